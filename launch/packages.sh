#!/usr/bin/env bash
# Sourced by setup.sh and local_slurm.sh: install_missing_packages PKG... installs the Debian/Ubuntu
# packages among PKG that are not installed yet (apt-get, as root). Not root and some missing:
# prints the apt-get line to run and returns 1.
install_missing_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "ringattn: missing packages: ${missing[*]}" >&2
    echo "ringattn: install them as root: apt-get update && apt-get install -y ${missing[*]}" >&2
    return 1
  fi
  echo "ringattn: installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
}

#!/usr/bin/env bash
# The Python package's tests (python/tests), as a user gets the package: a virtual environment with
# torch, pytest and numpy from PyPI (kept between runs in $RINGATTN_VENV, default ~/.cache/ringattn/venv-pyX.Y,
# so that torch downloads once per machine), the package built and installed by the README's
# command (`pip install .`, scikit-build-core running the project's CMake) into a folder of this
# build tree, then pytest. Exits 77 (ctest: skipped) with a "skipped: REASON" line only where it
# cannot run: no python3 >= 3.9 with venv, or PyPI not reachable; RINGATTN_REQUIRE_PYTHON=1 (set by
# .ci/run) makes those failures.
#   usage: run_python_tests.sh SOURCE_DIR BUILD_DIR [pytest args...]
set -uo pipefail
SRC=$1 BUILD=$2
shift 2

skip() {
  if [ "${RINGATTN_REQUIRE_PYTHON:-0}" = 1 ]; then
    echo "FAILED (RINGATTN_REQUIRE_PYTHON=1): $1"
    exit 1
  fi
  echo "skipped: $1"
  exit 77
}

PY=$(command -v python3) || skip "no python3 on PATH"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 9))' || skip "$("$PY" --version) is older than 3.9"
ver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
VENV=${RINGATTN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ringattn/venv-py$ver}
if ! "$VENV/bin/python" -c 'import torch, pytest, numpy' 2>/dev/null; then
  echo "creating $VENV with torch and pytest from PyPI"
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv "$VENV" || skip "python3 -m venv failed (Debian: apt-get install python3-venv)"
  "$VENV/bin/pip" install --quiet --progress-bar off torch pytest numpy ||
    skip "pip install torch pytest numpy failed (is PyPI reachable?)"
fi
"$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)' || exit 1

# The README's install command, into this build tree (so that parallel trees share no package).
SITE=$BUILD/python-site
rm -rf "$SITE"
"$VENV/bin/pip" install --quiet --progress-bar off --no-deps --target "$SITE" "$SRC" || {
  echo "FAILED: pip install $SRC (the package's build) failed"
  exit 1
}
cd "$SRC"
PYTHONPATH=$SITE OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  python/tests "$@"
rc=$?
[ "$rc" -eq 5 ] && echo "FAILED: pytest collected no tests"
[ "$rc" -eq 0 ] || exit 1

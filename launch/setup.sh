#!/usr/bin/env bash
# Shared by run.sh and test.sh: installs the missing Debian/Ubuntu packages (as root), then
# configures and builds ringattn into $BUILD_DIR (default: build/ in the repository).
#   RINGATTN_CMAKE_ARGS    extra configure flags, e.g. "-DRINGATTN_CUDA=OFF"
#   RINGATTN_BUILD_TARGET  build this target only (run.sh: ringattn); default: everything
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
PACKAGES=(cmake ninja-build g++ libopenmpi-dev openmpi-bin libspdlog-dev libfmt-dev libgtest-dev libcli11-dev
          nlohmann-json3-dev python3 python3-venv)

source "$ROOT/launch/packages.sh"
install_missing_packages "${PACKAGES[@]}" || exit 1

# CUDA builds when nvcc is found; the usual install prefix need not be on PATH.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

# shellcheck disable=SC2086
cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${RINGATTN_CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" --parallel "$(nproc)" ${RINGATTN_BUILD_TARGET:+--target "$RINGATTN_BUILD_TARGET"}

# mpirun as root refuses to start without these; oversubscribe lets 2 ranks share fewer cores.
MPIRUN_FLAGS=(--oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && MPIRUN_FLAGS+=(--allow-run-as-root)
RINGATTN="$BUILD_DIR/bin/ringattn"
export ROOT BUILD_DIR RINGATTN

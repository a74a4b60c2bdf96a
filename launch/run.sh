#!/usr/bin/env bash
# Builds ringattn and runs the main job on its embedded default problem, checked against the
# fp64 reference: on the GPU when nvidia-smi sees one (and the build has CUDA), else over two
# CPU ranks through launch/mpirun.sh. Extra arguments go to `ringattn run`.
#   bash launch/run.sh                 # the default problem
#   bash launch/run.sh --seq 8192      # the same with other flags
# It builds the `ringattn` target only (no tests: launch/test.sh builds everything). Without a
# visible GPU it builds no CUDA code (-DRINGATTN_CUDA=OFF) and does so in build-cpu/, so that it
# and test.sh's build/ (CUDA too when nvcc is found) do not reconfigure each other.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

gpu_visible() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

RINGATTN_BUILD_TARGET=ringattn
if ! gpu_visible; then
  BUILD_DIR="${BUILD_DIR:-$ROOT/build-cpu}"
  RINGATTN_CMAKE_ARGS="-DRINGATTN_CUDA=OFF ${RINGATTN_CMAKE_ARGS:-}"
  echo "run.sh: no GPU visible: building the CPU targets only (RINGATTN_CUDA=OFF) into ${BUILD_DIR#"$ROOT"/}/" >&2
fi
source "$ROOT/launch/setup.sh"

if gpu_visible && "$RINGATTN" --version | grep -q "cuda yes"; then
  echo "+ $RINGATTN run --device cuda --causal --check $*" >&2
  exec "$RINGATTN" run --device cuda --causal --check "$@"
fi
# Two CPU ranks; mpirun.sh prints the rank table, and the ranks split the cores.
RINGATTN="$RINGATTN" exec bash "$ROOT/launch/mpirun.sh" --cpu -np 2 run --causal --check "$@"

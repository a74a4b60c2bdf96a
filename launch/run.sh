#!/usr/bin/env bash
# Builds ringattn and runs the main job on its embedded default problem, checked against the
# fp64 reference: on the GPU when nvidia-smi sees one (and the build has CUDA), else over two
# CPU ranks through launch/mpirun.sh. Extra arguments go to `ringattn run`.
#   bash launch/run.sh                 # the default problem
#   bash launch/run.sh --seq 8192      # the same with other flags
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 &&
   "$RINGATTN" --version | grep -q "cuda yes"; then
  echo "+ $RINGATTN run --device cuda --causal --check $*" >&2
  exec "$RINGATTN" run --device cuda --causal --check "$@"
fi
# Two CPU ranks; mpirun.sh prints the rank table, and the ranks split the cores.
RINGATTN="$RINGATTN" exec bash "$ROOT/launch/mpirun.sh" --cpu -np 2 run --causal --check "$@"

#!/usr/bin/env bash
# Builds ringattn and runs the main job on its embedded default problem, checked against the
# fp64 reference: on the GPU when nvidia-smi sees one (and the build has CUDA), else over two
# CPU ranks with mpirun. Extra arguments go to `ringattn run`.
#   bash launch/run.sh                 # the default problem
#   bash launch/run.sh --seq 8192      # the same with other flags
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 &&
   "$RINGATTN" --version | grep -q "cuda yes"; then
  echo "+ $RINGATTN run --device cuda --causal --check $*" >&2
  exec "$RINGATTN" run --device cuda --causal --check "$@"
fi
NP=2
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( $(nproc) / NP > 0 ? $(nproc) / NP : 1 ))}"
echo "+ mpirun -np $NP ${MPIRUN_FLAGS[*]} -x OMP_NUM_THREADS=$OMP_NUM_THREADS $RINGATTN run --causal --check $*" >&2
exec mpirun -np "$NP" "${MPIRUN_FLAGS[@]}" -x OMP_NUM_THREADS "$RINGATTN" run --causal --check "$@"

#!/usr/bin/env bash
# One rank per GPU of this host under mpirun; each rank picks its GPU from its local rank and
# the ring runs over NCCL when the build has it (else MPI, staged through host memory).
#   bash launch/gpus.sh [NGPUS] [ringattn run flags...]
#   bash launch/gpus.sh 8 --seq 131072 --causal --check
# Assumes a build (bash launch/run.sh or launch/test.sh did one); BUILD_DIR overrides build/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RINGATTN="${BUILD_DIR:-$ROOT/build}/src/ringattn"
NGPUS="${1:-$(nvidia-smi -L | wc -l)}"
[ $# -gt 0 ] && shift
FLAGS=(--bind-to none)
[ "$(id -u)" -eq 0 ] && FLAGS+=(--allow-run-as-root)
echo "+ mpirun -np $NGPUS ${FLAGS[*]} $RINGATTN run --device cuda $*" >&2
exec mpirun -np "$NGPUS" "${FLAGS[@]}" "$RINGATTN" run --device cuda "$@"

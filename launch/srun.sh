#!/usr/bin/env bash
# Slurm: one task per GPU over NODES nodes with GPUS_PER_NODE GPUs each. ringattn reads its
# rank from SLURM_PROCID and its GPU from SLURM_LOCALID; Slurm's PMIx starts MPI.
#   NODES=2 GPUS_PER_NODE=8 bash launch/srun.sh --seq 262144 --causal --check
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RINGATTN="${BUILD_DIR:-$ROOT/build}/src/ringattn"
NODES="${NODES:-1}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
echo "+ srun -N $NODES --ntasks-per-node=$GPUS_PER_NODE --gpus-per-node=$GPUS_PER_NODE --mpi=pmix $RINGATTN run --device cuda $*" >&2
exec srun -N "$NODES" --ntasks-per-node="$GPUS_PER_NODE" --gpus-per-node="$GPUS_PER_NODE" --mpi=pmix \
  "$RINGATTN" run --device cuda "$@"

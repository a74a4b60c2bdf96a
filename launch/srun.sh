#!/usr/bin/env bash
# Slurm: one task per GPU over NODES nodes with GPUS_PER_NODE GPUs each. ringattn reads its
# rank from SLURM_PROCID and picks CUDA device SLURM_LOCALID; Slurm starts MPI through PMIx.
# Inside an allocation (salloc, or the body of launch/ringattn.sbatch) it uses that allocation.
#   NODES=2 GPUS_PER_NODE=8 bash launch/srun.sh --seq 262144 --causal --check
#   NODES=2 GPUS_PER_NODE=8 bash launch/srun.sh bench -b 65536 -e 524288 -f 2 --causal
#   NODES=2 GPUS_PER_NODE=8 bash launch/srun.sh --seq 262144 --causal --dry-run   # topology only
# Environment: BUILD_DIR or RINGATTN (the binary, the same path on every node), SRUN_MPI (default
# pmix; pmi2 on clusters without PMIx), SRUN_ARGS (more srun flags, e.g. "-p gpu -t 00:30:00").
# Every task must see all GPUs of its node (the default of --gpus-per-node): ringattn picks
# device SLURM_LOCALID itself, so --gpus-per-task or --gpu-bind=single would leave it device 0 of
# 1 and the NCCL transport refuses that layout with a message naming the rank.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RINGATTN="${RINGATTN:-${BUILD_DIR:-$ROOT/build}/src/ringattn}"
NODES="${NODES:-${SLURM_JOB_NUM_NODES:-1}}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
SUB=run
case "${1:-}" in run|bench) SUB="$1"; shift ;; esac
# srun exports this shell's environment to the tasks (--export=ALL is the default).
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}" CUDA_DEVICE_ORDER="${CUDA_DEVICE_ORDER:-PCI_BUS_ID}"
# shellcheck disable=SC2206
CMD=(srun -N "$NODES" --ntasks-per-node="$GPUS_PER_NODE" --gpus-per-node="$GPUS_PER_NODE"
     --mpi="${SRUN_MPI:-pmix}" --cpu-bind=none ${SRUN_ARGS:-})
# The rank -> host -> GPU table, one line per task (the repository must be on every node).
echo "# rank  host                     local  device" >&2
"${CMD[@]}" bash "$ROOT/launch/rank_probe.sh" gpu | sort -n >&2
echo "+ ${CMD[*]} $RINGATTN $SUB --device cuda $*" >&2
exec "${CMD[@]}" "$RINGATTN" "$SUB" --device cuda "$@"

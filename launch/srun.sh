#!/usr/bin/env bash
# ringattn under Slurm's srun: GPU ranks (default) or CPU ranks (--cpu). Prints the rank -> host
# -> device table first, then runs ringattn with the given arguments. ringattn reads its rank from
# SLURM_PROCID; Slurm starts MPI through PMIx. Inside an allocation (salloc, or the body of
# launch/ringattn.sbatch) it uses that allocation.
#
#   bash launch/srun.sh [--cpu] [-n N] [--] [run|bench] [ringattn flags...]
#
# GPU ranks: one task per GPU over NODES nodes with GPUS_PER_NODE GPUs each; ringattn picks CUDA
# device SLURM_LOCALID (--device cuda).
#   NODES=2 GPUS_PER_NODE=8 bash launch/srun.sh --seq 262144 --causal --check
#   NODES=2 GPUS_PER_NODE=8 bash launch/srun.sh bench -b 65536 -e 524288 -f 2 --causal
#   NODES=2 GPUS_PER_NODE=8 bash launch/srun.sh --seq 262144 --causal --dry-run   # topology only
# Every task must see all GPUs of its node (the default of --gpus-per-node): ringattn picks
# device SLURM_LOCALID itself, so --gpus-per-task or --gpu-bind=single would leave it device 0 of
# 1 and the NCCL transport refuses that layout with a message naming the rank.
#
# CPU ranks (--cpu): -n N tasks, or TASKS_PER_NODE tasks on each of NODES nodes; with neither, the
# allocation's tasks inside one, else 2. No GPU is asked for; --device cpu. Ranks that share a
# node split the job's cores there (SLURM_CPUS_ON_NODE) unless OMP_NUM_THREADS is set.
#   bash launch/srun.sh --cpu -n 2 run --seq 2048 --causal --check
#   NODES=2 TASKS_PER_NODE=4 bash launch/srun.sh --cpu --seq 65536 --causal --check
#
# Environment: BUILD_DIR (default build/, or build-cpu/ where only run.sh's CPU-only build is) or
# RINGATTN (the binary, the same path on every node), SRUN_MPI (default pmix; pmi2 on clusters
# without PMIx), SRUN_ARGS (more srun flags, e.g. "-p gpu -t 00:30:00").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# build/ is launch/test.sh's (and run.sh's with a GPU); build-cpu/ is run.sh's without a GPU.
if [ -z "${BUILD_DIR:-}" ] && [ ! -x "$ROOT/build/bin/ringattn" ] && [ -x "$ROOT/build-cpu/bin/ringattn" ]; then
  BUILD_DIR="$ROOT/build-cpu"
fi
RINGATTN="${RINGATTN:-${BUILD_DIR:-$ROOT/build}/bin/ringattn}"
die() { echo "srun.sh: $*" >&2; exit 1; }
count() {  # NAME VALUE: VALUE must be a positive whole number
  [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive whole number, got '$2'"
}

MODE=gpu NTASKS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) MODE=cpu; shift ;;
    -n|--ntasks) [ $# -ge 2 ] || die "$1 needs a number of tasks"; NTASKS="$2"; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
SUB=run
case "${1:-}" in run|bench) SUB="$1"; shift ;; esac

[ -z "$NTASKS" ] || count "-n" "$NTASKS"
[ -z "${NODES:-}" ] || count NODES "$NODES"
if [ "$MODE" = gpu ]; then
  [ -z "$NTASKS" ] || die "-n is for CPU ranks (--cpu); GPU ranks are NODES x GPUS_PER_NODE, one task per GPU"
  NODES="${NODES:-${SLURM_JOB_NUM_NODES:-1}}"
  GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
  count GPUS_PER_NODE "$GPUS_PER_NODE"
else
  [ -z "${TASKS_PER_NODE:-}" ] || count TASKS_PER_NODE "$TASKS_PER_NODE"
fi
command -v srun >/dev/null || die "srun not found: no Slurm here (bash launch/local_slurm.sh starts a one-node cluster, as root)"
[ -x "$RINGATTN" ] || die "no ringattn binary at $RINGATTN (build first: bash launch/run.sh, or set BUILD_DIR / RINGATTN)"

# srun exports this shell's environment to the tasks (--export=ALL is the default).
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}" CUDA_DEVICE_ORDER="${CUDA_DEVICE_ORDER:-PCI_BUS_ID}"
if [ "$MODE" = gpu ]; then
  CMD=(srun -N "$NODES" --ntasks-per-node="$GPUS_PER_NODE" --gpus-per-node="$GPUS_PER_NODE")
  DEVICE=cuda
else
  CMD=(srun)
  if [ -n "$NTASKS" ]; then
    CMD+=(-n "$NTASKS")
    [ -z "${NODES:-}" ] || CMD+=(-N "$NODES")
  elif [ -n "${TASKS_PER_NODE:-}" ]; then
    CMD+=(-N "${NODES:-${SLURM_JOB_NUM_NODES:-1}}" --ntasks-per-node="$TASKS_PER_NODE")
  elif [ -z "${SLURM_JOB_ID:-}" ]; then
    CMD+=(-n 2)
  fi
  DEVICE=cpu
fi
# shellcheck disable=SC2206
CMD+=(--mpi="${SRUN_MPI:-pmix}" --cpu-bind=none ${SRUN_ARGS:-})
# The rank -> host -> device table, one line per task (the repository must be on every node).
echo "# rank  host                     local  device" >&2
"${CMD[@]}" bash "$ROOT/launch/rank_probe.sh" "$MODE" | sort -n >&2
echo "+ ${CMD[*]} $RINGATTN $SUB --device $DEVICE $*" >&2
exec "${CMD[@]}" "$RINGATTN" "$SUB" --device "$DEVICE" "$@"

#!/usr/bin/env bash
# ringattn under mpirun: one rank per GPU on one or many nodes, or CPU ranks on a machine without
# GPUs. Prints the rank -> host -> GPU table first, then runs ringattn with the given arguments.
#
#   bash launch/mpirun.sh [launcher options] [--] [run|bench] [ringattn flags...]
#
# Launcher options (everything else goes to ringattn; the subcommand defaults to `run`):
#   -np N             ranks (default: the GPUs of this host, or 2 CPU ranks without a GPU;
#                     with -H/--hostfile and no -np, mpirun fills the hosts' slots)
#   -H h1:8,h2:8      hosts with their slot counts (one slot per GPU), passed to mpirun
#   --hostfile FILE   the same as a file ("h1 slots=8" per line)
#   --cpu | --gpu     force CPU ranks (`ringattn ... --device cpu`) or GPU ranks (--device cuda);
#                     default: GPU when nvidia-smi sees one and the build has CUDA
#   --no-table        skip the rank -> host -> GPU table (it costs one extra mpirun start)
#   --mca K V         passed to mpirun (e.g. --mca btl_tcp_if_include eth0)
# Environment: BUILD_DIR (default build/, or build-cpu/ where only run.sh's CPU-only build is) or
# RINGATTN (the binary; it must be at the same path on every node), MPIRUN (default mpirun),
# MPIRUN_ARGS (more mpirun options, word-split, e.g. "-x LD_LIBRARY_PATH --map-by ppr:8:node").
# NCCL_* and RINGATTN_* variables of this shell, and OMP_NUM_THREADS when set, are exported to
# every rank (-x); NCCL_NVLS_ENABLE=0 is added unless set, since NVLink SHARP multicast is off on
# the machines this was tested on.
#
# Binding: none (--bind-to none). ringattn picks its GPU from the local rank itself (rank i on a
# host uses CUDA device i), and CPU ranks sharing a host split its cores between them when
# OMP_NUM_THREADS is unset; a binding from mpirun would fight either choice.
#
#   bash launch/mpirun.sh -np 8 --seq 131072 --causal --check           # all GPUs of one host
#   bash launch/mpirun.sh -H node1:8,node2:8 bench -b 65536 -e 524288 -f 2 --causal
#   bash launch/mpirun.sh --cpu -np 4 --seq 16384 --causal --check       # CPU ranks
#   bash launch/mpirun.sh -np 8 run --seq 1048576 --causal --dry-run     # check the topology first
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# build/ is launch/test.sh's (and run.sh's with a GPU); build-cpu/ is run.sh's without a GPU.
if [ -z "${BUILD_DIR:-}" ] && [ ! -x "$ROOT/build/bin/ringattn" ] && [ -x "$ROOT/build-cpu/bin/ringattn" ]; then
  BUILD_DIR="$ROOT/build-cpu"
fi
RINGATTN="${RINGATTN:-${BUILD_DIR:-$ROOT/build}/bin/ringattn}"
MPIRUN="${MPIRUN:-mpirun}"

NP="" MODE="" TABLE=1
HOSTS=()   # -H / --hostfile, as given
EXTRA=()   # other mpirun options
while [ $# -gt 0 ]; do
  case "$1" in
    -np|-n|--np) NP="$2"; shift 2 ;;
    -H|--host) HOSTS+=(-H "$2"); shift 2 ;;
    --hostfile|-hostfile|--machinefile) HOSTS+=(--hostfile "$2"); shift 2 ;;
    --cpu) MODE=cpu; shift ;;
    --gpu) MODE=gpu; shift ;;
    --no-table) TABLE=0; shift ;;
    --mca) EXTRA+=(--mca "$2" "$3"); shift 3 ;;
    --) shift; break ;;
    *) break ;;
  esac
done

[ -x "$RINGATTN" ] || { echo "mpirun.sh: no ringattn binary at $RINGATTN (build first: bash launch/run.sh," \
  "or set BUILD_DIR / RINGATTN)" >&2; exit 1; }
command -v "$MPIRUN" >/dev/null || { echo "mpirun.sh: $MPIRUN not found (apt-get install openmpi-bin)" >&2; exit 1; }

# The subcommand, then the flags; --device is added unless the caller chose one.
SUB=run
case "${1:-}" in run|bench) SUB="$1"; shift ;; esac
# plan computes the schedule on one process, without MPI.
[ "${1:-}" = plan ] && exec "$RINGATTN" "$@"
gpu_count() { { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null || true; } | grep -c '^GPU' || true; }
ASKED=""  # the --device the caller gave, if any
prev=""
for a in "$@"; do
  [ "$prev" = --device ] && ASKED="$a"
  [[ "$a" == --device=* ]] && ASKED="${a#--device=}"
  prev="$a"
done
if [ -z "$MODE" ]; then
  case "$ASKED" in
    cuda) MODE=gpu ;;
    cpu) MODE=cpu ;;
    *) MODE=cpu
       if [ "$(gpu_count)" -gt 0 ] && "$RINGATTN" --version | grep -q "cuda yes"; then MODE=gpu; fi ;;
  esac
fi
DEVICE_FLAG=()
if [ -z "$ASKED" ]; then
  if [ "$MODE" = gpu ]; then DEVICE_FLAG=(--device cuda); else DEVICE_FLAG=(--device cpu); fi
fi
if [ -z "$NP" ] && [ ${#HOSTS[@]} -eq 0 ]; then
  if [ "$MODE" = gpu ]; then NP="$(gpu_count)"; else NP=2; fi
fi
if [ "$NP" = 0 ]; then
  echo "mpirun.sh: GPU ranks asked for, but nvidia-smi sees no GPU here; use --cpu, or -np with -H" >&2
  exit 1
fi

FLAGS=(--bind-to none)
[ -n "$NP" ] && FLAGS+=(-np "$NP")
FLAGS+=("${HOSTS[@]}" "${EXTRA[@]}")
# shellcheck disable=SC2206
FLAGS+=(${MPIRUN_ARGS:-})
[ "$(id -u)" -eq 0 ] && FLAGS+=(--allow-run-as-root)
# CPU ranks may outnumber the cores (tests, or this 2-core VM); GPU ranks never should (NCCL
# refuses two ranks on one GPU), so there mpirun's own check stays on.
[ "$MODE" = cpu ] && FLAGS+=(--oversubscribe)
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
# CUDA numbers devices fastest-first by default; PCI order makes CUDA device i the GPU that
# nvidia-smi -i i names, so the table below shows the GPU each rank really uses.
export CUDA_DEVICE_ORDER="${CUDA_DEVICE_ORDER:-PCI_BUS_ID}"
# (RINGATTN_CMAKE_ARGS is setup.sh's build setting, not one of the runtime's.)
for v in $(compgen -e | grep -E '^(NCCL_|RINGATTN_|CUDA_DEVICE_ORDER$|CUDA_VISIBLE_DEVICES$|OMP_NUM_THREADS$)' |
           grep -vx RINGATTN_CMAKE_ARGS || true); do
  FLAGS+=(-x "$v")
done

if [ "$TABLE" = 1 ]; then
  echo "# rank  host                     local  device" >&2
  "$MPIRUN" "${FLAGS[@]}" bash "$ROOT/launch/rank_probe.sh" "$MODE" | sort -n >&2
fi

echo "+ $MPIRUN ${FLAGS[*]} $RINGATTN $SUB ${DEVICE_FLAG[*]} $*" >&2
exec "$MPIRUN" "${FLAGS[@]}" "$RINGATTN" "$SUB" "${DEVICE_FLAG[@]}" "$@"

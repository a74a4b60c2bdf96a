#!/usr/bin/env bash
# NP CPU ranks on this host under mpirun, the cores split evenly between them (OpenMP threads
# per rank = cores / NP).
#   bash launch/cpus.sh [NP] [ringattn run flags...]
#   bash launch/cpus.sh 4 --seq 16384 --causal --shard zigzag --check
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RINGATTN="${BUILD_DIR:-$ROOT/build}/src/ringattn"
NP="${1:-2}"
[ $# -gt 0 ] && shift
THREADS=$(( $(nproc) / NP > 0 ? $(nproc) / NP : 1 ))
FLAGS=(--oversubscribe --bind-to none -x OMP_NUM_THREADS="$THREADS")
[ "$(id -u)" -eq 0 ] && FLAGS+=(--allow-run-as-root)
echo "+ mpirun -np $NP ${FLAGS[*]} $RINGATTN run $*" >&2
exec mpirun -np "$NP" "${FLAGS[@]}" "$RINGATTN" run "$@"

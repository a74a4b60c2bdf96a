#!/usr/bin/env bash
# NP CPU ranks on this host (default 2): launch/mpirun.sh with --cpu (see there for the options).
# The ranks split the host's cores between them unless OMP_NUM_THREADS is set.
#   bash launch/cpus.sh [NP] [ringattn run flags...]
#   bash launch/cpus.sh 4 --seq 16384 --causal --shard zigzag --check
set -euo pipefail
NP=(-np 2)
[[ "${1:-}" =~ ^[0-9]+$ ]] && { NP=(-np "$1"); shift; }
exec bash "$(dirname "${BASH_SOURCE[0]}")/mpirun.sh" --cpu "${NP[@]}" run "$@"

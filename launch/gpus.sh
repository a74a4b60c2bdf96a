#!/usr/bin/env bash
# One rank per GPU of this host: launch/mpirun.sh with --gpu (see there for the options).
#   bash launch/gpus.sh [NGPUS] [ringattn run flags...]
#   bash launch/gpus.sh 8 --seq 131072 --causal --check
set -euo pipefail
NP=()
[[ "${1:-}" =~ ^[0-9]+$ ]] && { NP=(-np "$1"); shift; }
exec bash "$(dirname "${BASH_SOURCE[0]}")/mpirun.sh" --gpu "${NP[@]}" run "$@"

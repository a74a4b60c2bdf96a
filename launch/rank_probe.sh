#!/usr/bin/env bash
# One line of the rank -> host -> device table, run on every rank by mpirun.sh and srun.sh before
# the work: rank, host, local rank and the device ringattn will use there. ringattn's choice is
# CUDA device (local rank mod visible GPUs); nvidia-smi ignores CUDA_VISIBLE_DEVICES, so the
# device's entry there (an index or a UUID) is what names it to nvidia-smi.
#   bash launch/rank_probe.sh gpu|cpu
rank="${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${SLURM_PROCID:-0}}}"
lr="${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-0}}"
dev="cpu ($(nproc) cores on the host$([ -z "${SLURM_CPUS_ON_NODE:-}" ] || echo ", $SLURM_CPUS_ON_NODE in this job"))"
if [ "${1:-cpu}" = gpu ]; then
  dev="no GPU visible"
  if command -v nvidia-smi >/dev/null 2>&1; then
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
      IFS=, read -ra ids <<< "$CUDA_VISIBLE_DEVICES"
    else
      mapfile -t ids < <(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null)
    fi
    if [ ${#ids[@]} -gt 0 ]; then
      i=$(( lr % ${#ids[@]} ))
      dev="cuda:$i $(nvidia-smi -i "${ids[$i]}" --query-gpu=pci.bus_id,name --format=csv,noheader 2>&1 | head -1)"
    fi
  fi
fi
printf "%6d  %-24s %5d  %s\n" "$rank" "$(hostname)" "$lr" "$dev"

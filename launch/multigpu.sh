#!/usr/bin/env bash
# The multi-GPU measurements in one call on one host with G GPUs (issue 9: not run yet, because
# no multi-GPU host has been lent so far). Builds (or uses BUILD_DIR), then:
#   1. correctness over NCCL at P = G: contiguous, zigzag and striped sharding, causal and full,
#      GQA 32/8, head dim 128, bf16, --check; distributed decode and chunked prefill (--check)
#   2. weak scaling: 8192 and 32768 tokens per GPU, causal zigzag at P = 1, 2, 4, ..., G, against
#      P x the single-GPU rate (on the same global problem, and on one shard's work); contiguous
#      and striped beside it at P = G
#   3. strong scaling: 131072 tokens over P = 1, 2, 4, ..., G (causal zigzag)
#   4. per-hop compute vs exchange: per-rank compute, exposed and transfer time of `ringattn run`
#      divided by the P hops, and the bench's hidden% (share of the exchange behind compute)
#   5. the peer: PyTorch context parallelism (launch/torch_cp_peer.py, ring rotation) under
#      torchrun on the weak and strong shapes, when torch is importable
# Everything lands in OUT (default multigpu-<date>/): the logs, one JSON per run, summary.txt
# (the tables), and the plots when matplotlib is there.
#   bash launch/multigpu.sh            # all GPUs of this host
#   G=4 OUT=/tmp/mg bash launch/multigpu.sh
#   STAGES="correct strong" bash launch/multigpu.sh
set -uo pipefail   # not -e: a failed stage is recorded and the next one still runs
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
export NCCL_NVLS_ENABLE=0 CUDA_DEVICE_ORDER=PCI_BUS_ID OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1   # the same for PyTorch's symmetric memory (no NVLS)
G="${G:-$(nvidia-smi -L | grep -c '^GPU')}"
OUT="${OUT:-$ROOT/multigpu-$(date +%Y%m%d-%H%M)}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
STAGES=" ${STAGES:-build correct weak strong hops peer summary} "
has() { [[ $STAGES == *" $1 "* ]]; }
mkdir -p "$OUT"
R="$BUILD_DIR/bin/ringattn"
SHAPE=(--batch 1 --heads 32 --kv-heads 8 --dim 128 --dtype bf16)
# One rank per GPU; the table is printed once, in the correctness stage.
MPI=(bash "$ROOT/launch/mpirun.sh" --gpu --no-table)
FAILS=0
step() {  # step NAME CMD...: runs CMD with its output in OUT/NAME.log, records the exit code
  local name="$1"; shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $(( SECONDS - t0 )) s" | tee -a "$OUT/steps.txt"
  [ $rc -eq 0 ] || { FAILS=$((FAILS + 1)); tail -5 "$OUT/$name.log"; }
  return $rc
}
powers() { local p=1; while [ $p -le "$G" ]; do echo $p; p=$((p * 2)); done; }  # 1 2 4 .. <= G

echo "# multigpu.sh: $G GPU(s) on $(hostname), output in $OUT" | tee "$OUT/steps.txt"
nvidia-smi --query-gpu=index,name,pci.bus_id,clocks.sm,temperature.gpu --format=csv | tee "$OUT/gpus.csv"
nvidia-smi topo -m >"$OUT/topo.txt" 2>&1

if has build; then
  if [ ! -x "$R" ] || [ -n "${REBUILD:-}" ]; then
    step build bash -c "cmake -S '$ROOT' -B '$BUILD_DIR' -G Ninja -DCMAKE_BUILD_TYPE=Release -DRINGATTN_TESTS=OFF &&
                        cmake --build '$BUILD_DIR' --parallel $(nproc) --target ringattn" || exit 1
  fi
  "$R" --version | tee "$OUT/version.txt"
  grep -q "nccl yes" "$OUT/version.txt" || echo "warning: this build has no NCCL; the runs use MPI staging" >&2
fi

if has correct; then
  bash "$ROOT/launch/mpirun.sh" --gpu -np "$G" run --dry-run "${SHAPE[@]}" --seq $((8192 * G)) --causal \
    >"$OUT/topology.log" 2>&1 || true   # the rank -> host -> GPU table (and --dry-run when it exists)
  for shard in contiguous zigzag striped; do
    for mask in causal full; do
      flag=(); [ $mask = causal ] && flag=(--causal)
      step "correct-$shard-$mask" "${MPI[@]}" -np "$G" run --transport nccl "${SHAPE[@]}" --seq $((8192 * G)) \
        "${flag[@]}" --shard "$shard" --check --json "$OUT/correct-$shard-$mask.json"
    done
  done
  # Distributed decode (one query over a KV cache split across the GPUs) and chunked prefill.
  step correct-decode "${MPI[@]}" -np "$G" run --transport nccl --batch 8 --heads 32 --kv-heads 8 --dim 128 \
    --dtype bf16 --seq 1 --kv-seq $((32768 * G)) --check --json "$OUT/correct-decode.json"
  step correct-chunked "${MPI[@]}" -np "$G" run --transport nccl "${SHAPE[@]}" --seq 512 \
    --kv-seq $((32768 * G)) --causal --check --json "$OUT/correct-chunked.json"
fi

bench() {  # bench NAME P SEQ SHARD: one size, 10 iterations, checked rows sampled
  local name="$1" p="$2" seq="$3" shard="$4"
  step "$name" "${MPI[@]}" -np "$p" bench "${SHAPE[@]}" --causal --shard "$shard" -b "$seq" -e "$seq" \
    -n 10 -w 3 --json "$OUT/$name.json"
}
if has weak; then
  for t in 8192 32768; do
    for p in $(powers); do
      bench "weak-t$t-p$p-zigzag" "$p" $((t * p)) zigzag
      # One GPU on the same global problem (the ideal is P x its rate) ...
      [ "$p" -gt 1 ] && bench "weak-t$t-p$p-single" 1 $((t * p)) zigzag
      # ... and on one shard's work: t queries at the end of the sequence against all t*p keys
      # before them (the heaviest rank's kind of work: a causal query block over a long cache).
      [ "$p" -gt 1 ] && step "weak-t$t-p$p-shardwork" "${MPI[@]}" -np 1 run "${SHAPE[@]}" --causal --seq "$t" \
        --kv-seq $((t * p)) --json "$OUT/weak-t$t-p$p-shardwork.json"
    done
    for shard in contiguous striped; do bench "weak-t$t-p$G-$shard" "$G" $((t * G)) "$shard"; done
  done
fi

if has strong; then
  for p in $(powers); do bench "strong-p$p" "$p" 131072 zigzag; done
fi

if has hops; then
  for p in $(powers); do
    [ "$p" -gt 1 ] || continue
    step "hops-p$p" "${MPI[@]}" -np "$p" run --transport nccl "${SHAPE[@]}" --causal --seq $((32768 * p)) \
      --json "$OUT/hops-p$p.json"
  done
fi

if has peer; then
  if python3 -c "import torch" 2>/dev/null && command -v torchrun >/dev/null; then
    peer() { step "peer-$1" torchrun --standalone --nproc_per_node "$2" "$ROOT/launch/torch_cp_peer.py" \
               --seq "$3" --causal --json "$OUT/peer-$1.json" "${@:4}"; }
    for t in 8192 32768; do for p in $(powers); do peer "weak-t$t-p$p" "$p" $((t * p)); done; done
    for p in $(powers); do peer "strong-p$p" "$p" 131072; done
    peer "check-p$G" "$G" $((4096 * G)) --check
  else
    echo "peer: skipped (no torch / torchrun here)" | tee -a "$OUT/steps.txt"
  fi
fi

if has summary; then
  python3 "$ROOT/launch/multigpu_summary.py" "$OUT" | tee "$OUT/summary.txt"
  ls "$OUT"/strong-p*.json >/dev/null 2>&1 &&
    python3 "$ROOT/launch/plot.py" --scaling "$OUT"/strong-p*.json -o "$OUT/plots" 2>&1 | tail -2
fi
echo "# done: $FAILS failed step(s); logs and JSON in $OUT" | tee -a "$OUT/steps.txt"
[ "$FAILS" -eq 0 ]

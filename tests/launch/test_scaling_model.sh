#!/usr/bin/env bash
# launch/scaling_model.py: on its defaults it validates itself against the 1- and 2-GPU
# measurements (every ratio printed and within 0.8..1.25, the fitted point at 1.000) and prints the
# weak and strong tables for 1, 2, 4, 8 GPUs and 2, 4, 16 nodes of 8; on a problem small enough to
# compute by hand it predicts the formula's numbers; bad flags are refused naming the value.
#   bash tests/launch/test_scaling_model.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MODEL="$ROOT/launch/scaling_model.py"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }

# 1. The defaults.
python3 "$MODEL" >"$WORK/out" || fail "defaults: exit $?"
cat "$WORK/out"
n=$(grep -c "| ratio " "$WORK/out") || true
[ "$n" -eq 5 ] || fail "defaults: $n validation rows, expected 5 (two 1-GPU and three 2-GPU measurements)"
grep "| ratio " "$WORK/out" | sed 's/.*| ratio \([0-9.]*\) .*/\1/' | while read -r r; do
  awk -v r="$r" 'BEGIN { exit !(r >= 0.8 && r <= 1.25) }' || fail "validation ratio $r outside 0.8..1.25"
done
grep -q "| 2 | 16384 | 2.421 | 2.421 | ratio 1.000 | fitted |" "$WORK/out" || fail "the fitted point does not meet its measurement"
for title in "weak scaling: 8192 tokens per GPU" "weak scaling: 32768 tokens per GPU" "strong scaling: 131072 tokens in all"; do
  grep -q "## $title (predicted)" "$WORK/out" || fail "no table '$title'"
done
for row in "| 1 | 1 x 1 |" "| 2 | 1 x 2 |" "| 4 | 1 x 4 |" "| 8 | 1 x 8 |" "| 16 | 2 x 8 |" "| 32 | 4 x 8 |" "| 128 | 16 x 8 |"; do
  [ "$(grep -cF "$row" "$WORK/out")" -eq 4 ] || fail "row '$row' is not in each of the 4 tables"
done

# 2. By hand: one GPU takes 1 ms at 8192 tokens (the only point, so every length runs at its rate),
#    no overhead. Compute-bound over NVLink, P = 2 at 16384 is 2 hops of 1 ms; at 1 GB/s the hop
#    waits for the 32 MiB block (2 x 8 KV heads x 8192 x 128 x 2 bytes): 33.554 ms + 5 us, plus the
#    last hop's 1 ms.
python3 "$MODEL" --hop-ms 8192:1 --overhead-ms 0 --measured 2:16384:2 >"$WORK/hand" || fail "by hand: exit $?"
grep -q "| 2 | 16384 | 2.000 | 2.000 | ratio 1.000 |" "$WORK/hand" || fail "by hand: P = 2 is not 2 x 1 ms: $(grep ratio "$WORK/hand")"
python3 "$MODEL" --hop-ms 8192:1 --overhead-ms 0 --measured 2:16384:2 --nvlink-gbps 1 >"$WORK/slow"
grep -q "| 2 | 16384 | 2.000 | 34.559 |" "$WORK/slow" || fail "link-bound: $(grep ratio "$WORK/slow")"
grep -q "| 2 | 1 x 2 | 16384 | 8192 | 1.000 | 33.559 | NVLink | link | 34.56 |" "$WORK/slow" || fail "link-bound row"

# The layouts (--cp) by hand, same GPU, 2 GPUs at 8192 tokens each: the ring is the 2 x 1 ms above;
# ulysses sends half of q, k and v (8192 x 128 x 2 bytes x (32 + 16) heads / 2 = 50.3 MB) and half
# of out and lse (8192 x 32 x (256 + 4) / 2 = 34.1 MB) at 450 GB/s + 5 us each (0.198 ms), and
# computes 16 of the 32 heads over all 16384 tokens (4 x the 8192-token time / 2: 2.000 ms).
python3 "$MODEL" --hop-ms 8192:1 --overhead-ms 0 --measured 2:16384:2 --cp-gpus 2 --cp-tokens 8192 >"$WORK/cp"
grep -qF "| 2 | ring | 2 x 1 | 0.000 | 1.000 | 0.080 | 2.00 | 1100 | best |" "$WORK/cp" || fail "cp ring row: $(cat "$WORK/cp")"
grep -qF "| 2 | ulysses | 1 x 2 | 0.198 | 2.000 | 0.000 | 2.20 | 1001 |  |" "$WORK/cp" || fail "cp ulysses row"
# The defaults print the layouts of 8, 16, 32 and 64 GPUs (8 per node), every divisor of the
# 8 KV heads, at 8192 and 32768 tokens per GPU, with one best per GPU count.
for t in 8192 32768; do
  grep -q "## layouts (--cp): $t tokens per GPU, 8 GPUs per node (predicted)" "$WORK/out" || fail "no layouts table at $t"
done
[ "$(grep -c "^| \(8\|16\|32\|64\) | hybrid:4 | " "$WORK/out")" -eq 8 ] || fail "hybrid:4 rows"
[ "$(grep -c "^| [0-9]* | [a-z:0-9]* | .* | best |$" "$WORK/out")" -eq 8 ] || fail "one best per GPU count and table"

# The help names where each default comes from.
python3 "$MODEL" --help >"$WORK/help" || fail "--help: exit $?"
grep -q "launch/results/kernels/2026-11-29-h200-ours.csv" "$WORK/help" || fail "--help does not name the compute source"

# 3. Bad flags: exit 2 and the flag, the value and what is allowed on stderr.
refused() {  # refused 'EXPECTED TEXT' ARGS...
  local want="$1"; shift
  set +e
  python3 "$MODEL" "$@" >/dev/null 2>"$WORK/err"
  local rc=$?
  set -e
  [ $rc -eq 2 ] || fail "$*: exit $rc, expected 2"
  grep -qF -- "$want" "$WORK/err" || fail "$*: stderr lacks '$want': $(cat "$WORK/err")"
}
refused "argument --nvlink-gbps: must be a finite number > 0 (got '-1')" --nvlink-gbps=-1
refused "argument --ib-gbps: must be a finite number > 0 (got 'fast')" --ib-gbps fast
refused "argument --overhead-ms: must be a finite number >= 0 (got 'nan')" --overhead-ms nan
refused "argument --hop-ms: must be comma-separated TOKENS:VALUE pairs" --hop-ms 8192
refused "argument --rate: gives 8192 tokens twice" --rate 8192:500,8192:600
refused "argument --measured: 16383 tokens do not split over 2 GPUs" --measured 2:16383:3
refused "argument --gpus-per-node: must be a comma-separated list of integers >= 1 (got '1,0')" --gpus-per-node 1,0
refused "--hop-ms and --rate both describe one GPU's compute" --hop-ms 8192:1 --rate 8192:500
refused "--fit 1:8192: no --measured point P:TOKENS with P > 1 matches it" --fit 1:8192
refused "no --measured point with P > 1 to fit the per-exchange overhead to" --measured 1:8192:1
refused "--heads 30 is not a multiple of --kv-heads 8" --heads 30
echo "scaling_model: OK"

#!/usr/bin/env bash
# The README's kernel table (Performance), in one run on the GPU host: ours (ringattn_gpu_bench
# --timer batch: 20 back-to-back calls between two events, median of 7 batches), each layout in its
# own process, two passes with the order alternating, and the peers (.bench/peers.py, a copy of
# shared/bench/peers.py: the same timing) between the passes, on the same shapes; then one table
# (ours in both layouts as medians of the passes, cuDNN in both layouts, FA2, the ratios). (One
# process running --layout both put each shape's bshd rows right after its bhsd rows: an order
# effect of the power limit: docs/performance.md, the fair-timer run of 2026-12-01.)
# MODE=interleaved instead runs, per shape and pass (PASSES, default 2), ours bhsd, ours bshd and then
# the peers on that shape alone, so that each row's three measurements sit side by side in time
# (slower: the peers' process starts once per shape and pass); the table takes medians over passes.
#   BIN=build/tests/gpu/ringattn_gpu_bench [MODE=interleaved] [PASSES=2] [SHAPES="b,hq,hkv,t,s,d,mask ..."] bash tests/gpu/kernel_table.sh
# Output: $OUT/ours.csv, $OUT/peers.csv and the table (also $OUT/table.md).
set -u -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kernel_table}; BIN=${BIN:-build/tests/gpu/ringattn_gpu_bench}
mkdir -p "$OUT"
SHAPES=${SHAPES:-"4,32,8,2048,2048,128,causal 1,32,8,8192,8192,128,full 1,32,8,8192,8192,128,causal
 1,32,8,32768,32768,128,causal 4,32,32,4096,4096,64,causal 1,32,8,8192,8192,64,full 1,32,8,8192,8192,64,causal
 1,32,8,8192,8192,256,full 1,32,8,8192,8192,256,causal 1,16,8,32768,32768,256,causal 4,16,8,2048,2048,256,causal
 8,32,8,1,32768,128,full 1,32,8,1,131072,128,full 1,32,8,1,8192,128,full 1,32,8,1,32768,128,full
 1,32,8,8,32768,128,full 1,32,8,16,32768,128,full 8,32,8,16,8192,128,full 8,32,8,16,8192,64,full
 1,32,8,1,32768,256,full"}
args=""; for s in $SHAPES; do args="$args --shape $s"; done
: >"$OUT/ours.csv"; : >"$OUT/peers.csv"
PEERS="sdpa_flash,sdpa_cudnn,sdpa_cudnn_gqa,sdpa_cudnn_bshd"
ours() {  # pass, layout, bench args
  local pass=$1 lay=$2; shift 2
  timeout 200 "$BIN" "$@" --layout "$lay" --timer batch 2>>"$OUT/ours.err" | tail -n +2 | grep ",ours," |
    sed "s/^/$pass,$lay,/" >>"$OUT/ours.csv" || { echo "ours failed:"; cat "$OUT/ours.err"; exit 1; }
}
peers() {  # bench args
  timeout 300 python3 .bench/peers.py --only $PEERS --no-ceilings "$@" 2>>"$OUT/peers.err" | grep -v "^shape" \
    >>"$OUT/peers.csv" || { echo "peers failed:"; tail -5 "$OUT/peers.err"; exit 1; }
}
if [ "${MODE:-}" = interleaved ]; then
  for s in $SHAPES; do
    for pass in $(seq 1 "${PASSES:-2}"); do
      ours "$pass" bhsd --shape "$s"; ours "$pass" bshd --shape "$s"; peers --shape "$s"
    done
  done
else
  for pass in 1 2; do
    order="bhsd bshd"; [ $pass = 2 ] && order="bshd bhsd"
    # shellcheck disable=SC2086
    for lay in $order; do ours $pass $lay $args; done
    # shellcheck disable=SC2086
    [ $pass = 1 ] && peers $args
  done
fi
python3 - "$OUT/ours.csv" "$OUT/peers.csv" <<'PY' | tee "$OUT/table.md"
import statistics, sys
nan = float("nan")
ours, peers = {}, {}
for line in open(sys.argv[1]):  # pass,layout,shape(7),ours,TFLOP/s,ms,KV GB/s
    f = line.strip().split(",")
    if len(f) < 13: continue
    s = ",".join(f[2:9])
    ours.setdefault(s, {}).setdefault(f[1], []).append(float(f[12]) if int(f[5]) <= 16 else float(f[10]))
for line in open(sys.argv[2]):  # shape(7),peer,TFLOP/s,ms,KV GB/s,... (one line per pass)
    f = line.strip().split(",")
    if len(f) < 11 or f[0] == "shape" or f[8] in ("unsupported", ""): continue
    s = ",".join(f[:7])
    peers.setdefault(s, {}).setdefault(f[7], []).append(float(f[10]) if int(f[3]) <= 16 else float(f[8]))
peers = {s: {k: statistics.median(v) for k, v in d.items()} for s, d in peers.items()}
print("| shape | ours bhsd | ours bshd | cuDNN bhsd / bshd | FA2 | bhsd / cuDNN | bshd / cuDNN bshd | ours / best peer |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for s, v in ours.items():
    p, decode = peers.get(s, {}), int(s.split(",")[3]) <= 16  # decode rows in K/V GB/s, prefill in TFLOP/s
    bhsd, bshd = statistics.median(v.get("bhsd", [nan])), statistics.median(v.get("bshd", [nan]))
    cudnn = max(p.get("sdpa_cudnn", nan), p.get("sdpa_cudnn_gqa", nan))
    cudnn_bshd, fa2 = p.get("sdpa_cudnn_bshd", nan), max(p.get("sdpa_flash", nan), p.get("sdpa_flash_gqa", nan))
    best = max(x for x in (cudnn, cudnn_bshd, fa2, 0.0) if x == x)
    f = (lambda x: f"{x:.0f}") if decode else (lambda x: f"{x:.1f}")
    print(f"| {s} | {f(bhsd)} | {f(bshd)} | {f(cudnn)} / {f(cudnn_bshd)} | {f(fa2)} | {bhsd / cudnn:.2f} | "
          f"{bshd / cudnn_bshd:.2f} | {min(bhsd, bshd) / best:.2f} |")
PY

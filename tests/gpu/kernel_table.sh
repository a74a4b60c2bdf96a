#!/usr/bin/env bash
# The kernel table of README's first GPU table, in one run on the GPU host: ours (ringattn_gpu_bench
# --timer batch --layout both: 20 back-to-back calls between two events, median of 7 batches) and then
# the peers (.bench/peers.py, a copy of shared/bench/peers.py: the same timing), on the same shapes,
# then one table (ours in both layouts, cuDNN in both layouts, FA2, the ratios).
#   BIN=build/tests/gpu/ringattn_gpu_bench [SHAPES="b,hq,hkv,t,s,d,mask ..."] bash tests/gpu/kernel_table.sh
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
# shellcheck disable=SC2086
timeout 200 "$BIN" $args --layout both --timer batch >"$OUT/ours.csv" 2>"$OUT/ours.err" || { echo "ours failed:"; cat "$OUT/ours.err"; exit 1; }
# shellcheck disable=SC2086
timeout 300 python3 .bench/peers.py --only sdpa_flash,sdpa_cudnn,sdpa_cudnn_gqa,sdpa_cudnn_bshd --no-ceilings $args \
  >"$OUT/peers.csv" 2>"$OUT/peers.err" || { echo "peers failed:"; tail -5 "$OUT/peers.err"; exit 1; }
python3 - "$OUT/ours.csv" "$OUT/peers.csv" <<'PY' | tee "$OUT/table.md"
import sys
def load(path):  # (shape, impl) -> (TFLOP/s, KV GB/s); the shape has 7 comma-separated fields
    rows = {}
    for line in open(path):
        f = line.strip().split(",")
        if len(f) < 11 or f[0] == "shape" or f[8] in ("unsupported", ""): continue
        rows[(",".join(f[:7]), f[7])] = (float(f[8]), float(f[10]))
    return rows
ours, peers = load(sys.argv[1]), load(sys.argv[2])
nan = float("nan")
print("| shape | ours bhsd | ours bshd | cuDNN bhsd / bshd | FA2 | bhsd / cuDNN | bshd / cuDNN bshd | ours / best peer |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for s in dict.fromkeys(k[0] for k in ours):
    decode = int(s.split(",")[3]) <= 16  # decode rows in K/V GB/s, prefill in TFLOP/s
    g = lambda d, impl: d.get((s, impl), (nan, nan))[1 if decode else 0]
    cudnn = max(g(peers, "sdpa_cudnn"), g(peers, "sdpa_cudnn_gqa"))
    cudnn_bshd, fa2 = g(peers, "sdpa_cudnn_bshd"), max(g(peers, "sdpa_flash"), g(peers, "sdpa_flash_gqa"))
    bhsd, bshd = g(ours, "ours"), g(ours, "ours_bshd")
    best = max(x for x in (cudnn, cudnn_bshd, fa2, 0.0) if x == x)
    f = (lambda x: f"{x:.0f}") if decode else (lambda x: f"{x:.1f}")
    print(f"| {s} | {f(bhsd)} | {f(bshd)} | {f(cudnn)} / {f(cudnn_bshd)} | {f(fa2)} | {bhsd / cudnn:.2f} | "
          f"{bshd / cudnn_bshd:.2f} | {min(bhsd, bshd) / best:.2f} |")
PY

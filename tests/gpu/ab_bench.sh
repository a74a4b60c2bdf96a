#!/usr/bin/env bash
# A/B timing of two source trees on one GPU in one run: builds tests/gpu/ringattn_gpu_bench from
# BASE_SRC (e.g. an earlier commit unpacked with `git archive`) and from this tree, then times both
# on the same shapes in interleaved passes (base, new, base, new, ...), so clock and thermal drift
# fall on both alike. Each pass is gpu_bench's median of --reps calls between CUDA events; the
# table gives, per shape and measure, the median over the passes and the ratio new / base.
#   BASE_SRC=/path/to/old/tree [PASSES=2] [REPS=20] [SHAPES="b,hq,hkv,t,s,d,mask ..."] [BENCH_ARGS=...] bash tests/gpu/ab_bench.sh
# BENCH_ARGS go to gpu_bench as they are (e.g. "--backward", with RINGATTN_BACKWARD_KERNEL=hopper
# in the environment for that kernel's rows alone).
# Output: $OUT/ab.csv (every pass) and the table on stdout.
set -u -o pipefail
: "${BASE_SRC:?set BASE_SRC to the baseline source tree}"
OUT=${OUT:-/tmp/ab}; PASSES=${PASSES:-2}; REPS=${REPS:-20}
NEW_B=${NEW_B:-/tmp/ab_new}; BASE_B=${BASE_B:-/tmp/ab_base}
SHAPES=${SHAPES:-"1,32,8,8192,8192,128,full 1,32,8,8192,8192,128,causal 1,32,8,32768,32768,128,causal
 4,32,8,2048,2048,128,causal 1,32,8,8192,8192,64,full 1,32,8,8192,8192,64,causal 4,32,32,4096,4096,64,causal
 8,32,8,1,32768,128,full 1,32,8,1,131072,128,full"}
mkdir -p "$OUT"
args=""; for s in $SHAPES; do args="$args --shape $s"; done
for pair in "$BASE_SRC:$BASE_B" ".:$NEW_B"; do
  src=${pair%%:*}; b=${pair##*:}
  # Always (incrementally) built: a build folder left by an earlier call may hold another tree's state.
  cmake -S "$src" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a >"$OUT/build_$(basename "$b").log" 2>&1 &&
    cmake --build "$b" -j"$(nproc)" --target ringattn_gpu_bench >>"$OUT/build_$(basename "$b").log" 2>&1 ||
    { echo "build of $src failed (see $OUT/build_$(basename "$b").log)"; tail -20 "$OUT/build_$(basename "$b").log"; exit 1; }
done
echo "pass,tree,shape,impl,tflops,ms,kv_gbps" >"$OUT/ab.csv"
for pass in $(seq 1 "$PASSES"); do
  for tree in base new; do
    b=$BASE_B; [ $tree = new ] && b=$NEW_B
    # shellcheck disable=SC2086
    "$b/tests/gpu/ringattn_gpu_bench" $args ${BENCH_ARGS:-} --reps "$REPS" 2>>"$OUT/bench_err.log" | tail -n +2 |
      sed "s/^/$pass,$tree,/" >>"$OUT/ab.csv" || echo "bench of $tree failed in pass $pass"
  done
done
python3 - "$OUT/ab.csv" <<'PY'
import csv, statistics, sys
rows = list(csv.reader(open(sys.argv[1])))[1:]
# pass,tree,<shape with commas>,impl,tflops,ms,kv_gbps: the shape has 7 comma-separated fields.
data = {}
for r in rows:
    if len(r) < 13: continue
    tree, shape, impl, tf = r[1], ",".join(r[2:9]), r[9], float(r[10])
    data.setdefault((shape, impl), {}).setdefault(tree, []).append(tf)
print("shape | measure | base TFLOP/s | new TFLOP/s | new/base (median of passes; each pass a median of reps)")
for (shape, impl), d in data.items():
    if impl not in ("ours", "ours_state", "ours_portable_state", "bwd_hopper", "bwd_mma"): continue
    b, n = statistics.median(d.get("base", [float("nan")])), statistics.median(d.get("new", [float("nan")]))
    print(f"{shape} | {impl} | {b:.1f} | {n:.1f} | {n / b:.3f}")
PY

#!/usr/bin/env bash
# One device call for the Hopper flash kernel: builds the test and bench straight from their
# sources (independent of work in progress elsewhere in the tree), runs the tests,
# compute-sanitizer racecheck/synccheck/memcheck on small cases, our bench and the peers
# (.bench/peers.py) on the same shapes, and prints a compact table last. Logs go to $OUT.
# Usage (repo root, on the GPU host): bash tests/gpu/hopper/gpu_host.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/hopper_out}
mkdir -p "$OUT"
B=/tmp/hopper_build
mkdir -p $B
INC="-I. -Isrc -Itests -I/usr/local/cuda/include"
NV="nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -I. -Isrc"
CX="g++ -std=c++20 -O2 -fopenmp $INC"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
($NV -Xptxas -v -c kernels/cuda/hopper/hopper_flash.cu -o $B/hf.o 2>&1 | grep -E "registers|spill|warn|error") > "$OUT/ptxas.txt" &
$NV -c tests/gpu/hopper/bench_hopper_flash.cu -o $B/bench.o &
$CX -c tests/gpu/hopper/test_hopper_flash.cpp -o $B/t.o &
for f in kernels/cuda/hopper/hopper_flash.cpp kernels/validate.cpp kernels/cpu/reference.cpp kernels/cpu/merge.cpp \
         kernels/cpu/flash.cpp; do
  $CX -c $f -o $B/$(basename $f .cpp).o &
done
wait
LIBS="-L/usr/local/cuda/lib64 -lcudart -lfmt -fopenmp -lpthread"
OBJS="$B/hf.o $B/hopper_flash.o $B/validate.o"
g++ -o $B/tests $B/t.o $OBJS $B/reference.o $B/merge.o $B/flash.o -lgtest -lgtest_main $LIBS || exit 1
g++ -o $B/bench $B/bench.o $OBJS $LIBS || exit 1
cuobjdump --dump-sass $B/hf.o > $B/hf.sass
echo "sass: HGMMA $(grep -c HGMMA $B/hf.sass) UTMALDG $(grep -c UTMALDG $B/hf.sass) LDL/STL $(grep -cE 'LDL|STL' $B/hf.sass)" >> "$OUT/ptxas.txt"
cat "$OUT/ptxas.txt"

timeout 150 $B/tests --gtest_color=no > "$OUT/tests.log" 2>&1
rc=$?
grep -E "hopper   \]|FAILED|PASSED|SKIPPED|Failure|error|Expected|Which is" "$OUT/tests.log" | head -60
echo "tests rc=$rc"
if [ $rc -eq 124 ]; then echo "tests timed out (a hang): skipping the rest"; exit 1; fi

SAN="--gtest_filter=HopperFlash.Fp16Dim64TailsGqa4:HopperFlash.CausalChunkedPrefill:HopperFlash.FoldCausalRowsWithNoKey"
for tool in racecheck synccheck memcheck; do
  timeout 100 compute-sanitizer --tool $tool $B/tests $SAN > "$OUT/san_$tool.log" 2>&1
  echo "$tool rc=$? :: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUT/san_$tool.log" | tr '\n' ' ')"
done

args=""
for s in 1,32,8,8192,8192,128,full 1,32,8,8192,8192,128,causal 4,32,8,2048,2048,128,full \
         4,32,8,2048,2048,128,causal 1,32,8,32768,32768,128,causal 1,32,8,8192,8192,64,full \
         1,32,8,8192,8192,64,causal; do
  args="$args --shape $s"
done
timeout 120 $B/bench $args > "$OUT/ours.csv" 2>&1
echo "bench rc=$?"
timeout 240 python3 .bench/peers.py --no-ceilings $args > "$OUT/peers.csv" 2>&1
echo "peers rc=$?"
python3 tests/gpu/hopper/table.py "$OUT/ours.csv" "$OUT/peers.csv" | tee "$OUT/table.txt"

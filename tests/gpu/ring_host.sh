#!/usr/bin/env bash
# One call on the GPU host for the GPU ring (issue 5) and the final kernel table: build, the CLI
# on the GPU, the GPU tests (the backend dispatches to the Hopper kernel on sm_90), the GPU ring
# tests under mpirun (NCCL at P=1, MPI staging at P=2/4), the ring's overhead against the plain
# kernel, our kernels beside the peers, and a memcheck pass. Logs in $OUT; summary on stdout.
set -u -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-/tmp/ring_host}; B=${BUILD_DIR:-/tmp/b}
# $OUT keeps the few files worth fetching (the tables and the main logs); the rest goes to $LOG.
LOG=${LOG:-/tmp/ring_host_logs}; mkdir -p "$OUT" "$LOG"
MPI="mpirun --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -x OMP_NUM_THREADS=2"
step() { echo "== $1: rc=$2 in $3 s"; }
# Stages to run (default all): STAGES="build cli tests mpi overhead bench memcheck"
STAGES=" ${STAGES:-build cli tests mpi overhead bench memcheck} "
has() { [[ $STAGES == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader

t0=$(date +%s)
cmake -S . -B "$B" -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a >"$LOG/build.log" 2>&1 &&
  timeout 300 cmake --build "$B" -j16 --target ringattn ringattn_gpu_tests ringattn_hopper_tests test_ring_gpu \
    ringattn_ring_overhead ringattn_gpu_bench >>"$LOG/build.log" 2>&1
rc=$?; step build $rc $(( $(date +%s) - t0 ))
[ $rc -eq 0 ] || { grep -E "error|FAILED" "$LOG/build.log" | head -30; exit 1; }
R=$B/bin/ringattn

if has cli; then
t0=$(date +%s)
{ timeout 60 $R run --device cuda --check; echo "rc=$?"
  timeout 60 $MPI -np 2 $R run --device cuda --transport mpi --causal --shard zigzag --seq 4096 --check; echo "rc=$?"
  timeout 60 $MPI -np 1 $R run --device cuda --transport nccl --causal --seq 8192 --check; echo "rc=$?"
  timeout 60 $MPI -np 4 $R run --device cuda --transport auto --shard striped --seq 4096 --check; echo "rc=$?"
  timeout 60 $MPI -np 1 $R run --device cuda --transport nccl --dry-run; echo "rc=$?"
  timeout 60 $MPI -np 2 $R run --device cuda --transport mpi --causal --check-finite --timeout 30 --check; echo "rc=$?"
  } >"$OUT/cli.log" 2>&1
step cli "$(grep -c 'rc=0' "$OUT/cli.log")/6-ok" $(( $(date +%s) - t0 )); grep -E "rc=|error|Error|picked|transport" "$OUT/cli.log" | head -20

fi
if has tests; then
t0=$(date +%s)
timeout 150 $B/tests/gpu/ringattn_gpu_tests --gtest_brief=1 >"$OUT/gpu_tests.log" 2>&1
step gpu_tests $? $(( $(date +%s) - t0 )); grep -E "^\[  (PASSED|FAILED)|Failure|seed" "$OUT/gpu_tests.log" | head -20
t0=$(date +%s)
timeout 120 $B/tests/gpu/hopper/ringattn_hopper_tests --gtest_brief=1 >"$OUT/hopper_tests.log" 2>&1
step hopper_tests $? $(( $(date +%s) - t0 )); grep -E "^\[  (PASSED|FAILED)|Failure|seed" "$OUT/hopper_tests.log" | head -20

fi
if has mpi; then
t0=$(date +%s)
# Every GPU ring test at np 1, 2 and 4: NCCL wherever each rank has a GPU of its own (np 2 on a
# 2-GPU host), MPI staging where ranks share a GPU. Counts come from gtest's summary lines, which
# --gtest_brief keeps (it drops the per-test OK lines).
gtest_counts() {  # LOG -> "N passed, M failed, K skipped" (colour codes stripped first)
  local p f k c
  c=$(sed 's/\x1b\[[0-9;]*m//g' "$1")
  p=$(grep -oE '^\[  PASSED  \] [0-9]+' <<<"$c" | head -1 | grep -oE '[0-9]+$')
  f=$(grep -oE '^\[  FAILED  \] [0-9]+ tests?,' <<<"$c" | head -1 | grep -oE '[0-9]+')
  k=$(grep -oE '^\[  SKIPPED \] [0-9]+' <<<"$c" | head -1 | grep -oE '[0-9]+$')
  echo "${p:-0} passed, ${f:-0} failed, ${k:-0} skipped"
}
GPUS=$(nvidia-smi -L | grep -c GPU)
for np in 1 2 4; do timeout 120 $MPI -np $np $B/tests/mpi/test_ring_gpu --gtest_brief=1 --gtest_color=no >"$LOG/ring_gpu_np$np.log" 2>&1
  rc=$?; echo "test_ring_gpu np$np ($GPUS GPUs) rc=$rc $(gtest_counts "$LOG/ring_gpu_np$np.log")"; done
step mpi_gpu_tests - $(( $(date +%s) - t0 )); grep -hE "Failure|rank [0-9].*:|MPI_Abort" "$LOG"/ring_*_np*.log | head -20

fi
if has overhead; then
t0=$(date +%s)
O=$B/tests/gpu/ringattn_ring_overhead
{ timeout 60 $MPI -np 1 $O --transport nccl --seq 8192 --causal --reps 20
  timeout 60 $MPI -np 1 $O --transport nccl --seq 8192 --reps 20
  timeout 60 $MPI -np 2 $O --transport mpi --seq 8192 --causal --shard zigzag --reps 5; } >"$OUT/overhead.log" 2>&1
step overhead $? $(( $(date +%s) - t0 )); cat "$OUT/overhead.log" | grep -vE "^\[|^--|^$" | head -30

fi
if has bench; then
SHAPES="4,32,8,2048,2048,128,full 4,32,8,2048,2048,128,causal 1,32,8,8192,8192,128,full 1,32,8,8192,8192,128,causal
 1,32,8,32768,32768,128,causal 1,32,8,8192,8192,64,full 1,32,8,8192,8192,64,causal 8,32,8,1,32768,128,full 1,32,8,1,131072,128,full"
args=""; for s in $SHAPES; do args="$args --shape $s"; done
t0=$(date +%s)
timeout 150 $B/tests/gpu/ringattn_gpu_bench $args --reps 20 --json "$LOG/ours.json" >"$OUT/ours.csv" 2>"$LOG/ours.err"
step bench $? $(( $(date +%s) - t0 )); cat "$LOG/ours.err" | head -5
t0=$(date +%s)
timeout 170 python3 .bench/peers.py $args >"$OUT/peers.csv" 2>"$LOG/peers.err"
step peers $? $(( $(date +%s) - t0 ))

python3 - "$OUT" <<'PY'
import csv, os, sys
out = sys.argv[1]
def load(n, cols):
    # The shape itself has commas: split the known columns off the right.
    p = os.path.join(out, n)
    if not os.path.exists(p): return []
    lines = open(p).read().splitlines()[1:]
    return [line.rsplit(",", cols) for line in lines if line.count(",") >= cols]
ours = load("ours.csv", 4)     # shape,impl,tflops,ms,kv_gbps
peers = load("peers.csv", 5)   # shape,peer,tflops,ms,kv_gbps,err
best = {}
for r in peers:
    try: v = float(r[2])
    except ValueError: continue
    if r[1] == "ceiling": print("ceiling", r[0], r[2], "TFLOP/s", r[4], "GB/s"); continue
    key = (r[0], r[1].replace("_gqa", ""))
    best[key] = max(best.get(key, 0), v)
    kvk = (r[0], r[1].replace("_gqa", ""), "kv")
    best[kvk] = max(best.get(kvk, 0), float(r[4] or 0))
nan = float("nan")
print("shape | ours TF/s | ours kernel | portable kernel | FA2 | cuDNN | ours/FA2 | ours/cuDNN | KV GB/s ours / cuDNN")
for s in dict.fromkeys(r[0] for r in ours):
    o = {r[1]: r for r in ours if r[0] == s}
    f = lambda k: float(o[k][2]) if k in o else nan
    fa, cu = best.get((s, "sdpa_flash"), nan), best.get((s, "sdpa_cudnn"), nan)
    kv = float(o["ours"][4]) if "ours" in o else nan
    print(f"{s} | {f('ours'):.1f} | {f('ours_state'):.1f} | {f('ours_portable_state'):.1f} | {fa:.1f} | {cu:.1f} | "
          f"{f('ours')/fa:.2f} | {f('ours')/cu:.2f} | {kv:.0f} / {best.get((s, 'sdpa_cudnn', 'kv'), nan):.0f}")
PY

fi
if has memcheck; then
t0=$(date +%s)
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 99 $B/tests/gpu/ringattn_gpu_tests --gtest_brief=1 \
  --gtest_filter='*bf16_d128*:*Fold*:*FusedOut*' >"$LOG/memcheck.log" 2>&1
step memcheck_hopper_dispatch $? $(( $(date +%s) - t0 )); grep -E "ERROR SUMMARY" "$LOG/memcheck.log"
t0=$(date +%s)
timeout 90 compute-sanitizer --tool racecheck --error-exitcode 99 $B/tests/gpu/ringattn_gpu_tests --gtest_brief=1 \
  --gtest_filter='*FusedOut*k0*' >"$LOG/racecheck.log" 2>&1
step racecheck_fused_out $? $(( $(date +%s) - t0 )); grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$LOG/racecheck.log"
fi

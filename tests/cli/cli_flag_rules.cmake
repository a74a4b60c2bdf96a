# Flags and environment: decimal integers, refused combinations, truthful check messages.
include(${HELPERS})
# Integers are decimal: 064 is 64 tokens, not octal 52; 08 is 8.
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --seq 064 --dim 010 --heads 02 --kv-heads 01
     STDOUT "heads 2/1 \\(MQA\\), q_len 64, kv_len 64, dim 10")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --seq 08 --dim 8 --heads 1 --kv-heads 1 STDOUT "q_len 8,")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 0x40 STDERR "--seq: must be a decimal integer \\(got '0x40'\\)")
foreach(seed -1 18446744073709551616 1e23)
  step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seed ${seed}
       STDERR "--seed: must be (a decimal integer|an integer) in 0..18446744073709551615 \\(got '${seed}'\\)")
endforeach()
# Integer flags name their real range, the flag and the value (int, int64 and the program's limits).
set(bench_small bench --heads 2 --kv-heads 1 --dim 16 -b 128 -e 128)
step(EXPECT_RC 1 COMMAND ${RINGATTN} ${bench_small} -n 2147483648
     STDERR "--iters: must be an integer in 1..2147483647 \\(got '2147483648'\\)")
step(EXPECT_RC 1 COMMAND ${RINGATTN} ${bench_small} -w 1000000000000
     STDERR "--warmup: must be an integer in 0..2147483647 \\(got '1000000000000'\\)")
step(EXPECT_RC 1 COMMAND ${RINGATTN} ${bench_small} -w 99999999999999999999
     STDERR "--warmup: must be an integer in 0..2147483647 \\(got '99999999999999999999'\\)")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --tile-q 2147483648 STDERR "--tile-q: must be an integer in 0..4096 \\(got '2147483648'\\)")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --tile-k 5000 STDERR "--tile-k: must be an integer in 0..4096 \\(got '5000'\\)")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --dim 99999999999999999999
     STDERR "--dim: must be an integer in 1..9223372036854775807 \\(got '99999999999999999999'\\)")
step(EXPECT_RC 1 COMMAND ${RINGATTN} plan --ranks 99999999999 STDERR "--ranks: must be an integer in 1..1048576 \\(got '99999999999'\\)")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --causal --q-offset 99999999999999999999
     STDERR "--q-offset: must be an integer in -9223372036854775808..9223372036854775807")
step(EXPECT_RC 1 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_MPI_TIMEOUT_S=0x10 ${RINGATTN} run --dry-run
     STDERR "RINGATTN_MPI_TIMEOUT_S='0x10' must be a number of seconds")
# --help-env and --version together: one would be dropped; refused.
step(EXPECT_RC 1 COMMAND ${RINGATTN} --help-env --version
     STDERR "--version and --help-env each print one thing and exit: give one of them")
# Every RINGATTN_* variable is listed by --help-env (core/settings.hpp's table, README's too).
step(EXPECT_RC 0 COMMAND ${RINGATTN} --help-env
     STDOUT "RINGATTN_FAULT\n" "RINGATTN_LOG_LEVEL\n" "RINGATTN_MPI_TIMEOUT_S\n" "RINGATTN_MPI_PROGRESS\n"
            "RINGATTN_FLASH_KERNEL\n" "RINGATTN_BACKWARD_KERNEL\n" "RINGATTN_BACKWARD_DQ\n" "RINGATTN_HOPPER_TILE\n"
            "RINGATTN_HOPPER_LAZY\n  lazy rescaling[^\n]*\n  values:  1, 0\n  default: 1\n")
# A bad value stops the run where the variable is used, naming it: the log level unless --log-level
# gives one; the CUDA kernel variables and the MPI progress not at all on one CPU process.
step(EXPECT_RC 1 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_LOG_LEVEL=loud ${RINGATTN} run --seq 64
     STDERR "RINGATTN_LOG_LEVEL='loud' is not understood: allowed are trace, debug, info, warn, error, critical, off")
step(EXPECT_RC 0 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_LOG_LEVEL=loud ${RINGATTN} run --seq 64 --log-level warn)
step(EXPECT_RC 0 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_LOG_LEVEL=WARNING ${RINGATTN} run --seq 64)
step(EXPECT_RC 0 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_FLASH_KERNEL=bogus RINGATTN_HOPPER_TILE=huge
     RINGATTN_MPI_PROGRESS=bogus ${RINGATTN} run --seq 64 STDOUT "q_len 64")
# A malformed RINGATTN_FAULT is refused in one process too, not only under mpirun.
step(EXPECT_RC 1 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_FAULT=garbage ${RINGATTN} run --seq 64
     STDERR "RINGATTN_FAULT='garbage' is not RANK:HOP:KIND\\[:PHASE\\] with RANK, HOP >= 0, KIND one of exit, hang, corrupt, error, throw and PHASE one of forward \\(the default\\), backward, grads")
step(EXPECT_RC 1 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_FAULT=010:0:exitt ${RINGATTN} bench -b 64 -e 64
     STDERR "RINGATTN_FAULT='010:0:exitt'")
# A RINGATTN_FAULT that could never fire is refused, naming the value and the allowed range.
step(EXPECT_RC 1 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_FAULT=1:0:exit ${RINGATTN} run --seq 64
     STDERR "RINGATTN_FAULT=1:0:exit names rank 1, but the world has 1 rank \\(0..0\\)")
step(EXPECT_RC 1 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_FAULT=0:0:exit ${RINGATTN} run --seq 64
     STDERR "RINGATTN_FAULT=0:0:exit can never fire: rank 0 posts no exchange at hop 0 of the forward ring \\(this problem's ring takes 1 hop over 1 rank\\); on rank 0, exit can fire at no hop\n")
step(EXPECT_RC 1 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_FAULT=0:1:throw ${RINGATTN} bench -b 64 -e 64
     STDERR "RINGATTN_FAULT=0:1:throw can never fire: rank 0 computes on no block at hop 1 of the forward ring \\(this problem's ring takes 1 hop over 1 rank\\); on rank 0, throw can fire at hop 0 \\(bench faults the ring of its first size, seq 64: -b sets it\\)\n")
step(EXPECT_RC 1 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_FAULT=0:0:throw ${RINGATTN} run --seq 4 --kv-seq 64 --dry-run
     STDERR "RINGATTN_FAULT=0:0:throw applies to ring runs; this is a distributed decode \\(q_len 4 != kv_len 64\\)")
# Flags a combination would silently ignore.
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --q-offset 3
     STDERR "--q-offset 3 only shifts the causal mask or the window and does nothing without --causal or --window")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --window -1,-1 --q-offset 5
     STDERR "--q-offset 5 only shifts the causal mask or the window and does nothing without --causal or --window")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --check-rows 5 STDERR "--check-rows 5 without the check does nothing")
step(EXPECT_RC 1 COMMAND sh -c "'${RINGATTN}' run --seq 64 --out ''" STDERR "--out: the path is empty; give a file name")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random q.npy fp32 1 2 64 16 ${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random k.npy fp32 1 1 64 16 1${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random v16.npy fp16 1 1 64 16 2${SEED})
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q q.npy --k k.npy --v v16.npy --seq 128 --dim 128
     STDERR "--seq does not apply with --q/--k/--v")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q q.npy --k k.npy --v v16.npy
     STDERR "--v v16.npy holds fp16: give files of one dtype, or --dtype to convert them all")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --q q.npy --k k.npy --v v16.npy --dtype fp32 --check STDOUT "-> OK")
# fp16 overflow of a finite input is named as such.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random big.npy fp32 1 2 64 16 ${SEED} 1e5)
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q big.npy --k k.npy --v k.npy --dtype fp16 --check-finite
     STDERR "q holds -?[0-9.e+]+ at \\[batch 0, head [0-9], token [0-9]+, dim [0-9]+\\], which overflows fp16 \\(largest finite 65504\\)")
# Large scores (q, k ~ N(0, 30^2): |lse| in the thousands) pass the fp32 check: its LSE bound is relative.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random q30.npy fp32 1 2 128 64 ${SEED} 30)
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random k30.npy fp32 1 1 128 64 1${SEED} 30)
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random v30.npy fp32 1 1 128 64 2${SEED})
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --q q30.npy --k k30.npy --v v30.npy --causal --check STDOUT "-> OK")
# ... and so does their backward (issue 39, second pass: the gradient bound had no allowance for the
# scores' magnitude, which fp32 rounding scales with, and failed correct runs near 2.7e-4).
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random do30.npy fp32 1 2 128 64 3${SEED})
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --q q30.npy --k k30.npy --v v30.npy --do do30.npy --causal --backward --check
     STDOUT "dv max abs [^\n]+ -> OK" "tolerance fp32: max \\|g - ref\\| <= \\(1e-04 \\+ 1e-06 x score magnitude [0-9.e+]+\\) max")
# A NaN in q (element 40: head 0, token 2): the message counts the non-finite values, the whole
# output row that the query reaches (16 values) and its log-sum-exp.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} poison q.npy 40 nan)
step(EXPECT_RC 2 COMMAND ${RINGATTN} run --q q.npy --k k.npy --v k.npy --causal --out o.npy
     STDERR "non-finite results: 16 in the output, 1 in the log-sum-exp \\(a NaN or Inf in q, k or v")
# bench --no-check shows that nothing was compared.
step(EXPECT_RC 0 COMMAND ${RINGATTN} bench -b 64 -e 128 -n 1 -w 0 --no-check
     STDOUT "\n +64 +flash +[0-9.]+ +[0-9.]+ +GFLOP/s +[0-9.na/]+ +[0-9]+ +[0-9.]+ [KMG]?i?B +- +- +0 +[^\n]+ +-\n" "# Result: not checked")
step(EXPECT_RC 0 COMMAND ${RINGATTN} bench --help STDOUT "write the sweep as one JSON record")
# A decode shards only its keys (contiguously): an explicit --shard is refused, not ignored.
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 4 --kv-seq 100 --shard striped
     STDERR "--shard striped: a decode \\(q_len 4, kv_len 100, q_offset 96\\) has no query sharding: every rank holds every query")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --seq 4 --kv-seq 100 --shard auto --check)
# An alias beside the flag it sets: --naive is --impl naive, so --naive --impl both is refused (naive won).
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench -b 64 -e 64 -n 1 --naive --impl both
     STDERR "--naive is --impl naive and --impl is given too; give one of them")
# bench --impl naive runs the fp64 oracle alone: flags of the flash runs are refused (they were
# accepted and ignored), and the header says nothing is checked.
foreach(f "--check-rows;4" "--tile-q;16" "--shard;zigzag" "--deterministic;--backward")
  list(GET f 0 name)
  step(EXPECT_RC 1 COMMAND ${RINGATTN} bench -b 64 -e 64 -n 1 --dim 8 --impl naive ${f}
       STDERR "${name} does nothing with --impl naive \\(the fp64 oracle on one process: not sharded, not tiled, the reference itself\\); drop ${name}")
endforeach()
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench -b 64 -e 64 -n 1 --dim 8 --naive --tile-k 16 STDERR "--tile-k does nothing with --impl naive")
step(EXPECT_RC 0 COMMAND ${RINGATTN} bench -b 64 -e 64 -n 1 --dim 8 --impl naive
     STDOUT "# check: none \\(the fp64 oracle is the reference; non-finite values counted\\)" "# Result: not checked")
# A path option followed by a flag takes the flag as its path in CLI11: refused, naming both, so
# that "--out --causal" does not write a file named --causal and run without the mask.
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --out --causal
     STDERR "--out: '--causal' is a flag, not a path: give the path first \\(a file whose name starts with '-' as ./--causal\\)")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --json --check --dry-run STDERR "--json: '--check' is a flag, not a path")
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench -b 64 -e 64 --json --no-check STDERR "--json: '--no-check' is a flag, not a path")

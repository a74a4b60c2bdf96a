# `ringattn plan` at the largest inputs its flags allow (issue 12: memory grew with ranks^2, past
# 20 GB at 16384 ranks, and 1048576 ranks ran for over a minute). Each plan runs under a memory
# bound (ulimit -v 256 MiB; not under AddressSanitizer, which reserves terabytes of address
# space); its time is judged by how it grows, not by a clock: 4 x the ranks must take well under
# the 16 x that ranks^2 work would (a ratio of two runs in this test, so a loaded machine slows
# both).
# Variables: RINGATTN, SANITIZE, HELPERS, WORK_DIR.
include(${HELPERS})
set(bound "")
if(NOT SANITIZE)
  set(bound "ulimit -v 262144 && ")
endif()
# plan_step(<stdout regex> <plan args...>)
function(plan_step expect)
  string(REPLACE ";" " " args "${ARGN}")
  step(EXPECT_RC 0 COMMAND sh -c "${bound}exec ${RINGATTN} plan ${args}" STDOUT "${expect}")
endfunction()
# The largest rank count (1 << 20): a summary instead of a row per rank.
plan_step("1048576 ranks: one row per rank is printed up to 1024 ranks" --seq 2097152 --ranks 1048576 --causal)
plan_step("GFLOP per rank: max 2\\.147 \\(rank 1048575\\), min 0\\.000 \\(rank 0\\)"
          --seq 1048576 --ranks 1048576 --causal --shard contiguous)
# The repro: 16384 ranks, contiguous.
plan_step("tokens per rank 2\n" --seq 32768 --ranks 16384 --shard contiguous)
# The most ranks that still get a row each (and their kernel calls): 1024.
plan_step("\n +1023 +2 +1024 " --seq 2048 --ranks 1024 --causal --shard striped)
# A long sequence: GFLOP in exponent form keep the columns (21 digits pushed them apart); past
# 64-bit bytes of q, k and v, the refusal names the product.
plan_step("\n +0 274877906944 +8 +3\\.0949e\\+17 +0 hops +25\\.0% " --seq 1099511627776 --ranks 4 --causal)
step(EXPECT_RC 1 COMMAND ${RINGATTN} plan --seq 9223372036854775807 --ranks 4
     STDERR "plan's bytes \\(batch x heads x seq x dim x 3 tensors x dtype bytes\\): 8 x 9223372036854775807 does not fit in a 64-bit integer")
# Past the flag's range: refused.
step(EXPECT_RC 1 COMMAND ${RINGATTN} plan --seq 4194304 --ranks 1048577 STDERR "--ranks")

# The time grows linearly with the ranks: the plan of 1048576 ranks against the one of 262144 (4 x:
# linear work takes about 4 x as long, ranks^2 work 16 x). The bound, 8 x, leaves room for one run
# slowed by the machine's load; an attempt that still misses it is retried, up to 3 in all.
function(plan_microseconds out ranks)
  string(TIMESTAMP t0 "%s%f")
  execute_process(COMMAND sh -c "${bound}exec ${RINGATTN} plan --seq 2097152 --ranks ${ranks} --causal"
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err TIMEOUT 120)
  string(TIMESTAMP t1 "%s%f")
  if(NOT rc STREQUAL "0")
    message(FATAL_ERROR "plan --ranks ${ranks}: exit '${rc}': ${err}")
  endif()
  math(EXPR us "${t1} - ${t0}")
  set(${out} ${us} PARENT_SCOPE)
endfunction()
set(ratios "")
foreach(attempt 1 2 3)
  plan_microseconds(small 262144)
  plan_microseconds(large 1048576)
  math(EXPR ratio100 "100 * ${large} / (${small} + 1)")
  list(APPEND ratios "${large} us / ${small} us = ${ratio100}/100")
  message("attempt ${attempt}: 1048576 ranks ${large} us, 262144 ranks ${small} us: ratio ${ratio100}/100")
  if(ratio100 LESS 800)
    break()
  endif()
  if(attempt EQUAL 3)
    message(FATAL_ERROR "plan's time grows faster than the ranks: 4 x the ranks took 8 x or more in 3 attempts "
                        "(${ratios})")
  endif()
endforeach()

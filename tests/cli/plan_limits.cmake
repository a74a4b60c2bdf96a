# `ringattn plan` at the largest inputs its flags allow (issue 12: memory grew with ranks^2, past
# 20 GB at 16384 ranks, and 1048576 ranks ran for over a minute). Each plan runs under a memory
# bound (ulimit -v 256 MiB; not under AddressSanitizer, which reserves terabytes of address
# space) and the test under a ctest TIMEOUT of a few seconds per plan (tests/cli/CMakeLists.txt).
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
# Past the flag's range: refused.
step(EXPECT_RC 1 COMMAND ${RINGATTN} plan --seq 4194304 --ranks 1048577 STDERR "--ranks")

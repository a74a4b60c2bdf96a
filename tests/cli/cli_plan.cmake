# `ringattn plan`: the schedule without a run; zigzag balances causal work exactly, contiguous
# does not; an indivisible length is refused with the required multiple.
include(${HELPERS})
step(EXPECT_RC 0 COMMAND ${RINGATTN} plan --seq 8192 --ranks 4 --causal
     STDOUT "\n +3 +2048 +[0-9]+ +[0-9.]+ +[0-9]+ hops +25.0%  .3072,5120."
            "contiguous 1.75 zigzag 1.00")
step(EXPECT_RC 0 COMMAND ${RINGATTN} plan --seq 12 --ranks 3 --shard striped STDOUT "0\\+3k")
step(EXPECT_RC 1 COMMAND ${RINGATTN} plan --seq 13 --ranks 3 STDERR "multiple of 2 x ranks = 6")

# `ringattn plan`: the schedule without a run; zigzag balances causal work exactly, contiguous
# does not; any length splits; --shard auto (the default) names its pick.
include(${HELPERS})
step(EXPECT_RC 0 COMMAND ${RINGATTN} plan --seq 8192 --ranks 4 --causal STDOUT "zigzag sharding \\(auto: the best balanced\\)")
step(EXPECT_RC 0 COMMAND ${RINGATTN} plan --seq 8192 --ranks 4 --causal
     STDOUT "\n +3 +2048 +[0-9]+ +[0-9.]+ +[0-9]+ hops +25.0% +[0-9]+  .3072,5120."
            "contiguous 1.75 zigzag 1.00")
step(EXPECT_RC 0 COMMAND ${RINGATTN} plan --seq 12 --ranks 3 --shard striped STDOUT "0\\+3k")
# Any length: uneven shards (13 over 3 ranks in 6 zigzag chunks of 2 or 3 tokens), and more
# ranks than tokens (a rank with none).
step(EXPECT_RC 0 COMMAND ${RINGATTN} plan --seq 13 --ranks 3 --causal --shard zigzag
     STDOUT "\n +0 +5 [^\n]+ .0,2. .10,13." "\n +1 +4 [^\n]+ .2,4. .8,10." "\n +2 +4 [^\n]+ .4,8."
            "contiguous [0-9.]+ zigzag [0-9.]+ striped [0-9.]+")
step(EXPECT_RC 0 COMMAND ${RINGATTN} plan --seq 3 --ranks 4 --shard contiguous STDOUT "\n +0 +0 +0 ")
# Packed documents (--doc-lens, as for run): the plan follows the runner's --shard auto choice and
# its balance line names doc-zigzag; lengths that miss the sequence are refused as run refuses them.
step(EXPECT_RC 0 COMMAND ${RINGATTN} plan --seq 64 --ranks 2 --causal --doc-lens 16,48
     STDOUT "doc-zigzag sharding \\(auto: the best balanced\\), causal, 2 packed documents"
            "\n +0 +32 +[^\n]+.0,4\\) .12,28\\) .52,64\\)\n"  # (. for a bracket: CMake lists do not split inside one)
            "balance [^\n]*contiguous 1.59 zigzag 1.20 striped 1.02 doc-zigzag 1.00\n")
step(EXPECT_RC 1 COMMAND ${RINGATTN} plan --seq 64 --doc-lens 16,40
     STDERR "the 2 document lengths add up to 56, but the sequence has 64 tokens")
step(EXPECT_RC 1 COMMAND ${RINGATTN} plan --seq 64 --ranks 2000 --doc-lens 32,32
     STDERR "plan --doc-lens builds every rank's schedule: up to 1024 ranks \\(got --ranks 2000\\)")
# plan's byte figures are 64-bit: a problem whose tensors do not fit is refused, not printed as 0 bytes.
step(EXPECT_RC 1 COMMAND ${RINGATTN} plan --seq 64 --ranks 2 --batch 4611686018427387904 --kv-heads 2 --dim 2
     STDERR "plan's bytes \\(batch x heads x seq x dim x 3 tensors x dtype bytes\\): [0-9]+ x [0-9]+ does not fit in a 64-bit integer")

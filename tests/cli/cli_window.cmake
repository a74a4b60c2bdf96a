# Sliding windows (--window LEFT,RIGHT, FlashAttention's window_size): checked against the fp64
# reference, the rate counts visible pairs exactly, plan prints the hops and the bytes, bad
# windows are refused by name.
include(${HELPERS})
set(P --heads 8 --kv-heads 2 --dim 64 --seed ${SEED})
# Causal window 5 over 77 tokens: rows 0..4 see 1..5 keys, the other 72 see 6: 15 + 432 = 447
# pairs x 4 x 8 heads x 64 = 0.000915 GFLOP.
step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${P} --seq 77 --causal --window 5,0 --check --json w.json
     STDOUT "window 5,0" "0.001 GFLOP" "-> OK")
file(READ ${WORK_DIR}/w.json json)
string(JSON flops GET "${json}" flops)
string(JSON hops GET "${json}" hops)
if(NOT flops EQUAL 915456 OR NOT hops EQUAL 1)
  message(FATAL_ERROR "w.json: flops ${flops} (want 447 x 4 x 8 x 64 = 915456), hops ${hops} (want 1)")
endif()
# Both edges without causal, documents, a window wider than the sequence, a right edge only.
step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${P} --seq 300 --window 7,3 --doc-lens 100,1,150,49 --check STDOUT "-> OK")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${P} --seq 64 --causal --window 1000,-1 --check STDOUT "-> OK")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${P} --seq 64 --window -1,4 --check STDOUT "-> OK")
# Decode against a cache with a window, and a --q-offset that the window uses.
step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${P} --seq 3 --kv-seq 200 --window 20,2 --q-offset 100 --check STDOUT "-> OK")
# A window wider than the sequence is the plain mask: the same output.
step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${P} --seq 64 --causal --window 64,0 --out wide.npy)
step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${P} --seq 64 --causal --out plain.npy)
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare wide.npy plain.npy 0)
step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${P} --seq 64 --causal --window 8,0 --out narrow.npy)
step(EXPECT_RC 1 COMMAND ${NPY_TOOL} compare narrow.npy plain.npy 1e-3)
# plan: contiguous shards and a window shorter than a shard take one hop of exchange and send one
# window's K/V (100 tokens x 2 KV heads x 64 x 4 bytes x K and V = 102400 bytes), the last rank
# nothing.
step(EXPECT_RC 0 COMMAND ${RINGATTN} plan --seq 1000 --ranks 4 --causal --window 100,0 --shard contiguous
     STDOUT "ring hops: 2 of 4" "\n +0 +250 +1 [^\n]+ +102400  .0,250." "\n +3 +250 +2 [^\n]+ +0  .750,1000."
            "sent in all: 307200 bytes")
# Auto: contiguous when its first rank's short ramp keeps it balanced (it sends the least); a
# window of 40% of a shard unbalances it past 5%, and striped balances the work instead.
step(EXPECT_RC 0 COMMAND ${RINGATTN} plan --seq 4000 --ranks 4 --causal --window 100,0
     STDOUT "contiguous sharding \\(auto: the best balanced\\), causal, window 100,0")
step(EXPECT_RC 0 COMMAND ${RINGATTN} plan --seq 1000 --ranks 4 --causal --window 100,0
     STDOUT "striped sharding \\(auto: the best balanced\\)" "contiguous 1.05 zigzag 1.05 striped 1.00")
# Refusals, by name.
step(EXPECT_RC 1 COMMAND ${RINGATTN} run ${P} --seq 64 --causal --window 5,3
     STDERR "window right 3 does not fit causal attention: with causal the right edge is the diagonal, so right must be 0 or -1")
foreach(bad "5" "a,1" "5,-2" "1,2,3" ",4" "4,")
  step(EXPECT_RC 1 COMMAND ${RINGATTN} run ${P} --seq 64 --window "${bad}"
       STDERR "--window '${bad}' is not understood: give LEFT,RIGHT, each -1 \\(unbounded\\) or a number of tokens >= 0")
endforeach()
# A side past 64 bits is named as out of range (not "not understood"), with the range.
step(EXPECT_RC 1 COMMAND ${RINGATTN} run ${P} --seq 64 --window 99999999999999999999,0
     STDERR "--window '99999999999999999999,0': the left side 99999999999999999999 is out of range: each side is -1 \\(unbounded\\) or 0 to 9223372036854775807 tokens")
step(EXPECT_RC 1 COMMAND ${RINGATTN} plan --seq 64 --ranks 2 --window 4,-12345678901234567890
     STDERR "the right side -12345678901234567890 is out of range")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run ${P} --seq 4 --kv-seq 64 --window 2,1 --q-offset 70
     STDERR "the window \\(left 2, right 1\\) leaves queries 0 to 3 \\(positions 70 to 73\\) with no visible key among the 64 keys")
# The rows without a key are named whole, from the first (it named the last, 63, where 1 to 63 have none).
step(EXPECT_RC 1 COMMAND ${RINGATTN} run ${P} --seq 64 --kv-seq 100 --causal --window 2,0 --q-offset 101
     STDERR "leaves queries 1 to 63 \\(positions 102 to 164\\) with no visible key among the 100 keys")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run ${P} --seq 8 --kv-seq 64 --window 2,1 --q-offset -5
     STDERR "leaves queries 0 to 3 \\(positions -5 to -2\\) with no visible key")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run ${P} --seq 2 --kv-seq 64 --window 0,0 --q-offset 63
     STDERR "leaves query 1 \\(position 64\\) with no visible key")
step(EXPECT_RC 1 COMMAND ${RINGATTN} plan --seq 64 --ranks 2 --causal --window 4,2
     STDERR "window right 2 does not fit causal attention")

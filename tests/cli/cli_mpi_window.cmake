# Sliding windows over MPI ranks: checked output, and the bytes and hops that plan predicts.
include(${HELPERS})
set(P --heads 4 --kv-heads 2 --dim 32 --seq 1001 --causal --window 100,0)
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run ${P} --seed ${SEED} --shard contiguous --check --json m.json STDOUT "-> OK")
file(READ ${WORK_DIR}/m.json json)
string(JSON hops GET "${json}" hops)
string(JSON sent GET "${json}" bytes_sent)
# Two ranks (the MPI scenarios' world): one hop of exchange; rank 0 sends the last 100 tokens of
# its 500 (2 KV heads x 32 x 4 bytes x K and V = 512 bytes a token), rank 1 nothing.
if(NOT hops EQUAL 2 OR NOT sent EQUAL 51200)
  message(FATAL_ERROR "m.json: hops ${hops} (want 2), bytes_sent ${sent} (want 51200)")
endif()
step(EXPECT_RC 0 COMMAND ${RINGATTN} plan --ranks 2 ${P} --shard contiguous STDOUT "ring hops: 2 of 2"
     "sent in all: 51200 bytes")
# Zigzag and striped: blocks travel farther, the output is the same.
foreach(sh zigzag striped)
  step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run ${P} --seed ${SEED} --shard ${sh} --check STDOUT "-> OK")
endforeach()

# Packed documents over two ranks: every sharding's gathered output equals one process, with
# documents of one token, documents shorter than a shard and one spanning both ranks.
include(${HELPERS})
set(P --heads 4 --kv-heads 2 --seq 301 --dim 32 --causal --doc-lens 1,40,200,3,57 --seed ${SEED})
step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${P} --out m1.npy --lse ml1.npy)
foreach(shard zigzag contiguous striped)
  step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run ${P} --check --shard ${shard} --out m_${shard}.npy
       --lse ml_${shard}.npy STDOUT "5 packed documents" "-> OK")
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare m1.npy m_${shard}.npy 1e-5)
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare ml1.npy ml_${shard}.npy 1e-5)
endforeach()
# --shard auto (the default) picks the best balanced layout for the documents: here striped
# (zigzag leaves one rank with most of the two long documents' pairs), and the check holds.
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --heads 2 --kv-heads 1 --dim 16 --seq 1200 --causal --check
     --doc-lens 40,40,40,40,40,40,40,40,40,40,400,400 STDOUT "striped sharding, 12 packed documents" "-> OK")

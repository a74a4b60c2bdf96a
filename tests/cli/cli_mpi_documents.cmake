# Packed documents over two ranks: every sharding's gathered output equals one process, with
# documents of one token, documents shorter than a shard and one spanning both ranks.
include(${HELPERS})
set(P --heads 4 --kv-heads 2 --seq 301 --dim 32 --causal --doc-lens 1,40,200,3,57 --seed ${SEED})
step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${P} --out m1.npy --lse ml1.npy)
foreach(shard zigzag contiguous striped doc-zigzag)
  step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run ${P} --check --shard ${shard} --out m_${shard}.npy
       --lse ml_${shard}.npy STDOUT "5 packed documents" "-> OK")
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare m1.npy m_${shard}.npy 1e-5)
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare ml1.npy ml_${shard}.npy 1e-5)
endforeach()
# --shard auto (the default) picks the best balanced layout for the documents: here doc-zigzag,
# which splits every document over the ranks (zigzag leaves one rank with most of the two long
# documents' pairs), and the check holds.
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --heads 2 --kv-heads 1 --dim 16 --seq 1200 --causal --check
     --doc-lens 40,40,40,40,40,40,40,40,40,40,400,400 STDOUT "doc-zigzag sharding, 12 packed documents" "-> OK")
# Packed THD files over two ranks: every rank reads its shard's rows; rank 0 writes the packed
# layout, equal to one process.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random3 q3.npy fp32 301 4 16 ${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random3 k3.npy fp32 301 2 16 1${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random3 v3.npy fp32 301 2 16 2${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} ints cu.npy i4 0 1 41 241 244 301)
set(T --q q3.npy --k k3.npy --v v3.npy --cu-seqlens cu.npy --causal)
step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${T} --out p1.npy --lse pl1.npy)
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run ${T} --check --out p2.npy --lse pl2.npy STDOUT "-> OK")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare p1.npy p2.npy 1e-5)
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare pl1.npy pl2.npy 1e-5)

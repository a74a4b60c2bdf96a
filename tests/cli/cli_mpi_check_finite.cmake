# --check-finite: a NaN or Inf in an input stops the run before any kernel, naming the rank, the
# tensor and the global index; a finite problem passes with the flag on.
include(${HELPERS})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random q.npy fp32 1 2 64 16 ${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random k.npy fp32 1 1 64 16 ${SEED}1)
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random v.npy fp32 1 1 64 16 ${SEED}2)
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --q q.npy --k k.npy --v v.npy --causal --check-finite --check)
# k[0, 0, 37, 5] (flat index 37 x 16 + 5) becomes +Inf.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} poison k.npy 597 inf)
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q q.npy --k k.npy --v v.npy --causal --check-finite
     STDERR "rank 0: --check-finite: k holds inf at \\[batch 0, head 0, token 37, dim 5\\]" "run was not started")
# Zigzag over two ranks: token 37 is in chunk 2 of 4, held by rank 1, which names itself; the job
# ends with exit code 1 on every rank.
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run --q q.npy --k k.npy --v v.npy --causal --shard zigzag --check-finite
     STDERR "\\[rank 1/2 [^]]*\\] [^\n]*rank 1: --check-finite: k holds inf at \\[batch 0, head 0, token 37, dim 5\\]")
# q[0, 1, 3, 0] (flat 64 x 16 + 3 x 16) becomes NaN.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random k.npy fp32 1 1 64 16 ${SEED}1)
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} poison q.npy 1072 nan)
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q q.npy --k k.npy --v v.npy --check-finite
     STDERR "q holds nan at \\[batch 0, head 1, token 3, dim 0\\]")
# The dry run gives the run's verdict on the inputs (it printed OK), on one process and over ranks.
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q q.npy --k k.npy --v v.npy --check-finite --dry-run
     STDERR "q holds nan at \\[batch 0, head 1, token 3, dim 0\\]")
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run --q q.npy --k k.npy --v v.npy --check-finite --dry-run --shard striped
     STDERR "q holds nan at \\[batch 0, head 1, token 3, dim 0\\]")
# ... and on dO with --backward.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random q.npy fp32 1 2 64 16 ${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random do.npy fp32 1 2 64 16 ${SEED}3)
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} poison do.npy 70 inf)
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q q.npy --k k.npy --v v.npy --backward --do do.npy --check-finite --dry-run
     STDERR "dO holds inf")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --q q.npy --k k.npy --v v.npy --check-finite --dry-run STDOUT "dry run: OK")

# Errors under mpirun end every rank with a message, never a hang (each step is bounded).
include(${HELPERS})
step(EXPECT_RC nonzero COMMAND ${MPIRUN} ${RINGATTN} run --seq 0 --shard zigzag
     STDERR "--seq: must be an integer in 1..9223372036854775807 \\(got '0'\\)")
step(EXPECT_RC nonzero COMMAND ${MPIRUN} ${RINGATTN} run --heads 7 --kv-heads 2 STDERR "--heads 7")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random q.npy fp32 1 2 64 32 ${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random k.npy fp32 1 2 64 32 ${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} corrupt k.npy truncated)
step(EXPECT_RC nonzero COMMAND ${MPIRUN} ${RINGATTN} run --q q.npy --k k.npy --v k.npy STDERR "k.npy")
step(EXPECT_RC nonzero COMMAND ${MPIRUN} ${RINGATTN} run --seq 64 --out /nonexistent-dir/o.npy
     STDERR "/nonexistent-dir/o.npy")
step(EXPECT_RC nonzero COMMAND ${MPIRUN} ${RINGATTN} bench --impl naive -b 64 -e 64 STDERR "one CPU process")
# A FIFO as input: refused on every rank before it is opened, never a hang.
step(EXPECT_RC 0 COMMAND mkfifo qfifo)
step(EXPECT_RC nonzero COMMAND ${MPIRUN} ${RINGATTN} run --q qfifo --k q.npy --v q.npy --timeout 3
     STDERR "--q 'qfifo' is not a regular file \\(a FIFO\\)")
# A RINGATTN_FAULT that could never fire is refused on every rank at start-up (issue M3).
step(EXPECT_RC nonzero COMMAND ${MPIRUN} -x RINGATTN_FAULT=5:0:exit ${RINGATTN} run --seq 64
     STDERR "RINGATTN_FAULT=5:0:exit names rank 5, but the world has 2 ranks \\(0..1\\)")
step(EXPECT_RC nonzero COMMAND ${MPIRUN} -x RINGATTN_FAULT=1:1:exit ${RINGATTN} run --seq 64
     STDERR "RINGATTN_FAULT=1:1:exit can never fire: rank 1 posts no exchange at hop 1 of the forward ring \\(this problem's ring takes 2 hops over 2 ranks\\); on rank 1, exit can fire at hop 0\n")
step(EXPECT_RC nonzero COMMAND ${MPIRUN} -x RINGATTN_FAULT=1:0:exit ${RINGATTN} run --seq 4 --kv-seq 64
     STDERR "applies to ring runs; this is a distributed decode \\(q_len 4 != kv_len 64\\)")
# --backward under mpirun runs the ring backward, which needs self-attention: a decode problem is
# refused on every rank before any ring, printed once.
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run --backward --causal --seq 30 --kv-seq 50
     STDERR "--backward over 2 ranks runs the ring backward, which needs self-attention \\(q_len == kv_len, q_offset 0\\); got q_len=30, kv_len=50, q_offset=20")
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} bench --backward --kv-seq 64 -b 4 -e 8
     STDERR "bench --backward --kv-seq over 2 ranks: the ring backward needs self-attention")

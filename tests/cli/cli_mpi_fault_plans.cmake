# RINGATTN_FAULT plans that can never fire are refused at start-up on every rank, before any
# exchange, naming the rank, the hop, the ring and the hops the kind could fire at (issue 39: they
# used to run to exit 0 with the hop skipped); plans at the last hop of a short ring, and in the
# ring backward, fire.
include(${HELPERS})
set(MPIRUN4 ${MPIEXEC} -np 4 --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)
set(windowed --seq 512 --causal --window 16,0 --shard contiguous)
# The repros: a window's ring takes 2 hops over 4 ranks; causal contiguous rank 0 computes at hop 0 only.
step(EXPECT_RC 1 COMMAND ${MPIRUN4} -x RINGATTN_FAULT=2:2:exit ${RINGATTN} run ${windowed}
     STDERR "RINGATTN_FAULT=2:2:exit can never fire: rank 2 posts no exchange at hop 2 of the forward ring \\(this problem's ring takes 2 hops over 4 ranks\\); on rank 2, exit can fire at hop 0\n")
step(EXPECT_RC 1 COMMAND ${MPIRUN} -x RINGATTN_FAULT=0:1:throw ${RINGATTN} run --seq 512 --causal --shard contiguous
     STDERR "RINGATTN_FAULT=0:1:throw can never fire: rank 0 computes on no block at hop 1 of the forward ring \\(this problem's ring takes 2 hops over 2 ranks\\); on rank 0, throw can fire at hop 0\n")
# The dry run and bench refuse them alike.
step(EXPECT_RC 1 COMMAND ${MPIRUN} -x RINGATTN_FAULT=0:1:throw ${RINGATTN} run --seq 512 --causal --shard contiguous
     --dry-run STDERR "RINGATTN_FAULT=0:1:throw can never fire: rank 0 computes on no block at hop 1")
step(EXPECT_RC 1 COMMAND ${MPIRUN} -x RINGATTN_FAULT=0:1:throw ${RINGATTN} bench -b 512 -e 1024 --causal
     --shard contiguous STDERR "RINGATTN_FAULT=0:1:throw can never fire: rank 0 computes on no block at hop 1")
step(EXPECT_RC 1 COMMAND ${MPIRUN} -x RINGATTN_FAULT=1:0:corrupt ${RINGATTN} run --seq 512 --causal --shard contiguous
     STDERR "RINGATTN_FAULT=1:0:corrupt can never fire: rank 1 sends no block at hop 0 of the forward ring \\(this problem's ring takes 2 hops over 2 ranks\\); on rank 1, corrupt can fire at no hop\n")
# The phase: backward needs --backward; an unknown phase is named with the allowed ones.
step(EXPECT_RC 1 COMMAND ${MPIRUN} -x RINGATTN_FAULT=1:0:exit:backward ${RINGATTN} run --seq 512 --causal
     STDERR "RINGATTN_FAULT=1:0:exit:backward names the backward ring, but this run has none \\(the phase backward needs --backward\\)\n")
step(EXPECT_RC 1 COMMAND ${MPIRUN} -x RINGATTN_FAULT=1:0:exit:sideways ${RINGATTN} run --seq 512 --causal --backward
     STDERR "RINGATTN_FAULT='1:0:exit:sideways' is not RANK:HOP:KIND\\[:PHASE\\]: unknown phase 'sideways' \\(allowed: forward, the default, and backward\\)")
step(EXPECT_RC 1 COMMAND ${MPIRUN4} -x RINGATTN_FAULT=0:1:throw:backward ${RINGATTN} run ${windowed} --backward
     STDERR "RINGATTN_FAULT=0:1:throw:backward can never fire: rank 0 computes on no block at hop 1 of the backward ring \\(this problem's ring takes 2 hops over 4 ranks\\); on rank 0, throw can fire at hop 0\n")
# The last hop of a short ring (2 of 4 ranks' hops) computes, and a throw there fires: forward and
# backward, the job ends non-zero with the hop named.
step(EXPECT_RC nonzero COMMAND ${MPIRUN4} -x RINGATTN_FAULT=2:1:throw ${RINGATTN} run ${windowed} --timeout 10
     STDERR "\\[rank 2/4 [^]\n]*\\] [^\n]*hop 1 of 4: computing on the block of rank 1 failed: std::bad_alloc")
step(EXPECT_RC nonzero COMMAND ${MPIRUN4} -x RINGATTN_FAULT=2:1:throw:backward ${RINGATTN} run ${windowed} --backward
     --timeout 10 STDERR "\\[rank 2/4 [^]\n]*\\] [^\n]*hop 1 of 4: the backward on the block of rank 1 failed: std::bad_alloc")
# The last hop of the full ring at P = 2 (no exchange in flight), in the backward.
step(EXPECT_RC nonzero COMMAND ${MPIRUN} -x RINGATTN_FAULT=1:1:throw:backward ${RINGATTN} run --seq 512 --causal
     --shard contiguous --backward --timeout 10
     STDERR "\\[rank 1/2 [^]\n]*\\] [^\n]*hop 1 of 2: the backward on the block of rank 0 failed: std::bad_alloc")
# One process (the local transport): the backward's only hop computes, so a throw there fires; it
# posts no exchange, so an exit is refused.
step(EXPECT_RC 1 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_FAULT=0:0:throw:backward ${RINGATTN} run --seq 64 --causal
     --backward STDERR "hop 0 of 1: the backward on the block of rank 0 failed: std::bad_alloc")
step(EXPECT_RC 1 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_FAULT=0:0:exit:backward ${RINGATTN} run --seq 64 --causal
     --backward STDERR "RINGATTN_FAULT=0:0:exit:backward can never fire: rank 0 posts no exchange at hop 0 of the backward ring \\(this problem's ring takes 1 hop over 1 rank\\); on rank 0, exit can fire at no hop\n")

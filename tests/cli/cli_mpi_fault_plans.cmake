# RINGATTN_FAULT plans that can never fire are refused at start-up on every rank, before any
# exchange, naming the rank, the hop, the ring and the hops the kind could fire at (issue 39: they
# used to run to exit 0 with the hop skipped); plans at the last hop of a short ring, and in the
# ring backward (its K/V ring and its dK/dV ring, phase grads), fire.
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
# A plan that can fire does not fire in the dry run's own exchanges (a hop-0 exit ended it): the
# dry run says where it fires and passes.
step(EXPECT_RC 0 COMMAND ${MPIRUN} -x RINGATTN_FAULT=0:0:exit ${RINGATTN} run --seq 64 --dry-run
     STDOUT "faults   ok: RINGATTN_FAULT=0:0:exit fires in the run, at a hop that carries a block \\(not in a dry run\\)
"
            "dry run: OK" STDERR_NOT "injected fault")
step(EXPECT_RC 0 COMMAND ${MPIRUN} -x RINGATTN_FAULT=1:0:throw ${RINGATTN} run --seq 64 --backward --dry-run
     STDOUT "faults   ok: RINGATTN_FAULT=1:0:throw fires in the run" "dry run: OK" STDERR_NOT "injected")
step(EXPECT_RC 1 COMMAND ${MPIRUN} -x RINGATTN_FAULT=0:1:throw ${RINGATTN} bench -b 512 -e 1024 --causal
     --shard contiguous STDERR "RINGATTN_FAULT=0:1:throw can never fire: rank 0 computes on no block at hop 1[^\n]* \\(bench faults the ring of its first size, seq 512: -b sets it\\)\n")
step(EXPECT_RC 1 COMMAND ${MPIRUN} -x RINGATTN_FAULT=1:0:corrupt ${RINGATTN} run --seq 512 --causal --shard contiguous
     STDERR "RINGATTN_FAULT=1:0:corrupt can never fire: rank 1 sends no block at hop 0 of the forward ring \\(this problem's ring takes 2 hops over 2 ranks\\); on rank 1, corrupt can fire at no hop\n")
# The phase: backward needs --backward; an unknown phase is named with the allowed ones.
step(EXPECT_RC 1 COMMAND ${MPIRUN} -x RINGATTN_FAULT=1:0:exit:backward ${RINGATTN} run --seq 512 --causal
     STDERR "RINGATTN_FAULT=1:0:exit:backward names the backward ring, but this run has none \\(the phase backward needs --backward\\)\n")
step(EXPECT_RC 1 COMMAND ${MPIRUN} -x RINGATTN_FAULT=1:0:exit:sideways ${RINGATTN} run --seq 512 --causal --backward
     STDERR "RINGATTN_FAULT='1:0:exit:sideways' is not RANK:HOP:KIND\\[:PHASE\\]: unknown phase 'sideways' \\(allowed: forward, the default, backward, the ring backward's K/V ring, and grads, its dK/dV ring\\)")
step(EXPECT_RC 1 COMMAND ${MPIRUN4} -x RINGATTN_FAULT=0:1:throw:backward ${RINGATTN} run ${windowed} --backward
     STDERR "RINGATTN_FAULT=0:1:throw:backward can never fire: rank 0 computes on no block at hop 1 of the backward ring \\(this problem's ring takes 2 hops over 4 ranks\\); on rank 0, throw can fire at hop 0\n")
# The last hop of a short ring (2 of 4 ranks' hops) computes, and a throw there fires: forward and
# backward, the job ends non-zero with the hop named.
step(EXPECT_RC nonzero COMMAND ${MPIRUN4} -x RINGATTN_FAULT=2:1:throw ${RINGATTN} run ${windowed} --timeout 10
     STDERR "\\[rank 2/4 [^]\n]*\\] [^\n]*hop 1 of the 4-rank ring: computing on the block of rank 1 failed: std::bad_alloc")
step(EXPECT_RC nonzero COMMAND ${MPIRUN4} -x RINGATTN_FAULT=2:1:throw:backward ${RINGATTN} run ${windowed} --backward
     --timeout 10 STDERR "\\[rank 2/4 [^]\n]*\\] [^\n]*hop 1 of the 4-rank ring: the backward on the block of rank 1 failed: std::bad_alloc")
# The last hop of the full ring at P = 2 (no exchange in flight), in the backward.
step(EXPECT_RC nonzero COMMAND ${MPIRUN} -x RINGATTN_FAULT=1:1:throw:backward ${RINGATTN} run --seq 512 --causal
     --shard contiguous --backward --timeout 10
     STDERR "\\[rank 1/2 [^]\n]*\\] [^\n]*hop 1 of the 2-rank ring: the backward on the block of rank 0 failed: std::bad_alloc")
# One process (the local transport): the backward's only hop computes, so a throw there fires; it
# posts no exchange, so an exit is refused.
step(EXPECT_RC 1 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_FAULT=0:0:throw:backward ${RINGATTN} run --seq 64 --causal
     --backward STDERR "hop 0 of the 1-rank ring: the backward on the block of rank 0 failed: std::bad_alloc")
step(EXPECT_RC 1 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_FAULT=0:0:exit:backward ${RINGATTN} run --seq 64 --causal
     --backward STDERR "RINGATTN_FAULT=0:0:exit:backward can never fire: rank 0 posts no exchange at hop 0 of the backward ring \\(this problem's ring takes 1 hop over 1 rank\\); on rank 0, exit can fire at no hop\n")
# The dK/dV ring (grads): causal contiguous over 2 ranks sends one accumulator, rank 0's, from
# rank 1 home at hop 2; a window over 4 ranks sends accumulators on (hops 2..4) after its K/V ring
# has ended (2 hops), and a throw where one comes home fires at hop 4.
step(EXPECT_RC 1 COMMAND ${MPIRUN} -x RINGATTN_FAULT=0:1:exit:grads ${RINGATTN} run --seq 512 --causal
     --shard contiguous --backward
     STDERR "RINGATTN_FAULT=0:1:exit:grads can never fire: rank 0 posts no dK/dV exchange at hop 1 of the grads ring \\(the dK/dV accumulators of this problem travel at hop 2 over 2 ranks\\); on rank 0, exit can fire at hop 2\n")
step(EXPECT_RC 1 COMMAND ${MPIRUN} -x RINGATTN_FAULT=1:2:throw:grads ${RINGATTN} bench -b 512 -e 512 --causal
     --shard contiguous --backward
     STDERR "RINGATTN_FAULT=1:2:throw:grads can never fire: rank 1 folds in no received accumulator at hop 2 of the grads ring \\(the dK/dV accumulators of this problem travel at hop 2 over 2 ranks\\); on rank 1, throw can fire at no hop \\(bench faults the ring of its first size, seq 512: -b sets it\\)\n")
step(EXPECT_RC 1 COMMAND ${MPIRUN4} -x RINGATTN_FAULT=1:3:corrupt:grads ${RINGATTN} run ${windowed} --backward
     STDERR "RINGATTN_FAULT=1:3:corrupt:grads can never fire: rank 1 sends no accumulator at hop 3 of the grads ring \\(the dK/dV accumulators of this problem travel at hops 2..4 over 4 ranks\\); on rank 1, corrupt can fire at hops 2, 4\n")
step(EXPECT_RC 1 COMMAND ${MPIRUN} -x RINGATTN_FAULT=1:2:exit:grads ${RINGATTN} run --seq 512 --causal
     STDERR "RINGATTN_FAULT=1:2:exit:grads names the grads ring, but this run has none \\(the phase grads needs --backward\\)\n")
step(EXPECT_RC nonzero COMMAND ${MPIRUN4} -x RINGATTN_FAULT=0:4:throw:grads ${RINGATTN} run ${windowed} --backward
     --timeout 10 STDERR "\\[rank 0/4 [^]\n]*\\] [^\n]*hop 4 of the 4-rank ring: adding the received dK/dV accumulator of the block of rank 0 failed: std::bad_alloc")
# One process: the backward has no dK/dV ring.
step(EXPECT_RC 1 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_FAULT=0:1:error:grads ${RINGATTN} run --seq 64 --causal
     --backward STDERR "RINGATTN_FAULT=0:1:error:grads can never fire: rank 0 posts no dK/dV exchange at hop 1 of the grads ring \\(the dK/dV accumulators of this problem travel at no hop over 1 rank\\); on rank 0, error can fire at no hop\n")

# `ringattn run --dry-run`: the world, the per-rank table, the problem and the ring are checked
# without computing attention; exit 0 when all hold, non-zero with the reason otherwise.
include(${HELPERS})
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --dry-run --seq 1024 --causal
     STDOUT "world 1 over local" "problem  ok: batch 1, heads 8/2" "dry run: OK")
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --dry-run --seq 1024 --causal --shard zigzag --timeout 20
     STDOUT "world 2 over mpi" "--timeout 20 s \\(first hop 60 s\\)" "\n +0 +[^\n]+cpu" "\n +1 +[^\n]+cpu"
            "shards   ok: zigzag sharding over 2 ranks, 512 query tokens" "ring     ok: one exchange around the ring of 2"
            "dry run: OK")
# Any length splits (uneven shards); ranks that disagree fail the dry run like the run.
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --dry-run --seq 1001 --shard zigzag
     STDOUT "shards   ok: zigzag sharding over 2 ranks, 500 to 501 query tokens" "dry run: OK")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random q.npy fp32 1 2 64 16 ${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random k.npy fp32 1 1 64 16 ${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} corrupt k.npy truncated)
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run --dry-run --q q.npy --k k.npy --v k.npy STDERR "k.npy")
# A launcher that announced 3 ranks but an MPI world of one (a binary built against another MPI).
step(EXPECT_RC 1 COMMAND ${CMAKE_COMMAND} -E env PMI_SIZE=3 ${RINGATTN} run --dry-run
     STDERR "MPI started a world of 1 process, but the launcher announced 3 \\(PMI_SIZE=3\\)" "rebuild it against")
# The wait bound: --timeout wins over RINGATTN_MPI_TIMEOUT_S, which is the fallback (checked).
step(EXPECT_RC 0 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_MPI_TIMEOUT_S=12 ${RINGATTN} run --dry-run
     STDOUT "--timeout 12 s \\(first hop 36 s\\)")
step(EXPECT_RC 1 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_MPI_TIMEOUT_S=abc ${RINGATTN} run --dry-run
     STDERR "RINGATTN_MPI_TIMEOUT_S='abc' must be a number of seconds >= 0.001 and <= 1e\\+06")
step(EXPECT_RC 0 COMMAND ${CMAKE_COMMAND} -E env RINGATTN_MPI_TIMEOUT_S=abc ${RINGATTN} run --dry-run --timeout 7
     STDOUT "--timeout 7 s \\(first hop 21 s\\)")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --timeout 0 STDERR "--timeout: must be a number of seconds >= 0.001")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --timeout 1e-300
     STDERR "--timeout: must be a number of seconds >= 0.001 and <= 1e\\+06 \\(got '1e-300'\\)")
# The MPI progress variable is read where the MPI transport is made: a bad value stops every rank.
# It and the transport's choice go through the start-up agreement: one message, exit 1, no
# MPI_Abort (which they ended in), also when one rank alone is wrong.
step(EXPECT_RC 1 COMMAND ${MPIRUN} -x RINGATTN_MPI_PROGRESS=helper ${RINGATTN} run --dry-run --seq 64
     STDERR "RINGATTN_MPI_PROGRESS='helper' is not understood: allowed are thread, nonblocking \\(or unset\\)"
     STDERR_NOT "MPI_ABORT" "rank 1/2")
step(EXPECT_RC 1 COMMAND ${MPIEXEC} --oversubscribe --allow-run-as-root -np 1 ${RINGATTN} run --seq 64 :
     -np 1 -x RINGATTN_MPI_PROGRESS=helper ${RINGATTN} run --seq 64
     STDERR "ranks stopped before the start: rank 1: RINGATTN_MPI_PROGRESS='helper' is not understood"
     STDERR_NOT "MPI_ABORT")
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run --seq 64 --transport local
     STDERR "--transport local is a world of one, but mpirun started 2 ranks; use mpi or auto"
     STDERR_NOT "MPI_ABORT" "rank 1/2")
step(EXPECT_RC 0 COMMAND ${MPIRUN} -x RINGATTN_MPI_PROGRESS=nonblocking ${RINGATTN} run --dry-run --seq 64
     STDOUT "dry run: OK")

# Ranks started with different subcommands or flags (MPMD launches) stop at the start-up
# agreement with one message naming the ranks and the field: no truncation, no hang.
include(${HELPERS})
set(MPMD ${MPIEXEC} --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} run --seq 64 : -np 1 ${RINGATTN} bench -b 64 -e 64
     STDERR "ranks disagree on the command line \\(1 of 2 differ from rank 0\\): rank 1 runs `ringattn bench` where rank 0 runs `ringattn run`")
# plan joins the agreement under a launcher instead of leaving the run ranks waiting.
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} run --seq 64 --timeout 5 : -np 1 ${RINGATTN} plan --seq 64
     STDERR "rank 1 runs `ringattn plan` where rank 0 runs `ringattn run`")
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} run --seq 64 --dry-run : -np 1 ${RINGATTN} run --seq 64
     STDERR "rank 1 has --dry-run no where rank 0 has --dry-run yes")
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} run --seq 64 --seed 1 : -np 1 ${RINGATTN} run --seq 64 --seed 2
     STDERR "rank 1 has --seed 2 where rank 0 has --seed 1")
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} bench -b 64 -e 64 -n 2 : -np 1 ${RINGATTN} bench -b 64 -e 64 -n 3
     STDERR "rank 1 has --iters 3 where rank 0 has --iters 2")
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} run --seq 64 --out o.npy : -np 1 ${RINGATTN} run --seq 64
     STDERR "rank 1 has --out given no where rank 0 has --out given yes")
# Only rank 0 writes the --json report: a rank that alone was given it stops every rank (it used
# to exit 0 with no report written).
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} run --seq 64 : -np 1 ${RINGATTN} run --seq 64 --json j1.json
     STDERR "rank 1 has --json given yes where rank 0 has --json given no")
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} bench -b 64 -e 64 --json j2.json : -np 1 ${RINGATTN} bench -b 64 -e 64
     STDERR "rank 1 has --json given no where rank 0 has --json given yes")
# --version and --help join the agreement under a launcher as their own subcommand (they used to
# exit before MPI_Init, leaving rank 0 waiting past --timeout); all ranks asking prints once, exit 0.
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} run --seq 128 --timeout 5 : -np 1 ${RINGATTN} --version
     STDERR "rank 1 runs `ringattn --version` where rank 0 runs `ringattn run`")
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} run --seq 128 --timeout 5 : -np 1 ${RINGATTN} run --help
     STDERR "rank 1 runs `ringattn --help` where rank 0 runs `ringattn run`")
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} --version STDOUT "^ringattn \\(cuda (yes|no), nccl (yes|no)\\)\n$")
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --help STDOUT "--seq")
# The same command on every rank passes; plan under mpirun prints once.
step(EXPECT_RC 0 COMMAND ${MPMD} -np 1 ${RINGATTN} run --seq 064 : -np 1 ${RINGATTN} run --seq 64 STDOUT "world 2")
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} plan --seq 64 --ranks 2 STDOUT "zigzag")
# Output paths are checked by rank 0 before any compute, with one verdict for every rank.
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run --seq 64 --out nodir/o.npy --dry-run
     STDERR "--out nodir/o.npy: cannot write the output there: its directory 'nodir' does not exist")
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --seq 64 --causal --out o.npy --lse l.npy)
# A rank whose own flags fail before MPI starts stops the others through the agreement, named.
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} run --seq 64 --timeout 5 : -np 1 ${RINGATTN} run --seq 0
     STDERR "ranks stopped before the start: rank 1: --seq: must be an integer in 1..9223372036854775807 \\(got '0'\\)")
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run --seq 0x40 STDERR "--seq: must be a decimal integer \\(got '0x40'\\)")
# The environment's part: a fault plan on one rank only (it would skip the warm-up exchange that
# the others wait in) and a wait bound that differs through RINGATTN_MPI_TIMEOUT_S stop every rank
# at the start, named; a --timeout given on every rank overrides the variable, so they agree.
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} run --seq 64 --causal --timeout 20 : -np 1 -x RINGATTN_FAULT=1:0:exit
     ${RINGATTN} run --seq 64 --causal --timeout 20
     STDERR "rank 1 has RINGATTN_FAULT 1:0:exit where rank 0 has RINGATTN_FAULT none")
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} run --seq 64 --dry-run : -np 1 -x RINGATTN_MPI_TIMEOUT_S=5
     ${RINGATTN} run --seq 64 --dry-run
     STDERR "rank 1 has wait bound \\(--timeout, RINGATTN_MPI_TIMEOUT_S\\) 5 s where rank 0 has wait bound \\(--timeout, RINGATTN_MPI_TIMEOUT_S\\) 300 s")
step(EXPECT_RC 0 COMMAND ${MPMD} -np 1 ${RINGATTN} run --seq 64 --timeout 9 --dry-run : -np 1 -x RINGATTN_MPI_TIMEOUT_S=5
     ${RINGATTN} run --seq 64 --timeout 9 --dry-run STDOUT "dry run: OK")

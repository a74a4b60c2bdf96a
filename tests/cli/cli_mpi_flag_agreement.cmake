# Issue 39's agreement and dry-run repros, through the executable: every flag that changes what
# the ranks compute, read or gather is agreed before the first exchange (the whole table is
# walked by cli_flag_agreement_np2); a dry run makes every check the run makes.
include(${HELPERS})
set(MPMD ${MPIEXEC} --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random a.npy fp32 1 8 64 64 ${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random b.npy fp32 1 8 64 64 ${SEED}1)
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random half.npy fp32 1 8 32 64 ${SEED})
set(BWD run --seq 64 --causal --backward)
# --do differs, or is given on rank 0 only: it used to exit 0 with a wrong dq.
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} ${BWD} --do a.npy --dq g.npy : -np 1 ${RINGATTN} ${BWD} --do b.npy --dq g.npy
     STDERR "ranks disagree on the command line \\(1 of 2 differ from rank 0\\): rank 1 has --do b.npy where rank 0 has --do a.npy")
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} ${BWD} --do a.npy : -np 1 ${RINGATTN} ${BWD}
     STDERR "rank 1 has --do none where rank 0 has --do a.npy")
# --dq on some ranks only: the ranks joined different gathers (MPI_ERR_TRUNCATE) after rank 0
# had written a wrong dq.npy. Now refused at start-up, and no file is written.
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} ${BWD} --dq g.npy : -np 1 ${RINGATTN} ${BWD}
     STDERR "rank 1 has --dq given no where rank 0 has --dq given yes")
if(EXISTS ${WORK_DIR}/g.npy)
  message(FATAL_ERROR "a refused run wrote g.npy")
endif()
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} ${BWD} --deterministic : -np 1 ${RINGATTN} ${BWD}
     STDERR "rank 1 has --deterministic no where rank 0 has --deterministic yes")
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} bench -b 64 -e 64 --timer batch : -np 1 ${RINGATTN} bench -b 64 -e 64
     STDERR "rank 1 has --timer per-call where rank 0 has --timer batch")
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} plan --seq 64 --window 4,4 : -np 1 ${RINGATTN} plan --seq 64 --window 8,8
     STDERR "rank 1 has --window 8,8 where rank 0 has --window 4,4")
# The dry run checks what the run checks: dO's file and shape, the decode backward over ranks.
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} ${BWD} --do missing.npy --dry-run
     STDERR "--do: cannot open 'missing.npy' for reading")
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} ${BWD} --do half.npy --dry-run
     STDERR "--do half.npy holds shape \\[1, 8, 32, 64\\] but q is \\[1, 8, 64, 64\\]: dO must have the shape of q")
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run --seq 8 --kv-seq 64 --backward --dry-run
     STDERR "--backward over 2 ranks runs the ring backward, which needs self-attention")
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} ${BWD} --do a.npy --dry-run
     STDOUT "flags +ok: --seq 64 --causal --dry-run --backward --do a.npy" "dry run: OK")
# --check-finite checks dO too, as its message says.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} poison b.npy 5 nan)
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} ${BWD} --do b.npy --check-finite
     STDERR "rank 0: --check-finite: dO holds nan at \\[batch 0, head 0, token 0, dim 5\\]")
# Empty values are refused, as `--out ''` is (they used to mean none). A CMake list cannot hold an
# empty argument: sh passes it.
step(EXPECT_RC 1 COMMAND sh -c "'${RINGATTN}' run --seq 64 --window ''"
     STDERR "--window: the value is empty; give one or drop --window")
step(EXPECT_RC 1 COMMAND sh -c "'${RINGATTN}' run --seq 64 --cu-seqlens ''"
     STDERR "--cu-seqlens: the path is empty; give a file name")
# A switch with a value: a false one used to count as given (the backward's flags accepted and
# ignored, the flags line claiming --backward; issue 39, second pass).
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run --seq 64 --backward=false --dq g.npy --deterministic
     STDERR "--backward=false: a switch takes no value; give --backward or leave it out")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --causal=0 STDERR "--causal=0: a switch takes no value")
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench -b 64 -e 64 --backward=off STDERR "--backward=off: a switch takes no value")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --causal=true STDERR "--causal=true: a switch takes no value")
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench -b 64 -e 64 --no-check=false
     STDERR "--no-check=false: a switch takes no value; give --no-check or leave it out")
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench -b 64 -e 64 --naive=1 STDERR "--naive=1: a switch takes no value")
# '-' is stdout for --json only: a tensor output named '-' is refused (it wrote a file named '-',
# the outputs overwriting each other), on every rank and in the dry run.
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run --seq 64 --causal --backward --out - --lse - --dq -
     STDERR "--out -: a tensor is written as a .npy file, not to stdout; give a file name")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --dk - --backward --dry-run STDERR "--dk -: a tensor is written")
# plan's head counts, checked as run's (issue 39, second pass, low).
step(EXPECT_RC 1 COMMAND ${RINGATTN} plan --heads 3 --kv-heads 2 STDERR "--heads 3 is not a multiple of --kv-heads 2")
# A bad output path (rank 0 checks it) and a problem every rank meets: every rank reports the
# problem, one message (rank 0 named its path while the others named the window).
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run --seq 64 --out nodir/o.npy --window 5
     STDERR "--window '5' is not understood" STDERR_NOT "does not exist")
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} bench -b 64 -e 64 --json nodir/b.json --window 5
     STDERR "--window '5' is not understood" STDERR_NOT "does not exist")

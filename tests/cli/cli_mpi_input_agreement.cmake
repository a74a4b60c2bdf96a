# Issue 39's input agreement (cli/input_agreement.cpp): under mpirun every rank reads --q/--k/--v
# (and --do) itself, so an MPMD launch with one working directory per rank gives each rank its
# own files. Files of other shapes are refused by agree_on_problem before the ring's warm-up
# (they overran a heap buffer in the warm-up exchange); files of the same shapes but other
# contents by a hash of the whole file (they ran to a wrong answer). The run, the backward and the dry run.
# The verdict is collective: rank 0 prints it (once, as every collective error) and every rank
# exits 1 (each rank's exit code is said by a shell around it), with no MPI_Abort and no output
# file written. A ';' of the texts is matched by '.': a CMake list would split the regex there.
include(${HELPERS})
set(MPMD ${MPIEXEC} --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)
# The shell exits 0, so that mpirun, which ends the job at a process's first non-zero exit, lets
# the other rank finish and say its own code too (lines, not ';': a CMake list would split there).
set(AS_RANK sh -c "\"$0\" \"$@\"\necho \"rank $OMPI_COMM_WORLD_RANK exited $?\" >&2")
set(EVERY_RANK_REFUSED "(^|\n)rank 0 exited 1\n" "(^|\n)rank 1 exited 1\n")
set(NO_ABORT "MPI_ABORT|Signal:|AddressSanitizer|terminate called")

# same/: q [1, 2, 64, 16], k and v [1, 1, 64, 16], dO as q. short/: every tensor at 32 tokens.
# copy/: same/ again. q/, v/, do/: same/ but that one file drawn from another seed.
function(inputs dir t)
  file(MAKE_DIRECTORY ${WORK_DIR}/${dir})
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random ${dir}/q.npy fp32 1 2 ${t} 16 ${SEED})
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random ${dir}/k.npy fp32 1 1 ${t} 16 1${SEED})
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random ${dir}/v.npy fp32 1 1 ${t} 16 2${SEED})
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random ${dir}/do.npy fp32 1 2 ${t} 16 3${SEED})
endfunction()
inputs(same 64)
inputs(short 32)
file(COPY ${WORK_DIR}/same/ DESTINATION ${WORK_DIR}/copy)
foreach(odd q v do)
  file(COPY ${WORK_DIR}/same/ DESTINATION ${WORK_DIR}/${odd})
  set(heads 2)
  if(odd STREQUAL "v")
    set(heads 1)
  endif()
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random ${odd}/${odd}.npy fp32 1 ${heads} 64 16 9${SEED})
endforeach()

# job(<dir of rank 0> <dir of rank 1> <expected stderr regex> <ringattn args...>)
function(job dir0 dir1 expected)
  set(files --q q.npy --k k.npy --v v.npy)
  step(EXPECT_RC 0 COMMAND ${MPMD} -np 1 -wdir ${WORK_DIR}/${dir0} ${AS_RANK} ${RINGATTN} ${ARGN} ${files}
                            : -np 1 -wdir ${WORK_DIR}/${dir1} ${AS_RANK} ${RINGATTN} ${ARGN} ${files}
       STDERR "\\[rank 0/2 [^\n]*\\] ${expected}\n" ${EVERY_RANK_REFUSED} STDERR_NOT "${NO_ABORT}")
  foreach(dir ${dir0} ${dir1})
    foreach(out o.npy l.npy dq.npy dk.npy dv.npy)
      if(EXISTS ${WORK_DIR}/${dir}/${out})
        message(FATAL_ERROR "a refused job wrote ${dir}/${out}")
      endif()
    endforeach()
  endforeach()
endfunction()

# Shapes that differ: rank 1's files hold 32 tokens. (The backward and the dry run agreed on the
# problem before their first exchange already; the run did so only after its warm-up.)
set(SHAPES "ranks disagree on the problem \\(1 of 2 differ from rank 0\\): rank 1: q_len = 32 \\(rank 0 has 64\\). every rank must pass the same problem")
set(OUTS --out o.npy --lse l.npy)
set(GRADS --backward --do do.npy --dq dq.npy --dk dk.npy --dv dv.npy)
job(same short "${SHAPES}" run --causal ${OUTS})
job(same short "${SHAPES}" run --causal ${GRADS})
job(same short "${SHAPES}" run --causal --dry-run)
job(same short "${SHAPES}" run --causal --backward --do do.npy --dry-run)

# One file per rank of the same shape but other contents: --q, --v, --do.
function(contents flag)
  set(CONTENTS "ranks read different contents from ${flag} \\(a hash of each rank's whole file. rank 0 has 0x[0-9a-f]+\\): rank 1: 0x[0-9a-f]+. every rank must read the same file" PARENT_SCOPE)
endfunction()
contents(--q)
job(same q "${CONTENTS}" run --causal ${OUTS})
job(same q "${CONTENTS}" run --causal ${GRADS})
job(same q "${CONTENTS}" run --causal --dry-run)
contents(--v)
job(same v "${CONTENTS}" run --causal ${OUTS})
contents(--do)
job(same do "${CONTENTS}" run --causal ${GRADS})
job(same do "${CONTENTS}" run --causal --backward --do do.npy --dry-run)

# Copies of the same files pass; rank 0 writes the outputs, which match the oracle.
step(EXPECT_RC 0 COMMAND ${MPMD} -np 1 -wdir ${WORK_DIR}/same ${RINGATTN} run --causal --q q.npy --k k.npy --v v.npy ${OUTS}
                          : -np 1 -wdir ${WORK_DIR}/copy ${RINGATTN} run --causal --q q.npy --k k.npy --v v.npy ${OUTS}
     STDERR_NOT "\\[error\\]")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} reference same/q.npy same/k.npy same/v.npy same/o.npy same/l.npy causal 1e-4)

# Files that differ in one element between the pieces a sampled hash read (its size, its first
# and last 64 KiB and 16 spaced 4 KiB pieces; issue 39, second pass): the whole file is hashed.
file(MAKE_DIRECTORY ${WORK_DIR}/big)
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random big/q.npy fp32 1 8 1024 16 ${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random big/k.npy fp32 1 2 1024 16 1${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random big/v.npy fp32 1 2 1024 16 2${SEED})
file(COPY ${WORK_DIR}/big/ DESTINATION ${WORK_DIR}/bigq)
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} poison bigq/q.npy 27600 inf)
contents(--q)
job(big bigq "${CONTENTS}" run --causal ${OUTS})

# Under mpirun (issue 12): tile sizes are checked before anything is allocated or sent, with the
# same message on every rank (an enormous tile used to throw std::bad_alloc inside the first hop
# and free the receive block while MPI still wrote it); the largest tiles run; the largest causal
# offset is right when the keys are split over ranks (distributed decode).
include(${HELPERS})
set(MPIRUN4 ${MPIEXEC} -np 4 --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)
foreach(flag --tile-q --tile-k)
  step(EXPECT_RC 1 COMMAND ${MPIRUN4} ${RINGATTN} run --seq 64 ${flag} 1000000000
       STDERR "${flag}: must be an integer in 0..4096 \\(got '1000000000'\\)")
  step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run --seq 64 ${flag} 4097
       STDERR "${flag}: must be an integer in 0..4096 \\(got '4097'\\)")
endforeach()
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --seq 64 --causal --tile-q 4096 --tile-k 4096 --check
     STDOUT "over tolerance 0 -> OK")
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --seq 64 --kv-seq 100 --causal --q-offset 9223372036854775744
     --check STDOUT "over tolerance 0 -> OK")
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run --seq 64 --kv-seq 100 --causal --q-offset 9223372036854775807
     STDERR "allowed q_offset is -9223372036854775808 to 9223372036854775744")

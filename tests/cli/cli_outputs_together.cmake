# All outputs of a run move into place together, or none: a write that fails late (here --out,
# over a file-size limit that --dk and --json stay under) leaves no --dk, --dq or --json behind
# (they used to be in place already), alone and under mpirun (the limit set in each rank).
include(${HELPERS})
set(LIMITED sh -c "trap '' XFSZ && ulimit -f 128 && exec \"$@\"" limited)
foreach(launch "" "${MPIRUN}")
  step(EXPECT_RC 1 COMMAND ${launch} ${LIMITED} ${RINGATTN} run --seq 64 --causal --backward --dk dk.npy --out o.npy
                                      --json r.json
       STDERR "writing 'o.npy' failed: File too large \\(nothing was written to it\\)")
  step(EXPECT_RC 1 COMMAND ${launch} ${LIMITED} ${RINGATTN} run --seq 64 --causal --lse l.npy --out o.npy --json r.json
       STDERR "writing 'o.npy' failed: File too large")
  file(GLOB left ${WORK_DIR}/*)
  if(left)
    message(FATAL_ERROR "a run whose --out failed left: ${left}")
  endif()
endforeach()
# Under the limit every output appears.
step(EXPECT_RC 0 COMMAND ${LIMITED} ${RINGATTN} run --seq 64 --causal --backward --dk dk.npy --json r.json)
foreach(f dk.npy r.json)
  if(NOT EXISTS ${WORK_DIR}/${f})
    message(FATAL_ERROR "${f} was not written")
  endif()
endforeach()

# Issue 39: an output path is checked by creating a probe file in its directory
# (runner/io/atomic_file.cpp), since permission bits and access(2) pass for root on sysfs, whose
# directories create nothing: `--out /sys/o.npy` used to pass the checks, run, and fail at the
# write. Refused before any compute now, alone and under mpirun (rank 0 checks, every rank stops),
# in the run and the dry run, for every kind of output. Skipped where /sys takes a new file.
include(${HELPERS})
if(NOT IS_DIRECTORY /sys)
  skip_scenario("no /sys on this machine")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E touch /sys/.ringattn-scenario-probe RESULT_VARIABLE created
                OUTPUT_QUIET ERROR_QUIET)
if(created EQUAL 0)
  file(REMOVE /sys/.ringattn-scenario-probe)
  skip_scenario("/sys takes new files here")
endif()
# The refusal is the first line on stderr (nothing ran before it); alone, the only one.
set(SYSFS "cannot write the output there: no file can be created in its directory '/sys': [A-Z][^\n]+\n")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --out /sys/o.npy --dry-run STDERR "^[^\n]*\\] --out /sys/o.npy: ${SYSFS}$")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --out /sys/o.npy STDERR "^[^\n]*\\] --out /sys/o.npy: ${SYSFS}$")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --lse /sys/l.npy STDERR "^[^\n]*\\] --lse /sys/l.npy: ${SYSFS}$")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --backward --dq /sys/dq.npy STDERR "^[^\n]*\\] --dq /sys/dq.npy: ${SYSFS}$")
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench -b 64 -e 64 --json /sys/j.json STDERR "^[^\n]*\\] --json /sys/j.json: ${SYSFS}$")
foreach(mode --dry-run --causal)
  step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run --seq 64 ${mode} --out /sys/o.npy
       STDERR "^[^\n]*\\[rank 0/2 [^\n]*\\] --out /sys/o.npy: ${SYSFS}" STDERR_NOT "MPI_ABORT")
endforeach()

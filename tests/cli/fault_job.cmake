# One injected fault (RINGATTN_FAULT, runner/faults/fault.hpp) in a real CLI job under mpiexec:
# the whole job must end by itself, non-zero, with a message that names the faulty rank and hop,
# and without a crash (no core dump, no segfault). Whether it ended by itself is judged by the
# job, not a stopwatch: a hang runs into the backstop below (far past the 3 x --timeout of the
# slowest path, a hang at the first exchange), whose kill is reported as a failure.
# Variables: RINGATTN, MPIEXEC, NP, RANK, HOP, KIND, TIMEOUT; PHASE (forward, the default,
# backward or grads: the plan's phase; backward and grads runs get --backward).
set(plan ${RANK}:${HOP}:${KIND})
set(extra "")
if(PHASE STREQUAL "backward" OR PHASE STREQUAL "grads")
  set(plan ${plan}:${PHASE})
  set(extra --backward)
elseif(PHASE AND NOT PHASE STREQUAL "forward")
  message(FATAL_ERROR "unknown PHASE '${PHASE}'")
endif()
set(cmd ${MPIEXEC} -np ${NP} --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1
    -x RINGATTN_FAULT=${plan} ${RINGATTN} run --seq 512 --heads 2 --kv-heads 1 --dim 16 --causal
    --shard zigzag --timeout ${TIMEOUT} ${extra})
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 150)
string(REPLACE ";" " " shown "${cmd}")
message("$ ${shown}\n--- exit ${rc}\n${out}${err}")
set(all "${out}${err}")

if(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the job did not end by itself ('${rc}'): a hang")
endif()
if(rc STREQUAL "0")
  message(FATAL_ERROR "expected the job to exit non-zero, got 0")
endif()
if(all MATCHES "core dumped|Segmentation fault|signal 11|SIGSEGV|Signal: Aborted|AddressSanitizer")
  message(FATAL_ERROR "the job crashed instead of ending cleanly: ${CMAKE_MATCH_0}")
endif()

# The ranks that survive the fault, as a regex alternation.
set(survivors "")
math(EXPR last "${NP} - 1")
foreach(r RANGE ${last})
  if(NOT r EQUAL RANK)
    list(APPEND survivors ${r})
  endif()
endforeach()
string(REPLACE ";" "|" survivors "${survivors}")
set(line "\\[rank (${survivors})/${NP} [^]\n]*\\] [^\n]*hop ${HOP} of the ${NP}-rank ring: ")
set(faulty "\\[rank ${RANK}/${NP} [^]\n]*\\] [^\n]*")
set(expect2 "")
if(KIND STREQUAL "hang")
  # A neighbour's bounded wait expires first: it names the silent rank as its peer.
  set(expect "${line}[^\n]*(receive from rank ${RANK}\\)|send [0-9]+ bytes to rank ${RANK},)[^\n]*did not complete")
elseif(KIND STREQUAL "corrupt")
  # The receiver checks the size of every block.
  set(expect "${line}[^\n]*received [0-9]+ bytes from rank ${RANK} but expected")
elseif(KIND STREQUAL "error")
  # The failing rank reports and ends the job (MPI_Abort) before any survivor's wait expires.
  # (Open MPI's own "MPI_ABORT was invoked" notice is not asserted: it is lost at times.)
  set(exchange "exchange")
  if(PHASE STREQUAL "grads")
    set(exchange "dK/dV exchange")
  endif()
  set(expect "${faulty}hop ${HOP} of the ${NP}-rank ring: posting the ${exchange}[^\n]*injected transport error")
elseif(KIND STREQUAL "throw")
  # An exception inside the hop: the rank completes the exchange in flight, then reports the hop
  # and ends the job; the flight recorder shows the failed hop, of the backward ring when it is.
  # grads: the fold of the accumulator received at the hop (both rings' exchanges completed).
  if(PHASE STREQUAL "grads")
    set(expect "${faulty}hop ${HOP} of the ${NP}-rank ring: adding the received dK/dV accumulator of the block of rank [0-9]+ failed: std::bad_alloc")
    set(expect2 "flight recorder, oldest first\\):(\n  t=[^\n]*)*\n  t=[0-9.]+s backward hop ${HOP} failed")
  elseif(PHASE STREQUAL "backward")
    set(expect "${faulty}hop ${HOP} of the ${NP}-rank ring: the backward on the block of rank [0-9]+ failed: std::bad_alloc")
    set(expect2 "flight recorder, oldest first\\):(\n  t=[^\n]*)*\n  t=[0-9.]+s backward hop ${HOP} failed")
  else()
    set(expect "${faulty}hop ${HOP} of the ${NP}-rank ring: computing on the block of rank [0-9]+ failed: std::bad_alloc")
    set(expect2 "flight recorder, oldest first\\):(\n  t=[^\n]*)*\n  t=[0-9.]+s hop ${HOP} failed")
  endif()
elseif(KIND STREQUAL "exit")
  # The launcher ends the job as soon as a rank dies, naming it; the rank's last line names the hop
  # and the ring.
  set(ring forward)
  if(PHASE)
    set(ring ${PHASE})
  endif()
  set(expect "${faulty}rank ${RANK} exits at hop ${HOP} of the ${ring} ring")
  set(expect2 "exited with non-zero status.*Process name: \\[\\[[0-9]+,[0-9]+\\],${RANK}\\]")
else()
  message(FATAL_ERROR "unknown KIND '${KIND}'")
endif()
# stdout, stderr and the launcher's own report interleave in no fixed order: each regex alone
# (two variables, not a list: CMake does not split a list at ';' inside the regexes' brackets).
foreach(re "${expect}" "${expect2}")
  if(NOT all MATCHES "${re}")
    message(FATAL_ERROR "exit ${rc}, but no message matches: ${re}")
  endif()
endforeach()
message("exit ${rc} with the expected message")

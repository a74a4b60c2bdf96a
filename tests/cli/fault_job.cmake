# One injected fault (RINGATTN_FAULT, src/ringattn/fault.hpp) in a real CLI job under mpiexec:
# the whole job must exit non-zero, within the timeout plus a margin (no hang), with a message
# that names the faulty rank and hop, and without a crash (no core dump, no segfault).
# Variables: RINGATTN, MPIEXEC, NP, RANK, HOP, KIND, TIMEOUT.
math(EXPR limit "${TIMEOUT} + 25")
set(cmd ${MPIEXEC} -np ${NP} --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1
    -x RINGATTN_FAULT=${RANK}:${HOP}:${KIND} ${RINGATTN} run --seq 512 --heads 2 --kv-heads 1 --dim 16 --causal
    --shard zigzag --timeout ${TIMEOUT})
string(TIMESTAMP t0 "%s")
# The bound here is a backstop: a hang fails on the elapsed-time assertion below.
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
string(REPLACE ";" " " shown "${cmd}")
message("$ ${shown}\n--- exit ${rc} after ${elapsed} s\n${out}${err}")
set(all "${out}${err}")

if(NOT rc MATCHES "^[0-9]+$" OR rc STREQUAL "0")
  message(FATAL_ERROR "expected the job to exit non-zero, got '${rc}'")
endif()
if(elapsed GREATER limit)
  message(FATAL_ERROR "the job took ${elapsed} s to end; allowed: --timeout ${TIMEOUT} + 25 s")
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
set(line "\\[rank (${survivors})/${NP} [^]\n]*\\] [^\n]*hop ${HOP} of ${NP}: ")
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
  set(expect "${faulty}hop ${HOP} of ${NP}: posting the exchange[^\n]*injected transport error")
elseif(KIND STREQUAL "throw")
  # An exception inside the hop: the rank completes the exchange in flight, then reports the hop
  # and ends the job; the flight recorder shows the failed hop.
  set(expect "${faulty}hop ${HOP} of ${NP}: computing on the block of rank [0-9]+ failed: std::bad_alloc")
  set(expect2 "flight recorder, oldest first\\):(\n  t=[^\n]*)*\n  t=[0-9.]+s hop ${HOP} failed")
elseif(KIND STREQUAL "exit")
  # The launcher ends the job as soon as a rank dies, naming it; the rank's last line names the hop.
  set(expect "${faulty}rank ${RANK} exits at hop ${HOP}")
  set(expect2 "exited with non-zero status.*Process name: \\[\\[[0-9]+,[0-9]+\\],${RANK}\\]")
else()
  message(FATAL_ERROR "unknown KIND '${KIND}'")
endif()
# stdout, stderr and the launcher's own report interleave in no fixed order: each regex alone
# (two variables, not a list: CMake does not split a list at ';' inside the regexes' brackets).
foreach(re "${expect}" "${expect2}")
  if(NOT all MATCHES "${re}")
    message(FATAL_ERROR "exit ${rc} in ${elapsed} s, but no message matches: ${re}")
  endif()
endforeach()
message("exit ${rc} in ${elapsed} s with the expected message")

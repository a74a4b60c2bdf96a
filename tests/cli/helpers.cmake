# Shared by the cli_*.cmake scenarios. Variables from the test command: RINGATTN, NPY_TOOL,
# MPIEXEC, HAVE_CUDA, WORK_DIR.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(MPIRUN ${MPIEXEC} -np 2 --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)

# A fresh seed per run, printed so that a failure can be replayed.
string(RANDOM LENGTH 9 ALPHABET 123456789 SEED)
message(STATUS "seed ${SEED}")

# step(EXPECT_RC <rc|nonzero> COMMAND <cmd...> [STDOUT <regex...>] [STDERR <regex...>]
#      [STDERR_NOT <regex...>])
# Runs one command in WORK_DIR (bounded by 300 s, so a hang fails instead of blocking) and
# asserts its exit code, that stdout/stderr match every regex and stderr none of STDERR_NOT.
function(step)
  cmake_parse_arguments(S "" "EXPECT_RC" "COMMAND;STDOUT;STDERR;STDERR_NOT" ${ARGN})
  string(REPLACE ";" " " shown "${S_COMMAND}")
  execute_process(COMMAND ${S_COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  WORKING_DIRECTORY ${WORK_DIR} TIMEOUT 300)
  message("$ ${shown}\n--- exit ${rc}\n--- stdout\n${out}--- stderr\n${err}")
  if(S_EXPECT_RC STREQUAL "nonzero")
    if(rc STREQUAL "0" OR NOT rc MATCHES "^[0-9]+$")
      message(FATAL_ERROR "expected a non-zero exit code (not a crash or a timeout), got '${rc}': ${shown}")
    endif()
  elseif(NOT rc STREQUAL S_EXPECT_RC)
    message(FATAL_ERROR "expected exit code ${S_EXPECT_RC}, got '${rc}' (seed ${SEED}): ${shown}")
  endif()
  foreach(re IN LISTS S_STDOUT)
    if(NOT out MATCHES "${re}")
      message(FATAL_ERROR "stdout does not match '${re}' (seed ${SEED}): ${shown}")
    endif()
  endforeach()
  foreach(re IN LISTS S_STDERR)
    if(NOT err MATCHES "${re}")
      message(FATAL_ERROR "stderr does not match '${re}' (seed ${SEED}): ${shown}")
    endif()
  endforeach()
  foreach(re IN LISTS S_STDERR_NOT)
    if(err MATCHES "${re}")
      message(FATAL_ERROR "stderr matches '${re}' (seed ${SEED}): ${shown}")
    endif()
  endforeach()
endfunction()

# skip_scenario(<why>): ends the scenario as skipped (CMakeLists.txt gives every scenario this
# line as its SKIP_REGULAR_EXPRESSION; cmake -P has no exit code of its own to return).
macro(skip_scenario why)
  message("ringattn scenario skipped: ${why}")
  return()
endmacro()

# random_pair(NAME fp32|fp16 B H T D SEED): NAME.npy, random [B, H, T, D] from SEED, and NAME_s.npy,
# the same tensor as [B, T, H, D] (axes 1 and 2 exchanged): one tensor in --layout bhsd and bshd.
function(random_pair name dtype b h t d seed)
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random ${name}.npy ${dtype} ${b} ${h} ${t} ${d} ${seed})
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} swap12 ${name}.npy ${name}_s.npy)
endfunction()

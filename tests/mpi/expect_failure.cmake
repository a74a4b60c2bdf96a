# Runs CMD (arguments separated by |) and passes only when it exits non-zero AND its output matches EXPECT:
# a bad problem must end every rank with an error and a message, not just any failure.
string(REPLACE "|" ";" CMD "${CMD}")
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 50)
message("${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit, got ${rc}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "exit ${rc}, but the output does not match: ${EXPECT}")
endif()
message("exit ${rc} with the expected message")

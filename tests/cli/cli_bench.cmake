# `ringattn bench`: an nccl-tests style table with a checked row per size and an OK footer; the
# flash and naive implementations in one run; a JSON record.
include(${HELPERS})
step(EXPECT_RC 0 COMMAND ${RINGATTN} bench -b 128 -e 512 -f 2 -n 2 -w 1 --causal --impl both --seed ${SEED}
     --json bench.json
     STDOUT "# ringattn bench" "#  Rank +0 Host" "\n +128 +flash" "\n +512 +naive" "flash is [0-9.]+x the naive"
            "# Result: OK")
file(READ ${WORK_DIR}/bench.json json)
string(JSON n LENGTH "${json}" sizes)
if(NOT n EQUAL 6)
  message(FATAL_ERROR "bench.json holds ${n} rows, expected 6 (3 sizes x 2 impls)")
endif()

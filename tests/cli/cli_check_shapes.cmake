# --check passes on fresh random inputs across the problem kinds: ring self-attention, chunked
# prefill, decode, non-causal cross attention, explicit offsets, half dtypes, tile sizes.
include(${HELPERS})
set(OK "-> OK")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --check --causal --batch 2 --heads 6 --kv-heads 3 --seq 200 --dim 48
     --seed ${SEED} --tile-q 16 --tile-k 24 STDOUT "${OK}" "200 of|1200 of|2400 of")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --check --causal --heads 4 --kv-heads 1 --seq 64 --kv-seq 300 --dim 64
     --seed ${SEED} STDOUT "${OK}" "MQA" "q_offset 236" "decode")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --check --causal --seq 1 --kv-seq 1000 --seed ${SEED} STDOUT "${OK}")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --check --seq 120 --kv-seq 77 --heads 2 --kv-heads 2 --dim 128
     --seed ${SEED} STDOUT "${OK}" "full" "MHA")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --check --causal --seq 50 --kv-seq 100 --q-offset 20 --seed ${SEED}
     STDOUT "${OK}" "q_offset 20")
foreach(dt bf16 fp16)
  step(EXPECT_RC 0 COMMAND ${RINGATTN} run --check --causal --seq 256 --dtype ${dt} --seed ${SEED}
       STDOUT "${OK}" "${dt}")
endforeach()
# Sampling: a forced small sample still checks and passes.
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --check --causal --seq 512 --check-rows 40 --seed ${SEED}
     STDOUT "40 of 4096 rows \\(seeded sample\\)" "${OK}")
# --json writes one record that parses and says the check passed.
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --check --causal --seq 128 --seed ${SEED} --json run.json)
file(READ ${WORK_DIR}/run.json json)
string(JSON pass GET "${json}" check pass)
string(JSON gflops GET "${json}" gflops_per_s)
string(JSON rank0 GET "${json}" ranks 0 host)
if(NOT pass STREQUAL "ON" OR gflops LESS_EQUAL 0 OR rank0 STREQUAL "")
  message(FATAL_ERROR "run.json: pass=${pass} gflops=${gflops} host=${rank0}")
endif()
# --json - : stdout holds the record alone (one line); the table moves to stderr.
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --seq 64 --seed ${SEED} --json -
     STDOUT "^{[^\n]*\"command\":\"run\"[^\n]*}\n$" STDERR "# ringattn run")

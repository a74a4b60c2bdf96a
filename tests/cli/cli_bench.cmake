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

# Decode / chunked prefill (--kv-seq): the swept size is the query count against a fixed cache of
# 300 keys (not rounded to the sharding's multiple), q_offset = kv_len - q_len, every row checked
# against the fp64 reference, the K/V read rate in its own column and in the JSON record.
step(EXPECT_RC 0 COMMAND ${RINGATTN} bench --kv-seq 300 -b 1 -e 20 -f 4 -n 1 -w 0 --causal --seed ${SEED}
     --json decode.json
     STDOUT "queries 1..20 x4 over a K/V cache of 300 \\(decode"
            "kv_GB/s = K and V read once per call \\(2 x batch x kv_heads x kv_len x dim x dtype size\\) / time"
            "\n# +queries +impl +time_ms +rate +unit +kv_GB/s +hidden%"
            "\n +1 +flash +[0-9.]+ +[0-9.]+ +[GT]FLOP/s +[0-9.]+ +n/a +[0-9]+ +[0-9.]+ [KMG]?i?B +[0-9.e+-]+ +[0-9.e+-]+ +0 +[^\n]+ +OK\n"
            "\n +4 +flash [^\n]+ OK\n" "\n +16 +flash [^\n]+ OK\n" "# Result: OK")
file(READ ${WORK_DIR}/decode.json json)
string(JSON sweep GET "${json}" sweep)
string(JSON n LENGTH "${json}" sizes)
string(JSON q0 GET "${json}" sizes 0 seq)
string(JSON off0 GET "${json}" sizes 0 q_offset)
string(JSON kv0 GET "${json}" sizes 0 kv_len)
string(JSON bytes0 GET "${json}" sizes 0 kv_bytes_read)
string(JSON rate0 GET "${json}" sizes 0 kv_gb_per_s)
# 2 (K and V) x batch 1 x 2 KV heads x 300 keys x dim 64 x 4 bytes (fp32)
if(NOT sweep STREQUAL "decode" OR NOT n EQUAL 3 OR NOT q0 EQUAL 1 OR NOT off0 EQUAL 299 OR NOT kv0 EQUAL 300
   OR NOT bytes0 EQUAL 307200 OR NOT rate0 GREATER 0)
  message(FATAL_ERROR "decode.json: sweep '${sweep}', ${n} sizes, first: seq ${q0}, q_offset ${off0}, kv_len ${kv0}, "
                      "kv_bytes_read ${bytes0}, kv_gb_per_s ${rate0}")
endif()
# Chunked prefill at a given offset, full attention, and the fp64 oracle beside it.
step(EXPECT_RC 0 COMMAND ${RINGATTN} bench --kv-seq 256 -b 32 -e 32 -n 1 -w 0 --causal --q-offset 100 --impl both
     STDOUT "q_offset 100\\)" "\n +32 +flash [^\n]+ OK\n" "\n +32 +naive " "# Result: OK")
# What a decode sweep cannot run is refused before the table, naming the size and the flag.
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench --kv-seq 64 -b 128 -e 128 --causal
     STDERR "bench --kv-seq 64, 128 queries: causal attention with q_offset=-64 leaves query 0 with no visible key")
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench --kv-seq 512 -b 256 -e 1024 --causal
     STDERR "bench --kv-seq 512: the sweep reaches 512 queries at q_offset 0, which is self-attention \\(a ring run\\), not decode")
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench -b 64 -e 64 --causal --q-offset 3
     STDERR "--q-offset 3 applies to bench only with --kv-seq")
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench --kv-seq 0 STDERR "--kv-seq: must be an integer in 1..9223372036854775807")
# --timer batch: the iterations back to back, said in the header and the JSON; a bad value is refused.
step(EXPECT_RC 0 COMMAND ${RINGATTN} bench -b 64 -e 128 -n 3 -w 1 --causal --timer batch --json tb.json
     STDOUT "# time: batch: the iterations back to back" "# Result: OK")
file(READ ${WORK_DIR}/tb.json json)
string(JSON timer GET "${json}" timer)
if(NOT timer STREQUAL "batch")
  message(FATAL_ERROR "tb.json: timer '${timer}' (want batch)")
endif()
step(EXPECT_RC 0 COMMAND ${RINGATTN} bench -b 64 -e 64 -n 1 -w 0 STDOUT "# time: per-call: barrier")
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench -b 64 -e 64 --timer events STDERR "--timer: 'events' not in {per-call,batch} \\(see ringattn bench --help\\)")
# The naive oracle honours packed documents (each its own problem, as the check sees it) and times
# its own backward.
step(EXPECT_RC 0 COMMAND ${RINGATTN} bench -b 64 -e 64 -n 1 -w 0 --impl both --docs fixed:16 --backward
     STDOUT "\n +64 +naive [^\n]+\n# seq 64: backward [^\n]+non-finite gradients 0\n" "flash is [0-9.]+x the naive reference")

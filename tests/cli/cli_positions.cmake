# Integer limits of positions, offsets and pair counts (issue 12): a value whose positions do not
# fit in 64 bits is refused with the flag, the value and the allowed range; the largest accepted
# offset gives the right answer (causal, every key visible); plan counts never wrap.
include(${HELPERS})
set(max_off 9223372036854775744)  # 2^63 - 64: the last of 64 queries sits at 2^63 - 1
# One past the largest offset: refused, naming the flag and the range (it used to abort with
# std::length_error).
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --causal --q-offset 9223372036854775807 --check
     STDERR "q_offset \\(--q-offset\\) 9223372036854775807 puts the last query at position 9223372036854775807 \\+ 64 - 1, which does not fit in a 64-bit integer: with q_len 64 the allowed q_offset is -9223372036854775808 to ${max_off}")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --kv-seq 100 --causal --q-offset 9223372036854775745
     STDERR "allowed q_offset is -9223372036854775808 to ${max_off}")
# The largest offset: every key is visible to every query, checked against the fp64 reference
# (it used to exit 0 with a row error of 2.7), and equal to the unmasked run of the same inputs.
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --seq 64 --causal --q-offset ${max_off} --check
     STDOUT "over tolerance 0 -> OK")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --seq 64 --kv-seq 100 --causal --q-offset ${max_off} --check --out huge.npy
     STDOUT "check +512 of 512 rows .*over tolerance 0 -> OK")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --seq 64 --kv-seq 100 --out full.npy)
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare huge.npy full.npy 1e-6)
# With q_len 1 INT64_MAX itself is accepted (the query sits at 2^63 - 1) and sees every key (the
# visibility check used to overflow at row + q_offset + 1 and refuse it).
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --heads 2 --kv-heads 1 --dim 16 --seq 1 --kv-seq 5 --causal
     --q-offset 9223372036854775807 --check STDOUT "check +2 of 2 rows .*over tolerance 0 -> OK")
# INT64_MIN is a value like any other, not "no offset given": with --causal it leaves every query
# without a key, which is refused.
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --causal --q-offset -9223372036854775808 --check
     STDERR "causal attention with q_offset=-9223372036854775808 leaves query 0 with no visible key")
# A q tensor whose byte count does not fit in 64 bits is refused before anything is allocated.
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 4611686018427387904 --kv-seq 64 --dim 4
     STDERR "the bytes of q \\(batch x heads x q_len x dim x dtype size\\): .* does not fit in a 64-bit integer")

# plan: pair counts past 2^63 (seq 3.1e9 has 4.8e18 causal pairs per head; x 8 heads x 64 x 4
# flops) print right, never negative (it used to print negative GFLOP).
step(EXPECT_RC 0 COMMAND ${RINGATTN} plan --seq 3100000000 --ranks 1 --causal
     STDOUT "\n +0 +3100000000 +1 +9\\.8406e\\+12 +0 hops +100\\.0%")
# seq 1e12 over 4 ranks: each rank a quarter (it used to print 485%).
step(EXPECT_RC 0 COMMAND ${RINGATTN} plan --seq 1000000000000 --ranks 4
     STDOUT "\n +3 +250000000000 +7 +5\\.1200e\\+17 +0 hops +25\\.0%"
            "contiguous 1\\.00 zigzag 1\\.00 striped 1\\.00")
step(EXPECT_RC 0 COMMAND ${RINGATTN} plan --seq 1000000000000 --ranks 4 --causal --shard contiguous
     STDOUT "\n +3 +250000000000 +4 +4\\.4800e\\+17 +0 hops +43\\.7%" "contiguous 1\\.75 zigzag 1\\.00")
# INT64_MAX tokens: the bytes of q, k and v do not fit in 64 bits, which plan refuses, naming them.
step(EXPECT_RC 1 COMMAND ${RINGATTN} plan --seq 9223372036854775807 --ranks 4
     STDERR "plan's bytes \\(batch x heads x seq x dim x 3 tensors x dtype bytes\\): .* does not fit in a 64-bit integer")
# The largest seq whose bytes fit (one head of dim 1: 12 bytes per token, (2^63 - 1) / 12 tokens)
# splits over 16 ranks in uneven chunks whose bounds (seq x rank, past 2^63) are computed without
# overflow: the zigzag pairs cover [0, seq) and the total sent (past 2^63) prints unsigned. (The brackets of the
# segments are matched with "." because an unbalanced "[" stops CMake splitting the list.)
step(EXPECT_RC 0 COMMAND ${RINGATTN} plan --seq 768614336404564650 --ranks 16 --heads 1 --kv-heads 1 --dim 1
     STDOUT "\n +0 +48038396025285291 .* .0,24019198012642645\\) .744595138391922004,768614336404564650\\)\n"
            "\n +15 +48038396025285291 .* .360287970189639679,408326366214924970\\)\n"
            "sent in all: 18446744073709551536 bytes")
step(EXPECT_RC 1 COMMAND ${RINGATTN} plan --seq 768614336404564651 --ranks 16 --heads 1 --kv-heads 1 --dim 1
     STDERR "2305843009213693953 x 4 does not fit in a 64-bit integer")
# Window sides of 2^60 and more are sides like any other (issue 39, second pass: they were taken as
# unbounded). Every key 2^62 behind the queries, a window of 2^60: no key is visible, refused.
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --heads 2 --kv-heads 1 --dim 4 --seq 7 --kv-seq 70 --causal
     --window 1152921504606846976,0 --q-offset 4611686018427387904
     STDERR "leaves quer(y|ies) 0 .*with no visible key")
# Right edge pos + 2^63 - 1 with the queries at -2^63: query 0 sees no key (the edge used to overflow).
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --heads 2 --kv-heads 1 --dim 4 --seq 7 --kv-seq 70
     --window 9223372036854775807,9223372036854775807 --q-offset -9223372036854775808
     STDERR "leaves quer(y|ies) 0 .*with no visible key")
# A window that covers the whole distance (2^62 + 2^60 from the last key) sees every key: the run
# equals the unwindowed one.
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --heads 2 --kv-heads 1 --dim 4 --seq 7 --kv-seq 70 --causal
     --window 5764607523034234880,0 --q-offset 4611686018427387904 --check --out wide.npy STDOUT "-> OK")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --heads 2 --kv-heads 1 --dim 4 --seq 7 --kv-seq 70 --out all.npy)
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare wide.npy all.npy 1e-6)
# bench's sweep ends are the given sizes exactly (they went through a double: 2^63 - 1 ran seq 1,
# and sizes above 2^53 were rounded in the messages).
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench --heads 1 --kv-heads 1 --dim 1 -b 9223372036854775807
     -e 9223372036854775807 --no-check -n 1 -w 0
     STDERR "the bytes of q \\(batch x heads x q_len x dim x dtype size\\): 9223372036854775807 x 4 does not fit")
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench --heads 1 --kv-heads 1 --dim 1 -b 9223372036854775000
     -e 9223372036854775807 --no-check -n 1 -w 0 STDERR ": 9223372036854775000 x 4 does not fit")

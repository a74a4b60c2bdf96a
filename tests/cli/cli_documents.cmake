# Packed documents (--doc-lens, --cu-seqlens): each attends only to itself; the check compares
# with the fp64 reference per document; the rate counts visible pairs exactly; bad lists are
# refused by name.
include(${HELPERS})
set(P --heads 8 --kv-heads 2 --seq 300 --dim 64 --seed ${SEED})
# Visible pairs, causal: 100*101/2 + 1 + 150*151/2 + 49*50/2 = 17601; x 4 x 8 heads x 64 = 0.036 GFLOP.
step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${P} --causal --doc-lens 100,1,150,49 --check --out d1.npy --lse dl1.npy
     STDOUT "4 packed documents" "0.036 GFLOP" "-> OK")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${P} --doc-lens 100,1,150,49 --check STDOUT "-> OK")
# The same documents as boundaries in a file, int64 and int32: the same output.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} ints cu8.npy i8 0 100 101 251 300)
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} ints cu4.npy i4 0 100 101 251 300)
foreach(f cu8 cu4)
  step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${P} --causal --cu-seqlens ${f}.npy --out d_${f}.npy --lse dl_${f}.npy
       STDOUT "4 packed documents")
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare d1.npy d_${f}.npy 0)
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare dl1.npy dl_${f}.npy 0)
endforeach()
# Documents really separate: one document of 300 gives another output.
step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${P} --causal --doc-lens 300 --out one.npy)
step(EXPECT_RC 1 COMMAND ${NPY_TOOL} compare d1.npy one.npy 1e-3)
# Refusals, by name.
step(EXPECT_RC 1 COMMAND ${RINGATTN} run ${P} --doc-lens 100,1,150
     STDERR "the 3 document lengths add up to 251, but the sequence has 300 tokens: they must add up to it")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run ${P} --doc-lens 100,0,200
     STDERR "--doc-lens '100,0,200': document 1 is '0', but every length must be a decimal integer >= 1")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run ${P} --doc-lens 100,,200 STDERR "document 1 is ''")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run ${P} --doc-lens 300 --cu-seqlens cu8.npy
     STDERR "--doc-lens and --cu-seqlens both give the documents: use one of them")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run ${P} --kv-seq 400 --causal --doc-lens 300
     STDERR "packed documents need self-attention \\(q_len == kv_len, q_offset 0\\); got q_len=300, kv_len=400")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} ints bad_start.npy i8 1 100 300)
step(EXPECT_RC 1 COMMAND ${RINGATTN} run ${P} --cu-seqlens bad_start.npy
     STDERR "boundaries must start at 0 and hold at least two values \\(got 3 value\\(s\\), the first 1\\)")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} ints bad_order.npy i4 0 100 100 300)
step(EXPECT_RC 1 COMMAND ${RINGATTN} run ${P} --cu-seqlens bad_order.npy
     STDERR "boundaries must increase, but value 2 is 100 after 100")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} ints floats.npy f4 0 100 300)
step(EXPECT_RC 1 COMMAND ${RINGATTN} run ${P} --cu-seqlens floats.npy
     STDERR "dtype '<f4' is not supported here: allowed are '<i4' \\(int32\\) and '<i8' \\(int64\\)")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run ${P} --cu-seqlens missing.npy STDERR "missing.npy")
# bench --docs: documents drawn per size from the seed, checked, rates on visible pairs.
step(EXPECT_RC 0 COMMAND ${RINGATTN} bench --heads 2 --kv-heads 1 --dim 16 -b 100 -e 200 --causal --docs uniform:40
     STDOUT "# packed documents: uniform:40 per size" "\n +200 +flash [^\n]+ OK" "# Result: OK")
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench --docs fixed:0
     STDERR "--docs 'fixed:0' is not understood: allowed are uniform:MAX and fixed:L with a decimal length >= 1")
# The packed THD layout: [total_tokens, heads, dim] files with --cu-seqlens; outputs in the same
# layout ([tokens, heads, dim] and LSE [tokens, heads]); the check reads the packed rows.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random3 q3.npy fp32 300 2 16 ${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random3 k3.npy fp32 300 1 16 1${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random3 v3.npy fp32 300 1 16 2${SEED})
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --q q3.npy --k k3.npy --v v3.npy --cu-seqlens cu8.npy --causal --check
     --out t1.npy --lse tl1.npy STDOUT "heads 2/1 \\(MQA\\), q_len 300" "4 packed documents" "-> OK")
step(EXPECT_RC 1 COMMAND ${NPY_TOOL} compare t1.npy d1.npy 1)  # a [300, 2, 16] file, not [1, 8, 300, 64]
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q q3.npy --k k3.npy --v v3.npy --causal
     STDERR "--q q3.npy is three-dimensional, the packed layout \\[total_tokens, heads, dim\\] of documents: give their boundaries with --cu-seqlens")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random q4.npy fp32 1 2 300 16 ${SEED})
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q q3.npy --k q4.npy --v v3.npy --cu-seqlens cu8.npy
     STDERR "--k q4.npy: holds shape \\[1, 2, 300, 16\\], but --q is three-dimensional")
# The backward with packed documents: every gradient against the fp64 reference per document.
step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${P} --causal --doc-lens 100,1,150,49 --backward --check
     STDOUT "4 packed documents" "non-finite 0 -> OK")
step(EXPECT_RC 0 COMMAND ${RINGATTN} bench --docs fixed:7 --backward -b 64 -e 64 -n 1 -w 0 --heads 2 --kv-heads 1 --dim 16
     --causal STDOUT "# seq 64: backward" "# Result: OK")
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench --docs fixed:7 --kv-seq 100 -b 1 -e 4
     STDERR "--docs packs self-attention; a --kv-seq sweep is decode over a cache: drop one of them")

# Inputs from .npy files (<f4 and <f2): the run's --out and --lse files are compared with the
# fp64 oracle that npy_tool computes from the same files.
include(${HELPERS})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random q.npy fp32 2 4 96 32 ${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random k.npy fp32 2 2 96 32 1${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random v.npy fp32 2 2 96 32 2${SEED})
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --q q.npy --k k.npy --v v.npy --causal --check --out o.npy --lse l.npy
     STDOUT "batch 2, heads 4/2 \\(GQA\\), q_len 96, kv_len 96, dim 32, fp32" "-> OK")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} reference q.npy k.npy v.npy o.npy l.npy causal 1e-4)
# The shape flags do not override the files.
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --q q.npy --k k.npy --v v.npy --out o_full.npy --lse l_full.npy
     STDOUT "full")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} reference q.npy k.npy v.npy o_full.npy l_full.npy full 1e-4)

# Chunked prefill from files: 40 queries at the end of 96 keys.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random qc.npy fp32 2 4 40 32 3${SEED})
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --q qc.npy --k k.npy --v v.npy --causal --check --out oc.npy --lse lc.npy
     STDOUT "q_offset 56" "-> OK")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} reference qc.npy k.npy v.npy oc.npy lc.npy causal 1e-4)

# <f2 files run fp16 unless --dtype says otherwise; the output is fp16-rounded.
foreach(t q k v)
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random ${t}16.npy fp16 1 2 128 64 4${SEED})
endforeach()
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --q q16.npy --k k16.npy --v v16.npy --causal --check --out o16.npy
     --lse l16.npy STDOUT "fp16" "-> OK")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} reference q16.npy k16.npy v16.npy o16.npy l16.npy causal 1e-2)
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --q q16.npy --k k16.npy --v v16.npy --causal --check --dtype fp32
     --out o16f.npy --lse l16f.npy STDOUT "fp32" "-> OK")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} reference q16.npy k16.npy v16.npy o16f.npy l16f.npy causal 1e-4)

# Files and the seed agree on nothing, so a random run and a file run differ (the compare fails).
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --batch 2 --heads 4 --kv-heads 2 --seq 96 --dim 32 --causal --out seeded.npy)
step(EXPECT_RC 1 COMMAND ${NPY_TOOL} compare seeded.npy o.npy 1e-3)

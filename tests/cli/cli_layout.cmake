# --layout bshd: .npy files as [batch, seq, heads, dim] (LSE [batch, seq, heads]). The same
# tensors given as bhsd files and transposed to bshd run the same problem, so every file written
# in bshd is exactly the transpose of the bhsd run's (npy_tool swap12 exchanges axes 1 and 2);
# the packed thd files are bshd of a batch of one without the batch axis. Refusals by name.
include(${HELPERS})
set(TOOL ${NPY_TOOL})
# bhsd inputs (GQA, batch 2) and their bshd transposes.
random_pair(q fp32 2 4 96 16 ${SEED})
random_pair(k fp32 2 2 96 16 1${SEED})
random_pair(v fp32 2 2 96 16 2${SEED})
random_pair(qc fp32 2 4 40 16 3${SEED})

# Self-attention and chunked prefill (40 queries at the end of 96 keys: q and k/v lengths differ).
foreach(case "q;self" "qc;prefill")
  list(GET case 0 q)
  list(GET case 1 tag)
  step(EXPECT_RC 0 COMMAND ${RINGATTN} run --q ${q}.npy --k k.npy --v v.npy --causal --check --out o_${tag}.npy
       --lse l_${tag}.npy STDOUT "-> OK")
  step(EXPECT_RC 0 COMMAND ${RINGATTN} run --layout bshd --q ${q}_s.npy --k k_s.npy --v v_s.npy --causal --check
       --out os_${tag}.npy --lse ls_${tag}.npy STDOUT "batch 2, heads 4/2 \\(GQA\\)" "kv_len 96, dim 16" "-> OK")
  foreach(f o l)
    step(EXPECT_RC 0 COMMAND ${TOOL} swap12 ${f}s_${tag}.npy ${f}b_${tag}.npy)  # back to bhsd
    step(EXPECT_RC 0 COMMAND ${TOOL} compare ${f}_${tag}.npy ${f}b_${tag}.npy 0)
  endforeach()
  step(EXPECT_RC 1 COMMAND ${TOOL} compare o_${tag}.npy os_${tag}.npy 1e9 STDOUT "shape \\[2, 4, ")  # [2, T, 4, 16]
endforeach()
step(EXPECT_RC 0 COMMAND ${TOOL} reference q.npy k.npy v.npy o_self.npy l_self.npy causal 1e-4)

# fp16 files: the same strided reads in another dtype.
foreach(t q k v)
  random_pair(${t}16 fp16 1 2 64 32 4${SEED})
endforeach()
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --q q16.npy --k k16.npy --v v16.npy --check --out o16.npy STDOUT "fp16")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --layout bshd --q q16_s.npy --k k16_s.npy --v v16_s.npy --check
     --out o16s.npy STDOUT "fp16" "-> OK")
step(EXPECT_RC 0 COMMAND ${TOOL} swap12 o16s.npy o16b.npy)
step(EXPECT_RC 0 COMMAND ${TOOL} compare o16.npy o16b.npy 0)

# Seeded inputs: --out and --lse alone take the layout.
set(S --batch 2 --heads 4 --kv-heads 2 --seq 50 --dim 16 --seed ${SEED} --causal)
step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${S} --out so.npy --lse sl.npy)
step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${S} --layout bshd --out sos.npy --lse sls.npy)
foreach(f so sl)
  step(EXPECT_RC 0 COMMAND ${TOOL} swap12 ${f}s.npy ${f}b.npy)
  step(EXPECT_RC 0 COMMAND ${TOOL} compare ${f}.npy ${f}b.npy 0)
endforeach()

# The backward: --do read and --dq/--dk/--dv written in bshd, checked, and the transposes of bhsd's.
random_pair(do fp32 2 4 96 16 5${SEED})
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --backward --q q.npy --k k.npy --v v.npy --do do.npy --causal
     --dq dq.npy --dk dk.npy --dv dv.npy --out bo.npy)
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --backward --layout bshd --q q_s.npy --k k_s.npy --v v_s.npy --do do_s.npy
     --causal --check --dq dqs.npy --dk dks.npy --dv dvs.npy --out bos.npy STDOUT "non-finite 0 -> OK")
foreach(g dq dk dv bo)
  step(EXPECT_RC 0 COMMAND ${TOOL} swap12 ${g}s.npy ${g}b.npy)
  step(EXPECT_RC 0 COMMAND ${TOOL} compare ${g}.npy ${g}b.npy 0)
endforeach()

# thd is bshd of a batch of one without the batch axis: the same files reshaped give the same
# output, LSE and gradients, written three-dimensional ([tokens, heads, dim], [tokens, heads]).
step(EXPECT_RC 0 COMMAND ${TOOL} ints cu.npy i8 0 30 31 96)
foreach(case "q;4;6" "k;2;7" "v;2;8" "do;4;9")
  list(GET case 0 t)
  list(GET case 1 heads)
  list(GET case 2 s)
  step(EXPECT_RC 0 COMMAND ${TOOL} random ${t}1.npy fp32 1 96 ${heads} 16 ${s}${SEED})
  step(EXPECT_RC 0 COMMAND ${TOOL} reshape ${t}1.npy ${t}3.npy 96 ${heads} 16)
endforeach()
set(F1 --q q1.npy --k k1.npy --v v1.npy --do do1.npy --layout bshd)
set(F3 --q q3.npy --k k3.npy --v v3.npy --do do3.npy)
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --backward ${F1} --cu-seqlens cu.npy --causal --check --out to1.npy
     --lse tl1.npy --dq tq1.npy --dk tk1.npy STDOUT "non-finite 0 -> OK")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --backward ${F3} --cu-seqlens cu.npy --causal --check --out to3.npy
     --lse tl3.npy --dq tq3.npy --dk tk3.npy STDOUT "3 packed documents" "non-finite 0 -> OK")
foreach(pair "to;96;4;16" "tl;96;4" "tq;96;4;16" "tk;96;2;16")
  list(POP_FRONT pair f)
  step(EXPECT_RC 0 COMMAND ${TOOL} reshape ${f}1.npy ${f}r.npy ${pair})
  step(EXPECT_RC 0 COMMAND ${TOOL} compare ${f}r.npy ${f}3.npy 0)
endforeach()

# Refusals, each naming the value or the file, the shapes and the layout.
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --layout bhsdx --q q.npy --k k.npy --v v.npy
     STDERR "--layout: 'bhsdx' is not a layout: allowed are bhsd \\(.batch, heads, seq, dim., the default\\) and bshd \\(.batch, seq, heads, dim.\\)")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --layout BSHD --seq 64 --out x.npy STDERR "'BSHD' is not a layout")
foreach(value bshd bhsd)
  step(EXPECT_RC 1 COMMAND ${RINGATTN} run --layout ${value} --seq 64 --check
       STDERR "--layout ${value} only says how the .npy files of --q/--k/--v, --out, --lse, --do and --dq/--dk/--dv hold their tensors and does nothing without one of them; add a file or drop --layout")
endforeach()
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench --layout bshd -b 64 -e 64 STDERR "--layout")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --layout bshd --q q3.npy --k k3.npy --v v3.npy --cu-seqlens cu.npy
     STDERR "--layout bshd is about four-dimensional files, but --q q3.npy holds shape .96, 4, 16., the packed layout .total_tokens, heads, dim., which is read as such: drop --layout")
# bhsd files read as bshd: q [2, 4, 40, 16] has 40 heads, k [2, 2, 96, 16] 96.
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --layout bshd --q qc.npy --k k.npy --v v.npy
     STDERR "--q qc.npy has shape .2, 4, 40, 16. and --k k.npy has shape .2, 2, 96, 16., read as .batch, q_len, heads, dim. and .batch, kv_len, kv_heads, dim. \\(--layout bshd\\): --q has 40 heads and --k 96. query heads must be a multiple of key/value heads")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --layout bshd --q q_s.npy --k k3.npy --v v3.npy
     STDERR "--k k3.npy: expected 4 dimensions .batch, kv_len, kv_heads, dim. \\(--layout bshd\\) but the file holds shape .96, 2, 16.")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --backward --layout bshd --q q_s.npy --k k_s.npy --v v_s.npy --do do.npy
     --dq none.npy
     STDERR "--do do.npy holds shape .2, 4, 96, 16. but q is .2, 96, 4, 16.: dO must have the shape of q \\(.batch, q_len, heads, dim., --layout bshd\\)")
if(EXISTS ${WORK_DIR}/none.npy)
  message(FATAL_ERROR "none.npy was written by a refused run")
endif()

# Issue 39 item 6 on one process: a NaN planted in k or v (one element of one token) reaches
# exactly the rows that see that key, in the output, the lse and the gradients, and no other
# (masked keys contribute nothing, not 0 x NaN). The counts in the message pin the elements:
# heads 2/1 and dim 16, so a NaN in k makes a whole row (2 heads x 16) non-finite, one in v the
# planted dim of each head.
include(${HELPERS})
include(${CMAKE_CURRENT_LIST_DIR}/nonfinite_helpers.cmake)
nonfinite_inputs(96)
# S = 96, v[10] = NaN, causal window 4,0: rows 10-14 (the rows whose window holds key 10), not 8-95.
step(EXPECT_RC 2 COMMAND ${RINGATTN} run --q q.npy --k k.npy --v v10.npy --causal --window 4,0 --out o.npy --lse l.npy
     STDERR "non-finite results: 10 in the output, 0 in the log-sum-exp")
expect_nonfinite(o.npy "10-14")
expect_nonfinite(l.npy "none")
# The backward of the same: dq over rows 10-14; dk over the keys those rows see (6-14); dv needs
# no v (dv = P^T dO) and stays finite.
step(EXPECT_RC 2 COMMAND ${RINGATTN} run --q q.npy --k k.npy --v v10.npy --causal --window 4,0 --backward --do do.npy
     --out o.npy --dq dq.npy --dk dk.npy --dv dv.npy
     STDERR "non-finite results: 10 in the forward's output and lse, 304 in the gradients")
expect_nonfinite(dq.npy "10-14")
expect_nonfinite(dk.npy "6-14")
expect_nonfinite(dv.npy "none")
# k[10] = NaN, causal: rows 10-95 see it (out, lse, dq), never rows 0-9; every key is seen by
# one of them (dk, dv all non-finite: P and dS of those rows are NaN).
step(EXPECT_RC 2 COMMAND ${RINGATTN} run --q q.npy --k k10.npy --v v.npy --causal --backward --do do.npy
     --out o.npy --lse l.npy --dq dq.npy --dk dk.npy --dv dv.npy)
expect_nonfinite(o.npy "10-95")
expect_nonfinite(l.npy "10-95")
expect_nonfinite(dq.npy "10-95")
expect_nonfinite(dk.npy "0-95")
expect_nonfinite(dv.npy "0-95")
# k[10] = NaN, causal window 4,0: rows 10-14; keys 6-14.
step(EXPECT_RC 2 COMMAND ${RINGATTN} run --q q.npy --k k10.npy --v v.npy --causal --window 4,0 --backward --do do.npy
     --out o.npy --lse l.npy --dq dq.npy --dk dk.npy --dv dv.npy
     STDERR "non-finite results: 170 in the forward's output and lse, 448 in the gradients")
expect_nonfinite(o.npy "10-14")
expect_nonfinite(l.npy "10-14")
expect_nonfinite(dq.npy "10-14")
expect_nonfinite(dk.npy "6-14")
expect_nonfinite(dv.npy "6-14")
# k[0] = NaN, causal window 0,0 (each row sees itself only): row 0's only score is NaN (it used to
# be dropped: o = 0, lse = -inf).
step(EXPECT_RC 2 COMMAND ${RINGATTN} run --q q.npy --k k0.npy --v v.npy --causal --window 0,0 --out o.npy --lse l.npy
     STDERR "non-finite results: 32 in the output, 2 in the log-sum-exp")
expect_nonfinite(o.npy "0")
expect_nonfinite(l.npy "0")
# Packed documents [0, 40) and [40, 96): k[10] reaches rows 10-39 of its document only.
step(EXPECT_RC 2 COMMAND ${RINGATTN} run --q q.npy --k k10.npy --v v.npy --causal --doc-lens 40,56 --backward --do do.npy
     --out o.npy --lse l.npy --dq dq.npy --dk dk.npy --dv dv.npy)
expect_nonfinite(o.npy "10-39")
expect_nonfinite(dq.npy "10-39")
expect_nonfinite(dk.npy "0-39")
expect_nonfinite(dv.npy "0-39")
# A decode (9 queries at the end of 96 keys, q_offset 87): key 90 is seen by rows 3-8 only.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random qd.npy fp32 1 2 9 16 ${SEED}5)
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random dod.npy fp32 1 2 9 16 ${SEED}6)
step(EXPECT_RC 2 COMMAND ${RINGATTN} run --q qd.npy --k k90.npy --v v.npy --causal --backward --do dod.npy
     --out o.npy --lse l.npy --dq dq.npy --dk dk.npy --dv dv.npy)
expect_nonfinite(o.npy "3-8")
expect_nonfinite(l.npy "3-8")
expect_nonfinite(dq.npy "3-8")
expect_nonfinite(dk.npy "0-95")
expect_nonfinite(dv.npy "0-95")
# The same with a window of 4 keys behind each query: rows 3-7 see key 90 (row 8 sees 91-95).
step(EXPECT_RC 2 COMMAND ${RINGATTN} run --q qd.npy --k k90.npy --v v.npy --causal --window 4,0 --backward --do dod.npy
     --out o.npy --lse l.npy --dq dq.npy --dk dk.npy --dv dv.npy)
expect_nonfinite(o.npy "3-7")
expect_nonfinite(dq.npy "3-7")
expect_nonfinite(dk.npy "86-94")
expect_nonfinite(dv.npy "86-94")
# An Inf at a masked key changes nothing: the output matches the run without it.
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --q qd.npy --k k.npy --v v.npy --causal --window 4,0 --out ref.npy)
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --q qd.npy --k k20inf.npy --v v20inf.npy --causal --window 4,0 --out o.npy)
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare o.npy ref.npy 0)

# Issue 39 item 6 through the ring: a NaN planted in k or v reaches exactly the rows (and, in the
# backward, the keys) that see it, on every rank and for every sharding, and the run exits 2
# with the counts of rank 0's gathered outputs; never absorbed by a merge, never leaked into a
# row that does not see it. S = 96, heads 2/1, dim 16 (a NaN in k: 32 elements per row).
include(${HELPERS})
include(${CMAKE_CURRENT_LIST_DIR}/nonfinite_helpers.cmake)
nonfinite_inputs(96)
set(NP3 ${MPIEXEC} -np 3 --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)
set(NP4 ${MPIEXEC} -np 4 --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)
set(GRADS --backward --do do.npy --out o.npy --lse l.npy --dq dq.npy --dk dk.npy --dv dv.npy)

# P = 3, contiguous, full: every row sees key 10 (it used to be absorbed, every output finite).
step(EXPECT_RC 2 COMMAND ${NP3} ${RINGATTN} run --q q.npy --k k10.npy --v v.npy --shard contiguous ${GRADS}
     STDERR "non-finite results: 3264 in the forward's output and lse, 6144 in the gradients")
foreach(f o l dq dk dv)
  expect_nonfinite(${f}.npy "0-95")
endforeach()
# P = 3, contiguous, causal window 4,0: key 30 (rank 0) is seen by rows 30-34 (ranks 0 and 1).
step(EXPECT_RC 2 COMMAND ${NP3} ${RINGATTN} run --q q.npy --k k30.npy --v v.npy --shard contiguous --causal --window 4,0
     ${GRADS} STDERR "non-finite results: 170 in the forward's output and lse, 448 in the gradients")
foreach(f o l dq)
  expect_nonfinite(${f}.npy "30-34")
endforeach()
expect_nonfinite(dk.npy "26-34")
expect_nonfinite(dv.npy "26-34")
# P = 4, zigzag, causal: rows 10-95 on every rank, never 0-9 (it used to be rows 10-11 only).
step(EXPECT_RC 2 COMMAND ${NP4} ${RINGATTN} run --q q.npy --k k10.npy --v v.npy --shard zigzag --causal ${GRADS}
     STDERR "non-finite results: 2924 in the forward's output and lse")
foreach(f o l dq)
  expect_nonfinite(${f}.npy "10-95")
endforeach()
expect_nonfinite(dk.npy "0-95")
expect_nonfinite(dv.npy "0-95")
# P = 4, zigzag, causal window 4,0: v[10] = NaN reaches rows 10-14 (dim 0), dk 6-14, not dv.
step(EXPECT_RC 2 COMMAND ${NP4} ${RINGATTN} run --q q.npy --k k.npy --v v10.npy --shard zigzag --causal --window 4,0
     ${GRADS} STDERR "non-finite results: 10 in the forward's output and lse, 304 in the gradients")
expect_nonfinite(o.npy "10-14")
expect_nonfinite(l.npy "none")
expect_nonfinite(dq.npy "10-14")
expect_nonfinite(dk.npy "6-14")
expect_nonfinite(dv.npy "none")
# P = 4, doc-zigzag, documents [0, 40) and [40, 96): k[10] reaches rows 10-39 (row 10's first
# chunk holds key 10 alone: its only score there is NaN, which used to be dropped), and keys 0-39.
step(EXPECT_RC 2 COMMAND ${NP4} ${RINGATTN} run --q q.npy --k k10.npy --v v.npy --shard doc-zigzag --doc-lens 40,56
     --causal ${GRADS} STDERR "non-finite results: 1020 in the forward's output and lse, 2240 in the gradients")
foreach(f o l dq)
  expect_nonfinite(${f}.npy "10-39")
endforeach()
expect_nonfinite(dk.npy "0-39")
expect_nonfinite(dv.npy "0-39")
# The same sharding, full (no causal): v[50] reaches all of the second document, rows 40-95.
step(EXPECT_RC 2 COMMAND ${NP4} ${RINGATTN} run --q q.npy --k k.npy --v v50.npy --shard doc-zigzag --doc-lens 40,56
     ${GRADS} STDERR "non-finite results: 112 in the forward's output and lse")
expect_nonfinite(o.npy "40-95")
expect_nonfinite(dq.npy "40-95")
expect_nonfinite(dk.npy "40-95")
expect_nonfinite(dv.npy "none")
# P = 4, striped, causal: k[10] reaches rows 10-95.
step(EXPECT_RC 2 COMMAND ${NP4} ${RINGATTN} run --q q.npy --k k10.npy --v v.npy --shard striped --causal ${GRADS}
     STDERR "non-finite results: 2924 in the forward's output and lse")
foreach(f o l dq)
  expect_nonfinite(${f}.npy "10-95")
endforeach()

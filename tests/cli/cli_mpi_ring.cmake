# Two ranks under mpirun: the check passes for every sharding, and rank 0's --out/--lse files
# (global token order) equal a single-process run within fp32 tolerance.
include(${HELPERS})
set(P --batch 2 --heads 4 --kv-heads 2 --seq 384 --dim 64 --causal --seed ${SEED})
step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${P} --out o1.npy --lse l1.npy)
foreach(shard zigzag contiguous striped)
  step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run ${P} --check --shard ${shard} --out o_${shard}.npy
       --lse l_${shard}.npy STDOUT "world 2, transport mpi" "${shard} sharding" "-> OK"
       STDERR "rank 0/2")
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare o1.npy o_${shard}.npy 1e-5)
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare l1.npy l_${shard}.npy 1e-5)
endforeach()
# The default problem, as `mpirun -np 2 ringattn`.
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} STDOUT "-> OK")
# Decode and chunked prefill over a KV-sharded cache.
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --check --causal --seq 16 --kv-seq 501 --seed ${SEED}
     --out od2.npy STDOUT "decode" "-> OK")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --causal --seq 16 --kv-seq 501 --seed ${SEED} --out od1.npy)
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare od1.npy od2.npy 1e-5)
# Files under mpirun: each rank loads its own rows.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random q.npy fp32 1 4 128 32 ${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random k.npy fp32 1 4 128 32 1${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random v.npy fp32 1 4 128 32 2${SEED})
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --q q.npy --k k.npy --v v.npy --causal --check --shard striped
     --out of.npy --lse lf.npy STDOUT "-> OK")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} reference q.npy k.npy v.npy of.npy lf.npy causal 1e-4)

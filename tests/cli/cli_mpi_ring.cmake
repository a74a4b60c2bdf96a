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
# Any length: 77 tokens split unevenly (zigzag chunks of 19 and 20 tokens), and 1 token (a rank
# with none); the gathered files still equal a single-process run.
foreach(n 77 1)
  set(O --heads 4 --kv-heads 2 --seq ${n} --dim 32 --causal --seed ${SEED})
  step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${O} --out u1_${n}.npy --lse ul1_${n}.npy)
  foreach(shard zigzag contiguous striped)
    step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run ${O} --check --shard ${shard} --out u_${shard}_${n}.npy
         --lse ul_${shard}_${n}.npy STDOUT "${shard} sharding" "-> OK")
    step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare u1_${n}.npy u_${shard}_${n}.npy 1e-5)
    step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare ul1_${n}.npy ul_${shard}_${n}.npy 1e-5)
  endforeach()
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
# A 77-token file: every rank reads its uneven shard's rows.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random q77.npy fp32 1 2 77 16 ${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random k77.npy fp32 1 1 77 16 1${SEED})
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random v77.npy fp32 1 1 77 16 2${SEED})
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --q q77.npy --k k77.npy --v v77.npy --causal --check
     --shard zigzag --out o77.npy --lse l77.npy STDOUT "-> OK")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} reference q77.npy k77.npy v77.npy o77.npy l77.npy causal 1e-4)

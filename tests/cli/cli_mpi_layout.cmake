# --layout bshd over two ranks: every rank reads its shard's rows of [batch, seq, heads, dim]
# files (strided per head), rank 0 writes --out/--lse and the gradients in bshd, and each file is
# exactly the transpose of the same two-rank run on the bhsd files (same shards, same kernels).
include(${HELPERS})
set(TOOL ${NPY_TOOL})
random_pair(q fp32 2 4 77 16 ${SEED})
random_pair(k fp32 2 2 77 16 1${SEED})
random_pair(v fp32 2 2 77 16 2${SEED})
random_pair(qc fp32 2 4 30 16 3${SEED})
random_pair(do fp32 2 4 77 16 4${SEED})

# The ring (uneven zigzag and striped shards) and a kv-sharded decode (30 queries over 77 keys).
foreach(case "q;--shard;zigzag" "q;--shard;striped" "qc")
  list(POP_FRONT case q)
  string(REPLACE "--shard;" "_" tag "${q}${case}")
  step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --q ${q}.npy --k k.npy --v v.npy --causal ${case}
       --out o_${tag}.npy --lse l_${tag}.npy)
  step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --layout bshd --q ${q}_s.npy --k k_s.npy --v v_s.npy --causal
       ${case} --check --out os_${tag}.npy --lse ls_${tag}.npy STDOUT "# world 2" "-> OK")
  foreach(f o l)
    step(EXPECT_RC 0 COMMAND ${TOOL} swap12 ${f}s_${tag}.npy ${f}b_${tag}.npy)
    step(EXPECT_RC 0 COMMAND ${TOOL} compare ${f}_${tag}.npy ${f}b_${tag}.npy 0)
  endforeach()
endforeach()

# The ring backward: --do read and --dq/--dk/--dv written in bshd.
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --backward --q q.npy --k k.npy --v v.npy --do do.npy --causal
     --dq dq.npy --dk dk.npy --dv dv.npy)
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --backward --layout bshd --q q_s.npy --k k_s.npy --v v_s.npy
     --do do_s.npy --causal --check --dq dqs.npy --dk dks.npy --dv dvs.npy STDOUT "# world 2" "non-finite 0 -> OK")
foreach(g dq dk dv)
  step(EXPECT_RC 0 COMMAND ${TOOL} swap12 ${g}s.npy ${g}b.npy)
  step(EXPECT_RC 0 COMMAND ${TOOL} compare ${g}.npy ${g}b.npy 0)
endforeach()

# A dO in the other layout: refused on every rank before the ring, nothing written.
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run --backward --layout bshd --q q_s.npy --k k_s.npy --v v_s.npy
     --do do.npy --dq none.npy
     STDERR "--do do.npy holds shape .2, 4, 77, 16. but q is .2, 77, 4, 16.: dO must have the shape of q")
if(EXISTS ${WORK_DIR}/none.npy)
  message(FATAL_ERROR "none.npy was written by a refused run")
endif()

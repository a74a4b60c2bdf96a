# run --backward and bench --backward over two ranks (the ring backward): the gradient check over
# every sharding, documents and windows; rank 0's gathered --dq/--dk/--dv (global token order)
# equal to one process's files; the sampled check; the JSON; bench's backward line.
include(${HELPERS})
set(G --heads 4 --kv-heads 2 --dim 16 --seed ${SEED})
# The check (every element against the fp64 reference) over shardings, documents and windows.
foreach(args "--seq;77;--causal;--shard;zigzag" "--seq;77;--shard;contiguous" "--seq;96;--causal;--shard;striped"
        "--seq;301;--causal;--doc-lens;1,40,200,3,57;--shard;doc-zigzag"
        "--seq;150;--causal;--window;20,0;--shard;zigzag" "--seq;150;--window;10,7;--shard;contiguous"
        "--seq;120;--causal;--doc-lens;50,70;--window;9,0;--shard;doc-zigzag")
  step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --backward --check ${G} ${args}
       STDOUT "# ringattn run --backward: " "# world 2, transport mpi" "backward +[0-9.]+ ms"
              "check +dq max abs [0-9.e+-]+ max rel [0-9.e+-]+ . dk .* . dv .* . non-finite 0 -> OK"
              "fp64 reference, every element")
endforeach()
# bf16: its own tolerance.
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --backward --check ${G} --seq 90 --causal --dtype bf16
     STDOUT "non-finite 0 -> OK" "tolerance bf16: max .g - ref. <= .2e-02 \\+ 1e-06 x score magnitude")
# A seeded sample of rows (--check-rows; large problems sample on their own), with the JSON.
# --check-rows counts per rank, as in the forward: 20 on each of 2 ranks is 40 of each gradient.
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --backward --check --check-rows 20 ${G} --seq 200 --causal
     --doc-lens 100,1,99 --json s.json
     STDOUT "non-finite 0 -> OK" "seeded sample: 40 of 800 dq rows, 40 of 400 dk/dv rows")
file(READ ${WORK_DIR}/s.json json)
foreach(key "\"backward\": ?true" "\"world\": ?2" "\"sampled\": ?true" "\"dq_rows_checked\": ?40" "\"max_rel_error\""
        "\"pass\": ?true")
  if(NOT json MATCHES "${key}")
    message(FATAL_ERROR "s.json lacks ${key}: ${json}")
  endif()
endforeach()
# Gathered gradients in global token order equal one process's, dO drawn from the seed and read
# from a file (each rank reads its rows), over layouts that are not contiguous.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random do.npy fp32 1 4 301 16 ${SEED})
foreach(dout "" "--do;do.npy")
  set(D --seq 301 --causal --doc-lens 1,40,200,3,57 ${dout})
  step(EXPECT_RC 0 COMMAND ${RINGATTN} run --backward ${G} ${D} --dq dq1.npy --dk dk1.npy --dv dv1.npy --out o1.npy)
  foreach(shard zigzag doc-zigzag striped)
    step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --backward ${G} ${D} --shard ${shard} --dq dq2.npy --dk dk2.npy
         --dv dv2.npy --out o2.npy)
    foreach(g dq dk dv o)
      step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare ${g}1.npy ${g}2.npy 1e-5)
    endforeach()
  endforeach()
endforeach()
# Another dO gives other gradients (the file is read, not ignored).
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --backward ${G} --seq 301 --causal --doc-lens 1,40,200,3,57 --dq dq3.npy)
step(EXPECT_RC 1 COMMAND ${NPY_TOOL} compare dq1.npy dq3.npy 1e-3)
# A dO of the wrong shape: refused on every rank before the ring, nothing written.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random bad.npy fp32 1 4 300 16 ${SEED})
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run --backward ${G} --seq 301 --do bad.npy --dq none.npy
     STDERR "--do bad.npy holds shape .1, 4, 300, 16. but q is .1, 4, 301, 16.: dO must have the shape of q")
if(EXISTS ${WORK_DIR}/none.npy)
  message(FATAL_ERROR "none.npy was written by a refused run")
endif()
# bench --backward: one forward and one backward per step, both timers.
foreach(timer per-call batch)
  step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} bench --backward -b 64 -e 128 -n 2 -w 1 --timer ${timer} ${G} --causal
       --json b.json
       STDOUT "world 2" "# seq 64: backward +[0-9.]+ ms, [0-9.]+ [GT]FLOP/s .2.5x the forward's FLOPs.; forward.backward [0-9.]+ ms"
              "# seq 128: backward .*non-finite gradients 0" "# Result: OK")
  file(READ ${WORK_DIR}/b.json json)
  foreach(key "\"backward_median_s\"" "\"fwd_bwd_gflops_per_s\"" "\"timer\": ?\"${timer}\"")
    if(NOT json MATCHES "${key}")
      message(FATAL_ERROR "b.json lacks ${key}: ${json}")
    endif()
  endforeach()
endforeach()
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} bench --backward --docs uniform:40 -b 100 -e 100 -n 1 -w 0 ${G} --causal
     STDOUT "# seq 100: backward" "# Result: OK")

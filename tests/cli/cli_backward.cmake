# run --backward (a world of one): the gradient check passes, files are written and read back,
# and the flags that need --backward are refused without it.
include(${HELPERS})
set(small --heads 8 --kv-heads 2 --dim 32 --seed ${SEED})
# The check against the fp64 reference gradient: fp32 and bf16, causal and full, odd lengths,
# q_len != kv_len (a causal offset), GQA.
foreach(dtype fp32 bf16)
  step(EXPECT_RC 0 COMMAND ${RINGATTN} run --backward --check --causal --seq 77 --kv-seq 93 --dtype ${dtype} ${small}
       STDOUT "# ringattn run --backward: .*q_len 77, kv_len 93" "backward +[0-9.]+ ms"
              "check +dq max abs [0-9.e+-]+ max rel [0-9.e+-]+ \\| dk .* \\| dv .* \\| non-finite 0 -> OK"
              "tolerance ${dtype}: max \\|g - ref\\|")
  step(EXPECT_RC 0 COMMAND ${RINGATTN} run --backward --check --seq 61 --dtype ${dtype} ${small}
       STDOUT "non-finite 0 -> OK")
endforeach()
# Head dim 1 with N(0, 16^2) inputs: the 16-bit output's rounding moves D = rowsum(dO * out) by
# ~10% of dq against the exact gradient; the check's oracle takes D from the forward's output, as
# the backward does, and passes (every element, and a sample of rows).
set(seed ${SEED})
foreach(t q k v)
  math(EXPR seed "${seed} + 1")
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random big_${t}.npy fp32 1 4 512 1 ${seed} 16)
endforeach()
foreach(dtype bf16 fp16)
  foreach(rows 0 64)
    step(EXPECT_RC 0 COMMAND ${RINGATTN} run --backward --check --check-rows ${rows} --dtype ${dtype} --q big_q.npy
         --k big_k.npy --v big_v.npy STDOUT "non-finite 0 -> OK")
  endforeach()
endforeach()
# Gradient files: dO from a file, dq/dk/dv written; the same dO gives the same gradients bitwise.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random do.npy fp32 1 8 40 32 ${SEED})
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --backward --causal --seq 40 ${small} --do do.npy --dq dq1.npy --dk dk1.npy
     --dv dv1.npy --check --json run.json STDOUT "-> OK")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --backward --causal --seq 40 ${small} --do do.npy --dq dq2.npy --dk dk2.npy
     --dv dv2.npy --deterministic)
foreach(g dq dk dv)
  step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare ${g}1.npy ${g}2.npy 0)
endforeach()
file(READ ${WORK_DIR}/run.json json)
foreach(key "\"backward\": ?true" "\"backward_flops\"" "\"backward_gflops_per_s\"" "\"total_s\"" "\"dout\": ?\"file\""
        "\"pass\": ?true")
  if(NOT json MATCHES "${key}")
    message(FATAL_ERROR "run.json lacks ${key}: ${json}")
  endif()
endforeach()
# dk has the shape of k: comparing it with dq (the shape of q) fails.
step(EXPECT_RC 1 COMMAND ${NPY_TOOL} compare dq1.npy dk1.npy 1e9)
# Another dO gives other gradients (the file is read, not ignored).
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --backward --causal --seq 40 ${small} --dq dq3.npy)
step(EXPECT_RC 1 COMMAND ${NPY_TOOL} compare dq1.npy dq3.npy 1e-3)
# A dO of the wrong shape, and a NaN in dO.
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} random bad.npy fp32 1 8 41 32 ${SEED})
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --backward --seq 40 ${small} --do bad.npy
     STDERR "--do bad.npy holds shape \\[1, 8, 41, 32\\] but q is \\[1, 8, 40, 32\\]: dO must have the shape of q")
step(EXPECT_RC 0 COMMAND ${NPY_TOOL} poison do.npy 100 nan)
step(EXPECT_RC 2 COMMAND ${RINGATTN} run --backward --seq 40 ${small} --do do.npy
     STDERR "non-finite results: 0 in the forward's output and lse, [1-9][0-9]* in the gradients")
# Flags that need --backward, refused without it; outputs checked before any compute.
foreach(flag --do --dq --dk --dv)
  step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 ${flag} x.npy
       STDERR "${flag} only applies to the backward pass and does nothing without --backward; add --backward or drop ${flag}")
endforeach()
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench -b 64 -e 64 --deterministic
     STDERR "--deterministic only applies to the backward pass and does nothing without --backward")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --backward --seq 64 --dq g.npy --dv g.npy
     STDERR "--dq g.npy and --dv g.npy name the same file: each output needs a file of its own")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --backward --seq 40 ${small} --do do.npy --dk do.npy
     STDERR "--dk do.npy is the input file of --do do.npy")
step(EXPECT_RC 1 COMMAND sh -c "'${RINGATTN}' run --backward --seq 64 --dv ''" STDERR "--dv: the path is empty")
# bench --backward: the backward's rate (2.5x the forward's FLOPs) and the total per size.
step(EXPECT_RC 0 COMMAND ${RINGATTN} bench --backward -b 64 -e 128 -n 1 -w 0 --heads 2 --kv-heads 1 --dim 16 --causal
     --json bench.json
     STDOUT "# seq 64: backward +[0-9.]+ ms, [0-9.]+ [GT]FLOP/s \\(2.5x the forward's FLOPs\\); forward\\+backward [0-9.]+ ms"
            "# seq 128: backward" "# Result: OK")
file(READ ${WORK_DIR}/bench.json json)
foreach(key "\"backward_median_s\"" "\"backward_gflops_per_s\"" "\"fwd_bwd_median_s\"" "\"fwd_bwd_gflops_per_s\"")
  if(NOT json MATCHES "${key}")
    message(FATAL_ERROR "bench.json lacks ${key}: ${json}")
  endif()
endforeach()

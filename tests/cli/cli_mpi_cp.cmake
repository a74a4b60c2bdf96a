# --cp ulysses and hybrid:U on CPU ranks (issue 45): at P = 4 (ulysses, hybrid:2) and P = 6
# (hybrid:3, hybrid:2), under every mask (full, causal, a window, packed documents), the forward and
# the backward pass the fp64 check, and the gathered out, lse, dq, dk and dv equal one process's
# within fp32 rounding; plan's bytes per rank for each layout are what run --json reports; the
# refusals name the value and what is allowed, on every rank, before any exchange.
include(${HELPERS})
set(MPIRUN4 ${MPIEXEC} -np 4 --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)
set(MPIRUN6 ${MPIEXEC} -np 6 --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)
set(HP --heads 24 --kv-heads 12 --dim 8)  # plan takes no seed
set(H ${HP} --seed ${SEED})
set(masks full causal window docs)
set(full --seq 97)
set(causal --seq 203 --causal)
set(window --seq 150 --window 17,3)
set(docs --seq 203 --causal --doc-lens 50,3,100,50)
foreach(mask ${masks})
  set(M ${H} ${${mask}})
  step(EXPECT_RC 0 COMMAND ${RINGATTN} run ${M} --backward --out o1_${mask}.npy --lse l1_${mask}.npy
       --dq dq1_${mask}.npy --dk dk1_${mask}.npy --dv dv1_${mask}.npy)
  foreach(layout "4;ulysses" "4;hybrid:2" "6;hybrid:3" "6;hybrid:2")
    list(GET layout 0 np)
    list(GET layout 1 cp)
    string(REPLACE ":" "" tag ${mask}_${np}_${cp})
    step(EXPECT_RC 0 COMMAND ${MPIRUN${np}} ${RINGATTN} run ${M} --cp ${cp} --backward --check --out o_${tag}.npy
         --lse l_${tag}.npy --dq dq_${tag}.npy --dk dk_${tag}.npy --dv dv_${tag}.npy
         STDOUT "# world ${np}, transport mpi, cp ${cp}" "dq max abs [^\n]* -> OK")
    foreach(t o l dq dk dv)
      step(EXPECT_RC 0 COMMAND ${NPY_TOOL} compare ${t}1_${mask}.npy ${t}_${tag}.npy 1e-5)
    endforeach()
  endforeach()
endforeach()
# The forward alone, checked, in bshd files.
step(EXPECT_RC 0 COMMAND ${MPIRUN4} ${RINGATTN} run ${H} ${causal} --cp hybrid:2 --check --layout bshd
     --out ob.npy STDOUT "cp hybrid:2 \\(2 groups of 2 ranks, a ring across them\\)" "over tolerance 0 -> OK")

# bench sweeps under a layout, checked forward and backward.
step(EXPECT_RC 0 COMMAND ${MPIRUN4} ${RINGATTN} bench ${H} -b 64 -e 128 --causal --cp hybrid:2 --backward -n 2 -w 0
     STDOUT "# ringattn bench: impl flash, device cpu, transport mpi, world 4, cp hybrid:2" "non-finite gradients 0"
            "# Result: OK")
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} bench ${H} -b 4 -e 8 --kv-seq 64 --cp ulysses
     STDERR "--cp ulysses runs self-attention; a --kv-seq sweep is decode: use --cp ring")

# plan's rows for a layout are what the run sends, forward and backward, rank by rank.
foreach(layout "4;ulysses" "6;hybrid:3" "6;hybrid:2")
  list(GET layout 0 np)
  list(GET layout 1 cp)
  string(REPLACE ":" "" tag ${np}_${cp})
  execute_process(COMMAND ${RINGATTN} plan ${HP} --seq 203 --causal --ranks ${np} --cp ${cp} OUTPUT_VARIABLE plan
                  RESULT_VARIABLE rc)
  message("${plan}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "plan --cp ${cp} failed: ${rc}")
  endif()
  step(EXPECT_RC 0 COMMAND ${MPIRUN${np}} ${RINGATTN} run ${H} --seq 203 --causal --cp ${cp} --backward
       --json b_${tag}.json)
  file(READ ${WORK_DIR}/b_${tag}.json json)
  math(EXPR last "${np} - 1")
  foreach(r RANGE ${last})
    if(NOT plan MATCHES "\n +${r} +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +([0-9]+) +[0-9]+ +[0-9]+ +([0-9]+)\n")
      message(FATAL_ERROR "plan --cp ${cp} has no row for rank ${r}")
    endif()
    set(fwd ${CMAKE_MATCH_1})
    set(bwd ${CMAKE_MATCH_2})
    string(JSON run_fwd GET "${json}" forward_bytes_sent ${r})
    string(JSON run_bwd GET "${json}" backward_bytes_sent ${r})
    if(NOT fwd EQUAL run_fwd OR NOT bwd EQUAL run_bwd OR fwd EQUAL 0)
      message(FATAL_ERROR "--cp ${cp} rank ${r}: plan says ${fwd} / ${bwd} bytes, the run sent ${run_fwd} / ${run_bwd}")
    endif()
  endforeach()
endforeach()
step(EXPECT_RC 0 COMMAND ${RINGATTN} plan ${HP} --seq 203 --causal --ranks 6
     STDOUT "\n  ring +6x1 " "\n  hybrid:2 +3x2 " "\n  hybrid:3 +2x3 " "\n  ulysses +1x6 ")

# Refusals: on every rank alike, before any exchange.
step(EXPECT_RC 1 COMMAND ${MPIRUN4} ${RINGATTN} run --seq 64 --cp ulysses
     STDERR "--cp ulysses over groups of 4 ranks: --heads 8 and --kv-heads 2 must both divide by 4 \\(each rank of a group attends heads / 4 query and kv-heads / 4 key/value heads\\)")
step(EXPECT_RC 1 COMMAND ${MPIRUN4} ${RINGATTN} run ${H} --seq 64 --cp hybrid:3
     STDERR "--cp hybrid:3: groups of 3 ranks do not divide the world of 4; U must be a divisor of it \\(1, 2, 4\\)")
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run ${H} --seq 64 --cp hybrid:0
     STDERR "--cp hybrid:0: not ring, ulysses or hybrid:U with U ranks per all-to-all group, a divisor of the world of 2 \\(1, 2\\)")
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run ${H} --seq 64 --cp zigzag --dry-run
     STDERR "--cp zigzag: not ring, ulysses or hybrid:U")
step(EXPECT_RC 1 COMMAND ${MPIRUN} ${RINGATTN} run ${H} --seq 4 --kv-seq 64 --cp ulysses --dry-run
     STDERR "--cp ulysses runs self-attention \\(kv_len = q_len, q_offset 0\\); this problem is a decode \\(q_len 4, kv_len 64, q_offset 60\\): use --cp ring")
step(EXPECT_RC 1 COMMAND ${MPIRUN} -x RINGATTN_FAULT=0:0:exit ${RINGATTN} run ${H} --seq 64 --cp ulysses
     STDERR "RINGATTN_FAULT applies to --cp ring \\(its hops are those of the ring of every rank\\); unset it for --cp ulysses")
set(MPMD ${MPIEXEC} --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)
step(EXPECT_RC 1 COMMAND ${MPMD} -np 1 ${RINGATTN} run ${H} --seq 64 --cp ring : -np 1 ${RINGATTN} run ${H} --seq 64
     --cp ulysses
     STDERR "rank 1 has --cp ulysses where rank 0 has --cp ring")
step(EXPECT_RC 1 COMMAND ${RINGATTN} plan ${HP} --seq 64 --ranks 4 --cp hybrid:8
     STDERR "--cp hybrid:8: groups of 8 ranks do not divide the world of 4")
# The dry run splits the groups and checks one all-to-all in each.
step(EXPECT_RC 0 COMMAND ${MPIRUN4} ${RINGATTN} run ${H} --seq 64 --cp hybrid:2 --backward --dry-run
     STDOUT "over 2 groups of 2 ranks \\(--cp hybrid:2" "groups   ok: one all-to-all inside each of the 2 groups of 2 consecutive ranks" "dry run: OK")

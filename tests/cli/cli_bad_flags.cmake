# Bad flags end with exit code 1 and a one-line message naming the values and what is allowed.
include(${HELPERS})
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --heads 7 --kv-heads 2 STDERR "--heads 7.*--kv-heads 2" "multiple")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --bogus STDERR "bogus")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --dtype fp64 STDERR "fp64")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 0 STDERR "--seq: must be an integer in 1..9223372036854775807 .got .0..")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --shard diagonal STDERR "diagonal")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --log-level loud STDERR "loud" "trace, debug, info")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --q q.npy STDERR "--q, --k and --v go together")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --causal --seq 50 --kv-seq 100 --q-offset -5 STDERR "q_offset=-5")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --seq 64 --out /nonexistent-dir/o.npy STDERR "/nonexistent-dir/o.npy")
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench -b 300 -e 100 STDERR "--seq-max 100 is below --seq-min 300")
step(EXPECT_RC 1 COMMAND ${RINGATTN} bench --impl naive --device cuda -b 64 -e 64 STDERR "cuda")
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --transport mpi STDERR "launcher")
if(NOT HAVE_CUDA)
  step(EXPECT_RC 1 COMMAND ${RINGATTN} run --device cuda STDERR "--device cuda: this ringattn was built without CUDA")
else()
  execute_process(COMMAND nvidia-smi -L RESULT_VARIABLE smi OUTPUT_QUIET ERROR_QUIET)
  if(NOT smi EQUAL 0)
    step(EXPECT_RC 1 COMMAND ${RINGATTN} run --device cuda STDERR "--device cuda: no GPU is visible")
  endif()
endif()
# A refused choice shows its value quoted, an empty one too (it printed `--dtype:  not in {...}`),
# and a parse error names the --help of its own subcommand (plan's named run's and bench's). A
# CMake list cannot hold an empty argument: sh passes it.
foreach(cmd run bench plan)
  step(EXPECT_RC 1 COMMAND sh -c "'${RINGATTN}' ${cmd} --dtype ''"
       STDERR "\\] --dtype: '' not in {fp32,fp16,bf16} \\(see ringattn ${cmd} --help\\)\n$")
  step(EXPECT_RC 1 COMMAND sh -c "'${RINGATTN}' ${cmd} --shard ''"
       STDERR "\\] --shard: '' not in {auto,contiguous,zigzag,striped,doc-zigzag} \\(see ringattn ${cmd} --help\\)\n$")
  step(EXPECT_RC 1 COMMAND ${RINGATTN} ${cmd} --bogus
       STDERR "\\] The following argument was not expected: --bogus \\(see ringattn ${cmd} --help\\)\n$")
endforeach()
step(EXPECT_RC 1 COMMAND ${RINGATTN} run --dtype fp64 STDERR "\\] --dtype: 'fp64' not in {fp32,fp16,bf16} \\(see ringattn run --help\\)\n$")
step(EXPECT_RC 1 COMMAND sh -c "'${RINGATTN}' run --device ''" STDERR "--device: '' not in {cpu,cuda} \\(see ringattn run --help\\)")
step(EXPECT_RC 1 COMMAND sh -c "'${RINGATTN}' bench --timer ''" STDERR "--timer: '' not in {per-call,batch} \\(see ringattn bench --help\\)")
step(EXPECT_RC 1 COMMAND sh -c "'${RINGATTN}' bench --impl ''" STDERR "--impl: '' not in {flash,naive,both} \\(see ringattn bench --help\\)")
step(EXPECT_RC 1 COMMAND ${RINGATTN} plan --seq 0
     STDERR "--seq: must be an integer in 1..9223372036854775807 \\(got '0'\\) \\(see ringattn plan --help\\)\n$")
step(EXPECT_RC 1 COMMAND ${RINGATTN} --bogus STDERR "\\] The following argument was not expected: --bogus \\(see ringattn --help\\)\n$")

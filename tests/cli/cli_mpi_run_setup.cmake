# `ringattn run` reports its setup (world, inputs, the ring's warm-up exchange) apart from the
# attention: a setup_ms column, a setup line, JSON fields; the warm-up's bytes are not the run's.
include(${HELPERS})
set(num "[0-9]+\\.[0-9]+")
# One process: nothing to connect, so no warm-up.
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --seq 256 --causal --seed ${SEED}
     STDOUT "# rank +host +device +setup_ms +wall_ms +compute_ms"
            "time +${num} ms \\(slowest rank, the attention alone\\)"
            "setup +${num} ms \\(slowest rank; not in the time above\\): world ${num} ms, inputs ${num} ms, ring warm-up none")
# Two ranks: one untimed exchange of the ring's block warms the ring first.
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --seq 512 --causal --check --seed ${SEED} --json r.json
     STDOUT "\n +0 +[^\n]+ ${num} +${num} +${num}" "ring warm-up ${num} ms" "-> OK")
file(READ ${WORK_DIR}/r.json json)
string(JSON setup GET "${json}" setup_s)
string(JSON wall GET "${json}" wall_s)
# The run's one hop sends one block: K and V (2 KV heads, dim 64, fp32: 1 KiB a token) of the rows
# the other rank sees. Zigzag over 2 ranks: rank 1 (chunks 1, 2) sees rank 0's chunk 0 only, so
# rank 0 sends 128 tokens; rank 0 (chunks 0, 3) sees both of rank 1's, so rank 1 sends 256.
set(want0 131072)
set(want1 262144)
foreach(r 0 1)
  string(JSON warm${r} GET "${json}" ranks ${r} setup warm_s)
  string(JSON rsetup${r} GET "${json}" ranks ${r} setup_s)
  string(JSON sent${r} GET "${json}" ranks ${r} bytes_sent)
  if(NOT warm${r} GREATER 0 OR NOT rsetup${r} GREATER warm${r} OR NOT sent${r} EQUAL ${want${r}})
    message(FATAL_ERROR "r.json rank ${r}: warm_s ${warm${r}}, setup_s ${rsetup${r}}, bytes_sent ${sent${r}} "
                        "(expected a warm-up > 0 inside the setup, and ${want${r}} bytes sent by the run alone)")
  endif()
endforeach()
if(NOT setup GREATER 0 OR NOT wall GREATER 0)
  message(FATAL_ERROR "r.json: setup_s ${setup}, wall_s ${wall}")
endif()
# A decode gathers states over the collectives the agreement already used: no warm-up.
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} run --seq 4 --kv-seq 300 --causal --seed ${SEED}
     STDOUT "decode" "ring warm-up none")

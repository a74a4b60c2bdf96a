# `ringattn bench` over two ranks: one header line per rank and the hidden-communication column.
include(${HELPERS})
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} bench -b 256 -e 512 -n 2 -w 1 --causal --seed ${SEED}
     STDOUT "#  Rank +0 Host" "#  Rank +1 Host" "\n +512 +flash" "# Result: OK")

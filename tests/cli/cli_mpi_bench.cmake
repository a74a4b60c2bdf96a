# `ringattn bench` over two ranks: one header line per rank and the hidden-communication column.
include(${HELPERS})
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} bench -b 256 -e 512 -n 2 -w 1 --causal --seed ${SEED}
     STDOUT "#  Rank +0 Host" "#  Rank +1 Host" "\n +512 +flash" "# Result: OK")
# Distributed decode over two ranks (K/V split contiguously): 1 and 4 queries over 500 keys, checked.
step(EXPECT_RC 0 COMMAND ${MPIRUN} ${RINGATTN} bench --kv-seq 500 -b 1 -e 4 -f 4 -n 2 -w 1 --causal --seed ${SEED}
     STDOUT "#  Rank +1 Host" "over a K/V cache of 500 \\(decode, K/V split over ranks"
            "\n +1 +flash [^\n]+ OK\n" "\n +4 +flash [^\n]+ OK\n" "# Result: OK")

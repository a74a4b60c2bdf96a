# `ringattn` alone runs the embedded default problem with --check and exits 0.
include(${HELPERS})
step(EXPECT_RC 0 COMMAND ${RINGATTN}
     STDOUT "causal" "GQA" "rate +[0-9.]+ [GT]FLOP/s" "peak rss" "check +[0-9]+ of [0-9]+ rows.*-> OK"
     STDERR "\\[rank 0/1 [^]]+\\]")
step(EXPECT_RC 0 COMMAND ${RINGATTN} --help STDOUT "run" "bench")
step(EXPECT_RC 0 COMMAND ${RINGATTN} run --help STDOUT "--kv-heads" "--shard" "--out")

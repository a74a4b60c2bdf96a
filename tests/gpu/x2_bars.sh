#!/usr/bin/env bash
# One call on a host with two H200s (`run` with kind nvidia-h200-x2, from the repository root):
# the open two-GPU bars of issues 14 and 15 at P = 2 over NCCL against one GPU, two passes:
# window 4096 (65536 tokens per GPU), dense causal, packed documents (auto and doc-zigzag), and a
# checked windowed run whose bytes are one window per rank. Logs go to $OUT/logs (tarred).
source tests/gpu/x2_common.sh
for pass in 1 2; do
  echo "== pass $pass"
  # windows: 65536 per GPU, window 4096
  $R bench $S -b 65536 -e 65536 --window 4096,0 > $L/w1_$pass.txt 2>&1; echo "w 1gpu: $(row $L/w1_$pass.txt 65536)"
  $MPI bench --transport nccl $S -b 131072 -e 131072 --window 4096,0 --json $L/w2_$pass.json > $L/w2_$pass.txt 2>&1; echo "w 2gpu: $(row $L/w2_$pass.txt 131072)"
  # dense causal reference
  $R bench $S -b 65536 -e 65536 > $L/d1_$pass.txt 2>&1; echo "d 1gpu: $(row $L/d1_$pass.txt 65536)"
  $MPI bench --transport nccl $S -b 131072 -e 131072 > $L/d2_$pass.txt 2>&1; echo "d 2gpu: $(row $L/d2_$pass.txt 131072)"
  # packed documents, auto (doc-zigzag when it balances best) and forced doc-zigzag
  $R bench $S -b 65536 -e 65536 --docs uniform:16384 > $L/p1_$pass.txt 2>&1; echo "docs 1gpu: $(row $L/p1_$pass.txt 65536)"
  $MPI bench --transport nccl $S -b 131072 -e 131072 --docs uniform:16384 > $L/p2_$pass.txt 2>&1; echo "docs 2gpu auto: $(grep -E 'shard' $L/p2_$pass.txt | head -1 | cut -c1-60) $(row $L/p2_$pass.txt 131072)"
  $MPI bench --transport nccl $S -b 131072 -e 131072 --docs uniform:16384 --shard doc-zigzag > $L/pz2_$pass.txt 2>&1; echo "docs 2gpu doc-zigzag: $(row $L/pz2_$pass.txt 131072)"
done
$MPI run --transport nccl --device cuda --heads 32 --kv-heads 8 --dim 128 --dtype bf16 --causal --seq 131072 --window 4096,0 --check --json $L/wrun.json > $L/wrun.txt 2>&1; echo "window run rc=$?"; grep -E "^ +[01] |-> " $L/wrun.txt
finish

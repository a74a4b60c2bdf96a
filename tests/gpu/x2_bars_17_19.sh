#!/usr/bin/env bash
# One call on a host with two H200s (`run` with kind nvidia-h200-x2, from the repository root):
# the open two-GPU bars of issues 17 and 19 at P = 2 over NCCL, beside one GPU and PyTorch context
# parallelism (cuDNN backend), two passes where it matters. bf16, 32/8 heads, d128, causal zigzag.
#   17: weak scaling at 8k and 32k tokens per GPU (and the hidden share the bench reports), the
#       MPI-staged path against NCCL at 32k per GPU, `run`'s rate against bench's at 65536, and
#       >= 1.1x PyTorch CP on 16384, 65536 and 131072 tokens;
#   19: forward + backward weak scaling at 32k per GPU, against PyTorch CP's forward + backward,
#       and a checked ring backward at P = 2 (gradients against the fp64 reference).
# Logs go to $OUT/logs (tarred to $OUT/logs.tgz); the lines printed are the table's inputs.
source tests/gpu/x2_common.sh
bwd() { grep -E "^# seq $2:" $1 | head -1; }
for pass in 1 2; do
  echo "== pass $pass (17: weak scaling; 19: forward + backward)"
  for n in 8192 32768; do
    $R bench $S -b $n -e $n > $L/w1_${n}_$pass.txt 2>&1; echo "1 gpu $n: $(row $L/w1_${n}_$pass.txt $n)"
    $MPI bench --transport nccl $S -b $((2 * n)) -e $((2 * n)) > $L/w2_${n}_$pass.txt 2>&1; echo "2 gpus $((2 * n)): $(row $L/w2_${n}_$pass.txt $((2 * n)))"
  done
  $R bench $S --backward -b 32768 -e 32768 > $L/b1_$pass.txt 2>&1; echo "fwd+bwd 1 gpu 32768: $(bwd $L/b1_$pass.txt 32768)"
  $MPI bench --transport nccl $S --backward -b 65536 -e 65536 > $L/b2_$pass.txt 2>&1; echo "fwd+bwd 2 gpus 65536: $(bwd $L/b2_$pass.txt 65536)"
done
echo "== 17: the MPI-staged path at 32k per GPU"
$MPI bench --transport mpi $S -b 65536 -e 65536 > $L/mpi2.txt 2>&1; echo "mpi 2 gpus 65536: $(row $L/mpi2.txt 65536)"
echo "== 17: run's rate against bench's at 65536, P = 2"
$MPI run --transport nccl --device cuda --heads 32 --kv-heads 8 --dim 128 --dtype bf16 --causal --seq 65536 --json $L/run65k.json > $L/run65k.txt 2>&1; echo "run rc=$?"; grep -iE "attention|TFLOP|setup" $L/run65k.txt | head -4
echo "== 19: a checked ring backward at P = 2"
$MPI run --transport nccl --device cuda --heads 32 --kv-heads 8 --dim 128 --dtype bf16 --causal --seq 16384 --backward --check > $L/runbwd.txt 2>&1; echo "run --backward --check rc=$?"; grep -E "check|backward" $L/runbwd.txt | head -4
echo "== peers: PyTorch context parallelism (cuDNN backend)"
TR="torchrun --standalone --nproc_per_node 2 launch/torch_cp_peer.py --causal --backend cudnn"
for n in 16384 65536 131072; do timeout 120 $TR --seq $n > $L/cp_$n.txt 2>&1; grep torch_cp $L/cp_$n.txt || tail -3 $L/cp_$n.txt; done
timeout 150 $TR --seq 65536 --backward > $L/cp_bwd.txt 2>&1; grep torch_cp $L/cp_bwd.txt || tail -3 $L/cp_bwd.txt
for n in 16384 131072; do $MPI bench --transport nccl $S -b $n -e $n > $L/s2_$n.txt 2>&1; echo "ours 2 gpus $n: $(row $L/s2_$n.txt $n)"; done
finish

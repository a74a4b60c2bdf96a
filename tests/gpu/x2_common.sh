# What both two-GPU bar scripts (x2_bars.sh, x2_bars_17_19.sh) start with, sourced from the
# repository root: the environment, the build of ringattn in $B, the log folder $L, the launcher
# $MPI, the common bench flags $S and the helpers finish (tar the logs, exit) and row.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
B=/tmp/b; L=$OUT/logs; mkdir -p $L
finish() { tar czf $OUT/logs.tgz -C $OUT logs; exit 0; }
nvidia-smi --query-gpu=index,name,clocks.sm,temperature.gpu --format=csv,noheader | tee $L/gpu.txt
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release -DRINGATTN_TESTS=OFF > $L/build.log 2>&1
cmake --build $B -j32 --target ringattn >> $L/build.log 2>&1 || { echo BUILD FAILED; grep -E "error" $L/build.log | head; finish; }
echo "build $(( $(date +%s) - t0 )) s"; R=$B/bin/ringattn
export RINGATTN=$R BUILD_DIR=$B
MPI="bash launch/mpirun.sh --gpu --no-table -np 2"
S="--device cuda --heads 32 --kv-heads 8 --dim 128 --dtype bf16 --causal --no-check -n 10 -w 3"
row() { grep -E "^ +$2 " $1 | head -1; }

#!/usr/bin/env bash
# ringattn under Slurm for real, on the one-node cluster of launch/local_slurm.sh.
#   bash tests/slurm/slurm_test.sh CASE RINGATTN_BINARY WORK_DIR
# Cases:
#   cluster      starts the cluster (the ctest fixture of the others)
#   srun_check   launch/srun.sh --cpu -n 2 run --seq 2048 --causal --check: rank table, the
#                core split (1 OpenMP thread per rank for 2 ranks on 2 cores), the check passes
#   srun_dry_run --dry-run through srun: world of 2 over MPI, each rank's row, one thread each
#   srun_bad_input  a bad flag through srun: the error once, a non-zero exit, no hang
#   sbatch_cpu   sbatch -N 1 -n 2 --export=ALL,RINGATTN_DEVICE=cpu launch/ringattn.sbatch ... --check,
#                waited for (bounded): COMPLETED, exit 0:0, the output file's table and check line;
#                and the default GPU job on this GPU-less cluster: FAILED with the script's message
#   errors       srun.sh's and ringattn.sbatch's own argument errors (no cluster needed)
# Exit 77 (ctest: skipped) with the reason where no cluster is up or it cannot start here, unless
# RINGATTN_REQUIRE_SLURM=1 (CI), where that fails instead.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CASE="$1" BIN="$2" WORK="$3"
HOST="$(hostname -s)"
rm -rf "$WORK" && mkdir -p "$WORK"
unset OMP_NUM_THREADS   # the ranks split the cores themselves; that is under test
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() {
  if [ "${RINGATTN_REQUIRE_SLURM:-0}" = 1 ]; then fail "RINGATTN_REQUIRE_SLURM=1, but: $*"; fi
  echo "skipped: $*"; exit 77
}
has() {  # FILE REGEX WHAT: FILE has a line matching REGEX (extended), else fail naming WHAT
  grep -Eq -- "$2" "$1" || { echo "---- $1:" >&2; cat "$1" >&2; fail "$3: no line matching '$2' in $1"; }
}
need_cluster() {
  command -v sinfo >/dev/null || skip "Slurm is not installed (the slurm_cluster test installs and starts it, as root)"
  timeout 10 sinfo -h -n "$HOST" -o %t 2>/dev/null | grep -Eq '^(idle|mix|alloc|comp)$' ||
    skip "no Slurm cluster is up on $HOST (see the slurm_cluster test; as root: bash launch/local_slurm.sh)"
}
# Runs launch/srun.sh with a time bound; its stdout and stderr land in $WORK/NAME.out / .err.
srun_sh() {  # NAME ARGS...
  local name="$1"; shift
  RINGATTN="$BIN" timeout 120 bash "$ROOT/launch/srun.sh" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"
}
# The rank table: one row per rank 0..N-1 on this host, local rank = rank, the CPU.
has_cpu_table() {  # FILE N
  local r
  has "$1" "^# rank  host +local  device$" "the rank table's header"
  for r in $(seq 0 $(( $2 - 1 ))); do
    has "$1" "^ +$r  $HOST +$r  cpu \\([0-9]+ cores on the host, [0-9]+ in this job\\)$" "rank $r's row of the table"
  done
}
# rank 0's log line on the core split: 2 ranks of one node, one OpenMP thread each.
has_core_split() {  # FILE
  has "$1" "2 rank\\(s\\) on this host \\(SLURM_STEP_TASKS_PER_NODE=2 on node 0\\) share 2 core\\(s\\) \\(SLURM_CPUS_ON_NODE=2\\): 1 OpenMP thread\\(s\\) each" \
    "the core split under srun"
}

# The run's report: both ranks on this host's CPU, one OpenMP thread each.
has_report_rows() {  # FILE
  local r
  for r in 0 1; do has "$1" "^ +$r  $HOST +cpu \\(1 threads\\) " "rank $r's report row, one OpenMP thread"; done
}

case_srun_check() {
  need_cluster
  srun_sh check --cpu -n 2 run --seq 2048 --causal --check || { cat "$WORK/check.err" >&2; fail "srun.sh --cpu -n 2 ... --check: exit $?"; }
  has_cpu_table "$WORK/check.err" 2
  has "$WORK/check.err" "^\\+ srun -n 2 --mpi=pmix --cpu-bind=none $BIN run --device cpu --seq 2048 --causal --check$" "the srun command line"
  has_core_split "$WORK/check.err"
  has "$WORK/check.out" "^# world 2, transport mpi$" "the run's world"
  has_report_rows "$WORK/check.out"
  has "$WORK/check.out" "$CHECK_LINE" "the check's verdict"
}

case_srun_dry_run() {
  need_cluster
  srun_sh dry --cpu -n 2 run --seq 2048 --causal --dry-run || { cat "$WORK/dry.err" >&2; fail "--dry-run through srun: exit $?"; }
  has "$WORK/dry.out" "^# ringattn dry run: world 2 over mpi .*; launcher SLURM_STEP_NUM_TASKS=2;" "the dry run's world"
  local r
  for r in 0 1; do
    has "$WORK/dry.out" "^ +$r  $HOST +$r  cpu \\(1 threads\\) " "rank $r's row, one OpenMP thread"
  done
  has "$WORK/dry.out" "^dry run: OK \\(no attention was computed\\)$" "the dry run's verdict"
}

case_srun_bad_input() {
  need_cluster
  srun_sh bad --cpu -n 2 run --seq 2048 --heads 7 --kv-heads 2
  local rc=$?
  [ "$rc" -eq 1 ] || fail "a bad --heads through srun: exit $rc, expected 1 (124: it hung)"
  local msg="--heads 7 is not a multiple of --kv-heads 2: grouped-query attention needs heads = g * kv-heads"
  local n
  n=$(grep -cF -- "$msg" "$WORK/bad.err" "$WORK/bad.out" | awk -F: '{s += $2} END {print s}')
  [ "$n" -eq 1 ] || { cat "$WORK/bad.err" >&2; fail "the error '$msg' printed $n times, expected once"; }
}

# Polls scontrol until job ID ends (at most LIMIT s; then cancels it): prints JobState and ExitCode.
wait_job() {  # ID LIMIT
  local deadline=$(( SECONDS + $2 )) info
  while [ $SECONDS -lt "$deadline" ]; do
    info="$(scontrol show job "$1" 2>/dev/null)"
    case "$info" in
      *JobState=PENDING*|*JobState=RUNNING*|*JobState=CONFIGURING*|*JobState=COMPLETING*) sleep 0.5 ;;
      *JobState=*) grep -oE "JobState=[A-Z_]+|ExitCode=[0-9]+:[0-9]+" <<<"$info" | tr '\n' ' '; return 0 ;;
      *) sleep 0.5 ;;
    esac
  done
  scancel "$1" 2>/dev/null
  fail "job $1 did not end within $2 s (cancelled)"
}

case_sbatch_cpu() {
  need_cluster
  cd "$ROOT" || fail "no $ROOT"   # ringattn.sbatch runs launch/srun.sh from the submit directory
  local id nogpu state out
  id=$(RINGATTN="$BIN" sbatch --parsable -N 1 -n 2 -o "$WORK/cpu-%j.out" --export=ALL,RINGATTN_DEVICE=cpu \
       launch/ringattn.sbatch --seq 2048 --causal --check) || fail "sbatch (cpu) refused the job"
  # The default, GPU ranks, on a cluster without GPUs: the script's own error, at once.
  nogpu=$(RINGATTN="$BIN" sbatch --parsable -N 1 -n 1 -o "$WORK/gpu-%j.out" launch/ringattn.sbatch) ||
    fail "sbatch (default, gpu) refused the job"
  state=$(wait_job "$id" 120)
  out="$WORK/cpu-$id.out"
  [ -s "$out" ] || fail "job $id ($state): no output file $out"
  [[ "$state" == "JobState=COMPLETED ExitCode=0:0 " ]] || { cat "$out" >&2; fail "job $id: $state, expected COMPLETED 0:0"; }
  has_cpu_table "$out" 2
  has "$out" "^\\+ srun --mpi=pmix --cpu-bind=none $BIN run --device cpu --seq 2048 --causal --check$" "the job's srun line"
  has_core_split "$out"
  has_report_rows "$out"
  has "$out" "$CHECK_LINE" "the check's verdict"
  state=$(wait_job "$nogpu" 60)
  [[ "$state" == "JobState=FAILED ExitCode=1:0 " ]] || fail "the GPU job without GPUs: $state, expected FAILED 1:0"
  has "$WORK/gpu-$nogpu.out" "^ringattn.sbatch: RINGATTN_DEVICE=cuda \\(the default\\), but job $nogpu holds no GPU: submit with --gpus-per-node=N --ntasks-per-node=N, or with --export=ALL,RINGATTN_DEVICE=cpu for CPU ranks$" \
    "the GPU job's message"
}

# Each: expected exit 1 and exactly MESSAGE on stderr.
expect_error() {  # MESSAGE COMMAND...
  local msg="$1"; shift
  "$@" >"$WORK/e.out" 2>"$WORK/e.err" </dev/null
  local rc=$?
  [ "$rc" -eq 1 ] || fail "'$*': exit $rc, expected 1 ($(cat "$WORK/e.err"))"
  [ "$(cat "$WORK/e.err")" = "$msg" ] || fail "'$*': stderr '$(cat "$WORK/e.err")', expected '$msg'"
}
case_errors() {
  local s="$ROOT/launch/srun.sh"
  expect_error "srun.sh: -n must be a positive whole number, got 'x'" bash "$s" --cpu -n x --seq 2048
  expect_error "srun.sh: -n must be a positive whole number, got '0'" bash "$s" --cpu -n 0
  expect_error "srun.sh: -n needs a number of tasks" bash "$s" --cpu -n
  expect_error "srun.sh: -n is for CPU ranks (--cpu); GPU ranks are NODES x GPUS_PER_NODE, one task per GPU" \
    bash "$s" -n 2 --seq 2048
  expect_error "srun.sh: TASKS_PER_NODE must be a positive whole number, got '2x'" env TASKS_PER_NODE=2x bash "$s" --cpu
  expect_error "srun.sh: NODES must be a positive whole number, got '-1'" env NODES=-1 bash "$s"
  expect_error "srun.sh: GPUS_PER_NODE must be a positive whole number, got 'eight'" env GPUS_PER_NODE=eight bash "$s"
  # No srun on PATH (only what srun.sh needs before it looks), then a missing binary.
  mkdir -p "$WORK/nosrun" "$WORK/fakesrun" && ln -sf "$(command -v dirname)" "$WORK/nosrun/dirname"
  expect_error "srun.sh: srun not found: no Slurm here (bash launch/local_slurm.sh starts a one-node cluster, as root)" \
    env PATH="$WORK/nosrun" "$BASH" "$s" --cpu -n 2
  printf '#!/bin/sh\nexit 0\n' >"$WORK/fakesrun/srun" && chmod +x "$WORK/fakesrun/srun"
  expect_error "srun.sh: no ringattn binary at $WORK/none (build first: bash launch/run.sh, or set BUILD_DIR / RINGATTN)" \
    env PATH="$WORK/fakesrun:$PATH" RINGATTN="$WORK/none" bash "$s" --cpu -n 2
  # ringattn.sbatch outside the repository root, and an unknown device.
  expect_error "ringattn.sbatch: launch/srun.sh is not in $WORK: submit from the repository root" \
    env SLURM_SUBMIT_DIR="$WORK" bash "$ROOT/launch/ringattn.sbatch"
  expect_error "ringattn.sbatch: RINGATTN_DEVICE='tpu': allowed are cuda and cpu" \
    env SLURM_SUBMIT_DIR="$ROOT" RINGATTN_DEVICE=tpu bash "$ROOT/launch/ringattn.sbatch"
  echo "errors: all as expected"
}

case_cluster() {
  bash "$ROOT/launch/local_slurm.sh" 2>"$WORK/start.err"
  local rc=$?
  cat "$WORK/start.err" >&2
  [ "$rc" -eq 77 ] && skip "$(grep "^local_slurm: " "$WORK/start.err" | tail -1 | sed 's/^local_slurm: //')"
  return "$rc"
}

CHECK_LINE="^check +16384 of 16384 rows \\(all\\): .*, over tolerance 0 -> OK$"   # 2048 tokens x 8 heads
declare -F "case_$CASE" >/dev/null || fail "unknown case '$CASE'"
t0=$SECONDS
"case_$CASE"
rc=$?
echo "$CASE: done in $(( SECONDS - t0 )) s"
exit "$rc"

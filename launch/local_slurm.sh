#!/usr/bin/env bash
# A one-node Slurm cluster on this machine (for the `slurm` tests and for trying srun.sh and
# ringattn.sbatch without a real cluster). Idempotent: a second call finds it up and returns at
# once; after a reboot, or when the host's name, cores or memory changed, it (re)starts it.
#   bash launch/local_slurm.sh          # as root; then: sinfo; srun -n 2 hostname
# What it does: installs slurm-wlm, munge and libpmix-dev (the PMIx library that srun --mpi=pmix
# loads) when missing; starts munged; writes /etc/slurm/slurm.conf for this host (`hostname -s`,
# the cores and memory `slurmd -C` reports; munge authentication, proctrack/linuxproc, task/none,
# MpiDefault=pmix, one partition `debug`); starts slurmctld and slurmd as root; waits (at most
# SLURM_START_WAIT_S, default 60 s) until sinfo shows the node up. An /etc/slurm/slurm.conf that
# this script did not write (a real cluster's) is left alone and used as it is.
# Exit: 0 the cluster is up; 77 it cannot start here (not root, or the packages cannot be
# installed), with the reason on stderr; 1 it was started but did not come up (logs on stderr).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOST="$(hostname -s)"
CONF=/etc/slurm/slurm.conf
MARK="# Written by ringattn launch/local_slurm.sh"
LOGS=/var/log/slurm
WAIT_S="${SLURM_START_WAIT_S:-60}"
say() { echo "local_slurm: $*" >&2; }

# The node's state letters as sinfo prints them (idle, mix, alloc, down*, drain, ...), or nothing.
node_state() { timeout 10 sinfo -h -n "$HOST" -o %t 2>/dev/null | head -1; }
node_up() { case "$(node_state)" in idle|mix|alloc|comp) return 0 ;; *) return 1 ;; esac; }

# Alive and really that daemon: pid file, signal 0 and the process name.
daemon_pid() {  # NAME PIDFILE
  local pid
  pid="$(cat "$2" 2>/dev/null)" || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] && echo "$pid"
}
stop_daemon() {  # NAME PIDFILE: ends the daemon this script started, by its id
  local pid
  pid="$(daemon_pid "$1" "$2")" || return 0
  kill "$pid"
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}
# Starts a daemon in its own session, its standard streams closed: a daemon holding the caller's
# pipe open would keep ctest waiting for the test's output to end.
start_daemon() { setsid "$@" </dev/null >/dev/null 2>&1; }

if [ "$(id -u)" -ne 0 ]; then
  command -v sinfo >/dev/null && node_up && { say "up already (node $HOST $(node_state))"; exit 0; }
  say "cannot start a Slurm cluster: needs root (apt-get, munged, slurmctld, slurmd); run as root: bash launch/local_slurm.sh"
  exit 77
fi
command -v apt-get >/dev/null || { say "cannot start a Slurm cluster: no apt-get here (Debian/Ubuntu only)"; exit 77; }
source "$ROOT/launch/packages.sh"
install_missing_packages slurm-wlm munge libpmix-dev || { say "cannot start a Slurm cluster: the packages did not install"; exit 77; }

# munge: one key for the host, a daemon to sign and check credentials.
if [ ! -s /etc/munge/munge.key ]; then
  say "creating /etc/munge/munge.key"
  mungekey -c -f -k /etc/munge/munge.key || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge && chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "starting munged"
  start_daemon runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || { say "munged did not start"; tail -5 /var/log/munge/munged.log >&2; exit 1; }
fi

# slurm.conf for this host, rewritten only when it changed (then the daemons restart).
write_conf() {
  local node
  node="$(slurmd -C | head -1)"   # NodeName=HOST CPUs=... RealMemory=...
  cat <<EOF
$MARK: a one-node cluster on $HOST for tests.
ClusterName=ringattn
SlurmctldHost=$HOST
AuthType=auth/munge
CryptoType=crypto/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmix
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
KillWait=5
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
$node State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
}
restart=0
if [ -e "$CONF" ] && ! grep -q "^$MARK" "$CONF"; then
  say "$CONF was not written by this script: using that cluster as configured"
else
  mkdir -p /etc/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd "$LOGS"
  new="$(write_conf)" || { say "slurmd -C failed"; exit 1; }
  if [ "$new" != "$(cat "$CONF" 2>/dev/null)" ]; then
    say "writing $CONF for $HOST"
    printf '%s\n' "$new" >"$CONF.tmp" && mv "$CONF.tmp" "$CONF"
    restart=1
  fi
fi

if [ "$restart" = 1 ]; then
  stop_daemon slurmd /run/slurmd.pid
  stop_daemon slurmctld /run/slurmctld.pid
fi
daemon_pid slurmctld /run/slurmctld.pid >/dev/null || { say "starting slurmctld"; start_daemon slurmctld; }
daemon_pid slurmd /run/slurmd.pid >/dev/null || { say "starting slurmd"; start_daemon slurmd; }

# Wait for the node; one that came back from a stop may be down or drained: resume it.
deadline=$(( SECONDS + WAIT_S ))
while [ $SECONDS -lt $deadline ]; do
  state="$(node_state)"
  case "$state" in
    idle|mix|alloc|comp) say "up: node $HOST $state ($(sinfo -h -n "$HOST" -o '%c CPUs, %m MB'))"; exit 0 ;;
    down*|drain*|drng*) timeout 10 scontrol update NodeName="$HOST" State=RESUME 2>/dev/null ;;
  esac
  sleep 1
done
say "the node did not come up within ${WAIT_S} s (state '${state:-no answer from slurmctld}'); the logs:"
tail -n 15 "$LOGS/slurmctld.log" "$LOGS/slurmd.log" >&2
exit 1

#!/usr/bin/env bash
# A private single-node Slurm cluster on localhost, for tests that launch through srun.
#
#   scripts/slurm-local.sh start DIR    start munged, slurmctld and slurmd; wait until srun works
#   scripts/slurm-local.sh stop DIR     stop the daemons that `start DIR` started
#
# DIR is an existing, empty directory the caller owns (mktemp -d). Everything lives under it:
# slurm.conf, the munge key and socket, state and spool directories, logs and pid files. No
# Slurm or munge configuration in /etc is read or changed and no system daemon (munged,
# slurmctld) is reused, so the cluster can run beside a real Slurm installation or beside
# another test's cluster (each picks its own free ports).
#
# On success `start` prints the one line the caller needs, `SLURM_CONF=DIR/slurm.conf`; export it
# before running srun/sinfo/squeue. On failure it prints a one-line reason and the tail of the
# logs to stderr, stops what it started, and exits non-zero.
#
# Environment (all optional):
#   SLURM_LOCAL_CTLD_PORT, SLURM_LOCAL_SLURMD_PORT   ports to use (default: random free ports)
#   SLURM_LOCAL_CPUS                                 CPUs the node advertises (default: nproc);
#                                                    more than the machine has is allowed
#   SLURM_LOCAL_TIMEOUT                              seconds to wait for the cluster (default 30)
# Needs root: slurmd runs jobs as the submitting user and the daemons run as root here.
set -euo pipefail

usage() {
  echo "usage: $0 start DIR | stop DIR" >&2
  exit 2
}

[ $# -eq 2 ] || usage
command=$1
[ -d "$2" ] || { echo "$0: '$2' is not a directory" >&2; exit 2; }
dir=$(cd "$2" && pwd -P)  # absolute: the daemons chdir, and the path goes into slurm.conf
conf="$dir/slurm.conf"
daemons=(munged slurmctld slurmd)  # start order; stop goes in reverse

# The pids this script recorded for the daemons it started. Kept apart from the pid files the
# daemons write themselves, so that `stop` knows a pid the moment the process exists.
pid_file() { echo "$dir/pids/$1"; }

# True when PID is alive and is one of this cluster's daemons: each is started with DIR on its
# command line, so a recycled pid that now belongs to someone else is never signalled.
# (A zombie has an empty command line, so one that has exited counts as gone.)
is_ours() {
  local cmdline
  cmdline=$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline") || return 1
  [[ "$cmdline" == *"$dir/"* ]]
}

stop_daemon() {
  local name=$1 pid i
  [ -f "$(pid_file "$name")" ] || return 0
  pid=$(cat "$(pid_file "$name")")
  if [[ "$pid" =~ ^[0-9]+$ ]] && is_ours "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    # slurmctld saves its state on TERM, which takes a moment; 10 s is generous.
    for ((i = 0; i < 100; i++)); do
      is_ours "$pid" || break
      sleep 0.1
    done
    if is_ours "$pid"; then
      echo "$0: $name (pid $pid) ignored SIGTERM for 10 s; sending SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 50; i++)); do
        is_ours "$pid" || break
        sleep 0.1
      done
    fi
  fi
  rm -f "$(pid_file "$name")"
}

# Quietly, because slurmctld may already be gone; `|| true` so that set -e never ends a stop.
slurm_quiet() { SLURM_CONF=$conf timeout 5 "$@" 2>/dev/null || true; }

# Ends every job, while slurmctld and slurmd still run, so that slurmstepd and the job's tasks
# are ended by Slurm itself instead of outliving slurmd. Tasks get SIGKILL at once: a plain
# scancel sends SIGTERM and waits KillWait (30 s) before killing a task that ignores it.
end_jobs() {
  local id steps running kill_steps kill_batch cancel end=$((SECONDS + 10))
  while [ -n "$(slurm_quiet squeue -h -o %i)" ] && [ "$SECONDS" -lt "$end" ]; do
    # Pending jobs first, so that none starts while the running ones are being killed.
    cancel=$(slurm_quiet squeue -h -t PENDING -o %i)
    steps=$(slurm_quiet squeue -h -s -o %i)
    running=$(slurm_quiet squeue -h -t RUNNING -o %i)
    # SIGKILL goes to each step, not to the job: Slurm treats SIGKILL to a job as a plain cancel,
    # and a cancelled job's steps can no longer be signalled. A batch step is signalled through
    # its job with --batch (scancel rejects the id JOB.batch).
    kill_steps=$(grep -E '^[0-9]+\.[0-9]+$' <<<"$steps" || true)
    kill_batch=$(sed -n 's/\.batch$//p' <<<"$steps")
    # A running job with no such step (an idle salloc) has no task to kill: cancel it.
    for id in $running; do
      grep -qE "^$id\.([0-9]+|batch)$" <<<"$steps" || cancel+=" $id"
    done
    # shellcheck disable=SC2086  # one argument per id
    {
      [ -z "${cancel// /}" ] || slurm_quiet scancel $cancel
      [ -z "$kill_steps" ] || slurm_quiet scancel --signal=KILL $kill_steps
      [ -z "$kill_batch" ] || slurm_quiet scancel --batch --signal=KILL $kill_batch
    }
    sleep 0.2
  done
}

stop_all() {
  local i
  if [ -f "$(pid_file slurmctld)" ] && is_ours "$(cat "$(pid_file slurmctld)")"; then
    end_jobs
  fi
  for ((i = ${#daemons[@]} - 1; i >= 0; i--)); do
    stop_daemon "${daemons[i]}"
  done
}

# A TCP port nobody listens on, below Linux's ephemeral range (32768-60999) so that outgoing
# connections never hold it.
free_port() {
  local port i
  for ((i = 0; i < 100; i++)); do
    port=$((20000 + RANDOM % 12000))
    if ! ss -Htln "sport = :$port" | grep -q .; then
      echo "$port"
      return 0
    fi
  done
  return 1
}

fail() {
  local name log
  echo "$0: $1" >&2
  # A daemon's own log file, or its captured stdout/stderr where it died before opening one
  # (munged always logs there: it runs in the foreground).
  for name in "${daemons[@]}"; do
    log="$dir/log/$name.log"
    [ -s "$log" ] || log="$dir/log/$name.out"
    [ -s "$log" ] || continue
    echo "--- tail of $log" >&2
    tail -n 20 "$log" >&2
  done
  stop_all
  exit 1
}

# Runs one daemon in the foreground of a new session (so the caller's Ctrl-C or process-group
# kill does not reach it) and records its pid. setsid execs in place here (a background job of a
# script is not a group leader), so $! is the daemon itself.
launch() {
  local name=$1
  shift
  setsid "$@" </dev/null >>"$dir/log/$name.out" 2>&1 &
  echo $! >"$(pid_file "$name")"
}

# Polls COMMAND until it succeeds or the deadline passes; fails with MESSAGE, or early when a
# daemon started so far has exited (no point waiting on a dead daemon). COMMAND may leave the
# reason for its last failure in $detail.
wait_for() {
  local message=$1 name
  shift
  detail=""
  while ! "$@" >/dev/null 2>&1; do
    for name in "${daemons[@]}"; do
      [ ! -f "$(pid_file "$name")" ] || is_ours "$(cat "$(pid_file "$name")")" ||
        fail "$name exited during start-up"
    done
    [ "$SECONDS" -lt "$deadline" ] || fail "$message after ${wait_s}s${detail:+ ($detail)}"
    sleep 0.2
  done
}

node_idle() {
  local states
  states=$(SLURM_CONF=$conf timeout 5 sinfo -h -N -o %T 2>&1) || { detail="sinfo: $states"; return 1; }
  detail="node state: ${states:-none}"
  [ "$states" = idle ]
}

start() {
  if [ -n "$(ls -A "$dir")" ]; then
    echo "$0: '$dir' is not empty; start wants a fresh directory" >&2
    exit 2
  fi
  local host cpus ctld_port slurmd_port
  host=$(hostname -s)
  cpus=${SLURM_LOCAL_CPUS:-$(nproc)}
  wait_s=${SLURM_LOCAL_TIMEOUT:-30}
  deadline=$((SECONDS + wait_s))
  ctld_port=${SLURM_LOCAL_CTLD_PORT:-$(free_port)}
  slurmd_port=${SLURM_LOCAL_SLURMD_PORT:-$(free_port)}
  while [ "$slurmd_port" = "$ctld_port" ]; do slurmd_port=$(free_port); done

  mkdir -p "$dir"/{munge,state,spool,log,run,pids}

  # munged insists that its key is readable by its user only.
  (umask 077 && dd if=/dev/urandom of="$dir/munge/munge.key" bs=1 count=1024 2>/dev/null)
  chmod 0400 "$dir/munge/munge.key"

  # An empty plugin stack: without it Slurm reads /etc/slurm/plugstack.conf.
  : >"$dir/plugstack.conf"

  cat >"$conf" <<EOF
# Private single-node cluster made by scripts/slurm-local.sh; removed with the directory.
ClusterName=ctrunlocal
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
PlugStackConfig=$dir/plugstack.conf
MailProg=/bin/true
# Containers have no usable cgroup hierarchy: track job processes by process group instead.
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
# Cores are consumable, memory is not: several small jobs can share the node.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Trust the CPU count below even where it differs from the hardware, instead of draining.
SlurmdParameters=config_overrides
# A node that was down comes back as soon as its slurmd registers again.
ReturnToService=2
NodeName=$host NodeHostname=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=100 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

  # From here on, an interrupted start stops what it started.
  trap 'fail "interrupted"' INT TERM

  # --force: munged refuses a socket below a directory that is not searchable by everyone, and
  # DIR from mktemp -d is mode 0700. Only root talks to it, so that is fine. In the foreground
  # munged logs to stderr (log/munged.out), not to a --log-file.
  launch munged munged --foreground --force \
    --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/run/munged.pid" --seed-file="$dir/munge/munged.seed"
  wait_for "munged did not answer on $dir/munge/munge.socket" \
    munge --socket="$dir/munge/munge.socket" --no-input

  # -D: foreground, so $! is the daemon (it also copies its log to log/NAME.out, which keeps
  # errors from before the log file is open). -f puts DIR on the command line (see is_ours)
  # although SLURM_CONF names the same file.
  export SLURM_CONF=$conf
  launch slurmctld slurmctld -D -f "$conf"
  launch slurmd slurmd -D -f "$conf" -N "$host"
  wait_for "node $host did not become idle" node_idle
  wait_for "srun -N1 -n1 true did not succeed" timeout 10 srun -N1 -n1 true
  trap - INT TERM

  echo "SLURM_CONF=$conf"
}

case "$command" in
  start) start ;;
  stop) stop_all ;;
  *) usage ;;
esac

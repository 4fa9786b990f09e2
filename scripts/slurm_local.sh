#!/usr/bin/env bash
# A private single-node Slurm cluster (munged + slurmctld + slurmd) for tests, everything under one state dir.
#
#   eval "$(bash scripts/slurm_local.sh start /tmp/hacpo-slurm)"   # prints `export SLURM_CONF=...`
#   sbatch --wait ... ; sinfo ; scontrol show job ...
#   bash scripts/slurm_local.sh stop /tmp/hacpo-slurm
#
# `start` writes slurm.conf (no cgroups: proctrack/linuxproc, task/none, no accounting daemon) and a munge key
# into the state dir, starts munged (as the `munge` user, on its own socket), slurmctld and slurmd with their
# pid files and logs there, and waits until `sinfo` shows the node idle. Clients find this cluster through
# SLURM_CONF=<state_dir>/slurm.conf (printed on stdout; progress goes to stderr). `stop` cancels this cluster's
# jobs and stops the three daemons by the PIDs in their pid files, nothing else.
#
# Needs root (slurmd launches jobs as their user), Debian's slurm-wlm and munge (scripts/install_ci_deps.sh).
# Keep the state dir path short: munge's socket path must fit in 108 bytes. Knobs (env):
#   SLURM_LOCAL_CPUS      CPUs of the node (default: nproc)
#   SLURM_LOCAL_PORT      slurmctld port; slurmd uses the next one (default: first free pair from 16817)
#   SLURM_LOCAL_TIMEOUT   seconds to wait for the node to become idle (default 60)
set -euo pipefail

log() { echo "[slurm_local] $*" >&2; }
die() { log "error: $*"; exit 1; }

usage() { die "usage: $0 start|stop <state_dir>"; }
[[ $# -eq 2 ]] || usage
action=$1
mkdir -p "$2"
state=$(cd "$2" && pwd)
conf=$state/slurm.conf
node=$(hostname -s)

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

free_port_pair() {  # first p >= $1 with p and p+1 both free
    local p=$1
    while port_in_use "$p" || port_in_use $((p + 1)); do p=$((p + 2)); done
    echo "$p"
}

pid_alive() { [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null; }

read_pid() { [[ -s "$1" ]] && tr -dc '0-9' <"$1" || true; }

write_config() {  # ctld_port
    local ctld_port=$1 cpus=${SLURM_LOCAL_CPUS:-$(nproc)}
    cat >"$conf" <<EOF
# Written by scripts/slurm_local.sh: a private single-node cluster, no cgroups, no accounting daemon.
ClusterName=hacpo-local
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$((ctld_port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$state/munge/munge.socket
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/slurmd-%n
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$state/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
# keep finished jobs visible to scontrol show job for 10 minutes
MinJobAge=600
KillWait=30
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
    # Read only by the cgroup plugins, which this cluster does not load; written so that nothing falls back
    # to a system-wide cgroup.conf.
    cat >"$state/cgroup.conf" <<EOF
CgroupAutomount=no
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
EOF
}

start_munge() {
    local dir=$state/munge
    mkdir -p "$dir"
    chown munge:munge "$dir"
    chmod 0755 "$dir"  # clients (slurmd, srun: root here) must reach the socket; the key stays 0600
    chmod 0755 "$state"  # munged runs as `munge` and must reach its directory
    if [[ ! -s "$dir/munge.key" ]]; then
        runuser -u munge -- mungekey --create --keyfile="$dir/munge.key"
    fi
    runuser -u munge -- munged --socket="$dir/munge.socket" --key-file="$dir/munge.key" \
        --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munged.seed"
    cp "$dir/munged.pid" "$state/munged.pid"
}

wait_node_idle() {
    local timeout=${SLURM_LOCAL_TIMEOUT:-60} waited=0 node_state=""
    while (( waited < timeout * 10 )); do
        node_state=$(sinfo -h -n "$node" -o %t 2>/dev/null || true)
        [[ "$node_state" == "idle" ]] && return 0
        sleep 0.1
        waited=$((waited + 1))
    done
    log "node $node is '${node_state:-unknown}' after ${timeout} s; slurmctld.log / slurmd.log tails:"
    tail -n 20 "$state/slurmctld.log" "$state/slurmd.log" >&2 || true
    return 1
}

start() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        || die "slurmctld, slurmd and munged are needed (bash scripts/install_ci_deps.sh)"
    [[ $(id -u) -eq 0 ]] || die "must run as root (slurmd starts jobs as their user)"
    pid_alive "$(read_pid "$state/slurmctld.pid")" && die "a cluster is already running from $state (stop it first)"
    local started=$SECONDS port
    port=$(free_port_pair "${SLURM_LOCAL_PORT:-16817}")
    mkdir -p "$state/ctld" "$state/slurmd-$node"
    write_config "$port"
    export SLURM_CONF=$conf
    start_munge
    slurmctld -i -f "$conf"      # -i: ignore (absent) saved state; daemonizes, writes slurmctld.pid
    slurmd -f "$conf"            # daemonizes, writes slurmd.pid
    if ! wait_node_idle; then
        stop
        die "the local cluster did not come up"
    fi
    log "cluster up in $((SECONDS - started)) s: node $node, ports $port/$((port + 1)), state in $state"
    echo "export SLURM_CONF=$conf"
}

stop_pid_file() {  # name pid_file
    local name=$1 pid
    pid=$(read_pid "$2")
    if ! pid_alive "$pid"; then
        rm -f "$2"
        return 0
    fi
    kill -TERM "$pid"
    for _ in $(seq 100); do pid_alive "$pid" || break; sleep 0.1; done
    if pid_alive "$pid"; then
        log "$name (pid $pid) ignored SIGTERM for 10 s: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$2"
    log "stopped $name (pid $pid)"
}

stop() {
    export SLURM_CONF=$conf
    if [[ -f "$conf" ]] && pid_alive "$(read_pid "$state/slurmctld.pid")"; then
        # this cluster's own jobs only (SLURM_CONF points at it): let their steps be torn down by slurmd
        local jobs
        jobs=$(squeue -h -o %i 2>/dev/null || true)
        if [[ -n "$jobs" ]]; then
            log "cancelling jobs: $(echo $jobs)"
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            for _ in $(seq 600); do [[ -z "$(squeue -h -o %i 2>/dev/null)" ]] && break; sleep 0.1; done
        fi
    fi
    stop_pid_file slurmd "$state/slurmd.pid"
    stop_pid_file slurmctld "$state/slurmctld.pid"
    stop_pid_file munged "$state/munged.pid"
}

case "$action" in
    start) start ;;
    stop) stop ;;
    *) usage ;;
esac

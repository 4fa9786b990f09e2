#!/usr/bin/env bash
# A private Slurm cluster of 1..N nodes on this machine (munged + slurmctld + one slurmd per node) for tests and
# for trying the multi-node path, everything under one state dir.
#
#   eval "$(bash scripts/slurm_local.sh start /tmp/hacpo-slurm)"      # one node: this host, on 127.0.0.1
#   eval "$(bash scripts/slurm_local.sh start /tmp/hacpo-slurm 3)"    # three nodes: node1..node3
#   sbatch --wait ... ; sinfo ; scontrol show job ...
#   bash scripts/slurm_local.sh stop /tmp/hacpo-slurm
#
# `start` writes slurm.conf (no cgroups: proctrack/linuxproc, task/none, no accounting daemon) and a munge key
# into the state dir, starts munged (as the `munge` user, on its own socket), slurmctld and the slurmd(s) with
# their pid files and logs there, and waits until `sinfo` shows every node idle. Clients find this cluster
# through SLURM_CONF=<state_dir>/slurm.conf (printed on stdout; progress goes to stderr). `stop` cancels this
# cluster's jobs, stops the daemons by the PIDs in their pid files and removes what `start` created.
#
# With N ≥ 2 nodes each node is a Linux network namespace `hacpo-nK` with its own address 10.77.0.K on a private
# bridge `hacpo-br` (10.77.0.254, where slurmctld listens) and its own host name nodeK (a UTS namespace): Slurm,
# Ray and the jobs' processes on nodeK see only that address, so anything that advertises loopback to another
# node fails as it would on a real cluster. Namespaces share the file system, /dev/shm and the PID space (one
# machine), and traffic never leaves it. A stale cluster (namespaces, bridge, veths, their processes) left by a
# crashed run is removed before `start` creates a new one.
#
# Needs root (slurmd launches jobs as their user), Debian's slurm-wlm and munge (scripts/install_ci_deps.sh).
# Keep the state dir path short: munge's socket path must fit in 108 bytes. Knobs (env):
#   SLURM_LOCAL_CPUS      CPUs of the node (default: nproc)
#   SLURM_LOCAL_PORT      slurmctld port; slurmd uses the next one (default: first free pair from 16817)
#   SLURM_LOCAL_TIMEOUT   seconds to wait for the node to become idle (default 60)
set -euo pipefail

log() { echo "[slurm_local] $*" >&2; }
die() { log "error: $*"; exit 1; }

usage() { die "usage: $0 start <state_dir> [nodes] | stop <state_dir>"; }
[[ $# -eq 2 || ( $# -eq 3 && $1 == start ) ]] || usage
action=$1
mkdir -p "$2"
state=$(cd "$2" && pwd)
conf=$state/slurm.conf
nodes_wanted=${3:-1}
[[ "$nodes_wanted" =~ ^[1-9][0-9]?$ && "$nodes_wanted" -le 32 ]] || die "nodes must be 1..32, got '$nodes_wanted'"
NS_PREFIX=hacpo-n
BRIDGE=hacpo-br
SUBNET=10.77.0
ctld_host=$(hostname -s)

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

free_port_pair() {  # first p >= $1 with p and p+1 both free
    local p=$1
    while port_in_use "$p" || port_in_use $((p + 1)); do p=$((p + 2)); done
    echo "$p"
}

pid_alive() { [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null; }

read_pid() { [[ -s "$1" ]] && tr -dc '0-9' <"$1" || true; }

node_names() {  # the cluster's node names, one per line (from slurm.conf once written)
    if (( nodes_wanted == 1 )); then echo "$ctld_host"; else seq -f "node%g" 1 "$nodes_wanted"; fi
}

write_config() {  # ctld_port
    local ctld_port=$1 cpus=${SLURM_LOCAL_CPUS:-$(nproc)} ctld_addr=127.0.0.1 node_lines
    if (( nodes_wanted == 1 )); then
        node_lines="NodeName=$ctld_host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN"
    else
        ctld_addr=$SUBNET.254
        node_lines=$(for k in $(seq 1 "$nodes_wanted"); do
            echo "NodeName=node$k NodeAddr=$SUBNET.$k NodeHostname=node$k CPUs=$cpus State=UNKNOWN"; done)
    fi
    cat >"$conf" <<EOF
# Written by scripts/slurm_local.sh: a private $nodes_wanted-node cluster, no cgroups, no accounting daemon.
ClusterName=hacpo-local
SlurmctldHost=$ctld_host($ctld_addr)
SlurmctldPort=$ctld_port
SlurmdPort=$((ctld_port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: how long a killed job's credential stays revoked, and so how long a requeued job waits before it may
# start again (Slurm's default 120 s; a requeued job started sooner is killed: "Job credential revoked")
AuthInfo=socket=$state/munge/munge.socket,cred_expire=10
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/slurmd-%n
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd-%n.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd-%n.log
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
$node_lines
PartitionName=local Nodes=$(node_names | paste -sd,) Default=YES MaxTime=INFINITE State=UP
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

wait_nodes_idle() {
    local timeout=${SLURM_LOCAL_TIMEOUT:-60} waited=0 states=""
    while (( waited < timeout * 10 )); do
        states=$(sinfo -h -N -o "%N=%t" 2>/dev/null | sort -u | paste -sd' ' || true)
        if [[ -n "$states" && $(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l) -eq $nodes_wanted ]]; then
            return 0
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    log "nodes not all idle after ${timeout} s (${states:-no answer}); slurmctld.log / slurmd logs:"
    tail -n 20 "$state/slurmctld.log" "$state"/slurmd-*.log >&2 || true
    return 1
}

# ------------------------------------------------------------------------------ network namespaces (N ≥ 2)
remove_network() {  # every namespace node, veth and the bridge of a (possibly crashed) earlier cluster
    local ns pids
    for ns in $(ip netns list 2>/dev/null | awk -v p="$NS_PREFIX" 'index($1, p) == 1 {print $1}'); do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        # shellcheck disable=SC2086
        [[ -n "$pids" ]] && kill -KILL $pids 2>/dev/null || true
        ip netns delete "$ns" 2>/dev/null || true
    done
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^hacpo-(v[0-9]+|br)$" || true); do
        ip link delete "$link" 2>/dev/null || true
    done
}

create_network() {
    command -v ip >/dev/null && command -v unshare >/dev/null && command -v nsenter >/dev/null \
        || die "ip (iproute2), unshare and nsenter (util-linux) are needed"
    remove_network
    ip link add "$BRIDGE" type bridge
    ip addr add "$SUBNET.254/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    local k ns
    for k in $(seq 1 "$nodes_wanted"); do
        ns=$NS_PREFIX$k
        ip netns add "$ns"
        ip link add "hacpo-v$k" type veth peer name "hacpo-v${k}p"
        ip link set "hacpo-v${k}p" netns "$ns"
        ip link set "hacpo-v$k" master "$BRIDGE"
        ip link set "hacpo-v$k" up
        ip -n "$ns" link set "hacpo-v${k}p" name eth0
        ip -n "$ns" addr add "$SUBNET.$k/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        ip -n "$ns" route add default via "$SUBNET.254"
    done
    log "network: bridge $BRIDGE $SUBNET.254/24, nodes $(for k in $(seq 1 "$nodes_wanted"); do echo "node$k=$SUBNET.$k"; done | paste -sd' ')"
}

start_slurmds() {
    if (( nodes_wanted == 1 )); then
        mkdir -p "$state/slurmd-$ctld_host"
        slurmd -f "$conf"            # daemonizes, writes slurmd-<node>.pid
        return
    fi
    local k
    # The nodes' name service, as a cluster's DNS would be: every node name resolves to its address (gloo, NCCL
    # and Slurm resolve host names), and no name server is configured (lookups fail at once, instead of
    # timing out against one the namespaces cannot reach).
    { echo "127.0.0.1 localhost"; for k in $(seq 1 "$nodes_wanted"); do echo "$SUBNET.$k node$k"; done
      echo "$SUBNET.254 $ctld_host"; } >"$state/hosts"
    echo "# scripts/slurm_local.sh: no name server on the namespace nodes" >"$state/resolv.conf"
    for k in $(seq 1 "$nodes_wanted"); do
        mkdir -p "$state/slurmd-node$k"
        # Its own network (address 10.77.0.k), host name and /etc/hosts + /etc/resolv.conf (a private mount
        # namespace); slurmd's jobs inherit all of it. nsenter, not `ip netns exec`: that one also remounts /sys
        # for the namespace, without /sys/fs/cgroup, and slurmd then refuses to start ("Unable to initialize
        # cgroup plugin").
        nsenter --net="/run/netns/$NS_PREFIX$k" unshare --uts --mount --propagation private sh -c \
            "mount --bind '$state/hosts' /etc/hosts && mount --bind '$state/resolv.conf' /etc/resolv.conf \
             && hostname node$k && exec slurmd -N node$k -f '$conf'"
    done
}

start() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        || die "slurmctld, slurmd and munged are needed (bash scripts/install_ci_deps.sh)"
    [[ $(id -u) -eq 0 ]] || die "must run as root (slurmd starts jobs as their user)"
    pid_alive "$(read_pid "$state/slurmctld.pid")" && die "a cluster is already running from $state (stop it first)"
    local started=$SECONDS port
    port=$(free_port_pair "${SLURM_LOCAL_PORT:-16817}")
    mkdir -p "$state/ctld"
    echo "$nodes_wanted" >"$state/nodes"
    write_config "$port"
    export SLURM_CONF=$conf
    (( nodes_wanted > 1 )) && create_network
    start_munge
    slurmctld -i -f "$conf"      # -i: ignore (absent) saved state; daemonizes, writes slurmctld.pid
    start_slurmds
    if ! wait_nodes_idle; then
        stop
        die "the local cluster did not come up"
    fi
    log "cluster up in $((SECONDS - started)) s: $(node_names | paste -sd' '), ports $port/$((port + 1)), state in $state"
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
    [[ -s "$state/nodes" ]] && nodes_wanted=$(cat "$state/nodes")
    local name
    for name in $(node_names); do
        stop_pid_file "slurmd $name" "$state/slurmd-$name.pid"
    done
    stop_pid_file slurmctld "$state/slurmctld.pid"
    stop_pid_file munged "$state/munged.pid"
    if (( nodes_wanted > 1 )); then
        remove_network
        log "removed the namespace nodes and the bridge"
    fi
}

case "$action" in
    start) start ;;
    stop) stop ;;
    *) usage ;;
esac

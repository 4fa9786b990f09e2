#!/usr/bin/env bash
# HACPO with a Llama-3.3-70B-class and a Qwen3-8B-class agent (conf/pair_large.yaml) on 5 nodes × 8 H100.
#
#   HACPO_LLAMA70B_PATH=/ckpt/Llama-3.3-70B-Instruct HACPO_QWEN8B_PATH=/ckpt/Qwen3-8B \
#   HACPO_TRAIN_DATA=/data/math_train.jsonl HACPO_EVAL_DATA=/data/math500.jsonl \
#   CONTAINER_IMAGE=/images/nemo-hacpo.sqsh sbatch slurm/hacpo_70b_8b.sh [hydra overrides...]
#
# One Ray head on the first node, one Ray worker per other node (each an `srun` step, inside the container when
# CONTAINER_IMAGE (or CONTAINER) is set — pyxis/enroot), then the driver on the head node. Every node must see
# the checkpoints, the data and HACPO_OUTPUT_DIR at the same paths. Ray and the driver log per node under
# $HACPO_OUTPUT_DIR/logs/ (ray-<node>.log, driver.log; the driver's output is also in the job's output file).
# Ray is stopped when the script exits, fails or is cancelled (scancel / time limit: SIGTERM).
#
# Ahead of the time limit: Slurm sends SIGUSR1 to this script <lead> seconds before the job's end
# (`--signal=B:USR1@<lead>`, 900 s below; another lead: `sbatch --signal=B:USR1@1800 ...`); the script passes it
# to the driver, which finishes the step in progress, saves a verified checkpoint and exits 75. The driver also
# stops by itself when the next step and a checkpoint (as measured) would not end runtime.stop_margin_s before the
# job's end time. `scancel --signal=USR1 --batch <job>` does the same at any time. Submitted with `--requeue`, the
# job then requeues itself and its next run continues from that checkpoint; without, it ends with exit code 75
# and resubmitting the same command continues. Exit status: the driver's (0 done, 1 a worker failed, 2 a start-up
# check failed — the output directory held by another live run among them —, 75 saved and stopped early, 143
# stopped by SIGTERM).
#
# Environment: CONFIG (or CONFIG_NAME; default pair_large), PYTHON (default: python on PATH, e.g. a venv's
# bin/python), HACPO_OUTPUT_DIR (outputs/<config>: resubmitting the job resumes there), HACPO_HEAD_IP (the head
# node's address the others dial; default: slurm/node_address.py on it, never loopback), RAY_PORT (6379), RAY_NUM_CPUS (default: the CPUs Slurm gave the task),
# RAY_TEMP_DIR (/tmp/ray-hacpo-<job id> on the head, -<node> appended on the others), RAY_WAIT_S (600), RAY_START_TRIES (3),
# RAY_AUTH_MODE (token, with a per-job token), SWEEP_TIMEOUT_S (60: the end-of-job /dev/shm sweep's limit per node),
# KILL_WAIT_S (Slurm's KillWait, from `scontrol show config`: after a SIGTERM the teardown's budget is 5 s less),
# CONTAINER_MOUNTS (extra mounts; the repository, HACPO_OUTPUT_DIR and the folders of HACPO_*_PATH / *_DATA are
# mounted already). `--config-name X` among the arguments also picks X.
# Other sizes: override the #SBATCH lines on the command line. What CI runs on one CPU node (tests/integration/
# slurm/test_sbatch_job.py):
#   sbatch --nodes=1 --gpus-per-node=0 --cpus-per-task=2 --export=ALL,CONFIG=pair_tiny_gpt,PYTHON=$PWD/.venv/bin/python \
#       slurm/hacpo_70b_8b.sh runtime.steps=2 ...
#SBATCH --job-name=hacpo-70b-8b
#SBATCH --nodes=5
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --exclusive
#SBATCH --time=48:00:00
#SBATCH --signal=B:USR1@900
#SBATCH --output=slurm-%x-%j.out
#SBATCH --open-mode=append
set -euo pipefail

CONFIG=${CONFIG:-${CONFIG_NAME:-pair_large}}
CONTAINER_IMAGE=${CONTAINER_IMAGE:-${CONTAINER:-}}
RAY_PORT=${RAY_PORT:-6379}
REPO_DIR=${REPO_DIR:-${SLURM_SUBMIT_DIR:-$(pwd)}}
PYTHON=${PYTHON:-python}
JOB_ID=${SLURM_JOB_ID:?run this script with sbatch}
EXIT_PREEMPTED=75  # the driver saved a checkpoint and stopped early (nemo_hacpo/runtime/preemption.py)

# SIGUSR1 (ahead of the time limit, or `scancel --signal=USR1 --batch`): passed to the driver once it runs; before
# that the job stops without starting it. Set first: bash's default for SIGUSR1 is to die.
driver_pid=""
preempt_requested=0
on_usr1() {
    preempt_requested=1
    if [[ -n "$driver_pid" ]] && kill -0 "$driver_pid" 2>/dev/null; then
        echo "[hacpo] SIGUSR1: asking the driver to save a checkpoint after the step in progress and stop"
        kill -USR1 "$driver_pid" 2>/dev/null || true
    else
        echo "[hacpo] SIGUSR1: the driver is not running; the job stops before starting it"
    fi
}
trap on_usr1 USR1

# `--config-name X` among the arguments picks the config; everything else is passed through as overrides.
overrides=()
while [[ $# -gt 0 ]]; do
    if [[ "$1" == "--config-name" && $# -ge 2 ]]; then CONFIG=$2; shift 2; else overrides+=("$1"); shift; fi
done

# Not per job: resubmitting the same job (after a failure, a preemption or the time limit) resumes from the
# last complete checkpoint there. Two jobs of one config at once need their own HACPO_OUTPUT_DIR: the second
# driver on a directory in use exits 2 naming the first (its lock, <dir>/run.lock).
export HACPO_OUTPUT_DIR=${HACPO_OUTPUT_DIR:-$REPO_DIR/outputs/$CONFIG}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# NVLink SHARP's buffers take 1.6 GB of every GPU for one communicator and ~6 GB for three or more on H100 switch
# systems (NVIDIA/nccl issue 864); the plan counts 0.5 GiB per communicator (planning/gpu_memory.py), as NeMo's
# launcher does by turning it off. Every srun step, Ray worker and actor inherits it; set it to 1 to measure.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
LOG_DIR=$HACPO_OUTPUT_DIR/logs
RAY_TEMP_DIR=${RAY_TEMP_DIR:-/tmp/ray-hacpo-$JOB_ID}  # short: Ray's socket paths must fit in 107 bytes
RAY_WAIT_S=${RAY_WAIT_S:-600}
RAY_START_TRIES=${RAY_START_TRIES:-3}
SWEEP_TIMEOUT_S=${SWEEP_TIMEOUT_S:-60}  # at the job's end, each node's /dev/shm sweep (see cleanup)
mkdir -p "$LOG_DIR"
# Ray ≥ 2.5x: `ray start` turns token auth on by itself when ~/.ray/auth_token exists (any earlier local
# ray.init() writes one), but a client given an explicit address does not: every connection is then refused
# (InvalidAuthToken). Decide once for the whole job: token auth with a fresh per-job token, handed to every
# srun step (and through the raylets to the workers) in the environment, never written to disk or logs.
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
if [[ "$RAY_AUTH_MODE" == token && -z "${RAY_AUTH_TOKEN:-}" && -z "${RAY_AUTH_TOKEN_PATH:-}" ]]; then
    RAY_AUTH_TOKEN=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
    export RAY_AUTH_TOKEN
fi
# On SIGTERM `ray start --block` first "drains" the node for 30 s (meant for Ray Serve); nothing to drain here.
export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=${RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S:-0}

container_args=()
if [[ -n "$CONTAINER_IMAGE" ]]; then
    # Mounted at the same paths: the repository, the outputs, and the folders of every checkpoint and data file
    # the config reads from the environment, plus CONTAINER_MOUNTS (comma-separated src[:dst[:flags]]).
    mounts=("$REPO_DIR:$REPO_DIR" "$HACPO_OUTPUT_DIR:$HACPO_OUTPUT_DIR")
    for var in HACPO_LLAMA70B_PATH HACPO_QWEN8B_PATH HACPO_TRAIN_DATA HACPO_EVAL_DATA; do
        path=${!var:-}
        [[ -z "$path" ]] && continue
        [[ -d "$path" ]] || path=$(dirname "$path")
        mounts+=("$path:$path")
    done
    [[ -n "${CONTAINER_MOUNTS:-}" ]] && mounts+=("$CONTAINER_MOUNTS")
    mount_list=$(IFS=,; echo "${mounts[*]}")
    # One named container per node for the whole job: every srun step on a node (its Ray daemons, the driver)
    # runs in the same container, so the driver sees the raylet's sockets under RAY_TEMP_DIR (a fresh container
    # per step would not: ray.init could not reach the local raylet).
    container_args=(--container-image="$CONTAINER_IMAGE" --container-name="hacpo-$JOB_ID"
                    --container-workdir="$REPO_DIR" --container-mounts="$mount_list")
    # the checkout's package, not the copy installed in the image, is what runs
    export PYTHONPATH=$REPO_DIR${PYTHONPATH:+:$PYTHONPATH}
fi
# One task on one node (`-w node`), sharing the allocation's CPUs/GPUs with the long-running Ray steps (--overlap).
# An array, not a function: `"${srun_one[@]}" ... &` backgrounds srun itself, so `$!` is srun's PID (a
# backgrounded function would be a subshell, and killing it would leave srun running).
srun_one=(srun --nodes=1 --ntasks=1 --overlap "${container_args[@]}")

mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
head_node=${nodes[0]}
# Not `hostname --ip-address`: it can answer 127.0.1.1 (/etc/hosts), which other nodes cannot reach.
head_ip=${HACPO_HEAD_IP:-$("${srun_one[@]}" -w "$head_node" "$PYTHON" "$REPO_DIR/slurm/node_address.py")}
gpus_per_node=${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-0}}
gpus_per_node=${gpus_per_node##*:}  # "gpu:8" → 8
cpus_per_node=${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-$(nproc)}}
RAY_NUM_CPUS=${RAY_NUM_CPUS:-$cpus_per_node}
echo "[hacpo] job $JOB_ID: ${#nodes[@]} node(s), head $head_node ($head_ip), $gpus_per_node GPU(s) and" \
     "$RAY_NUM_CPUS Ray CPU(s) per node, config $CONFIG, outputs $HACPO_OUTPUT_DIR"

# ------------------------------------------------------------------------------------------ teardown
# After a SIGTERM (scancel, the time limit) Slurm SIGKILLs whatever of the job still runs KillWait seconds later
# (30 s by default), this script included. The TERM path therefore runs on a budget read from the cluster's
# KillWait, less a margin: Ray first (its steps got the same SIGTERM from Slurm and stop in seconds; waited for at
# most half the budget, then SIGKILLed through Slurm), the "ray stopped" line, then the driver (its shutdown
# bounds itself at 15 s; waited for until the budget ends, then left to Slurm's SIGKILL). Every wait is bounded,
# so the lines that report the stop come before KillWait whatever the machine's speed.
KILL_WAIT_S=${KILL_WAIT_S:-$(scontrol show config 2>/dev/null | awk '$1 == "KillWait" {print $3; exit}' || true)}
[[ "$KILL_WAIT_S" =~ ^[0-9]+$ ]] || KILL_WAIT_S=30  # Slurm's default
STOP_BUDGET_S=$(( KILL_WAIT_S > 10 ? KILL_WAIT_S - 5 : KILL_WAIT_S / 2 ))
ray_pids=()
ray_steps=""  # the Ray steps' ids (`<job>.<step>`), read once the cluster is up: no Slurm query in the TERM path
cancelled=0
any_alive() { local pid; for pid in "$@"; do kill -0 "$pid" 2>/dev/null && return 0; done; return 1; }
wait_until() {  # deadline (in $SECONDS) pids...: wait until the pids have exited or the deadline passed
    local deadline=$1
    shift
    while any_alive "$@" && (( SECONDS < deadline )); do sleep 0.2; done
    ! any_alive "$@"
}
ray_steps_now() {  # the Ray steps' ids, from squeue (at most 10 s)
    timeout 10 squeue --steps --jobs "$JOB_ID" -h -o "%i %j" 2>/dev/null | awk '$2 == "hacpo-ray" {print $1}' || true
}
stop_ray() {  # deadline: SIGTERM to the Ray steps through Slurm (`ray start --block` then stops the raylet, GCS and
    # workers it started; a SIGTERM to srun itself would make srun SIGKILL the step); at the deadline, SIGKILL
    [[ ${#ray_pids[@]} -gt 0 ]] || return 0
    local deadline=$1 steps=${ray_steps:-$(ray_steps_now)} forced=""
    # shellcheck disable=SC2086
    [[ -n "$steps" ]] && timeout 5 scancel --signal=TERM $steps 2>/dev/null || true
    if ! wait_until "$deadline" "${ray_pids[@]}"; then
        forced=" (SIGKILLed $(( SECONDS - stop_from )) s after SIGTERM)"
        # shellcheck disable=SC2086
        [[ -n "$steps" ]] && timeout 3 scancel --signal=KILL $steps 2>/dev/null || true
        wait_until $(( SECONDS + 2 )) "${ray_pids[@]}" || for pid in "${ray_pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    fi
    for pid in "${ray_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    echo "[hacpo] ray stopped on ${#nodes[@]} node(s)$forced (job time ${SECONDS} s)"
}
cleanup() {
    local rc=$?
    trap - EXIT TERM INT
    stop_from=$SECONDS
    if [[ $cancelled -eq 1 ]]; then
        [[ -n "$driver_pid" ]] && kill -TERM "$driver_pid" 2>/dev/null || true  # as Slurm's own SIGTERM: one stop
        stop_ray $(( stop_from + STOP_BUDGET_S / 2 ))
        if [[ -n "$driver_pid" ]] && ! wait_until $(( stop_from + STOP_BUDGET_S )) "$driver_pid"; then
            echo "[hacpo] the driver still stops after $(( SECONDS - stop_from )) s: Slurm's SIGKILL ends it at KillWait" \
                 "(${KILL_WAIT_S} s after SIGTERM)"
        fi
    else
        if [[ -n "$driver_pid" ]] && kill -0 "$driver_pid" 2>/dev/null; then
            echo "[hacpo] stopping the driver (srun pid $driver_pid)"
            kill -TERM "$driver_pid" 2>/dev/null || true
            wait "$driver_pid" 2>/dev/null || true
        fi
        stop_ray $(( SECONDS + 60 ))
    fi
    # What engines killed on a node (its processes lost, actors killed after a failure) left there: their message
    # queues (160–240 MiB each) and semaphores in /dev/shm, their scratch directories. The driver sweeps its own
    # node and every rank its node before its engine starts, but a node no later run uses would keep them: swept
    # here on every node, one step each, while the allocation is still the job's. Not after a cancellation (Slurm
    # refuses new steps then; a later run's ranks sweep what is left), nor where Ray never started.
    if [[ ${#ray_pids[@]} -gt 0 && $cancelled -eq 0 && -d "$HACPO_OUTPUT_DIR/engines/.shm" ]]; then
        local node sweepers=()
        for node in "${nodes[@]}"; do
            timeout "$SWEEP_TIMEOUT_S" "${srun_one[@]}" -w "$node" --job-name=hacpo-sweep "$PYTHON" \
                "$REPO_DIR/nemo_hacpo/rollout/engine_processes.py" "$HACPO_OUTPUT_DIR/engines/.shm" \
                2>>"$LOG_DIR/sweep-$node.log" &
            sweepers+=($!)
        done
        for pid in "${sweepers[@]}"; do wait "$pid" 2>/dev/null || true; done
    fi
    echo "[hacpo] exit status $rc; outputs in $HACPO_OUTPUT_DIR, logs in $LOG_DIR"
    if [[ $rc -eq $EXIT_PREEMPTED ]]; then
        # `sbatch --requeue` (or JobRequeue=1): Requeue=1 in the job's record
        if scontrol show job -o "$JOB_ID" 2>/dev/null | grep -q '\bRequeue=1\b'; then
            echo "[hacpo] requeueing job $JOB_ID (run ${SLURM_RESTART_COUNT:-0}): its next run continues from the checkpoint"
            scontrol requeue "$JOB_ID" || echo "[hacpo] scontrol requeue failed: resubmit the same command to continue"
        else
            echo "[hacpo] stopped early with a checkpoint: resubmit the same command to continue (or submit with --requeue)"
        fi
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'cancelled=1; echo "[hacpo] cancelled (SIGTERM)"; exit 143' TERM
trap 'echo "[hacpo] interrupted"; exit 130' INT

# ------------------------------------------------------------------------------------------ Ray cluster
# At teardown `ray start --block` exits 1 on its SIGTERM, so srun reports "task 0: Exited with exit code 1"
# for each Ray step: expected, and not the job's status (the driver's is).
ray_temp_dir() {  # node: its Ray temp dir (nodes that share /tmp — containers on one host, the namespace nodes of
    # scripts/slurm_local.sh — would otherwise share Ray's session sockets)
    if [[ "$1" == "$head_node" ]]; then echo "$RAY_TEMP_DIR"; else echo "$RAY_TEMP_DIR-$1"; fi
}

ray_start() {  # node: `ray start --block` there (the head, or a worker joining it), in the background
    local node=$1 role
    if [[ "$node" == "$head_node" ]]; then
        role=(--head --node-ip-address="$head_ip" --port="$RAY_PORT" --include-dashboard=false)
    else
        role=(--address="$head_ip:$RAY_PORT")
    fi
    "${srun_one[@]}" -w "$node" --job-name=hacpo-ray --output="$LOG_DIR/ray-$node.log" --open-mode=append \
        "$PYTHON" -m ray.scripts.scripts start --block --num-cpus="$RAY_NUM_CPUS" --num-gpus="$gpus_per_node" \
        --disable-usage-stats "${role[@]}" --temp-dir="$(ray_temp_dir "$node")" &
    ray_pids+=("$!")
}

ray_wait() {  # nodes: in the background, wait until that many Ray nodes are alive (the head may still be starting)
    "${srun_one[@]}" -w "$head_node" "$PYTHON" - "$head_ip:$RAY_PORT" "$1" "$RAY_WAIT_S" <<'EOF' &
import sys, time
import ray
address, want, wait_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
start = time.monotonic()
alive, last_error, last_report = 0, "", start
while time.monotonic() - start < wait_s:
    try:
        ray.init(address=address, logging_level="ERROR")
    except Exception as err:  # the GCS is not up yet (ConnectionError) or refuses us (auth): retry, report
        last_error = f"{type(err).__name__}: {err}"
        if time.monotonic() - last_report > 60:
            print(f"[hacpo] still waiting for Ray at {address}: {last_error}", flush=True)
            last_report = time.monotonic()
        time.sleep(2)
        continue
    alive = sum(node["Alive"] for node in ray.nodes())
    if alive >= want:
        print(f"[hacpo] ray cluster ready after {time.monotonic() - start:.0f} s: {alive} node(s), "
              f"resources {ray.cluster_resources()}", flush=True)
        sys.exit(0)
    ray.shutdown()
    time.sleep(5)
sys.exit(f"[hacpo] only {alive} of {want} Ray nodes joined {address} within {wait_s:.0f} s {last_error}")
EOF
}

# Ray gives a starting node 30 s to register with the GCS (hard-coded in Ray); a loaded node can miss that, and
# `ray start` then exits ("The current node timed out during startup"). A node whose `ray start` ends before the
# cluster is up is started again — what it left running killed first — up to RAY_START_TRIES times in all.
ray_up() {  # nodes the cluster must have in all, then the nodes to start now
    local want=$1 node waiter
    shift
    local -A pid_of=() tries=()
    for node in "$@"; do
        ray_start "$node"
        pid_of[$node]=$!
        tries[$node]=1
    done
    ray_wait "$want"
    waiter=$!
    while kill -0 "$waiter" 2>/dev/null; do
        for node in "$@"; do
            kill -0 "${pid_of[$node]}" 2>/dev/null && continue
            kill -0 "$waiter" 2>/dev/null || break 2  # the cluster came up as this start ended
            echo "[hacpo] ray on $node exited while starting (try ${tries[$node]} of $RAY_START_TRIES):" \
                 "$(grep -v '^\s*$' "$LOG_DIR/ray-$node.log" 2>/dev/null | tail -n 1)"
            if [[ ${tries[$node]} -ge $RAY_START_TRIES ]]; then
                echo "[hacpo] ray did not start on $node: see $LOG_DIR/ray-$node.log"
                kill -TERM "$waiter" 2>/dev/null || true
                wait "$waiter" 2>/dev/null || true
                return 1
            fi
            # whatever that start left running there: its processes name its session dir ("[s]": the pattern
            # must not match its own srun's command line)
            "${srun_one[@]}" -w "$node" pkill -KILL -f -- "$(ray_temp_dir "$node")/[s]ession_" || true
            ray_start "$node"
            pid_of[$node]=$!
            tries[$node]=$((tries[$node] + 1))
        done
        sleep 0.2
    done
    wait "$waiter"
}

ray_up 1 "$head_node"
if [[ ${#nodes[@]} -gt 1 ]]; then ray_up "${#nodes[@]}" "${nodes[@]:1}"; fi
ray_steps=$(ray_steps_now)

# ------------------------------------------------------------------------------------------ driver
# The job's end time, for the driver's own stop before it: inside the container there is no squeue or scontrol,
# so the driver cannot ask Slurm itself (it would fall back to the SIGUSR1 lead alone). Asked here, on the host,
# at every start (a requeued job has a new one), with the host's time zone written out; a runtime.stop_by given
# to sbatch is left as it is.
if [[ " ${overrides[*]} " != *" runtime.stop_by="* ]]; then
    job_end=$(squeue -h -j "$JOB_ID" -o %e 2>/dev/null | head -n 1 || true)
    if [[ "$job_end" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]+$ ]]; then
        job_end=$(date -d "$job_end" +%Y-%m-%dT%H:%M:%S%:z 2>/dev/null || echo "$job_end")
        overrides+=("runtime.stop_by=$job_end")
        echo "[hacpo] the job ends at $job_end: the driver saves and stops before it (runtime.stop_by)"
    else
        echo "[hacpo] no end time from squeue (${job_end:-no answer}): the driver stops early only on SIGUSR1"
    fi
fi
if [[ $preempt_requested -eq 1 ]]; then
    echo "[hacpo] not starting the driver: SIGUSR1 came while Ray started"
    exit "$EXIT_PREEMPTED"
fi
# In the background (with `wait`), so that a SIGTERM or SIGUSR1 reaches its trap at once instead of after the
# driver.
"${srun_one[@]}" -w "$head_node" "$PYTHON" "$REPO_DIR/recipes/train.py" --config-name "$CONFIG" \
    runtime.cluster.ray_address="$head_ip:$RAY_PORT" runtime.cluster.num_nodes="${#nodes[@]}" \
    runtime.cluster.gpus_per_node="$gpus_per_node" runtime.output_dir="$HACPO_OUTPUT_DIR" \
    "${overrides[@]}" > >(trap "" TERM; exec tee -a "$LOG_DIR/driver.log") 2>&1 &
driver_pid=$!
while :; do
    status=0
    wait "$driver_pid" || status=$?
    # a trapped signal (SIGUSR1) ends `wait` early with 128+n while the driver still runs: wait again
    if [[ $status -gt 128 ]] && kill -0 "$driver_pid" 2>/dev/null; then continue; fi
    break
done
driver_pid=""
echo "[hacpo] driver exited with status $status (job time ${SECONDS} s)"
exit "$status"

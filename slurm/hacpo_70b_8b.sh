#!/usr/bin/env bash
# HACPO with a Llama-3.3-70B-class and a Qwen3-8B-class agent (conf/pair_large.yaml) on 5 nodes × 8 H100.
#
#   HACPO_LLAMA70B_PATH=/ckpt/Llama-3.3-70B-Instruct HACPO_QWEN8B_PATH=/ckpt/Qwen3-8B \
#   HACPO_TRAIN_DATA=/data/math_train.jsonl HACPO_EVAL_DATA=/data/math500.jsonl \
#   CONTAINER_IMAGE=/images/nemo-hacpo.sqsh sbatch slurm/hacpo_70b_8b.sh [hydra overrides...]
#
# One Ray head on the first node, one Ray worker per other node (all with `srun`, inside the container when
# CONTAINER_IMAGE is set — pyxis/enroot), then the driver on the head node. Every node must see the
# checkpoints, the data and HACPO_OUTPUT_DIR at the same paths. Other sizes: override --nodes and the config:
#   sbatch --nodes=1 --gpus-per-node=0 slurm/hacpo_70b_8b.sh --config-name pair_tiny   (what CI runs on CPU)
#SBATCH --job-name=hacpo-70b-8b
#SBATCH --nodes=5
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --exclusive
#SBATCH --time=48:00:00
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail

CONFIG_NAME=${CONFIG_NAME:-pair_large}
RAY_PORT=${RAY_PORT:-6379}
REPO_DIR=${REPO_DIR:-${SLURM_SUBMIT_DIR:-$(pwd)}}
PYTHON=${PYTHON:-python}
export HACPO_OUTPUT_DIR=${HACPO_OUTPUT_DIR:-$REPO_DIR/outputs/$CONFIG_NAME-${SLURM_JOB_ID:-local}}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$HACPO_OUTPUT_DIR"

# `--config-name X` among the arguments picks the config; everything else is passed through as overrides.
overrides=()
while [[ $# -gt 0 ]]; do
    if [[ "$1" == "--config-name" && $# -ge 2 ]]; then CONFIG_NAME=$2; shift 2; else overrides+=("$1"); shift; fi
done

container_args=()
if [[ -n "${CONTAINER_IMAGE:-}" ]]; then
    container_args=(--container-image="$CONTAINER_IMAGE" --container-workdir="$REPO_DIR"
                    --container-mounts="${CONTAINER_MOUNTS:-$REPO_DIR:$REPO_DIR}")
fi

mapfile -t nodes < <(scontrol show hostnames "${SLURM_JOB_NODELIST:?run this script with sbatch}")
head_node=${nodes[0]}
head_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address | awk '{print $1}')
gpus_per_node=${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-0}}
gpus_per_node=${gpus_per_node##*:}
cpus_per_node=${SLURM_CPUS_PER_TASK:-$(nproc)}
echo "[hacpo] job ${SLURM_JOB_ID:-?}: ${#nodes[@]} node(s), head $head_node ($head_ip), $gpus_per_node GPU(s)/node, config $CONFIG_NAME"

ray_start() {  # node, extra ray args...
    local node=$1; shift
    srun --nodes=1 --ntasks=1 -w "$node" "${container_args[@]}" --overlap \
        ray start --block --num-cpus="$cpus_per_node" --num-gpus="$gpus_per_node" --disable-usage-stats "$@" &
}
ray_start "$head_node" --head --node-ip-address="$head_ip" --port="$RAY_PORT" --include-dashboard=false
sleep 10
for node in "${nodes[@]:1}"; do
    ray_start "$node" --address="$head_ip:$RAY_PORT"
done

# Wait until every node has joined before the driver places its worker groups.
srun --nodes=1 --ntasks=1 -w "$head_node" "${container_args[@]}" --overlap \
    "$PYTHON" - "$head_ip:$RAY_PORT" "${#nodes[@]}" <<'EOF'
import sys, time
import ray
ray.init(address=sys.argv[1], logging_level="ERROR")
want = int(sys.argv[2])
for _ in range(120):
    alive = sum(node["Alive"] for node in ray.nodes())
    if alive >= want:
        print(f"[hacpo] ray cluster ready: {alive} node(s), resources {ray.cluster_resources()}")
        break
    time.sleep(5)
else:
    sys.exit(f"[hacpo] only {alive} of {want} Ray nodes joined")
EOF

status=0
srun --nodes=1 --ntasks=1 -w "$head_node" "${container_args[@]}" --overlap \
    "$PYTHON" "$REPO_DIR/recipes/train.py" --config-name "$CONFIG_NAME" \
    runtime.cluster.ray_address="$head_ip:$RAY_PORT" runtime.cluster.num_nodes="${#nodes[@]}" \
    runtime.cluster.gpus_per_node="$gpus_per_node" runtime.output_dir="$HACPO_OUTPUT_DIR" \
    "${overrides[@]}" || status=$?

srun --nodes="${#nodes[@]}" --ntasks-per-node=1 "${container_args[@]}" --overlap ray stop --force >/dev/null 2>&1 || true
echo "[hacpo] driver exited with status $status; outputs in $HACPO_OUTPUT_DIR"
exit $status

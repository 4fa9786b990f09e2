"""Host RAM per node, phase by phase, and what a checkpoint writes and hashes — the host half of `--plan`.

Per GPU of a colocated agent there are two processes (the trainer rank and its engine's vLLM worker), and per
engine one engine-core process. What they hold in host memory, in GiB (`AgentHost`):

    processes    PROCESS_HOST_GIB each (libraries, Python, the CUDA context's host side)
    offload      pinned copies of the optimizer state (`offload_train_state`: Adam m, v and the fp32 main
                 parameters, each tensor's shard rounded up to a power of two by torch's host caching
                 allocator): an arena each rank allocates at its first offload and keeps for the whole run,
                 checkpoints included (`training.memory.TrainStateOffload`: pinning runs at ~2.2 GB/s, so
                 re-pinning after every save would cost each llama70b rank ~14 s per checkpoint)
    reference    pinned copy of the reference weights (`offload_reference`)
    vLLM weights the worker's pinned backup of its weights at the checkpoint's level-1 sleep, kept in its host
                 cache from the first checkpoint on — counted in every phase
    rpc buffers  `rollout.refit_transport: rpc` only: the export's host copy of a tensor and the safetensors
                 chunks the engine sends to each worker
    save         the trainer's checkpoint save (`training.trainer_checkpoint`); the optimizer state is on the
                 GPU for it, and the save empties the host cache before and after writing, so the offload's
                 pinned buffers are not held at the same time:
                 `dp_reshardable`   every rank copies what it writes to pinned memory (torch_dist's writer moves
                                    each tensor with `.to("cpu", non_blocking=True)`, which pins the destination):
                                    its optimizer shard, and on DP rank 0 the weights and the reference
                 `fully_reshardable` (Megatron's memory-efficient gather over gloo onto DP rank 0): DP rank 0
                                    holds the gathered state (12 bytes per parameter of its TP/PP shard) and its
                                    own shard, then the writer's copies of the per-parameter views (12 more);
                                    other ranks only their shard (12/DP)

The worker's CUDA-graph pools are not backed up: they stay on the GPU while it sleeps (`planning.gpu_memory`,
VLLM_GRAPH_POOLS_GIB); its `runtime` pool's backup (the KV cache's bookkeeping) is small and not counted.

Phases per node (the agents' GPUs fill the nodes in order, as their placement groups pack them):
generate = train = processes + offload + reference + vLLM weights; refit = that + rpc buffers;
checkpoint = that + save (the offload arena stays).

A checkpoint's bytes: per parameter its weights (and the reference's) in the training dtype plus 12 bytes of
optimizer state (fp32 main copy, m, v). Hashing them in the driver after the save reads every byte back
through one client of the shared file system; hashing in the writers (each rank its own files, from memory,
in parallel) costs the largest writer's bytes at one core's hash rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nemo_hacpo.config import AgentConfig, HacpoConfig
from nemo_hacpo.models.architecture import ModelArch
from nemo_hacpo.planning.gpu_memory import (
    DTYPE_BYTES,
    GIB,
    pinned_gib,
    serving_tensors,
    stage_tensors,
)

PROCESS_HOST_GIB = 3.0
"""Per process. measured: 0.5 GiB resident after importing torch + megatron-core + transformers (or torch + vLLM
+ transformers) on the CPU machine (`resource.getrusage` maxrss); + the CUDA libraries' and context's host
memory (cuBLAS, cuDNN, NCCL, Transformer Engine map hundreds of MB each) — an estimate, 2.5 GiB."""

BLAKE3_GBPS_PER_CORE = 1.0
"""measured (`benchmarks/hash_rate.py`, 256 MiB in memory): blake3 1.0.11 on one thread of this machine's AMD
EPYC (AVX-512) reaches 5.7 GB/s at best and 0.7–1.1 GB/s while the shared machine is loaded (sha256: 1.7 GB/s at
best). The plan takes 1.0: a writer hashes while the other 15 processes of its node write and hash too."""

SHARED_FS_READ_GBPS = 2.0
"""Assumption: one client's sequential read from the shared file system (a parallel file system gives one
client about 2–5 GB/s, NFS about 1): the driver hashing every checkpoint file reads at this rate."""

PIN_GBPS = 2.2
"""measured on a GPU (H200 host, torch 2.11): allocating pinned host memory runs at ~2.2 GB/s (1 GiB in 0.46 s,
8 GiB in 3.73 s), so a trainer's first `offload()` of 41.5 GiB took 21.9 s and the second, into the same blocks,
0.62 s (72 GB/s, as the restore). The plan prints the first offload's time: once per run, since the arena is kept."""

SHARED_FS_WRITE_GBPS = 1.0
"""Assumption: one client's sequential write to the shared file system (the export's single writer per agent)."""

OPTIMIZER_STATE_BYTES = 12
"""Bytes per parameter of the distributed optimizer's saved state: the fp32 main copy, Adam's m and v (Megatron's
`get_parameter_state_dp_zero` gathers these three keys)."""


@dataclass(frozen=True)
class AgentHost:
    """Host GiB of one agent's GPU slot (trainer rank + vLLM worker) by kind; `save_dp0` / `save_other` are the
    save's transient on a DP-rank-0 rank and on any other rank."""

    processes: float
    offload: float
    reference: float
    vllm_weights: float
    rpc_buffers: float
    save_dp0: float
    save_other: float
    dp: int

    @property
    def steady(self) -> float:
        """Generate and train: what every slot holds between checkpoints."""
        return self.processes + self.offload + self.reference + self.vllm_weights

    @property
    def first_offload_s(self) -> float:
        """Seconds of the rank's first `offload()`: pinning its arena at PIN_GBPS (later offloads reuse it)."""
        return self.offload * GIB / (PIN_GBPS * 1e9)


def agent_host(agent: AgentConfig, arch: ModelArch, cfg: HacpoConfig) -> AgentHost:
    """The host GiB of one GPU slot of `agent` (see the module docstring)."""
    par, roll = agent.parallel, agent.rollout
    dtype_bytes = DTYPE_BYTES[agent.precision.dtype]
    tensors = stage_tensors(arch, par.tp, par.pp)
    params = sum(tensors)
    distributed = agent.optimizer.use_distributed_optimizer
    shards = par.dp if distributed else 1
    state_copies = 3 if agent.precision.dtype != "fp32" else 2  # fp32 training has no separate main copy
    keeps_reference = cfg.algo.kl_coef > 0
    colocated = roll.colocated and cfg.runtime.cluster.device == "cuda"
    vllm_tp = roll.tensor_parallel_size

    processes = PROCESS_HOST_GIB * (1 + (1 + 1 / vllm_tp if colocated else 0))  # trainer, worker, engine core
    offload = pinned_gib(tensors, 4, copies=state_copies, shards=shards) if agent.offload_train_state else 0.0
    reference = pinned_gib(tensors, dtype_bytes) if keeps_reference and agent.offload_reference else 0.0
    vllm_weights = pinned_gib(serving_tensors(arch, vllm_tp), 2) if colocated else 0.0
    rpc = 0.0
    if roll.refit_transport == "rpc":
        bucket = roll.refit_bucket_mb / 1024
        rpc = max(tensors) * par.tp * dtype_bytes / GIB + bucket * (2 / vllm_tp + 1)

    weights_pinned = pinned_gib(tensors, dtype_bytes) * (1 + keeps_reference)
    if not distributed or agent.optimizer.checkpoint_format == "dp_reshardable":
        own_state = pinned_gib(tensors, 4, copies=state_copies, shards=shards)
        save_dp0 = own_state + weights_pinned
        save_other = own_state if distributed else 0.0
    else:  # fully_reshardable, gathered over gloo onto DP rank 0
        state = params * OPTIMIZER_STATE_BYTES / GIB
        own = state / par.dp
        gathering = state + own + 2 * params * 4 / GIB  # world tensors, own shard, one key's received list + cat
        writing = 2 * state + weights_pinned  # world tensors + the writer's copies of their views
        save_dp0 = max(gathering, writing)
        save_other = own
    return AgentHost(processes, offload, reference, vllm_weights, rpc, save_dp0, save_other, par.dp)


@dataclass(frozen=True)
class NodeHost:
    """One node: which agents' slots it holds and its host GiB per phase."""

    index: int
    slots: tuple[tuple[str, int], ...]
    generate: float
    refit: float
    checkpoint: float


def node_slots(cfg: HacpoConfig) -> list[list[tuple[int, int]]]:
    """Per node, (agent index, GPUs of that agent on the node): the agents' GPUs fill the nodes in order."""
    cluster = cfg.runtime.cluster
    per_node = max(1, cluster.gpus_per_node)
    nodes: list[list[tuple[int, int]]] = [[] for _ in range(cluster.num_nodes)]
    gpu = 0
    for i, agent in enumerate(cfg.agents):
        need = agent.parallel.world_size + (0 if agent.rollout.colocated else agent.rollout.tensor_parallel_size)
        while need > 0 and gpu // per_node < len(nodes):
            take = min(need, per_node - gpu % per_node)
            nodes[gpu // per_node].append((i, take))
            gpu, need = gpu + take, need - take
    return nodes


def node_hosts(hosts: list[AgentHost], cfg: HacpoConfig) -> list[NodeHost]:
    """Host GiB per node and phase, from each agent's per-slot figures (`agent_host`)."""
    out = []
    for index, slots in enumerate(node_slots(cfg)):
        generate = refit = checkpoint = 0.0
        for agent_index, count in slots:
            host = hosts[agent_index]
            dp0 = min(count, math.ceil(count / host.dp))  # DP rank 0 of each TP/PP group on the node
            generate += count * host.steady
            refit += count * (host.steady + host.rpc_buffers)
            checkpoint += count * host.steady + dp0 * host.save_dp0 + (count - dp0) * host.save_other
        out.append(NodeHost(index, tuple((cfg.agents[a].name, c) for a, c in slots), generate, refit, checkpoint))
    return out


@dataclass(frozen=True)
class CheckpointIO:
    """What one checkpoint of the run writes, and the time to hash it either way."""

    total_bytes: float
    largest_writer_bytes: float
    driver_serial_s: float
    per_writer_s: float


def checkpoint_io(agents: list[tuple[AgentConfig, ModelArch]], cfg: HacpoConfig, total_parameters: list[int],
                  ) -> CheckpointIO:
    """Bytes of a checkpoint of every agent, and its hashing time: in the driver after the save (one client reads
    every byte back: total / min(SHARED_FS_READ_GBPS, BLAKE3_GBPS_PER_CORE · 8 threads)) or in the writers
    (each rank its own bytes, in parallel: the largest writer's bytes / BLAKE3_GBPS_PER_CORE)."""
    total = largest = 0.0
    keeps_reference = cfg.algo.kl_coef > 0
    for (agent, arch), parameters in zip(agents, total_parameters, strict=True):
        par, dtype_bytes = agent.parallel, DTYPE_BYTES[agent.precision.dtype]
        per_param = dtype_bytes * (1 + keeps_reference) + OPTIMIZER_STATE_BYTES
        total += parameters * per_param
        shard = sum(stage_tensors(arch, par.tp, par.pp))
        if agent.optimizer.use_distributed_optimizer and agent.optimizer.checkpoint_format == "dp_reshardable":
            writer = shard * (dtype_bytes * (1 + keeps_reference) + OPTIMIZER_STATE_BYTES / par.dp)
        else:  # DP rank 0 writes its TP/PP shard's weights and whole optimizer state
            writer = shard * per_param
        largest = max(largest, writer)
    read_rate = min(SHARED_FS_READ_GBPS, 8 * BLAKE3_GBPS_PER_CORE) * 1e9
    return CheckpointIO(total, largest, total / read_rate, largest / (BLAKE3_GBPS_PER_CORE * 1e9))


@dataclass(frozen=True)
class EngineStartIO:
    """What starting the agents' engines moves through the shared file system, per start (a requeue included)."""

    export_written_bytes: float
    """The former start (before issue #40): every agent's whole model exported as an HF checkpoint."""
    export_read_bytes: float
    """… and read back by every engine."""
    export_s: float
    """… its time: the agents in parallel, each its writer's bytes then one engine's read (the engines of an agent
    read at once, one client each)."""
    fresh_read_bytes: float
    """A fresh run now: every engine reads its agent's own HF checkpoint; nothing is written."""
    fresh_s: float


def engine_start_io(agents: list[tuple[AgentConfig, ModelArch]], total_parameters: list[int]) -> EngineStartIO:
    """The engines' start, from the checkpoints' sizes (bf16 serving weights, 2 bytes per parameter):
    export = bytes / SHARED_FS_WRITE_GBPS + bytes / SHARED_FS_READ_GBPS per agent, the slowest agent's; fresh =
    bytes / SHARED_FS_READ_GBPS; a resume reads and writes nothing (placeholder weights, then a refit in memory)."""
    written = read = fresh_read = 0.0
    export_s = fresh_s = 0.0
    for (agent, _), parameters in zip(agents, total_parameters, strict=True):
        checkpoint = 2.0 * parameters
        engines = agent.parallel.world_size // agent.rollout.tensor_parallel_size if agent.rollout.colocated else 1
        written += checkpoint
        read += engines * checkpoint
        fresh_read += engines * checkpoint
        export_s = max(export_s, checkpoint / (SHARED_FS_WRITE_GBPS * 1e9) + checkpoint / (SHARED_FS_READ_GBPS * 1e9))
        fresh_s = max(fresh_s, checkpoint / (SHARED_FS_READ_GBPS * 1e9))
    return EngineStartIO(written, read, export_s, fresh_read, fresh_s)

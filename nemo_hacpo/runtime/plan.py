"""The `--plan` dry run: per agent, GPUs, layout and an estimate of memory per GPU; refuse what cannot fit.

Estimates (bytes per GPU of the busiest pipeline stage; P_s = that stage's parameters / TP):

    weights      P_s · bytes(dtype)                       (1 byte with fp8_param)
    gradients    P_s · 4                                  (fp32 main-grad buffers)
    optimizer    P_s · (8 + 4·[dtype ≠ fp32]) / DP_opt    (Adam m, v and fp32 master copy; DP_opt = DP with the
                                                           distributed optimizer, else 1)
    activations  L · s · b · h · k · bytes/2               (Korthikanti et al. 2022, flash attention, no
                 k = 34/TP with sequence parallel,          recompute; 1F1B keeps ~L layers' worth on stage 0)
                 10 + 24/TP without
    logits       s · b · V / TP · 4 · 3                   (fp32 logits + log-softmax + grad, last stage)
    reference    P_s · bytes(dtype)                       (β > 0 without `offload_reference`: a frozen copy)
    vLLM         gpu_memory_utilization · GPU memory      (its weights + KV cache, while it generates)

Phases (a colocated engine sleeps while its GPUs train; `training.memory` describes the order):

    train        weights + gradients + optimizer + activations + logits + reference     (engine asleep)
    generate     resident + vLLM                 resident = weights + reference, + gradients + optimizer
                                                 unless `offload_train_state` moves them to the host
    refit        resident + vLLM weights + buffers   (KV cache still asleep; buffers: the export's gathered
                                                 full HF tensor, + with `ipc` the sender's staging bucket and
                                                 the engine worker's copy of it on the same GPU, each ≤ the
                                                 larger of rollout.refit_bucket_mb and the largest tensor)
    checkpoint   weights + gradients + optimizer + reference + gather   (engine asleep; the distributed
                                                 optimizer's `fully_reshardable` save gathers each state key of
                                                 the stage, un-sharded, on every DP rank: P_s · 4 bytes, plus
                                                 its own shard's copy P_s · 4 / DP)

The KV cache left to vLLM after its weights must hold at least one max-length sequence. These are
estimates for planning, not guarantees: CUDA context, NCCL buffers and fragmentation take a few GB more
(a 10 % margin is kept).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nemo_hacpo.config import AgentConfig, HacpoConfig
from nemo_hacpo.models.architecture import ModelArch
from nemo_hacpo.models.hf_layouts import hf_tensor_shapes
from nemo_hacpo.rollout.refit import MIB, refit_plan

GIB = 1024**3
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
MARGIN = 0.9  # usable fraction of a GPU's memory


def parameter_counts(arch: ModelArch, tp: int = 1) -> tuple[int, int, int]:
    """(embedding, one transformer layer, output layer) parameter counts, with the padded vocabulary."""
    h, d, f = arch.hidden_size, arch.head_dim, arch.ffn_hidden_size
    vocab = arch.padded_vocab_size(tp)
    q, kv = arch.num_attention_heads * d, arch.num_query_groups * d
    attention = h * (q + 2 * kv) + q * h
    if arch.add_bias_linear:
        attention += q + 2 * kv + h
    elif arch.add_qkv_bias:
        attention += q + 2 * kv
    mlp = h * f * (2 if arch.activation == "swiglu" else 1) + f * h
    if arch.add_bias_linear:
        mlp += f * (2 if arch.activation == "swiglu" else 1) + h
    norms = (2 if arch.normalization == "LayerNorm" else 1) * 2 * h + (2 * d if arch.qk_layernorm else 0)
    embedding = vocab * h + (arch.max_position_embeddings * h if arch.position_embedding == "learned_absolute" else 0)
    output = 0 if arch.tie_embeddings else vocab * h
    return embedding, attention + mlp + norms, output


def total_parameters(arch: ModelArch) -> int:
    embedding, layer, output = parameter_counts(arch)
    final_norm = (2 if arch.normalization == "LayerNorm" else 1) * arch.hidden_size
    return embedding + arch.num_layers * layer + output + final_norm


@dataclass(frozen=True)
class AgentPlan:
    """Memory per GPU (GiB) of one agent's busiest rank, phase by phase (train, generate, refit, checkpoint)."""

    name: str
    gpus: int
    layout: str
    parameters: int
    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    reference: float
    train_total: float
    vllm_budget: float
    vllm_weights: float
    kv_cache_sequences: float
    generate_total: float
    refit_buffers: float
    refit_total: float
    checkpoint_gather: float
    checkpoint_total: float
    gpu_memory: float
    problems: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def peak(self) -> float:
        """The largest phase (GiB per GPU)."""
        return max(self.train_total, self.generate_total, self.refit_total, self.checkpoint_total)


def plan_agent(agent: AgentConfig, arch: ModelArch, cfg: HacpoConfig) -> AgentPlan:
    par, prec, roll = agent.parallel, agent.precision, agent.rollout
    cluster = cfg.runtime.cluster
    embedding, layer, output = parameter_counts(arch, par.tp)
    layers_per_stage = -(-arch.num_layers // par.pp)
    # busiest stage: its layers plus the embedding (stage 0) or the output layer (last stage)
    stage_params = (layers_per_stage * layer + max(embedding, output if par.pp > 1 else embedding + output)) / par.tp
    dtype_bytes = BYTES[prec.dtype]
    weight_bytes = 1 if prec.fp8_param else dtype_bytes
    opt_shards = par.dp if agent.optimizer.use_distributed_optimizer else 1
    seq, mbs = agent.max_prompt_length + agent.max_response_length, par.micro_batch_size

    weights = stage_params * weight_bytes / GIB
    gradients = stage_params * 4 / GIB
    optimizer = stage_params * (8 + (4 if prec.dtype != "fp32" else 0)) / opt_shards / GIB
    per_element = 34 / par.tp if par.sequence_parallel else 10 + 24 / par.tp
    activations = arch.num_layers * seq * mbs * arch.hidden_size * per_element * dtype_bytes / 2 / GIB
    logits = seq * mbs * arch.padded_vocab_size(par.tp) / par.tp * 4 * 3 / GIB
    reference = weights if cfg.algo.kl_coef > 0 and not agent.offload_reference else 0.0
    train_total = weights + gradients + optimizer + activations + logits + reference
    train_state = 0.0 if agent.offload_train_state else gradients + optimizer
    resident = weights + reference + train_state  # what the trainer keeps on the GPU while the engine works

    gpu_memory = cluster.gpu_memory_gib if cluster.device == "cuda" else float("inf")
    vllm_budget = roll.gpu_memory_utilization * gpu_memory if cluster.device == "cuda" else float(roll.cpu_kvcache_gib)
    vllm_weights = total_parameters(arch) * 2 / roll.tensor_parallel_size / GIB  # bf16 serving weights
    kv_per_token = 2 * arch.num_layers * arch.num_query_groups * arch.head_dim * 2 / roll.tensor_parallel_size
    kv_space = vllm_budget - (vllm_weights if cluster.device == "cuda" else 0.0)
    kv_sequences = kv_space * GIB / (kv_per_token * seq)
    on_gpu = cluster.device == "cuda"
    generate_total = (resident if roll.colocated else 0.0) + (vllm_budget if on_gpu else 0.0)

    shapes = hf_tensor_shapes(arch)
    largest = max(math.prod(shape) for shape in shapes.values()) * dtype_bytes / GIB
    refit_buffers = largest  # the export's gathered tensor
    if roll.refit_transport == "ipc":
        staged = refit_plan(shapes, dtype_bytes, bound=roll.refit_bucket_mb * MIB, world=par.world_size,
                            engine_tp=roll.tensor_parallel_size, device=cluster.device, transport="ipc")
        # + the sender's staging buffer, + the worker's copy of a bucket until its layers are loaded
        refit_buffers += (staged.buffer_bytes + staged.peak_bytes) / GIB
    refit_total = (resident if roll.colocated else 0.0) + (vllm_weights if on_gpu else 0.0) + refit_buffers
    gather = stage_params * 4 * (1 + 1 / opt_shards) / GIB if agent.optimizer.use_distributed_optimizer else 0.0
    checkpoint_total = weights + gradients + optimizer + reference + gather

    problems = []
    limit = MARGIN * gpu_memory
    if train_total > limit:
        problems.append(f"training needs ~{train_total:.1f} GiB per GPU > {MARGIN:.0%} of {gpu_memory:.0f} GiB: "
                        "raise tp/pp, use the distributed optimizer, or shrink micro_batch_size")
    if on_gpu and generate_total > limit:
        problems.append(f"generation needs ~{generate_total:.1f} GiB per GPU (the trainer's resident state "
                        f"{resident:.1f} + vLLM's budget) > {MARGIN:.0%} of {gpu_memory:.0f} GiB: lower "
                        "rollout.gpu_memory_utilization or set offload_train_state: true")
    if on_gpu and refit_total > limit:
        problems.append(f"the refit needs ~{refit_total:.1f} GiB per GPU (resident {resident:.1f} + vLLM weights "
                        f"{vllm_weights:.1f} + buffers {refit_buffers:.1f}) > {MARGIN:.0%} of {gpu_memory:.0f} GiB: "
                        "lower rollout.refit_bucket_mb or set offload_train_state: true")
    if on_gpu and checkpoint_total > limit:
        problems.append(f"saving a checkpoint needs ~{checkpoint_total:.1f} GiB per GPU (the optimizer's gather "
                        f"{gather:.1f}) > {MARGIN:.0%} of {gpu_memory:.0f} GiB: raise tp/pp")
    if kv_sequences < 1:
        problems.append(f"vLLM's KV cache ({kv_space:.1f} GiB after weights) cannot hold one {seq}-token sequence: "
                        "raise rollout.gpu_memory_utilization or rollout.tensor_parallel_size")
    layout = f"tp={par.tp} pp={par.pp} cp={par.cp} dp={par.dp}; vLLM tp={roll.tensor_parallel_size}" + (
        " colocated" if roll.colocated else " separate")
    gpus = par.world_size + (0 if roll.colocated else roll.tensor_parallel_size)
    return AgentPlan(agent.name, gpus, layout, total_parameters(arch), weights, gradients, optimizer, activations,
                     logits, reference, train_total, vllm_budget, vllm_weights, kv_sequences, generate_total,
                     refit_buffers, refit_total, gather, checkpoint_total, gpu_memory, tuple(problems))



def format_plan(plans: list[AgentPlan], cfg: HacpoConfig) -> str:
    """Two tables: what each agent's busiest GPU holds (GiB), and its total in each phase."""
    cluster = cfg.runtime.cluster
    cuda = cluster.device == "cuda"
    lines = [f"plan: {len(plans)} agents, algo={cfg.algo.name}, device={cluster.device}"
             + (f", {cluster.num_nodes} node(s) × {cluster.gpus_per_node} GPU(s) × {cluster.gpu_memory_gib:.0f} GiB"
                if cuda else ""),
             f"| agent | params | {'GPUs' if cuda else 'ranks'} | layout | weights | grads | optim | activ | logits | "
             "ref | vLLM | KV seqs | refit buffers | ckpt gather |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in plans:
        size = f"{p.parameters / 1e9:.2f}B" if p.parameters >= 1e9 else f"{p.parameters / 1e6:.2f}M"
        lines.append(f"| {p.name} | {size} | {p.gpus} | {p.layout} | {p.weights:.1f} | {p.gradients:.1f} | "
                     f"{p.optimizer:.1f} | {p.activations:.1f} | {p.logits:.1f} | {p.reference:.1f} | "
                     f"{p.vllm_budget:.1f} | {p.kv_cache_sequences:,.0f} | {p.refit_buffers:.2f} | "
                     f"{p.checkpoint_gather:.1f} |")
    limit = f"{MARGIN * plans[0].gpu_memory:.0f}" if cuda and plans else "—"
    lines += ["", f"| agent | train | generate | refit | checkpoint | peak GiB/GPU (limit {limit}) | fits |",
              "|---|---|---|---|---|---|---|"]
    for p in plans:
        lines.append(f"| {p.name} | {p.train_total:.1f} | {p.generate_total:.1f} | {p.refit_total:.1f} | "
                     f"{p.checkpoint_total:.1f} | {p.peak:.1f} | {'yes' if p.fits else 'NO'} |")
    if cuda:
        used, have = sum(p.gpus for p in plans), cluster.num_nodes * cluster.gpus_per_node
        lines.append(f"GPUs: {used} of {have} used")
    for p in plans:
        lines.extend(f"  ✗ {p.name}: {problem}" for problem in p.problems)
    return "\n".join(lines)

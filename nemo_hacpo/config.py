"""The typed, validated configuration of a nemo_hacpo run.

Hydra composes the YAML files under `conf/`; `validate(cfg)` turns the composed result into the frozen
dataclasses below and checks every rule that can be checked before a process starts. Any problem —
unknown key, wrong type, impossible combination — raises one `ConfigError` that lists each offending key
with the fix. Every field carries a docstring (`describe()` prints them).

    cfg = load_config("pair_tiny", ["algo=gspo", "agents.0.optimizer.lr=1e-4"])
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

from nemo_hacpo._typed import ConfigError, ConfigIssue, field_docs, from_plain

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
ALGORITHMS = ("hacpo", "gspo", "gspo_x2", "grpo", "naive")
SHARING_ALGORITHMS = ("hacpo", "naive")


# --------------------------------------------------------------------------------------------- agents
@dataclass(frozen=True)
class TinyModelSpec:
    """A small GPT built from scratch (tests and `pair_tiny`)."""

    num_layers: int = 2
    """Transformer layers."""
    hidden_size: int = 128
    """Model width."""
    num_attention_heads: int = 2
    """Query heads. vLLM's CPU kernels need head_dim = hidden_size / heads = 64 (or 128)."""
    num_query_groups: int | None = None
    """KV heads (GQA); null = one per attention head (plain MHA)."""
    ffn_hidden_size: int = 512
    """MLP inner width (per branch for SwiGLU)."""
    normalization: Literal["RMSNorm", "LayerNorm"] = "RMSNorm"
    """Normalisation layer."""
    activation: Literal["swiglu", "gelu"] = "swiglu"
    """MLP activation: SwiGLU (gated SiLU) or GELU."""
    position_embedding: Literal["rope", "learned_absolute"] = "rope"
    """Position encoding: rotary or learned absolute."""
    rotary_base: int = 10000
    """RoPE base (ignored for learned positions)."""
    tie_embeddings: bool = False
    """Share the input embedding with the output layer."""
    qk_layernorm: bool = False
    """Normalise queries and keys per head (Qwen3-style)."""
    max_position_embeddings: int = 512
    """Longest sequence (prompt + response) the model accepts."""
    init_std: float = 0.02
    """Std of the normal initialisation."""


@dataclass(frozen=True)
class ModelSource:
    """Where an agent's weights and architecture come from."""

    source: Literal["tiny", "hf", "recipe"] = "tiny"
    """`tiny`: built-in spec below; `hf`: local Hugging Face checkpoint (`path`); `recipe`: NeMo-framework recipe."""
    path: str | None = None
    """Local HF checkpoint directory (config.json + safetensors) for `source: hf`. Never downloaded."""
    recipe: str | None = None
    """Megatron-Bridge / NeMo 2 recipe name for `source: recipe` (needs that library installed)."""
    tiny: TinyModelSpec = field(default_factory=TinyModelSpec)
    """Architecture for `source: tiny`."""


@dataclass(frozen=True)
class TokenizerConfig:
    """The agent's own tokenizer and chat template."""

    source: str = "tiny-bpe"
    """`tiny-bpe`, `tiny-unigram` (built and cached locally), `qwen3`, `gpt2` (shipped by pip packages), a local
    directory, or null-equivalent `model` to use the HF checkpoint's own tokenizer."""
    chat_template: str | None = None
    """Jinja chat template overriding the tokenizer's own; null keeps the tokenizer's."""


@dataclass(frozen=True)
class ParallelConfig:
    """Megatron-core layout of one agent's trainer. World size = tp · pp · cp · dp ranks (GPUs)."""

    tp: int = 1
    """Tensor-parallel size; must divide attention heads and KV heads."""
    pp: int = 1
    """Pipeline-parallel size; must divide the number of layers."""
    cp: int = 1
    """Context-parallel size (only 1 is supported so far)."""
    dp: int = 1
    """Data-parallel size."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (needs tp > 1; GPU only)."""
    micro_batch_size: int = 1
    """Sequences per micro-batch in forward/backward."""
    sequence_packing: bool = False
    """Padding-free micro-batches: each micro-batch's rows run as one packed (THD) sequence with cu_seqlens
    (Transformer Engine attention on GPU, a per-row local attention on CPU); a token budget counts real tokens."""

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp


@dataclass(frozen=True)
class RolloutConfig:
    """The agent's vLLM engine and sampling parameters."""

    tensor_parallel_size: int = 1
    """vLLM tensor-parallel size."""
    colocated: bool = True
    """Share the trainer's GPUs (sleep/wake between phases) instead of owning separate ones."""
    gpu_memory_utilization: float = 0.5
    """Fraction of GPU memory vLLM may take (on CPU: scaled by the KV-cache size below)."""
    cpu_kvcache_gib: int = 1
    """KV-cache size on CPU (VLLM_CPU_KVCACHE_SPACE, GiB)."""
    enforce_eager: bool = False
    """Disable CUDA graphs."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = -1
    """Top-k sampling (-1 = off)."""
    seed: int | None = None
    """Engine seed; null = derived from runtime.seed and the agent index."""


@dataclass(frozen=True)
class OptimizerConfig:
    """Megatron optimizer and LR schedule for one agent."""

    name: Literal["adam", "sgd"] = "adam"
    """Optimizer (Megatron's AdamW when weight_decay > 0)."""
    lr: float = 1e-6
    """Peak learning rate."""
    min_lr: float = 0.0
    """Floor of the LR schedule."""
    weight_decay: float = 0.01
    """Decoupled weight decay."""
    adam_beta1: float = 0.9
    """Adam β1."""
    adam_beta2: float = 0.999
    """Adam β2."""
    adam_eps: float = 1e-8
    """Adam ε."""
    clip_grad: float = 1.0
    """Global grad-norm clip (0 = off)."""
    lr_warmup_steps: int = 0
    """Linear warm-up, in optimizer updates."""
    lr_decay_style: Literal["constant", "linear", "cosine"] = "constant"
    """Schedule after warm-up."""
    use_distributed_optimizer: bool = True
    """Shard optimizer state over DP ranks (Megatron distributed optimizer)."""


@dataclass(frozen=True)
class PrecisionConfig:
    """Numerics of one agent's trainer, mapped onto Megatron's TransformerConfig."""

    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Parameter/compute dtype (fp32 on CPU)."""
    fp8: Literal["e4m3", "hybrid"] | None = None
    """FP8 format through Transformer Engine (GPU only); null = off."""
    fp8_recipe: Literal["delayed", "tensorwise", "blockwise", "mxfp8"] = "blockwise"
    """FP8 scaling recipe (blockwise on Hopper, mxfp8 on Blackwell)."""
    fp8_param: bool = False
    """Keep parameters in FP8 (saves memory; needs the distributed optimizer)."""
    first_last_layers_bf16: bool = True
    """Run the first and last transformer layers in BF16 when FP8 is on."""
    num_layers_at_start_in_bf16: int = 1
    """Layers kept in BF16 at the start (with first_last_layers_bf16)."""
    num_layers_at_end_in_bf16: int = 1
    """Layers kept in BF16 at the end (with first_last_layers_bf16)."""


@dataclass(frozen=True)
class AgentConfig:
    """One trainable policy: its model, tokenizer, layout, rollout engine and optimizer."""

    name: str
    """Unique name (used in logs, checkpoints and metrics)."""
    model: ModelSource = field(default_factory=ModelSource)
    """Weights/architecture source."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """Tokenizer and chat template."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Megatron layout of the trainer."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """vLLM engine and sampling."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizer and LR schedule."""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """Dtype and FP8."""
    offload_reference: bool = False
    """Keep the reference model (β > 0 only) in pinned host memory between its forwards; it is copied to the
    device for each no-grad reference pass and released after. Saves one copy of the weights on the GPU."""
    max_prompt_length: int = 256
    """Prompt tokens (after the chat template); longer prompts are an error in the data."""
    max_response_length: int = 256
    """Generated tokens per response; also the truncation length for re-encoded cross samples."""


# ----------------------------------------------------------------------------------------------- algo
@dataclass(frozen=True)
class AblationConfig:
    """HACPO ablation switches (spec/hacpo.md, "Baselines"). All true = full HACPO."""

    capability_baseline: bool = True
    """Use ω in the learner's baseline (false = the "−adv" ablation: ω = 1 in the baseline only)."""
    gradient_modulation: bool = True
    """Multiply cross-sample advantages by ω (false = the "−ω" ablation)."""
    cross_clip: bool = True
    """Clip cross-sample ratios to [lo_u, 1] (false = no cross clip)."""


@dataclass(frozen=True)
class AlgoConfig:
    """The RL algorithm and every hyper-parameter of spec/hacpo.md, with its defaults."""

    name: Literal["hacpo", "gspo", "gspo_x2", "grpo", "naive"] = "hacpo"
    """hacpo | gspo (alone) | gspo_x2 (alone, 2G samples) | grpo (alone, token PPO) | naive (plain sharing)."""
    batch_size: int = 128
    """B: prompts per step."""
    group_size: int = 8
    """G: responses per prompt per agent (gspo_x2 generates 2G)."""
    updates_per_step: int = 4
    """M: optimizer updates per step over the learner's training view (one pass, in order)."""
    capability_window: int = 5
    """K: steps averaged into the capability estimate P̂ (current step included)."""
    ratio_min: float = 0.1
    """Lower clip of ω(j→k)."""
    ratio_max: float = 10.0
    """Upper clip of ω(j→k)."""
    capability_floor: float = 1e-8
    """Floor of P̂ (avoids dividing by zero)."""
    capability_warmup_steps: int = 0
    """W: steps with ω = 1."""
    alpha: float = 1.0
    """Exponential importance-sampling power on cross samples (α ≥ 0)."""
    delta: float = 0.2
    """Cross-sample clip lower bound starts at 1 − δ; δ ∈ (0, 1)."""
    delta_step: float = 0.025
    """Rise of the lower bound per update index u (0 = static clip)."""
    eps_low: float = 3e-4
    """GSPO clip ε_low on self samples."""
    eps_high: float = 4e-4
    """GSPO clip ε_high on self samples."""
    grpo_eps_low: float = 0.2
    """Token-level PPO clip ε_low (grpo)."""
    grpo_eps_high: float = 0.28
    """Token-level PPO clip ε_high (grpo)."""
    grpo_loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = "token-mean"
    """Loss aggregation of the grpo baseline."""
    kl_coef: float = 0.001
    """β of the low-variance KL to the reference model on self samples (0 = no reference model)."""
    adv_eps: float = 1e-6
    """ε added to the std in the advantage."""
    max_abs_log_ratio: float = 10.0
    """Clamp of |log s| before exponentiating."""
    ablation: AblationConfig = field(default_factory=AblationConfig)
    """Ablation switches."""

    @property
    def shares_rollouts(self) -> bool:
        return self.name in SHARING_ALGORITHMS

    @property
    def samples_per_prompt(self) -> int:
        """Responses each agent generates per prompt (2G for gspo_x2)."""
        return 2 * self.group_size if self.name == "gspo_x2" else self.group_size

    def sequences_per_learner(self, num_agents: int) -> int:
        """Training sequences per learner per step: n·B·G when sharing, B·G (or B·2G) alone."""
        groups = num_agents if self.shares_rollouts else 1
        return groups * self.batch_size * self.samples_per_prompt


# ------------------------------------------------------------------------------------ data and reward
@dataclass(frozen=True)
class DatasetConfig:
    """One prompt source."""

    source: Literal["arithmetic", "jsonl", "parquet", "gsm8k", "aime2025"] = "arithmetic"
    """Generated arithmetic, a local JSONL/parquet file, or a benchmark shipped by the `eval` extra."""
    path: str | None = None
    """Local file for jsonl/parquet."""
    question_field: str = "question"
    """Field holding the question."""
    answer_field: str = "answer"
    """Field holding the gold answer."""
    size: int = 2000
    """Problems to generate (arithmetic)."""
    seed: int = 0
    """Generator seed (arithmetic; train and eval splits are disjoint by construction)."""
    levels: tuple[int, ...] = (1, 2, 3)
    """Difficulty levels (number of operations) to generate."""
    limit: int | None = None
    """Use at most this many problems (null = all)."""


@dataclass(frozen=True)
class DataConfig:
    """Training and held-out prompts."""

    train: DatasetConfig = field(default_factory=DatasetConfig)
    """Training prompts."""
    eval: DatasetConfig = field(default_factory=lambda: DatasetConfig(size=200, seed=1))
    """Held-out prompts."""
    system_prompt: str | None = None
    """Optional system message prepended to every prompt."""
    shuffle_seed: int = 0
    """Seed of the per-epoch prompt order."""


@dataclass(frozen=True)
class RewardConfig:
    """Math answer verification."""

    strict: bool = True
    """Only the last \\boxed{} answer counts (training default); false = lenient extraction."""
    timeout_s: float = 5.0
    """Per-answer time limit; a timeout scores 0."""
    num_workers: int = 2
    """Scoring processes (0 = in the driver)."""
    max_response_chars: int = 16384
    """Longer responses are truncated (keeping the end) before parsing."""


@dataclass(frozen=True)
class WarmStartConfig:
    """Supervised warm start of tiny agents on generated worked solutions (random models earn no reward)."""

    enabled: bool = False
    """Run it (for agents with `model.source: tiny`) when its cached checkpoint is missing."""
    steps: int = 300
    """Optimizer steps per agent."""
    batch_size: int = 32
    """Solutions per step."""
    lr: float = 1e-3
    """Learning rate of the warm start (replaces the agent's RL learning rate)."""
    num_problems: int = 4000
    """Generated training problems with worked solutions to draw from."""
    seed: int = 0
    """Problem generation and sampling seed."""
    cache_dir: str = "~/.cache/nemo_hacpo/warmstart"
    """Where warm-started HF checkpoints are kept, keyed by a hash of everything that shapes them."""
    progress_interval: int = 25
    """Print a progress line (NLL, rate, ETA) every this many steps."""


# -------------------------------------------------------------------------------------------- runtime
@dataclass(frozen=True)
class ClusterConfig:
    """Resources the job may use."""

    device: Literal["cpu", "cuda"] = "cpu"
    """Where trainers and engines run."""
    num_nodes: int = 1
    """Nodes in the allocation."""
    gpus_per_node: int = 0
    """GPUs per node (0 on CPU)."""
    gpu_memory_gib: float = 80.0
    """Memory of one GPU (H100 80 GB: 80; H200: 141), for the plan's fit check."""
    ray_address: str | None = None
    """Existing Ray cluster to join (`auto` under Slurm); null starts a local one."""


@dataclass(frozen=True)
class RuntimeConfig:
    """The run: steps, seed, checkpoints, logging, cluster."""

    steps: int = 10
    """Training steps."""
    seed: int = 0
    """Global seed."""
    output_dir: str = "outputs/run"
    """Metrics, rollouts, plots and checkpoints go under this directory."""
    checkpoint_interval: int = 0
    """Save every this many steps (0 = only at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk."""
    resume: bool = True
    """Continue from the newest checkpoint in output_dir when there is one."""
    eval_interval: int = 0
    """Evaluate on data.eval every this many steps (0 = only at start and end)."""
    eval_samples: int = 0
    """Also sample this many responses per eval problem (at the rollout temperature) for avg@k and pass@k
    (0 = greedy avg@1 only)."""
    logging: tuple[Literal["console", "jsonl", "tensorboard", "wandb"], ...] = ("console", "jsonl")
    """Metric sinks (`wandb` needs the `wandb` package and `wandb_project`)."""
    wandb_project: str | None = None
    """Weights & Biases project (with `wandb` in `logging`)."""
    wandb_run_name: str | None = None
    """Weights & Biases run name (default: the output directory's name)."""
    save_rollouts: bool = True
    """Write every step's trajectories as JSONL."""
    save_hf: bool = True
    """At the end, export every agent as an HF checkpoint to `<output_dir>/hf/<agent>` (for vLLM,
    `recipes/evaluate.py`, transformers)."""
    collective_timeout_s: float = 1800.0
    """torch.distributed timeout inside an agent's world: a hung rank fails its collectives after this."""
    call_timeout_s: float = 3600.0
    """Longest the driver waits for one worker call (generate, train, save, ...) before stopping the job
    with the agent and rank named."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Resources."""


@dataclass(frozen=True)
class HacpoConfig:
    """A whole run."""

    agents: tuple[AgentConfig, ...]
    """The agents (≥ 2 for sharing algorithms)."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Algorithm."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Verifier."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """Run control."""
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)
    """Supervised warm start of tiny agents."""

    def agent(self, name: str) -> AgentConfig:
        for agent in self.agents:
            if agent.name == name:
                return agent
        raise KeyError(f"no agent named {name!r}; agents: {[a.name for a in self.agents]}")


# ----------------------------------------------------------------------------------------- validation
def _model_shape(agent: AgentConfig) -> dict[str, int] | None:
    """Heads, KV heads and layers of an agent's model when knowable before start-up."""
    model = agent.model
    if model.source == "tiny":
        spec = model.tiny
        return {"heads": spec.num_attention_heads, "kv_heads": spec.num_query_groups or spec.num_attention_heads,
                "layers": spec.num_layers}
    if model.source == "hf" and model.path and (Path(model.path) / "config.json").is_file():
        hf = json.loads((Path(model.path) / "config.json").read_text())
        heads = hf.get("num_attention_heads")
        return {"heads": heads, "kv_heads": hf.get("num_key_value_heads", heads), "layers": hf.get("num_hidden_layers")}
    return None


def _check_agent(i: int, agent: AgentConfig, cfg: HacpoConfig, out: list[ConfigIssue]) -> None:
    key = f"agents[{i}]"
    par, model = agent.parallel, agent.model
    for name in ("tp", "pp", "cp", "dp", "micro_batch_size"):
        if getattr(par, name) < 1:
            out.append(ConfigIssue(f"{key}.parallel.{name}", f"must be ≥ 1, got {getattr(par, name)}", "use 1 or more"))
    if par.cp != 1:
        out.append(ConfigIssue(f"{key}.parallel.cp", f"context parallelism ({par.cp}) is not supported yet",
                               "set cp: 1 and use tp/pp for long sequences"))
    if par.sequence_parallel and par.tp == 1:
        out.append(ConfigIssue(f"{key}.parallel.sequence_parallel", "needs tp > 1", "set tp ≥ 2 or turn it off"))

    if model.source == "hf" and not model.path:
        out.append(ConfigIssue(f"{key}.model.path", "source is 'hf' but no path is given",
                               "set it to a local HF checkpoint directory"))
    elif model.source == "hf" and not (Path(model.path) / "config.json").is_file():
        out.append(ConfigIssue(f"{key}.model.path", f"no config.json in {model.path!r} (nothing is downloaded)",
                               "point it at a local HF checkpoint directory"))
    if model.source == "recipe" and not model.recipe:
        out.append(ConfigIssue(f"{key}.model.recipe", "source is 'recipe' but no recipe name is given",
                               "set a Megatron-Bridge / NeMo recipe name"))

    shape = _model_shape(agent)
    if shape and all(isinstance(v, int) and v > 0 for v in shape.values()):
        if shape["heads"] % par.tp:
            out.append(ConfigIssue(f"{key}.parallel.tp", f"tp={par.tp} does not divide {shape['heads']} attention heads",
                                   f"use a tp that divides {shape['heads']}"))
        if shape["kv_heads"] % par.tp:
            out.append(ConfigIssue(f"{key}.parallel.tp", f"tp={par.tp} does not divide {shape['kv_heads']} KV heads",
                                   f"use a tp that divides {shape['kv_heads']}"))
        if shape["heads"] % shape["kv_heads"]:
            out.append(ConfigIssue(f"{key}.model.tiny.num_query_groups",
                                   f"{shape['kv_heads']} KV heads do not divide {shape['heads']} heads",
                                   "use a divisor of num_attention_heads"))
        if shape["layers"] % par.pp:
            out.append(ConfigIssue(f"{key}.parallel.pp", f"pp={par.pp} does not divide {shape['layers']} layers",
                                   f"use a pp that divides {shape['layers']}"))
    if model.source == "tiny":
        spec = model.tiny
        if spec.hidden_size % spec.num_attention_heads:
            out.append(ConfigIssue(f"{key}.model.tiny.hidden_size", "not divisible by num_attention_heads",
                                   "make hidden_size a multiple of the head count"))
        need = agent.max_prompt_length + agent.max_response_length
        if need > spec.max_position_embeddings:
            out.append(ConfigIssue(f"{key}.model.tiny.max_position_embeddings",
                                   f"{spec.max_position_embeddings} < max_prompt_length + max_response_length = {need}",
                                   f"raise it to ≥ {need} or shorten the lengths"))

    for name in ("max_prompt_length", "max_response_length"):
        if getattr(agent, name) < 1:
            out.append(ConfigIssue(f"{key}.{name}", "must be ≥ 1", "use a positive token count"))

    roll = agent.rollout
    if roll.temperature <= 0:
        out.append(ConfigIssue(f"{key}.rollout.temperature", "must be > 0 for RL sampling", "use e.g. 1.0"))
    if not 0 < roll.top_p <= 1:
        out.append(ConfigIssue(f"{key}.rollout.top_p", f"must be in (0, 1], got {roll.top_p}", "use e.g. 1.0"))
    if not 0 < roll.gpu_memory_utilization <= 1:
        out.append(ConfigIssue(f"{key}.rollout.gpu_memory_utilization", "must be in (0, 1]", "use e.g. 0.5"))
    if roll.tensor_parallel_size < 1:
        out.append(ConfigIssue(f"{key}.rollout.tensor_parallel_size", "must be ≥ 1", "use 1 or more"))

    opt = agent.optimizer
    if opt.lr <= 0 or opt.min_lr < 0 or opt.min_lr > opt.lr:
        out.append(ConfigIssue(f"{key}.optimizer.lr", f"need 0 ≤ min_lr ≤ lr and lr > 0 (lr={opt.lr}, min_lr={opt.min_lr})",
                               "fix the learning rates"))

    prec, device = agent.precision, cfg.runtime.cluster.device
    if device == "cpu" and prec.dtype != "fp32":
        out.append(ConfigIssue(f"{key}.precision.dtype", f"{prec.dtype} training is not supported on CPU",
                               "use fp32 on CPU (bf16/fp16 on GPU)"))
    if prec.fp8 is not None:
        if device != "cuda":
            out.append(ConfigIssue(f"{key}.precision.fp8", "FP8 needs CUDA and Transformer Engine",
                                   "set precision.fp8: null on CPU"))
        if prec.dtype == "fp32":
            out.append(ConfigIssue(f"{key}.precision.dtype", "FP8 runs with a bf16/fp16 base dtype", "set dtype: bf16"))
        if prec.fp8_recipe == "delayed" and prec.first_last_layers_bf16:
            out.append(ConfigIssue(f"{key}.precision.first_last_layers_bf16",
                                   "Megatron's delayed FP8 scaling cannot keep the first/last layers in BF16",
                                   "set first_last_layers_bf16: false, or use fp8_recipe: blockwise / tensorwise"))
        if prec.fp8_param and not opt.use_distributed_optimizer:
            out.append(ConfigIssue(f"{key}.precision.fp8_param", "FP8 parameters need the distributed optimizer",
                                   "set optimizer.use_distributed_optimizer: true"))
    if device == "cpu" and par.sequence_parallel:
        out.append(ConfigIssue(f"{key}.parallel.sequence_parallel", "not supported on CPU", "set it to false"))

    seqs = cfg.algo.sequences_per_learner(len(cfg.agents))
    updates = cfg.algo.updates_per_step
    if updates >= 1 and seqs % updates == 0:
        per_update = seqs // updates
        if per_update % (par.dp * par.micro_batch_size):
            out.append(ConfigIssue(f"{key}.parallel.micro_batch_size",
                                   f"an update's {per_update} sequences do not split into dp={par.dp} × "
                                   f"micro_batch_size={par.micro_batch_size}",
                                   f"choose dp · micro_batch_size dividing {per_update}"))


def _check_engines(i: int, agent: AgentConfig, cfg: HacpoConfig, out: list[ConfigIssue]) -> None:
    """Colocated engines use the trainer's GPUs: vLLM TP groups of T consecutive ranks on one node."""
    if cfg.runtime.cluster.device != "cuda":
        return
    key, tp, world = f"agents[{i}].rollout", agent.rollout.tensor_parallel_size, agent.parallel.world_size
    if not agent.rollout.colocated:
        out.append(ConfigIssue(f"{key}.colocated", "engines on separate GPUs are not placed by the runtime yet",
                               "use rollout.colocated: true (engines sleep while their GPUs train)"))
    elif world % tp:
        out.append(ConfigIssue(f"{key}.tensor_parallel_size", f"{tp} does not divide the agent's {world} trainer "
                               "ranks (each engine runs on the GPUs of T consecutive ranks)",
                               "choose a divisor of tp·pp·cp·dp"))
    elif cfg.runtime.cluster.gpus_per_node and cfg.runtime.cluster.gpus_per_node % tp:
        out.append(ConfigIssue(f"{key}.tensor_parallel_size", f"{tp} does not divide gpus_per_node="
                               f"{cfg.runtime.cluster.gpus_per_node} (a vLLM TP group must stay on one node)",
                               "choose a divisor of the GPUs per node"))


def _check_offload(i: int, agent: AgentConfig, out: list[ConfigIssue]) -> None:
    if agent.offload_reference and agent.precision.fp8_param:
        out.append(ConfigIssue(f"agents[{i}].offload_reference", "not supported with precision.fp8_param",
                               "turn one of them off"))


def _check_algo(cfg: HacpoConfig, out: list[ConfigIssue]) -> None:
    algo, n = cfg.algo, len(cfg.agents)
    if algo.shares_rollouts and n < 2:
        out.append(ConfigIssue("agents", f"algo '{algo.name}' shares rollouts and needs ≥ 2 agents, got {n}",
                               "add an agent or use algo=gspo"))
    if algo.group_size < 2:
        out.append(ConfigIssue("algo.group_size", f"G={algo.group_size}: a group baseline needs ≥ 2 responses",
                               "use group_size ≥ 2 (paper: 8)"))
    if algo.batch_size < 1:
        out.append(ConfigIssue("algo.batch_size", "must be ≥ 1", "use a positive prompt count"))
    if not 0 < algo.delta < 1:
        out.append(ConfigIssue("algo.delta", f"δ={algo.delta} must lie in (0, 1)", "use e.g. 0.2 (lower bound 0.8)"))
    for name in ("alpha", "delta_step", "kl_coef", "eps_low", "eps_high", "grpo_eps_low", "grpo_eps_high"):
        if getattr(algo, name) < 0:
            out.append(ConfigIssue(f"algo.{name}", "must be ≥ 0", "use a non-negative value"))
    if not 0 < algo.ratio_min <= 1 <= algo.ratio_max:
        out.append(ConfigIssue("algo.ratio_min", f"need 0 < ratio_min ≤ 1 ≤ ratio_max, got [{algo.ratio_min}, "
                               f"{algo.ratio_max}]", "use the defaults 0.1 and 10"))
    if algo.capability_window < 1:
        out.append(ConfigIssue("algo.capability_window", "must be ≥ 1", "use e.g. 5"))
    if algo.updates_per_step < 1:
        out.append(ConfigIssue("algo.updates_per_step", "must be ≥ 1", "use e.g. 4"))
    else:
        seqs = algo.sequences_per_learner(n)
        if seqs % algo.updates_per_step:
            out.append(ConfigIssue("algo.updates_per_step",
                                   f"{algo.updates_per_step} updates do not divide the {seqs} training sequences per "
                                   f"learner ({'n·' if algo.shares_rollouts else ''}B·G)",
                                   "choose a divisor (or change batch_size / group_size)"))


def _check_resources(cfg: HacpoConfig, out: list[ConfigIssue]) -> None:
    cluster = cfg.runtime.cluster
    if cluster.device != "cuda":
        return
    gpus = cluster.num_nodes * cluster.gpus_per_node
    need = 0
    for agent in cfg.agents:
        need += agent.parallel.world_size
        if not agent.rollout.colocated:
            need += agent.rollout.tensor_parallel_size
    if need > gpus:
        out.append(ConfigIssue("runtime.cluster.gpus_per_node",
                               f"the agents' layouts need {need} GPUs but the cluster has {cluster.num_nodes} × "
                               f"{cluster.gpus_per_node} = {gpus}",
                               "add nodes or shrink tp/pp/dp (or colocate the rollout engines)"))


def _check_runtime(rt: RuntimeConfig, out: list[ConfigIssue]) -> None:
    if rt.steps < 1:
        out.append(ConfigIssue("runtime.steps", "must be ≥ 1", "use a positive step count"))
    if rt.eval_samples < 0:
        out.append(ConfigIssue("runtime.eval_samples", "must be ≥ 0", "0 = greedy only, or e.g. 8"))
    for key in ("collective_timeout_s", "call_timeout_s"):
        if getattr(rt, key) <= 0:
            out.append(ConfigIssue(f"runtime.{key}", "must be > 0 seconds", "use e.g. 1800"))
    if "wandb" in rt.logging:
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            out.append(ConfigIssue("runtime.logging", "'wandb' is listed but the wandb package is not installed",
                                   "pip install wandb, or drop wandb from runtime.logging"))
        if not rt.wandb_project:
            out.append(ConfigIssue("runtime.wandb_project", "must be set when runtime.logging has wandb",
                                   "pass runtime.wandb_project=<project>"))


def dump_config(cfg: HacpoConfig) -> str:
    """The resolved config as YAML; `validate(yaml.safe_load(text))` gives `cfg` back."""
    import dataclasses

    import yaml

    def plain(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: plain(v) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return [plain(v) for v in node]
        return node

    return yaml.safe_dump(plain(dataclasses.asdict(cfg)), sort_keys=False, allow_unicode=True)


def load_run_config(path: str | Path) -> HacpoConfig:
    """The config a run saved (`<output_dir>/config.yaml`), validated again."""
    import yaml

    path = Path(path)
    if path.is_dir():
        path = path / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no run config at {path.resolve()} (a training run writes <output_dir>/config.yaml)")
    return validate(yaml.safe_load(path.read_text()))


def validate(raw: Any) -> HacpoConfig:
    """Turn a composed config (DictConfig or plain dict) into a `HacpoConfig`, or raise `ConfigError`."""
    try:
        from omegaconf import DictConfig, OmegaConf
        if isinstance(raw, DictConfig):
            raw = OmegaConf.to_container(raw, resolve=True, throw_on_missing=False)
    except ImportError:  # pragma: no cover - hydra is a core dependency
        pass
    issues: list[ConfigIssue] = []
    _find_missing(raw, "", issues)
    if issues:
        raise ConfigError(issues)
    cfg = from_plain(HacpoConfig, raw, "", issues)
    if issues:
        raise ConfigError(issues)
    names = [agent.name for agent in cfg.agents]
    for i, name in enumerate(names):
        if not name or not name.replace("_", "").replace("-", "").isalnum():
            issues.append(ConfigIssue(f"agents[{i}].name", f"{name!r} is not a valid name",
                                      "use letters, digits, '-' and '_'"))
        elif name in names[:i]:
            issues.append(ConfigIssue(f"agents[{i}].name", f"duplicate agent name {name!r}", "give every agent a unique name"))
    _check_algo(cfg, issues)
    for i, agent in enumerate(cfg.agents):
        _check_agent(i, agent, cfg, issues)
        _check_offload(i, agent, issues)
        _check_engines(i, agent, cfg, issues)
    _check_resources(cfg, issues)
    _check_runtime(cfg.runtime, issues)
    if cfg.warmstart.enabled and (cfg.warmstart.steps < 1 or cfg.warmstart.batch_size < 1 or cfg.warmstart.lr <= 0):
        issues.append(ConfigIssue("warmstart", "steps and batch_size must be ≥ 1 and lr > 0", "fix the warm start"))
    if cfg.reward.timeout_s <= 0:
        issues.append(ConfigIssue("reward.timeout_s", "must be > 0", "use e.g. 5.0"))
    for split in ("train", "eval"):
        ds = getattr(cfg.data, split)
        if ds.source in ("jsonl", "parquet") and not ds.path:
            issues.append(ConfigIssue(f"data.{split}.path", f"source '{ds.source}' needs a path", "set a local file path"))
        if ds.source == "arithmetic" and (not ds.levels or any(lv not in (1, 2, 3) for lv in ds.levels)):
            issues.append(ConfigIssue(f"data.{split}.levels", f"levels {list(ds.levels)} must be a non-empty subset of 1..3",
                                      "use e.g. [1, 2, 3]"))
    if issues:
        raise ConfigError(issues)
    return cfg


def _find_missing(node: Any, key: str, out: list[ConfigIssue]) -> None:
    """Report OmegaConf's `???` (mandatory value) placeholders, e.g. a checkpoint path left for the user."""
    if node == "???":
        env = " (or the environment variable named in the YAML)"
        out.append(ConfigIssue(key, "mandatory value is not set", f"pass {key}=...{env}"))
    elif isinstance(node, dict):
        for k, v in node.items():
            _find_missing(v, f"{key}.{k}" if key else str(k), out)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _find_missing(v, f"{key}[{i}]", out)


def compose(config_name: str = "pair_tiny", overrides: list[str] | tuple[str, ...] = (),
            conf_dir: str | os.PathLike | None = None):
    """Compose `conf/<config_name>.yaml` with Hydra overrides; returns the raw DictConfig."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    conf_dir = Path(conf_dir or os.environ.get("NEMO_HACPO_CONF_DIR", CONF_DIR)).resolve()
    if not (conf_dir / f"{config_name}.yaml").is_file():
        available = sorted(p.stem for p in conf_dir.glob("*.yaml"))
        raise FileNotFoundError(f"no config {config_name!r} in {conf_dir}; available: {available}")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=_add_or_override(overrides, conf_dir))


def _add_or_override(overrides, conf_dir: Path) -> list[str]:
    """Let `key=value` set any schema key, also one the YAML leaves at its default.

    Hydra refuses to override a key that is absent from the composed YAML unless it is written `++key=value`.
    Our schema, not the YAML, decides which keys exist (`validate` rejects unknown ones by name), so plain
    value overrides are passed as `++`. Config-group choices (`algo=gspo`) and explicit `+`/`~` forms are kept.
    """
    groups = {p.name for p in conf_dir.iterdir() if p.is_dir()}
    out = []
    for item in overrides:
        key = item.split("=", 1)[0]
        if "=" not in item or key[:1] in "+~" or key.split("@", 1)[0] in groups:
            out.append(item)
        else:
            out.append(f"++{item}")
    return out


def load_config(config_name: str = "pair_tiny", overrides: list[str] | tuple[str, ...] = (),
                conf_dir: str | os.PathLike | None = None) -> HacpoConfig:
    """Compose with Hydra and validate: the one way a run gets its config."""
    return validate(compose(config_name, overrides, conf_dir))


def describe(cls: type = HacpoConfig, prefix: str = "") -> list[str]:
    """One line per config key, `key = default — docstring`, for `recipes/train.py --describe`."""
    lines: list[str] = []
    docs = field_docs(cls)
    for f in fields(cls):
        key, doc = f"{prefix}{f.name}", docs.get(f.name, "")
        if f.name == "agents":
            lines.append(f"{key}[] — {doc}")
            lines.extend(describe(AgentConfig, f"{key}[]."))
            continue
        if f.default_factory is not MISSING:
            default = f.default_factory()
        elif f.default is not MISSING:
            default = f.default
        else:
            lines.append(f"{key} (required) — {doc}")
            continue
        if is_dataclass(default):
            lines.append(f"{key} — {doc}")
            lines.extend(describe(type(default), f"{key}."))
        else:
            lines.append(f"{key} = {default!r} — {doc}")
    return lines

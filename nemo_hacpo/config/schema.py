"""The configuration schema: frozen dataclasses, one docstring per field (`describe()` prints them).

`nemo_hacpo.config.validate` fills these from a composed Hydra config; nothing else constructs them from YAML.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from nemo_hacpo.algo.registry import Algorithm, algorithm

QUESTION = "{question}"
"""The placeholder of a prompt template that the question replaces (literally: other braces, as in `\\boxed{}`,
are text)."""
DEFAULT_PROMPT_TEMPLATE = "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."
"""The user message of a prompt unless a data set sets its own `prompt_template` (`{question}`: the question)."""


# --------------------------------------------------------------------------------------------- agents
@dataclass(frozen=True)
class TinyModelSpec:
    """A small GPT built from scratch (the tiny configs and the tests)."""

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
    """`tiny-bpe`, `tiny-unigram`, `tiny-words` (built and cached locally), `qwen3`, `gpt2` (shipped by pip packages), a local
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
    gpu_memory_utilization: float | Literal["auto"] = 0.5
    """Fraction of GPU memory vLLM may take: its weights, activations, CUDA graphs and KV cache (on CPU: scaled by
    the KV-cache size below). `auto`: what the plan's generate phase leaves on the busiest GPU next to the
    colocated trainer's resident state, the two processes' CUDA contexts and NCCL buffers (`planning.plan`,
    resolved by the driver at start-up and shown by `--plan`; on CPU `auto` is 0.5)."""
    cpu_kvcache_gib: float = 1
    """KV-cache size on CPU, GiB (vLLM's `kv_cache_memory_bytes`). Fractions are allowed: the engine zero-fills the
    whole cache at start-up, so a tiny model's short sequences start faster with e.g. 0.125 (128 MiB)."""
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
    seeded_requests: bool = True
    """Every request its own seed: a batch's samples do not depend on how vLLM schedules it (a run is bit-for-bit
    reproducible, a resumed run equal to an uninterrupted one). vLLM then draws each seeded request's sampling noise
    in a Python loop at every decode step (`benchmarks/sampling_seeds.py`); false: the engine's seed alone,
    reproducible only on the same schedule — pair_large's choice, where GPU kernels are not bit-exact anyway."""
    refit_transport: Literal["rpc", "ipc"] = "rpc"
    """How the trainer's new weights reach the engine after each step (`rollout.refit`). `rpc`: the engine rank
    sends HF-layout tensors in safetensors chunks over vLLM's `collective_rpc` to every engine worker (simple, any
    device; the whole model passes through host memory). `ipc`: the trainer ranks on the engine's devices stage
    each bucket in their own device's memory and every engine worker reads the one on its device (CUDA IPC on
    GPUs, shared memory on CPU); no tensor leaves its device."""
    refit_bucket_mb: int = 512
    """Largest refit bucket (MiB): the extra memory a sending rank holds during a refit (a single tensor larger
    than this travels alone)."""


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
    checkpoint_format: Literal["fully_reshardable", "dp_reshardable"] = "fully_reshardable"
    """How the distributed optimizer's state is saved (`training.trainer_checkpoint`). `fully_reshardable`: gathered
    over gloo onto DP rank 0 (Megatron's memory-efficient gather), which writes one tensor per parameter; any
    TP/PP/DP layout can resume from it, but DP rank 0 holds full host copies of its stage's state (12 bytes per
    parameter of its TP shard, twice). `dp_reshardable`: every rank writes its own shard, nothing is gathered;
    resumable at the same TP/PP only (any DP). With DP = 1 there is nothing to share the copies with: use
    `dp_reshardable` for large models (pair_large's llama70b)."""


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
class AgentWarmStart:
    """Per-agent overrides of `warmstart` (null: the run's value). Everything else of the warm start (learning rate,
    batch size, problems, seed) is the run's."""

    steps: int | None = None
    """Optimizer steps of this agent's warm start (fewer: a weaker starting policy)."""
    stop_early_fraction: float | None = None
    """This agent's share of multi-step solutions that stop after the first operation."""
    direct_answer_fraction: float | None = None
    """This agent's share of answer-only solutions."""
    narrated_fraction: float | None = None
    """This agent's share of solutions written in the narrated style (`warmstart.narrated_fraction`)."""


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
    offload_train_state: bool = False
    """Between updates, keep the optimizer state (Adam m, v and fp32 main parameters) in host memory and free the
    gradient buffers (`training.memory`): while the colocated engine generates, the trainer holds only its
    weights on the GPU. Costs one host↔device copy of the optimizer state per step."""
    max_prompt_length: int = 256
    """Prompt tokens (after the chat template); longer prompts are an error in the data."""
    max_response_length: int = 256
    """Generated tokens per response; also the truncation length for re-encoded cross samples."""
    warmstart: AgentWarmStart = field(default_factory=AgentWarmStart)
    """This agent's own warm-start settings where they differ from the run's `warmstart` (pairs that differ in
    capability or solution style, benchmarks/results/heterogeneity/)."""


# ----------------------------------------------------------------------------------------------- algo
@dataclass(frozen=True)
class AblationConfig:
    """HACPO ablation switches (algorithm.md §8). All true = full HACPO; a switch only removes a mechanism."""

    capability_baseline: bool = True
    """Use ω in the learner's baseline (false = the "−adv" ablation: ω = 1 in the baseline only)."""
    gradient_modulation: bool = True
    """Multiply cross-sample advantages by ω (false = the "−ω" ablation)."""
    cross_clip: bool = True
    """Clip cross-sample ratios to [lo_u, 1] (false = no cross clip)."""


@dataclass(frozen=True)
class AlgoConfig:
    """The RL algorithm and every hyper-parameter of docs/algorithm.md, with its defaults."""

    name: str = "hacpo"
    """One of `nemo_hacpo.algo.registry.ALGORITHMS`: hacpo | naive (plain sharing) | gspo (alone) | gspo_x2
    (alone, 2G samples) | grpo (alone, token PPO). `conf/algo/<name>.yaml` sets it with its defaults."""
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
    ratio_length: Literal["per_tokenizer", "single_exponent"] = "per_tokenizer"
    """Length convention of a cross sample's ratio s (docs/algorithm.md §4): `per_tokenizer` divides each side's
    summed log-prob by its own token count (the paper's code, and v2), log s = m_k − m_j; `single_exponent` uses
    one exponent 1/|y_source| over the two whole-sequence probabilities (the paper's v1 Eq. 11),
    log s = Σ log π_k / L_j − m_j. They agree when the two tokenizations have the same length."""
    row_order: Literal["own_first", "by_prompt", "shuffled"] = "by_prompt"
    """Order of a learner's rows, which `updates_per_step` cuts into consecutive optimizer updates
    (docs/algorithm.md §6): `by_prompt` (the default) — prompt by prompt, its own rows then the others' (every
    update mixes both, as each update does in the authors' 8-rank runs); `own_first` — its own rows, then each
    other agent's (the order the authors' code builds before cutting it over ranks); `shuffled` — a permutation drawn
    from runtime.seed, the step and the learner (reproducible, equal on a resume)."""
    ablation: AblationConfig = field(default_factory=AblationConfig)
    """Ablation switches."""

    @property
    def algorithm(self) -> Algorithm:
        """The registry entry of `name` with the ablation switches applied (what the broker and loop read)."""
        return algorithm(self.name).with_ablations(capability_baseline=self.ablation.capability_baseline,
                                                   gradient_modulation=self.ablation.gradient_modulation)

    @property
    def samples_per_prompt(self) -> int:
        """Responses each agent generates per prompt (2G for gspo_x2)."""
        return self.algorithm.samples_per_prompt(self.group_size)

    def sequences_per_learner(self, num_agents: int) -> int:
        """Training rows per learner per step: n·B·G when sharing, B·G (or B·2G) alone."""
        return self.algorithm.rows_per_learner(num_agents, self.batch_size, self.group_size)


# ------------------------------------------------------------------------------------ data and reward
@dataclass(frozen=True)
class ArithmeticNumbers:
    """The number ranges of generated arithmetic problems: which facts (`a <op> b = c`) a worked solution needs.

    The defaults are the original task (values up to 100, products up to 5×); smaller ranges give a task whose
    facts a tiny model learns in its warm start (`data/arithmetic.py`)."""

    max_value: int = 100
    """The start value, every intermediate value and the answer lie in [2, max_value]."""
    max_start: int = 20
    """The start value lies in [2, max_start]."""
    max_addend: int = 20
    """`+` operands lie in [2, max_addend]."""
    max_subtrahend: int = 100
    """`-` operands lie in [2, max_subtrahend] (and leave at least 2)."""
    max_factor: int = 5
    """`*` operands lie in [2, max_factor]."""
    max_divisor: int = 10
    """`/` operands lie in [2, max_divisor] (exact division, a quotient of at least 2)."""

    def problems(self) -> list[str]:
        """What makes these ranges unusable, each naming its field (empty when every story can go on: every range
        holds an operand ≥ 2, and with max_value ≥ 5 every value in [2, max_value] admits a `+` or a `-`)."""
        found = [f"{name}={getattr(self, name)} must be ≥ 2" for name in
                 ("max_start", "max_addend", "max_subtrahend", "max_factor", "max_divisor") if getattr(self, name) < 2]
        if self.max_value < max(self.max_start, 5):
            found.append(f"max_value={self.max_value} must be ≥ max_start ({self.max_start}) and ≥ 5")
        return found


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
    """Difficulty levels (number of operations, 1..4) to generate."""
    numbers: ArithmeticNumbers = field(default_factory=ArithmeticNumbers)
    """Number ranges of the generated problems (arithmetic)."""
    limit: int | None = None
    """Use at most this many problems (null = all)."""
    answer_format: Literal["plain", "gsm8k"] = "plain"
    """How the gold answer field is written (jsonl/parquet): `plain` is the answer itself (`72`, `\\frac{1}{2}`);
    `gsm8k` is a worked solution whose answer follows its last `####` (`… #### 72`)."""
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE
    """The user message of every prompt: `{question}` (exactly once) is replaced by the question. The default asks
    for the answer in `\\boxed{}`, where the math reward reads it."""
    system_prompt: str | None = None
    """System message of this data set's prompts (null: `data.system_prompt`; "": none)."""


@dataclass(frozen=True)
class DataConfig:
    """Training and held-out prompts."""

    train: DatasetConfig = field(default_factory=DatasetConfig)
    """Training prompts."""
    eval: DatasetConfig = field(default_factory=lambda: DatasetConfig(size=200, seed=1))
    """Held-out prompts."""
    system_prompt: str | None = None
    """Optional system message prepended to every prompt (a data set's own `system_prompt` replaces it)."""
    shuffle_seed: int = 0
    """Seed of the per-epoch prompt order."""
    on_invalid: Literal["error", "skip"] = "error"
    """A record with a missing or empty question or answer, or a prompt longer than an agent's
    max_prompt_length: `error` stops at start-up naming file and line of each; `skip` drops them (logging how
    many and the first few)."""
    max_invalid_gold_share: float = 0.05
    """Gold answers that math-verify cannot read (every answer to them would score 0) are invalid records; above
    this share of a data set they stop the start-up even with `on_invalid=skip`: a format problem of the whole
    file (GSM8K-style `… #### 72`: `answer_format=gsm8k`), not a few bad records. Not checked with
    `reward.function`."""


@dataclass(frozen=True)
class RewardConfig:
    """How answers are scored: math-verify against the gold answer, or a function of the user's."""

    function: str | None = None
    """A function of yours that decides whether an answer is correct, instead of math-verify:
    `f(response: str, gold: str) -> bool`, named `module:function` (importable: on PYTHONPATH) or
    `path/to/file.py:function`. It runs in the reward processes under `timeout_s`; an exception, a timeout or a
    value other than True/False/1/0 scores 0 and is logged (nemo_hacpo/rewards/custom.py). `strict` and the
    start-up check of gold answers (math-verify's) do not apply then."""

    strict: bool = True
    """Only the last \\boxed{} answer counts (training default); false = lenient extraction."""
    timeout_s: float = 5.0
    """Per-answer time limit; a timeout scores 0."""
    num_workers: int = 2
    """Scoring processes (0 = in the driver)."""
    max_response_chars: int = 16384
    """Longer responses are truncated (keeping the end) before parsing."""
    worker_memory_mb: int | None = 2048
    """Address space (RLIMIT_AS) each reward process may add to what it holds once started (its interpreter and
    imports; a CUDA build of torch, if the main module imports it, maps ~3 GB), so that a pathological answer cannot
    take the node's memory; null: no limit. math-verify needs well under the default; a reward function of yours
    that imports torch or loads a model may need more: over the limit while loading, the run stops naming this
    key; while scoring, that answer scores 0 (`error`). Not applied with `num_workers: 0` (the driver's process)."""


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
    """Generated training problems with worked solutions to draw from (levels and number ranges of `data.train`
    when it is generated arithmetic, else the generator's defaults)."""
    direct_answer_fraction: float = 0.0
    """Share of those problems whose solution is written answer-only (`The answer is \\boxed{N}`, no steps): the
    warm-started policy then answers some problems directly and works the others out, and RL can discover which
    of the two earns more reward (docs/quickstart.md, "The task")."""
    stop_early_fraction: float = 0.0
    """Share of the problems with two or more operations whose solution stops after the first operation and gives
    its result as the answer (wrong unless the problem has one operation): the warm-started policy then sometimes
    stops early, and RL can discover that finishing the computation earns the reward."""
    narrated_fraction: float = 0.0
    """Share of the problems whose solution is narrated: each operation's sentence of the story, then its equation
    (`She buys 2 more.` / `8 + 2 = 10`), instead of the equations alone. A style, orthogonal to the two habits above
    (a narrated solution can also stop early); the verifier accepts both, but an agent taught one finds the other's
    responses unlikely (arithmetic.narrated)."""
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
    """Memory of one GPU as the device reports it, for the plan's fit check (H100 80 GB: 79.6 — nvidia-smi's
    81559 MiB)."""
    host_memory_gib: float | None = None
    """Host RAM of one node (GiB; `free -g`'s total), for the plan's host check: the driver refuses to start when
    any phase needs more per node (`planning.host_memory`); null = not checked (CPU runs)."""
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
    """Checkpoints kept on disk, newest first (0 = every one)."""
    checkpoint_hashes: bool = True
    """Record a content digest (blake3, else sha256) of every checkpoint file in its manifest and verify it before
    resuming; false: sizes only (faster for multi-terabyte checkpoints)."""
    resume: bool = True
    """Continue from the newest checkpoint in output_dir that verifies, when there is one."""
    allow_config_change: bool = False
    """Resume even though the requested config changes what the run record (output_dir/config.yaml) says about
    the agents, the data, the warm start, the algorithm or the seed (listed at start-up; refused otherwise)."""
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
    stop_by: str | None = None
    """Save a checkpoint and stop (exit status 75) before this time: ISO 8601, `2026-07-01T18:00` (local time) or
    with a zone (`…+02:00`). Inside a Slurm job its end time counts too (the earlier). The run stops before a step
    when that step plus a checkpoint (both as measured) plus `stop_margin_s` would end after it."""
    stop_margin_s: float = 300.0
    """Seconds kept free before the time limit (runtime.stop_by or the Slurm job's end) after the last save: the
    engines' and Ray's shutdown and the job script's teardown."""
    lock_stale_s: float = 300.0
    """The run holds `<output_dir>/run.lock` and refreshes its heartbeat every lock_stale_s/10 s; another run takes
    the lock over when its holder is gone: on the same host its pid has ended, in Slurm its job has ended, else
    its heartbeat is older than this."""
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

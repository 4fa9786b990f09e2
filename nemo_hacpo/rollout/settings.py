"""How one agent's vLLM engine is built: a frozen `EngineSettings` from the agent's config, then `vllm.LLM` kwargs.

Pure functions, no vLLM import: the unit tests check every mapping without starting an engine.

    settings = engine_settings(agent, model_dir="/ckpt/llama_tiny", tokenizer_dir=tokenizer_path("tiny-bpe"),
                               device="cpu", default_seed=0)
    llm = vllm.LLM(**llm_kwargs(settings))

| config                                   | vLLM                                                          |
|------------------------------------------|---------------------------------------------------------------|
| `rollout.tensor_parallel_size`           | `tensor_parallel_size`                                        |
| `precision.dtype` (fp32 / bf16 / fp16)   | `dtype` (float32 / bfloat16 / float16)                        |
| `max_prompt_length + max_response_length`| `max_model_len` (+ 1, see below)                              |
| `rollout.gpu_memory_utilization`         | `gpu_memory_utilization` (on CPU: capped, see below)          |
| `rollout.cpu_kvcache_gib` (CPU only)     | `kv_cache_memory_bytes` (`VLLM_CPU_KVCACHE_SPACE` unset)      |
| `rollout.enforce_eager`                  | `enforce_eager`                                               |
| `rollout.seed` (or the runtime's seed)   | `seed`                                                        |
| `rollout.colocated` (CUDA only)          | `enable_sleep_mode`                                           |

On CPU, vLLM's `gpu_memory_utilization` is the fraction of *host RAM* the worker asks for at start-up (it fails
when that much is not free); the KV cache itself is sized by `kv_cache_memory_bytes`. So the CPU fraction is
`min(rollout.gpu_memory_utilization, max(CPU_MIN_MEMORY_FRACTION, 2 · cpu_kvcache_gib / total RAM GiB))`:
enough headroom for the cache and the weights of a tiny model, never the 92 % default that fails.

`max_model_len` has one slot more than the longest prompt + response: scoring a fixed sequence (prompt
log-probs) makes vLLM generate one throw-away token after it, and a full-length trainer sequence must still
fit. The extra slot is dropped when the checkpoint's position table has no room for it.

The checkpoint's own `generation_config.json` (and config.json's `eos_token_id`) are not used: vLLM adds every
EOS id it finds there to the stop tokens, even with `generation_config="vllm"` (measured: a checkpoint whose
config names another EOS made responses stop on that token). The engine writes a one-field generation config
naming the agent tokenizer's EOS (`write_generation_config`) and points vLLM at it, so sampling comes from the
agent's config only and the only stop token is the agent's EOS (see `sampling.py`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from nemo_hacpo.config import AgentConfig

Device = Literal["cpu", "cuda"]

GIB = 1 << 30
VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""precision.dtype → vLLM dtype name."""
CPU_AUTO_FRACTION = 0.5
"""`rollout.gpu_memory_utilization: auto` on CPU (then capped by `cpu_memory_fraction` like any value)."""
CPU_MIN_MEMORY_FRACTION = 0.02
"""Smallest host-RAM fraction requested on CPU (vLLM checks this much is free at start-up)."""
WORKER_EXTENSION = "nemo_hacpo.rollout.worker_extension.RefitWorkerExtension"
"""Qualified name of the worker mix-in that receives refits over `collective_rpc` (imported in the worker)."""


@dataclass(frozen=True)
class EngineSettings:
    """Everything needed to start one agent's vLLM engine."""

    agent_name: str
    """Agent name (logs, stats)."""
    model_dir: str
    """Local HF checkpoint directory (config.json + safetensors) the engine starts from."""
    tokenizer_dir: str
    """Local HF tokenizer directory (the agent's own tokenizer)."""
    device: Device
    """`cpu` (vllm-cpu) or `cuda`."""
    tensor_parallel_size: int
    """vLLM tensor-parallel size."""
    dtype: str
    """vLLM dtype name: float32 / bfloat16 / float16."""
    max_model_len: int
    """max_prompt_length + max_response_length + 1 (the scoring slot), capped at the checkpoint's positions."""
    max_prompt_length: int
    """Longest prompt accepted (after the chat template)."""
    max_response_length: int
    """Default (and largest) number of generated tokens per response."""
    gpu_memory_utilization: float
    """GPU memory fraction (CUDA) or host-RAM fraction checked at start-up (CPU)."""
    kv_cache_memory_bytes: int | None
    """Explicit KV-cache size (CPU: cpu_kvcache_gib GiB); None lets vLLM size it from the memory fraction."""
    enforce_eager: bool
    """No CUDA graphs / no torch.compile."""
    seed: int
    """Engine seed (global sampler RNG; per-request seeds are derived from it, see `sampling.request_seeds`)."""
    enable_sleep_mode: bool
    """Colocated on CUDA: the engine can release its GPU memory while the trainer runs."""
    cpu_cores: tuple[int, ...] | None = None
    """CPU only: the cores this engine's OpenMP threads are bound to (`engine_cpu_cores`), so that the engines of
    one node run side by side; None leaves vLLM's own binding (TP 1) or splits the process's cores (TP > 1)."""
    seeded_requests: bool = True
    """Every request its own seed (`rollout.seeded_requests`); False: the engine's seed alone."""
    dummy_weights: bool = False
    """Start from `model_dir`'s config.json alone (vLLM's `load_format="dummy"`: placeholder weights, nothing read
    from disk); the caller refits the real weights before the engine generates."""


def cpu_memory_fraction(requested: float, cpu_kvcache_gib: float, total_memory_bytes: int) -> float:
    """Host-RAM fraction to pass as `gpu_memory_utilization` on CPU.

    fraction = min(requested, max(CPU_MIN_MEMORY_FRACTION, 2 · cpu_kvcache_gib GiB / total RAM))

    Example: requested 0.5, 1 GiB of KV cache, 24 GiB RAM → min(0.5, max(0.02, 2/24)) = 0.0833.
    """
    if total_memory_bytes <= 0:
        raise ValueError(f"total_memory_bytes must be > 0, got {total_memory_bytes}")
    if not cpu_kvcache_gib > 0:
        raise ValueError(f"cpu_kvcache_gib must be > 0 GiB, got {cpu_kvcache_gib}")
    needed = 2 * cpu_kvcache_gib * GIB / total_memory_bytes
    return min(requested, max(CPU_MIN_MEMORY_FRACTION, needed))


def total_host_memory_bytes() -> int:
    """Physical RAM of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def checkpoint_max_positions(model_dir: str | Path) -> int | None:
    """`max_position_embeddings` (or GPT-2's `n_positions`) of the HF checkpoint's config.json, if readable."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    for key in ("max_position_embeddings", "n_positions"):
        if isinstance(config.get(key), int):
            return config[key]
    return None


def engine_settings(agent: AgentConfig, model_dir: str | Path, tokenizer_dir: str | Path, *, device: Device,
                    default_seed: int = 0, total_memory_bytes: int | None = None,
                    cpu_cores: Sequence[int] | None = None, dummy_weights: bool = False) -> EngineSettings:
    """The engine settings of `agent`, starting from the HF checkpoint in `model_dir`.

    `default_seed` is used when `agent.rollout.seed` is null (the runtime derives it from runtime.seed and the
    agent's index). `total_memory_bytes` defaults to this machine's RAM (CPU only). `cpu_cores`: the cores the
    engine's threads are bound to (CPU only; `engine_cpu_cores`).
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    rollout = agent.rollout
    dtype = VLLM_DTYPES.get(agent.precision.dtype)
    if dtype is None:
        raise ValueError(f"agent {agent.name!r}: precision.dtype {agent.precision.dtype!r} has no vLLM dtype; "
                         f"use one of {sorted(VLLM_DTYPES)}")
    needed = agent.max_prompt_length + agent.max_response_length
    positions = checkpoint_max_positions(model_dir)
    if positions is not None and positions < needed:
        raise ValueError(f"agent {agent.name!r}: the checkpoint in {model_dir} has {positions} positions, fewer "
                         f"than max_prompt_length + max_response_length = {needed}")
    max_model_len = needed + 1 if positions is None or positions > needed else needed
    if device == "cpu":
        memory = total_host_memory_bytes() if total_memory_bytes is None else total_memory_bytes
        requested = CPU_AUTO_FRACTION if rollout.gpu_memory_utilization == "auto" else rollout.gpu_memory_utilization
        fraction = cpu_memory_fraction(requested, rollout.cpu_kvcache_gib, memory)
        kv_bytes: int | None = int(rollout.cpu_kvcache_gib * GIB)
        sleep_mode = False
    else:
        if rollout.gpu_memory_utilization == "auto":
            raise ValueError(f"agent {agent.name!r}: rollout.gpu_memory_utilization is 'auto', which the plan resolves "
                             "from the trainer's memory next to the engine (the training driver does it at start-up: "
                             "nemo_hacpo.planning.plan.startup_plan); an engine started on its own needs a number")
        fraction, kv_bytes = rollout.gpu_memory_utilization, None
        sleep_mode = rollout.colocated
    return EngineSettings(
        agent_name=agent.name,
        model_dir=str(model_dir),
        tokenizer_dir=str(tokenizer_dir),
        device=device,
        tensor_parallel_size=rollout.tensor_parallel_size,
        dtype=dtype,
        max_model_len=max_model_len,
        max_prompt_length=agent.max_prompt_length,
        max_response_length=agent.max_response_length,
        gpu_memory_utilization=fraction,
        kv_cache_memory_bytes=kv_bytes,
        enforce_eager=rollout.enforce_eager,
        seed=rollout.seed if rollout.seed is not None else default_seed,
        enable_sleep_mode=sleep_mode,
        cpu_cores=tuple(int(c) for c in cpu_cores) if cpu_cores is not None and device == "cpu" else None,
        seeded_requests=rollout.seeded_requests,
        dummy_weights=dummy_weights,
    )


def write_generation_config(directory: str | Path, eos_token_id: int) -> Path:
    """Write `generation_config.json` = {"eos_token_id": eos} into `directory` (vLLM's `generation_config`)."""
    path = Path(directory) / "generation_config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"eos_token_id": int(eos_token_id)}) + "\n")
    return path


CPU_MAX_BATCHED_TOKENS = 8192
"""Prompt + decode tokens per engine step on CPU (chunked prefill off, so at least max_model_len)."""


def llm_kwargs(settings: EngineSettings, *, generation_config_dir: str | Path,
               tokenizer_dir: str | Path | None = None) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM(**kwargs)` for these settings.

    `generation_config_dir` holds the file written by `write_generation_config`; `tokenizer_dir` replaces
    `settings.tokenizer_dir` (the engine passes a `tokenizer_view`). `weight_transfer_config` is
    given as a plain dict (vLLM's EngineArgs turns it into a WeightTransferConfig), so this module needs no
    vLLM import.
    """
    kwargs: dict[str, Any] = {
        "model": settings.model_dir,
        "tokenizer": str(tokenizer_dir) if tokenizer_dir is not None else settings.tokenizer_dir,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "dtype": settings.dtype,
        "max_model_len": settings.max_model_len,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "enforce_eager": settings.enforce_eager,
        "seed": settings.seed,
        "generation_config": str(generation_config_dir),
        "worker_extension_cls": WORKER_EXTENSION,
        "enable_prefix_caching": True,
    }
    if settings.kv_cache_memory_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = settings.kv_cache_memory_bytes
    if settings.dummy_weights:
        kwargs["load_format"] = "dummy"
    if settings.device == "cpu":
        # vllm-cpu 0.32 kills the engine ("CPU Generator does not use offset") when a *seeded* request's prompt
        # is prefilled over several steps, which chunked prefill does as soon as a batch's prompts exceed the
        # step's token budget (4096 on CPU). Without chunking every prompt is prefilled whole.
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(settings.max_model_len, CPU_MAX_BATCHED_TOKENS)
    if settings.tensor_parallel_size > 1:
        # vLLM picks its Ray executor whenever the caller sits in a Ray placement group (ours always does) and
        # would then try to place its TP workers in the trainer's group, whose bundles the trainer ranks hold:
        # the engine start waits forever. Its own processes on the GPUs the rank hands it are what we want.
        kwargs["distributed_executor_backend"] = "mp"
    if settings.enable_sleep_mode:
        kwargs["enable_sleep_mode"] = True
    return kwargs


def engine_environment(settings: EngineSettings,
                       environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """Environment variables the engine needs while `vllm.LLM` starts (its processes inherit them); None: unset.

    CPU: `VLLM_CPU_KVCACHE_SPACE` is unset — vllm-cpu's legacy knob (whole GiB) overrides `kv_cache_memory_bytes`
    when present, so a value from the user's shell or another agent's engine would win over the config's size.
    `VLLM_CPU_OMP_THREADS_BIND`: the engine's `cpu_cores` (or, with TP > 1 and none given, the process's cores)
    cut into one contiguous set per TP worker. Without it vllm-cpu binds every TP-1 engine of a node to the same
    first core (and keeps another for its scheduler), so two agents' engines would take turns on one core; with
    TP > 1 it wants one NUMA node per worker and refuses to start on a one-node machine. A value set in `environ`
    (the user's; default `os.environ`) is kept. CUDA: nothing.
    """
    if settings.device != "cpu":
        return {}
    environ = os.environ if environ is None else environ
    env: dict[str, str | None] = {"VLLM_CPU_KVCACHE_SPACE": None}
    tp = settings.tensor_parallel_size
    if "VLLM_CPU_OMP_THREADS_BIND" not in environ:
        if settings.cpu_cores is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_thread_binding(list(settings.cpu_cores), tp)
        elif tp > 1:
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_thread_binding(sorted(os.sched_getaffinity(0)), tp)
    return env


def engine_cpu_cores(cores: Sequence[int], slot: int, slots: int) -> list[int]:
    """The cores of engine `slot` of `slots` engines that share `cores`: contiguous near-equal slices, one per
    engine (cores 0–3, 2 engines → [0, 1] and [2, 3]); with more engines than cores, one core each, shared in
    turn (cores 0–1, 3 engines → [0], [1], [0])."""
    cores = sorted(int(c) for c in cores)
    if not cores or not 0 <= slot < slots:
        raise ValueError(f"need ≥ 1 core and a slot of 0..{slots - 1}, got slot {slot}, cores {cores}")
    if slots > len(cores):
        return [cores[slot % len(cores)]]
    return cores[slot * len(cores) // slots:(slot + 1) * len(cores) // slots]


def cpu_thread_binding(cores: list[int], workers: int) -> str:
    """vllm-cpu's `VLLM_CPU_OMP_THREADS_BIND` for `workers` TP workers over `cores`: contiguous near-equal
    slices joined by `|` (e.g. cores 0–3, 2 workers → "0,1|2,3"; fewer cores than workers → shared cores)."""
    if workers < 1 or not cores:
        raise ValueError(f"need ≥ 1 worker and ≥ 1 core, got {workers} worker(s), cores {cores}")
    slices = []
    for w in range(workers):
        lo, hi = w * len(cores) // workers, (w + 1) * len(cores) // workers
        part = cores[lo:hi] or [cores[w % len(cores)]]
        slices.append(",".join(str(c) for c in part))
    return "|".join(slices)


def tokenizer_view(tokenizer_dir: str | Path, model_dir: str | Path, target: str | Path) -> Path:
    """A directory of symlinks: the tokenizer's files plus the checkpoint's config.json (if the tokenizer has none).

    vLLM parses a config.json next to the tokenizer; a bare tokenizer directory makes it fail, sleep 2 s and
    retry, in the driver and again in the engine core (≈ 8 s of a ≈ 24 s CPU start-up, measured). The files
    are the tokenizer's own, so nothing about tokenization changes.
    """
    source, target = Path(tokenizer_dir), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        (target / item.name).symlink_to(item.resolve())
    config = Path(model_dir) / "config.json"
    if not (target / "config.json").exists() and config.is_file():
        (target / "config.json").symlink_to(config.resolve())
    return target

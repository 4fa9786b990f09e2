"""Validation rules: every check that can run before a process starts, each problem reported with its fix.

`validate(raw)` turns a composed config into `HacpoConfig` or raises one `ConfigError` listing every problem.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from nemo_hacpo.algo.registry import ALGORITHMS
from nemo_hacpo.config.schema import QUESTION, AgentConfig, HacpoConfig, RuntimeConfig
from nemo_hacpo.config.typed import ConfigError, ConfigIssue, from_plain, override_key

FP8_PARAM_UNPROVEN = (
    "the weight export to vLLM is unproven with FP8 parameters: Transformer Engine keeps them as quantized tensor "
    "subclasses (FP8 data + scales), and the refit and HF export all-gather each TP shard with a plain "
    "torch.distributed.all_gather (models.hf_conversion) that has never been run on them — the engine could "
    "receive raw FP8 bytes or a wrong dequantization, silently")
"""Why `precision.fp8_param` is refused at start-up (issue #26, item 7)."""


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


def _check_warm_start_shares(key: str, ws, issues: list[ConfigIssue]) -> None:
    """The warm start's shares of habits and style (`warmstart`, or one agent's settings with its overrides)."""
    for share in ("direct_answer_fraction", "stop_early_fraction", "narrated_fraction"):
        value = getattr(ws, share)
        if not 0.0 <= value <= 1.0:
            issues.append(ConfigIssue(f"{key}.{share}", f"must lie in [0, 1], got {value}", "use e.g. 0.3"))
    if ws.direct_answer_fraction + ws.stop_early_fraction > 1.0:
        issues.append(ConfigIssue(f"{key}.stop_early_fraction", "direct_answer_fraction + stop_early_fraction "
                                  "exceeds 1: a solution has one habit", "lower one of them"))


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

    if model.source == "tiny":
        spec = model.tiny
        for name in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "max_position_embeddings"):
            if getattr(spec, name) < 1:
                out.append(ConfigIssue(f"{key}.model.tiny.{name}", f"must be ≥ 1, got {getattr(spec, name)}",
                                       "use a positive size"))
        if spec.num_query_groups is not None and spec.num_query_groups < 1:
            out.append(ConfigIssue(f"{key}.model.tiny.num_query_groups", f"must be ≥ 1, got {spec.num_query_groups}",
                                   "use a divisor of num_attention_heads, or null for one per head"))
    layout_ok = all(getattr(par, name) >= 1 for name in ("tp", "pp", "cp", "dp", "micro_batch_size"))
    shape = _model_shape(agent)
    if layout_ok and shape and all(isinstance(v, int) and v > 0 for v in shape.values()):
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
    if model.source == "tiny" and model.tiny.num_attention_heads >= 1:
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
    if roll.gpu_memory_utilization != "auto" and not 0 < roll.gpu_memory_utilization <= 1:
        out.append(ConfigIssue(f"{key}.rollout.gpu_memory_utilization", "must be in (0, 1] or 'auto'",
                               "use e.g. 0.5, or auto (the plan's generate phase sizes it)"))
    if roll.tensor_parallel_size < 1:
        out.append(ConfigIssue(f"{key}.rollout.tensor_parallel_size", "must be ≥ 1", "use 1 or more"))
    if not roll.cpu_kvcache_gib > 0:
        out.append(ConfigIssue(f"{key}.rollout.cpu_kvcache_gib", f"must be > 0 GiB, got {roll.cpu_kvcache_gib}",
                               "use e.g. 1, or 0.125 for the tiny models"))

    opt = agent.optimizer
    if opt.lr <= 0 or opt.min_lr < 0 or opt.min_lr > opt.lr:
        out.append(ConfigIssue(f"{key}.optimizer.lr", f"need 0 ≤ min_lr ≤ lr and lr > 0 (lr={opt.lr}, min_lr={opt.min_lr})",
                               "fix the learning rates"))
    if opt.checkpoint_format == "dp_reshardable" and not opt.use_distributed_optimizer:
        out.append(ConfigIssue(f"{key}.optimizer.checkpoint_format", "dp_reshardable is a format of the distributed "
                               "optimizer's state", "set optimizer.use_distributed_optimizer: true, or keep "
                               "checkpoint_format: fully_reshardable"))

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
    if prec.fp8_param:
        out.append(ConfigIssue(f"{key}.precision.fp8_param", FP8_PARAM_UNPROVEN,
                               "set precision.fp8_param: false — FP8 compute with bf16 weights (conf/pair_large_fp8.yaml) "
                               "exports bf16 tensors to vLLM through the tested path"))
    if device == "cpu" and par.sequence_parallel:
        out.append(ConfigIssue(f"{key}.parallel.sequence_parallel", "not supported on CPU", "set it to false"))

    seqs = cfg.algo.sequences_per_learner(len(cfg.agents))
    updates = cfg.algo.updates_per_step
    if layout_ok and updates >= 1 and seqs % updates == 0:
        per_update = seqs // updates
        if per_update % (par.dp * par.micro_batch_size):
            out.append(ConfigIssue(f"{key}.parallel.micro_batch_size",
                                   f"an update's {per_update} sequences do not split into dp={par.dp} × "
                                   f"micro_batch_size={par.micro_batch_size}",
                                   f"choose dp · micro_batch_size dividing {per_update}"))


def _check_engines(i: int, agent: AgentConfig, cfg: HacpoConfig, out: list[ConfigIssue]) -> None:
    """Colocated engines use the trainer's GPUs: vLLM TP groups of T consecutive ranks on one node."""
    key, tp, world = f"agents[{i}].rollout", agent.rollout.tensor_parallel_size, agent.parallel.world_size
    if agent.rollout.refit_bucket_mb < 1:
        out.append(ConfigIssue(f"{key}.refit_bucket_mb", f"must be ≥ 1 (got {agent.rollout.refit_bucket_mb})",
                               "use e.g. 512"))
    if cfg.runtime.cluster.device != "cuda":
        return
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
    shares = algo.algorithm.shares_rollouts
    if shares and n < 2:
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
                                   f"learner ({'n·' if shares else ''}B·G)",
                                   "choose a divisor (or change batch_size / group_size)"))


def _check_resources(cfg: HacpoConfig, out: list[ConfigIssue]) -> None:
    cluster = cfg.runtime.cluster
    if cluster.gpu_memory_gib <= 0:
        out.append(ConfigIssue("runtime.cluster.gpu_memory_gib", f"must be > 0, got {cluster.gpu_memory_gib}",
                               "use the device's memory in GiB (H100 80 GB: 79.6)"))
    if cluster.host_memory_gib is not None and cluster.host_memory_gib <= 0:
        out.append(ConfigIssue("runtime.cluster.host_memory_gib", f"must be > 0 or null, got {cluster.host_memory_gib}",
                               "use one node's RAM in GiB (`free -g`), or null to skip the host check"))
    if cluster.device != "cuda":
        return
    if cluster.gpus_per_node < 1:
        out.append(ConfigIssue("runtime.cluster.gpus_per_node", f"must be ≥ 1 on cuda, got {cluster.gpus_per_node}",
                               "set it to the GPUs of one node, e.g. runtime.cluster.gpus_per_node=8"))
        return
    # the count is decided by each agent's layout (tp·pp·cp·dp trainer ranks, one GPU each, plus the engine's
    # tensor_parallel_size when it is not colocated) against num_nodes whole nodes of gpus_per_node
    gpus = cluster.num_nodes * cluster.gpus_per_node
    layouts = []
    for i, agent in enumerate(cfg.agents):
        par, roll = agent.parallel, agent.rollout
        engine = "" if roll.colocated else f" + rollout.tensor_parallel_size {roll.tensor_parallel_size}"
        layouts.append((f"agents[{i}].parallel tp·pp·cp·dp = {par.tp}·{par.pp}·{par.cp}·{par.dp}{engine}",
                        par.world_size + (0 if roll.colocated else roll.tensor_parallel_size)))
    need = sum(n for _, n in layouts)
    if need > gpus:
        nodes = -(-need // cluster.gpus_per_node)  # ⌈need / gpus_per_node⌉
        out.append(ConfigIssue("runtime.cluster.num_nodes",
                               f"the agents' layouts need {need} GPUs ({'; '.join(f'{text} = {n}' for text, n in layouts)})"
                               f" but runtime.cluster.num_nodes × gpus_per_node = {cluster.num_nodes} × "
                               f"{cluster.gpus_per_node} = {gpus}",
                               f"set runtime.cluster.num_nodes={nodes}, or shrink an agent's layout "
                               "(agents.<i>.parallel.tp/pp/dp; agents.<i>.rollout.colocated=true shares the trainer's GPUs)"))


def _check_runtime(rt: RuntimeConfig, out: list[ConfigIssue]) -> None:
    if rt.steps < 1:
        out.append(ConfigIssue("runtime.steps", "must be ≥ 1", "use a positive step count"))
    if rt.eval_samples < 0:
        out.append(ConfigIssue("runtime.eval_samples", "must be ≥ 0", "0 = greedy only, or e.g. 8"))
    for key in ("collective_timeout_s", "call_timeout_s", "lock_stale_s"):
        if getattr(rt, key) <= 0:
            out.append(ConfigIssue(f"runtime.{key}", "must be > 0 seconds", "use e.g. 1800"))
    if rt.stop_margin_s < 0:
        out.append(ConfigIssue("runtime.stop_margin_s", f"must be ≥ 0 seconds, got {rt.stop_margin_s}",
                               "use e.g. 300 (the shutdown after the last save)"))
    if rt.stop_by is not None:
        try:
            datetime.fromisoformat(rt.stop_by.strip().replace("Z", "+00:00"))
        except ValueError:
            out.append(ConfigIssue("runtime.stop_by", f"{rt.stop_by!r} is not an ISO 8601 date and time",
                                   "e.g. runtime.stop_by=2026-07-01T18:00 (local time) or 2026-07-01T18:00+02:00"))
    for key, meaning in (("checkpoint_interval", "0 = only at the end"), ("eval_interval", "0 = only at start and end"),
                         ("keep_checkpoints", "0 = keep every one")):
        if getattr(rt, key) < 0:
            out.append(ConfigIssue(f"runtime.{key}", f"must be ≥ 0, got {getattr(rt, key)}", f"use e.g. 5 ({meaning})"))
    if "wandb" in rt.logging:
        if importlib.util.find_spec("wandb") is None:
            out.append(ConfigIssue("runtime.logging", "'wandb' is listed but the wandb package is not installed",
                                   "pip install wandb, or drop wandb from runtime.logging"))
        if not rt.wandb_project:
            out.append(ConfigIssue("runtime.wandb_project", "must be set when runtime.logging has wandb",
                                   "pass runtime.wandb_project=<project>"))


def _check_prompts(cfg: HacpoConfig, out: list[ConfigIssue]) -> None:
    """Each data set's prompt template and answer format (the reward function is imported at start-up:
    `planning.plan.startup_checks`)."""
    for split in ("train", "eval"):
        ds = getattr(cfg.data, split)
        if (count := ds.prompt_template.count(QUESTION)) != 1:
            out.append(ConfigIssue(f"data.{split}.prompt_template", f"holds {QUESTION} {count} times; it must hold "
                                   "it exactly once (where the question goes)",
                                   f"e.g. '{QUESTION}\\nAnswer with the final number in \\boxed{{}}.'"))
        if ds.answer_format != "plain" and ds.source not in ("jsonl", "parquet"):
            out.append(ConfigIssue(f"data.{split}.answer_format", f"applies to a jsonl or parquet file, not to "
                                   f"source '{ds.source}' (which reads its answers itself)", "leave it at plain"))
    if not 0.0 <= cfg.data.max_invalid_gold_share <= 1.0:
        out.append(ConfigIssue("data.max_invalid_gold_share", f"must lie in [0, 1], got "
                               f"{cfg.data.max_invalid_gold_share}", "use e.g. 0.05"))


def validate(raw: Any) -> HacpoConfig:
    """Turn a composed config (DictConfig or plain dict) into a `HacpoConfig`, or raise `ConfigError`."""
    written = None  # the YAML as written, `${oc.env:…}` unresolved: which environment variable a `???` came from
    try:
        from omegaconf import DictConfig, OmegaConf
        if isinstance(raw, DictConfig):
            written = OmegaConf.to_container(raw, resolve=False)
            raw = OmegaConf.to_container(raw, resolve=True, throw_on_missing=False)
    except ImportError:  # pragma: no cover - hydra is a core dependency
        pass
    issues = _missing_issues(raw, written)
    if issues:
        raise ConfigError(issues)
    cfg = from_plain(HacpoConfig, raw, "", issues)
    if issues:
        raise ConfigError(issues)
    if cfg.algo.name not in ALGORITHMS:  # every later rule asks the algorithm's registry entry
        raise ConfigError([ConfigIssue("algo.name", f"unknown algorithm {cfg.algo.name!r}",
                                       f"choose one of {sorted(ALGORITHMS)} (conf/algo/<name>.yaml)")])
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
    _check_prompts(cfg, issues)
    if cfg.warmstart.enabled and (cfg.warmstart.steps < 1 or cfg.warmstart.batch_size < 1 or cfg.warmstart.lr <= 0):
        issues.append(ConfigIssue("warmstart", "steps and batch_size must be ≥ 1 and lr > 0", "fix the warm start"))
    _check_warm_start_shares("warmstart", cfg.warmstart, issues)
    for i, agent in enumerate(cfg.agents):
        own = agent.warmstart
        if own.steps is not None and own.steps < 1:
            issues.append(ConfigIssue(f"agents[{i}].warmstart.steps", f"must be ≥ 1, got {own.steps}",
                                      "use e.g. 100, or null for the run's warmstart.steps"))
        if any(value is not None for value in dataclasses.asdict(own).values()):
            effective = dataclasses.replace(cfg.warmstart, **{k: v for k, v in dataclasses.asdict(own).items()
                                                               if v is not None})
            _check_warm_start_shares(f"agents[{i}].warmstart", effective, issues)
    if cfg.reward.timeout_s <= 0:
        issues.append(ConfigIssue("reward.timeout_s", "must be > 0", "use e.g. 5.0"))
    if cfg.reward.num_workers < 0:
        issues.append(ConfigIssue("reward.num_workers", f"must be ≥ 0, got {cfg.reward.num_workers}",
                                  "0 scores in the driver; use e.g. 2 worker processes"))
    if cfg.reward.max_response_chars < 1:
        issues.append(ConfigIssue("reward.max_response_chars", f"must be ≥ 1, got {cfg.reward.max_response_chars}",
                                  "use e.g. 16384 (responses keep their last this many characters)"))
    if cfg.reward.worker_memory_mb is not None and cfg.reward.worker_memory_mb < MIN_REWARD_WORKER_MB:
        issues.append(ConfigIssue("reward.worker_memory_mb",
                                  f"must be ≥ {MIN_REWARD_WORKER_MB} (MB) or null, got {cfg.reward.worker_memory_mb}",
                                  "use e.g. 2048, or null for no limit"))
    for split in ("train", "eval"):
        ds = getattr(cfg.data, split)
        if ds.source in ("jsonl", "parquet") and not ds.path:
            issues.append(ConfigIssue(f"data.{split}.path", f"source '{ds.source}' needs a path", "set a local file path"))
        if ds.limit is not None and ds.limit < 1:
            issues.append(ConfigIssue(f"data.{split}.limit", f"must be ≥ 1 or null, got {ds.limit}",
                                      "null uses every problem; e.g. 100 keeps the first 100"))
        if ds.source == "arithmetic" and ds.size < 1:
            issues.append(ConfigIssue(f"data.{split}.size", f"must be ≥ 1, got {ds.size}", "use e.g. 2000"))
        if ds.source == "arithmetic" and (not ds.levels or any(lv not in (1, 2, 3, 4) for lv in ds.levels)):
            issues.append(ConfigIssue(f"data.{split}.levels", f"levels {list(ds.levels)} must be a non-empty subset of 1..4",
                                      "use e.g. [1, 2, 3]"))
        if ds.source == "arithmetic":
            issues += [ConfigIssue(f"data.{split}.numbers", problem, "widen the range (defaults: ArithmeticNumbers)")
                       for problem in ds.numbers.problems()]
    if issues:
        raise ConfigError(issues)
    return cfg


MIN_REWARD_WORKER_MB = 256
"""The least `reward.worker_memory_mb` (added to a reward process's start: math-verify and sympy are imported by
then; scoring the start-up check's answer adds ~1 MB, measured)."""
_ENV_READ = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)")
"""An OmegaConf environment read, `${oc.env:NAME}` or `${oc.env:NAME,default}`: group 1 is the variable."""


def _find_missing(node: Any, written: Any, key: str) -> list[tuple[str, str | None]]:
    """(key, environment variable or None) of every OmegaConf `???` (mandatory value) placeholder; `written` is
    the same node before interpolation, where `${oc.env:NAME,???}` says which variable was not set."""
    if node == "???":
        env = _ENV_READ.search(written) if isinstance(written, str) else None
        return [(key, env.group(1) if env else None)]
    if isinstance(node, dict):
        written = written if isinstance(written, dict) else {}
        return [found for k, v in node.items()
                for found in _find_missing(v, written.get(k), f"{key}.{k}" if key else str(k))]
    if isinstance(node, list):
        written = written if isinstance(written, list) and len(written) == len(node) else [None] * len(node)
        return [found for i, v in enumerate(node) for found in _find_missing(v, written[i], f"{key}[{i}]")]
    return []


def _missing_issues(raw: Any, written: Any) -> list[ConfigIssue]:
    """Mandatory values left unset: one issue per unset environment variable (naming every key the config reads
    from it: pair_large's checkpoints and data come from `HACPO_*`), one per other key."""
    by_env: dict[str, list[str]] = {}
    issues = []
    for key, env in _find_missing(raw, written, ""):
        if env is not None:
            by_env.setdefault(env, []).append(key)
        else:
            issues.append(ConfigIssue(key, "mandatory value is not set", f"pass {override_key(key)}=..."))
    for env, keys in by_env.items():
        issues.append(ConfigIssue(env, f"environment variable not set; the config reads {', '.join(keys)} from it",
                                  f"export {env}=... before the command, or pass "
                                  + " ".join(f"{override_key(key)}=..." for key in keys)))
    return issues


# ------------------------------------------------------------------------------- what a training run touches
def run_path_issues(cfg: HacpoConfig) -> list[ConfigIssue]:
    """The files a training run reads and the directory it writes, checked before it creates anything: every
    jsonl/parquet data file exists, and `runtime.output_dir` is a directory this process can write (or can be made
    one). Not part of `validate`: `--plan`, `--cfg job` and a finished run's saved config (`load_run_config`) read no
    data and write no output — a cluster is sized before the data is copied."""
    issues: list[ConfigIssue] = []
    for split in ("train", "eval"):
        ds = getattr(cfg.data, split)
        if ds.source in ("jsonl", "parquet") and ds.path:
            resolved = Path(ds.path).expanduser().resolve()  # as `data.loaders.read_records` reads it
            if not resolved.is_file():
                what = "a directory" if resolved.is_dir() else "not found"
                issues.append(ConfigIssue(f"data.{split}.path", f"no {ds.source} file at {resolved} ({what}; given as "
                                          f"{ds.path!r}, nothing is downloaded)",
                                          f"point data.{split}.path at a local {ds.source} file"))
    _check_output_dir(cfg.runtime.output_dir, issues)
    return issues


def _check_output_dir(output_dir: str, out: list[ConfigIssue]) -> None:
    """`runtime.output_dir` (relative: to the working directory, as the run opens it) exists as a directory, or its
    nearest existing ancestor is one, and a directory can be made there. Permission bits do not stop root, nor tell
    a read-only or virtual file system (/sys), so a directory is made there and removed at once."""
    target = Path(os.path.abspath(output_dir))
    existing = next(p for p in (target, *target.parents) if os.path.exists(p))  # the root always exists
    made = "" if existing == target else f" (the run would create {target} inside it)"
    if not existing.is_dir():
        out.append(ConfigIssue("runtime.output_dir", f"{existing} is a file, not a directory{made}",
                               "choose a directory path (it is created when missing), or move the file away"))
        return
    if not os.access(existing, os.W_OK | os.X_OK):
        why = "permission denied"
    else:
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".hacpo-write-check-", dir=existing))
            return
        except OSError as err:
            why = (err.strerror or str(err)).lower()
    out.append(ConfigIssue("runtime.output_dir", f"{existing} is not writable by this process{made}: {why}",
                           "choose a directory this process can write (e.g. on the shared file system), or fix "
                           "its permissions"))

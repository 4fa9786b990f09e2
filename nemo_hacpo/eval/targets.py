"""What to evaluate: agents (a finished run's HF exports or `name=dir` checkpoints) and datasets by name or path.

A finished training run (`runtime.output_dir`) holds

    <run>/config.yaml          the resolved training config (`config.load_run_config`)
    <run>/hf/<agent>/          each agent's HF checkpoint at the end of training (weights, config.json, tokenizer)

Datasets: `heldout` (the run's — or the given config's — `data.eval` split), `gsm8k` / `aime2025` (the `eval`
extra's packaged benchmarks), or a local JSONL / parquet file read with a field mapping
(`{"question": "problem", "answer": "solution"}`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nemo_hacpo.config import (
    AgentConfig,
    ConfigIssue,
    DataConfig,
    DatasetConfig,
    HacpoConfig,
    ModelSource,
    PrecisionConfig,
    RewardConfig,
    RolloutConfig,
    TokenizerConfig,
    load_run_config,
)
from nemo_hacpo.data import MathProblem
from nemo_hacpo.data.loaders import BENCHMARKS, load_problems
from nemo_hacpo.data.prompts import PromptFormat
from nemo_hacpo.data.splits import load_split
from nemo_hacpo.data.validation import DataError, Policy

__all__ = [
    "FIELD_KEYS", "HELDOUT", "RUN_HF_DIR", "AgentTarget", "DatasetTarget", "default_agent_config", "load_dataset",
    "model_targets", "parse_field_mapping", "run_targets", "with_lengths",
]

RUN_HF_DIR = "hf"
"""Sub-directory of a run holding `<agent>/` HF checkpoints."""
HELDOUT = "heldout"
"""Dataset name of the config's held-out split (`data.eval`)."""
FIELD_KEYS = ("question", "answer", "id", "level", "solution")
"""Fields a local file's mapping may name (`--field question=problem`)."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class AgentTarget:
    """One checkpoint to evaluate and the engine settings to run it with."""

    name: str
    """Label in tables and file names."""
    agent: AgentConfig
    """Engine settings (lengths, rollout, dtype, chat template); `model` points at `model_dir`."""
    model_dir: Path
    """HF checkpoint directory."""
    tokenizer_dir: Path | None
    """Tokenizer directory; None = the agent's configured tokenizer (`agent.tokenizer.source`)."""


@dataclass(frozen=True)
class DatasetTarget:
    """A named problem list."""

    name: str
    problems: list[MathProblem]
    origin: str
    """Where it came from (a benchmark name, the config split, or the file's absolute path)."""


def check_golds(problems: list[MathProblem], what: str, policy: Policy, reward: RewardConfig,
                max_share: float = DataConfig.max_invalid_gold_share, answer_key: str | None = None
                ) -> list[MathProblem]:
    """`problems` whose gold answer math-verify can read (`rewards.math.gold_problem`) and is not a GSM8K-style
    solution (`… #### 72`: math-verify would compare the whole solution with the answer); the others are invalid
    records under `policy` (`data.on_invalid`), and above `max_share` of the set a `DataError` whatever the policy.

    `what` names the set (`data.train`), `answer_key` the setting that says where golds are read from (its fix
    names it). Nothing is checked when `reward.function` scores instead of math-verify (it reads golds its way)."""
    from nemo_hacpo.data.validation import DataIssue, apply_policy
    from nemo_hacpo.rewards.math import DEFAULT_LIMITS, gold_problem

    if reward.function is not None or not problems:
        return problems
    issues = []
    for problem in problems:
        note = ("a GSM8K-style solution: its final answer follows '####'" if "####" in problem.answer else
                gold_problem(problem.answer, DEFAULT_LIMITS, reward.timeout_s))
        if note is not None:
            issues.append(DataIssue(problem.origin or problem.id, f"gold answer {problem.answer[-60:]!r} cannot be "
                                    f"verified ({note})", problem_id=problem.id))
    if issues and (policy == "error" or len(issues) > max_share * len(problems)):
        share = len(issues) / len(problems)
        key = answer_key or f"{what}.answer_field"
        shown = "; ".join(str(issue) for issue in issues[:5]) + (f" (+{len(issues) - 5} more)" if len(issues) > 5
                                                                  else "")
        fix = (f"point {key} at the final answer alone (72, \\frac{{1}}{{2}}); GSM8K-style solutions ('… #### 72'): "
               f"{what}.answer_format=gsm8k" if what.startswith("data.") else
               "map the answer column to the final answer alone (--field answer=...)")
        if policy == "skip":
            fix += f" (more than data.max_invalid_gold_share = {max_share:g} of the set: skipping would hide it)"
        else:
            fix += "; or drop such records: data.on_invalid=skip"
        raise DataError([ConfigIssue(what, f"{len(issues)} of {len(problems)} gold answers ({share:.0%}) cannot be "
                                     f"read by math-verify, every answer to them would score 0: {shown}", fix)])
    return apply_policy(problems, issues, policy, what)


# ------------------------------------------------------------------------------------------------ agents
def check_prompt_lengths(datasets: list[DatasetTarget], targets: list[AgentTarget], prompt_format: PromptFormat | None = None,
                         on_invalid: Policy = "error") -> list[DatasetTarget]:
    """The datasets with every prompt checked against every target's `max_prompt_length` in its own tokenizer
    and chat template — the check a training run makes of its data — under the `on_invalid` policy."""
    from nemo_hacpo.data.validation import apply_policy
    from nemo_hacpo.models.chat import prompt_length_issues
    from nemo_hacpo.models.tokenizers import load_tokenizer

    agents = []
    for target in targets:
        source = target.tokenizer_dir or target.agent.tokenizer.source
        agents.append((target.name, load_tokenizer(source), target.agent.tokenizer.chat_template,
                       target.agent.max_prompt_length))
    checked = []
    for dataset in datasets:
        issues = prompt_length_issues(dataset.problems, agents, prompt_format)
        problems = apply_policy(dataset.problems, issues, on_invalid, f"dataset {dataset.name}")
        checked.append(dataclasses.replace(dataset, problems=problems))
    return checked


def _has_tokenizer(directory: Path) -> bool:
    return any((directory / name).is_file() for name in TOKENIZER_FILES)


def _check_checkpoint(model_dir: Path, what: str) -> None:
    if not model_dir.is_dir():
        raise FileNotFoundError(f"{what}: no checkpoint directory at {model_dir.resolve()}")
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{what}: {model_dir.resolve()} has no config.json (an HF checkpoint directory "
                                "holds config.json and the safetensors weights)")


STANDALONE_GPU_MEMORY_UTILIZATION = 0.92
"""What `rollout.gpu_memory_utilization: auto` means for an evaluation engine, alone on its GPUs: vLLM's own
default (`vllm/config/cache.py`: 0.92 in vLLM 0.32)."""


def _as_hf(agent: AgentConfig, name: str, model_dir: Path) -> AgentConfig:
    """The agent served from `model_dir`; `auto` engine memory (sized next to a trainer) becomes the standalone
    engine's default."""
    rollout = agent.rollout
    if rollout.gpu_memory_utilization == "auto":
        rollout = dataclasses.replace(rollout, gpu_memory_utilization=STANDALONE_GPU_MEMORY_UTILIZATION)
    return dataclasses.replace(agent, name=name, model=ModelSource(source="hf", path=str(model_dir)), rollout=rollout)


def run_targets(run_dir: str | Path, agents: Sequence[str] = ()) -> tuple[HacpoConfig, list[AgentTarget]]:
    """The run's config and its agents' final HF checkpoints (`<run>/hf/<agent>`), all or the named ones.

    The tokenizer is the one saved next to the weights when present, else the agent's configured one.

    Raises:
        FileNotFoundError: no `<run>/config.yaml`, or an agent's checkpoint is missing (naming the path).
        KeyError: an agent name the run does not have.
    """
    run = Path(run_dir)
    cfg = load_run_config(run / "config.yaml")
    names = [a.name for a in cfg.agents]
    unknown = [name for name in agents if name not in names]
    if unknown:
        raise KeyError(f"run {run.resolve()} has no agent {unknown}; its agents: {names}")
    targets = []
    for agent in cfg.agents:
        if agents and agent.name not in agents:
            continue
        model_dir = run / RUN_HF_DIR / agent.name
        _check_checkpoint(model_dir, f"agent {agent.name!r} of run {run}")
        targets.append(AgentTarget(agent.name, _as_hf(agent, agent.name, model_dir), model_dir,
                                   model_dir if _has_tokenizer(model_dir) else None))
    return cfg, targets


def default_agent_config(name: str, model_dir: str | Path, device: str = "cpu") -> AgentConfig:
    """Engine settings for a checkpoint without a config: its own tokenizer and chat template, 256 + 256 tokens,
    fp32 and eager mode on CPU (bf16 on CUDA), the remaining fields at their `AgentConfig` defaults."""
    return AgentConfig(name=name, model=ModelSource(source="hf", path=str(model_dir)),
                       tokenizer=TokenizerConfig(source="model"),
                       precision=PrecisionConfig(dtype="fp32" if device == "cpu" else "bf16"),
                       rollout=RolloutConfig(enforce_eager=device == "cpu"))


def _parse_model_spec(spec: str) -> tuple[str, Path]:
    name, sep, path = spec.partition("=")
    if not sep:
        directory = Path(spec)
        return directory.resolve().name, directory
    if not name or not path:
        raise ValueError(f"--model {spec!r}: expected NAME=DIR")
    return name, Path(path)


def model_targets(specs: Sequence[str], *, cfg: HacpoConfig | None = None, agent: str | None = None,
                  device: str = "cpu") -> list[AgentTarget]:
    """Checkpoints given as `NAME=DIR` (or `DIR`, named after its folder).

    Engine settings: with `cfg`, the agent named `agent`, else the config's agent called NAME; without a
    config, `default_agent_config`. The tokenizer is the checkpoint's own when it has one, else the agent's.

    Raises:
        FileNotFoundError: a missing directory / config.json, or no tokenizer anywhere (naming the path).
        KeyError: `agent` (or NAME, when `agent` is not given) is not an agent of `cfg`.
        ValueError: a malformed spec or a repeated NAME.
    """
    targets: list[AgentTarget] = []
    for spec in specs:
        name, model_dir = _parse_model_spec(spec)
        if any(t.name == name for t in targets):
            raise ValueError(f"--model {spec!r}: the name {name!r} is used twice; give each model its own NAME=")
        _check_checkpoint(model_dir, f"model {name!r}")
        if cfg is not None:
            base = cfg.agent(agent if agent is not None else name)
            agent_cfg = _as_hf(base, name, model_dir)
        elif agent is not None:
            raise ValueError(f"--agent {agent!r} needs --config-name (the config that defines the agent)")
        else:
            agent_cfg = default_agent_config(name, model_dir, device)
        tokenizer_dir = model_dir if _has_tokenizer(model_dir) else None
        if tokenizer_dir is None and agent_cfg.tokenizer.source == "model":
            raise FileNotFoundError(f"model {name!r}: no tokenizer files ({', '.join(TOKENIZER_FILES)}) in "
                                    f"{model_dir.resolve()}; add them, or pass --config-name/--agent to use an "
                                    "agent's tokenizer")
        targets.append(AgentTarget(name, agent_cfg, model_dir, tokenizer_dir))
    return targets


def with_lengths(target: AgentTarget, max_prompt_length: int | None = None,
                 max_response_length: int | None = None) -> AgentTarget:
    """`target` with its prompt / response token limits replaced (None keeps the configured one)."""
    changes = {key: value for key, value in (("max_prompt_length", max_prompt_length),
                                             ("max_response_length", max_response_length)) if value is not None}
    for key, value in changes.items():
        if value < 1:
            raise ValueError(f"{key} must be ≥ 1, got {value}")
    return dataclasses.replace(target, agent=dataclasses.replace(target.agent, **changes)) if changes else target


# ---------------------------------------------------------------------------------------------- datasets
def parse_field_mapping(items: Sequence[str]) -> dict[str, str]:
    """`["question=problem", "answer=solution"]` → `{"question": "problem", "answer": "solution"}`.

    Raises:
        ValueError: an item without `=`, or a key outside `FIELD_KEYS`.
    """
    mapping: dict[str, str] = {}
    for item in items:
        key, sep, field = item.partition("=")
        if not sep or not key or not field:
            raise ValueError(f"--field {item!r}: expected KEY=FIELD, e.g. question=problem")
        if key not in FIELD_KEYS:
            raise ValueError(f"--field {item!r}: unknown key {key!r}; use one of {list(FIELD_KEYS)}")
        mapping[key] = field
    return mapping


def load_dataset(spec: str, *, heldout: DatasetConfig | None = None, fields: Mapping[str, str] | None = None,
                 limit: int | None = None, on_invalid: Policy = "error") -> DatasetTarget:
    """`heldout`, a benchmark name (`gsm8k`, `aime2025`) or a local .jsonl/.json/.parquet path.

    `heldout` uses the given split config (default: `DataConfig().eval`, 200 generated problems, seed 1).
    `fields` maps question/answer/id/level/solution to a local file's columns (dotted names reach into nested
    records). `limit` keeps the first N problems. Bad records follow `on_invalid` (`data.validation`): `error`
    names each with its file and line (and says to map the columns with --field), `skip` drops them.

    Raises:
        FileNotFoundError: neither a known name nor an existing file (naming the path looked at).
        DataError: bad records under the `error` policy.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be ≥ 1, got {limit}")
    fields = dict(fields or {})
    if spec == HELDOUT:
        split = heldout if heldout is not None else DataConfig().eval
        problems, name, origin = load_split(split, "eval", on_invalid), HELDOUT, f"data.eval ({split.source})"
    elif spec in BENCHMARKS:
        problems, name, origin = BENCHMARKS[spec](on_invalid), spec, spec
    else:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"dataset {spec!r} is not one of {[HELDOUT, *BENCHMARKS]} and no file exists "
                                    f"at {path.resolve()}")
        try:
            problems = load_problems(path, question_field=fields.get("question", "question"),
                                     answer_field=fields.get("answer", "answer"), id_field=fields.get("id"),
                                     level_field=fields.get("level"), solution_field=fields.get("solution"),
                                     on_invalid=on_invalid, what=f"dataset {path.stem}")
        except DataError as err:
            hint = ConfigIssue("--field", "the columns may have other names",
                               f"map them with --field KEY=COLUMN (keys: {', '.join(FIELD_KEYS)})")
            raise DataError([*err.issues, hint]) from err
        name, origin = path.stem, str(path.resolve())
    if not problems:
        raise ValueError(f"dataset {spec!r} has no problems")
    return DatasetTarget(name=name, problems=problems[:limit] if limit else problems, origin=origin)

"""Checks that need the agents' files (tokenizers, checkpoint configs) and run before anything starts.

`config.validate` checks the config on its own; these read what it points at. Every problem is a `ConfigIssue`
naming the key, raised together as one `ConfigError`:

- the tokenizer source is a known name or a local tokenizer directory;
- a local tokenizer directory holds a vocabulary file (`tokenizer.json`, `tokenizer.model`, `vocab.json` +
  `merges.txt`, `vocab.txt`): an HF checkpoint copied without them fails deep inside transformers otherwise
  ("Couldn't instantiate the backend tokenizer …");
- the tokenizer's ids fit the model's embedding rows (an HF checkpoint's `vocab_size`): a larger tokenizer
  would index past the embedding the moment it samples a high id.

`check_agents(cfg, vocabulary_optional=True)` (the `--plan` dry run, which sizes a cluster from config.json alone
before the weights are copied) reports a missing vocabulary as a note and skips the vocabulary check.
"""

from __future__ import annotations

import json
from pathlib import Path

from nemo_hacpo.config import AgentConfig, ConfigError, ConfigIssue, HacpoConfig


def tokenizer_source(agent: AgentConfig) -> str:
    """Where the agent's tokenizer comes from: its `tokenizer.source`, or the HF checkpoint for `model`."""
    source = agent.tokenizer.source
    return agent.model.path if source == "model" and agent.model.path else source


VOCABULARY_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"), ("vocab.txt",),
                    ("spiece.model",))
"""Any one of these sets of files lets transformers' AutoTokenizer build a tokenizer from a directory."""


def missing_vocabulary(directory: str | Path) -> str | None:
    """None when `directory` holds a vocabulary (`VOCABULARY_FILES`), else what it lacks, in words."""
    path = Path(directory)
    if any(all((path / name).is_file() for name in names) for names in VOCABULARY_FILES):
        return None
    wanted = ", ".join(" + ".join(names) for names in VOCABULARY_FILES)
    return f"{path} has no tokenizer files (none of: {wanted})"


def agent_issues(i: int, agent: AgentConfig, notes: list[str] | None = None) -> list[ConfigIssue]:
    """The problems of agent `i`'s tokenizer and checkpoint. With `notes` (a list), a directory without
    vocabulary files is a note appended there, and the checks that need the vocabulary are skipped."""
    from nemo_hacpo.models.tokenizers import load_tokenizer, tokenizer_path

    key = f"agents[{i}]"
    if agent.tokenizer.source == "model" and agent.model.source != "hf":
        return [ConfigIssue(f"{key}.tokenizer.source", "'model' means the HF checkpoint's own tokenizer, but the "
                            f"model source is {agent.model.source!r}", "name a tokenizer (e.g. tiny-bpe) or a directory")]
    try:
        directory = tokenizer_path(tokenizer_source(agent))
    except FileNotFoundError as err:
        return [ConfigIssue(f"{key}.tokenizer.source", str(err), "use a known name or a local tokenizer directory")]
    lacking = missing_vocabulary(directory)
    if lacking is not None:
        if notes is not None and agent.model.source == "hf":
            notes.append(f"agent {agent.name!r}: {lacking}; its vocabulary check (tokenizer ids ≤ embedding rows) "
                         "was skipped — the plan reads only config.json")
            return []
        return [ConfigIssue(f"{key}.tokenizer.source", lacking, "copy the checkpoint's tokenizer files next to its "
                            "config.json, or point tokenizer.source at a directory that has them")]
    if agent.model.source == "tiny":  # its embedding is sized from its tokenizer; it must have an HF family (vLLM)
        from nemo_hacpo.models.architecture import arch_from_tiny
        from nemo_hacpo.models.hf_layouts import check_convertible

        try:
            check_convertible(arch_from_tiny(agent.model.tiny, len(load_tokenizer(tokenizer_source(agent)))))
        except ValueError as err:
            return [ConfigIssue(f"{key}.model.tiny", str(err), "match Llama/Qwen3 (RMSNorm, SwiGLU, RoPE) or GPT-2 "
                                "(LayerNorm, GELU, learned positions, biases, MHA)")]
        return []
    if agent.model.source != "hf" or not agent.model.path:
        return []
    config = Path(agent.model.path) / "config.json"
    try:
        rows = json.loads(config.read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError) as err:
        return [ConfigIssue(f"{key}.model.path", f"{config} is unreadable ({err})", "point at an HF checkpoint")]
    try:
        ids = len(load_tokenizer(tokenizer_source(agent)))
    except (OSError, ValueError) as err:  # a present but unloadable tokenizer: say which directory
        return [ConfigIssue(f"{key}.tokenizer.source", f"cannot load the tokenizer in {directory}: {err}",
                            "point tokenizer.source at a complete HF tokenizer directory")]
    if isinstance(rows, int) and ids > rows:
        return [ConfigIssue(f"{key}.tokenizer.source", f"the tokenizer has {ids} ids but the model's embedding has "
                            f"{rows} rows ({config})", "use the checkpoint's own tokenizer (source: model)")]
    return []


def check_agents(cfg: HacpoConfig, *, vocabulary_optional: bool = False) -> list[str]:
    """Raise one ConfigError with every problem of every agent's tokenizer and checkpoint; returns the notes of
    what was skipped (`vocabulary_optional`: an HF checkpoint without tokenizer files, see the module docstring)."""
    notes: list[str] | None = [] if vocabulary_optional else None
    issues = [issue for i, agent in enumerate(cfg.agents) for issue in agent_issues(i, agent, notes)]
    if issues:
        raise ConfigError(issues)
    return notes or []

"""Checks that need the agents' files (tokenizers, checkpoint configs) and run before anything starts.

`config.validate` checks the config on its own; these read what it points at. Every problem is a `ConfigIssue`
naming the key, raised together as one `ConfigError`:

- the tokenizer source is a known name or a local tokenizer directory;
- the tokenizer's ids fit the model's embedding rows (an HF checkpoint's `vocab_size`): a larger tokenizer
  would index past the embedding the moment it samples a high id.
"""

from __future__ import annotations

import json
from pathlib import Path

from nemo_hacpo.config import AgentConfig, ConfigError, ConfigIssue, HacpoConfig


def tokenizer_source(agent: AgentConfig) -> str:
    """Where the agent's tokenizer comes from: its `tokenizer.source`, or the HF checkpoint for `model`."""
    source = agent.tokenizer.source
    return agent.model.path if source == "model" and agent.model.path else source


def agent_issues(i: int, agent: AgentConfig) -> list[ConfigIssue]:
    from nemo_hacpo.models.tokenizers import load_tokenizer, tokenizer_path

    key = f"agents[{i}]"
    if agent.tokenizer.source == "model" and agent.model.source != "hf":
        return [ConfigIssue(f"{key}.tokenizer.source", "'model' means the HF checkpoint's own tokenizer, but the "
                            f"model source is {agent.model.source!r}", "name a tokenizer (e.g. tiny-bpe) or a directory")]
    try:
        tokenizer_path(tokenizer_source(agent))
    except FileNotFoundError as err:
        return [ConfigIssue(f"{key}.tokenizer.source", str(err), "use a known name or a local tokenizer directory")]
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
    ids = len(load_tokenizer(tokenizer_source(agent)))
    if isinstance(rows, int) and ids > rows:
        return [ConfigIssue(f"{key}.tokenizer.source", f"the tokenizer has {ids} ids but the model's embedding has "
                            f"{rows} rows ({config})", "use the checkpoint's own tokenizer (source: model)")]
    return []


def check_agents(cfg: HacpoConfig) -> None:
    """Raise one ConfigError with every problem of every agent's tokenizer and checkpoint."""
    issues = [issue for i, agent in enumerate(cfg.agents) for issue in agent_issues(i, agent)]
    if issues:
        raise ConfigError(issues)

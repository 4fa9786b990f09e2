"""Held-out accuracy of every agent: greedy decoding (avg@1) on the eval split, scored by the verifier."""

from __future__ import annotations

from nemo_hacpo.config import HacpoConfig
from nemo_hacpo.data import MathProblem, problem_to_messages


def evaluate_agents(groups, problems: list[MathProblem], cfg: HacpoConfig) -> dict[str, float]:
    """`{agent: accuracy}` of greedy answers to `problems` (all agents generate at once)."""
    from nemo_hacpo.rewards import MathRewardScorer

    messages = [problem_to_messages(p, system_prompt=cfg.data.system_prompt) for p in problems]
    futures = {name: group.actors[0].generate.remote(messages, 1, True) for name, group in groups.items()}
    golds = [p.answer for p in problems]
    accuracy = {}
    with MathRewardScorer(num_workers=0, timeout_s=cfg.reward.timeout_s, strict=cfg.reward.strict) as scorer:
        for name, future in futures.items():
            generated = groups[name].get([future], "evaluate")[0]
            texts = [group[0]["text"] for group in generated["responses"]]
            accuracy[name] = scorer.score(texts, golds).accuracy
    return accuracy

"""HACPO algorithm core: pure tensor functions (no torch.distributed, no Ray, no config objects).

- :mod:`~nemo_hacpo.algo.registry` — what each algorithm is (`ALGORITHMS`): sharing, baseline, ω, loss (§8).
- :mod:`~nemo_hacpo.algo.capability` — rolling capability `P̂` and clipped ratios `ω(j→k)` (algorithm.md §1).
- :mod:`~nemo_hacpo.algo.advantages` — GRPO/GSPO group advantages, HACPO's capability-aware baseline (§2).
- :mod:`~nemo_hacpo.algo.ratios` — sequence mean log-probs, GSPO log-ratios, stepwise cross clip bound (§4–5).
- :mod:`~nemo_hacpo.algo.losses` — HACPO / GSPO / GRPO losses and the k3 KL estimator (§5–6).
- :mod:`~nemo_hacpo.algo.rows` — `TrainingRows`, one learner's rows for a step (what the losses are fed).

Section numbers refer to docs/algorithm.md.
"""

import importlib
from typing import Any

_HOMES = {
    "group_advantages": "advantages", "hacpo_advantages": "advantages", "hacpo_baseline": "advantages",
    "CapabilityTracker": "capability", "step_accuracy": "capability",
    "GRPO_AGGREGATIONS": "losses", "grpo_token_loss": "losses", "gspo_loss": "losses", "hacpo_loss": "losses",
    "low_var_kl": "losses",
    "cross_clip_lower": "ratios", "masked_token_sum": "ratios", "sequence_log_ratio": "ratios",
    "sequence_mean_logprob": "ratios",
    "ALGORITHMS": "registry", "Algorithm": "registry", "algorithm": "registry",
    "TrainingRows": "rows",
}
"""Each exported name's module. Imported on first use (PEP 562): `nemo_hacpo.algo.registry` — which the config
checks read — must not import torch, or every process that reads a config (the CLI, each spawned reward worker)
would pay ~1.2 s and, with a CUDA build of torch, ~2.5 GB of address space for it."""


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


__all__ = [
    "ALGORITHMS",
    "GRPO_AGGREGATIONS",
    "Algorithm",
    "CapabilityTracker",
    "TrainingRows",
    "algorithm",
    "cross_clip_lower",
    "group_advantages",
    "grpo_token_loss",
    "gspo_loss",
    "hacpo_advantages",
    "hacpo_baseline",
    "hacpo_loss",
    "low_var_kl",
    "masked_token_sum",
    "sequence_log_ratio",
    "sequence_mean_logprob",
    "step_accuracy",
]

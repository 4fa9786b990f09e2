"""HACPO algorithm core: pure tensor functions (no torch.distributed, no Ray, no config objects).

- :mod:`~nemo_hacpo.algo.registry` — what each algorithm is (`ALGORITHMS`): sharing, baseline, ω, loss (§8).
- :mod:`~nemo_hacpo.algo.capability` — rolling capability `P̂` and clipped ratios `ω(j→k)` (algorithm.md §1).
- :mod:`~nemo_hacpo.algo.advantages` — GRPO/GSPO group advantages, HACPO's capability-aware baseline (§2).
- :mod:`~nemo_hacpo.algo.ratios` — sequence mean log-probs, GSPO log-ratios, stepwise cross clip bound (§4–5).
- :mod:`~nemo_hacpo.algo.losses` — HACPO / GSPO / GRPO losses and the k3 KL estimator (§5–6).
- :mod:`~nemo_hacpo.algo.rows` — `TrainingRows`, one learner's rows for a step (what the losses are fed).

Section numbers refer to docs/algorithm.md.
"""

from nemo_hacpo.algo.advantages import group_advantages, hacpo_advantages, hacpo_baseline
from nemo_hacpo.algo.capability import CapabilityTracker, step_accuracy
from nemo_hacpo.algo.losses import GRPO_AGGREGATIONS, grpo_token_loss, gspo_loss, hacpo_loss, low_var_kl
from nemo_hacpo.algo.ratios import (
    cross_clip_lower,
    masked_token_sum,
    sequence_log_ratio,
    sequence_mean_logprob,
)
from nemo_hacpo.algo.registry import ALGORITHMS, Algorithm, algorithm
from nemo_hacpo.algo.rows import TrainingRows

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

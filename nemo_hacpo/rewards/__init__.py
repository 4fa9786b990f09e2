"""Math answer rewards: math-verify against a gold answer, with guards, timeouts and a process pool.

- :func:`score_math` / :func:`score_math_detailed`: one answer, in this process.
- :class:`MathRewardScorer`: batches in killable worker processes -> :class:`RewardBatch`.
- :class:`RewardReason`: why an answer scored what it did (every 0 is attributed).
"""

from nemo_hacpo.rewards.math import (
    DEFAULT_LIMITS,
    RewardReason,
    ScoredAnswer,
    VerifyLimits,
    score_math,
    score_math_detailed,
)
from nemo_hacpo.rewards.scorer import MathRewardScorer, RewardBatch, RewardPoolError

__all__ = [
    "DEFAULT_LIMITS",
    "MathRewardScorer",
    "RewardBatch",
    "RewardPoolError",
    "RewardReason",
    "ScoredAnswer",
    "VerifyLimits",
    "score_math",
    "score_math_detailed",
]

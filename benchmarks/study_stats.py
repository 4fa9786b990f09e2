"""The statistics of the sample-efficiency study (`sample_efficiency.py`): mean and sample std over seeds, the paired
t-test of two algorithms' final accuracies seed by seed, and how a mean ± std is printed. Plain Python, no torch."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Two-sided 95 % quantiles of Student's t, df = 1..30 (df > 30: 1.96).
T_CRIT_95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
             2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
             2.045, 2.042)


# ------------------------------------------------------------------------------------------ statistics
def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample std (n − 1) of `values`; std is nan for fewer than 2 values, both nan for none.

    mean_std([0.1, 0.2, 0.3]) == (0.2, 0.1)
    """
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def t_critical_95(df: int) -> float:
    """Two-sided 95 % critical value of Student's t with `df` degrees of freedom."""
    if df < 1:
        return math.nan
    return T_CRIT_95[df - 1] if df <= len(T_CRIT_95) else 1.96


@dataclass(frozen=True)
class PairedDifference:
    """Per-seed differences d_s = a_s − b_s over the seeds both have, and a paired t-test of mean(d) = 0.

    t = mean(d) / (std(d) / √n), df = n − 1; `significant` when |t| exceeds the two-sided 95 % critical value.
    """

    seeds: tuple[int, ...]
    differences: tuple[float, ...]
    mean: float
    std: float
    t: float
    significant: bool
    wins: int  # seeds with a_s > b_s
    losses: int  # seeds with a_s < b_s

    @property
    def interval_95(self) -> tuple[float, float]:
        """The 95 % confidence interval of mean(d): mean ± t_{0.975, n−1} · std / √n (nan for fewer than 2 seeds).

        d = (0.01, 0.03, 0.02): mean 0.02, std 0.01, t_{0.975, 2} = 4.303 → 0.02 ± 0.0248 = (−0.0048, 0.0448)
        """
        n = len(self.differences)
        if n < 2:
            return math.nan, math.nan
        half = t_critical_95(n - 1) * self.std / math.sqrt(n)
        return self.mean - half, self.mean + half


def paired_difference(a_by_seed: Mapping[int, float], b_by_seed: Mapping[int, float]) -> PairedDifference:
    """Paired comparison of two algorithms' final accuracies, seed by seed (seeds missing from either are left out)."""
    seeds = tuple(sorted(set(a_by_seed) & set(b_by_seed)))
    diffs = tuple(a_by_seed[s] - b_by_seed[s] for s in seeds)
    mean, std = mean_std(diffs)
    if len(diffs) < 2:
        t = math.nan
    elif std == 0.0:
        t = 0.0 if mean == 0.0 else math.copysign(math.inf, mean)
    else:
        t = mean / (std / math.sqrt(len(diffs)))
    significant = not math.isnan(t) and abs(t) > t_critical_95(len(diffs) - 1)
    return PairedDifference(seeds, diffs, mean, std, t, significant, sum(d > 0 for d in diffs),
                            sum(d < 0 for d in diffs))


def format_pm(mean: float, std: float, digits: int = 3) -> str:
    """`0.200 ± 0.100`; a missing std (one seed) shows as `n/a`, a missing mean as `-`."""
    if math.isnan(mean):
        return "-"
    spread = "n/a" if math.isnan(std) else f"{std:.{digits}f}"
    return f"{mean:.{digits}f} ± {spread}"

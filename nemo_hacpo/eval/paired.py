"""Did an agent's held-out accuracy change? McNemar's exact test on the same problems, before vs after.

With per-problem correctness before (x) and after (y), only the discordant problems carry information:
b = wrong → right, c = right → wrong. Under "no change" each discordant problem is a fair coin, so the exact
two-sided p-value is

    p = min(1, 2 · P[Binomial(b + c, 1/2) ≤ min(b, c)])

(p = 1 when b + c = 0). Example: b = 10, c = 2 → P[Bin(12, ½) ≤ 2] = (1 + 12 + 66) / 4096 = 0.019287,
p = 0.038574.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class McNemar:
    """The discordant counts and the exact two-sided p-value of before → after on the same problems."""

    gained: int
    """b: problems wrong before and right after."""
    lost: int
    """c: problems right before and wrong after."""
    p_value: float

    @property
    def improved(self) -> bool:
        """More gained than lost, at the 5 % level."""
        return self.gained > self.lost and self.p_value < 0.05


def mcnemar_exact(before: Sequence[int | bool], after: Sequence[int | bool]) -> McNemar:
    """McNemar's exact test of paired 0/1 outcomes (see the module docstring)."""
    if len(before) != len(after):
        raise ValueError(f"{len(before)} outcomes before but {len(after)} after: the test pairs the same problems")
    gained = sum(1 for x, y in zip(before, after, strict=True) if not x and y)
    lost = sum(1 for x, y in zip(before, after, strict=True) if x and not y)
    n = gained + lost
    if n == 0:
        return McNemar(0, 0, 1.0)
    tail = sum(math.comb(n, k) for k in range(min(gained, lost) + 1)) / 2 ** n
    return McNemar(gained, lost, min(1.0, 2 * tail))

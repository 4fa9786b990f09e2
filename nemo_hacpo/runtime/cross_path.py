"""Watching the cross path: which learners actually receive gradient from their partners' rollouts.

A cross sample gets zero gradient when its ratio s falls outside `[lo_u, 1]` (algorithm.md §5); when that holds
for every cross row, step after step, the learner trains on its own rollouts only (algorithm.md §9).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class CrossPathMonitor:
    """Names an agent whose cross samples have given no gradient for `patience` steps in a row.

    A cross sample gets zero gradient when its ratio s falls outside ``[lo_u, 1]`` (algorithm.md §5). When
    that holds for every cross row, step after step, the agent learns from its own rollouts only and the
    run is, for it, GSPO with HACPO's baseline: worth saying once, with the numbers, rather than leaving it
    to be found in `train/cross_zero_grad_frac`. Reads the step's metrics; returns the warnings it issues
    (at most one per agent per run).
    """

    def __init__(self, agents: Sequence[str], patience: int = 3):
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        self.patience = patience
        self.streak = {a: 0 for a in agents}
        self.warned: set[str] = set()

    def update(self, metrics: Mapping[str, float]) -> list[str]:
        messages = []
        for agent in self.streak:
            num_cross = metrics.get(f"{agent}/train/num_cross", 0.0)
            zero_frac = metrics.get(f"{agent}/train/cross_zero_grad_frac")
            if not num_cross or zero_frac is None:  # isolated modes, or no cross rows this step
                self.streak[agent] = 0
                continue
            self.streak[agent] = self.streak[agent] + 1 if zero_frac >= 1.0 else 0
            if self.streak[agent] >= self.patience and agent not in self.warned:
                self.warned.add(agent)
                ratio = metrics.get(f"{agent}/train/cross_ratio_mean", float("nan"))
                lower = metrics.get(f"{agent}/train/cross_clip_lower", float("nan"))
                messages.append(
                    f"{agent}: every cross sample got zero gradient for {self.streak[agent]} steps in a row "
                    f"(mean ratio s = {ratio:.3g}, clip range [{lower:.3g}, 1]); it learns from its own rollouts "
                    f"only. Its policy and its partners' are too far apart for the stepwise clip "
                    f"(docs/algorithm.md §9).")
        return messages

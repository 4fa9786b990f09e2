"""Watching the cross path: which learners actually receive gradient from their partners' rollouts.

A cross sample gets zero gradient when its ratio s falls outside `[lo_u, 1]` (algorithm.md §5); when that holds
for every cross row, step after step, the learner trains on its own rollouts only (algorithm.md §9).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from nemo_hacpo.training.loss_metrics import RowOutcome

DIRECTION_STATS = ("rows", "s_p10", "s_p50", "s_p90", "in_window_frac", "grad_frac", "grad_pos_frac",
                   "grad_neg_frac")
"""Per direction `<learner>/from/<source>/<stat>`: the rows of that source in the learner's training view, the
10/50/90 % quantiles of their ratio s (linear interpolation, as numpy's default), the share whose gradient no clip
stops (HACPO's cross objective: inside [lo_u, 1], not log-clamped; rows trained as the learner's own, under the
naive baselines: the PPO min takes the unclipped term), the share with a non-zero gradient (that, and A ≠ 0), and
that share split by the sign of the advantage (A > 0: pulled up, A < 0: pushed down)."""


def direction_metrics(learner: str, agents: Sequence[str], source: torch.Tensor, shared: torch.Tensor,
                      outcome: RowOutcome, advantages: torch.Tensor) -> dict[str, float]:
    """`{<learner>/from/<source>/<stat>: value}` for every other agent whose rows this learner trained on.

    `source [N]`, `shared [N]`, `advantages [N]`: the learner's `TrainingRows.source`, `~TrainingRows.is_own` (rows
    another agent sampled, whatever objective the algorithm gives them) and `.advantages`; `outcome`: what the
    trainer's loss saw on each row (`TrainMetrics.rows`), in the same order. Each row is trained once, at its
    update u, so s is the ratio that decided its gradient (algorithm.md §5).
    """
    ratio = torch.tensor(outcome.ratio, dtype=torch.float64)
    in_window = torch.tensor(outcome.in_window, dtype=torch.bool)
    gradient = torch.tensor(outcome.gradient, dtype=torch.bool)
    if not (len(ratio) == len(source) == len(shared) == len(advantages)):
        raise ValueError(f"{len(ratio)} row outcomes for {len(source)} rows")
    out: dict[str, float] = {}
    for j, name in enumerate(agents):
        if name == learner:
            continue
        rows = (source == j) & shared
        count = int(rows.sum())
        if count == 0:
            continue
        s = ratio[rows]
        p10, p50, p90 = torch.quantile(s, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
        live = gradient[rows]
        sign = advantages[rows]
        values = {"rows": float(count), "s_p10": p10, "s_p50": p50, "s_p90": p90,
                  "in_window_frac": float(in_window[rows].double().mean()), "grad_frac": float(live.double().mean()),
                  "grad_pos_frac": float((live & (sign > 0)).double().mean()),
                  "grad_neg_frac": float((live & (sign < 0)).double().mean())}
        out.update({f"{learner}/from/{name}/{key}": value for key, value in values.items()})
    return out


def _directions(records: Sequence[Mapping[str, float]], agents: Sequence[str]):
    """`(label, key prefix, the records of steps that logged the direction)` per direction that has any."""
    for learner in agents:
        for source in agents:
            prefix = f"{learner}/from/{source}/"
            steps = [r for r in records if f"{prefix}grad_frac" in r]
            if steps:
                yield f"{source} → {learner}", prefix, steps


def direction_table(records: Sequence[Mapping[str, float]], agents: Sequence[str]) -> list[dict[str, object]]:
    """One summary row per direction source → learner from the run's step records: s quantiles at the first and
    the last trained step, and the share of cross rows with non-zero gradient (first, mean over steps, last)."""
    table = []
    for label, prefix, steps in _directions(records, agents):
        first, last = steps[0], steps[-1]

        def quantiles(record, p=prefix):
            return " / ".join(f"{record[p + k]:.3g}" for k in ("s_p10", "s_p50", "s_p90"))

        grads = [r[f"{prefix}grad_frac"] for r in steps]
        table.append({"direction": label, "cross_rows": int(sum(r[f"{prefix}rows"] for r in steps)),
                      f"s p10/p50/p90 (step {int(first['step'])})": quantiles(first),
                      f"s p10/p50/p90 (step {int(last['step'])})": quantiles(last),
                      "grad_frac_first": grads[0], "grad_frac_mean": sum(grads) / len(grads),
                      "grad_frac_last": grads[-1]})
    return table


def plot_directions(records: Sequence[Mapping[str, float]], agents: Sequence[str], path, title: str = "",
                    clip_lower: float = 0.8):
    """`cross_path.png`: per direction, the median s with its p10–p90 band (log scale, the clip window's lower
    bound at u = 0, `clip_lower` = 1 − δ, and 1 drawn) and the share of cross rows with non-zero gradient, against the step."""
    from nemo_hacpo.reporting import pyplot, save_figure

    plt = pyplot()
    fig, (ax_s, ax_g) = plt.subplots(1, 2, figsize=(11, 4))
    drawn = False
    for label, prefix, steps in _directions(records, agents):
        drawn = True
        x = [int(r["step"]) for r in steps]
        line, = ax_s.plot(x, [r[prefix + "s_p50"] for r in steps], marker="o", markersize=3, label=label)
        ax_s.fill_between(x, [r[prefix + "s_p10"] for r in steps], [r[prefix + "s_p90"] for r in steps],
                          color=line.get_color(), alpha=0.2)
        ax_g.plot(x, [r[prefix + "grad_frac"] for r in steps], marker="o", markersize=3, label=label)
    if not drawn:
        plt.close(fig)
        return None
    for level in (1.0, clip_lower):
        ax_s.axhline(level, color="grey", linestyle="--", linewidth=0.8)
    ax_s.set_yscale("log")
    ax_s.set_xlabel("step")
    ax_s.set_ylabel("cross ratio s (median, p10–p90)")
    ax_g.set_xlabel("step")
    ax_g.set_ylabel("share of cross rows with gradient")
    ax_g.set_ylim(-0.02, 1.02)
    for ax in (ax_s, ax_g):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title or "cross path per direction")
    return save_figure(fig, path)


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

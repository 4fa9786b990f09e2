"""Combining per-micro-batch loss metrics into one step's numbers, over micro-batches, DP replicas and updates.

Each metric of `hacpo_loss` / `grpo_token_loss` (and the trainer's KL terms) is a statistic over a set of
rows or tokens of *one* micro-batch. `REDUCTIONS` says how pieces combine, explicitly per name:

    "sum"        counts (num_rows, num_self, …): added.
    "loss"       a micro-batch's share of its mini-batch loss: added within an update (the shares sum to
                 the mini-batch loss), then averaged over the step's updates.
    "min"/"max"  extremes.
    ("mean", w)  a mean over the set counted by metric `w`: Σ value·w / Σ w; pieces with w = 0 (an empty
                 set, where the value is NaN) are skipped; NaN when the whole step's set is empty.

`MetricAccumulator` keeps running sums in three flat float64 tensors (sums, mins, maxs) in a fixed key order,
so data-parallel replicas combine with three all-reduces (SUM, MIN, MAX) and pipeline stages with one
broadcast — see `reduce_metrics`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch

Reduction = Literal["sum", "loss", "min", "max"] | tuple[Literal["mean"], str]

REDUCTIONS: dict[str, Reduction] = {
    # the trainer's loss parts
    "loss": "loss",
    "policy_loss": "loss",
    "kl_loss": "loss",
    "kl_mean": ("mean", "num_own"),
    "num_own": "sum",  # the learner's own rows (the KL term's set)
    "own_ratio_mean": ("mean", "num_own"),  # their ratio s (sequence loss; the trainer reports it at update 0)
    # hacpo_loss (also gspo / naive)
    "num_rows": "sum",
    "num_self": "sum",
    "num_cross": "sum",
    "self_ratio_mean": ("mean", "num_self"),
    "self_ratio_min": "min",
    "self_ratio_max": "max",
    "cross_ratio_mean": ("mean", "num_cross"),
    "cross_ratio_min": "min",
    "cross_ratio_max": "max",
    "self_clip_low_frac": ("mean", "num_self"),
    "self_clip_high_frac": ("mean", "num_self"),
    "self_clip_active_frac": ("mean", "num_self"),
    "cross_clip_low_frac": ("mean", "num_cross"),
    "cross_clip_high_frac": ("mean", "num_cross"),
    "cross_zero_grad_frac": ("mean", "num_cross"),
    "cross_weight_mean": ("mean", "num_cross"),
    "log_ratio_clamped_frac": ("mean", "num_rows"),
    "adv_abs_mean": ("mean", "num_rows"),
    "cross_clip_lower": ("mean", "num_rows"),  # lo_u: the mean over the step's rows of their update's bound
    # grpo_token_loss (token-level statistics, weighted by tokens)
    "num_tokens": "sum",
    "ratio_mean": ("mean", "num_tokens"),
    "ratio_min": "min",
    "ratio_max": "max",
    "clip_low_frac": ("mean", "num_tokens"),
    "clip_high_frac": ("mean", "num_tokens"),
    "clip_active_frac": ("mean", "num_tokens"),
    "approx_kl": ("mean", "num_tokens"),
}
"""How each metric combines; an unknown name is an error (so a new loss metric cannot be averaged wrongly)."""

GRPO_TOKEN_METRICS = ("adv_abs_mean",)
"""Names whose set is the tokens (not the rows) when the loss is grpo's."""


def reduction_of(name: str, token_level: bool = False) -> Reduction:
    """The reduction of metric `name`; `token_level` for grpo, whose `adv_abs_mean` is over tokens."""
    if name not in REDUCTIONS:
        raise KeyError(f"no reduction registered for metric {name!r}; add it to training.loss_metrics.REDUCTIONS")
    if token_level and name in GRPO_TOKEN_METRICS:
        return ("mean", "num_tokens")
    return REDUCTIONS[name]


class MetricAccumulator:
    """Running combination of per-micro-batch metrics (see the module docstring).

    `keys` fixes the order of the flat state (same on every rank). Metrics missing from a piece simply
    do not contribute; a key never seen is left out of `result()`.
    """

    def __init__(self, keys: list[str], token_level: bool = False, device: torch.device | str = "cpu"):
        self.keys = list(keys)
        self.reductions = {k: reduction_of(k, token_level) for k in self.keys}
        for key, reduction in self.reductions.items():
            if isinstance(reduction, tuple) and reduction[1] not in self.reductions:
                raise KeyError(f"metric {key!r} is weighted by {reduction[1]!r}, which is not among the keys")
        self.index = {k: i for i, k in enumerate(self.keys)}
        size = len(self.keys)
        self.sums = torch.zeros(size, dtype=torch.float64, device=device)  # Σ value (sum/loss), Σ value·w (mean)
        self.weights = torch.zeros(size, dtype=torch.float64, device=device)  # Σ w (mean)
        self.mins = torch.full((size,), math.inf, dtype=torch.float64, device=device)
        self.maxs = torch.full((size,), -math.inf, dtype=torch.float64, device=device)
        self.seen = torch.zeros(size, dtype=torch.float64, device=device)
        self.num_updates = 0

    def add(self, metrics: Mapping[str, torch.Tensor | float]) -> None:
        """Fold in one micro-batch's metrics (0-d tensors or floats); unknown names raise KeyError."""
        values = {k: torch.as_tensor(v, dtype=torch.float64).reshape(()).to(self.sums.device)
                  for k, v in metrics.items()}
        for key, value in values.items():
            if key not in self.index:
                raise KeyError(f"metric {key!r} is not among this accumulator's keys")
            i = self.index[key]
            reduction = self.reductions[key]
            self.seen[i] = 1.0
            if reduction in ("sum", "loss"):
                self.sums[i] += value
            elif reduction == "min":
                if not torch.isnan(value):
                    self.mins[i] = torch.minimum(self.mins[i], value)
            elif reduction == "max":
                if not torch.isnan(value):
                    self.maxs[i] = torch.maximum(self.maxs[i], value)
            else:
                weight = values.get(reduction[1])
                if weight is None:
                    raise KeyError(f"metric {key!r} needs its weight {reduction[1]!r} in the same piece")
                if weight > 0:
                    self.sums[i] += value * weight
                    self.weights[i] += weight

    def end_update(self) -> None:
        """Mark the end of one optimizer update ("loss" metrics are averaged over updates)."""
        self.num_updates += 1

    def state(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sums, weights, mins, maxs, seen): SUM, SUM, MIN, MAX, MAX across replicas respectively."""
        return self.sums, self.weights, self.mins, self.maxs, self.seen

    def result(self) -> dict[str, float]:
        """Final numbers: sums, loss averages over `num_updates` (≥ 1), extremes and weighted means."""
        out: dict[str, float] = {}
        updates = max(self.num_updates, 1)
        for key, i in self.index.items():
            if not self.seen[i]:
                continue
            reduction = self.reductions[key]
            if reduction == "sum":
                out[key] = float(self.sums[i])
            elif reduction == "loss":
                out[key] = float(self.sums[i]) / updates
            elif reduction == "min":
                out[key] = float(self.mins[i]) if math.isfinite(self.mins[i]) else math.nan
            elif reduction == "max":
                out[key] = float(self.maxs[i]) if math.isfinite(self.maxs[i]) else math.nan
            else:
                weight = float(self.weights[i])
                out[key] = float(self.sums[i]) / weight if weight > 0 else math.nan
        return out


def reduce_metrics(accumulator: MetricAccumulator, dp_group, pp_group=None, pp_last_rank: int | None = None) -> None:
    """Combine the accumulators of all data-parallel replicas (in place), then copy the last pipeline
    stage's (the only one that computes losses) to the other stages. Groups are torch.distributed groups;
    `pp_last_rank` is the global rank of this pipeline's last stage."""
    import torch.distributed as dist

    sums, weights, mins, maxs, seen = accumulator.state()
    if dp_group is not None and dist.get_world_size(dp_group) > 1:
        dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=dp_group)
        dist.all_reduce(weights, op=dist.ReduceOp.SUM, group=dp_group)
        dist.all_reduce(mins, op=dist.ReduceOp.MIN, group=dp_group)
        dist.all_reduce(maxs, op=dist.ReduceOp.MAX, group=dp_group)
        dist.all_reduce(seen, op=dist.ReduceOp.MAX, group=dp_group)
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        packed = torch.cat([sums, weights, mins, maxs, seen])
        dist.broadcast(packed, src=pp_last_rank, group=pp_group)
        for target, source in zip((sums, weights, mins, maxs, seen), packed.chunk(5), strict=True):
            target.copy_(source)


@dataclass(frozen=True)
class FP16Scaling:
    """fp16's dynamic loss scaling in one train call: the scale after it, and how many of its updates the scaler
    skipped because the scaled gradients overflowed (each skip lowers the scale; `grad_norm` covers the rest)."""

    loss_scale: float
    skipped_updates: int


@dataclass(frozen=True)
class RowOutcome:
    """Per-row outcome of a step's sequence-level loss, in `TrainingRows` order (each row is trained once, at its
    update u): its ratio s and whether it passed gradient (`hacpo_loss`'s `rows_out`). Read per source → learner
    direction by `runtime.cross_path.direction_metrics`."""

    ratio: tuple[float, ...]
    in_window: tuple[bool, ...]
    gradient: tuple[bool, ...]


@dataclass(frozen=True)
class TrainMetrics:
    """What one train call reports; the same on every rank (the worker returns rank 0's across Ray).

    `flat()` gives the `<agent>/train/<name>` metrics of the run: every loss statistic of `objective` plus
    `loss_u{u}`, `lr`, `grad_norm`, `grad_norm_max`, `step_time_s`, `tokens_per_s`, `tflops_per_gpu`, and in fp16
    `loss_scale` and `skipped_updates`.
    """

    loss: float
    """Mean over the updates of the mini-batch loss (policy + KL)."""
    loss_per_update: tuple[float, ...]
    """The mini-batch loss of each update u."""
    grad_norm: float
    """Mean over the updates of the gradient norm before clipping."""
    grad_norm_max: float
    """Largest gradient norm of the step's updates."""
    lr: float
    """Learning rate of the last update."""
    step_time_s: float
    """Wall time of the call."""
    tokens_per_s: float
    """All tokens of the rows (prompt included) per second of the call."""
    tflops_per_gpu: float
    """Model FLOPs of the updates and of the call's own no-grad passes, per second and rank (`training.flops`)."""
    own_ratio_u0: float = math.nan
    """Mean ratio of the learner's own rows (token level: of the tokens) in the first update, where the weights
    are still the sampling weights: 1 up to float noise when m_old (or the old token log-probs) is right. Own
    rows by origin (`is_own`), not by objective: naive's shared rows, trained with the own objective against the
    source's m_old, are not among them."""
    objective: dict[str, float] = field(default_factory=dict)
    """Every statistic of the loss combined over the step's rows (`REDUCTIONS`): policy_loss, kl_loss, num_rows,
    self/cross ratios and clip fractions, …"""
    fp16: FP16Scaling | None = None
    """fp16 training only: the loss scaler after the step and the updates it skipped."""
    rows: RowOutcome | None = None
    """Sequence-level losses: every row's ratio s and gradient flags (not in `flat()`; the driver turns them into
    per-direction statistics)."""

    def flat(self) -> dict[str, float]:
        scaling = {} if self.fp16 is None else {"loss_scale": self.fp16.loss_scale,
                                                 "skipped_updates": float(self.fp16.skipped_updates)}
        return {**self.objective, **{f"loss_u{u}": v for u, v in enumerate(self.loss_per_update)},
                "own_ratio_u0": self.own_ratio_u0, "lr": self.lr,
                "grad_norm": self.grad_norm, "grad_norm_max": self.grad_norm_max, "step_time_s": self.step_time_s,
                "tokens_per_s": self.tokens_per_s, "tflops_per_gpu": self.tflops_per_gpu, **scaling}

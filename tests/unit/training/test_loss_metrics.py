"""Combining loss metrics over micro-batches, replicas and updates: hand numbers, and agreement with the
loss functions' own metrics on the whole mini-batch."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_hacpo.algo import grpo_token_loss, hacpo_loss
from nemo_hacpo.training.loss_metrics import REDUCTIONS, MetricAccumulator, reduction_of

NAN = float("nan")
HACPO_KW = dict(alpha=1.0, delta=0.2, delta_step=0.025, eps_low=3e-4, eps_high=4e-4)


def test_hand_computed_combination() -> None:
    keys = ["loss", "num_rows", "num_self", "num_cross", "self_ratio_mean", "self_ratio_min", "self_ratio_max",
            "cross_ratio_mean", "cross_ratio_min"]
    acc = MetricAccumulator(keys)
    # piece A: 2 self rows, no cross row (cross statistics NaN); piece B: 1 self row, 2 cross rows
    acc.add({"loss": -0.25, "num_rows": 2, "num_self": 2, "num_cross": 0, "self_ratio_mean": 1.0,
             "self_ratio_min": 0.9, "self_ratio_max": 1.1, "cross_ratio_mean": NAN, "cross_ratio_min": NAN})
    acc.add({"loss": 0.1, "num_rows": 3, "num_self": 1, "num_cross": 2, "self_ratio_mean": 2.0,
             "self_ratio_min": 2.0, "self_ratio_max": 2.0, "cross_ratio_mean": 0.5, "cross_ratio_min": 0.4})
    acc.end_update()
    result = acc.result()
    assert result["loss"] == pytest.approx(-0.15)  # the shares of one mini-batch add up
    assert result["num_rows"] == 5 and result["num_self"] == 3 and result["num_cross"] == 2
    assert result["self_ratio_mean"] == pytest.approx((1.0 * 2 + 2.0 * 1) / 3)  # weighted by self rows
    assert result["self_ratio_min"] == 0.9 and result["self_ratio_max"] == 2.0
    assert result["cross_ratio_mean"] == 0.5 and result["cross_ratio_min"] == pytest.approx(0.4)  # NaN piece skipped

    # a second update with loss 0.35: losses average over updates, counts add up
    acc.add({"loss": 0.35, "num_rows": 5, "num_self": 5, "num_cross": 0})
    acc.end_update()
    assert acc.result()["loss"] == pytest.approx((-0.15 + 0.35) / 2)
    assert acc.result()["num_rows"] == 10


def test_empty_sets_and_unseen_keys() -> None:
    acc = MetricAccumulator(["num_cross", "cross_ratio_mean", "cross_ratio_max", "num_rows"])
    acc.add({"num_cross": 0, "cross_ratio_mean": NAN, "cross_ratio_max": NAN})
    result = acc.result()
    assert math.isnan(result["cross_ratio_mean"]) and math.isnan(result["cross_ratio_max"])
    assert "num_rows" not in result  # never seen
    with pytest.raises(KeyError, match="not among"):
        acc.add({"approx_kl": 0.1})
    with pytest.raises(KeyError, match="needs its weight"):
        acc.add({"cross_ratio_mean": 0.5})
    with pytest.raises(KeyError, match="no reduction registered"):
        reduction_of("mystery_metric")
    with pytest.raises(KeyError, match="weighted by 'num_self'"):
        MetricAccumulator(["self_ratio_mean"])


def test_every_loss_metric_has_a_reduction() -> None:
    n = torch.zeros(2)
    _, hacpo_metrics = hacpo_loss(n.clone().requires_grad_(), n, n + 1, torch.tensor([False, True]), n + 1, 0,
                                  **HACPO_KW)
    _, grpo_metrics = grpo_token_loss(torch.zeros(2, 3), torch.zeros(2, 3), n, torch.ones(2, 3, dtype=torch.bool))
    for name in [*hacpo_metrics, *grpo_metrics, "policy_loss", "kl_loss", "kl_mean"]:
        reduction_of(name if name != "loss" else "policy_loss")
    assert reduction_of("adv_abs_mean", token_level=True) == ("mean", "num_tokens")
    assert reduction_of("adv_abs_mean") == ("mean", "num_rows")


def _combine(pieces, token_level: bool) -> dict[str, float]:
    acc = MetricAccumulator(list(REDUCTIONS), token_level=token_level)
    for metrics in pieces:
        acc.add(metrics)
    acc.end_update()
    return acc.result()


def test_micro_batch_pieces_reproduce_the_whole_batch_metrics_hacpo() -> None:
    generator = torch.Generator().manual_seed(0)
    n = 9
    learner = torch.randn(n, generator=generator, dtype=torch.float64) * 0.1
    behaviour = learner + torch.randn(n, generator=generator, dtype=torch.float64) * 0.15
    advantages = torch.randn(n, generator=generator, dtype=torch.float64)
    is_cross = torch.tensor([False] * 4 + [True] * 5)
    omega = torch.rand(n, generator=generator, dtype=torch.float64) + 0.5
    _, whole = hacpo_loss(learner, behaviour, advantages, is_cross, omega, 2, num_sequences=n, **HACPO_KW)
    splits = [[0, 1], [2, 3, 4], [5], [6, 7, 8]]  # includes a self-only and cross-only piece
    pieces = [hacpo_loss(learner[s], behaviour[s], advantages[s], is_cross[s], omega[s], 2, num_sequences=n,
                         **HACPO_KW)[1] for s in splits]
    combined = _combine(pieces, token_level=False)
    for name, value in whole.items():
        assert combined[name] == pytest.approx(value.item(), abs=1e-12, nan_ok=True), name


def test_micro_batch_pieces_reproduce_the_whole_batch_metrics_grpo() -> None:
    generator = torch.Generator().manual_seed(1)
    n, t = 6, 5
    logp = -torch.rand(n, t, generator=generator, dtype=torch.float64)
    old = logp + torch.randn(n, t, generator=generator, dtype=torch.float64) * 0.3
    advantages = torch.randn(n, generator=generator, dtype=torch.float64)
    mask = torch.arange(t)[None] < torch.tensor([5, 1, 3, 4, 2, 5])[:, None]
    tokens = int(mask.sum())
    _, whole = grpo_token_loss(logp, old, advantages, mask, normaliser=tokens)
    splits = [[0], [1, 2], [3, 4, 5]]
    pieces = [grpo_token_loss(logp[s], old[s], advantages[s], mask[s], normaliser=tokens)[1] for s in splits]
    combined = _combine(pieces, token_level=True)
    for name, value in whole.items():
        assert combined[name] == pytest.approx(value.item(), abs=1e-12, nan_ok=True), name

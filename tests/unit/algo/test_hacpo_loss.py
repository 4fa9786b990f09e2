"""hacpo_loss / gspo_loss: hand-computed objectives, autograd against closed forms, metrics, normaliser."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_hacpo.algo import (
    CapabilityTracker,
    gspo_loss,
    hacpo_advantages,
    hacpo_loss,
)

F64 = torch.float64
SPEC = {"alpha": 1.0, "delta": 0.2, "delta_step": 0.025, "eps_low": 3e-4, "eps_high": 4e-4}


def rows(ratios, advantages, is_cross, omega):
    """Learner mean log-probs (leaf, with grad) whose ratio to a zero behaviour is `ratios`."""
    learner = torch.tensor([math.log(s) for s in ratios], dtype=F64, requires_grad=True)
    behaviour = torch.zeros(len(ratios), dtype=F64)
    return (
        learner,
        behaviour,
        torch.tensor(advantages, dtype=F64),
        torch.tensor(is_cross, dtype=torch.bool),
        torch.tensor(omega, dtype=F64),
    )


def test_mixed_batch_hand_numbers_gradients_and_metrics():
    # u = 1 → lo_u = 1 − 0.2 + 0.025 = 0.825; α = 1; self clip [0.9997, 1.0004]
    learner, behaviour, adv, is_cross, omega = rows(
        ratios=[1.0, 1.01, 0.9, 1.2],
        advantages=[0.5, 2.0, 1.0, -1.0],
        is_cross=[False, False, True, True],
        omega=[1.0, 1.0, 2.0, 0.5],
    )
    loss, metrics = hacpo_loss(learner, behaviour, adv, is_cross, omega, 1, **SPEC)
    # row 0 self: s = 1 → min(0.5, 0.5) = 0.5
    # row 1 self: s = 1.01 → min(1.01·2, 1.0004·2) = 2.0008          (clipped: no gradient)
    # row 2 cross: s_c = 0.9 → 0.9·0.9·2·1 = 1.62
    # row 3 cross: s = 1.2 → s_c = 1 → 1·1·0.5·(−1) = −0.5            (s > 1: no gradient)
    # loss = −(0.5 + 2.0008 + 1.62 − 0.5)/4 = −0.9052
    assert loss.item() == pytest.approx(-0.9052, rel=1e-12)
    loss.backward()
    # d loss/d m: row 0 −s·A/4 = −0.125; row 2 −s^(1+α)·ω·A/4 = −0.81·2/4 = −0.405; rows 1, 3: 0
    assert learner.grad.tolist() == pytest.approx([-0.125, 0.0, -0.405, 0.0], abs=1e-12)

    expected_metrics = {
        "loss": -0.9052,
        "num_rows": 4.0,
        "num_self": 2.0,
        "num_cross": 2.0,
        "self_ratio_mean": 1.005,
        "self_ratio_min": 1.0,
        "self_ratio_max": 1.01,
        "cross_ratio_mean": 1.05,
        "cross_ratio_min": 0.9,
        "cross_ratio_max": 1.2,
        "self_clip_low_frac": 0.0,
        "self_clip_high_frac": 0.5,
        "self_clip_active_frac": 0.5,
        "cross_clip_low_frac": 0.0,
        "cross_clip_high_frac": 0.5,
        "cross_zero_grad_frac": 0.5,
        "cross_weight_mean": (0.9 * 2.0 + 1.0 * 0.5) / 2,  # mean of sg(s_c)^α·ω = 1.15
        "log_ratio_clamped_frac": 0.0,
        "adv_abs_mean": (0.5 + 2.0 + 1.0 + 1.0) / 4,
        "cross_clip_lower": 0.825,
    }
    assert set(metrics) == set(expected_metrics)
    for name, value in expected_metrics.items():
        assert metrics[name].ndim == 0 and not metrics[name].requires_grad, name
        assert metrics[name].item() == pytest.approx(value, rel=1e-9), name


@pytest.mark.parametrize("alpha", [0.0, 1.0, 3.0])
def test_cross_gradient_has_effective_weight_s_to_one_plus_alpha(alpha):
    # obj = s_c·sg(s_c)^α·ω·A and ds/dm = s ⇒ d obj/dm = s·s^α·ω·A = s^(1+α)·ω·A (not (1+α)·…:
    # the s^α factor is detached). Loss = −mean ⇒ d loss/dm = −s^(1+α)·ω·A/N.
    ratios = [0.85, 0.9, 0.95, 1.0]
    advantages = [1.5, -0.7, 2.0, -1.0]
    omega = [2.0, 0.5, 1.0, 10.0]
    learner, behaviour, adv, is_cross, omega_t = rows(ratios, advantages, [True] * 4, omega)
    settings = {**SPEC, "alpha": alpha}
    loss, _ = hacpo_loss(learner, behaviour, adv, is_cross, omega_t, 0, **settings)  # lo_u = 0.8
    loss.backward()
    expected = [-(s ** (1 + alpha)) * w * a / 4 for s, w, a in zip(ratios, omega, advantages, strict=True)]
    assert learner.grad.tolist() == pytest.approx(expected, rel=1e-12)
    # and the value: −Σ s^(1+α)·ω·A / 4
    assert loss.item() == pytest.approx(sum(expected), rel=1e-12)


def test_cross_rows_outside_clip_range_have_zero_gradient_but_count_in_the_mean():
    # lo_u = 0.8 (u = 0). Rows: s = 0.7 (< lo_u), s = 1.1 (> 1), s = 0.9 (inside)
    learner, behaviour, adv, is_cross, omega = rows([0.7, 1.1, 0.9], [1.0, 1.0, 1.0], [True] * 3, [1.0] * 3)
    loss, metrics = hacpo_loss(learner, behaviour, adv, is_cross, omega, 0, **SPEC)
    # objectives: 0.8·0.8 = 0.64, 1·1 = 1, 0.9·0.9 = 0.81 → loss = −2.45/3
    assert loss.item() == pytest.approx(-2.45 / 3, rel=1e-12)
    loss.backward()
    assert learner.grad.tolist() == pytest.approx([0.0, 0.0, -0.81 / 3], abs=1e-15)
    assert learner.grad[0] == 0.0 and learner.grad[1] == 0.0
    assert metrics["cross_clip_low_frac"].item() == pytest.approx(1 / 3)
    assert metrics["cross_clip_high_frac"].item() == pytest.approx(1 / 3)
    assert metrics["cross_zero_grad_frac"].item() == pytest.approx(2 / 3)


def test_no_cross_clip_ablation_passes_every_cross_gradient():
    # Same rows as above, cross_clip=False: s_c = s. α = 1, ω = 1, A = 1 →
    # objectives s·s = 0.49, 1.21, 0.81 → loss = −2.51/3; d obj/d m = s^2 → grads −[0.49, 1.21, 0.81]/3
    learner, behaviour, adv, is_cross, omega = rows([0.7, 1.1, 0.9], [1.0, 1.0, 1.0], [True] * 3, [1.0] * 3)
    loss, metrics = hacpo_loss(learner, behaviour, adv, is_cross, omega, 0, **SPEC, cross_clip=False)
    assert loss.item() == pytest.approx(-2.51 / 3, rel=1e-12)
    loss.backward()
    assert learner.grad.tolist() == pytest.approx([-0.49 / 3, -1.21 / 3, -0.81 / 3], rel=1e-12)
    assert metrics["cross_zero_grad_frac"].item() == 0.0 and metrics["cross_clip_low_frac"].item() == 0.0


def test_cross_clip_boundaries_are_closed():
    # δ = 0.5 → lo_u = 0.5 at u = 0; s exactly 0.5 and exactly 1 both pass gradient.
    learner, behaviour, adv, is_cross, omega = rows([0.5, 1.0], [1.0, 1.0], [True, True], [1.0, 1.0])
    assert learner.detach().exp().tolist() == [0.5, 1.0]  # precondition: the boundaries are hit exactly
    loss, metrics = hacpo_loss(learner, behaviour, adv, is_cross, omega, 0, **{**SPEC, "delta": 0.5})
    loss.backward()
    # d loss/dm = −s²/2: −0.125 and −0.5
    assert learner.grad.tolist() == pytest.approx([-0.125, -0.5], rel=1e-12)
    assert metrics["cross_zero_grad_frac"].item() == 0.0


def test_cross_lower_bound_capped_at_one_only_s_equal_one_passes_gradient():
    # δ = 0.2, δ_step = 0.025, u = 9 → 0.8 + 0.225 = 1.025 → capped to 1: the range is {1}
    learner, behaviour, adv, is_cross, omega = rows([0.99, 1.0, 1.01], [1.0, 1.0, 1.0], [True] * 3, [1.0] * 3)
    loss, metrics = hacpo_loss(learner, behaviour, adv, is_cross, omega, 9, **SPEC)
    assert metrics["cross_clip_lower"].item() == 1.0
    assert loss.item() == pytest.approx(-1.0)  # every s_c = 1: −(1 + 1 + 1)/3
    loss.backward()
    assert learner.grad.tolist() == pytest.approx([0.0, -1 / 3, 0.0], abs=1e-15)


@pytest.mark.parametrize(("update_index", "lower"), [(0, 0.8), (1, 0.825), (2, 0.85), (3, 0.875)])
def test_stepwise_lower_bound_moves_with_update_index(update_index, lower):
    # a cross row at s = 0.84 has gradient at u = 0, 1 (lo ≤ 0.84) and none at u = 2, 3
    learner, behaviour, adv, is_cross, omega = rows([0.84], [1.0], [True], [1.0])
    loss, metrics = hacpo_loss(learner, behaviour, adv, is_cross, omega, update_index, **SPEC)
    assert metrics["cross_clip_lower"].item() == pytest.approx(lower)
    loss.backward()
    expected = -(0.84**2) if lower <= 0.84 else 0.0
    assert learner.grad.item() == pytest.approx(expected, abs=1e-15)
    # the objective uses s_c = max(0.84, lo_u): value −s_c² (α = 1, ω = A = 1)
    assert loss.item() == pytest.approx(-(max(0.84, lower) ** 2), rel=1e-12)


def test_log_ratio_is_clamped_to_ten():
    # self row, log s = 15 → clamped to 10: s = e^10; A = −1: min(−e^10, −1.0004) = −e^10
    learner = torch.tensor([15.0, -15.0], dtype=F64, requires_grad=True)
    behaviour = torch.zeros(2, dtype=F64)
    adv = torch.tensor([-1.0, 1.0], dtype=F64)
    loss, metrics = hacpo_loss(
        learner, behaviour, adv, torch.tensor([False, False]), torch.ones(2, dtype=F64), 0, **SPEC
    )
    # row 1: s = e^−10, A = 1: min(e^−10, 0.9997) = e^−10. loss = −(−e^10 + e^−10)/2
    assert loss.item() == pytest.approx((math.exp(10) - math.exp(-10)) / 2, rel=1e-12)
    assert metrics["self_ratio_max"].item() == pytest.approx(math.exp(10), rel=1e-12)
    assert metrics["log_ratio_clamped_frac"].item() == 1.0
    loss.backward()
    assert learner.grad.tolist() == [0.0, 0.0]  # outside the clamp: no gradient


def test_gspo_equivalence_without_cross_rows():
    generator = torch.Generator().manual_seed(0)
    learner = (torch.randn(16, generator=generator, dtype=F64) * 1e-3).requires_grad_()
    behaviour = torch.randn(16, generator=generator, dtype=F64) * 1e-3
    adv = torch.randn(16, generator=generator, dtype=F64)
    # GSPO written out independently: −mean(min(s·A, clip(s, 1 − ε_l, 1 + ε_h)·A))
    s = torch.exp(learner - behaviour)
    reference = -torch.minimum(s * adv, s.clamp(1 - 3e-4, 1 + 4e-4) * adv).mean()
    (reference_grad,) = torch.autograd.grad(reference, learner)

    no_cross = torch.zeros(16, dtype=torch.bool)
    # ω on self rows is ignored, even NaN (it cannot reach the value or the gradient)
    omega = torch.full((16,), float("nan"), dtype=F64)
    for update_index in (0, 3):
        loss, metrics = hacpo_loss(learner, behaviour, adv, no_cross, omega, update_index, **SPEC)
        (grad,) = torch.autograd.grad(loss, learner)
        torch.testing.assert_close(loss, reference, rtol=1e-14, atol=0)
        torch.testing.assert_close(grad, reference_grad, rtol=1e-14, atol=0)
    assert metrics["self_clip_high_frac"].item() + metrics["self_clip_low_frac"].item() > 0  # clip exercised
    gspo, gspo_metrics = gspo_loss(learner, behaviour, adv, eps_low=3e-4, eps_high=4e-4)
    torch.testing.assert_close(gspo, reference, rtol=1e-14, atol=0)
    # cross metrics are NaN when there are no cross rows
    assert math.isnan(gspo_metrics["cross_ratio_mean"].item())
    assert math.isnan(gspo_metrics["cross_clip_low_frac"].item())
    assert gspo_metrics["num_cross"].item() == 0.0


def test_three_agents_on_policy_end_to_end_hand_numbers():
    # Tracker: P̂ = (0.8, 0.4, 0.2) → learner "b" gets ω = [ω(a→b), 1, ω(c→b)] = [2, 1, 0.5]
    tracker = CapabilityTracker(["a", "b", "c"])
    tracker.update({"a": 0.8, "b": 0.4, "c": 0.2})
    omega = tracker.omega_vector("b", dtype=F64)
    assert omega.tolist() == pytest.approx([2.0, 1.0, 0.5])
    # rewards a [1, 0], b [1, 0], c [1, 1] → μ_b = 11/12, σ = √(4/15) (see test_advantages)
    rewards = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [1.0, 1.0]]], dtype=F64)
    advantages = hacpo_advantages(rewards, 1, omega).reshape(-1)  # [6], agent-major
    is_cross = torch.tensor([True, True, False, False, True, True])
    row_omega = omega.repeat_interleave(2)  # [2, 2, 1, 1, 0.5, 0.5]
    # on-policy (s = 1 for every row): self obj = A, cross obj = 1·1^α·ω·A
    learner = torch.zeros(6, dtype=F64, requires_grad=True)
    loss, _ = hacpo_loss(learner, torch.zeros(6, dtype=F64), advantages, is_cross, row_omega, 0, **SPEC)
    # up = (1/12)/σ', down = (−11/12)/σ'; Σ obj = 2(up + down) + (up + down) + 0.5·2·up = 4·up + 3·down
    #      = (4/12 − 33/12)/σ' = −(29/12)/σ'  → loss = (29/12)/(6σ') = (29/72)/σ'
    sigma = math.sqrt(4 / 15) + 1e-6
    assert loss.item() == pytest.approx((29 / 72) / sigma, rel=1e-12)


def test_global_normaliser_makes_micro_batch_losses_add_up():
    generator = torch.Generator().manual_seed(1)
    learner = (torch.randn(10, generator=generator, dtype=F64) * 0.1).requires_grad_()
    behaviour = torch.randn(10, generator=generator, dtype=F64) * 0.1
    adv = torch.randn(10, generator=generator, dtype=F64)
    is_cross = torch.tensor([False] * 4 + [True] * 6)
    omega = torch.rand(10, generator=generator, dtype=F64) * 2 + 0.1
    full, _ = hacpo_loss(learner, behaviour, adv, is_cross, omega, 2, **SPEC)
    (full_grad,) = torch.autograd.grad(full, learner)
    total = 0.0
    for sl in (slice(0, 3), slice(3, 10)):  # two micro-batches, normalised by the global count 10
        part, _ = hacpo_loss(
            learner[sl], behaviour[sl], adv[sl], is_cross[sl], omega[sl], 2, num_sequences=10, **SPEC
        )
        total = total + part
    (total_grad,) = torch.autograd.grad(total, learner)
    torch.testing.assert_close(total, full, rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(total_grad, full_grad, rtol=1e-14, atol=1e-15)


def test_empty_micro_batch_needs_a_normaliser():
    empty = torch.zeros(0, dtype=F64, requires_grad=True)
    args = (empty, torch.zeros(0, dtype=F64), torch.zeros(0, dtype=F64), torch.zeros(0, dtype=torch.bool))
    with pytest.raises(ValueError, match="num_sequences"):
        hacpo_loss(*args, torch.zeros(0, dtype=F64), 0, **SPEC)
    loss, metrics = hacpo_loss(*args, torch.zeros(0, dtype=F64), 0, num_sequences=8, **SPEC)
    assert loss.item() == 0.0
    assert math.isnan(metrics["self_ratio_mean"].item()) and math.isnan(metrics["cross_ratio_max"].item())


def test_behaviour_advantages_and_omega_are_detached():
    learner = torch.tensor([0.0, math.log(0.9)], dtype=F64, requires_grad=True)
    behaviour = torch.zeros(2, dtype=F64, requires_grad=True)
    adv = torch.ones(2, dtype=F64, requires_grad=True)
    omega = torch.ones(2, dtype=F64, requires_grad=True)
    loss, _ = hacpo_loss(learner, behaviour, adv, torch.tensor([False, True]), omega, 0, **SPEC)
    loss.backward()
    assert learner.grad is not None
    assert behaviour.grad is None and adv.grad is None and omega.grad is None


def test_validation_errors():
    good = [torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.zeros(3, dtype=torch.bool), torch.ones(3)]
    with pytest.raises(ValueError, match=r"advantages must have shape \[N\]"):
        hacpo_loss(good[0], good[1], torch.zeros(4), good[3], good[4], 0, **SPEC)
    with pytest.raises(ValueError, match=r"learner_mean_logprob must have shape \[N\]"):
        hacpo_loss(torch.zeros(3, 2), good[1], good[2], good[3], good[4], 0, **SPEC)
    with pytest.raises(TypeError, match="is_cross must be a bool tensor"):
        hacpo_loss(good[0], good[1], good[2], torch.zeros(3), good[4], 0, **SPEC)
    with pytest.raises(ValueError, match="alpha"):
        hacpo_loss(*good, 0, **{**SPEC, "alpha": -1.0})
    with pytest.raises(ValueError, match="update_index"):
        hacpo_loss(*good, -1, **SPEC)
    with pytest.raises(ValueError, match="num_sequences"):
        hacpo_loss(*good, 0, num_sequences=0, **SPEC)
    with pytest.raises(ValueError, match="max_abs_log_ratio"):
        hacpo_loss(*good, 0, max_abs_log_ratio=0.0, **SPEC)


def test_rows_out_reports_each_rows_ratio_window_and_gradient():
    """u = 0 (window [0.8, 1]); rows: self s = 1 A = 1 | cross s = 0.9 A = 1 | cross s = 0.9 A = 0 |
    cross s = 0.5 A = 1 | cross s = 1.2 A = −1 | self s = 1.1 A = 1 (above 1 + ε_high: clipped)."""
    log_s = torch.tensor([0.0, math.log(0.9), math.log(0.9), math.log(0.5), math.log(1.2), math.log(1.1)],
                         dtype=torch.float64, requires_grad=True)
    rows_out: dict = {}
    hacpo_loss(log_s, torch.zeros(6, dtype=torch.float64), torch.tensor([1.0, 1, 0, 1, -1, 1], dtype=torch.float64),
               torch.tensor([False, True, True, True, True, False]), torch.ones(6, dtype=torch.float64), 0,
               alpha=1.0, delta=0.2, delta_step=0.025, eps_low=3e-4, eps_high=4e-4, rows_out=rows_out)
    assert rows_out["ratio"].tolist() == pytest.approx([1.0, 0.9, 0.9, 0.5, 1.2, 1.1])
    assert rows_out["in_window"].tolist() == [True, True, True, False, False, False]
    assert rows_out["gradient"].tolist() == [True, True, False, False, False, False]

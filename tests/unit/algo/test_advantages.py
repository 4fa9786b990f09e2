"""group_advantages and hacpo_advantages / hacpo_baseline pinned with hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_hacpo.algo import group_advantages, hacpo_advantages, hacpo_baseline

EPS = 1e-6


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def assert_values(actual: torch.Tensor, expected, rtol: float = 1e-12) -> None:
    """Compare with nested hand-written numbers (float64, relative tolerance, tiny absolute slack)."""
    torch.testing.assert_close(actual.to(torch.float64), t(expected), rtol=rtol, atol=1e-12)


# ----------------------------------------------------------------------------- group_advantages
def test_group_advantages_binary_group():
    # [1, 0, 0, 1]: mean 0.5; unbiased var = 4·0.25/3 = 1/3 → std = 0.57735
    expected = 0.5 / (math.sqrt(1 / 3) + EPS)
    result = group_advantages(t([[1, 0, 0, 1]]))
    assert_values(result, [[expected, -expected, -expected, expected]], rtol=1e-12)


def test_group_advantages_real_valued_group():
    # [1, 2, 3]: mean 2, unbiased var = (1 + 0 + 1)/2 = 1 → A = [-1, 0, 1]/(1 + eps)
    result = group_advantages(t([[1.0, 2.0, 3.0]]))
    assert_values(result, [[-1 / (1 + EPS), 0.0, 1 / (1 + EPS)]], rtol=1e-12)


def test_group_advantages_all_equal_groups_are_exactly_zero():
    # 0.1 three times: (r − mean) may be a rounding residue; the result must be exactly 0.
    rewards = torch.tensor([[0.1, 0.1, 0.1], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    result = group_advantages(rewards)
    assert torch.equal(result[:3], torch.zeros(3, 3))
    assert (result[3] != 0).all()


def test_group_advantages_custom_eps_and_dtype():
    # [0, 2]: mean 1, unbiased std = √2 → A = ±1/(√2 + 0.5)
    result = group_advantages(torch.tensor([[0, 2]]), eps=0.5)  # int rewards → float32
    assert result.dtype == torch.float32
    assert_values(result, [[-1 / (math.sqrt(2) + 0.5), 1 / (math.sqrt(2) + 0.5)]], rtol=1e-6)


def test_group_advantages_validation():
    with pytest.raises(ValueError, match=r"\[B, G\]"):
        group_advantages(torch.zeros(4))
    with pytest.raises(ValueError, match="G ≥ 2"):
        group_advantages(torch.zeros(3, 1))
    with pytest.raises(ValueError, match="finite"):
        group_advantages(torch.tensor([[0.0, float("nan")]]))


# ----------------------------------------------------------------------------- hacpo_advantages
def test_hacpo_advantages_two_agents_hand_numbers():
    # learner 0 rewards [1, 0]; source rewards [1, 1]; ω(1→0) = 2
    # μ_0 = (1 + 0 + 1/2 + 1/2) / 4 = 0.5
    # joint [1, 0, 1, 1]: mean 0.75, var = (3·0.0625 + 0.5625)/3 = 0.25 → σ = 0.5
    rewards = t([[[1, 0], [1, 1]]])
    assert hacpo_baseline(rewards, 0, [1.0, 2.0]).tolist() == pytest.approx([0.5])
    scale = 1 / (0.5 + EPS)
    expected = [[[0.5 * scale, -0.5 * scale], [0.5 * scale, 0.5 * scale]]]
    assert_values(hacpo_advantages(rewards, 0, t([1.0, 2.0])), expected)


def test_hacpo_advantages_learner_is_second_agent():
    # same rewards, learner 1 with ω(0→1) = 0.8: μ_1 = (1/0.8 + 0/0.8 + 1 + 1)/4 = 3.25/4 = 0.8125
    rewards = t([[[1, 0], [1, 1]]])
    assert hacpo_baseline(rewards, 1, [0.8, 1.0]).tolist() == pytest.approx([0.8125])
    result = hacpo_advantages(rewards, 1, [0.8, 1.0])
    sigma = 0.5  # as above: σ does not depend on the learner
    expected = [[[(1 - 0.8125) / (sigma + EPS), -0.8125 / (sigma + EPS)], [(1 - 0.8125) / (sigma + EPS)] * 2]]
    assert_values(result, expected)


def test_hacpo_advantages_three_agents_hand_numbers():
    # learner 1 (middle); ω = [ω(0→1), 1, ω(2→1)] = [2, 1, 0.5]
    # rewards: agent0 [1, 0], agent1 [1, 0], agent2 [1, 1]
    # μ_1 = (1/2 + 0 + 1 + 0 + 1/0.5 + 1/0.5)/6 = 5.5/6 = 11/12
    # joint [1,0,1,0,1,1]: mean 2/3, var = (4·(1/3)² + 2·(2/3)²)/5 = (4/9 + 8/9)/5 = 4/15
    rewards = t([[[1, 0], [1, 0], [1, 1]]])
    omega = [2.0, 1.0, 0.5]
    assert hacpo_baseline(rewards, 1, omega).tolist() == pytest.approx([11 / 12])
    sigma = math.sqrt(4 / 15)
    up, down = (1 - 11 / 12) / (sigma + EPS), (0 - 11 / 12) / (sigma + EPS)
    expected = [[[up, down], [up, down], [up, up]]]
    assert_values(hacpo_advantages(rewards, 1, omega), expected)


def test_guard_all_equal_group_gives_exact_zero():
    # all four rewards 1, ω(1→0) = 2: raw μ = (1 + 1 + 1/2 + 1/2)/4 = 0.75 ≠ 1
    rewards = t([[[1, 1], [1, 1]]])
    assert hacpo_baseline(rewards, 0, [1.0, 2.0]).tolist() == [1.0]  # guard: plain mean
    assert torch.equal(hacpo_advantages(rewards, 0, [1.0, 2.0]), torch.zeros(1, 2, 2, dtype=torch.float64))
    # the raw formula: μ = 0.75, σ = 0 → A = 0.25/(0 + 1e-6) = 250000 on every response
    assert hacpo_baseline(rewards, 0, [1.0, 2.0], guards=False).tolist() == [0.75]
    raw = hacpo_advantages(rewards, 0, [1.0, 2.0], guards=False)
    assert raw.flatten().tolist() == pytest.approx([0.25 / EPS] * 4, rel=1e-9)


def test_guard_baseline_above_one_falls_back_to_learner_mean():
    # learner 0 rewards [1, 0, 0]; source [1, 1, 1]; ω(1→0) = 0.5 (a weaker source: its rewards count ×2)
    # raw μ = (1 + 0 + 0 + 2 + 2 + 2)/6 = 7/6 > 1 → μ = learner's own mean 1/3
    # joint [1,0,0,1,1,1]: mean 2/3, var = (4·(1/3)² + 2·(2/3)²)/5 = 4/15
    rewards = t([[[1, 0, 0], [1, 1, 1]]])
    assert hacpo_baseline(rewards, 0, [1.0, 0.5], guards=False).tolist() == pytest.approx([7 / 6])
    assert hacpo_baseline(rewards, 0, [1.0, 0.5]).tolist() == pytest.approx([1 / 3])
    sigma = math.sqrt(4 / 15)
    up, down = (2 / 3) / (sigma + EPS), (-1 / 3) / (sigma + EPS)
    assert_values(hacpo_advantages(rewards, 0, [1.0, 0.5]), [[[up, down, down], [up] * 3]])


def test_guards_apply_per_prompt_in_a_batch():
    # ω(1→0) = 0.4 (source rewards count ×2.5)
    rewards = t(
        [
            [[1, 0], [0, 1]],  # raw μ = (1 + 0 + 0 + 2.5)/4 = 0.875: no guard
            [[1, 1], [1, 1]],  # all equal: raw μ = (2 + 5)/4 = 1.75 → plain mean 1
            [[1, 0], [1, 1]],  # raw μ = (1 + 0 + 2.5 + 2.5)/4 = 1.5 > 1 → learner mean 0.5
        ]
    )
    omega = [1.0, 0.4]
    assert hacpo_baseline(rewards, 0, omega, guards=False).tolist() == pytest.approx([0.875, 1.75, 1.5])
    assert hacpo_baseline(rewards, 0, omega).tolist() == pytest.approx([0.875, 1.0, 0.5])
    result = hacpo_advantages(rewards, 0, omega)
    assert torch.equal(result[1], torch.zeros(2, 2, dtype=torch.float64))
    # prompt 0: joint [1,0,0,1] σ = √(1/3); prompt 2: joint [1,0,1,1] σ = 0.5
    s0, s2 = math.sqrt(1 / 3) + EPS, 0.5 + EPS
    assert_values(result[0], [[0.125 / s0, -0.875 / s0], [-0.875 / s0, 0.125 / s0]])
    assert_values(result[2], [[0.5 / s2, -0.5 / s2], [0.5 / s2, 0.5 / s2]])


def test_minus_adv_ablation_is_unit_omega_plain_joint_baseline():
    # "−adv": ω = 1 in the baseline → μ = plain joint mean 0.75 for [1, 0, 1, 1], σ = 0.5
    rewards = t([[[1, 0], [1, 1]]])
    result = hacpo_advantages(rewards, 0, torch.ones(2))
    expected = [[[0.25 / (0.5 + EPS), -0.75 / (0.5 + EPS)], [0.25 / (0.5 + EPS)] * 2]]
    assert_values(result, expected)


def test_hacpo_advantages_validation():
    rewards = torch.zeros(2, 2, 4)
    with pytest.raises(ValueError, match=r"\[B, n, G\]"):
        hacpo_advantages(torch.zeros(2, 8), 0, [1.0, 1.0])
    with pytest.raises(ValueError, match="learner"):
        hacpo_advantages(rewards, 2, [1.0, 1.0])
    with pytest.raises(ValueError, match=r"omega must have shape \[n\]"):
        hacpo_advantages(rewards, 0, [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="positive"):
        hacpo_advantages(rewards, 0, [1.0, 0.0])
    with pytest.raises(ValueError, match=r"omega\[learner\]"):
        hacpo_advantages(rewards, 0, [2.0, 1.0])
    with pytest.raises(ValueError, match="n·G ≥ 2"):
        hacpo_advantages(torch.zeros(2, 1, 1), 0, [1.0])

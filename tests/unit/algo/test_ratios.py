"""sequence_mean_logprob, sequence_log_ratio and the stepwise cross clip bound."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_hacpo.algo import cross_clip_lower, masked_token_sum, sequence_log_ratio, sequence_mean_logprob


def test_sequence_mean_logprob_hand_numbers():
    token_logprobs = torch.tensor([[-1.0, -2.0, -3.0, -9.0], [-0.5, -0.7, -9.0, -9.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    # row 0: (−1 −2 −3)/3 = −2; row 1: (−0.5 −0.7)/2 = −0.6 (the −9 padding is ignored)
    assert sequence_mean_logprob(token_logprobs, mask).tolist() == pytest.approx([-2.0, -0.6])


def test_sequence_mean_logprob_empty_row_is_zero_and_padding_cannot_leak():
    token_logprobs = torch.tensor(
        [[-1.0, float("-inf"), float("nan")], [float("nan"), float("-inf"), -4.0]], requires_grad=True
    )
    mask = torch.tensor([[True, False, False], [False, False, False]])
    result = sequence_mean_logprob(token_logprobs, mask)
    assert result.tolist() == [-1.0, 0.0]
    result.sum().backward()
    # gradient 1/L at masked tokens, exactly 0 elsewhere (no NaN from the −inf/NaN padding)
    assert token_logprobs.grad.tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]


def test_sequence_mean_logprob_gradient_is_one_over_length():
    token_logprobs = torch.zeros(1, 5, requires_grad=True)
    mask = torch.tensor([[True, True, True, True, False]])
    sequence_mean_logprob(token_logprobs, mask).sum().backward()
    assert token_logprobs.grad.tolist() == [[0.25, 0.25, 0.25, 0.25, 0.0]]


def test_sequence_mean_logprob_upcasts_half_precision():
    token_logprobs = torch.full((1, 3), -1.0, dtype=torch.bfloat16)
    result = sequence_mean_logprob(token_logprobs, torch.ones(1, 3, dtype=torch.bool))
    assert result.dtype == torch.float32 and result.item() == -1.0


def test_masked_token_sum_counts():
    sums, counts = masked_token_sum(
        torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[True, True], [False, True]])
    )
    assert sums.tolist() == [3.0, 4.0] and counts.tolist() == [2.0, 1.0]


def test_sequence_mean_logprob_validation():
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        sequence_mean_logprob(torch.zeros(3), torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask must have shape"):
        sequence_mean_logprob(torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool"):
        sequence_mean_logprob(torch.zeros(2, 3), torch.ones(2, 3))


def test_cross_clip_lower_stepwise_schedule():
    # δ = 0.2, δ_step = 0.025: 1 − 0.2 + u·0.025
    assert [cross_clip_lower(u, 0.2, 0.025) for u in range(4)] == pytest.approx([0.8, 0.825, 0.85, 0.875])
    # cap at 1: 0.8 + 8·0.025 = 1.0 and 0.8 + 20·0.025 = 1.3 → 1
    assert cross_clip_lower(8, 0.2, 0.025) == 1.0
    assert cross_clip_lower(20, 0.2, 0.025) == 1.0
    # δ = 0.1, δ_step = 0.05: 0.9, 0.95, 1.0, then capped
    assert [cross_clip_lower(u, 0.1, 0.05) for u in range(4)] == pytest.approx([0.9, 0.95, 1.0, 1.0])
    # static clip (ablation): δ_step = 0 keeps 1 − δ
    assert [cross_clip_lower(u, 0.2, 0.0) for u in range(4)] == pytest.approx([0.8] * 4)


@pytest.mark.parametrize(
    ("update_index", "delta", "delta_step"),
    [(-1, 0.2, 0.025), (1.5, 0.2, 0.025), (0, 1.2, 0.025), (0, -0.1, 0.0), (0, 0.2, -0.01)],
)
def test_cross_clip_lower_validation(update_index, delta, delta_step):
    with pytest.raises(ValueError):
        cross_clip_lower(update_index, delta, delta_step)


def test_sequence_log_ratio_clamps_and_detaches_behaviour():
    learner = torch.tensor([-1.0, 5.0, -20.0, 10.0], requires_grad=True)
    behaviour = torch.tensor([-1.5, -10.0, 0.0, 0.0], requires_grad=True)
    # raw: 0.5, 15 → 10, −20 → −10, 10 (exactly at the bound: kept, gradient passes)
    log_ratio = sequence_log_ratio(learner, behaviour, max_abs_log_ratio=10.0)
    assert log_ratio.tolist() == [0.5, 10.0, -10.0, 10.0]
    log_ratio.sum().backward()
    assert learner.grad.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert behaviour.grad is None
    assert math.isclose(float(log_ratio.detach().exp()[1]), math.exp(10.0), rel_tol=1e-6)

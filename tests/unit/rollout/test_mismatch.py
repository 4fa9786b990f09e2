"""token_mult_prob_error = exp(token-mean |trainer − sampler|) over response tokens: hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_hacpo.rollout.mismatch import pad_ragged, ragged_token_mult_prob_error, token_mult_prob_error


def test_single_row_hand_computed():
    # |Δ| on the three response tokens: 0.1, 0.5, 0.0 → mean 0.2 → exp(0.2); the padded 4th entry is ignored.
    trainer = torch.tensor([[-1.0, -2.0, -0.5, 0.0]])
    sampler = torch.tensor([[-1.1, -1.5, -0.5, -9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert float(token_mult_prob_error(trainer, sampler, mask)) == pytest.approx(math.exp(0.2), rel=1e-6)
    assert math.exp(0.2) == pytest.approx(1.2214027581601699)


def test_token_mean_over_the_batch_not_mean_of_rows():
    # Row 0: one token with |Δ| = 0.4; row 1: three tokens with |Δ| = 0 → token mean 0.4/4 = 0.1
    # (a per-row mean first would give (0.4 + 0)/2 = 0.2).
    trainer = torch.tensor([[0.0, -3.0, -3.0, -3.0], [-1.0, -1.0, -1.0, 0.0]])
    sampler = torch.tensor([[0.0, -3.4, 0.0, 0.0], [-1.0, -1.0, -1.0, 5.0]])
    mask = torch.tensor([[0, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    assert float(token_mult_prob_error(trainer, sampler, mask)) == pytest.approx(math.exp(0.1), rel=1e-6)


def test_masked_positions_may_hold_non_finite_values():
    trainer = torch.tensor([[-1.0, float("nan")]])
    sampler = torch.tensor([[-1.5, float("-inf")]])
    assert float(token_mult_prob_error(trainer, sampler, torch.tensor([[1, 0]]))) == pytest.approx(math.exp(0.5))


def test_errors():
    with pytest.raises(ValueError, match="shapes differ"):
        token_mult_prob_error(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 2))
    with pytest.raises(ValueError, match="selects no token"):
        token_mult_prob_error(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="row 0"):
        ragged_token_mult_prob_error([[-1.0, -2.0]], [[-1.0]])


def test_ragged_rows():
    # Rows of lengths 2 and 1: |Δ| = 0.3, 0.1 | 0.2 → mean 0.2.
    value = ragged_token_mult_prob_error([[-1.0, -2.0], [-0.5]], [[-1.3, -2.1], [-0.3]])
    assert value == pytest.approx(math.exp(0.2), rel=1e-9)
    values, mask = pad_ragged([[1.0, 2.0], [3.0]])
    assert values.tolist() == [[1.0, 2.0], [3.0, 0.0]]
    assert mask.tolist() == [[1.0, 1.0], [1.0, 0.0]]


logprob = st.floats(min_value=-20.0, max_value=0.0, allow_nan=False)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(logprob, logprob), min_size=1, max_size=20))
def test_at_least_one_symmetric_and_one_iff_equal(pairs):
    trainer = torch.tensor([[a for a, _ in pairs]], dtype=torch.float64)
    sampler = torch.tensor([[b for _, b in pairs]], dtype=torch.float64)
    mask = torch.ones_like(trainer)
    forward = float(token_mult_prob_error(trainer, sampler, mask))
    assert forward >= 1.0
    assert forward == pytest.approx(float(token_mult_prob_error(sampler, trainer, mask)))
    assert float(token_mult_prob_error(trainer, trainer, mask)) == 1.0

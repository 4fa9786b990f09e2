"""low_var_kl: the k3 estimator with verl's clamps, token-mean per sequence."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_hacpo.algo import low_var_kl

F64 = torch.float64


def test_hand_numbers_and_gradient():
    # d = ref − logp: row 0 tokens d = −0.5 and 1;  kl = e^d − d − 1
    #   e^−0.5 + 0.5 − 1 = 0.1065307,  e^1 − 1 − 1 = 0.7182818  → mean 0.4124063
    # row 1: identical policies → 0
    logp = torch.tensor([[-1.0, -2.0], [-0.3, -0.4]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0], [-0.3, -0.4]], dtype=F64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    kl = low_var_kl(logp, ref, mask)
    first = ((math.exp(-0.5) + 0.5 - 1) + (math.exp(1) - 2)) / 2
    assert kl.tolist() == pytest.approx([first, 0.0], abs=1e-15)
    kl.sum().backward()
    # d kl_t / d logp = 1 − e^d, divided by the 2 tokens
    expected = [[(1 - math.exp(-0.5)) / 2, (1 - math.exp(1)) / 2], [0.0, 0.0]]
    torch.testing.assert_close(logp.grad, torch.tensor(expected, dtype=F64), rtol=1e-12, atol=1e-15)


def test_clamps():
    # token 0: d = 2.5 → e^2.5 − 3.5 = 8.6825 (no clamp)
    # token 1: d = 3 → e^3 − 4 = 16.09 → clamped to 10 (value clamp; no gradient)
    # token 2: d = 25 → clamped to 20 first, e^20 − 21 ≫ 10 → 10
    # token 3: d = −30 → clamped to −20: e^−20 + 20 − 1 = 19.000000002 → 10
    logp = torch.tensor([[0.0, 0.0, 0.0, 0.0]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[2.5, 3.0, 25.0, -30.0]], dtype=F64)
    kl = low_var_kl(logp, ref, torch.ones(1, 4, dtype=torch.bool))
    expected = (math.exp(2.5) - 3.5 + 10 + 10 + 10) / 4
    assert kl.item() == pytest.approx(expected, rel=1e-12)
    kl.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([(1 - math.exp(2.5)) / 4, 0.0, 0.0, 0.0], rel=1e-12)


def test_mask_and_empty_rows():
    logp = torch.tensor([[-1.0, float("nan")], [float("-inf"), 0.0]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[-1.5, 0.0], [0.0, float("nan")]], dtype=F64)
    mask = torch.tensor([[True, False], [False, False]])
    kl = low_var_kl(logp, ref, mask)
    assert kl.tolist() == pytest.approx([math.exp(-0.5) + 0.5 - 1, 0.0])
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[0, 1] == 0.0 and logp.grad[1].tolist() == [0.0, 0.0]


def test_reference_is_detached():
    logp = torch.zeros(1, 2, requires_grad=True)
    ref = torch.full((1, 2), -0.5, requires_grad=True)
    low_var_kl(logp, ref, torch.ones(1, 2, dtype=torch.bool)).sum().backward()
    assert ref.grad is None and logp.grad is not None


def test_shape_validation():
    with pytest.raises(ValueError, match="ref_token_logprobs must have shape"):
        low_var_kl(torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3, dtype=torch.bool))

"""grpo_token_loss: token-level PPO clip, the three aggregation modes, normaliser, metrics."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_hacpo.algo import GRPO_AGGREGATIONS, grpo_token_loss

F64 = torch.float64

# Two rows, old log-probs 0, so ρ_t = exp(logp_t). Clip range [0.8, 1.28].
# row 0: mask [1, 1, 1], ρ = [1, 1.5, 0.5], A = 1
#        obj = [min(1, 1), min(1.5, 1.28), min(0.5, 0.8)] = [1, 1.28, 0.5] → ℓ = [−1, −1.28, −0.5], Σ = −2.78
# row 1: mask [1, 1, 0], ρ = [1.1, 0.7, 9], A = −2
#        obj = [min(−2.2, −2.2), min(−1.4, −1.6)] = [−2.2, −1.6] → ℓ = [2.2, 1.6], Σ = 3.8
RATIOS = [[1.0, 1.5, 0.5], [1.1, 0.7, 9.0]]
MASK = [[True, True, True], [True, True, False]]
ADVANTAGES = [1.0, -2.0]


def batch():
    logp = torch.tensor([[math.log(r) for r in row] for row in RATIOS], dtype=F64, requires_grad=True)
    return logp, torch.zeros(2, 3, dtype=F64), torch.tensor(ADVANTAGES, dtype=F64), torch.tensor(MASK)


@pytest.mark.parametrize(
    ("agg", "expected"),
    [
        ("token-mean", (-2.78 + 3.8) / 5),  # 0.204
        ("seq-mean-token-mean", (-2.78 / 3 + 3.8 / 2) / 2),  # 0.48667
        ("seq-mean-token-sum", (-2.78 + 3.8) / 2),  # 0.51
    ],
)
def test_aggregation_modes_hand_numbers(agg, expected):
    logp, old, adv, mask = batch()
    loss, _ = grpo_token_loss(logp, old, adv, mask, agg=agg)
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_token_mean_gradient():
    # dℓ_t/dlogp_t = −ρ·A on tokens where the unclipped term is the min, else 0; divided by 5 tokens.
    logp, old, adv, mask = batch()
    loss, _ = grpo_token_loss(logp, old, adv, mask)
    loss.backward()
    expected = [[-1.0 / 5, 0.0, -0.5 / 5], [2.2 / 5, 0.0, 0.0]]
    torch.testing.assert_close(logp.grad, torch.tensor(expected, dtype=F64), rtol=1e-12, atol=1e-15)


def test_seq_mean_token_mean_gradient():
    # row 0 tokens weigh 1/(3·2), row 1 tokens 1/(2·2)
    logp, old, adv, mask = batch()
    loss, _ = grpo_token_loss(logp, old, adv, mask, agg="seq-mean-token-mean")
    loss.backward()
    expected = [[-1.0 / 6, 0.0, -0.5 / 6], [2.2 / 4, 0.0, 0.0]]
    torch.testing.assert_close(logp.grad, torch.tensor(expected, dtype=F64), rtol=1e-12, atol=1e-15)


def test_global_normaliser():
    logp, old, adv, mask = batch()
    # token-mean divides the token sum by the normaliser (a global token count): 1.02/10
    assert grpo_token_loss(logp, old, adv, mask, normaliser=10)[0].item() == pytest.approx(0.102)
    # seq-mean-token-sum divides the per-sequence sums by a global sequence count: 1.02/4
    loss = grpo_token_loss(logp, old, adv, mask, agg="seq-mean-token-sum", normaliser=4)[0]
    assert loss.item() == pytest.approx(0.255)
    # seq-mean-token-mean: (−2.78/3 + 1.9)/4
    loss = grpo_token_loss(logp, old, adv, mask, agg="seq-mean-token-mean", normaliser=4)[0]
    assert loss.item() == pytest.approx((-2.78 / 3 + 1.9) / 4)


def test_micro_batches_with_global_token_count_add_up_to_the_full_loss():
    logp, old, adv, mask = batch()
    full = grpo_token_loss(logp, old, adv, mask)[0]
    parts = [
        grpo_token_loss(logp[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1], normaliser=5)[0]
        for i in (0, 1)
    ]
    assert (parts[0] + parts[1]).item() == pytest.approx(full.item(), rel=1e-12)


def test_token_level_advantages_equal_broadcast_sequence_advantages():
    logp, old, adv, mask = batch()
    per_sequence, _ = grpo_token_loss(logp, old, adv, mask)
    per_token, _ = grpo_token_loss(logp, old, adv[:, None].expand(2, 3).clone(), mask)
    assert per_token.item() == per_sequence.item()


def test_metrics_hand_numbers():
    logp, old, adv, mask = batch()
    _, metrics = grpo_token_loss(logp, old, adv, mask)
    # masked ratios [1, 1.5, 0.5, 1.1, 0.7]
    assert metrics["num_tokens"].item() == 5.0 and metrics["num_rows"].item() == 2.0
    assert metrics["ratio_mean"].item() == pytest.approx(4.8 / 5)
    assert metrics["ratio_min"].item() == pytest.approx(0.5)
    assert metrics["ratio_max"].item() == pytest.approx(1.5)  # the masked 9.0 is ignored
    assert metrics["clip_low_frac"].item() == pytest.approx(2 / 5)  # 0.5, 0.7 < 0.8
    assert metrics["clip_high_frac"].item() == pytest.approx(1 / 5)  # 1.5 > 1.28
    assert metrics["clip_active_frac"].item() == pytest.approx(2 / 5)  # row 0 t1 (A>0), row 1 t1 (A<0)
    kl = -(math.log(1.0) + math.log(1.5) + math.log(0.5) + math.log(1.1) + math.log(0.7)) / 5
    assert metrics["approx_kl"].item() == pytest.approx(kl)
    assert metrics["adv_abs_mean"].item() == pytest.approx((3 * 1 + 2 * 2) / 5)
    assert metrics["loss"].item() == pytest.approx(0.204)


def test_padding_with_nan_does_not_leak():
    logp, old, adv, mask = batch()
    logp_nan = logp.detach().clone()
    logp_nan[1, 2] = float("nan")
    logp_nan.requires_grad_()
    old_nan = old.clone()
    old_nan[1, 2] = float("-inf")
    loss, _ = grpo_token_loss(logp_nan, old_nan, adv, mask)
    loss.backward()
    assert loss.item() == pytest.approx(0.204)
    assert torch.isfinite(logp_nan.grad).all() and logp_nan.grad[1, 2] == 0.0


def test_unknown_agg_lists_valid_modes():
    logp, old, adv, mask = batch()
    with pytest.raises(ValueError, match="token-mean.*seq-mean-token-mean.*seq-mean-token-sum"):
        grpo_token_loss(logp, old, adv, mask, agg="sum")
    assert GRPO_AGGREGATIONS == ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def test_validation_errors():
    logp, old, adv, mask = batch()
    with pytest.raises(ValueError, match="old_token_logprobs must have shape"):
        grpo_token_loss(logp, old[:, :2], adv, mask)
    with pytest.raises(ValueError, match="advantages must have shape"):
        grpo_token_loss(logp, old, torch.zeros(3), mask)
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        grpo_token_loss(logp, old, adv, mask.float())
    with pytest.raises(ValueError, match="normaliser"):
        grpo_token_loss(logp, old, adv, mask, normaliser=-1)

"""Property tests (hypothesis): invariants of the advantages and finiteness of the losses."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_hacpo.algo import (
    group_advantages,
    grpo_token_loss,
    gspo_loss,
    hacpo_advantages,
    hacpo_loss,
    low_var_kl,
    sequence_mean_logprob,
)

F64 = torch.float64
PROPERTY = settings(max_examples=60, deadline=None)

binary_reward = st.sampled_from([0.0, 1.0])
real_reward = st.floats(min_value=-1.0, max_value=1.0, allow_nan=False, allow_infinity=False)
wide_reward = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)
omega_value = st.floats(min_value=0.1, max_value=10.0)


@st.composite
def joint_rewards(draw, reward=binary_reward):
    """(rewards [B, n, G] float64, learner, omega [n]) with n ≥ 2 and ω(k→k) = 1."""
    batch, agents, group = draw(st.integers(1, 3)), draw(st.integers(2, 4)), draw(st.integers(1, 5))
    values = draw(st.lists(reward, min_size=batch * agents * group, max_size=batch * agents * group))
    learner = draw(st.integers(0, agents - 1))
    omega = draw(st.lists(omega_value, min_size=agents, max_size=agents))
    omega[learner] = 1.0
    rewards = torch.tensor(values, dtype=F64).reshape(batch, agents, group)
    return rewards, learner, torch.tensor(omega, dtype=F64)


@st.composite
def reward_groups(draw, reward=binary_reward):
    batch, group = draw(st.integers(1, 4)), draw(st.integers(2, 8))
    values = draw(st.lists(reward, min_size=batch * group, max_size=batch * group))
    return torch.tensor(values, dtype=F64).reshape(batch, group)


@PROPERTY
@given(st.one_of(joint_rewards(binary_reward), joint_rewards(wide_reward)), st.booleans())
def test_hacpo_advantages_are_finite(case, guards):
    rewards, learner, omega = case
    assert torch.isfinite(hacpo_advantages(rewards, learner, omega, guards=guards)).all()
    assert torch.isfinite(hacpo_advantages(rewards.float(), learner, omega)).all()


@PROPERTY
@given(st.one_of(joint_rewards(binary_reward), joint_rewards(real_reward)))
def test_unit_omega_equals_group_advantages_of_the_joint_group(case):
    rewards, learner, _ = case
    batch, agents, group = rewards.shape
    joint = group_advantages(rewards.reshape(batch, agents * group))
    result = hacpo_advantages(rewards, learner, torch.ones(agents, dtype=F64))
    torch.testing.assert_close(result.reshape(batch, -1), joint, rtol=1e-12, atol=1e-9)


@PROPERTY
@given(st.one_of(joint_rewards(binary_reward), joint_rewards(real_reward)))
def test_all_equal_joint_groups_give_zero_advantages(case):
    rewards, learner, omega = case
    rewards[0] = rewards[0, 0, 0]  # make prompt 0's joint group uniform
    assert torch.equal(hacpo_advantages(rewards, learner, omega)[0], torch.zeros_like(rewards[0]))


@PROPERTY
@given(st.one_of(reward_groups(binary_reward), reward_groups(wide_reward)))
def test_group_advantages_are_finite_and_sum_to_zero(rewards):
    advantages = group_advantages(rewards)
    assert torch.isfinite(advantages).all()
    # Σ_i (r_i − mean) = 0 exactly in real arithmetic; allow float64 rounding relative to the scale
    scale = advantages.abs().amax(dim=-1).clamp(min=1.0) * rewards.shape[1]
    assert (advantages.sum(dim=-1).abs() <= 1e-12 * scale).all()


extreme_logprob = st.one_of(
    st.sampled_from([-1e4, 1e4, 0.0, -1e-8]),
    st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, allow_infinity=False),
)


@st.composite
def loss_rows(draw):
    size = draw(st.integers(1, 6))
    learner = draw(st.lists(extreme_logprob, min_size=size, max_size=size))
    behaviour = draw(st.lists(extreme_logprob, min_size=size, max_size=size))
    advantages = draw(st.lists(st.floats(-1e3, 1e3), min_size=size, max_size=size))
    is_cross = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    omega = draw(st.lists(omega_value, min_size=size, max_size=size))
    return (
        learner,
        behaviour,
        advantages,
        is_cross,
        omega,
        draw(st.integers(0, 12)),
        draw(st.sampled_from([0.0, 1.0, 3.0])),
    )


@PROPERTY
@given(loss_rows(), st.sampled_from([torch.float32, F64]))
def test_hacpo_loss_and_gradient_are_finite_for_extreme_logprobs(rows, dtype):
    learner_values, behaviour_values, advantages, is_cross, omega, update_index, alpha = rows
    learner = torch.tensor(learner_values, dtype=dtype, requires_grad=True)
    loss, metrics = hacpo_loss(
        learner,
        torch.tensor(behaviour_values, dtype=dtype),
        torch.tensor(advantages, dtype=dtype),
        torch.tensor(is_cross),
        torch.tensor(omega, dtype=dtype),
        update_index,
        alpha=alpha,
        delta=0.2,
        delta_step=0.025,
        eps_low=3e-4,
        eps_high=4e-4,
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(learner.grad).all()
    assert (metrics["self_ratio_max"].isnan() | (metrics["self_ratio_max"] <= 22027)).item()  # e^10 = 22026.5
    gspo, _ = gspo_loss(
        learner,
        torch.tensor(behaviour_values, dtype=dtype),
        torch.tensor(advantages, dtype=dtype),
        eps_low=3e-4,
        eps_high=4e-4,
    )
    assert torch.isfinite(gspo)


@st.composite
def token_batches(draw):
    rows, tokens = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    count = rows * tokens
    logp = draw(st.lists(extreme_logprob, min_size=count, max_size=count))
    other = draw(st.lists(extreme_logprob, min_size=count, max_size=count))
    mask = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    advantages = draw(st.lists(st.floats(-1e3, 1e3), min_size=rows, max_size=rows))
    shape = (rows, tokens)
    return (
        torch.tensor(logp, dtype=F64).reshape(shape),
        torch.tensor(other, dtype=F64).reshape(shape),
        torch.tensor(mask).reshape(shape),
        torch.tensor(advantages, dtype=F64),
    )


@PROPERTY
@given(token_batches(), st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]))
def test_token_losses_and_gradients_are_finite_for_extreme_logprobs(batch, agg):
    logp, other, mask, advantages = batch
    logp.requires_grad_()
    loss, _ = grpo_token_loss(logp, other, advantages, mask, agg=agg)
    kl = low_var_kl(logp, other, mask)
    mean_logprob = sequence_mean_logprob(logp, mask)
    (loss + kl.sum() + mean_logprob.sum()).backward()
    assert torch.isfinite(loss) and torch.isfinite(kl).all() and torch.isfinite(logp.grad).all()
    # k3 ≥ 0 in exact arithmetic (e^d − d − 1 can round to ≈ −1e-17 for tiny d), clamped at 10
    assert ((kl >= -1e-12) & (kl <= 10)).all()

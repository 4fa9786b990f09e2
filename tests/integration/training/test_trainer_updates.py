"""One rank (an in-process gloo world of one): what single HACPO updates do to the tiny model.

- `compute_mean_logprobs` is the mean of log-softmax over the true vocabulary at the shifted positions;
- a positive advantage raises its sequence's mean log-prob, a negative one lowers it;
- a cross row with s > 1 contributes exactly zero gradient (bit-identical update when its advantage is
  zeroed; removing it only rescales the mean by 16/15), while a cross row inside [lo_u, 1] does contribute;
- the update index u reaches the loss: with M = 4 the cross rows meet lo_2 = 0.85 and lo_3 = 0.875;
- grpo and the KL term get their old / reference token log-probs from the trainer itself;
- the LR schedule: linear warm-up from lr/W, then cosine decay.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import pytest
import torch

from nemo_hacpo.config import AlgoConfig, OptimizerConfig
from tests.helpers.megatron_setup import gloo_world_of_one
from tests.integration.training.tiny_setup import (
    VOCAB_SIZE,
    as_own_rows,
    mean_logprobs,
    plain_rows,
    tiny_agent,
    tiny_arch,
    token_rows,
    train,
    training_rows,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU/gloo test (GPU: tests/gpu/)"),
]


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    with gloo_world_of_one():
        yield


def _trainer(optimizer: OptimizerConfig, reference_model: bool = False):
    from nemo_hacpo.training import MegatronTrainer

    agent = dataclasses.replace(tiny_agent(), optimizer=optimizer)
    return MegatronTrainer(agent, tiny_arch(agent), seed=1234, reference_model=reference_model)


def _sgd(lr: float) -> OptimizerConfig:
    return OptimizerConfig(name="sgd", lr=lr, weight_decay=0.0, clip_grad=0.0, use_distributed_optimizer=False)


def _weights(trainer) -> dict[str, torch.Tensor]:
    return {name: param.detach().clone() for name, param in trainer.module.named_parameters()}


def _rows(trainer):
    token_ids, response_mask = token_rows()
    plain = plain_rows(token_ids, response_mask)
    return training_rows(mean_logprobs(trainer, plain))


def test_mean_logprob_is_the_shifted_log_softmax_over_the_true_vocabulary(world: None) -> None:
    trainer = _trainer(_sgd(0.1))
    try:
        token_ids, response_mask = token_rows()
        rows = _rows(trainer)
        mean_logprob = rows.old_mean_logprob[:8]  # self rows: behaviour = m_old exactly
        for index in range(8):
            tokens = torch.tensor(token_ids[index])
            with torch.no_grad():
                logits = trainer.module(tokens[None, :-1], torch.arange(len(tokens) - 1)[None], None)  # [1, L-1, V']
            logprobs = torch.log_softmax(logits[0, :, :VOCAB_SIZE].double(), dim=-1)  # padding rows excluded
            token_logprobs = logprobs.gather(-1, tokens[1:, None])[:, 0]  # position t scores token t+1
            scored = torch.tensor(response_mask[index][1:], dtype=torch.bool)
            assert float(mean_logprob[index]) == pytest.approx(float(token_logprobs[scored].mean()), abs=1e-5)
    finally:
        trainer.close()


def test_positive_advantage_raises_and_negative_lowers_the_mean_logprob(world: None) -> None:
    trainer = _trainer(OptimizerConfig(name="adam", lr=1e-3, weight_decay=0.0, clip_grad=1.0,
                                       use_distributed_optimizer=False))
    try:
        rows = _rows(trainer)
        before = rows.old_mean_logprob.clone()
        advantages = torch.zeros(len(rows))
        advantages[0], advantages[1] = 1.0, -1.0  # two self rows; every other row has A = 0
        rows = as_own_rows(rows).replace(advantages=advantages, old_mean_logprob=before)
        train(trainer, rows, AlgoConfig(updates_per_step=1, kl_coef=0.0), step=0)
        after = mean_logprobs(trainer, rows)
        assert after[0] > before[0] + 1e-3
        assert after[1] < before[1] - 1e-3
    finally:
        trainer.close()


def test_cross_row_above_one_has_exactly_zero_gradient(world: None) -> None:
    trainer = _trainer(_sgd(1.0))
    algo = AlgoConfig(updates_per_step=1, kl_coef=0.0)
    try:
        rows = _rows(trainer)
        initial = {name: value.clone() for name, value in trainer.module.state_dict().items()
                   if isinstance(value, torch.Tensor)}

        def update_of(variant) -> dict[str, torch.Tensor]:
            trainer.module.load_state_dict(initial, strict=False)
            train(trainer, variant, algo, step=0)
            return {name: initial[name] - weight for name, weight in _weights(trainer).items()}

        def with_advantage(row: int, value: float):
            advantages = rows.advantages.clone()
            advantages[row] = value
            return dataclasses.replace(rows, advantages=advantages)

        baseline = update_of(rows)
        above, inside = 8, 9  # s = exp(0.3) = 1.35 > 1 and s = exp(−0.05) = 0.95 ∈ [0.8, 1] (tiny_setup)
        assert rows.cross_objective[above] and rows.cross_objective[inside] and rows.advantages[above] != 0
        zeroed_above = update_of(with_advantage(above, 0.0))
        zeroed_inside = update_of(with_advantage(inside, 0.0))
        for name, update in baseline.items():
            assert torch.equal(zeroed_above[name], update), name  # bit for bit
        assert any(not torch.allclose(zeroed_inside[n], u, rtol=0, atol=1e-6) for n, u in baseline.items())

        # Dropping the row: the remaining rows' objective is the same, divided by 15 instead of 16 (up to float
        # rounding: w − w′ in fp32 resolves an update only to an ulp of w, 1.2e-7 for the norm weights at 1).
        keep = [i for i in range(len(rows)) if i != above]
        dropped = dataclasses.replace(
            rows, token_ids=[rows.token_ids[i] for i in keep], response_mask=[rows.response_mask[i] for i in keep],
            advantages=rows.advantages[keep], cross_objective=rows.cross_objective[keep], omega=rows.omega[keep],
            old_mean_logprob=rows.old_mean_logprob[keep], is_own=rows.is_own[keep], source=rows.source[keep],
            ratio_length_scale=rows.ratio_length_scale[keep])
        without_row = update_of(dropped)
        for name, update in baseline.items():
            torch.testing.assert_close(without_row[name] * 15 / 16, update, rtol=0, atol=5e-7)
    finally:
        trainer.close()


def test_naive_onpolicy_trains_shared_rows_from_the_learners_own_old_logprob(world: None) -> None:
    """`naive_onpolicy`: the trainer replaces the source's m_old of every row the learner did not sample by its own
    (and the length scale by 1) before the first update, so the update equals `naive` on rows whose m_old is the
    learner's — and differs from `naive` on the source's (the cross rows' m_old sit 0.3 … −0.5 nats away)."""
    trainer = _trainer(_sgd(1.0))
    try:
        rows = _rows(trainer)
        learner_m = mean_logprobs(trainer, rows)
        scale = torch.where(rows.is_own, 1.0, 1.25)
        shared = rows.replace(cross_objective=torch.zeros(len(rows), dtype=torch.bool), ratio_length_scale=scale)
        initial = {name: value.clone() for name, value in trainer.module.state_dict().items()
                   if isinstance(value, torch.Tensor)}

        def update_of(variant, name: str) -> dict[str, torch.Tensor]:
            trainer.module.load_state_dict(initial, strict=False)
            metrics = train(trainer, variant, AlgoConfig(name=name, updates_per_step=1, kl_coef=0.0), step=0)
            return {n: initial[n] - w for n, w in _weights(trainer).items()}, metrics

        onpolicy, metrics = update_of(shared, "naive_onpolicy")
        assert torch.equal(shared.old_mean_logprob, rows.old_mean_logprob)  # the caller's rows stay untouched
        assert metrics["self_ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # every row at ratio 1 at u = 0
        as_if_own, _ = update_of(shared.replace(old_mean_logprob=learner_m.float(),
                                                ratio_length_scale=torch.ones(len(rows))), "naive")
        source_m, _ = update_of(shared, "naive")
        for name, update in onpolicy.items():
            torch.testing.assert_close(update, as_if_own[name], rtol=0, atol=1e-6)
        assert any(not torch.allclose(source_m[n], u, rtol=0, atol=1e-4) for n, u in onpolicy.items())
    finally:
        trainer.close()


def test_update_index_sets_the_stepwise_cross_clip(world: None) -> None:
    """M = 4 over 16 rows: self rows in updates 0–1, cross rows 8–11 in update 2 (lo = 0.85) and 12–15 in
    update 3 (lo = 0.875). s = 1.35, 0.95, 0.90, 0.61 | 1.05, 0.86, 0.74, 0.98 (lr 1e-6 barely moves them):
    below lo: 0.61 | 0.86, 0.74 → 3 of 8; above 1: 1.35 | 1.05 → 2 of 8."""
    trainer = _trainer(_sgd(1e-6))
    try:
        rows = _rows(trainer)
        metrics = train(trainer, rows, AlgoConfig(updates_per_step=4, kl_coef=0.0), step=0)
        assert metrics["cross_clip_lower"] == pytest.approx((0.8 + 0.825 + 0.85 + 0.875) / 4)
        assert metrics["cross_clip_low_frac"] == pytest.approx(3 / 8)
        assert metrics["cross_clip_high_frac"] == pytest.approx(2 / 8)
        assert metrics["num_rows"] == 16 and metrics["num_self"] == 8 and metrics["num_cross"] == 8
        assert sorted(k for k in metrics if k.startswith("loss_u")) == ["loss_u0", "loss_u1", "loss_u2", "loss_u3"]
        assert metrics["loss"] == pytest.approx(sum(metrics[f"loss_u{u}"] for u in range(4)) / 4)

        with pytest.raises(ValueError, match="cannot fill 17 updates"):
            train(trainer, rows, AlgoConfig(updates_per_step=17, kl_coef=0.0), step=1)
    finally:
        trainer.close()


def test_grpo_and_kl_take_old_and_reference_logprobs_from_the_trainer(world: None) -> None:
    trainer = _trainer(_sgd(0.1), reference_model=True)
    try:
        rows = _rows(trainer)
        rows = as_own_rows(rows)
        # At the start of the step: old = current weights (ratio 1) and reference = current (KL 0).
        metrics = train(trainer, rows, AlgoConfig(name="grpo", updates_per_step=1, kl_coef=0.5), step=0)
        assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
        assert metrics["kl_mean"] == pytest.approx(0.0, abs=1e-9) and metrics["kl_loss"] == pytest.approx(0.0, abs=1e-9)
        assert metrics["num_tokens"] == sum(sum(mask[1:]) for mask in rows.response_mask)
        assert rows.old_token_logprobs is None  # the caller's rows are not modified
        # After an update the policy has left the reference: the KL term is live.
        metrics = train(trainer, rows, AlgoConfig(name="grpo", updates_per_step=1, kl_coef=0.5), step=1)
        assert metrics["kl_mean"] > 1e-6 and metrics["kl_loss"] > 0
    finally:
        trainer.close()
    without_reference = _trainer(_sgd(0.1))
    try:
        with pytest.raises(ValueError, match="reference model"):
            train(without_reference, rows, AlgoConfig(kl_coef=0.001, updates_per_step=1), step=0)
    finally:
        without_reference.close()


def test_learning_rate_schedule_warms_up_from_lr_over_w_and_decays(world: None) -> None:
    """W = 2, cosine to min_lr 1e-4 over 6 updates: lr_k = 5e-4, 7.5e-4, 1e-3, then
    1e-4 + 0.9e-3·(1 + cos(π·(k − 2)/4))/2 for k = 3..6 (Megatron's OptimizerParamScheduler)."""
    from nemo_hacpo.training import MegatronTrainer

    optimizer = OptimizerConfig(name="sgd", lr=1e-3, min_lr=1e-4, weight_decay=0.0, lr_warmup_steps=2,
                                lr_decay_style="cosine", use_distributed_optimizer=False)
    agent = dataclasses.replace(tiny_agent(), optimizer=optimizer)
    trainer = MegatronTrainer(agent, tiny_arch(agent), seed=1234, total_updates=6)
    try:
        rows = _rows(trainer)
        seen = [train(trainer, rows, AlgoConfig(updates_per_step=1, kl_coef=0.0), step=k)["lr"] for k in range(7)]
        expected = [5e-4, 7.5e-4, 1e-3] + [1e-4 + 0.9e-3 * (1 + math.cos(math.pi * (k - 2) / 4)) / 2
                                           for k in range(3, 7)]
        assert seen == pytest.approx(expected, rel=1e-9)
    finally:
        trainer.close()


def _fp16(agent_optimizer: OptimizerConfig, dtype: str):
    from nemo_hacpo.training import MegatronTrainer

    agent = dataclasses.replace(tiny_agent(), optimizer=agent_optimizer)
    agent = dataclasses.replace(agent, precision=dataclasses.replace(agent.precision, dtype=dtype))
    return MegatronTrainer(agent, tiny_arch(agent), seed=1234)


def _moved(before: dict[str, torch.Tensor], trainer) -> float:
    return math.sqrt(sum(float((param.detach().float() - before[name].float()).norm()) ** 2
                         for name, param in trainer.module.named_parameters()))


def test_fp16_trains_like_fp32_under_its_loss_scale(world: None) -> None:
    """fp16 scales the loss before backward and unscales the gradients in the optimizer. Without the scaling
    wired into the schedule, the optimizer divided unscaled gradients by 2^32 and Adam moved the weights by
    ~2e-6 instead of ~0.6 (measured). Adam's first update is lr·g/(|g| + ε) per weight, so with the gradients
    right it moves both dtypes by nearly the same amount."""
    optimizer = OptimizerConfig(name="adam", lr=1e-3, weight_decay=0.0, clip_grad=1.0, use_distributed_optimizer=False)
    moved = {}
    for dtype in ("fp32", "fp16"):
        trainer = _fp16(optimizer, dtype)
        try:
            rows = _rows(trainer)
            advantages = torch.zeros(len(rows))
            advantages[0], advantages[1] = 1.0, -1.0
            rows = as_own_rows(rows).replace(advantages=advantages)
            before = _weights(trainer)
            metrics = train(trainer, rows, AlgoConfig(updates_per_step=1, kl_coef=0.0), step=0)
            moved[dtype] = _moved(before, trainer)
            if dtype == "fp16":
                assert (metrics["loss_scale"], metrics["skipped_updates"]) == (2.0**16, 0.0)
                assert math.isfinite(metrics["grad_norm"])
                after = mean_logprobs(trainer, rows)
                assert after[0] > rows.old_mean_logprob[0] and after[1] < rows.old_mean_logprob[1]
            else:
                assert "loss_scale" not in metrics
        finally:
            trainer.close()
    assert moved["fp16"] == pytest.approx(moved["fp32"], rel=0.05), moved


def _set_loss_scale(trainer, scale: float) -> None:
    for optimizer in trainer.optimizer.chained_optimizers:  # Megatron: one scaler per parameter-group optimizer
        optimizer.grad_scaler._scale = torch.tensor([scale])


def test_fp16_overflow_skips_the_update_and_lowers_the_scale(world: None) -> None:
    """A loss scale of 2^40 overflows fp16 (max 65504) in backward: both updates of the step are skipped (weights
    bit-identical, the LR schedule not advanced), the second consecutive overflow halves the scale (hysteresis 2),
    and the step reports it instead of failing; the next step trains at the warm-up's first LR."""
    optimizer = OptimizerConfig(name="adam", lr=1e-3, weight_decay=0.0, clip_grad=0.0, lr_warmup_steps=2,
                                use_distributed_optimizer=False)
    trainer = _fp16(optimizer, "fp16")
    try:
        rows = _rows(trainer)
        _set_loss_scale(trainer, 2.0**40)
        before = _weights(trainer)
        metrics = train(trainer, rows, AlgoConfig(updates_per_step=2, kl_coef=0.0), step=0)
        assert (metrics["skipped_updates"], metrics["loss_scale"]) == (2.0, 2.0**39)
        assert math.isnan(metrics["grad_norm"])
        assert all(torch.equal(param, before[name]) for name, param in trainer.module.named_parameters())
        _set_loss_scale(trainer, 2.0**16)
        metrics = train(trainer, rows, AlgoConfig(updates_per_step=1, kl_coef=0.0), step=1)
        assert (metrics["skipped_updates"], metrics["lr"]) == (0.0, pytest.approx(5e-4, rel=1e-9))
        assert _moved(before, trainer) > 0.1
    finally:
        trainer.close()

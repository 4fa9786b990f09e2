"""The trainer with sequence packing equals the padded trainer (one rank, an in-process gloo world of one).

Megatron's local spec with the packed-sequence attention (`PackedDotProductAttention`) on CPU: same seed,
so the same initial weights (the attention kernel holds no parameters). On the tiny test model and its 16
seeded rows of 10–48 tokens:
  * mean and per-token log-probs (policy and reference) agree within 1e-6;
  * one hacpo update and one grpo + KL update (SGD, lr 0.1) give the same metrics (1e-5) and weights (1e-6),
    also with a 160-token budget (which packs more rows per micro-batch than it pads) and T padded to 16;
  * the switch is read from `agent.parallel.sequence_packing` when the config has that field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch

from nemo_hacpo.config import AlgoConfig, OptimizerConfig, ParallelConfig
from tests.helpers.megatron_setup import gloo_world_of_one
from tests.integration.training.tiny_setup import (
    TIMING_METRICS,
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

LOGPROB_ATOL, METRIC_ATOL, WEIGHT_ATOL = 1e-6, 1e-5, 1e-6
SGD = OptimizerConfig(name="sgd", lr=0.1, weight_decay=0.0, clip_grad=0.0, use_distributed_optimizer=False)
ALGOS = {"hacpo": AlgoConfig(updates_per_step=2, kl_coef=0.0),
         "grpo_kl": AlgoConfig(name="grpo", updates_per_step=2, kl_coef=0.1)}


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    with gloo_world_of_one():
        yield


def _trainer(packing: bool, micro_batch_size: int = 2, **kwargs):
    from nemo_hacpo.training import MegatronTrainer

    agent = dataclasses.replace(tiny_agent(micro_batch_size=micro_batch_size), optimizer=SGD)
    return MegatronTrainer(agent, tiny_arch(agent), seed=1234, reference_model=True, sequence_packing=packing,
                           **kwargs)


def _plain_rows():
    return plain_rows(*token_rows())


def _run(packing: bool, **kwargs) -> dict:
    """Log-probs at the initial weights, then per objective: metrics and weights after one step."""
    out: dict = {}
    trainer = _trainer(packing, **kwargs)
    try:
        assert trainer.sequence_packing is packing
        initial = {k: v.clone() for k, v in trainer.module.state_dict().items() if isinstance(v, torch.Tensor)}
        plain = _plain_rows()
        out["weights"] = initial
        out["mean"] = mean_logprobs(trainer, plain)
        out["tokens"] = trainer.compute_token_logprobs(plain.token_ids, plain.response_mask)
        out["reference_tokens"] = trainer.compute_token_logprobs(plain.token_ids, plain.response_mask, reference=True)
        rows = training_rows(out["mean"])
        for label, algo in ALGOS.items():
            if label == "grpo_kl":  # all self rows: the KL term (self rows only) is live in the second update
                rows = as_own_rows(rows)
            trainer.module.load_state_dict(initial, strict=False)
            metrics = train(trainer, rows, algo, step=0)
            out[label] = {"metrics": {k: v for k, v in metrics.items() if k not in TIMING_METRICS},
                          "weights": {n: p.detach().clone() for n, p in trainer.module.named_parameters()}}
    finally:
        trainer.close()
    return out


@pytest.fixture(scope="module")
def padded_run(world: None) -> dict:
    return _run(packing=False)


@pytest.mark.parametrize("variant", ["mbs2", "budget160_pad16"])
def test_packed_trainer_equals_padded_trainer(padded_run: dict, variant: str) -> None:
    kwargs = {} if variant == "mbs2" else {"micro_batch_size": 8, "max_tokens_per_micro_batch": 160,
                                           "pad_to_multiple": 16}
    packed_run = _run(packing=True, **kwargs)
    for name, value in padded_run["weights"].items():
        assert torch.equal(packed_run["weights"][name], value), f"different initial weights: {name}"
    for key in ("mean", "tokens", "reference_tokens"):
        gap = float((packed_run[key] - padded_run[key]).abs().max())
        print(f"{variant} {key}: max |Δ| = {gap:.1e}")  # shown with -s
        assert packed_run[key].shape == padded_run[key].shape and gap <= LOGPROB_ATOL, key
    for label in ALGOS:
        expected, actual = padded_run[label], packed_run[label]
        assert actual["metrics"].keys() == expected["metrics"].keys()
        for key, value in expected["metrics"].items():
            assert actual["metrics"][key] == pytest.approx(value, abs=METRIC_ATOL, nan_ok=True), f"{label}: {key}"
        moved = max(float((w - padded_run["weights"][n]).abs().max()) for n, w in expected["weights"].items())
        assert moved > 1e-4, "the update must move the weights"
        for name, weight in expected["weights"].items():
            torch.testing.assert_close(actual["weights"][name], weight, rtol=0, atol=WEIGHT_ATOL,
                                       msg=lambda m, n=name, lab=label: f"{lab} {n}: {m}")
    assert padded_run["grpo_kl"]["metrics"]["kl_loss"] > 1e-6  # the second update sees a moved policy


def test_token_budget_packs_more_rows_than_it_pads(world: None) -> None:
    """160 tokens: padded micro-batches hold rows·longest ≤ 160, packed ones Σ lengths ≤ 160."""
    lengths = [len(t) - 1 for t in token_rows()[0]]
    plans = []
    for packing in (False, True):  # one trainer (one Megatron parallel state) at a time
        trainer = _trainer(packing, micro_batch_size=8, max_tokens_per_micro_batch=160)
        try:
            plans.append(trainer._shard_micro_batches(range(len(lengths)), lengths))
        finally:
            trainer.close()
    padded_plan, packed_plan = plans
    assert all(sum(lengths[r] for r in batch) <= 160 or len(batch) == 1 for batch in packed_plan)
    assert all(len(batch) * max(lengths[r] for r in batch) <= 160 or len(batch) == 1 for batch in padded_plan)
    assert len(packed_plan) < len(padded_plan)


@dataclasses.dataclass(frozen=True)
class PackingParallelConfig(ParallelConfig):
    """A `ParallelConfig` with the field the lead adds to nemo_hacpo/config.py."""

    sequence_packing: bool = True


def test_the_switch_is_read_from_the_agent_config(world: None) -> None:
    from nemo_hacpo.training import MegatronTrainer

    agent = dataclasses.replace(tiny_agent(), parallel=PackingParallelConfig(micro_batch_size=2))
    trainer = MegatronTrainer(agent, tiny_arch(agent), seed=1234)
    try:
        assert trainer.sequence_packing
        attention = trainer.module.decoder.layers[0].self_attention.core_attention
        assert type(attention).__name__ == "PackedDotProductAttention"
    finally:
        trainer.close()
    plain = MegatronTrainer(tiny_agent(), tiny_arch(tiny_agent()), seed=1234)
    try:
        assert not plain.sequence_packing
        assert type(plain.module.decoder.layers[0].self_attention.core_attention).__name__ == "DotProductAttention"
    finally:
        plain.close()

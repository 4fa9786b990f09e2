"""The reference model (β > 0) offloaded to host memory between its forwards (one rank, gloo world of one).

On CPU host and device coincide, so placement is checked by storage: between calls every reference
parameter *is* its host tensor (`HostOffload.host_tensors`, same data pointer); during the reference
forward it is a separate device copy; afterwards the host tensor again. Reference log-probs, a grpo + KL
step and a checkpoint round trip are identical with and without offloading. tests/gpu/ checks CUDA
placement, pinned memory and the freed device bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from nemo_hacpo.config import AlgoConfig, OptimizerConfig
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

SGD = OptimizerConfig(name="sgd", lr=0.1, weight_decay=0.0, clip_grad=0.0, use_distributed_optimizer=False)
GRPO_KL = AlgoConfig(name="grpo", updates_per_step=2, kl_coef=0.1)


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    with gloo_world_of_one():
        yield


def _trainer(offload: bool, reference_model: bool = True):
    from nemo_hacpo.training import MegatronTrainer

    agent = dataclasses.replace(tiny_agent(), optimizer=SGD)
    return MegatronTrainer(agent, tiny_arch(agent), seed=1234, reference_model=reference_model,
                           offload_reference=offload)


def _rows():
    return plain_rows(*token_rows())


def _host_pointers(trainer) -> dict[str, int]:
    return {name: tensor.data_ptr() for name, tensor in trainer.reference_offload.host_tensors.items()}


def _reference_pointers(trainer) -> dict[str, int]:
    return {name: p.data_ptr() for name, p in trainer.reference.named_parameters()}


def _run(offload: bool) -> dict:
    trainer = _trainer(offload)
    try:
        rows = _rows()
        reference_before = trainer.compute_token_logprobs(rows.token_ids, rows.response_mask, reference=True)
        step_rows = training_rows(mean_logprobs(trainer, rows))
        step_rows = as_own_rows(step_rows)
        metrics = train(trainer, step_rows, GRPO_KL, step=0)
        reference_after = trainer.compute_token_logprobs(rows.token_ids, rows.response_mask, reference=True)  # the step does not move it
        trainer.sync_reference()  # now the reference is the updated policy
        synced = trainer.compute_token_logprobs(rows.token_ids, rows.response_mask, reference=True)
        policy = trainer.compute_token_logprobs(rows.token_ids, rows.response_mask)
        return {"reference": reference_before, "reference_after": reference_after, "synced": synced,
                "policy": policy, "metrics": {k: v for k, v in metrics.items() if k not in TIMING_METRICS}}
    finally:
        trainer.close()


def test_offloaded_reference_gives_identical_logprobs_and_updates(world: None) -> None:
    kept, offloaded = _run(offload=False), _run(offload=True)
    for key in ("reference", "reference_after", "synced", "policy"):
        assert torch.equal(offloaded[key], kept[key]), key
    assert torch.equal(kept["reference_after"], kept["reference"])
    assert torch.equal(kept["synced"], kept["policy"]) and not torch.equal(kept["synced"], kept["reference"])
    assert offloaded["metrics"] == kept["metrics"] and kept["metrics"]["kl_loss"] > 1e-6


def test_reference_weights_are_host_tensors_between_forwards(world: None) -> None:
    trainer = _trainer(offload=True)
    try:
        offload = trainer.reference_offload
        assert offload is not None and not offload.pin_memory  # pinned only where CUDA exists
        host = _host_pointers(trainer)
        assert set(host) >= set(_reference_pointers(trainer))
        assert {n: host[n] for n in _reference_pointers(trainer)} == _reference_pointers(trainer)
        seen: list[dict[str, int]] = []
        hook = trainer.reference.register_forward_pre_hook(lambda module, args: seen.append(
            {name: p.data_ptr() for name, p in module.named_parameters()}))
        trainer.compute_token_logprobs(*token_rows(), reference=True)
        hook.remove()
        assert seen and all(pointers[n] != host[n] for pointers in seen for n in pointers)  # device copies
        assert {n: host[n] for n in _reference_pointers(trainer)} == _reference_pointers(trainer)
        assert not offload.resident
        # the policy never shares storage with the host copies
        policy = {p.data_ptr() for p in trainer.module.parameters()}
        assert policy.isdisjoint(host.values())
    finally:
        trainer.close()


def test_no_reference_model_without_beta(world: None) -> None:
    """The runtime builds the reference only for β > 0 (reference_model=False otherwise): nothing to offload."""
    trainer = _trainer(offload=True, reference_model=False)
    try:
        assert trainer.reference is None and trainer.reference_offload is None
        with pytest.raises(RuntimeError, match="no reference model"):
            trainer.compute_token_logprobs(*token_rows(), reference=True)
    finally:
        trainer.close()


def test_the_switch_is_read_from_the_agent_config_and_survives_a_checkpoint(world: None, tmp_path: Path) -> None:
    from nemo_hacpo.training import MegatronTrainer

    base = dataclasses.replace(tiny_agent(), optimizer=SGD)
    agent = dataclasses.replace(base, offload_reference=True)  # the config field, not a trainer argument
    trainer = MegatronTrainer(agent, tiny_arch(agent), seed=1234, reference_model=True)
    try:
        assert trainer.reference_offload is not None
        rows = _rows()
        expected = trainer.compute_token_logprobs(rows.token_ids, rows.response_mask, reference=True)
        trainer.save_checkpoint(str(tmp_path / "ckpt"), step=0)
        with torch.no_grad():  # disturb the host copies, then restore them from the checkpoint
            for tensor in trainer.reference_offload.host_tensors.values():
                tensor.add_(0.5)
        assert not torch.equal(trainer.compute_token_logprobs(rows.token_ids, rows.response_mask, reference=True), expected)
        host = _host_pointers(trainer)
        trainer.load_checkpoint(str(tmp_path / "ckpt"))
        assert _host_pointers(trainer) == host  # loaded into the host tensors, not replaced
        assert {n: host[n] for n in _reference_pointers(trainer)} == _reference_pointers(trainer)
        assert torch.equal(trainer.compute_token_logprobs(rows.token_ids, rows.response_mask, reference=True), expected)
    finally:
        trainer.close()

"""`training.memory.TrainStateOffload` on a real Megatron trainer (gloo world of one, CPU): what leaves, what
stays, and that training with the state offloaded between updates is bit-identical to training without.

Hand-computed sizes, P = the model's parameter count: fp32 Adam keeps m and v (2 · 4 · P bytes); fp16 (bf16 alike,
on GPUs) adds the fp32 main copy of every half-precision parameter (+ 4 · P_half; the norms stay fp32). The gradient buffers are Megatron DDP's flat fp32 `grad_data`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch

from nemo_hacpo.config import OptimizerConfig, PrecisionConfig
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
    pytest.mark.slow,  # ~15 s for both dtypes
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU/gloo test"),
]

ADAM = OptimizerConfig(name="adam", lr=1e-3, weight_decay=0.01, clip_grad=1.0, use_distributed_optimizer=False)
STEPS = 3


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    with gloo_world_of_one():
        yield


def _trainer(dtype: str):
    from nemo_hacpo.training import MegatronTrainer

    agent = dataclasses.replace(tiny_agent(), optimizer=ADAM, precision=PrecisionConfig(dtype=dtype))
    return MegatronTrainer(agent, tiny_arch(agent), seed=1234)


def _run(dtype: str, offload: bool) -> dict:
    from nemo_hacpo.config import AlgoConfig
    from nemo_hacpo.training.memory import TrainStateOffload

    trainer = _trainer(dtype)
    memory = TrainStateOffload(trainer.optimizer, [trainer.model])
    out: dict = {"metrics": [], "freed": [], "after_offload": [], "restored_equal": []}
    try:
        rows = plain_rows(*token_rows())
        for step in range(STEPS):
            if offload:
                memory.restore()
            step_rows = as_own_rows(training_rows(mean_logprobs(trainer, rows), seed=step))
            metrics = train(trainer, step_rows, AlgoConfig(name="gspo", updates_per_step=2, kl_coef=0.0), step=step)
            out["metrics"].append({k: v for k, v in metrics.items() if k not in TIMING_METRICS})
            if offload:
                state = [t.clone() for t in memory.state_tensors()]
                before = memory.device_bytes()
                out["state_bytes"] = sum(t.numel() * t.element_size() for t in state)
                out["grad_bytes"] = sum(g.numel() * g.element_size() for g in memory.grad_buffers())
                out["freed"].append((memory.offload(), before))
                out["after_offload"].append(memory.device_bytes())
                out["state_storages_empty"] = all(t.untyped_storage().nbytes() == 0 for t in memory._tracked.values())
                out["weights_intact"] = all(p.untyped_storage().nbytes() > 0 for p in trainer.model.parameters())
                memory.restore()
                out["restored_equal"].append(all(torch.equal(a, b) for a, b in zip(
                    state, memory.state_tensors(), strict=True)))
                out["grads_zero"] = all(bool((g == 0).all()) for g in memory.grad_buffers())
                memory.offload()
        memory.restore()
        out["params"] = {n: p.detach().clone() for n, p in trainer.module.named_parameters()}
        out["P"] = sum(p.numel() for p in trainer.module.parameters())
        out["P_half"] = sum(p.numel() for p in trainer.module.parameters() if p.dtype != torch.float32)
        return out
    finally:
        trainer.close()


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_offloaded_train_state_is_freed_restored_and_trains_identically(world: None, dtype: str) -> None:
    kept, offloaded = _run(dtype, offload=False), _run(dtype, offload=True)
    P, P_half = offloaded["P"], offloaded["P_half"]
    assert P_half == 0 if dtype == "fp32" else 0.99 * P < P_half < P  # fp16: all but the norms
    assert offloaded["state_bytes"] == 8 * P + 4 * P_half  # m, v, and an fp32 main copy of each half parameter
    assert offloaded["grad_bytes"] >= 4 * P  # fp32 main-grad buffer (Megatron may pad it)
    for freed, before in offloaded["freed"]:
        assert freed == before == offloaded["state_bytes"] + offloaded["grad_bytes"]
    assert offloaded["after_offload"] == [0] * STEPS
    assert offloaded["state_storages_empty"] and offloaded["weights_intact"] and offloaded["grads_zero"]
    assert offloaded["restored_equal"] == [True] * STEPS
    for name, param in kept["params"].items():
        assert torch.equal(offloaded["params"][name], param), name
    assert offloaded["metrics"] == kept["metrics"]
    assert kept["metrics"][0]["grad_norm"] > 0

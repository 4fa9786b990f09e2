"""The trainer on a bare CUDA machine: torch with CUDA and megatron-core only — no Transformer Engine, no vLLM, as on
the first H200 run (issue #38), where the trainer failed to start, leaked process groups and their NCCL memory, and
the plan's constants were off by gigabytes. Megatron's local layer spec, bf16, an NCCL world of one.

    bf16 step        the trainer builds (no fusion without its kernel), with torch SDPA as its attention (issue #40),
                     its first update sees ratio 1 exactly on own rows, the loss and gradient norm are finite
    close            building and closing trainers gives back their process groups, and their NCCL memory: GPU
                     memory outside the allocator grows by < 0.3 GiB over three trainers (1.1 GiB each before)
    offload          the train state's round trip is bit-exact, the second offload copies into the same pinned arena
    plan vs measured the training peak above the state is the plan's activations + logits within 1 GiB, for
                     Megatron's unfused attention (its s² scores) and for SDPA, which keeps far less
                     (`benchmarks/gpu_memory.py` prints the full comparison)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from nemo_hacpo.config import (
    AgentConfig,
    AlgoConfig,
    ModelSource,
    OptimizerConfig,
    ParallelConfig,
    PrecisionConfig,
    TinyModelSpec,
)
from nemo_hacpo.training.objective import Objective

pytestmark = [pytest.mark.gpu, pytest.mark.integration]

GIB = 1024**3
SPEC = TinyModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=8, num_query_groups=2, ffn_hidden_size=2816,
                     max_position_embeddings=1024)
VOCAB, ROWS, SEQ, MICRO_BATCH = 32000, 16, 512, 4
PLAN_TOLERANCE_GIB = 1.0
CLOSE_GROWTH_GIB = 0.3


def _agent() -> AgentConfig:
    return AgentConfig(name="cuda_small", model=ModelSource(tiny=SPEC),
                       parallel=ParallelConfig(micro_batch_size=MICRO_BATCH),
                       optimizer=OptimizerConfig(lr=1e-5, clip_grad=1.0, use_distributed_optimizer=True),
                       precision=PrecisionConfig(dtype="bf16"))


def _outside_allocator_gib() -> float:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return (total - free - torch.cuda.memory_reserved()) / GIB


@pytest.fixture(scope="module")
def nccl_world() -> Iterator[None]:
    from nemo_hacpo.training import destroy_distributed, init_distributed
    from tests.helpers.distributed import free_port

    init_distributed(0, 1, "127.0.0.1", free_port(), backend="nccl")
    try:
        yield
    finally:
        destroy_distributed()


def _trainer(attention: str = "auto"):
    from nemo_hacpo.models.architecture import model_arch
    from nemo_hacpo.training import MegatronTrainer

    agent = _agent()
    return MegatronTrainer(agent, model_arch(agent, tokenizer_vocab=VOCAB), seed=0, use_te=False, attention=attention)


def _rows(trainer):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from train_step_mfu import make_rows

    rows = make_rows(ROWS, SEQ, SEQ // 8, VOCAB)
    return rows.replace(old_mean_logprob=trainer.compute_mean_logprobs(rows.token_ids, rows.response_mask).float())


def test_a_bf16_step_on_the_local_spec(nccl_world: None) -> None:
    import math

    trainer = _trainer()
    try:
        assert trainer.attention == "sdpa" and not trainer.config.apply_rope_fusion
        metrics = trainer.train_step(_rows(trainer), Objective.of(AlgoConfig(updates_per_step=2, kl_coef=0.0)), 0)
        assert metrics.own_ratio_u0 == pytest.approx(1.0, abs=1e-6)
        assert math.isfinite(metrics.loss) and math.isfinite(metrics.grad_norm)
    finally:
        trainer.close()


def test_closing_trainers_gives_back_their_groups_and_nccl_memory(nccl_world: None) -> None:
    from nemo_hacpo.training.distributed import process_groups

    groups = process_groups()
    warm = _trainer()  # the first trainer also loads cuBLAS and the kernels: not a leak
    warm.train_step(_rows(warm), Objective.of(AlgoConfig(updates_per_step=1, kl_coef=0.0)), 0)
    warm.close()
    del warm
    before = _outside_allocator_gib()
    for step in range(3):
        trainer = _trainer()
        trainer.train_step(_rows(trainer), Objective.of(AlgoConfig(updates_per_step=1, kl_coef=0.0)), step)
        trainer.close()
        del trainer
        torch.cuda.empty_cache()
    assert process_groups() == groups
    growth = _outside_allocator_gib() - before
    print(f"\nGPU memory outside the allocator after three more trainers: {growth:+.2f} GiB")
    assert growth < CLOSE_GROWTH_GIB


def test_offload_round_trip_into_the_kept_arena(nccl_world: None) -> None:
    from nemo_hacpo.training.memory import TrainStateOffload

    trainer = _trainer()
    try:
        trainer.train_step(_rows(trainer), Objective.of(AlgoConfig(updates_per_step=1, kl_coef=0.0)), 0)
        offload = TrainStateOffload(trainer.optimizer, [trainer.model])
        assert offload.keep_host
        state = [t.clone() for t in offload.state_tensors()]
        offload.offload()
        assert all(host.is_pinned() for host in offload._host.values())
        arena = {key: host.data_ptr() for key, host in offload._host.items()}
        offload.restore()
        assert all(torch.equal(a, b) for a, b in zip(state, offload.state_tensors(), strict=True))
        offload.offload()
        assert {key: host.data_ptr() for key, host in offload._host.items()} == arena
        offload.restore()
        assert all(torch.equal(a, b) for a, b in zip(state, offload.state_tensors(), strict=True))
    finally:
        trainer.close()


@pytest.mark.parametrize("attention", ["local", "sdpa"])
def test_the_plan_matches_the_training_peak(nccl_world: None, attention: str) -> None:
    from nemo_hacpo.models.architecture import model_arch
    from nemo_hacpo.planning.gpu_memory import activation_gib, logits_gib

    trainer = _trainer(attention)
    try:
        rows = _rows(trainer)
        objective = Objective.of(AlgoConfig(updates_per_step=2, kl_coef=0.0))
        trainer.train_step(rows, objective, 0)
        torch.cuda.synchronize()
        state = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        trainer.train_step(rows, objective, 1)
        transient = (torch.cuda.max_memory_allocated() - state) / GIB
        arch = model_arch(_agent(), tokenizer_vocab=VOCAB)
        fused = attention == "sdpa"
        planned = activation_gib(arch, SEQ, MICRO_BATCH, 1, False, 2, fused_attention=fused) + logits_gib(
            arch, SEQ, MICRO_BATCH, 1)
        print(f"\n{attention}: training peak above the state {transient:.2f} GiB measured, {planned:.2f} planned")
        assert transient == pytest.approx(planned, abs=PLAN_TOLERANCE_GIB)
    finally:
        trainer.close()

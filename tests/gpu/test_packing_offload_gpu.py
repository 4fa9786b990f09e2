"""Sequence packing and reference offloading on CUDA with the Transformer Engine layer spec (BF16).

Skipped without CUDA (tests/gpu/conftest.py marks every test here `gpu`) or without Transformer Engine.
Not run on the CPU development machine (written against megatron-core ≥ 0.16 and TE 2.x); the CPU
counterparts are tests/unit/training/test_packed_attention.py, tests/integration/training/
test_sequence_packing.py and test_reference_offload.py.

One rank (an in-process NCCL world of one), the small Llama-like model of test_training_gpu.py (4 layers,
hidden 1024, 8 heads of 128, GQA 2 groups, SwiGLU 2816, vocabulary 32000), 16 rows of 200–500 tokens.

Packing: TE's `TEDotProductAttention` takes the THD batch (`PackedSeqParams`, padding_causal) where the
padded path runs causal attention on [B, S]; the GEMMs see T = Σ l_b rows instead of B·S, so BF16 rounding
differs. Same initial weights; stated tolerances (packed vs padded):

    per-token log-prob           max |Δ| ≤ 0.05 nats
    per-sequence mean log-prob   max |Δm| ≤ 0.01, mean |Δm| ≤ 0.002 nats
    GSPO loss of one update      |ΔL| ≤ 0.01 + 1 % of |L|
    gradient norm                within ×/÷ 1.1

Offloading: between calls every reference parameter lives in pinned host memory and none on the GPU; inside
the reference forward they are on the GPU; the reference log-probs equal (≤ 1e-5, i.e. the same kernels on the
same weights) those of a trainer that keeps its reference on the GPU, which holds ≥ 90 % of the reference's
bytes more device memory (allocated bytes after construction, each trainer measured from its own start).
"""

from __future__ import annotations

import gc
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

pytestmark = [pytest.mark.gpu, pytest.mark.integration, pytest.mark.needs("transformer_engine")]

VOCAB_SIZE = 32000
NUM_ROWS = 16
TOKEN_GAP, MEAN_GAP_MAX, MEAN_GAP_MEAN = 0.05, 0.01, 0.002
LOSS_ABS_GAP, LOSS_REL_GAP, GRAD_NORM_RATIO = 0.01, 0.01, 1.1
OFFLOAD_GAP = 1e-5
# GSPO on self rows with a clip range wide enough to keep every row's gradient (as in test_training_gpu.py).
ALGO = AlgoConfig(name="gspo", updates_per_step=1, eps_low=0.5, eps_high=0.5, kl_coef=0.0)


def _agent() -> AgentConfig:
    spec = TinyModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=8, num_query_groups=2,
                         ffn_hidden_size=2816, max_position_embeddings=1024)
    return AgentConfig(name="gpu_small", model=ModelSource(tiny=spec), parallel=ParallelConfig(micro_batch_size=4),
                       optimizer=OptimizerConfig(lr=1e-4, clip_grad=1.0, use_distributed_optimizer=True),
                       precision=PrecisionConfig(dtype="bf16"))


@pytest.fixture(scope="module")
def cuda_world() -> Iterator[None]:
    pytest.importorskip("transformer_engine")
    from nemo_hacpo.training import destroy_distributed, init_distributed
    from tests.helpers.distributed import free_port

    init_distributed(0, 1, "127.0.0.1", free_port(), backend="nccl")
    try:
        yield
    finally:
        destroy_distributed()


def _rows():
    from nemo_hacpo.algo.rows import TrainingRows

    generator = torch.Generator().manual_seed(0)
    token_ids, response_mask = [], []
    for _ in range(NUM_ROWS):
        length = int(torch.randint(200, 500, (1,), generator=generator))
        token_ids.append(torch.randint(1, VOCAB_SIZE, (length,), generator=generator).tolist())
        response_mask.append([0] * 64 + [1] * (length - 64))
    rows = TrainingRows.supervised(token_ids, response_mask)  # own rows only (GSPO)
    return rows.replace(advantages=torch.randn(NUM_ROWS, generator=generator),
                        old_mean_logprob=torch.zeros(NUM_ROWS))


def _trainer(**kwargs):
    from nemo_hacpo.models.architecture import model_arch
    from nemo_hacpo.training import MegatronTrainer

    agent = _agent()
    return MegatronTrainer(agent, model_arch(agent, tokenizer_vocab=VOCAB_SIZE), seed=1234, **kwargs)


def _release(trainer) -> None:
    trainer.close()
    del trainer
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def _packing_run(packing: bool, initial_weights: dict | None) -> dict:
    trainer = _trainer(sequence_packing=packing)
    try:
        assert trainer.use_te and trainer.sequence_packing is packing
        if initial_weights is None:
            initial_weights = {k: v.detach().clone() for k, v in trainer.module.state_dict().items()
                               if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")}
        else:
            missing, unexpected = trainer.module.load_state_dict(initial_weights, strict=False)
            assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)
            trainer.optimizer.reload_model_params()
        rows = _rows()
        tokens = trainer.compute_token_logprobs(rows.token_ids, rows.response_mask)
        mean = trainer.compute_mean_logprobs(rows.token_ids, rows.response_mask)
        metrics = trainer.train_step(rows.replace(old_mean_logprob=mean), Objective.of(ALGO), step=0).flat()
        return {"weights": initial_weights, "tokens": tokens, "mean": mean, "metrics": metrics}
    finally:
        _release(trainer)


def test_packed_transformer_engine_path_matches_padded(cuda_world: None) -> None:
    padded = _packing_run(False, None)
    packed = _packing_run(True, padded["weights"])
    token_gap = float((packed["tokens"] - padded["tokens"]).abs().max())
    mean_gap = (packed["mean"] - padded["mean"]).abs()
    loss, expected_loss = packed["metrics"]["loss"], padded["metrics"]["loss"]
    ratio = packed["metrics"]["grad_norm"] / padded["metrics"]["grad_norm"]
    print(f"packed vs padded: token max |Δ| = {token_gap:.4f}, mean |Δm| max {mean_gap.max():.4f} / mean "
          f"{mean_gap.mean():.5f}, loss {loss:.5f} vs {expected_loss:.5f}, grad norm ratio {ratio:.4f}, "
          f"tokens/s {packed['metrics']['tokens_per_s']:.0f} vs {padded['metrics']['tokens_per_s']:.0f}")
    assert token_gap <= TOKEN_GAP
    assert mean_gap.max() <= MEAN_GAP_MAX and mean_gap.mean() <= MEAN_GAP_MEAN
    assert abs(loss - expected_loss) <= LOSS_ABS_GAP + LOSS_REL_GAP * abs(expected_loss)
    assert 1 / GRAD_NORM_RATIO <= ratio <= GRAD_NORM_RATIO
    assert padded["metrics"]["self_ratio_mean"] == pytest.approx(1.0, abs=1e-3)  # s = 1 at the sampling weights


def test_offloaded_reference_lives_in_pinned_host_memory(cuda_world: None) -> None:
    rows = _rows()
    start = torch.cuda.memory_allocated()
    kept = _trainer(reference_model=True)
    try:
        kept_bytes = torch.cuda.memory_allocated() - start  # what the trainer holds on the device
        reference_bytes = sum(p.numel() * p.element_size() for p in kept.reference.parameters())
        assert all(p.is_cuda for p in kept.reference.parameters())
        kept_logprobs = kept.compute_token_logprobs(rows.token_ids, rows.response_mask, reference=True)
    finally:
        _release(kept)

    start = torch.cuda.memory_allocated()
    trainer = _trainer(reference_model=True, offload_reference=True)
    try:
        offload = trainer.reference_offload
        offloaded_bytes = torch.cuda.memory_allocated() - start
        print(f"reference {reference_bytes / 2**20:.1f} MiB; device memory kept {kept_bytes / 2**20:.1f} MiB vs "
              f"offloaded {offloaded_bytes / 2**20:.1f} MiB")
        assert kept_bytes - offloaded_bytes >= 0.9 * reference_bytes
        assert offload.pin_memory and all(t.is_pinned() for t in offload.host_tensors.values())
        assert all(p.device.type == "cpu" for p in trainer.reference.parameters()) and offload.device_bytes() == 0
        inside: list[bool] = []
        hook = trainer.reference.register_forward_pre_hook(
            lambda module, args: inside.append(all(p.is_cuda for p in module.parameters())))
        logprobs = trainer.compute_token_logprobs(rows.token_ids, rows.response_mask, reference=True)
        hook.remove()
        assert inside and all(inside)
        assert all(p.device.type == "cpu" for p in trainer.reference.parameters()) and offload.device_bytes() == 0
        assert float((logprobs - kept_logprobs).abs().max()) <= OFFLOAD_GAP
    finally:
        _release(trainer)

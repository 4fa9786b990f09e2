"""The Megatron trainer on CUDA with the Transformer Engine layer spec: BF16, FP8 delayed and FP8 blockwise.

Skipped without CUDA (tests/gpu/conftest.py marks every test here `gpu`); the FP8 cases also skip where
Transformer Engine reports the recipe unsupported (delayed/tensorwise: Ada/Hopper+; blockwise: Hopper).
Not run on the CPU development machine (written against megatron-core ≥ 0.16 and TE 2.x).

One rank (an in-process NCCL world of one), a small Llama-like model (4 layers, hidden 1024, 8 heads of
128, GQA 2 groups, SwiGLU 2816, vocabulary 32000). The BF16 trainer's initial weights are loaded into every
FP8 trainer, so all precisions score the same rows with the same weights. Stated tolerances (FP8 vs BF16):

    per-sequence mean log-prob   max |Δm| ≤ 0.1, mean |Δm| ≤ 0.02 nats
    HACPO loss of one update     |ΔL| ≤ 0.02 + 2 % of |L_bf16|
    gradient norm                within ×/÷ 1.33 of BF16's
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

pytestmark = [pytest.mark.gpu, pytest.mark.integration, pytest.mark.needs("transformer_engine")]

VOCAB_SIZE = 32000
NUM_ROWS = 16
PRECISIONS = {
    "bf16": PrecisionConfig(dtype="bf16"),
    "fp8_delayed": PrecisionConfig(dtype="bf16", fp8="hybrid", fp8_recipe="delayed", first_last_layers_bf16=False),
    "fp8_blockwise": PrecisionConfig(dtype="bf16", fp8="e4m3", fp8_recipe="blockwise"),
}
MEAN_LOGPROB_MAX_GAP, MEAN_LOGPROB_MEAN_GAP = 0.1, 0.02
LOSS_ABS_GAP, LOSS_REL_GAP = 0.02, 0.02
GRAD_NORM_RATIO = 1.33


def _agent(precision: PrecisionConfig) -> AgentConfig:
    spec = TinyModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=8, num_query_groups=2,
                         ffn_hidden_size=2816, max_position_embeddings=1024)
    return AgentConfig(name="gpu_small", model=ModelSource(tiny=spec), parallel=ParallelConfig(micro_batch_size=4),
                       optimizer=OptimizerConfig(lr=1e-4, clip_grad=1.0, use_distributed_optimizer=True),
                       precision=precision)


def _fp8_supported(recipe: str) -> tuple[bool, str]:
    """Ask Transformer Engine whether this GPU runs the recipe (the check's location moved between TE versions)."""
    try:
        import transformer_engine.pytorch as te
    except ImportError:
        return False, "transformer-engine is not installed"
    modules = [te]
    for name in ("transformer_engine.pytorch.fp8", "transformer_engine.pytorch.quantization"):
        try:
            modules.append(__import__(name, fromlist=["_"]))
        except ImportError:
            pass
    check_name = "check_fp8_block_scaling_support" if recipe == "blockwise" else "check_fp8_support"
    for module in modules:
        check = getattr(module, check_name, None)
        if check is not None:
            available, reason = check()
            return bool(available), str(reason)
    return False, f"this Transformer Engine has no {check_name}"


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


def _rows(behaviour: torch.Tensor | None = None):
    from nemo_hacpo.algo.rows import TrainingRows

    generator = torch.Generator().manual_seed(0)
    token_ids, response_mask = [], []
    for _ in range(NUM_ROWS):
        length = int(torch.randint(200, 500, (1,), generator=generator))
        token_ids.append(torch.randint(1, VOCAB_SIZE, (length,), generator=generator).tolist())
        response_mask.append([0] * 64 + [1] * (length - 64))
    rows = TrainingRows.supervised(token_ids, response_mask)  # own rows only (GSPO)
    return rows.replace(advantages=torch.randn(NUM_ROWS, generator=generator),
                        old_mean_logprob=behaviour if behaviour is not None else torch.zeros(NUM_ROWS))


# GSPO on self rows with a clip range wide enough to keep every row's gradient: the loss is −mean(s·A).
ALGO = AlgoConfig(name="gspo", updates_per_step=1, eps_low=0.5, eps_high=0.5, kl_coef=0.0)


def _run(label: str, initial_weights: dict | None, behaviour: torch.Tensor | None) -> dict:
    from nemo_hacpo.models.architecture import model_arch
    from nemo_hacpo.training import MegatronTrainer

    agent = _agent(PRECISIONS[label])
    trainer = MegatronTrainer(agent, model_arch(agent, tokenizer_vocab=VOCAB_SIZE), seed=1234)
    try:
        assert trainer.use_te, "the GPU path must use the Transformer Engine layer spec"
        if initial_weights is None:
            initial_weights = {k: v.detach().clone() for k, v in trainer.module.state_dict().items()
                               if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")}
        else:
            missing, unexpected = trainer.module.load_state_dict(initial_weights, strict=False)
            assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)
            trainer.optimizer.reload_model_params()  # the optimizer's FP32 main copy follows the new weights
        rows = _rows()
        mean_logprob = trainer.compute_mean_logprobs(rows.token_ids, rows.response_mask)
        rows = rows.replace(old_mean_logprob=behaviour if behaviour is not None else mean_logprob)
        first = trainer.train_step(rows, Objective.of(ALGO), step=0).flat()
        second = trainer.train_step(rows, Objective.of(ALGO), step=1).flat()
        return {"weights": initial_weights, "mean_logprob": mean_logprob, "first": first, "second": second}
    finally:
        trainer.close()


@pytest.fixture(scope="module")
def bf16_run(cuda_world: None) -> dict:
    return _run("bf16", None, None)


def test_bf16_transformer_engine_step(bf16_run: dict) -> None:
    first, second = bf16_run["first"], bf16_run["second"]
    assert torch.isfinite(bf16_run["mean_logprob"]).all()
    # s = 1 exactly at the sampling weights: the first loss is −mean(A)
    assert first["self_ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    assert first["loss"] == pytest.approx(-float(_rows().advantages.mean()), abs=5e-3)
    assert torch.isfinite(torch.tensor([first["grad_norm"], second["loss"], second["grad_norm"]])).all()
    assert second["self_ratio_mean"] != first["self_ratio_mean"]  # the update moved the policy
    print(f"bf16: {first['tokens_per_s']:.0f} tokens/s, {first['tflops_per_gpu']:.1f} TFLOP/s")


@pytest.mark.parametrize("label", ["fp8_delayed", "fp8_blockwise"])
def test_fp8_forward_backward_close_to_bf16(label: str, bf16_run: dict) -> None:
    supported, reason = _fp8_supported(PRECISIONS[label].fp8_recipe)
    if not supported:
        pytest.skip(f"{label}: {reason}")
    run = _run(label, bf16_run["weights"], bf16_run["mean_logprob"])
    gap = (run["mean_logprob"] - bf16_run["mean_logprob"]).abs()
    print(f"{label}: max |Δm| = {gap.max():.4f}, mean |Δm| = {gap.mean():.4f}, "
          f"loss {run['first']['loss']:.5f} vs bf16 {bf16_run['first']['loss']:.5f}, "
          f"grad norm {run['first']['grad_norm']:.4f} vs {bf16_run['first']['grad_norm']:.4f}")
    assert gap.max() <= MEAN_LOGPROB_MAX_GAP and gap.mean() <= MEAN_LOGPROB_MEAN_GAP
    expected_loss = bf16_run["first"]["loss"]
    assert abs(run["first"]["loss"] - expected_loss) <= LOSS_ABS_GAP + LOSS_REL_GAP * abs(expected_loss)
    ratio = run["first"]["grad_norm"] / bf16_run["first"]["grad_norm"]
    assert 1 / GRAD_NORM_RATIO <= ratio <= GRAD_NORM_RATIO
    assert torch.isfinite(torch.tensor([run["second"]["loss"], run["second"]["grad_norm"]])).all()

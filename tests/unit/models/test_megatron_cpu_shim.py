"""The Megatron-core CPU shim: a tiny GPTModel (RMSNorm, SwiGLU, RoPE, GQA) trains on CPU over gloo.

One process, world size 1. The Megatron tests share a module-scoped fixture that initialises
torch.distributed + parallel_state and tears both (and the shim) down at the end of the module, so
other test modules in the same pytest process start from a clean state.
"""

from __future__ import annotations

import contextlib
import math
import socket
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from nemo_hacpo.models.megatron_cpu_shim import (
    CudaToCpuMode,
    _current_thread_mode,
    apply_cpu_shim,
    remove_cpu_shim,
)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU shim is a no-op with CUDA")

VOCAB_SIZE = 512
SEQ_LEN = 32


def tiny_gpt_config(tensor_model_parallel_size: int = 1, num_layers: int = 2, **overrides):
    """TransformerConfig of a Llama-like toy: RMSNorm, SwiGLU, GQA (4 query heads, 2 KV groups, head_dim 64).

    Every CUDA-only fusion is off (their kernels need CUDA); dropout is 0 (deterministic) unless overridden.
    """
    from megatron.core.transformer.transformer_config import TransformerConfig

    fields = dict(
        num_layers=num_layers,
        hidden_size=256,
        ffn_hidden_size=512,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=64,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=False,
        persist_layer_norm=False,
        sequence_parallel=False,
        tensor_model_parallel_size=tensor_model_parallel_size,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
    )
    return TransformerConfig(**(fields | overrides))


def tiny_gpt_model(config):
    """GPTModel with Megatron's local (non-TE) layer spec and RoPE; untied input/output embeddings."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    return GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=False),
        vocab_size=VOCAB_SIZE,
        max_sequence_length=SEQ_LEN,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- the shim on its own (each test applies it and leaves it as found) -----------------------------


@contextlib.contextmanager
def _shim_applied() -> Iterator[bool]:
    """The shim on for one test, then as the test found it: still on when the module's Megatron fixture (or a
    trainer built in-process by an earlier test) had applied it, off otherwise — in whatever order tests run."""
    was_on = _current_thread_mode() is not None
    applied = apply_cpu_shim()
    try:
        yield applied
    finally:
        if not was_on:
            remove_cpu_shim()


def test_device_mode_maps_cuda_devices_to_cpu() -> None:
    with _shim_applied() as applied:
        assert applied is True
        assert torch.zeros(2, device="cuda").device.type == "cpu"
        assert torch.empty(2, device=torch.cuda.current_device()).device.type == "cpu"
        assert torch.arange(3, device=torch.device("cuda", 0)).device.type == "cpu"
        assert torch.ones(2).cuda().device.type == "cpu"
        assert torch.ones(2).to("cuda:0").device.type == "cpu"
        assert torch.ones(2).to(0).device.type == "cpu"
        assert torch.ones(2).to(torch.float64, False).dtype == torch.float64  # bool is not a device
        # Megatron's optimizers insist on CUDA type names; conversions through .type(dtype) still work.
        assert torch.ones(2).type() == "torch.cuda.FloatTensor"
        assert torch.ones(2, dtype=torch.bfloat16).type() == "torch.cuda.BFloat16Tensor"
        assert torch.ones(2).type(torch.float64).dtype == torch.float64
        torch.cuda.synchronize()  # a no-op instead of "Torch not compiled with CUDA"


class _AllocatesOnCudaInBackward(torch.autograd.Function):
    """Like Megatron's CheckpointFunction: Python backward code that creates tensors on "cuda"."""

    @staticmethod
    def forward(ctx, inputs: torch.Tensor) -> torch.Tensor:
        return inputs * 2

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output * torch.full_like(grad_output, 2.0, device="cuda")


def test_device_mode_stays_on_inside_backward() -> None:
    with _shim_applied():
        inputs = torch.ones(3, requires_grad=True)
        _AllocatesOnCudaInBackward.apply(inputs).sum().backward()  # d(sum 2x)/dx = 2
        assert inputs.grad.tolist() == [2.0, 2.0, 2.0]
        (grad,) = torch.autograd.grad(_AllocatesOnCudaInBackward.apply(inputs).sum(), inputs)
        assert grad.tolist() == [2.0, 2.0, 2.0]


def test_apply_is_idempotent_and_remove_restores_torch() -> None:
    # the module's Megatron fixture or an earlier test in this process (a trainer built in-process) may have left
    # the shim on: start from plain torch, and leave the shim as it was found
    was_on = _current_thread_mode() is not None
    remove_cpu_shim()
    try:
        original_current_device = torch.cuda.current_device
        original_run_backward = torch.autograd._engine_run_backward
        assert apply_cpu_shim() is True
        patched_current_device = torch.cuda.current_device
        assert apply_cpu_shim() is True
        modes = [m for m in torch.overrides._get_current_function_mode_stack() if isinstance(m, CudaToCpuMode)]
        assert len(modes) == 1
        assert torch.cuda.current_device is patched_current_device is not original_current_device

        remove_cpu_shim()
        assert torch.cuda.current_device is original_current_device
        assert torch.autograd._engine_run_backward is original_run_backward
        assert not any(isinstance(m, CudaToCpuMode) for m in torch.overrides._get_current_function_mode_stack())
        with pytest.raises((AssertionError, RuntimeError)):  # CPU-only torch refuses CUDA again
            torch.zeros(1, device="cuda")
    finally:
        if was_on:
            apply_cpu_shim()


def test_rng_tracker_forks_named_cpu_streams() -> None:
    """model_parallel_cuda_manual_seed(s) on TP rank 0 seeds 'model-parallel-rng' with s + 2718."""
    from megatron.core import tensor_parallel

    with _shim_applied():
        torch.manual_seed(7)
        tensor_parallel.model_parallel_cuda_manual_seed(1234, tp_rank=0, ep_rank=0, etp_rank=0)
        tracker = tensor_parallel.get_cuda_rng_tracker()
        default_before = torch.get_rng_state()
        with tracker.fork():
            first_draw = torch.rand(4)
        with tracker.fork():  # the named stream continues where it stopped
            second_draw = torch.rand(4)
        assert torch.equal(torch.get_rng_state(), default_before)  # the default stream is untouched

        expected = torch.rand(8, generator=torch.Generator().manual_seed(1234 + 2718))
        torch.testing.assert_close(torch.cat([first_draw, second_draw]), expected, rtol=0, atol=0)


# --- a tiny GPTModel through Megatron's model, schedules and optimizer -----------------------------


@pytest.fixture(scope="module")
def megatron_world_size_1() -> Iterator[None]:
    """gloo world of one process with TP = PP = 1; everything is destroyed afterwards."""
    from megatron.core import parallel_state

    apply_cpu_shim()
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    try:
        parallel_state.initialize_model_parallel(1, 1)
        yield
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()
        remove_cpu_shim()


def _seed_all(seed: int) -> None:
    """The default CPU stream and Megatron's named streams (which the shim keeps on the CPU too)."""
    from megatron.core import tensor_parallel

    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def _seeded_model(seed: int = 1234, **config_overrides):
    _seed_all(seed)
    return tiny_gpt_model(tiny_gpt_config(**config_overrides))


def _token_batch(batch_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tokens; labels are the next tokens. Each value is [batch_size, SEQ_LEN]."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB_SIZE, (batch_size, SEQ_LEN + 1), generator=generator)
    return {
        "input_ids": tokens[:, :-1],
        "labels": tokens[:, 1:],
        "position_ids": torch.arange(SEQ_LEN).expand(batch_size, SEQ_LEN),
    }


def test_forward_backward_finite(megatron_world_size_1: None) -> None:
    model = _seeded_model()
    batch = _token_batch(batch_size=2)

    logits = model(batch["input_ids"], batch["position_ids"], attention_mask=None)  # [B, S, V]
    assert logits.shape == (2, SEQ_LEN, VOCAB_SIZE)
    assert torch.isfinite(logits).all()

    # With labels, GPTModel returns the per-token loss from vocab_parallel_cross_entropy: [B, S].
    token_losses = model(batch["input_ids"], batch["position_ids"], None, labels=batch["labels"])
    expected = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), batch["labels"].reshape(-1), reduction="none")
    torch.testing.assert_close(token_losses.reshape(-1), expected, rtol=1e-5, atol=1e-5)

    token_losses.mean().backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name
        assert parameter.grad.abs().sum() > 0, name


def _forward_step(data_iterator, model):
    """Megatron's forward-step contract: (output of the last stage, loss_func(output) -> (loss, logs))."""
    batch = next(data_iterator)
    token_losses = model(batch["input_ids"], batch["position_ids"], None, labels=batch["labels"])  # [B, S]

    def loss_func(output_tensor: torch.Tensor):
        loss = output_tensor.float().mean()
        # clone: the schedule divides the returned loss by num_microbatches in place.
        return loss, {"lm loss": loss.detach().clone()}

    return token_losses, loss_func


def test_schedule_and_optimizer_reduce_loss_on_a_fixed_batch(megatron_world_size_1: None) -> None:
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func

    model = _seeded_model()
    config = model.config
    ddp_model = DistributedDataParallel(
        config=config,
        ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=False),
        module=model,
    )
    config.finalize_model_grads_func = finalize_model_grads
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam", lr=1e-3, bf16=False, params_dtype=torch.float32, use_distributed_optimizer=False
        ),
        [ddp_model],
    )
    micro_batches = [_token_batch(batch_size=2, seed=seed) for seed in (0, 1)]
    forward_backward = get_forward_backward_func()

    mean_losses = []
    for _ in range(5):
        ddp_model.zero_grad_buffer()
        optimizer.zero_grad()
        losses_reduced = forward_backward(
            forward_step_func=_forward_step,
            data_iterator=iter(micro_batches),
            model=[ddp_model],
            num_microbatches=len(micro_batches),
            seq_length=SEQ_LEN,
            micro_batch_size=2,
            forward_only=False,
        )
        update_successful, grad_norm, _ = optimizer.step()
        assert update_successful
        assert grad_norm is not None and grad_norm > 0
        mean_losses.append(sum(float(r["lm loss"]) for r in losses_reduced) / len(losses_reduced))

    assert len(losses_reduced) == 2  # one entry per micro-batch
    # A fresh model (init std 0.02) predicts a near-uniform distribution: loss ≈ ln(vocab) = ln 512 = 6.238,
    # plus ≈ Var(logits) / 2 (0.07 here).
    assert mean_losses[0] == pytest.approx(math.log(VOCAB_SIZE), abs=0.2)
    assert all(later < earlier for earlier, later in zip(mean_losses, mean_losses[1:], strict=False))
    assert mean_losses[-1] < mean_losses[0] - 0.1


def test_activation_recompute_replays_dropout(megatron_world_size_1: None) -> None:
    """Full recompute re-runs each layer's forward in backward; with dropout on (hidden dropout from the
    default stream, attention dropout from the tracker's 'model-parallel-rng'), the grads only match the
    stored-activation run if the checkpoint restored both RNG streams before the replay."""
    dropout = {"hidden_dropout": 0.2, "attention_dropout": 0.2}
    stored = _seeded_model(**dropout)
    recomputed = _seeded_model(
        **dropout, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
    )
    recomputed.load_state_dict(stored.state_dict())
    batch = _token_batch(batch_size=2)

    first_loss, second_loss = {}, {}
    for name, model in (("stored", stored), ("recomputed", recomputed)):
        _seed_all(99)
        first_loss[name] = model(
            batch["input_ids"], batch["position_ids"], None, labels=batch["labels"]
        ).mean()
        first_loss[name].backward()
        second_loss[name] = model(
            batch["input_ids"], batch["position_ids"], None, labels=batch["labels"]
        ).mean()
    assert first_loss["stored"] != second_loss["stored"]  # dropout is live: the streams moved on
    assert first_loss["recomputed"] == first_loss["stored"]
    # The replay leaves the streams where the stored-activation run left them.
    assert second_loss["recomputed"] == second_loss["stored"]

    recomputed_params = dict(recomputed.named_parameters())
    for name, parameter in stored.named_parameters():
        torch.testing.assert_close(recomputed_params[name].grad, parameter.grad, rtol=0, atol=1e-6)

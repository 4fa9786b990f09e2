"""Tensor parallelism on CPU: a TP = 2 GPTModel (2 gloo processes) matches TP = 1 on the same weights.

The test launches this file as a script: once with one process (``reference``: TP = 1 builds the tiny
model, saves its full state dict, logits, per-token loss and gradients), then with two processes (``tp2``:
each rank loads its shards of those weights, runs the same batch, gathers logits and gradients back to
the full layout); both then take one DDP + schedule + SGD step (grad clipping on) and gather the updated
weights. The parent compares the two. The model is the unit test's (``tiny_gpt_config``), loaded
from ``tests/unit/models/test_megatron_cpu_shim.py`` by path.

Sharding of a TP = 1 weight for rank r of T (Megatron's layouts):
  column-parallel (``linear_qkv``, ``output_layer``) and the vocab-parallel embedding: chunk r of T on dim 0
  (``linear_qkv`` rows are grouped per KV group, [q heads | k | v] per group, so whole groups move);
  row-parallel (``linear_proj``, ``linear_fc2``): chunk r on dim 1;
  SwiGLU ``linear_fc1`` = [gate; up] on dim 0: rank r holds [gate chunk r; up chunk r];
  norms: replicated.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU shim is a no-op with CUDA"),
]

UNIT_TEST_MODULE = Path(__file__).resolve().parents[1] / "unit" / "models" / "test_megatron_cpu_shim.py"
BATCH_SIZE = 2
WORKER_TIMEOUT_S = 300


def _load_unit_test_helpers():
    spec = importlib.util.spec_from_file_location("megatron_cpu_shim_unit_test", UNIT_TEST_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _is_gated_fc1(name: str) -> bool:
    return name.endswith("mlp.linear_fc1.weight")


def shard_for_rank(
    name: str, full: torch.Tensor, param: torch.nn.Parameter, rank: int, size: int
) -> torch.Tensor:
    """The slice of a TP = 1 tensor that TP rank `rank` of `size` holds (rules in the module docstring)."""
    if not getattr(param, "tensor_model_parallel", False):
        return full
    if _is_gated_fc1(name):  # [gate; up] -> [gate_r; up_r]
        return torch.cat([half.chunk(size, dim=0)[rank] for half in full.chunk(2, dim=0)], dim=0)
    return full.chunk(size, dim=param.partition_dim)[rank]


def unshard(name: str, shards: list[torch.Tensor], param: torch.nn.Parameter) -> torch.Tensor:
    """Inverse of `shard_for_rank`: the TP = 1 tensor from the shards of ranks 0..T-1."""
    if not getattr(param, "tensor_model_parallel", False):
        return shards[0]
    if _is_gated_fc1(name):
        gates, ups = zip(*(shard.chunk(2, dim=0) for shard in shards), strict=True)
        return torch.cat([*gates, *ups], dim=0)
    return torch.cat(shards, dim=param.partition_dim)


def _gather_full(
    tensors: dict[str, torch.Tensor], params: dict[str, torch.nn.Parameter], tp_group
) -> dict[str, torch.Tensor]:
    """All-gather each rank's shard over the TP group and rebuild the TP = 1 layout (`unshard`)."""
    full = {}
    for name, tensor in tensors.items():
        shards = [torch.empty_like(tensor) for _ in range(tp_group.size())]
        torch.distributed.all_gather(shards, tensor.contiguous(), group=tp_group)
        full[name] = unshard(name, shards, params[name])
    return full


def _one_training_step(model, helpers) -> tuple[float, list[float]]:
    """DDP + Megatron's SGD (grad clipping at 1.0) + the no-pipelining schedule over 2 micro-batches.

    SGD, not Adam: Adam's first step lr * g / (|g| + eps) turns float noise in near-zero gradients into
    lr-sized differences, while SGD's update is linear in the (clipped) gradient and so comparable.

    Returns the gradient norm (over the whole model, all TP shards) and the per-micro-batch losses.
    """
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func

    ddp_model = DistributedDataParallel(
        config=model.config, ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True), module=model
    )
    model.config.finalize_model_grads_func = finalize_model_grads
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="sgd", lr=0.1, sgd_momentum=0.0, clip_grad=1.0, bf16=False, params_dtype=torch.float32
        ),
        [ddp_model],
    )
    micro_batches = [helpers._token_batch(BATCH_SIZE, seed=seed) for seed in (0, 1)]
    losses_reduced = get_forward_backward_func()(
        forward_step_func=helpers._forward_step,
        data_iterator=iter(micro_batches),
        model=[ddp_model],
        num_microbatches=len(micro_batches),
        seq_length=helpers.SEQ_LEN,
        micro_batch_size=BATCH_SIZE,
        forward_only=False,
    )
    update_successful, grad_norm, _ = optimizer.step()
    assert update_successful
    return float(grad_norm), [float(r["lm loss"]) for r in losses_reduced]


def _worker(mode: str, out_dir: Path) -> None:
    """One rank of the `reference` (TP = 1) or `tp2` (TP = 2) run; rendezvous from the env:// variables."""
    from megatron.core import parallel_state, tensor_parallel

    from nemo_hacpo.models.megatron_cpu_shim import apply_cpu_shim

    helpers = _load_unit_test_helpers()
    apply_cpu_shim()
    torch.distributed.init_process_group("gloo", init_method="env://")
    tp_size = torch.distributed.get_world_size()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp_size)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tp_group = parallel_state.get_tensor_model_parallel_group()
    torch.manual_seed(1234)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    model = helpers.tiny_gpt_model(helpers.tiny_gpt_config(tensor_model_parallel_size=tp_size))
    params = dict(model.named_parameters())

    if mode == "tp2":
        full_state = torch.load(out_dir / "reference.pt")["state_dict"]
        sharded_state = {
            name: shard_for_rank(name, value, params[name], tp_rank, tp_size) if name in params else value
            for name, value in full_state.items()
        }
        model.load_state_dict(sharded_state, strict=True)

    batch = helpers._token_batch(BATCH_SIZE)
    logits_shard = model(batch["input_ids"], batch["position_ids"], None)  # [B, S, V / T]
    logits = tensor_parallel.gather_from_tensor_model_parallel_region(logits_shard)  # [B, S, V]
    token_losses = model(batch["input_ids"], batch["position_ids"], None, labels=batch["labels"])  # [B, S]
    token_losses.mean().backward()

    grads = _gather_full({name: param.grad for name, param in params.items()}, params, tp_group)
    result = {"logits": logits.detach(), "token_losses": token_losses.detach(), "grads": grads}
    if mode == "reference":
        # Copies: state_dict() aliases the parameters, which the training step below updates in place.
        result["state_dict"] = {
            name: value.clone() if isinstance(value, torch.Tensor) else value
            for name, value in model.state_dict().items()
        }

    model.zero_grad(set_to_none=True)
    result["grad_norm"], result["step_losses"] = _one_training_step(model, helpers)
    result["updated_weights"] = _gather_full(
        {name: param.detach() for name, param in params.items()}, params, tp_group
    )
    if torch.distributed.get_rank() == 0:
        torch.save(result, out_dir / f"{mode}.pt")
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def _launch(mode: str, world_size: int, out_dir: Path) -> None:
    """Run `world_size` copies of this file as a script, one per rank, and fail with their output."""
    # imported here: the ranks run this file as a script, where `tests` is not importable
    from tests.helpers.distributed import free_port

    port = free_port()
    processes = []
    for rank in range(world_size):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            OMP_NUM_THREADS="1",
            PYTHONWARNINGS="ignore",
        )
        processes.append(
            subprocess.Popen(
                [sys.executable, __file__, mode, str(out_dir)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = []
    for process in processes:
        output, _ = process.communicate(timeout=WORKER_TIMEOUT_S)
        outputs.append(output)
    for rank, (process, output) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, f"{mode} rank {rank} failed:\n{output[-4000:]}"


def _assert_close_by_name(
    actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], atol: float
) -> None:
    assert actual.keys() == expected.keys()
    for name, expected_value in expected.items():
        torch.testing.assert_close(
            actual[name],
            expected_value,
            rtol=0,
            atol=atol,
            msg=lambda message, name=name: f"{name}: {message}",
        )


@pytest.mark.slow
def test_tp2_matches_tp1_on_the_same_weights(tmp_path: Path) -> None:
    _launch("reference", world_size=1, out_dir=tmp_path)
    _launch("tp2", world_size=2, out_dir=tmp_path)
    reference = torch.load(tmp_path / "reference.pt")
    tp2 = torch.load(tmp_path / "tp2.pt")

    assert tp2["logits"].shape == reference["logits"].shape
    torch.testing.assert_close(tp2["logits"], reference["logits"], rtol=0, atol=1e-5)
    torch.testing.assert_close(tp2["token_losses"], reference["token_losses"], rtol=0, atol=1e-5)
    _assert_close_by_name(tp2["grads"], reference["grads"], atol=1e-6)

    # One optimizer step: the clipping norm must count every weight once (TP shards summed, norms
    # replicated), and the updated weights must agree.
    assert reference["grad_norm"] > 1.0  # so clip_grad = 1.0 actually rescales
    assert tp2["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5)
    assert tp2["step_losses"] == pytest.approx(reference["step_losses"], abs=1e-5)
    for name, reference_weight in reference["updated_weights"].items():
        assert not torch.equal(reference_weight, reference["state_dict"][name]), name  # the step moved it
    _assert_close_by_name(tp2["updated_weights"], reference["updated_weights"], atol=1e-6)


def test_shard_and_unshard_are_inverse_for_swiglu_fc1() -> None:
    """[gate; up] rows 0..7 -> rank 0 holds gate rows 0,1 and up rows 4,5; unshard puts them back."""
    full = torch.arange(8.0).reshape(8, 1)  # gate = rows 0..3, up = rows 4..7
    param = torch.nn.Parameter(torch.empty(4, 1))
    param.tensor_model_parallel, param.partition_dim = True, 0
    shards = [shard_for_rank("mlp.linear_fc1.weight", full, param, rank, 2) for rank in range(2)]
    assert shards[0].flatten().tolist() == [0.0, 1.0, 4.0, 5.0]
    assert shards[1].flatten().tolist() == [2.0, 3.0, 6.0, 7.0]
    assert torch.equal(unshard("mlp.linear_fc1.weight", shards, param), full)


if __name__ == "__main__":
    _worker(sys.argv[1], Path(sys.argv[2]))

"""`HostOffload`: weights live in host tensors between uses, fresh device copies exist only inside `on_device()`.

On this CPU machine host and compute device are both the CPU, so "on the device" is checked by storage:
inside the block every parameter and buffer is a new copy (another data pointer), outside it is the host
tensor again. tests/gpu/test_packing_offload_gpu.py checks the CUDA placement and memory.
"""

from __future__ import annotations

import pytest
import torch

from nemo_hacpo.training.offload import HostOffload


class Affine(torch.nn.Module):
    """y = W·x + b + shift, with `shift` a registered buffer (buffers move like parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)
        self.register_buffer("shift", torch.tensor([0.5, -0.5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.shift


def _module() -> Affine:
    torch.manual_seed(0)
    return Affine().requires_grad_(False)


def _pointers(module: torch.nn.Module) -> dict[str, int]:
    tensors = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    return {name: tensor.data_ptr() for name, tensor in tensors.items()}


def test_offloaded_module_computes_the_same_outputs() -> None:
    plain, offloaded = _module(), _module()
    offload = HostOffload(offloaded, "cpu")
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    with offload.on_device() as module:
        assert module is offloaded
        assert torch.equal(offloaded(x), plain(x))


def test_weights_are_host_tensors_between_uses_and_fresh_copies_inside() -> None:
    module = _module()
    offload = HostOffload(module, "cpu", pin_memory=False)
    assert set(offload.host_tensors) == {"linear.weight", "linear.bias", "shift"}
    host_pointers = {name: tensor.data_ptr() for name, tensor in offload.host_tensors.items()}
    assert _pointers(module) == host_pointers and not offload.resident
    seen_inside = {}
    module.register_forward_pre_hook(lambda m, args: seen_inside.update(_pointers(m)))
    with offload.on_device():
        assert offload.resident
        module(torch.zeros(1, 3))
    assert all(seen_inside[name] != host_pointers[name] for name in host_pointers)
    assert _pointers(module) == host_pointers and not offload.resident
    assert offload.device_bytes() == 0  # nothing lives on an accelerator here


def test_writes_between_uses_land_in_the_host_copy() -> None:
    """`sync_reference` loads the policy's weights into the offloaded reference between its forwards."""
    module, source = _module(), _module()
    offload = HostOffload(module, "cpu")
    with torch.no_grad():
        source.linear.weight.fill_(2.0)
        source.shift.fill_(1.0)
    module.load_state_dict(source.state_dict())
    assert torch.equal(offload.host_tensors["linear.weight"], torch.full((2, 3), 2.0))
    with offload.on_device():
        # x = 1: y_i = Σ_j 2 + b_i + 1 = 7 + b_i
        assert torch.equal(module(torch.ones(1, 3)), 7.0 + source.linear.bias.unsqueeze(0))


def test_the_block_restores_host_tensors_after_an_error_and_refuses_nesting() -> None:
    module = _module()
    offload = HostOffload(module, "cpu")
    host_pointers = {name: tensor.data_ptr() for name, tensor in offload.host_tensors.items()}
    with pytest.raises(RuntimeError, match="boom"), offload.on_device():
        raise RuntimeError("boom")
    assert _pointers(module) == host_pointers and not offload.resident
    with offload.on_device(), pytest.raises(RuntimeError, match="nested"), offload.on_device():
        pass

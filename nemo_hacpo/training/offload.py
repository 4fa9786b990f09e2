"""Keep a frozen module's weights in host memory between uses; copy them to the device only for a forward.

    offload = HostOffload(reference_module, device)      # parameters and buffers now live on the host
    with offload.on_device():                            # device copies for the block …
        log_probs = forward(reference_module, ...)
    # … dropped on exit: the device holds none of the module's weights again

For the reference model of the KL term (β > 0): it never trains, so nothing is copied back — on exit every
parameter points at its host tensor again and the device copies are released (on CUDA the caching
allocator keeps the blocks for the next allocation). Host tensors are pinned on CUDA machines, so the
copy-in is asynchronous (`non_blocking`) and runs at full PCIe/NVLink-C2C speed.

Writes into the module's parameters between uses (`load_state_dict`, e.g. `sync_reference`) land in the
host tensors. Only registered parameters and buffers move; tensors a module keeps as plain attributes
(RoPE frequency tables) and Transformer Engine's FP8 weight caches stay where they are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class HostOffload:
    """Host-resident parameters and buffers of `module`, moved to `device` inside `on_device()` only.

    Args:
        module: the module to offload (frozen: device-side changes are not copied back).
        device: the compute device of its forward passes.
        pin_memory: page-lock the host tensors (default: when CUDA is available).
    """

    def __init__(self, module: torch.nn.Module, device: torch.device | str, pin_memory: bool | None = None):
        self.module = module
        self.device = torch.device(device)
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.host_tensors: dict[str, torch.Tensor] = {}
        for name, tensor in self._tensors():
            host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=self.pin_memory)
            self.host_tensors[name] = host.copy_(tensor.detach())
            tensor.data = host
        self.resident = False  # True while the device copies are in use (inside `on_device`)

    def _tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self.module.named_parameters()
        yield from ((name, buffer) for name, buffer in self.module.named_buffers() if buffer is not None)

    def device_bytes(self) -> int:
        """Bytes of the module's parameters and buffers currently on a non-CPU device."""
        return sum(t.numel() * t.element_size() for _, t in self._tensors() if t.device.type != "cpu")

    @contextlib.contextmanager
    def on_device(self) -> Iterator[torch.nn.Module]:
        """Device copies of every parameter and buffer for the block (a fresh copy even when `device` is
        the CPU, so the path is the same everywhere); on exit they point at the host tensors again."""
        if self.resident:
            raise RuntimeError("the offloaded module is already on the device (nested on_device())")
        try:
            for name, tensor in self._tensors():
                tensor.data = self.host_tensors[name].to(self.device, non_blocking=self.pin_memory, copy=True)
            self.resident = True
            yield self.module
        finally:
            for name, tensor in self._tensors():
                tensor.data = self.host_tensors[name]
            self.resident = False

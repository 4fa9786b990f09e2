"""The trainer's memory between phases: optimizer state and gradient buffers leave the device while the engine
generates, and come back for the next update (`agent.offload_train_state`).

One step of a colocated agent, phase by phase (`runtime.worker.AgentRank`):

    generate      engine awake; the trainer holds only its weights (and the reference, unless offloaded)
    sleep         the engine releases its weights and KV cache
    old log-probs forward passes: weights only
    train         restore() → update(s) → offload() → release cached memory
    refit         bucketed (`rollout.refit`): the engine wakes its weights, loads, then wakes its KV cache
    checkpoint    engine asleep (level 1) → restore() → save → offload() → release → engine awake

`offload()` copies each optimizer state tensor (Adam's m and v, the fp32 main copy of bf16/fp16 parameters,
never a tensor that shares storage with the model's own weights) into host memory (pinned on CUDA machines) and
shrinks its device storage to zero bytes; the gradient buffers (Megatron DDP's flat `grad_data`, which
`param.main_grad` views) are shrunk without a copy (they are zeroed before the next backward pass anyway).
`restore()` re-grows every storage and copies the host values back. Tensor objects, views and the optimizer's
references stay the same, so nothing else has to know. The code is the same on CPU and CUDA: on CPU the
"device" storage is host memory too, and shrinking it really frees it, which is what the tests measure.

Host memory on CUDA: the pinned copies are an arena the first `offload()` allocates (each tensor a block of
torch's host caching allocator, rounded up to a power of two) and every later one reuses; `restore()` keeps it
(`keep_host`). Pinning is slow — ~2.2 GB/s on an H200 host: the first offload of 41.5 GiB took 21.9 s, the next
0.62 s — so the arena lives for the whole run, through checkpoints too: the save's emptying of the host cache
(`trainer_checkpoint.release_host_cache`) frees only the writer's copies, not these live tensors.
`planning.host_memory` counts the arena in every phase of its node.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch


def _storage_bytes(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().nbytes()


def _inner_optimizers(optimizer: Any) -> list[Any]:
    """The torch optimizers inside a Megatron optimizer (chained or not)."""
    chained = getattr(optimizer, "chained_optimizers", None)
    megatron = chained if chained is not None else [optimizer]
    return [getattr(m, "optimizer", m) for m in megatron if getattr(m, "optimizer", None) is not None]


class TrainStateOffload:
    """Offload/restore of one trainer's optimizer state and gradient buffers (see the module docstring).

    Args:
        optimizer: the Megatron optimizer (its torch optimizer's `state` and `param_groups` are moved).
        models: the DDP-wrapped model chunks (their `buffers` hold `grad_data`).
        keep_host: keep the host copies after `restore()` for the next `offload()` to copy into (None: on CUDA,
            where they are pinned and pinning is what costs; on CPU the state would then sit in memory twice).
    """

    def __init__(self, optimizer: Any, models: Sequence[Any], keep_host: bool | None = None):
        self.optimizer, self.models = optimizer, list(models)
        self.keep_host = torch.cuda.is_available() if keep_host is None else keep_host
        self.offloaded = False
        self._host: dict[int, torch.Tensor] = {}
        self._model_storages = {p.untyped_storage().data_ptr() for m in self.models for p in m.parameters()}
        for model in self.models:
            for buffer in getattr(model, "buffers", []):
                if getattr(buffer, "param_data", None) is not None:
                    self._model_storages.add(buffer.param_data.untyped_storage().data_ptr())

    # ------------------------------------------------------------------------------------------ what moves
    def state_tensors(self) -> Iterator[torch.Tensor]:
        """Optimizer tensors that are not the model's weights: Adam state and fp32 main parameters (once each)."""
        seen: set[int] = set()
        for inner in _inner_optimizers(self.optimizer):
            candidates = [v for state in inner.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
            candidates += [p for group in inner.param_groups for p in group["params"]]
            for tensor in candidates:
                pointer = tensor.untyped_storage().data_ptr()
                if tensor.numel() <= 1 or pointer in seen or pointer in self._model_storages or pointer == 0:
                    continue  # scalars (Adam's step), shared storage, the model's own weights, already freed
                seen.add(pointer)
                yield tensor

    def grad_buffers(self) -> Iterator[torch.Tensor]:
        for model in self.models:
            for buffer in getattr(model, "buffers", []):
                if getattr(buffer, "grad_data", None) is not None:
                    yield buffer.grad_data

    def host_bytes(self) -> int:
        """Bytes of host copies held now (while offloaded; with `keep_host`, from the first offload on)."""
        return sum(host.numel() for host in self._host.values())

    def device_bytes(self) -> int:
        """Bytes the optimizer state and gradient buffers occupy on their device right now."""
        state = {t.untyped_storage().data_ptr(): _storage_bytes(t) for t in self._all_state()}
        return sum(state.values()) + sum(_storage_bytes(g) for g in self.grad_buffers())

    def _all_state(self) -> list[torch.Tensor]:
        return list(self._tracked.values()) if self.offloaded else list(self.state_tensors())

    # ------------------------------------------------------------------------------------------- phases
    def offload(self) -> int:
        """Move the state to host memory and free its device storage; returns the device bytes freed."""
        if self.offloaded:
            return 0
        freed = 0
        self._tracked: dict[int, torch.Tensor] = {}
        pin = torch.cuda.is_available()
        kept, self._host = self._host, {}  # the arena of the state as it is now: a buffer of a tensor gone is dropped
        for tensor in self.state_tensors():
            storage = tensor.untyped_storage()
            key = id(tensor)
            host = kept.get(key)
            if host is None or host.numel() != storage.nbytes():
                host = torch.empty(storage.nbytes(), dtype=torch.uint8, device="cpu", pin_memory=pin)
            host.untyped_storage().copy_(storage)
            self._host[key], self._tracked[key] = host, tensor
            freed += storage.nbytes()
            storage.resize_(0)
        for grad in self.grad_buffers():
            self._grad_sizes = getattr(self, "_grad_sizes", {})
            self._grad_sizes[id(grad)] = _storage_bytes(grad)
            freed += _storage_bytes(grad)
            grad.untyped_storage().resize_(0)
        self.offloaded = True
        return freed

    def restore(self) -> None:
        """Re-grow every storage on its device and copy the state back (gradient buffers come back zeroed)."""
        if not self.offloaded:
            return
        for key, tensor in self._tracked.items():
            host = self._host[key] if self.keep_host else self._host.pop(key)
            storage = tensor.untyped_storage()
            storage.resize_(host.numel())
            storage.copy_(host.untyped_storage(), non_blocking=False)
        for grad in self.grad_buffers():
            grad.untyped_storage().resize_(self._grad_sizes[id(grad)])
            grad.zero_()
        self._tracked = {}
        self.offloaded = False

"""CUDA refit of a colocated engine through vLLM's own weight-transfer engine (needs CUDA vLLM; GPU paths only).

The engine and the trainer share the GPUs; with `rollout.refit_transport: ipc` the engine is built with
`weight_transfer_config={"backend": "ipc"}` and sleep mode. `send_weights_ipc` exports CUDA IPC handles of the trainer's HF-layout `(name, tensor)` pairs;
the engine's workers open them, copy on-device and finish with vLLM's layer-wise reload. The engine must have
its weights awake (`wake_up(["weights"])`) and may keep its KV cache asleep until generation.

Engines on separate GPUs (a NCCL broadcast from the trainer) are not supported: the config refuses
`rollout.colocated: false` on CUDA.

Opt-in (`rollout.refit_transport: ipc`); the default transport is `rpc` (`RolloutEngine._refit_rpc`). The config
allows it only for an agent of one trainer rank with a TP-1 engine: vLLM's IPC sender exports handles of the
engine rank's own GPU only (TP workers on other GPUs find none) and gathers them over the default process group,
which the other trainer ranks of the agent never join.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
from vllm.distributed.weight_transfer.packed_tensor import (
    DEFAULT_PACKED_BUFFER_SIZE_BYTES as PACKED_BUFFER_BYTES,
)

GIB = 1 << 30


class NamedTensorSource(WeightSource):
    """A re-iterable `WeightSource` over a list of `(hf_name, tensor)` pairs, replaceable between refits.

    Tensors not on the current CUDA device are copied there as they are yielded (CUDA IPC needs device memory).
    """

    def __init__(self, weights: Iterable[tuple[str, torch.Tensor]] = ()) -> None:
        self._weights: list[tuple[str, torch.Tensor]] = list(weights)

    def set(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._weights = list(weights)

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self._weights]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        device = torch.device("cuda", torch.cuda.current_device())
        for name, tensor in self._weights:
            yield name, tensor.detach().to(device, non_blocking=True)


class LLMWeightSyncClient:
    """vLLM's weight-sync client protocol over an in-process `vllm.LLM` (whose methods take request dicts)."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self._llm.start_weight_update()

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        self._llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._llm.finish_weight_update(weight_version)


def send_weights_ipc(client: Any, weights: Sequence[tuple[str, torch.Tensor]], *, rank: int = 0,
                     packed: bool = True) -> int:
    """One colocated refit over CUDA IPC; returns the number of tensors sent.

    `packed` batches tensors into ~1 GiB staging buffers (vLLM's default) instead of one handle per tensor.
    vLLM refuses a tensor larger than that buffer in the middle of the update, leaving the engine between
    `start_weight_update` and `finish_weight_update`; such a tensor is refused here, before anything is sent.
    """
    if packed:
        too_large = [(name, tensor.numel() * tensor.element_size()) for name, tensor in weights
                     if tensor.numel() * tensor.element_size() > PACKED_BUFFER_BYTES]
        if too_large:
            listed = ", ".join(f"{name} ({size / GIB:.2f} GiB)" for name, size in too_large[:3])
            raise ValueError(f"CUDA IPC refit: {len(too_large)} tensor(s) exceed vLLM's {PACKED_BUFFER_BYTES / GIB:.0f} "
                             f"GiB staging buffer: {listed}; use rollout.refit_transport: rpc")
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo, IPCTrainerWeightTransferEngine

    source = NamedTensorSource(weights)
    sender = IPCTrainerWeightTransferEngine.trainer_init(IPCTrainerInitInfo(rank=rank, packed=packed),
                                                         client=client, source=source)
    sender.send_weights()
    sender.shutdown()
    return len(source.metadata())

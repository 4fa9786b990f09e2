"""CUDA refit of a colocated engine through vLLM's own weight-transfer engine (needs CUDA vLLM; GPU paths only).

The engine and the trainer share the GPUs; the engine is built with `weight_transfer_config={"backend": "ipc"}`
and sleep mode. `send_weights_ipc` exports CUDA IPC handles of the trainer's HF-layout `(name, tensor)` pairs;
the engine's workers open them, copy on-device and finish with vLLM's layer-wise reload. The engine must have
its weights awake (`wake_up(["weights"])`) and may keep its KV cache asleep until generation.

Engines on separate GPUs (a NCCL broadcast from the trainer) are not supported: the config refuses
`rollout.colocated: false` on CUDA.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource


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


def send_weights_ipc(client: Any, weights: Iterable[tuple[str, torch.Tensor]], *, rank: int = 0,
                     packed: bool = True) -> int:
    """One colocated refit over CUDA IPC; returns the number of tensors sent.

    `packed` batches tensors into ~1 GiB staging buffers (vLLM's default) instead of one handle per tensor.
    """
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo, IPCTrainerWeightTransferEngine

    source = NamedTensorSource(weights)
    sender = IPCTrainerWeightTransferEngine.trainer_init(IPCTrainerInitInfo(rank=rank, packed=packed),
                                                         client=client, source=source)
    sender.send_weights()
    sender.shutdown()
    return len(source.metadata())

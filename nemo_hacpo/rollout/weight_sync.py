"""CUDA refits through vLLM's own weight-transfer engines (needs CUDA vLLM; imported only on GPU paths).

Two layouts, chosen by `rollout.colocated` (see `settings.py`); both stream the trainer's HF-layout
`(name, tensor)` pairs and end with vLLM's layer-wise reload inside the engine:

- **colocated** (engine and trainer share the GPUs, engine built with `weight_transfer_config={"backend": "ipc"}`
  and sleep mode): `send_weights_ipc` exports CUDA IPC handles of the trainer's tensors; the engine's workers
  open them and copy on-device. The engine must have its weights awake (`wake_up(["weights"])`) and may
  keep its KV cache asleep until generation.
- **separate GPUs** (`backend: "nccl"`): `NcclWeightSender` lives in the *trainer* process, joins a NCCL group
  with the engine's workers once (trainer = rank 0, workers = ranks 1..tp), then broadcasts every refit.
  `client` is anything with the engine's four weight-sync methods — a `RolloutEngine` in the same process, or
  a Ray actor wrapping one (`vllm.distributed.weight_transfer.RayVLLMWeightSyncClient`).

Both run on every trainer rank (iterating the export can be a collective); only rank 0 sends.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource


class NamedTensorSource(WeightSource):
    """A re-iterable `WeightSource` over a list of `(hf_name, tensor)` pairs, replaceable between refits.

    Tensors not on the current CUDA device are copied there as they are yielded (CUDA IPC and NCCL need device
    memory). The metadata of a replacement must match the first one for NCCL (fixed receive layout).
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
    """vLLM's `VLLMWeightSyncClient` protocol over an in-process `vllm.LLM` (whose methods take request dicts)."""

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


class NcclWeightSender:
    """Trainer-side sender for an engine on separate GPUs (NCCL broadcast from trainer rank 0).

    Construct once per run on every trainer rank (rank 0 rendezvous with the engine's `engine_world_size`
    workers at `master_address:master_port`), then `send(weights)` after each training step.
    """

    def __init__(self, client: Any, *, master_address: str, master_port: int, engine_world_size: int,
                 rank: int = 0, packed: bool = True) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )

        self._source = NamedTensorSource()
        init_info = NCCLTrainerInitInfo(master_address=master_address, master_port=master_port,
                                        world_size=1 + engine_world_size, rank=rank, packed=packed)
        self._sender = NCCLTrainerWeightTransferEngine.trainer_init(init_info, client=client, source=self._source)

    def send(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Broadcast one refit; returns the number of tensors sent."""
        self._source.set(weights)
        self._sender.send_weights()
        return len(self._source.metadata())

    def close(self) -> None:
        self._sender.shutdown()

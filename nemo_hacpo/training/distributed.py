"""One agent's torch.distributed world: start it, seed it, tear it down.

Every agent forms its own world (docs/architecture.md): the ranks of one agent's trainer call
`init_distributed` with that agent's rendezvous address, then build a `MegatronTrainer`, which owns
Megatron's `parallel_state` for that world. Two agents never share a process.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_distributed(rank: int, world_size: int, master_addr: str = "127.0.0.1", master_port: int = 29500,
                     backend: str | None = None, *, local_rank: int | None = None,
                     timeout_s: float = 1800.0, store: dist.Store | None = None) -> None:
    """Join this agent's world as `rank` of `world_size` (TCP rendezvous at master_addr:master_port).

    On CUDA machines the rank's GPU is `local_rank` (default: `rank % device_count`) and the backend NCCL;
    on CPU-only torch the Megatron CPU shim is applied to this thread first and the backend is gloo.
    `store`: the rendezvous store to use (a worker's rank 0 passes the `TCPStore` it has listened with since
    it picked the port); by default rank 0 starts one at master_addr:master_port and the others connect.
    """
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialised in this process (one agent world per process)")
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank if local_rank is not None else rank % torch.cuda.device_count())
    else:
        from nemo_hacpo.models.megatron_cpu_shim import apply_cpu_shim

        apply_cpu_shim()
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:  # rank 0 hosts the store (as torch's tcp:// rendezvous does), the others connect to it
        store = dist.TCPStore(master_addr, master_port, world_size=world_size, is_master=rank == 0, timeout=timeout,
                              multi_tenant=True)
    dist.init_process_group(backend or default_backend(), store=store, rank=rank, world_size=world_size,
                            timeout=timeout)


def process_groups_in_order() -> list[Any]:
    """The process groups this process holds now, the default one included, in the order they were created (torch
    keeps them in its ordered c10d world registry; `dist.new_group` and Megatron's `initialize_model_parallel` add
    to it)."""
    from torch.distributed import distributed_c10d

    return list(distributed_c10d._world.pg_map) if dist.is_initialized() else []


def process_groups() -> set[Any]:
    """The process groups this process holds now, as a set (`process_groups_in_order`)."""
    return set(process_groups_in_order())


def destroy_groups(groups: Iterable[Any]) -> int:
    """Destroy these process groups (never the default one), freeing their communicators — with NCCL, their GPU
    buffers; Megatron's `destroy_model_parallel` only forgets its handles. Returns how many were destroyed."""
    destroyed = 0
    registry = process_groups_in_order()
    for group in sorted(groups, key=lambda g: registry.index(g) if g in registry else len(registry)):
        # in creation order on every rank: a communicator's teardown may be collective
        if group is not dist.GroupMember.WORLD and group in registry:
            dist.destroy_process_group(group)
            destroyed += 1
    return destroyed


def destroy_distributed() -> None:
    """Tear down Megatron's model-parallel state (if any) and the process group."""
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def seed_all(seed: int) -> None:
    """Seed torch's default stream and Megatron's named model-parallel streams (TP-rank offsets inside).

    The default stream gets `seed + 100·pp_rank` (Megatron-LM's convention) so pipeline stages initialise
    different layers differently.
    """
    from megatron.core import parallel_state, tensor_parallel

    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    torch.manual_seed(seed + 100 * pp_rank)
    tensor_parallel.model_parallel_cuda_manual_seed(seed + 100 * pp_rank)

"""Megatron-core parallel state on CPU for tests: the shim, `initialize_model_parallel`, seeds, teardown.

    with megatron_parallel_state(tp=2, pp=1, seed=1234):   # inside an initialised gloo world
        model = build_gpt_model(...)

Works in-process (a gloo world of one: see the `megatron_world_size_1` fixture in
tests/integration/conftest.py) and inside `run_distributed` ranks. Nested TP/PP layouts in one process are
fine one after another: the state is destroyed on exit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def megatron_parallel_state(tp: int = 1, pp: int = 1, seed: int = 1234) -> Iterator[None]:
    """Apply the CPU shim, initialise Megatron's TP/PP groups and seed both RNG streams; destroy on exit."""
    from megatron.core import parallel_state, tensor_parallel

    from nemo_hacpo.models.megatron_cpu_shim import apply_cpu_shim

    apply_cpu_shim()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    try:
        torch.manual_seed(seed)  # the default stream (Megatron's torch.cuda.manual_seed does nothing on CPU)
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
        yield
    finally:
        parallel_state.destroy_model_parallel()


@contextlib.contextmanager
def gloo_world_of_one() -> Iterator[None]:
    """An in-process torch.distributed world (gloo, rank 0 of 1) with the CPU shim; torn down on exit."""
    from nemo_hacpo.models.megatron_cpu_shim import apply_cpu_shim, remove_cpu_shim

    apply_cpu_shim()
    # a store on a port the OS picks while binding it: no window in which a test beside this one takes the port
    store = torch.distributed.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, wait_for_workers=False)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()
        remove_cpu_shim()

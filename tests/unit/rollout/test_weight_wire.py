"""Refit chunks: safetensors round trip (any dtype, tied tensors) and cutting by size, in order."""

from __future__ import annotations

import pytest
import torch

from nemo_hacpo.rollout.weight_wire import decode_chunk, encode_chunk, iter_chunks


def test_round_trip_keeps_values_dtypes_and_shapes():
    weights = [("a.weight", torch.arange(6, dtype=torch.float32).reshape(2, 3)),
               ("b.bias", torch.tensor([1.5, -2.0], dtype=torch.bfloat16)),
               ("c.t", torch.arange(6, dtype=torch.float32).reshape(3, 2).t())]  # non-contiguous view
    decoded = dict(decode_chunk(encode_chunk(weights)))
    assert sorted(decoded) == ["a.weight", "b.bias", "c.t"]
    for name, tensor in weights:
        assert decoded[name].dtype == tensor.dtype
        assert torch.equal(decoded[name], tensor)


def test_tied_tensors_are_copied_not_rejected():
    embedding = torch.randn(4, 3)
    decoded = dict(decode_chunk(encode_chunk([("embed.weight", embedding), ("lm_head.weight", embedding)])))
    assert torch.equal(decoded["embed.weight"], embedding) and torch.equal(decoded["lm_head.weight"], embedding)


def test_duplicate_names_are_an_error():
    with pytest.raises(ValueError, match="twice"):
        encode_chunk([("x", torch.zeros(1)), ("x", torch.ones(1))])


def test_chunks_cut_once_they_reach_the_size():
    # 4-byte floats: sizes 8, 8, 40, 4 bytes; cut at ≥ 16 bytes → [a, b], [c], [d].
    weights = [("a", torch.zeros(2)), ("b", torch.zeros(2)), ("c", torch.zeros(10)), ("d", torch.zeros(1))]
    chunks = list(iter_chunks(weights, chunk_bytes=16))
    assert [[name for name, _ in chunk] for chunk in chunks] == [["a", "b"], ["c"], ["d"]]
    assert [name for name, _ in next(iter(iter_chunks(weights, chunk_bytes=1 << 30)))] == ["a", "b", "c", "d"]
    assert list(iter_chunks([], chunk_bytes=16)) == []
    with pytest.raises(ValueError):
        list(iter_chunks(weights, chunk_bytes=0))

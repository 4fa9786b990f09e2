"""Sequence packing helpers: cu_seqlens, restarting positions, packed inputs and the unpacked row layout."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_hacpo.training.batching import MicroBatch, micro_batches, pad_micro_batch, padded_length
from nemo_hacpo.training.packing import (
    PackedSequence,
    cu_seqlens_of,
    pack_rows,
    restarting_positions,
    unpack_index,
    unpack_token_values,
)


def test_cu_seqlens_are_int32_cumulative_lengths() -> None:
    cu = cu_seqlens_of([3, 1, 2])
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 4, 6]
    assert cu_seqlens_of([5]).tolist() == [0, 5]
    with pytest.raises(ValueError, match="≥ 1 position"):
        cu_seqlens_of([3, 0])


def test_positions_restart_in_every_segment() -> None:
    assert restarting_positions([3, 1, 2]).tolist() == [0, 1, 2, 0, 0, 1]


def test_pack_rows_worked_example_with_trailing_padding() -> None:
    """The docstring's example: rows [5, 6, 7] and [8, 9], multiple 4 → T = 4, one padding position."""
    packed = pack_rows([[5, 6, 7], [8, 9]], [0, 1], pad_to_multiple=4)
    assert packed.input_ids.tolist() == [[5, 6, 8, 0]]
    assert packed.labels.tolist() == [[6, 7, 9, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 0, 1]]
    assert packed.cu_seqlens.tolist() == [0, 2, 4] and packed.cu_seqlens.dtype == torch.int32
    assert packed.row_lengths.tolist() == [2, 1]
    assert (packed.max_seqlen, packed.num_rows, packed.num_positions) == (2, 2, 4)


def test_pack_rows_takes_rows_in_the_given_order_without_padding() -> None:
    token_ids = [[1, 2], [3, 4, 5, 6], [7, 8, 9]]
    packed = pack_rows(token_ids, [2, 0])
    assert packed.input_ids.tolist() == [[7, 8, 1]]
    assert packed.labels.tolist() == [[8, 9, 2]]
    assert packed.position_ids.tolist() == [[0, 1, 0]]
    assert packed.cu_seqlens.tolist() == [0, 2, 3]
    assert packed.max_seqlen == 2
    with pytest.raises(ValueError, match="≥ 1 row"):
        pack_rows(token_ids, [])
    with pytest.raises(ValueError, match="≥ 2 tokens"):
        pack_rows([[1]], [0])


def test_unpack_index_and_values_worked_example() -> None:
    """Rows of lengths 2 and 1 packed as [a0 a1 | b0 pad] → [[a0, a1, 0], [b0, 0, 0]] at S = 3."""
    packed = pack_rows([[5, 6, 7], [8, 9]], [0, 1], pad_to_multiple=4)
    index, valid = unpack_index(packed.cu_seqlens, packed.row_lengths, 3)
    assert index.tolist() == [[0, 1, 0], [2, 0, 0]]
    assert valid.tolist() == [[True, True, False], [True, False, False]]
    values = torch.tensor([[10.0, 11.0, 12.0, 13.0]])
    assert unpack_token_values(values, packed, 3).tolist() == [[10.0, 11.0, 0.0], [12.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="shorter than the longest row"):
        unpack_token_values(values, packed, 1)
    with pytest.raises(ValueError, match="expected 4 packed values"):
        unpack_token_values(values[:, :3], packed, 3)


def test_unpacking_passes_gradients_to_real_positions_only() -> None:
    packed = pack_rows([[5, 6, 7], [8, 9]], [0, 1], pad_to_multiple=4)
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0]], requires_grad=True)
    weights = torch.tensor([[1.0, 10.0, 100.0], [1000.0, 1e4, 1e5]])
    (unpack_token_values(values, packed, 3) * weights).sum().backward()
    # position 0 is also the target of invalid cells; they must not leak gradient into it
    assert values.grad.tolist() == [[1.0, 10.0, 1000.0, 0.0]]


rows_strategy = st.lists(st.lists(st.integers(1, 50), min_size=2, max_size=12), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(token_ids=rows_strategy, multiple=st.sampled_from([1, 2, 4, 16]))
def test_unpacked_inputs_and_labels_equal_the_padded_layout(token_ids: list[list[int]], multiple: int) -> None:
    """Invariant: packing then unpacking reproduces the padded micro-batch (inputs, labels, positions where
    the row is real), T is Σ l_b rounded up to the multiple, and segments tile [0, T)."""
    rows = list(range(len(token_ids)))
    padded = pad_micro_batch(token_ids, [[0] * len(t) for t in token_ids], rows)
    packed = pack_rows(token_ids, rows, pad_to_multiple=multiple)
    total = sum(len(t) - 1 for t in token_ids)
    assert packed.num_positions == padded_length(total, multiple)
    assert packed.cu_seqlens[0] == 0 and packed.cu_seqlens[-1] == packed.num_positions
    assert torch.all(packed.cu_seqlens[1:] > packed.cu_seqlens[:-1])
    seq_len = padded.input_ids.shape[1]
    assert torch.equal(unpack_token_values(packed.input_ids, packed, seq_len), padded.input_ids)
    assert torch.equal(unpack_token_values(packed.labels, packed, seq_len), padded.labels)
    _, valid = unpack_index(packed.cu_seqlens, packed.row_lengths, seq_len)
    unpacked_positions = unpack_token_values(packed.position_ids, packed, seq_len)
    assert torch.equal(unpacked_positions[valid], padded.position_ids[valid])
    assert packed.max_seqlen == int((packed.cu_seqlens[1:] - packed.cu_seqlens[:-1]).max())


def test_token_budget_counts_real_tokens_when_packed() -> None:
    """The docstring's example: lengths 3, 5, 2, 4 and a budget of 10 tokens."""
    lengths = [3, 5, 2, 4]
    assert micro_batches(range(4), lengths, micro_batch_size=8, max_tokens=10) == [[0, 1], [2, 3]]
    assert micro_batches(range(4), lengths, micro_batch_size=8, max_tokens=10, packed=True) == [[0, 1, 2], [3]]
    # the row cap still applies, and a row above the budget runs alone
    assert micro_batches(range(4), lengths, micro_batch_size=2, max_tokens=10, packed=True) == [[0, 1], [2, 3]]
    assert micro_batches(range(4), lengths, micro_batch_size=8, max_tokens=4, packed=True) == [[0], [1], [2], [3]]


def test_micro_batch_carries_its_packed_inputs_to_the_device() -> None:
    token_ids = [[5, 6, 7], [8, 9]]
    batch = pad_micro_batch(token_ids, [[0, 1, 1], [0, 1]], [0, 1])
    assert batch.model_input_shape == (2, 2)
    batch.packed = pack_rows(token_ids, [0, 1], pad_to_multiple=4)
    assert batch.model_input_shape == (1, 4)
    moved = batch.to("cpu")
    assert isinstance(moved, MicroBatch) and isinstance(moved.packed, PackedSequence)
    assert torch.equal(moved.packed.cu_seqlens, batch.packed.cu_seqlens) and moved.packed.max_seqlen == 2


def test_megatron_packed_seq_params_are_thd_self_attention() -> None:
    packed = pack_rows([[5, 6, 7], [8, 9]], [0, 1])
    params = packed.megatron_params()
    assert params.qkv_format == "thd"
    assert params.cu_seqlens_q.tolist() == params.cu_seqlens_kv.tolist() == [0, 2, 3]
    assert params.max_seqlen_q == params.max_seqlen_kv == 2


@pytest.mark.parametrize(("fp8_recipe", "tp", "sequence_parallel", "multiple"), [
    (None, 4, False, 1), ("tensorwise", 1, False, 16), ("blockwise", 1, False, 128),
    (None, 4, True, 4), ("tensorwise", 3, True, 48), ("blockwise", 8, True, 128),  # lcm(16, 3), lcm(128, 8)
])
def test_default_length_multiple_covers_fp8_and_sequence_parallel(fp8_recipe: str | None, tp: int,
                                                                  sequence_parallel: bool, multiple: int) -> None:
    """A packed micro-batch's T (a padded one's S) must split over TP ranks under sequence parallelism."""
    from nemo_hacpo.config import AgentConfig, ParallelConfig, PrecisionConfig
    from nemo_hacpo.training.trainer import default_pad_multiple

    precision = PrecisionConfig(dtype="bf16", fp8="e4m3" if fp8_recipe else None, fp8_recipe=fp8_recipe or "blockwise")
    agent = AgentConfig(name="a", parallel=ParallelConfig(tp=tp, sequence_parallel=sequence_parallel),
                        precision=precision)
    assert default_pad_multiple(agent) == multiple

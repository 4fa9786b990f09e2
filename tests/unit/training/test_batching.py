"""Rows → mini-batches → DP shards → padded, shifted micro-batches (hand-computed layouts)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_hacpo.training.batching import (
    PAD_ID,
    TrainingRows,
    micro_batches,
    minibatch_ranges,
    pad_micro_batch,
    scored_token_counts,
    split_evenly,
    training_micro_batch,
    validate_rows,
)


def _rows(token_ids, response_mask, **fields) -> TrainingRows:
    n = len(token_ids)
    cross = torch.arange(n) >= n // 2
    defaults = dict(advantages=torch.arange(n, dtype=torch.float32), cross_objective=cross, is_own=~cross,
                    source=cross.long(), omega=torch.full((n,), 2.0),
                    old_mean_logprob=-torch.arange(n, dtype=torch.float32))
    return TrainingRows(token_ids=token_ids, response_mask=response_mask, **(defaults | fields))


def test_split_evenly_gives_contiguous_ranges_larger_first() -> None:
    assert split_evenly(10, 4) == [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    assert split_evenly(2, 4) == [range(0, 1), range(1, 2), range(2, 2), range(2, 2)]
    assert split_evenly(0, 1) == [range(0, 0)]
    with pytest.raises(ValueError, match="num_parts"):
        split_evenly(3, 0)


def test_minibatch_ranges_are_the_in_order_updates() -> None:
    # algorithm.md §6: own first, cross last, not shuffled: update u takes the u-th consecutive block
    assert minibatch_ranges(16, 4) == [range(0, 4), range(4, 8), range(8, 12), range(12, 16)]
    assert minibatch_ranges(10, 3) == [range(0, 4), range(4, 7), range(7, 10)]
    with pytest.raises(ValueError, match="cannot fill 3 updates × 2 data-parallel"):
        minibatch_ranges(5, 3, dp_size=2)
    with pytest.raises(ValueError, match="updates_per_step"):
        minibatch_ranges(5, 0)


def test_micro_batches_fixed_size_and_token_budget() -> None:
    lengths = [10, 30, 5, 5, 40]
    assert micro_batches(range(5), lengths, 2) == [[0, 1], [2, 3], [4]]
    # budget 60 padded tokens, ≤ 4 rows: [10, 30] → 2·30 = 60 fits; adding 5 → 3·30 = 90 does not;
    # [5, 5] → 10; adding 40 → 3·40 = 120 does not; [40] alone.
    assert micro_batches(range(5), lengths, 4, max_tokens=60) == [[0, 1], [2, 3], [4]]
    assert micro_batches([3, 4], lengths, 4, max_tokens=30) == [[3], [4]]  # 40 > 30: a row of its own
    assert micro_batches(range(5), lengths, 1, max_tokens=1000) == [[0], [1], [2], [3], [4]]  # size still caps
    with pytest.raises(ValueError, match="micro_batch_size"):
        micro_batches(range(2), lengths, 0)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 50), min_size=1, max_size=30), size=st.integers(1, 8),
       budget=st.one_of(st.none(), st.integers(1, 200)))
def test_micro_batches_cover_rows_in_order_within_limits(lengths, size, budget) -> None:
    batches = micro_batches(range(len(lengths)), lengths, size, max_tokens=budget)
    assert [row for batch in batches for row in batch] == list(range(len(lengths)))
    for batch in batches:
        assert 1 <= len(batch) <= size
        if budget is not None and len(batch) > 1:
            assert len(batch) * max(lengths[r] for r in batch) <= budget


def test_pad_micro_batch_shifts_labels_and_mask_by_one() -> None:
    token_ids = [[5, 6, 7], [8, 9]]
    response_mask = [[0, 1, 1], [0, 1]]
    batch = pad_micro_batch(token_ids, response_mask, [0, 1])
    assert batch.input_ids.tolist() == [[5, 6], [8, PAD_ID]]
    assert batch.labels.tolist() == [[6, 7], [9, PAD_ID]]  # position t predicts token t + 1
    assert batch.loss_mask.tolist() == [[True, True], [True, False]]
    assert batch.position_ids.tolist() == [[0, 1], [0, 1]]
    assert batch.row_index.tolist() == [0, 1]
    only_second = pad_micro_batch(token_ids, response_mask, [1])
    assert only_second.input_ids.tolist() == [[8]]  # padded to the micro-batch's own longest row


def test_training_micro_batch_slices_row_fields_and_token_logprobs() -> None:
    token_ids = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    response_mask = [[0, 0, 1, 1], [0, 1], [0, 1, 1]]
    old = torch.arange(9, dtype=torch.float32).reshape(3, 3)  # [N, T = longest − 1]
    rows = _rows(token_ids, response_mask, old_token_logprobs=old)
    batch = training_micro_batch(rows, [1, 2])
    assert batch.input_ids.shape == (2, 2)
    assert batch.advantages.tolist() == [1.0, 2.0]
    assert batch.cross_objective.tolist() == [True, True] and batch.is_own.tolist() == [False, False]
    assert batch.old_mean_logprob.tolist() == [-1.0, -2.0]
    assert batch.old_token_logprobs.tolist() == [[3.0, 4.0], [6.0, 7.0]]  # cut to the micro-batch's S = 2
    assert batch.ref_token_logprobs is None


def test_validate_rows_rejects_unscoreable_rows() -> None:
    validate_rows([[1, 2]], [[0, 1]])
    with pytest.raises(ValueError, match="first token"):
        validate_rows([[1, 2]], [[1, 1]])
    with pytest.raises(ValueError, match="≥ 2 tokens"):
        validate_rows([[1]], [[0]])
    with pytest.raises(ValueError, match="response mask of 1"):
        validate_rows([[1, 2]], [[0]])
    with pytest.raises(ValueError, match="0/1"):
        validate_rows([[1, 2]], [[0, 2]])
    with pytest.raises(ValueError, match=r"advantages must have shape \[N\]"):
        _rows([[1, 2]], [[0, 1]], advantages=torch.zeros(2))


def test_scored_token_counts_are_response_lengths() -> None:
    assert scored_token_counts([[0, 0, 1, 1], [0, 1], [0, 0]]) == [2, 1, 0]


def test_training_rows_check_their_fields() -> None:
    rows = _rows([[1, 2, 3], [4, 5]], [[0, 1, 1], [0, 1]], omega=torch.tensor([1, 3]))
    assert rows.omega.dtype == torch.float32 and rows.omega.tolist() == [1.0, 3.0]  # converted once
    assert len(rows) == 2 and rows.is_own.tolist() == [True, False] and rows.old_token_logprobs is None
    assert rows.replace(advantages=torch.ones(2)).advantages.tolist() == [1.0, 1.0] and rows.advantages[0] == 0.0
    with pytest.raises(ValueError, match=r"old_token_logprobs must have shape \[N, T\] with N = 2"):
        rows.replace(old_token_logprobs=torch.zeros(3, 4))  # a replaced field is checked like a new one
    with pytest.raises(TypeError, match="no field"):
        rows.replace(omega_=torch.ones(2))
    with pytest.raises(ValueError, match="first token"):
        rows.replace(response_mask=[[1, 1, 1], [0, 1]])  # new token rows: checked again
    with pytest.raises(ValueError, match="cross_objective must be a bool tensor"):
        _rows([[1, 2]], [[0, 1]], cross_objective=torch.tensor([0]))
    with pytest.raises(ValueError, match=r"old_token_logprobs must have shape \[N, T\]"):
        _rows([[1, 2]], [[0, 1]], old_token_logprobs=torch.zeros(2, 3))
    supervised = TrainingRows.supervised([[1, 2, 3]], [[0, 1, 1]])
    assert supervised.is_own.tolist() == [True] and not supervised.cross_objective.any()


def test_padding_to_a_multiple_for_fp8() -> None:
    from nemo_hacpo.training.batching import padded_length

    assert [padded_length(n, 16) for n in (1, 16, 17, 40)] == [16, 16, 32, 48]
    batch = pad_micro_batch([[5, 6, 7]], [[0, 1, 1]], [0], pad_to_multiple=4)
    assert batch.input_ids.tolist() == [[5, 6, PAD_ID, PAD_ID]]
    assert batch.loss_mask.tolist() == [[True, True, False, False]]
    rows = _rows([[1, 2, 3]], [[0, 1, 1]], old_token_logprobs=torch.tensor([[-1.0, -2.0]]))
    assert training_micro_batch(rows, [0], pad_to_multiple=4).old_token_logprobs.tolist() == [[-1.0, -2.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="pad_to_multiple"):
        padded_length(3, 0)

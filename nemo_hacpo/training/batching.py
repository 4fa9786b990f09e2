"""Training rows → optimizer mini-batches → data-parallel shards → padded micro-batches (pure, no torch.distributed).

A learner's `TrainingRows` (in the broker's order, `algo.row_order`: algorithm.md §6) are cut into `M`
consecutive mini-batches, one per optimizer update `u`. Each mini-batch is split into `dp` contiguous shards, one per data-parallel
replica, and each shard into micro-batches: at most `micro_batch_size` rows, or — with a token budget —
as many consecutive rows as fit in `max_tokens` padded tokens (a dynamic micro-batch size).

Micro-batches are right-padded to their own longest row; with sequence packing (`training.packing`) the
model sees the rows concatenated instead, and the loss still reads this padded row layout. The shift by one
happens here:

    input_ids[b, t] = token_ids[b][t]          labels[b, t] = token_ids[b][t + 1]
    loss_mask[b, t] = response_mask[b][t + 1]  (position t predicts token t + 1)       t < len_b − 1

so `−CE(logits[b, t], labels[b, t])` is log π(y_{t+1} | y_≤t), scored where the label is a response token.
The last token of a row is never an input whose prediction is needed and is dropped; padding (id
`PAD_ID`, mask False) sits after it, which causal attention never lets real positions see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from nemo_hacpo.algo.rows import TrainingRows, validate_rows

__all__ = ["PAD_ID", "MicroBatch", "TrainingRows", "micro_batches", "minibatch_ranges", "pad_micro_batch",
           "padded_length", "scored_token_counts", "split_evenly", "training_micro_batch", "validate_rows"]

if TYPE_CHECKING:
    from nemo_hacpo.training.packing import PackedSequence

PAD_ID = 0
"""Token id written into padding (any valid id works: padded positions are masked and causally invisible)."""


def scored_token_counts(response_mask: Sequence[Sequence[int]]) -> list[int]:
    """Scored (response) tokens per row: `L_k(y)` of algorithm.md §4."""
    return [int(sum(mask[1:])) for mask in response_mask]


def split_evenly(num_items: int, num_parts: int) -> list[range]:
    """Contiguous ranges covering `0..num_items−1`, sizes differing by ≤ 1, the larger ones first.

    split_evenly(10, 4) → [0:3], [3:6], [6:8], [8:10]. Parts may be empty when num_items < num_parts.
    """
    if num_parts < 1:
        raise ValueError(f"num_parts must be ≥ 1, got {num_parts}")
    if num_items < 0:
        raise ValueError(f"num_items must be ≥ 0, got {num_items}")
    base, extra = divmod(num_items, num_parts)
    ranges, start = [], 0
    for part in range(num_parts):
        size = base + (1 if part < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges


def minibatch_ranges(num_rows: int, num_updates: int, dp_size: int = 1) -> list[range]:
    """The `M` consecutive optimizer mini-batches of a step (algorithm.md §6: one pass, in order).

    Every mini-batch needs ≥ `dp_size` rows so that each data-parallel replica has a micro-batch.
    """
    if num_updates < 1:
        raise ValueError(f"updates_per_step must be ≥ 1, got {num_updates}")
    if num_rows < num_updates * dp_size:
        raise ValueError(f"{num_rows} rows cannot fill {num_updates} updates × {dp_size} data-parallel replicas "
                         "(each replica needs ≥ 1 row per update); lower algo.updates_per_step or parallel.dp")
    return split_evenly(num_rows, num_updates)


def micro_batches(rows: Sequence[int], lengths: Sequence[int], micro_batch_size: int,
                  max_tokens: int | None = None, *, packed: bool = False) -> list[list[int]]:
    """Cut consecutive `rows` into micro-batches.

    Fixed size: chunks of `micro_batch_size` rows. With `max_tokens`: greedy, a row joins the current
    micro-batch while its cost stays ≤ max_tokens and the count ≤ micro_batch_size; a row longer than the
    budget gets a micro-batch of its own. The cost is `rows · (longest input length)` (padded), or with
    `packed` the sum of the input lengths (a packed micro-batch holds no padding between rows).
    `lengths[r]` is row r's input length (tokens − 1, the shifted layout).

    Example, lengths 3, 5, 2, 4 and max_tokens 10: padded → [0, 1], [2, 3] (rows 0–1 cost 2·5 = 10, adding
    row 2 would cost 3·5 = 15); packed → [0, 1, 2], [3] (3 + 5 + 2 = 10, adding row 3 would cost 14).
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be ≥ 1, got {micro_batch_size}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be ≥ 1, got {max_tokens}")
    batches: list[list[int]] = []
    current: list[int] = []
    longest = total = 0
    for row in rows:
        grown_longest, grown_total = max(longest, lengths[row]), total + lengths[row]
        cost = grown_total if packed else (len(current) + 1) * grown_longest
        fits = len(current) < micro_batch_size and (max_tokens is None or cost <= max_tokens)
        if current and not fits:
            batches.append(current)
            current, grown_longest, grown_total = [], lengths[row], lengths[row]
        current.append(row)
        longest, total = grown_longest, grown_total
    if current:
        batches.append(current)
    return batches


@dataclass
class MicroBatch:
    """One padded micro-batch, `B` rows × `S` positions (the shifted layout of the module docstring).

    `row_index [B]` holds the rows' indices in `TrainingRows`; the per-row fields are sliced from it.
    `old_token_logprobs`/`ref_token_logprobs` are `[B, S]` when present. `packed`, when set, holds the same
    rows packed into one sequence (`training.packing`): the model runs on it, the loss on this layout.
    """

    input_ids: torch.Tensor  # [B, S] int64
    position_ids: torch.Tensor  # [B, S] int64
    labels: torch.Tensor  # [B, S] int64
    loss_mask: torch.Tensor  # [B, S] bool
    row_index: torch.Tensor  # [B] int64
    advantages: torch.Tensor | None = None  # [B]
    cross_objective: torch.Tensor | None = None  # [B] bool
    is_own: torch.Tensor | None = None  # [B] bool
    omega: torch.Tensor | None = None  # [B]
    old_mean_logprob: torch.Tensor | None = None  # [B]
    ratio_length_scale: torch.Tensor | None = None  # [B] (TrainingRows.ratio_length_scale)
    old_token_logprobs: torch.Tensor | None = None  # [B, S]
    ref_token_logprobs: torch.Tensor | None = None  # [B, S]
    packed: PackedSequence | None = None  # model inputs [1, T] when sequence packing is on

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def model_input_shape(self) -> tuple[int, int]:
        """Shape of what the model sees: `[B, S]` padded, or `[1, T]` packed."""
        source = self.packed.input_ids if self.packed is not None else self.input_ids
        return int(source.shape[0]), int(source.shape[1])

    def to(self, device: torch.device | str) -> MicroBatch:
        moved = {name: (value.to(device) if value is not None and hasattr(value, "to") else value)
                 for name, value in self.__dict__.items()}
        return MicroBatch(**moved)


def padded_length(longest_input: int, multiple: int = 1) -> int:
    """`longest_input` rounded up to a multiple of `multiple` (FP8 GEMMs need token counts divisible by 16)."""
    if multiple < 1:
        raise ValueError(f"pad_to_multiple must be ≥ 1, got {multiple}")
    return -(-longest_input // multiple) * multiple


def pad_micro_batch(token_ids: Sequence[Sequence[int]], response_mask: Sequence[Sequence[int]],
                    rows: Sequence[int], pad_to_multiple: int = 1) -> MicroBatch:
    """Right-pad `rows` to their longest input length (rounded up to `pad_to_multiple`) and shift labels
    by one (module docstring).

    Example: tokens [5, 6, 7] with mask [0, 1, 1] and tokens [8, 9] with mask [0, 1] →
    input_ids [[5, 6], [8, 0]], labels [[6, 7], [9, 0]], loss_mask [[T, T], [T, F]].
    """
    if not rows:
        raise ValueError("a micro-batch needs ≥ 1 row")
    seq_len = padded_length(max(len(token_ids[r]) for r in rows) - 1, pad_to_multiple)
    input_ids = torch.full((len(rows), seq_len), PAD_ID, dtype=torch.long)
    labels = torch.full((len(rows), seq_len), PAD_ID, dtype=torch.long)
    loss_mask = torch.zeros((len(rows), seq_len), dtype=torch.bool)
    for b, r in enumerate(rows):
        tokens = torch.as_tensor(token_ids[r], dtype=torch.long)
        length = tokens.numel() - 1
        input_ids[b, :length] = tokens[:-1]
        labels[b, :length] = tokens[1:]
        loss_mask[b, :length] = torch.as_tensor(response_mask[r][1:], dtype=torch.bool)
    position_ids = torch.arange(seq_len, dtype=torch.long).expand(len(rows), seq_len).contiguous()
    return MicroBatch(input_ids=input_ids, position_ids=position_ids, labels=labels, loss_mask=loss_mask,
                      row_index=torch.as_tensor(list(rows), dtype=torch.long))


def training_micro_batch(rows: TrainingRows, indices: Sequence[int], pad_to_multiple: int = 1) -> MicroBatch:
    """`pad_micro_batch` plus the per-row loss inputs (and token log-probs fitted to the micro-batch's length)."""
    batch = pad_micro_batch(rows.token_ids, rows.response_mask, indices, pad_to_multiple)
    index = batch.row_index
    seq_len = batch.input_ids.shape[1]
    batch.advantages = rows.advantages[index].float()
    batch.cross_objective = rows.cross_objective[index]
    batch.is_own = rows.is_own[index]
    batch.omega = rows.omega[index].float()
    batch.old_mean_logprob = rows.old_mean_logprob[index].float()
    batch.ratio_length_scale = rows.ratio_length_scale[index].float()
    for name in ("old_token_logprobs", "ref_token_logprobs"):
        full = getattr(rows, name)
        if full is not None:
            if full.shape[0] != len(rows):
                raise ValueError(f"{name} has {full.shape[0]} rows, expected {len(rows)}")
            values = full[index, :seq_len].float()  # [B, ≤ S]; missing columns are padding (masked)
            setattr(batch, name, torch.nn.functional.pad(values, (0, seq_len - values.shape[1])))
    return batch

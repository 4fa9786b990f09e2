"""Padding-free micro-batches: a micro-batch's rows concatenated into one sequence (THD), and back.

Rows b = 0..B−1 with input lengths l_b (tokens − 1, the shifted layout of `batching`) become one sequence
of T = Σ l_b positions (+ trailing padding up to a multiple), fed to `GPTModel.forward` as `[1, T]` with
Megatron's `PackedSeqParams(qkv_format="thd")`:

    cu_seqlens = [0, l_0, l_0 + l_1, …, T]       (int32, [B + 1]; row b occupies [cu_b, cu_{b+1}))
    input_ids  = concat_b(tokens_b[:-1])         labels = concat_b(tokens_b[1:])
    position_ids = concat_b(0, 1, …, l_b − 1)    (restarting per row: learned absolute positions; RoPE
                                                  restarts per segment from cu_seqlens itself)
    max_seqlen = max_b(segment length)

Attention stays inside each segment (causal), so position t of row b sees exactly what it sees in the
padded layout and the token log-probs are the same. Trailing padding (to make T a multiple of
`pad_to_multiple`: FP8 GEMMs, sequence parallelism) is appended to the *last* segment, after its real
tokens, where causal attention hides it from them — the same place right-padding takes.

`unpack_token_values` maps packed per-position values `[1, T]` back to the padded row layout `[B, S]` the
loss expects (zeros beyond each row's length); it is a gather, so gradients flow back to the packed tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from nemo_hacpo.training.batching import PAD_ID, padded_length


@dataclass
class PackedSequence:
    """The model-side inputs of one packed micro-batch (see the module docstring).

    `row_lengths [B]` are the rows' real input lengths; segment lengths `cu_seqlens[b+1] − cu_seqlens[b]`
    equal them except the last, which also holds the trailing padding.
    """

    input_ids: torch.Tensor  # [1, T] int64
    position_ids: torch.Tensor  # [1, T] int64
    labels: torch.Tensor  # [1, T] int64
    cu_seqlens: torch.Tensor  # [B + 1] int32
    row_lengths: torch.Tensor  # [B] int64
    max_seqlen: int

    @property
    def num_rows(self) -> int:
        return int(self.row_lengths.numel())

    @property
    def num_positions(self) -> int:
        """T: packed positions, trailing padding included."""
        return int(self.input_ids.shape[1])

    def to(self, device: torch.device | str) -> PackedSequence:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        moved = {name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in moved.items()}
        return PackedSequence(**moved)

    def megatron_params(self) -> Any:
        """Megatron's `PackedSeqParams` for `GPTModel.forward(packed_seq_params=...)` (THD, self-attention)."""
        from megatron.core.packed_seq_params import PackedSeqParams

        return PackedSeqParams(qkv_format="thd", cu_seqlens_q=self.cu_seqlens, cu_seqlens_kv=self.cu_seqlens,
                               max_seqlen_q=self.max_seqlen, max_seqlen_kv=self.max_seqlen)


def cu_seqlens_of(lengths: Sequence[int]) -> torch.Tensor:
    """`[B + 1]` int32 cumulative lengths: cu_seqlens_of([3, 1, 2]) → [0, 3, 4, 6]."""
    if any(length < 1 for length in lengths):
        raise ValueError(f"every packed segment needs ≥ 1 position, got lengths {list(lengths)}")
    return torch.cumsum(torch.tensor([0, *lengths], dtype=torch.int64), 0).to(torch.int32)


def restarting_positions(lengths: Sequence[int]) -> torch.Tensor:
    """`[Σ lengths]` positions counting from 0 in every segment: ([3, 1, 2]) → [0, 1, 2, 0, 0, 1]."""
    return torch.cat([torch.arange(length, dtype=torch.long) for length in lengths])


def pack_rows(token_ids: Sequence[Sequence[int]], rows: Sequence[int], pad_to_multiple: int = 1) -> PackedSequence:
    """Pack `rows` (indices into `token_ids`) into one sequence, T rounded up to `pad_to_multiple`.

    Example: tokens [5, 6, 7] and [8, 9], multiple 4 → l = [2, 1], T = 4,
    input_ids [[5, 6, 8, 0]], labels [[6, 7, 9, 0]], position_ids [[0, 1, 0, 1]], cu_seqlens [0, 2, 4],
    max_seqlen 2 (the last segment holds row 1's token and one padding position).
    """
    if not rows:
        raise ValueError("a micro-batch needs ≥ 1 row")
    lengths = [len(token_ids[r]) - 1 for r in rows]
    if min(lengths) < 1:
        raise ValueError("every row needs ≥ 2 tokens (a prompt token and a scored token)")
    total = sum(lengths)
    num_positions = padded_length(total, pad_to_multiple)
    segments = [*lengths[:-1], lengths[-1] + num_positions - total]  # the last segment takes the padding
    inputs = torch.full((num_positions,), PAD_ID, dtype=torch.long)
    labels = torch.full((num_positions,), PAD_ID, dtype=torch.long)
    start = 0
    for r, length in zip(rows, lengths, strict=True):
        tokens = torch.as_tensor(token_ids[r], dtype=torch.long)
        inputs[start:start + length] = tokens[:-1]
        labels[start:start + length] = tokens[1:]
        start += length
    return PackedSequence(
        input_ids=inputs.unsqueeze(0), position_ids=restarting_positions(segments).unsqueeze(0),
        labels=labels.unsqueeze(0), cu_seqlens=cu_seqlens_of(segments),
        row_lengths=torch.tensor(lengths, dtype=torch.long), max_seqlen=max(segments))


def unpack_index(cu_seqlens: torch.Tensor, row_lengths: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each row-layout cell comes from: `index [B, S]` into the T packed positions and `valid [B, S]`.

    index[b, t] = cu_seqlens[b] + t, valid[b, t] = t < row_lengths[b] (invalid cells point at position 0).
    """
    if seq_len < int(row_lengths.max()):
        raise ValueError(f"seq_len {seq_len} is shorter than the longest row ({int(row_lengths.max())})")
    offsets = torch.arange(seq_len, device=cu_seqlens.device)  # [S]
    valid = offsets.unsqueeze(0) < row_lengths.to(cu_seqlens.device).unsqueeze(1)  # [B, S]
    index = cu_seqlens[:-1].long().unsqueeze(1) + offsets.unsqueeze(0)  # [B, S]
    return torch.where(valid, index, torch.zeros_like(index)), valid


def unpack_token_values(packed_values: torch.Tensor, packed: PackedSequence, seq_len: int) -> torch.Tensor:
    """Packed per-position values `[1, T]` (or `[T]`) → the padded row layout `[B, S]`, 0 beyond each row.

    A gather: gradients reach the packed tensor (padding cells get none).
    """
    flat = packed_values.reshape(-1)  # [T]
    if flat.numel() != packed.num_positions:
        raise ValueError(f"expected {packed.num_positions} packed values, got {flat.numel()}")
    index, valid = unpack_index(packed.cu_seqlens.to(flat.device), packed.row_lengths, seq_len)
    return torch.where(valid, flat[index], torch.zeros((), dtype=flat.dtype, device=flat.device))

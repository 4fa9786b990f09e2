"""`TrainingRows`: one learner's training rows for one step — what the broker builds and the trainer consumes.

The one row-batch type of the project. The broker (`Broker.step`) fills it for every learner from the joint
group (algorithm.md §6: in `algo.row_order`, by default prompt by prompt, each prompt's own rows before the
other agents'); the warm start fills it with worked solutions (`TrainingRows.supervised`); the trainer cuts it
into mini-batches and micro-batches.

Row-aligned fields, N rows:

    token_ids, response_mask       ragged lists: prompt + response ids (learner's tokenization), 1 on the response
    advantages        [N] float32  A_k(y) (algorithm.md §2)
    cross_objective   [N] bool     the loss applies the cross objective of algorithm.md §5 to the row
    omega             [N] float32  gradient weight ω(source→learner) of the row (1 on own rows, algorithm.md §3)
    old_mean_logprob  [N] float32  m_old: the sampling policy's mean token log-prob of the response, recomputed by
                                   the sampling agent's trainer — the learner's own m_k,old on its rows, the
                                   source's m_j,old (on the source's tokens) on other agents' rows (algorithm.md §4)
    is_own            [N] bool     the learner sampled the row itself (the KL term's rows)
    source            [N] int64    index of the agent that sampled the row
    ratio_length_scale [N] float32 L_learner / L_source under the single-exponent ratio convention (cross rows),
                                   1 otherwise: the loss scales the learner's mean log-prob by it, so that
                                   its sum is divided by the source's token count (algorithm.md §4); default 1
    old_token_logprobs [N, T] | None   per-token log-probs at the sampling weights, shifted layout (`[:, t]` scores
                                   token t + 1, T ≥ longest row − 1); carried when the loss needs them (token level)
    ref_token_logprobs [N, T] | None   the reference model's, same layout (filled by the trainer when β > 0)

`cross_objective` and `is_own` differ on purpose: under `naive` sharing the other agents' rows are not the
learner's own (`is_own` False) but are trained with the own-row objective (`cross_objective` False).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["TrainingRows", "validate_rows"]


def validate_rows(token_ids: Sequence[Sequence[int]], response_mask: Sequence[Sequence[int]]) -> None:
    """Each row has ≥ 2 tokens, a 0/1 mask of its length, and an unscored first token (nothing predicts it)."""
    if len(token_ids) != len(response_mask):
        raise ValueError(f"token_ids has {len(token_ids)} rows but response_mask has {len(response_mask)}")
    for index, (tokens, mask) in enumerate(zip(token_ids, response_mask, strict=True)):
        if len(tokens) != len(mask):
            raise ValueError(f"row {index}: {len(tokens)} tokens but a response mask of {len(mask)}")
        if len(tokens) < 2:
            raise ValueError(f"row {index}: needs ≥ 2 tokens (a prompt token and a scored token), got {len(tokens)}")
        if mask[0]:
            raise ValueError(f"row {index}: the first token is marked as response, but no position predicts it")
        if not set(mask) <= {0, 1}:
            raise ValueError(f"row {index}: response_mask must hold 0/1 values")


_VECTORS = {"advantages": torch.float32, "cross_objective": torch.bool, "omega": torch.float32,
            "old_mean_logprob": torch.float32, "is_own": torch.bool, "source": torch.int64,
            "ratio_length_scale": torch.float32}


@dataclass
class TrainingRows:
    """One learner's rows for one step, in training order (see the module docstring for every field)."""

    token_ids: list[list[int]]
    response_mask: list[list[int]]
    advantages: torch.Tensor
    cross_objective: torch.Tensor
    omega: torch.Tensor
    old_mean_logprob: torch.Tensor
    is_own: torch.Tensor
    source: torch.Tensor
    old_token_logprobs: torch.Tensor | None = None
    ref_token_logprobs: torch.Tensor | None = None
    ratio_length_scale: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.ratio_length_scale is None:
            self.ratio_length_scale = torch.ones(len(self.token_ids))
        self._check_tensors()
        validate_rows(self.token_ids, self.response_mask)

    def _check_tensors(self) -> None:
        num_rows = len(self.token_ids)
        for name, dtype in _VECTORS.items():
            value = torch.as_tensor(getattr(self, name))
            if tuple(value.shape) != (num_rows,):
                raise ValueError(f"{name} must have shape [N] = [{num_rows}], got {tuple(value.shape)}")
            if dtype == torch.bool and value.dtype != torch.bool:
                raise ValueError(f"{name} must be a bool tensor, got {value.dtype}")
            setattr(self, name, value.to(dtype))
        for name in ("old_token_logprobs", "ref_token_logprobs"):
            value = getattr(self, name)
            if value is not None and (value.ndim != 2 or value.shape[0] != num_rows):
                raise ValueError(f"{name} must have shape [N, T] with N = {num_rows}, got {tuple(value.shape)}")

    def __len__(self) -> int:
        return len(self.token_ids)

    def replace(self, **changes) -> TrainingRows:
        """A shallow copy with some fields replaced (the caller's rows stay untouched). The token rows, checked
        when these rows were made, are checked again only when they change."""
        if "token_ids" in changes or "response_mask" in changes:
            return dataclasses.replace(self, **changes)
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"TrainingRows has no field(s) {sorted(unknown)}")
        new = copy.copy(self)
        for name, value in changes.items():
            setattr(new, name, value)
        new._check_tensors()
        return new

    def select(self, order: Sequence[int] | torch.Tensor) -> TrainingRows:
        """The rows at `order` (a permutation reorders them, a subset keeps those), every per-row field alike."""
        index = torch.as_tensor(order, dtype=torch.long)
        picked = index.tolist()
        changes: dict[str, Any] = {"token_ids": [self.token_ids[i] for i in picked],
                                   "response_mask": [self.response_mask[i] for i in picked]}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name not in changes and isinstance(value, torch.Tensor):
                changes[f.name] = value[index]
        return dataclasses.replace(self, **changes)

    @classmethod
    def supervised(cls, token_ids: list[list[int]], response_mask: list[list[int]]) -> TrainingRows:
        """Rows for the `nll` objective (the warm start): the agent's own worked solutions. The loss inputs of
        RL (advantages, ω, m_old) are neutral values the `nll` objective never reads."""
        n = len(token_ids)
        return cls(token_ids=token_ids, response_mask=response_mask, advantages=torch.zeros(n),
                   cross_objective=torch.zeros(n, dtype=torch.bool), omega=torch.ones(n),
                   old_mean_logprob=torch.zeros(n), is_own=torch.ones(n, dtype=torch.bool),
                   source=torch.zeros(n, dtype=torch.int64))

"""Train/inference mismatch: how far the sampler's log-probs are from the trainer's on the same tokens.

    token_mult_prob_error = exp( Σ_{i,t} mask[i,t] · |trainer[i,t] − sampler[i,t]| / Σ_{i,t} mask[i,t] )

a token-mean over every response token of the batch (prompt positions and padding masked out). It is 1
exactly when the two agree on every token and grows with the typical per-token probability ratio; a healthy
fp32 run sits within 1e-3 of 1, bf16 runs at a few percent. NeMo-RL's metric of the same name averages
exp|Δ| instead (mean of exponentials, ≥ this one by Jensen); we follow the issue's exp-of-mean.

Example: |Δ| = 0.1, 0.5, 0 on three response tokens → exp(0.6 / 3) = exp(0.2) = 1.2214.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def token_mult_prob_error(trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor,
                          response_mask: torch.Tensor) -> torch.Tensor:
    """exp(token-mean |trainer − sampler|) over masked tokens.

    Args:
        trainer_logprobs: [N, T] log π_train(y_t | ·), any value where the mask is 0.
        sampler_logprobs: [N, T] the sampler's log-probs of the same tokens.
        response_mask: [N, T] 1 on response tokens, 0 on prompt / padding (bool or 0/1).

    Returns:
        A 0-dim float64 tensor ≥ 1. Nothing is differentiated (inputs are detached).
    """
    if trainer_logprobs.shape != sampler_logprobs.shape or trainer_logprobs.shape != response_mask.shape:
        raise ValueError(f"shapes differ: trainer {tuple(trainer_logprobs.shape)}, sampler "
                         f"{tuple(sampler_logprobs.shape)}, mask {tuple(response_mask.shape)}")
    mask = response_mask.detach().to(torch.float64)
    count = mask.sum()
    if count <= 0:
        raise ValueError("the response mask selects no token")
    diff = (trainer_logprobs.detach().to(torch.float64) - sampler_logprobs.detach().to(torch.float64)).abs()
    diff = torch.where(mask > 0, diff, torch.zeros_like(diff))  # padding may hold inf/NaN
    return torch.exp((diff * mask).sum() / count)


def pad_ragged(rows: Sequence[Sequence[float]], pad_value: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad per-response log-prob lists into `values [N, T]` (float64) and `mask [N, T]` (1 on real entries)."""
    if not rows:
        raise ValueError("no rows to pad")
    width = max(len(r) for r in rows)
    values = torch.full((len(rows), width), pad_value, dtype=torch.float64)
    mask = torch.zeros((len(rows), width), dtype=torch.float64)
    for i, row in enumerate(rows):
        values[i, :len(row)] = torch.tensor(list(row), dtype=torch.float64)
        mask[i, :len(row)] = 1.0
    return values, mask


def ragged_token_mult_prob_error(trainer_logprobs: Sequence[Sequence[float]],
                                 sampler_logprobs: Sequence[Sequence[float]]) -> float:
    """`token_mult_prob_error` of per-response lists (response tokens only, row i of both of equal length)."""
    if len(trainer_logprobs) != len(sampler_logprobs):
        raise ValueError(f"{len(trainer_logprobs)} trainer rows vs {len(sampler_logprobs)} sampler rows")
    for i, (a, b) in enumerate(zip(trainer_logprobs, sampler_logprobs, strict=True)):
        if len(a) != len(b):
            raise ValueError(f"row {i}: {len(a)} trainer log-probs vs {len(b)} sampler log-probs")
    trainer, mask = pad_ragged(trainer_logprobs)
    sampler, _ = pad_ragged(sampler_logprobs)
    return float(token_mult_prob_error(trainer, sampler, mask))

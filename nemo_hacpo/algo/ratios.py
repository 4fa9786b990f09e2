"""Sequence-level log-probabilities, GSPO ratios and the stepwise cross-sample clip bound (algorithm.md §4, §5)."""

from __future__ import annotations

import torch

from nemo_hacpo.algo._validation import (
    compute_dtype,
    require_bool,
    require_finite_number,
    require_floating,
    require_shape,
)

__all__ = ["cross_clip_lower", "masked_token_sum", "sequence_log_ratio", "sequence_mean_logprob"]


def masked_token_sum(token_values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row sum of the masked tokens and the number of masked tokens.

        sums[n] = Σ_t values[n, t]·[mask[n, t]]     counts[n] = Σ_t [mask[n, t]]

    Unmasked positions are *selected away*, not multiplied by 0, so padding holding −inf or NaN
    (a common log-prob filler) cannot leak into the sum or its gradient.

    Args:
        token_values: `[N, T]` floating point.
        mask: `[N, T]` bool.

    Returns:
        `(sums [N], counts [N])`, both in at least float32.
    """
    require_shape("token_values", token_values, (None, None), "[N, T]")
    require_floating("token_values", token_values)
    require_shape("mask", mask, tuple(token_values.shape), "[N, T] (same as token_values)")
    require_bool("mask", mask)
    values = token_values.to(compute_dtype(token_values))
    sums = torch.where(mask, values, torch.zeros_like(values)).sum(dim=-1)  # [N]
    counts = mask.sum(dim=-1).to(values.dtype)  # [N]
    return sums, counts


def sequence_mean_logprob(token_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Length-normalised log-probability of each sequence in its own tokenization (algorithm.md §4).

        m[n] = (1 / L[n]) · Σ_t log π(y_t | …)·[mask[n, t]]          L[n] = Σ_t [mask[n, t]]

    A row with an empty mask gives m = 0 (and no gradient), so an all-padding row is harmless.
    Gradients flow into `token_logprobs` at masked positions only.

    Args:
        token_logprobs: `[N, T]` per-token log-probabilities (any float dtype; summed in ≥ float32).
        mask: `[N, T]` bool, True on response tokens that are scored.

    Returns:
        `[N]` mean log-probabilities (float32, or float64 for float64 input).
    """
    sums, counts = masked_token_sum(token_logprobs, mask)
    return sums / counts.clamp(min=1.0)


def sequence_log_ratio(
    learner_mean_logprob: torch.Tensor, behaviour_mean_logprob: torch.Tensor, max_abs_log_ratio: float = 10.0
) -> torch.Tensor:
    """Clamped GSPO log-ratio `log s = clamp(m_learner − sg(m_behaviour), −c, c)`, shape `[N]`.

    The behaviour side (`m_k,old` for self samples, the source's `m_j,old` for cross samples) is
    detached. Outside `[−c, c]` the clamp passes no gradient (torch.clamp's gradient is 1 on the closed
    interval, 0 outside).
    """
    require_shape("learner_mean_logprob", learner_mean_logprob, (None,), "[N]")
    require_shape("behaviour_mean_logprob", behaviour_mean_logprob, tuple(learner_mean_logprob.shape), "[N]")
    require_floating("learner_mean_logprob", learner_mean_logprob)
    limit = require_finite_number("max_abs_log_ratio", max_abs_log_ratio, low=0.0)
    if limit == 0.0:
        raise ValueError("max_abs_log_ratio must be > 0")
    dtype = compute_dtype(learner_mean_logprob)
    behaviour = behaviour_mean_logprob.detach().to(dtype=dtype, device=learner_mean_logprob.device)
    return (learner_mean_logprob.to(dtype) - behaviour).clamp(min=-limit, max=limit)


def cross_clip_lower(update_index: int, delta: float, delta_step: float) -> float:
    """Stepwise lower clip bound for cross samples: `lo_u = min(1, 1 − δ + u · δ_step)` (algorithm.md §5).

    `u` is the 0-based index of the optimizer update inside the current training step. Example:
    δ = 0.2, δ_step = 0.025 → u = 0, 1, 2, 3 give 0.8, 0.825, 0.85, 0.875; u ≥ 8 gives 1.
    """
    if isinstance(update_index, bool) or not isinstance(update_index, int) or update_index < 0:
        raise ValueError(f"update_index must be an integer ≥ 0, got {update_index!r}")
    delta = require_finite_number("delta", delta, low=0.0, high=1.0)
    delta_step = require_finite_number("delta_step", delta_step, low=0.0)
    return min(1.0, 1.0 - delta + update_index * delta_step)

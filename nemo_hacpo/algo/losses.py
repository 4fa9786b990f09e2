"""Policy losses: HACPO (algorithm.md §5–6), its special case GSPO, token-level GRPO, and the k3 KL estimator.

Every loss returns `(loss, metrics)`. `loss` is a 0-d tensor carrying the gradient; `metrics` maps names
to **0-d detached tensors** on the input's device (no host synchronisation; call `.item()` to log).
A metric over an empty set of rows or tokens (e.g. cross ratios when there are no cross rows) is NaN.

Normalisers: by default a loss is a mean over this call's rows (or tokens). A trainer that splits one
optimizer mini-batch into micro-batches and data-parallel ranks passes the *global* count instead
(`num_sequences` / `normaliser`), so that summing the per-micro-batch losses (and all-reducing the
gradients with a sum) reproduces the loss of the whole mini-batch.
"""

from __future__ import annotations

import torch

from nemo_hacpo.algo._validation import (
    compute_dtype,
    require_bool,
    require_finite_number,
    require_floating,
    require_positive_count,
    require_shape,
)
from nemo_hacpo.algo.ratios import cross_clip_lower, masked_token_sum, sequence_log_ratio

__all__ = ["GRPO_AGGREGATIONS", "grpo_token_loss", "gspo_loss", "hacpo_loss", "low_var_kl"]

GRPO_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
"""Valid `agg` values of :func:`grpo_token_loss`."""

KL_LOG_RATIO_LIMIT = 20.0
KL_VALUE_LIMIT = 10.0


def _masked_stats(
    values: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean, min, max) of `values[mask]`, each NaN when the mask is empty; sync-free."""
    count = mask.sum().to(values.dtype)
    nan = torch.full_like(count, float("nan"))
    mean = torch.where(mask, values, torch.zeros_like(values)).sum() / count  # 0/0 = NaN when empty
    inf = torch.full((1,), float("inf"), dtype=values.dtype, device=values.device)
    # the ±inf sentinel makes the reductions defined on zero-sized inputs
    low = torch.cat([torch.where(mask, values, inf).reshape(-1), inf]).amin()
    high = torch.cat([torch.where(mask, values, -inf).reshape(-1), -inf]).amax()
    empty = count == 0
    return mean, torch.where(empty, nan, low), torch.where(empty, nan, high)


def _fraction(condition: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Share of the masked entries where `condition` holds (NaN when the mask is empty)."""
    return (condition & mask).sum().to(dtype) / mask.sum().to(dtype)


def _check_vector(name: str, value: torch.Tensor, size: int) -> None:
    require_shape(name, value, (size,), "[N]")


def hacpo_loss(
    learner_mean_logprob: torch.Tensor,
    behaviour_mean_logprob: torch.Tensor,
    advantages: torch.Tensor,
    is_cross: torch.Tensor,
    omega: torch.Tensor,
    update_index: int,
    *,
    alpha: float,
    delta: float,
    delta_step: float,
    eps_low: float,
    eps_high: float,
    max_abs_log_ratio: float = 10.0,
    num_sequences: float | None = None,
    cross_clip: bool = True,
    rows_out: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """HACPO policy loss of one learner over `N` sequences (self and cross rows pooled).

        s        = exp(clamp(m_learner − sg(m_behaviour), −c, c))                      c = max_abs_log_ratio
        self:  obj = min(s·A, clip(s, 1 − eps_low, 1 + eps_high)·A)                    (GSPO)
        cross: obj = s_c · sg(s_c)^α · ω · A,   s_c = clip(s, lo_u, 1),   lo_u = min(1, 1 − δ + u·δ_step)
        loss     = −Σ_rows obj / D                     D = N, or `num_sequences` when given

    Only `learner_mean_logprob` carries gradient; behaviour log-probs, advantages and ω are detached.
    Gradient of a cross row w.r.t. `m_learner` (since ds/dm = s): `−s^(1+α)·ω·A / D` for
    `lo_u ≤ s ≤ 1`, and exactly 0 for `s < lo_u` or `s > 1` (the row still counts in `D`).
    Boundaries are closed: `s == lo_u` or `s == 1` still passes gradient (torch.clamp's convention; the
    same holds for the self clip range and for `|log s| == c`). When `lo_u` reaches 1 the cross clip
    range is the single point 1, so cross rows pass gradient only when `s == 1` exactly.
    With no cross rows this is exactly GSPO; "naive" sharing = cross rows passed with `is_cross=False`.

    Args:
        learner_mean_logprob: `[N]` m_k,θ(y), the learner's current mean token log-prob of each
            sequence in the learner's tokenization (:func:`sequence_mean_logprob`), with gradient.
        behaviour_mean_logprob: `[N]` m_k,old(y) for self rows, the source's m_j,old(y) for cross rows.
        advantages: `[N]` A_k(y) (from :func:`hacpo_advantages`).
        is_cross: `[N]` bool, True for rows sampled by another agent.
        omega: `[N]` ω(source→learner) of each row; ignored on self rows (use 1 there).
        update_index: `u`, 0-based optimizer update index inside the current step.
        alpha: α ≥ 0, exponent of the detached importance weight on cross rows (spec default 1).
        delta: δ ∈ [0, 1], initial width of the cross clip range (spec default 0.2).
        delta_step: δ_step ≥ 0, per-update shrink of the range (spec default 0.025).
        eps_low, eps_high: GSPO clip radii for self rows (spec 3e-4, 4e-4).
        max_abs_log_ratio: c > 0, clamp on |log s| (spec 10).
        num_sequences: global normaliser D (e.g. sequences in the optimizer mini-batch over all
            micro-batches and DP ranks); None → D = N (then N must be > 0).
        cross_clip: False is the "no cross clip" ablation: `s_c = s` (no [lo_u, 1] clip, so cross rows
            always pass gradient `−s^(1+α)·ω·A / D`); the log-ratio clamp still applies.
        rows_out: when given, receives per-row `[N]` detached tensors: `ratio` (s, log-clamped, before any
            clip), `in_window` (bool: neither a clip nor the log clamp stops the row's gradient — for cross rows
            lo_u ≤ s ≤ 1, for self rows the PPO min does not take the clipped term) and `gradient` (bool:
            `in_window` and A ≠ 0, and ω ≠ 0 on cross rows: the row's gradient is not zero).

    Returns:
        `(loss, metrics)`; metrics (0-d detached tensors, NaN over an empty set):
        `loss`; `num_rows`, `num_self`, `num_cross`; `self_ratio_{mean,min,max}` and
        `cross_ratio_{mean,min,max}` (s before clipping); `self_clip_low_frac` (s < 1 − eps_low),
        `self_clip_high_frac` (s > 1 + eps_high), `self_clip_active_frac` (the PPO min takes the clipped
        term, strictly smaller: zero gradient) over self rows; `cross_clip_low_frac` (s < lo_u),
        `cross_clip_high_frac` (s > 1), `cross_zero_grad_frac` (the clip or the log-ratio clamp stops the
        gradient; rows with A = 0 are not counted) over cross rows; `cross_weight_mean` (mean of
        sg(s_c)^α·ω over cross rows); `log_ratio_clamped_frac` (|raw log s| > c, all rows);
        `adv_abs_mean` (mean |A| over all rows); `cross_clip_lower` (lo_u).
    """
    require_floating("learner_mean_logprob", learner_mean_logprob)
    require_shape("learner_mean_logprob", learner_mean_logprob, (None,), "[N]")
    num_rows = learner_mean_logprob.shape[0]
    for name, value in (
        ("behaviour_mean_logprob", behaviour_mean_logprob),
        ("advantages", advantages),
        ("is_cross", is_cross),
        ("omega", omega),
    ):
        _check_vector(name, value, num_rows)
    require_bool("is_cross", is_cross)
    alpha = require_finite_number("alpha", alpha, low=0.0)
    eps_low = require_finite_number("eps_low", eps_low, low=0.0, high=1.0)
    eps_high = require_finite_number("eps_high", eps_high, low=0.0)
    denominator = require_positive_count("num_sequences", num_sequences)
    if denominator is None:
        if num_rows == 0:
            raise ValueError("hacpo_loss got no rows; pass num_sequences to allow an empty micro-batch")
        denominator = float(num_rows)
    lower = cross_clip_lower(update_index, delta, delta_step)

    log_ratio = sequence_log_ratio(learner_mean_logprob, behaviour_mean_logprob, max_abs_log_ratio)  # [N]
    dtype, device = log_ratio.dtype, log_ratio.device
    ratio = log_ratio.exp()  # [N]
    is_cross = is_cross.to(device)
    advantages = advantages.detach().to(dtype=dtype, device=device)
    # Self rows get ω = 1 so that whatever the caller put there cannot reach the gradient (NaN·0 = NaN).
    omega = torch.where(is_cross, omega.detach().to(dtype=dtype, device=device), torch.ones_like(ratio))

    self_clipped = ratio.clamp(min=1.0 - eps_low, max=1.0 + eps_high)
    self_objective = torch.minimum(ratio * advantages, self_clipped * advantages)
    cross_clipped = ratio.clamp(min=lower, max=1.0) if cross_clip else ratio
    cross_weight = cross_clipped.detach().pow(alpha) * omega  # sg(s_c)^α · ω
    cross_objective = cross_clipped * cross_weight * advantages
    objective = torch.where(is_cross, cross_objective, self_objective)  # [N]
    loss = -objective.sum() / denominator

    with torch.no_grad():
        is_self = ~is_cross
        raw_log_ratio = learner_mean_logprob.detach().to(dtype) - behaviour_mean_logprob.detach().to(
            dtype=dtype, device=device
        )
        log_clamped = raw_log_ratio.abs() > max_abs_log_ratio
        all_rows = torch.ones_like(is_cross)
        cross_low, cross_high = (ratio < lower, ratio > 1.0) if cross_clip else (ratio < 0, ratio < 0)
        self_mean, self_min, self_max = _masked_stats(ratio, is_self)
        cross_mean, cross_min, cross_max = _masked_stats(ratio, is_cross)
        metrics = {
            "loss": loss.detach(),
            "num_rows": torch.tensor(float(num_rows), dtype=dtype, device=device),
            "num_self": is_self.sum().to(dtype),
            "num_cross": is_cross.sum().to(dtype),
            "self_ratio_mean": self_mean,
            "self_ratio_min": self_min,
            "self_ratio_max": self_max,
            "cross_ratio_mean": cross_mean,
            "cross_ratio_min": cross_min,
            "cross_ratio_max": cross_max,
            "self_clip_low_frac": _fraction(ratio < 1.0 - eps_low, is_self, dtype),
            "self_clip_high_frac": _fraction(ratio > 1.0 + eps_high, is_self, dtype),
            "self_clip_active_frac": _fraction(
                self_clipped * advantages < ratio * advantages, is_self, dtype
            ),
            "cross_clip_low_frac": _fraction(cross_low, is_cross, dtype),
            "cross_clip_high_frac": _fraction(cross_high, is_cross, dtype),
            "cross_zero_grad_frac": _fraction(cross_low | cross_high | log_clamped, is_cross, dtype),
            "cross_weight_mean": _masked_stats(cross_weight, is_cross)[0],
            "log_ratio_clamped_frac": _fraction(log_clamped, all_rows, dtype),
            "adv_abs_mean": _masked_stats(advantages.abs(), all_rows)[0],
            "cross_clip_lower": torch.tensor(lower, dtype=dtype, device=device),
        }
        if rows_out is not None:
            cross_live = ~(cross_low | cross_high)
            self_live = ~(self_clipped * advantages < ratio * advantages)
            in_window = torch.where(is_cross, cross_live, self_live) & ~log_clamped
            rows_out["ratio"] = ratio.detach()
            rows_out["in_window"] = in_window
            rows_out["gradient"] = in_window & (advantages != 0) & (omega != 0)
    return loss, metrics


def gspo_loss(
    learner_mean_logprob: torch.Tensor,
    behaviour_mean_logprob: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    max_abs_log_ratio: float = 10.0,
    num_sequences: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO: :func:`hacpo_loss` with every row a self row (shapes `[N]`, same metrics, cross ones NaN).

    loss = −Σ_rows min(s·A, clip(s, 1 − eps_low, 1 + eps_high)·A) / D
    s    = exp(clamp(m − sg(m_old), −c, c))
    """
    require_shape("learner_mean_logprob", learner_mean_logprob, (None,), "[N]")
    num_rows, device = learner_mean_logprob.shape[0], learner_mean_logprob.device
    return hacpo_loss(
        learner_mean_logprob,
        behaviour_mean_logprob,
        advantages,
        torch.zeros(num_rows, dtype=torch.bool, device=device),
        torch.ones(num_rows, dtype=compute_dtype(learner_mean_logprob), device=device),
        0,
        alpha=0.0,
        delta=0.0,
        delta_step=0.0,
        eps_low=eps_low,
        eps_high=eps_high,
        max_abs_log_ratio=max_abs_log_ratio,
        num_sequences=num_sequences,
    )


def _check_tokens(
    token_logprobs: torch.Tensor, other: torch.Tensor, other_name: str, mask: torch.Tensor
) -> None:
    require_shape("token_logprobs", token_logprobs, (None, None), "[N, T]")
    require_floating("token_logprobs", token_logprobs)
    require_shape(other_name, other, tuple(token_logprobs.shape), "[N, T] (same as token_logprobs)")
    require_shape("mask", mask, tuple(token_logprobs.shape), "[N, T] (same as token_logprobs)")
    require_bool("mask", mask)


def low_var_kl(
    token_logprobs: torch.Tensor, ref_token_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Per-sequence token-mean of the k3 ("low-variance") estimator of KL(π ‖ π_ref), as verl computes it.

        d = clamp(ref − logp, −20, 20);   kl_t = clamp(exp(d) − d − 1, −10, 10);   kl[n] = mean_t∈mask kl_t

    `ref_token_logprobs` is detached; gradient flows into `token_logprobs` where neither clamp is
    active. A row with an empty mask gives 0.

    Args:
        token_logprobs: `[N, T]` current policy log-probs.
        ref_token_logprobs: `[N, T]` reference policy log-probs.
        mask: `[N, T]` bool.

    Returns:
        `[N]` per-sequence KL estimates (≥ 0 up to the clamps).
    """
    _check_tokens(token_logprobs, ref_token_logprobs, "ref_token_logprobs", mask)
    dtype = compute_dtype(token_logprobs)
    zeros = torch.zeros((), dtype=dtype, device=token_logprobs.device)
    logp = torch.where(mask, token_logprobs.to(dtype), zeros)  # padding → 0 before exp, so no NaN/inf leaks
    ref = torch.where(mask, ref_token_logprobs.detach().to(dtype=dtype, device=logp.device), zeros)
    log_ratio = (ref - logp).clamp(min=-KL_LOG_RATIO_LIMIT, max=KL_LOG_RATIO_LIMIT)  # [N, T]
    token_kl = (log_ratio.exp() - log_ratio - 1.0).clamp(min=-KL_VALUE_LIMIT, max=KL_VALUE_LIMIT)  # [N, T]
    sums, counts = masked_token_sum(token_kl, mask)
    return sums / counts.clamp(min=1.0)


def grpo_token_loss(
    token_logprobs: torch.Tensor,
    old_token_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    agg: str = "token-mean",
    *,
    normaliser: float | None = None,
    max_abs_log_ratio: float = 20.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-level PPO-clip loss of the GRPO baseline (no dual clip).

        ρ_t = exp(clamp(logp_t − sg(logp_old,t), ±c));   ℓ_t = −min(ρ_t·A, clip(ρ_t, 1 − eps_low, 1 + eps_high)·A)

    Aggregation over masked tokens (`D` = `normaliser` when given, else the local count named below):
      - "token-mean":          Σ_n Σ_t ℓ_t / D,   D = number of masked tokens (global token count)
      - "seq-mean-token-mean": Σ_n (Σ_t ℓ_t / L_n) / D,   D = N (global number of sequences)
      - "seq-mean-token-sum":  Σ_n Σ_t ℓ_t / D,   D = N (global number of sequences)
    A row with an empty mask contributes 0 (its `L_n` is treated as 1) but counts in `N`.

    Args:
        token_logprobs: `[N, T]` current log-probs (with gradient).
        old_token_logprobs: `[N, T]` log-probs at sampling time (detached).
        advantages: `[N]` (broadcast over tokens) or `[N, T]`; detached.
        mask: `[N, T]` bool response mask.
        eps_low, eps_high: clip radii (spec: 0.2 / 0.28).
        agg: one of :data:`GRPO_AGGREGATIONS`.
        normaliser: global `D` (see above); None → local count.
        max_abs_log_ratio: c, clamp on the per-token log-ratio (verl uses 20).

    Returns:
        `(loss, metrics)`; metrics over masked tokens (0-d detached, NaN when there are none): `loss`,
        `num_rows`, `num_tokens`, `ratio_{mean,min,max}`, `clip_low_frac` (ρ < 1 − eps_low),
        `clip_high_frac` (ρ > 1 + eps_high), `clip_active_frac` (the min takes the clipped term),
        `approx_kl` (mean of logp_old − logp), `adv_abs_mean`.
    """
    _check_tokens(token_logprobs, old_token_logprobs, "old_token_logprobs", mask)
    if agg not in GRPO_AGGREGATIONS:
        raise ValueError(f"unknown agg {agg!r}; valid values: {list(GRPO_AGGREGATIONS)}")
    num_rows = token_logprobs.shape[0]
    if advantages.ndim == 1:
        require_shape("advantages", advantages, (num_rows,), "[N]")
    else:
        require_shape("advantages", advantages, tuple(token_logprobs.shape), "[N, T] or [N]")
    eps_low = require_finite_number("eps_low", eps_low, low=0.0, high=1.0)
    eps_high = require_finite_number("eps_high", eps_high, low=0.0)
    limit = require_finite_number("max_abs_log_ratio", max_abs_log_ratio, low=0.0)
    if limit == 0.0:
        raise ValueError("max_abs_log_ratio must be > 0")
    normaliser = require_positive_count("normaliser", normaliser)

    dtype, device = compute_dtype(token_logprobs), token_logprobs.device
    zeros = torch.zeros((), dtype=dtype, device=device)
    logp = torch.where(mask, token_logprobs.to(dtype), zeros)  # [N, T]; padding → 0 so it cannot give NaN
    old = torch.where(mask, old_token_logprobs.detach().to(dtype=dtype, device=device), zeros)
    adv = advantages.detach().to(dtype=dtype, device=device)
    adv = (adv[:, None] if adv.ndim == 1 else adv).expand_as(logp)  # [N, T]
    raw_log_ratio = logp - old
    ratio = raw_log_ratio.clamp(min=-limit, max=limit).exp()  # [N, T]
    clipped = ratio.clamp(min=1.0 - eps_low, max=1.0 + eps_high)
    token_loss = -torch.minimum(ratio * adv, clipped * adv)  # [N, T]
    sums, counts = masked_token_sum(token_loss, mask)  # [N], [N]

    if agg == "token-mean":
        loss = sums.sum() / (normaliser if normaliser is not None else counts.sum().clamp(min=1.0))
    else:
        per_sequence = sums / counts.clamp(min=1.0) if agg == "seq-mean-token-mean" else sums
        denominator = normaliser if normaliser is not None else float(num_rows)
        if denominator == 0:
            raise ValueError("grpo_token_loss got no rows; pass normaliser to allow an empty micro-batch")
        loss = per_sequence.sum() / denominator

    with torch.no_grad():
        ratio_mean, ratio_min, ratio_max = _masked_stats(ratio, mask)
        metrics = {
            "loss": loss.detach(),
            "num_rows": torch.tensor(float(num_rows), dtype=dtype, device=device),
            "num_tokens": counts.sum(),
            "ratio_mean": ratio_mean,
            "ratio_min": ratio_min,
            "ratio_max": ratio_max,
            "clip_low_frac": _fraction(ratio < 1.0 - eps_low, mask, dtype),
            "clip_high_frac": _fraction(ratio > 1.0 + eps_high, mask, dtype),
            "clip_active_frac": _fraction(clipped * adv < ratio * adv, mask, dtype),
            "approx_kl": _masked_stats(-raw_log_ratio, mask)[0],
            "adv_abs_mean": _masked_stats(adv.abs(), mask)[0],
        }
    return loss, metrics

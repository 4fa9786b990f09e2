"""The loss of one micro-batch, given its token log-probs: the bridge from `nemo_hacpo.algo` to Megatron.

Megatron's schedule calls the loss once per micro-batch and *sums* the results (the trainer runs it with
`calculate_per_token_loss=True` and sums gradients over data-parallel replicas), so each micro-batch
returns its exact share of the mini-batch loss: every sum is divided by the **global** normaliser `D` of
the optimizer mini-batch, over all its micro-batches and data-parallel replicas.

    hacpo / naive / gspo / gspo_x2:  L_pol = hacpo_loss(m_θ, m_old, A, is_cross, ω, u; num_sequences=D_seq)
                                     (gspo / gspo_x2 / naive rows simply carry is_cross = False)
    grpo:                            L_pol = grpo_token_loss(logp, logp_old, A, mask; agg, normaliser=D)
                                     D = D_tok (response tokens of the mini-batch) for token-mean, else D_seq
    sft (the warm start, not a config algorithm):  L_pol = Σ_rows −m_θ(row) / D_seq   (sequence-mean token NLL)
    KL (β > 0):                      L_kl  = β · Σ_{self rows} low_var_kl_n / D_seq      (cross rows: no KL)
    loss = L_pol + L_kl

The KL term is normalised by the mini-batch's sequence count for every algorithm (a per-sequence token mean,
summed over self rows, divided by all sequences — verl's seq-mean-token-mean over self rows with cross rows
counted as zero), so β means the same thing whatever the policy loss's aggregation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from nemo_hacpo.algo import grpo_token_loss, hacpo_loss, low_var_kl, sequence_mean_logprob

if TYPE_CHECKING:
    from nemo_hacpo.config import AlgoConfig
    from nemo_hacpo.training.batching import MicroBatch

SEQUENCE_LEVEL_ALGORITHMS = ("hacpo", "naive", "gspo", "gspo_x2")
"""Algorithms whose policy loss is `hacpo_loss` on per-sequence mean log-probs."""

SFT = "sft"
"""The supervised warm start's objective (`AgentRank.sft`): the sequence-mean token NLL of the rows, no ratio.
Not an `algo.name` a config can choose."""


def uses_token_normaliser(algo: AlgoConfig) -> bool:
    """True when the policy loss divides by the mini-batch's response-token count (grpo, token-mean)."""
    return algo.name == "grpo" and algo.grpo_loss_agg == "token-mean"


def policy_normaliser(algo: AlgoConfig, num_sequences: int, num_tokens: int) -> float:
    """Global `D` of the policy loss: sequences in the mini-batch, or its response tokens (grpo token-mean)."""
    denominator = num_tokens if uses_token_normaliser(algo) else num_sequences
    if denominator <= 0:
        raise ValueError(f"the mini-batch has no {'response tokens' if uses_token_normaliser(algo) else 'rows'}")
    return float(denominator)


def micro_batch_loss(
    token_logprobs: torch.Tensor,
    batch: MicroBatch,
    algo: AlgoConfig,
    update_index: int,
    *,
    normaliser: float,
    num_sequences: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """This micro-batch's share of the mini-batch loss and its metrics (0-d detached tensors).

    Args:
        token_logprobs: `[B, S]` log π_θ(label) with gradient (shifted layout, see `batching`).
        batch: the micro-batch (`loss_mask`, per-row advantages / is_cross / ω / behaviour log-probs, and
            `old_token_logprobs` for grpo, `ref_token_logprobs` when `algo.kl_coef > 0`).
        algo: algorithm name and hyper-parameters.
        update_index: `u`, the optimizer update inside the step (stepwise cross clip).
        normaliser: global `D` of the policy loss (`policy_normaliser`).
        num_sequences: global `D_seq` (rows in the mini-batch), the KL term's normaliser.

    Returns:
        `(loss, metrics)`: `loss` = L_pol + L_kl; metrics are the policy loss's own (its `loss` renamed
        `policy_loss`) plus `loss`, and with β > 0 `kl_loss` and `kl_mean` (mean k3 KL over self rows).
    """
    mask = batch.loss_mask
    if algo.name in SEQUENCE_LEVEL_ALGORITHMS:
        learner_mean_logprob = sequence_mean_logprob(token_logprobs, mask)  # [B]
        policy_loss, metrics = hacpo_loss(
            learner_mean_logprob, batch.behaviour_mean_logprob, batch.advantages, batch.is_cross, batch.omega,
            update_index, alpha=algo.alpha, delta=algo.delta, delta_step=algo.delta_step, eps_low=algo.eps_low,
            eps_high=algo.eps_high, max_abs_log_ratio=algo.max_abs_log_ratio, num_sequences=normaliser,
            cross_clip=algo.ablation.cross_clip)
    elif algo.name == "grpo":
        if batch.old_token_logprobs is None:
            raise ValueError("grpo needs the old token log-probs of every row (batch.old_token_logprobs)")
        policy_loss, metrics = grpo_token_loss(
            token_logprobs, batch.old_token_logprobs, batch.advantages, mask, algo.grpo_eps_low,
            algo.grpo_eps_high, algo.grpo_loss_agg, normaliser=normaliser)
    elif algo.name == SFT:
        policy_loss = -sequence_mean_logprob(token_logprobs, mask).sum() / normaliser
        metrics = {"loss": policy_loss.detach(), "num_rows": torch.tensor(float(mask.shape[0]), device=mask.device)}
    else:
        raise ValueError(f"unknown algorithm {algo.name!r}")
    metrics = {("policy_loss" if name == "loss" else name): value for name, value in metrics.items()}

    loss = policy_loss
    if algo.kl_coef > 0:
        if batch.ref_token_logprobs is None:
            raise ValueError("kl_coef > 0 needs the reference model's token log-probs (batch.ref_token_logprobs)")
        sequence_kl = low_var_kl(token_logprobs, batch.ref_token_logprobs, mask)  # [B]
        is_self = ~batch.is_cross.to(sequence_kl.device)
        self_kl = torch.where(is_self, sequence_kl, torch.zeros_like(sequence_kl))
        kl_loss = algo.kl_coef * self_kl.sum() / num_sequences
        loss = loss + kl_loss
        num_self = is_self.sum().to(sequence_kl.dtype)
        metrics["kl_loss"] = kl_loss.detach()
        metrics["kl_mean"] = self_kl.detach().sum() / num_self  # NaN when the micro-batch has no self rows
        metrics.setdefault("num_self", num_self)
    metrics["loss"] = loss.detach()
    return loss, metrics

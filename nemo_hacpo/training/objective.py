"""What the trainer optimises, and the loss of one micro-batch: the bridge from `nemo_hacpo.algo` to Megatron.

`Objective` is everything a train call needs to know about the algorithm — which loss (`LOSSES`), how many
updates, its hyper-parameters — built once from the config (`Objective.of(algo)`) or for the warm start
(`Objective.sft()`). The trainer never reads an algorithm name.

Megatron's schedule calls the loss once per micro-batch and *sums* the results (the trainer runs it with
`calculate_per_token_loss=True` and sums gradients over data-parallel replicas), so each micro-batch
returns its exact share of the mini-batch loss: every sum is divided by the **global** normaliser `D` of
the optimizer mini-batch, over all its micro-batches and data-parallel replicas.

    sequence (hacpo, naive, gspo, gspo_x2):  L_pol = hacpo_loss(m_θ, m_old, A, cross_objective, ω, u; D_seq)
                                             (isolated and naive rows carry cross_objective = False)
    token (grpo):                            L_pol = grpo_token_loss(logp, logp_old, A, mask; agg, D)
                                             D = D_tok (response tokens of the mini-batch) for token-mean, else D_seq
    nll (the warm start):                    L_pol = Σ_rows −m_θ(row) / D_seq       (sequence-mean token NLL)
    KL (β > 0):                              L_kl  = β · Σ_{own rows} low_var_kl_n / D_seq    (other rows: none)
    loss = L_pol + L_kl

The KL term is normalised by the mini-batch's sequence count whatever the loss (a per-sequence token mean,
summed over the learner's own rows, divided by all sequences — verl's seq-mean-token-mean over own rows with
other rows counted as zero), so β means the same thing for every loss (algorithm.md §6).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from nemo_hacpo.algo import grpo_token_loss, hacpo_loss, low_var_kl, sequence_mean_logprob
from nemo_hacpo.algo.registry import LossKind, algorithm

if TYPE_CHECKING:
    from nemo_hacpo.config import AlgoConfig
    from nemo_hacpo.training.batching import MicroBatch


@dataclass(frozen=True)
class Objective:
    """The loss and hyper-parameters of one train call (see the module docstring); built by `of` or `sft`."""

    loss: LossKind
    """Key of `LOSSES`."""
    updates_per_step: int = 1
    """M: optimizer updates over the rows, in order (algorithm.md §6)."""
    kl_coef: float = 0.0
    """β of the KL term on own rows (0: none)."""
    alpha: float = 1.0
    """sequence: exponential IS power on cross rows (algorithm.md §5)."""
    delta: float = 0.2
    """sequence: the cross clip's lower bound starts at 1 − δ."""
    delta_step: float = 0.025
    """sequence: rise of the lower bound per update."""
    eps_low: float = 3e-4
    """sequence: GSPO clip ε_low on own rows."""
    eps_high: float = 4e-4
    """sequence: GSPO clip ε_high on own rows."""
    max_abs_log_ratio: float = 10.0
    """sequence: clamp of |log s|."""
    cross_clip: bool = True
    """sequence: clip cross rows to [lo_u, 1] (False: the "no cross clip" ablation)."""
    learner_old_logprob: bool = False
    """sequence: other agents' rows take the learner's own m_old, computed at the weights the step starts from
    (`Algorithm.cross_old_logprob == "learner"`), instead of the source's that the broker put in the rows."""
    token_eps_low: float = 0.2
    """token: PPO clip ε_low."""
    token_eps_high: float = 0.28
    """token: PPO clip ε_high."""
    token_agg: str = "token-mean"
    """token: aggregation (`algo.GRPO_AGGREGATIONS`)."""

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; choose from {sorted(LOSSES)}")
        if self.updates_per_step < 1:
            raise ValueError(f"updates_per_step must be ≥ 1, got {self.updates_per_step}")

    @classmethod
    def of(cls, algo: AlgoConfig) -> Objective:
        """The objective of a configured RL algorithm (its registry entry says which loss)."""
        return cls(loss=algorithm(algo.name).loss, updates_per_step=algo.updates_per_step, kl_coef=algo.kl_coef,
                   alpha=algo.alpha, delta=algo.delta, delta_step=algo.delta_step, eps_low=algo.eps_low,
                   eps_high=algo.eps_high, max_abs_log_ratio=algo.max_abs_log_ratio,
                   cross_clip=algo.ablation.cross_clip,
                   learner_old_logprob=algorithm(algo.name).cross_old_logprob == "learner",
                   token_eps_low=algo.grpo_eps_low,
                   token_eps_high=algo.grpo_eps_high, token_agg=algo.grpo_loss_agg)

    @classmethod
    def sft(cls) -> Objective:
        """Supervised fine-tuning (the warm start): one update per call on the sequence-mean token NLL, no KL."""
        return cls(loss="nll")

    @property
    def token_level(self) -> bool:
        """Token-level PPO: its ratios need the rows' old token log-probs, its statistics are over tokens."""
        return self.loss == "token"

    @property
    def uses_token_normaliser(self) -> bool:
        """The policy loss divides by the mini-batch's response-token count (token loss with token-mean)."""
        return self.loss == "token" and self.token_agg == "token-mean"

    def normaliser(self, num_sequences: int, num_tokens: int) -> float:
        """Global `D` of the policy loss: sequences in the mini-batch, or its response tokens (token-mean)."""
        denominator = num_tokens if self.uses_token_normaliser else num_sequences
        if denominator <= 0:
            raise ValueError(f"the mini-batch has no {'response tokens' if self.uses_token_normaliser else 'rows'}")
        return float(denominator)


LossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
"""`(token_logprobs, batch, objective, update_index, normaliser, rows_out=None) -> (loss, metrics)`; a sequence-level
loss fills `rows_out` with its per-row outcome (`hacpo_loss`), the others leave it empty."""


def sequence_loss(token_logprobs: torch.Tensor, batch: MicroBatch, objective: Objective, update_index: int,
                  normaliser: float, rows_out: dict[str, torch.Tensor] | None = None
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`hacpo_loss` on per-sequence mean log-probs (HACPO; GSPO and naive are rows without the cross objective)."""
    learner_mean_logprob = sequence_mean_logprob(token_logprobs, batch.loss_mask)  # [B]
    if batch.ratio_length_scale is not None:  # single-exponent convention: Σ log π_k / L_source on cross rows
        learner_mean_logprob = learner_mean_logprob * batch.ratio_length_scale.to(learner_mean_logprob)
    loss, metrics = hacpo_loss(
        learner_mean_logprob, batch.old_mean_logprob, batch.advantages, batch.cross_objective, batch.omega,
        update_index, alpha=objective.alpha, delta=objective.delta, delta_step=objective.delta_step,
        eps_low=objective.eps_low, eps_high=objective.eps_high, max_abs_log_ratio=objective.max_abs_log_ratio,
        num_sequences=normaliser, cross_clip=objective.cross_clip, rows_out=rows_out)
    if batch.is_own is not None:
        # the learner's own rows, whatever objective they get (naive trains the others' rows with the own one,
        # against the source's m_old): at the first update their ratio is 1 when m_old is right
        with torch.no_grad():
            is_own = batch.is_own.to(learner_mean_logprob.device)
            log_ratio = (learner_mean_logprob.detach() - batch.old_mean_logprob.to(learner_mean_logprob))[is_own]
            own = log_ratio.clamp(-objective.max_abs_log_ratio, objective.max_abs_log_ratio).exp()
            metrics["own_ratio_mean"] = own.mean() if own.numel() else torch.tensor(math.nan, dtype=own.dtype)
    return loss, metrics


def token_loss(token_logprobs: torch.Tensor, batch: MicroBatch, objective: Objective, update_index: int,
               normaliser: float, rows_out: dict[str, torch.Tensor] | None = None
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-level PPO clip (`grpo_token_loss`) against the rows' old token log-probs."""
    if batch.old_token_logprobs is None:
        raise ValueError("the token-level loss needs the old token log-probs of every row (old_token_logprobs)")
    return grpo_token_loss(token_logprobs, batch.old_token_logprobs, batch.advantages, batch.loss_mask,
                           objective.token_eps_low, objective.token_eps_high, objective.token_agg,
                           normaliser=normaliser)


def nll_loss(token_logprobs: torch.Tensor, batch: MicroBatch, objective: Objective, update_index: int,
             normaliser: float, rows_out: dict[str, torch.Tensor] | None = None
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Supervised fine-tuning: Σ_rows −m_θ(row) / D (sequence-mean of the token-mean NLL)."""
    loss = -sequence_mean_logprob(token_logprobs, batch.loss_mask).sum() / normaliser
    return loss, {"loss": loss.detach(), "num_rows": torch.tensor(float(batch.loss_mask.shape[0]),
                                                                   device=batch.loss_mask.device)}


LOSSES: dict[LossKind, LossFn] = {"sequence": sequence_loss, "token": token_loss, "nll": nll_loss}
"""The policy loss of each `Objective.loss`."""


def micro_batch_loss(
    token_logprobs: torch.Tensor,
    batch: MicroBatch,
    objective: Objective,
    update_index: int,
    *,
    normaliser: float,
    num_sequences: float,
    rows_out: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """This micro-batch's share of the mini-batch loss and its metrics (0-d detached tensors).

    Args:
        token_logprobs: `[B, S]` log π_θ(label) with gradient (shifted layout, see `batching`).
        batch: the micro-batch (`loss_mask`, per-row advantages / cross_objective / ω / m_old / is_own, and
            `old_token_logprobs` for the token loss, `ref_token_logprobs` when `objective.kl_coef > 0`).
        objective: which loss and its hyper-parameters.
        update_index: `u`, the optimizer update inside the step (stepwise cross clip).
        normaliser: global `D` of the policy loss (`Objective.normaliser`).
        num_sequences: global `D_seq` (rows in the mini-batch), the KL term's normaliser.
        rows_out: receives the sequence loss's per-row outcome (`hacpo_loss`'s `rows_out`: ratio, in_window,
            gradient of each row of the micro-batch); left empty by the token and nll losses.

    Returns:
        `(loss, metrics)`: `loss` = L_pol + L_kl; metrics are the policy loss's own (its `loss` renamed
        `policy_loss`) plus `loss`, and with β > 0 `kl_loss` and `kl_mean` (mean k3 KL over own rows).
    """
    policy_loss, metrics = LOSSES[objective.loss](token_logprobs, batch, objective, update_index, normaliser,
                                                  rows_out=rows_out)
    metrics = {("policy_loss" if name == "loss" else name): value for name, value in metrics.items()}

    loss = policy_loss
    if batch.is_own is not None:
        metrics["num_own"] = batch.is_own.sum().to(torch.float64)
    if objective.kl_coef > 0:
        if batch.ref_token_logprobs is None:
            raise ValueError("kl_coef > 0 needs the reference model's token log-probs (batch.ref_token_logprobs)")
        sequence_kl = low_var_kl(token_logprobs, batch.ref_token_logprobs, batch.loss_mask)  # [B]
        is_own = batch.is_own.to(sequence_kl.device)
        own_kl = torch.where(is_own, sequence_kl, torch.zeros_like(sequence_kl))
        kl_loss = objective.kl_coef * own_kl.sum() / num_sequences
        loss = loss + kl_loss
        num_own = is_own.sum().to(sequence_kl.dtype)
        metrics["kl_loss"] = kl_loss.detach()
        metrics["kl_mean"] = own_kl.detach().sum() / num_own  # NaN when the micro-batch has no own rows
    metrics["loss"] = loss.detach()
    return loss, metrics

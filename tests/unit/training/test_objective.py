"""The trainer's `Objective` and one micro-batch's loss share: hand-computed HACPO + KL numbers, the NLL of the
warm start, and split invariance (the shares of any micro-batch split sum to the whole mini-batch's loss and
gradient)."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_hacpo.algo.registry import ALGORITHMS
from nemo_hacpo.config import AblationConfig, AlgoConfig
from nemo_hacpo.training.batching import MicroBatch
from nemo_hacpo.training.objective import LOSSES, Objective, micro_batch_loss

F64 = torch.float64


def _batch(mask, advantages, cross_objective, omega, old_mean, old=None, ref=None, is_own=None) -> MicroBatch:
    mask = torch.tensor(mask, dtype=torch.bool)
    zeros = torch.zeros(mask.shape, dtype=torch.long)
    cross = torch.tensor(cross_objective)
    return MicroBatch(input_ids=zeros, position_ids=zeros, labels=zeros, loss_mask=mask,
                      row_index=torch.arange(mask.shape[0]), advantages=torch.tensor(advantages, dtype=F64),
                      cross_objective=cross, is_own=~cross if is_own is None else torch.tensor(is_own),
                      omega=torch.tensor(omega, dtype=F64), old_mean_logprob=torch.tensor(old_mean, dtype=F64),
                      old_token_logprobs=old, ref_token_logprobs=ref)


def _objective(**algo) -> Objective:
    return Objective.of(AlgoConfig(**algo))


def test_objective_of_each_algorithm_follows_its_registry_entry() -> None:
    assert {name: Objective.of(AlgoConfig(name=name)).loss for name in ALGORITHMS} == {
        "hacpo": "sequence", "naive": "sequence", "naive_onpolicy": "sequence", "gspo": "sequence",
        "gspo_x2": "sequence", "grpo": "token"}
    # only naive_onpolicy gives other agents' rows the learner's own m_old (the trainer computes it)
    assert {name for name in ALGORITHMS if Objective.of(AlgoConfig(name=name)).learner_old_logprob} == {
        "naive_onpolicy"}
    hacpo = Objective.of(AlgoConfig(name="hacpo", alpha=3.0, delta=0.1, updates_per_step=2, kl_coef=0.01,
                                    ablation=AblationConfig(cross_clip=False)))
    assert (hacpo.alpha, hacpo.delta, hacpo.updates_per_step, hacpo.kl_coef, hacpo.cross_clip) == (3.0, 0.1, 2, 0.01,
                                                                                                   False)
    assert not hacpo.token_level and Objective.of(AlgoConfig(name="grpo")).token_level
    sft = Objective.sft()
    assert (sft.loss, sft.updates_per_step, sft.kl_coef) == ("nll", 1, 0.0) and set(LOSSES) == {"sequence", "token",
                                                                                                  "nll"}
    with pytest.raises(ValueError, match="unknown loss"):
        Objective(loss="policy")  # type: ignore[arg-type]


def test_normaliser_counts_sequences_or_tokens() -> None:
    assert _objective(name="hacpo").normaliser(512, 90000) == 512.0
    assert _objective(name="gspo").normaliser(512, 90000) == 512.0
    grpo_tokens = _objective(name="grpo", grpo_loss_agg="token-mean")
    assert grpo_tokens.uses_token_normaliser and grpo_tokens.normaliser(512, 90000) == 90000.0
    assert _objective(name="grpo", grpo_loss_agg="seq-mean-token-mean").normaliser(512, 90000) == 512.0
    with pytest.raises(ValueError, match="no rows"):
        _objective(name="hacpo").normaliser(0, 10)


def test_hacpo_share_with_kl_hand_computed() -> None:
    # row 0 self: logp [−1, −3] → m = −2 = m_old → s = 1 → obj = A = 0.5
    # row 1 cross (ω = 2): logp [−0.5] → m = −0.5, m_old = −0.4 → s = e^−0.1 = 0.904837 ∈ [lo_0 = 0.8, 1]
    #   obj = s·sg(s)^1·ω·A = 2·e^−0.2 = 1.637462
    # policy share = −(0.5 + 1.637462)/4 (D = 4 sequences in the whole mini-batch) = −0.534365
    # KL (β = 0.1, self rows only): ref row 0 [−1, −2] → d = [0, 1] → k3 = [0, e − 2] → mean 0.359141
    #   share = 0.1·0.359141/4 = 0.008979
    junk = 99.0  # a padded position: must not leak
    token_logprobs = torch.tensor([[-1.0, -3.0, junk], [-0.5, junk, junk]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.0, -2.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    batch = _batch([[1, 1, 0], [1, 0, 0]], [0.5, 1.0], [False, True], [1.0, 2.0], [-2.0, -0.4], ref=ref)
    loss, metrics = micro_batch_loss(token_logprobs, batch, _objective(kl_coef=0.1), 0, normaliser=4.0,
                                     num_sequences=4.0)
    policy = -(0.5 + 2 * math.exp(-0.2)) / 4
    kl = 0.1 * (math.e - 2) / 2 / 4
    assert metrics["policy_loss"].item() == pytest.approx(policy, rel=1e-12)
    assert metrics["kl_loss"].item() == pytest.approx(kl, rel=1e-12)
    assert metrics["kl_mean"].item() == pytest.approx((math.e - 2) / 2, rel=1e-12) and metrics["num_own"].item() == 1
    assert loss.item() == pytest.approx(policy + kl, rel=1e-12) == metrics["loss"].item()
    assert metrics["num_cross"].item() == 1 and metrics["cross_clip_lower"].item() == pytest.approx(0.8)
    loss.backward()
    assert token_logprobs.grad[:, 1:].tolist()[1] == [0.0, 0.0]  # padding gets no gradient
    assert token_logprobs.grad[0, 2].item() == 0.0


def _random_case(num_rows: int, seq_len: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, seq_len + 1, (num_rows,), generator=generator)
    mask = torch.arange(seq_len)[None, :] < lengths[:, None]  # [N, T]
    token_logprobs = -torch.rand(num_rows, seq_len, generator=generator, dtype=torch.float64) * 3
    is_cross = torch.arange(num_rows) >= num_rows // 2
    behaviour = (torch.where(mask, token_logprobs, 0.0).sum(1) / lengths) + torch.where(
        is_cross, torch.randn(num_rows, generator=generator, dtype=torch.float64) * 0.2, 0.0)
    fields = dict(
        advantages=torch.randn(num_rows, generator=generator, dtype=torch.float64), cross_objective=is_cross,
        omega=torch.rand(num_rows, generator=generator, dtype=torch.float64) + 0.5, behaviour=behaviour,
        old=token_logprobs + torch.randn(num_rows, seq_len, generator=generator, dtype=torch.float64) * 0.1,
        ref=token_logprobs + torch.randn(num_rows, seq_len, generator=generator, dtype=torch.float64) * 0.1)
    return token_logprobs, mask, fields


def _piece(token_logprobs, mask, fields, rows) -> tuple[torch.Tensor, MicroBatch]:
    return token_logprobs[rows], MicroBatch(
        input_ids=mask[rows].long(), position_ids=mask[rows].long(), labels=mask[rows].long(), loss_mask=mask[rows],
        row_index=torch.tensor(rows), advantages=fields["advantages"][rows],
        cross_objective=fields["cross_objective"][rows], is_own=~fields["cross_objective"][rows],
        omega=fields["omega"][rows], old_mean_logprob=fields["behaviour"][rows],
        old_token_logprobs=fields["old"][rows], ref_token_logprobs=fields["ref"][rows])


@pytest.mark.parametrize("algo", [
    AlgoConfig(name="hacpo", kl_coef=0.0, updates_per_step=1),
    AlgoConfig(name="hacpo", kl_coef=0.05, updates_per_step=1),
    AlgoConfig(name="grpo", kl_coef=0.05, grpo_loss_agg="token-mean"),
    AlgoConfig(name="grpo", kl_coef=0.0, grpo_loss_agg="seq-mean-token-sum"),
], ids=["hacpo", "hacpo_kl", "grpo_token_mean_kl", "grpo_seq_sum"])
def test_shares_of_any_split_sum_to_the_whole_minibatch(algo: AlgoConfig) -> None:
    token_logprobs, mask, fields = _random_case(num_rows=7, seq_len=6, seed=3)
    objective = Objective.of(algo)
    normaliser = objective.normaliser(7, int(mask.sum()))

    def loss_and_grad(splits):
        leaf = token_logprobs.clone().requires_grad_(True)
        total = 0.0
        for rows in splits:
            piece_logprobs, batch = _piece(leaf, mask, fields, rows)
            loss, _ = micro_batch_loss(piece_logprobs, batch, objective, 1, normaliser=normaliser, num_sequences=7.0)
            total = total + loss
        total.backward()
        return total.detach(), leaf.grad

    whole_loss, whole_grad = loss_and_grad([list(range(7))])
    split_loss, split_grad = loss_and_grad([[0, 1], [2, 3, 4], [5], [6]])
    assert split_loss.item() == pytest.approx(whole_loss.item(), abs=1e-14)
    torch.testing.assert_close(split_grad, whole_grad, rtol=0, atol=1e-14)
    assert whole_grad.abs().sum() > 0


def test_missing_inputs_are_errors() -> None:
    token_logprobs = torch.zeros(1, 2)
    batch = _batch([[1, 1]], [1.0], [False], [1.0], [0.0])
    with pytest.raises(ValueError, match="old token log-probs"):
        micro_batch_loss(token_logprobs, batch, _objective(name="grpo", kl_coef=0.0), 0, normaliser=1.0,
                         num_sequences=1.0)
    with pytest.raises(ValueError, match="reference model"):
        micro_batch_loss(token_logprobs, batch, _objective(kl_coef=0.1), 0, normaliser=1.0, num_sequences=1.0)


def test_sft_share_is_the_sequence_mean_token_nll() -> None:
    # row 0: logp [−1, −3] → NLL 2; row 1: logp [−0.5] → NLL 0.5; D = 4 rows in the mini-batch
    # share = (2 + 0.5) / 4 = 0.625; d share / d logp = −1 / (L_row · D): row 0 −1/8 per token, row 1 −1/4
    junk = 99.0
    token_logprobs = torch.tensor([[-1.0, -3.0, junk], [-0.5, junk, junk]], dtype=F64, requires_grad=True)
    batch = _batch([[1, 1, 0], [1, 0, 0]], [5.0, -5.0], [False, True], [3.0, 3.0], [0.0, 7.0])  # all unused
    loss, metrics = micro_batch_loss(token_logprobs, batch, Objective.sft(), 0, normaliser=4.0, num_sequences=4.0)
    assert loss.item() == pytest.approx(0.625, rel=1e-12) == metrics["loss"].item() == metrics["policy_loss"].item()
    assert metrics["num_rows"].item() == 2
    loss.backward()
    assert token_logprobs.grad.tolist() == [[-0.125, -0.125, 0.0], [-0.25, 0.0, 0.0]]


def test_kl_covers_the_learners_own_rows_only_under_naive_sharing() -> None:
    # naive: row 1 is another agent's, trained like an own row (no cross objective) but outside the KL term
    token_logprobs = torch.tensor([[-1.0, -3.0], [-0.5, -0.5]], dtype=F64)
    ref = torch.tensor([[-1.0, -2.0], [0.0, 0.0]], dtype=F64)
    batch = _batch([[1, 1], [1, 1]], [0.5, 1.0], [False, False], [1.0, 1.0], [-2.0, -0.5], ref=ref,
                   is_own=[True, False])
    _, metrics = micro_batch_loss(token_logprobs, batch, _objective(name="naive", kl_coef=0.1), 0, normaliser=2.0,
                                  num_sequences=2.0)
    # only row 0: k3 mean (e − 2)/2, over D = 2 sequences
    assert metrics["kl_loss"].item() == pytest.approx(0.1 * (math.e - 2) / 2 / 2, rel=1e-12)
    assert metrics["num_own"].item() == 1 and metrics["num_self"].item() == 2  # the loss's own-objective rows


def test_own_ratio_counts_the_learners_own_rows_not_the_rows_with_the_own_objective() -> None:
    """naive's shared row gets the own objective against the source's m_old, so its ratio is not 1 at the first
    update; the own-row ratio (the trainer's `own_ratio_u0`, 1 when m_old is right) leaves it out."""
    token_logprobs = torch.tensor([[-1.0, -3.0], [-0.5, -0.5]], dtype=F64)  # m_θ = −2, −0.5
    batch = _batch([[1, 1], [1, 1]], [0.5, 1.0], [False, False], [1.0, 1.0], [-2.0, -1.0], is_own=[True, False])
    _, metrics = micro_batch_loss(token_logprobs, batch, _objective(name="naive", kl_coef=0.0), 0, normaliser=2.0,
                                  num_sequences=2.0)
    assert metrics["own_ratio_mean"].item() == pytest.approx(1.0, abs=1e-12)  # e^(−2 − (−2))
    assert metrics["self_ratio_mean"].item() == pytest.approx((1 + math.exp(0.5)) / 2, rel=1e-12)  # and e^0.5
    assert metrics["num_own"].item() == 1 and "kl_mean" not in metrics
    only_shared = _batch([[1, 1]], [1.0], [False], [1.0], [-1.0], is_own=[False])
    _, metrics = micro_batch_loss(token_logprobs[1:], only_shared, _objective(name="naive", kl_coef=0.0), 0,
                                  normaliser=1.0, num_sequences=1.0)
    assert math.isnan(metrics["own_ratio_mean"].item()) and metrics["num_own"].item() == 0  # skipped when combined


def _length_case(scale: float) -> tuple[torch.Tensor, MicroBatch]:
    """One cross row (A = 1, ω = 1) re-encoded into L_k = 16 learner tokens of log-prob −0.4 each; the source
    sampled it as L_j = 10 tokens at m_j = −0.5 (docs/algorithm.md §4's example)."""
    token_logprobs = torch.full((1, 16), -0.4, dtype=F64, requires_grad=True)
    batch = _batch([[1] * 16], [1.0], [True], [1.0], [-0.5])
    batch.ratio_length_scale = torch.tensor([scale], dtype=F64)
    return token_logprobs, batch


def test_ratio_length_conventions_hand_computed() -> None:
    # per_tokenizer (scale 1): log s = m_k − m_j = −0.4 + 0.5 = 0.1 → s = 1.10517 > 1: clipped, no gradient,
    #   objective = clip(s)·sg(clip(s))·ω·A = 1
    tokens, batch = _length_case(1.0)
    loss, metrics = micro_batch_loss(tokens, batch, _objective(kl_coef=0.0), 0, normaliser=1.0, num_sequences=1.0)
    assert metrics["cross_ratio_mean"].item() == pytest.approx(math.exp(0.1), rel=1e-12)
    assert metrics["cross_zero_grad_frac"].item() == 1.0 and loss.item() == pytest.approx(-1.0, rel=1e-12)
    loss.backward()
    assert tokens.grad.abs().max().item() == 0.0
    # single_exponent (scale L_k/L_j = 1.6): log s = Σ log π_k / L_j − m_j = −6.4/10 + 0.5 = −0.14 → s = 0.869358,
    #   inside [lo_0 = 0.8, 1]: objective = s·sg(s) = e^−0.28 = 0.755784; d loss / d log π_k(y_t) = −s·sg(s) / L_j
    tokens, batch = _length_case(1.6)
    loss, metrics = micro_batch_loss(tokens, batch, _objective(kl_coef=0.0), 0, normaliser=1.0, num_sequences=1.0)
    assert metrics["cross_ratio_mean"].item() == pytest.approx(math.exp(-0.14), rel=1e-12)
    assert metrics["cross_zero_grad_frac"].item() == 0.0
    assert loss.item() == pytest.approx(-math.exp(-0.28), rel=1e-12)
    loss.backward()
    assert tokens.grad[0].tolist() == pytest.approx([-math.exp(-0.28) / 10] * 16, rel=1e-12)

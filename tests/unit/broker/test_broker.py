"""Broker.step: capability update, per-learner advantages and ω, own-first/cross-last rows, every algorithm."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_hacpo.algo import ALGORITHMS, CapabilityTracker, TrainingRows, group_advantages, hacpo_advantages
from nemo_hacpo.broker import (
    AgentRollout,
    Broker,
    LearnerTokenizer,
    ReencodePool,
    Trajectory,
    advantage_stats,
    read_jsonl,
    reencode_batch,
    reencode_for_learner,
    write_jsonl,
)
from nemo_hacpo.config.schema import AlgoConfig
from nemo_hacpo.models.chat import render_prompt_ids

AGENTS = ("alpha", "beta", "gamma")
TOKENIZER_OF = {"alpha": "tiny-bpe", "beta": "tiny-unigram", "gamma": "gpt2"}
PROMPTS = {"p0": "Ann has 2 pens and buys 3 more. How many pens?", "p1": "Bob has 9 cups and breaks 4. How many?"}
# rewards[agent][prompt] for G = 2 responses: accuracies alpha 3/4, beta 1/4, gamma 2/4
REWARDS = {"alpha": {"p0": [1, 0], "p1": [1, 1]}, "beta": {"p0": [0, 0], "p1": [1, 0]},
           "gamma": {"p0": [1, 1], "p1": [0, 0]}}


def _messages(pid):
    return ({"role": "user", "content": PROMPTS[pid]},)


def _rollouts(tokenizers, finished=True, long_for=None):
    out = {}
    for a_index, agent in enumerate(AGENTS):
        tok = tokenizers[TOKENIZER_OF[agent]]
        rows = []
        for pid in PROMPTS:
            for i, reward in enumerate(REWARDS[agent][pid]):
                text = f"{agent} says {i}: the answer is \\boxed{{{5 if reward else 6}}}."
                if long_for == agent:
                    text = text * 20
                prompt_ids = render_prompt_ids(_messages(pid), tok)
                response = tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if finished else [])
                traj = Trajectory(prompt_id=pid, messages=_messages(pid), response_text=text, source=agent,
                                  sample_index=i, finish_reason="stop" if finished else "length", reward=float(reward),
                                  source_mean_logprob=-0.1 * (a_index + 1) - 0.01 * i, source_num_tokens=len(response),
                                  gold="5")
                rows.append(AgentRollout(traj, prompt_ids + response, [0] * len(prompt_ids) + [1] * len(response)))
        out[agent] = rows
    return out


def _broker(tokenizers, algo="hacpo", limit=256, capability_baseline=True, gradient_modulation=True, **kwargs):
    """A broker over alpha, beta, gamma; rows in the order they are built (own_first), which the hand-computed
    tests index, unless `row_order` says otherwise (the default order, by_prompt, is tested on its own)."""
    kwargs.setdefault("row_order", "own_first")
    specs = {a: LearnerTokenizer(tokenizers[TOKENIZER_OF[a]], limit) for a in AGENTS}
    spec = ALGORITHMS[algo].with_ablations(capability_baseline=capability_baseline,
                                           gradient_modulation=gradient_modulation)
    return Broker(AGENTS, specs, algorithm=spec, **kwargs)


PROMPT_INDEX = torch.tensor([0, 0, 1, 1] * 3)  # rows: per source (own first), prompt-major, sample-minor
SAMPLE = torch.tensor([0, 1] * 6)


def test_three_agents_hand_computed(tokenizers):
    step = _broker(tokenizers).step(_rollouts(tokenizers))
    assert step.accuracy == {"alpha": 0.75, "beta": 0.25, "gamma": 0.5}
    # ω(j→k) = P̂_j / P̂_k after one step (window includes it)
    assert step.omega["alpha"] == pytest.approx({"alpha": 1.0, "beta": 1 / 3, "gamma": 2 / 3})
    assert step.omega["beta"] == pytest.approx({"alpha": 3.0, "beta": 1.0, "gamma": 2.0})

    view = step.rows["alpha"]
    # B·G = 4 own rows, then (n−1)·B·G = 8 cross rows, source-major, prompt, sample order
    assert len(view) == 12 and step.counts["alpha"]["self_rows"] == 4 and step.counts["alpha"]["cross_rows"] == 8
    assert step.counts["alpha"]["trained_rows"] == 12 and step.counts["alpha"]["reencode_failed"] == 0
    assert view.source.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert view.is_own.tolist() == [True] * 4 + [False] * 8
    assert view.cross_objective.tolist() == [False] * 4 + [True] * 8
    assert view.omega.tolist() == pytest.approx([1.0] * 4 + [1 / 3] * 4 + [2 / 3] * 4)
    assert view.old_mean_logprob.tolist() == pytest.approx([-0.1, -0.11] * 2 + [-0.2, -0.21] * 2 + [-0.3, -0.31] * 2)
    assert view.old_token_logprobs is None  # the sequence loss does not read them

    # prompt p0, learner alpha: rewards a[1,0] b[0,0] c[1,1]
    #   μ = (1/6)(1/1 + 0 + 0 + 0 + 1/(2/3) + 1/(2/3)) = (1 + 1.5 + 1.5)/6 = 2/3
    #   σ = std_unbiased([1,0,0,0,1,1]) = sqrt(6·0.25/5) = sqrt(0.3)
    sigma = math.sqrt(0.3) + 1e-6
    assert view.advantages[0].item() == pytest.approx((1 - 2 / 3) / sigma, rel=1e-6)
    assert view.advantages[1].item() == pytest.approx((0 - 2 / 3) / sigma, rel=1e-6)
    # p1, learner alpha: a[1,1] b[1,0] c[0,0] → μ = (1 + 1 + 1/(1/3) + 0 + 0 + 0)/6 = 5/6
    assert view.advantages[2].item() == pytest.approx((1 - 5 / 6) / sigma, rel=1e-6)
    assert view.advantages[6].item() == pytest.approx((1 - 5 / 6) / sigma, rel=1e-6)  # beta's rewarded p1 sample
    assert view.advantages[10].item() == pytest.approx((0 - 5 / 6) / sigma, rel=1e-6)  # gamma's p1 sample

    # learner beta, p0: a[1,0] b[0,0] c[1,1] → μ = (1/3 + 0 + 0 + 0 + 1/2 + 1/2)/6 = 2/9
    beta = step.rows["beta"]
    assert beta.source.tolist() == [1] * 4 + [0] * 4 + [2] * 4
    assert beta.advantages[0].item() == pytest.approx((0 - 2 / 9) / sigma, rel=1e-6)

    # and exactly what the algorithm functions give
    rewards = torch.tensor([[REWARDS[a][p] for a in AGENTS] for p in PROMPTS], dtype=torch.float64)
    for k, learner in enumerate(AGENTS):
        view = step.rows[learner]
        omega = torch.tensor([step.omega[learner][a] for a in AGENTS], dtype=torch.float64)
        expected = hacpo_advantages(rewards, k, omega)
        assert torch.allclose(view.advantages.double(), expected[PROMPT_INDEX, view.source, SAMPLE].float().double())


def test_self_rows_use_generated_ids_and_cross_rows_are_reencoded(tokenizers):
    rollouts = _rollouts(tokenizers)
    view = _broker(tokenizers).step(rollouts).rows["beta"]
    own = rollouts["beta"]
    assert view.token_ids[:4] == [r.token_ids for r in own]
    tok = tokenizers["tiny-unigram"]
    first_cross = rollouts["alpha"][0].trajectory  # alpha p0 sample 0, re-encoded for beta
    expected = reencode_for_learner(first_cross.messages, first_cross.response_text, True, tok, 256)
    assert view.token_ids[4] == expected.token_ids and view.response_mask[4] == expected.response_mask
    assert view.token_ids[4][-1] == tok.eos_token_id


def test_naive_trains_other_agents_rows_like_own_rows_with_plain_joint_baseline(tokenizers):
    step = _broker(tokenizers, algo="naive").step(_rollouts(tokenizers))
    view = step.rows["alpha"]
    assert len(view) == 12 and not view.cross_objective.any() and torch.all(view.omega == 1)
    assert view.is_own.tolist() == [True] * 4 + [False] * 8  # not its own, even though trained like its own
    joint = torch.tensor([[sum((REWARDS[a][p] for a in AGENTS), [])] for p in PROMPTS], dtype=torch.float64)[:, 0]
    # plain joint GRPO over the n·G group: p0 rewards [1,0,0,0,1,1] → mean 0.5
    expected_p0 = group_advantages(joint)[0]
    assert view.advantages[0].item() == pytest.approx(expected_p0[0].item(), rel=1e-6)
    assert view.advantages[0].item() == pytest.approx(0.5 / (math.sqrt(0.3) + 1e-6), rel=1e-6)


@pytest.mark.parametrize("algo", ["gspo", "gspo_x2"])
def test_isolated_algorithms_have_only_own_rows(tokenizers, algo):
    step = _broker(tokenizers, algo=algo).step(_rollouts(tokenizers))
    view = step.rows["alpha"]
    assert len(view) == 4 and step.counts["alpha"]["cross_rows"] == 0 and not view.cross_objective.any()
    assert view.is_own.all() and torch.all(view.omega == 1)
    # p0 alpha [1, 0]: mean 0.5, std_unbiased sqrt(0.5) → ±0.5/sqrt(0.5)
    assert view.advantages[:2].tolist() == pytest.approx([0.5 / (math.sqrt(0.5) + 1e-6), -0.5 / (math.sqrt(0.5) + 1e-6)])
    assert view.advantages[2:].tolist() == [0.0, 0.0]  # p1 alpha [1, 1]: all equal
    assert step.generated == {"alpha": 4, "beta": 4, "gamma": 4}


def test_ablations(tokenizers):
    no_mod = _broker(tokenizers, gradient_modulation=False).step(_rollouts(tokenizers)).rows["alpha"]
    assert torch.all(no_mod.omega == 1) and no_mod.cross_objective[4:].all()
    no_base = _broker(tokenizers, capability_baseline=False).step(_rollouts(tokenizers)).rows["alpha"]
    naive = _broker(tokenizers, algo="naive").step(_rollouts(tokenizers)).rows["alpha"]
    assert torch.allclose(no_base.advantages, naive.advantages)  # −adv: plain baseline
    assert no_base.omega[4:].tolist() == pytest.approx([1 / 3] * 4 + [2 / 3] * 4)  # ω still modulates


def test_truncation_counts_when_reencoded_response_exceeds_learner_limit(tokenizers):
    step = _broker(tokenizers, limit=40).step(_rollouts(tokenizers, long_for="gamma"))
    view = step.rows["alpha"]
    assert step.counts["alpha"]["reencode_truncated"] == 4
    assert [sum(m) == 40 for m in view.response_mask] == [False] * 8 + [True] * 4


def test_source_truncated_rollouts_carry_no_eos(tokenizers):
    view = _broker(tokenizers).step(_rollouts(tokenizers, finished=False)).rows["alpha"]
    eos = tokenizers["tiny-bpe"].eos_token_id
    assert all(ids[-1] != eos for ids in view.token_ids[4:])


def test_tracker_window_spans_steps(tokenizers):
    broker = _broker(tokenizers, tracker=CapabilityTracker(AGENTS, window=2))
    broker.step(_rollouts(tokenizers))
    flipped = _rollouts(tokenizers)
    for row in flipped["beta"]:  # beta now answers everything correctly: step accuracy 1.0
        object.__setattr__(row.trajectory, "reward", 1.0)
    step = broker.step(flipped)
    assert step.capability["beta"] == pytest.approx((0.25 + 1.0) / 2)
    assert step.omega["alpha"]["beta"] == pytest.approx(0.625 / 0.75)


def test_incomplete_groups_are_rejected(tokenizers):
    broker = _broker(tokenizers)
    rollouts = _rollouts(tokenizers)
    with pytest.raises(ValueError, match="missing \\['gamma'\\]"):
        broker.step({a: rollouts[a] for a in AGENTS[:2]})
    short = dict(rollouts, beta=rollouts["beta"][:-1])
    with pytest.raises(ValueError, match="same number G"):
        broker.step(short)
    gap = dict(rollouts, beta=rollouts["beta"][1:])  # p0 keeps only sample 1
    with pytest.raises(ValueError, match="sample indices \\[1\\]"):
        broker.step(gap)
    with pytest.raises(ValueError, match="needs ≥ 2 agents"):
        Broker(["solo"], {}, algorithm=ALGORITHMS["hacpo"])


def test_pool_gives_the_same_results_as_in_process(tokenizers):
    tok = tokenizers["qwen3"]
    items = [(({"role": "user", "content": f"q{i}"},), f"answer {i} 😀\n\n  \\boxed{{{i}}}", i % 3 != 0) for i in range(24)]
    direct = reencode_batch(items, tok, 12)
    with ReencodePool(2) as pool:
        pooled = pool.reencode(items, tok, 12)
        again = pool.reencode(items, tok, 12)  # tokenizer cached in the workers
    assert pooled == direct == again
    assert any(s.truncated for s in direct) and any(not s.truncated for s in direct)


def test_trajectory_jsonl_roundtrip(tmp_path, tokenizers):
    trajectories = [r.trajectory for rows in _rollouts(tokenizers).values() for r in rows]
    weird = Trajectory(prompt_id="p\n1", messages=({"role": "system", "content": "be brief"}, {"role": "user", "content": "数学 😀"}),
                       response_text="line1\n\"quoted\" \\boxed{\\frac{1}{2}}\u0000", source="alpha", sample_index=3,
                       finish_reason="length", reward=0.0, source_mean_logprob=-1.25, source_num_tokens=7, gold="1/2",
                       step=9, metadata={"level": "2"})
    path = tmp_path / "step_000009" / "rollouts.jsonl"
    assert write_jsonl(path, trajectories + [weird]) == 13
    back = list(read_jsonl(path))
    assert back == trajectories + [weird]
    with pytest.raises(FileNotFoundError, match="no trajectory file at"):
        list(read_jsonl(tmp_path / "missing.jsonl"))
    path.write_text('{"prompt_id": 1}\n')
    with pytest.raises(ValueError, match="rollouts.jsonl:1"):
        list(read_jsonl(path))


def test_trajectory_rejects_bad_values():
    base = dict(prompt_id="p", messages=({"role": "user", "content": "q"},), response_text="r", source="a",
                sample_index=0, finish_reason="stop", reward=1.0, source_mean_logprob=-1.0, source_num_tokens=1, gold="1")
    with pytest.raises(ValueError, match="finish_reason"):
        Trajectory(**{**base, "finish_reason": "eos"})
    with pytest.raises(ValueError, match="non-finite"):
        Trajectory(**{**base, "source_mean_logprob": float("nan")})


def _stats_rows(**changes) -> TrainingRows:
    n = 5
    fields = dict(token_ids=[[1, 2]] * n, response_mask=[[0, 1]] * n, advantages=torch.tensor([1.0, -1.0, 0.0, 2.0, 0.0]),
                  cross_objective=torch.tensor([False, False, False, True, True]),
                  omega=torch.tensor([1.0, 1.0, 1.0, 0.5, 0.25]), old_mean_logprob=torch.zeros(n),
                  is_own=torch.tensor([True, True, True, False, False]), source=torch.tensor([0, 0, 0, 1, 1]))
    return TrainingRows(**(fields | changes))


def test_advantage_stats_hand_computed():
    stats = advantage_stats(_stats_rows())
    # own rows: [1, -1, 0] -> mean 0, population std sqrt(2/3); other agents' rows: [2, 0] -> mean 1, std 1
    assert stats["adv/self_mean"] == 0.0 and abs(stats["adv/self_std"] - (2 / 3) ** 0.5) < 1e-12
    assert (stats["adv/self_min"], stats["adv/self_max"]) == (-1.0, 1.0)
    assert stats["adv/cross_mean"] == 1.0 and stats["adv/cross_std"] == 1.0
    assert stats["adv/zero_frac"] == 2 / 5 and stats["adv/cross_omega_mean"] == 0.375
    # naive sharing: the loss treats every row as own-like (no cross objective), the statistics still split by source
    assert advantage_stats(_stats_rows(cross_objective=torch.zeros(5, dtype=torch.bool))) == stats
    own_only = advantage_stats(_stats_rows(is_own=torch.ones(5, dtype=torch.bool)))
    assert "adv/cross_mean" not in own_only and "adv/cross_omega_mean" not in own_only


def test_token_level_algorithm_carries_the_own_rows_old_token_logprobs(tokenizers):
    rollouts = _rollouts(tokenizers)
    for a_index, agent in enumerate(AGENTS):
        rollouts[agent] = [AgentRollout(r.trajectory, r.token_ids, r.response_mask,
                                        torch.full((len(r.token_ids) - 1,), -float(a_index + i)))
                           for i, r in enumerate(rollouts[agent])]
    step = Broker(AGENTS, {}, algorithm=ALGORITHMS["grpo"]).step(rollouts)
    rows = step.rows["beta"]
    width = max(len(ids) for ids in rows.token_ids) - 1
    assert rows.old_token_logprobs.shape == (4, width)
    for i, ids in enumerate(rows.token_ids):  # each row's values, then zero padding
        assert rows.old_token_logprobs[i, :len(ids) - 1].tolist() == [-float(1 + i)] * (len(ids) - 1)
        assert not rows.old_token_logprobs[i, len(ids) - 1:].any()
    missing = _rollouts(tokenizers)
    with pytest.raises(ValueError, match="needs the old token log-probs"):
        Broker(AGENTS, {}, algorithm=ALGORITHMS["grpo"]).step(missing)


def test_ratio_length_scale_per_convention(tokenizers):
    """single_exponent: a cross row's scale is L_learner / L_source (its re-encoded response tokens over the
    source's sampled ones, EOS included on both sides); own rows and the per-tokenizer default keep 1."""
    rollouts = _rollouts(tokenizers)
    default = _broker(tokenizers).step(rollouts).rows["alpha"]
    assert default.ratio_length_scale.tolist() == [1.0] * 12
    with pytest.raises(ValueError, match="ratio_length"):
        _broker(tokenizers, ratio_length="per_character")
    view = _broker(tokenizers, ratio_length="single_exponent").step(rollouts).rows["alpha"]
    learner = tokenizers[TOKENIZER_OF["alpha"]]
    expected = [1.0] * 4
    for source in ("beta", "gamma"):
        for row in rollouts[source]:
            text = row.trajectory.response_text
            learner_tokens = len(learner(text, add_special_tokens=False)["input_ids"]) + 1  # + the learner's EOS
            expected.append(learner_tokens / row.trajectory.source_num_tokens)
    assert view.ratio_length_scale.tolist() == pytest.approx(expected, rel=1e-6)
    assert any(abs(s - 1.0) > 0.05 for s in expected[4:])  # the tokenizers differ: the convention matters
    # everything else is the same rows
    assert view.token_ids == default.token_ids and torch.equal(view.advantages, default.advantages)


def _row_keys(rows: TrainingRows) -> list[tuple]:
    """Each row as a comparable tuple of every per-row field that the order must carry along."""
    return [(tuple(rows.token_ids[r]), tuple(rows.response_mask[r]), float(rows.advantages[r]), float(rows.omega[r]),
             float(rows.old_mean_logprob[r]), bool(rows.is_own[r]), int(rows.source[r]),
             bool(rows.cross_objective[r])) for r in range(len(rows))]


def test_row_orders_reorder_whole_rows(tokenizers):
    """own_first (the authors' order): 4 own rows, then 4 of each other agent; by_prompt: per prompt, own rows
    first (rows 0,1 own prompt 0; 4,5 and 8,9 the others' prompt 0; then prompt 1); shuffled: a permutation drawn
    from (seed, step, learner), the same when asked again, another one at another step."""
    rollouts = _rollouts(tokenizers)
    built = _broker(tokenizers).step(rollouts, 3).rows["alpha"]
    assert built.source.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    keys = _row_keys(built)

    by_prompt = _broker(tokenizers, row_order="by_prompt").step(rollouts, 3).rows["alpha"]
    assert _row_keys(by_prompt) == [keys[i] for i in [0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11]]
    assert by_prompt.source.tolist() == [0, 0, 1, 1, 2, 2] * 2
    # the default, of the broker and of the config (docs/algorithm.md §6: the pre-registered comparison moved it)
    specs = {a: LearnerTokenizer(tokenizers[TOKENIZER_OF[a]], 256) for a in AGENTS}
    default = Broker(AGENTS, specs, algorithm=ALGORITHMS["hacpo"]).step(rollouts, 3).rows["alpha"]
    assert _row_keys(default) == _row_keys(by_prompt) and AlgoConfig().row_order == "by_prompt"

    def shuffled(step, seed=0):
        return _broker(tokenizers, row_order="shuffled", seed=seed).step(rollouts, step).rows

    first = shuffled(3)
    assert sorted(_row_keys(first["alpha"])) == sorted(keys) and _row_keys(first["alpha"]) != keys
    assert _row_keys(shuffled(3)["alpha"]) == _row_keys(first["alpha"])  # reproducible: a resumed step draws the same
    assert _row_keys(shuffled(4)["alpha"]) != _row_keys(first["alpha"])
    assert _row_keys(shuffled(3, seed=1)["alpha"]) != _row_keys(first["alpha"])
    assert first["alpha"].is_own.tolist() != first["beta"].is_own.tolist()  # each learner its own permutation
    with pytest.raises(ValueError, match="row_order must be one of"):
        _broker(tokenizers, row_order="random")


def test_select_takes_every_per_row_field_along():
    rows = _stats_rows()
    picked = rows.select([2, 0])
    assert _row_keys(picked) == [_row_keys(rows)[2], _row_keys(rows)[0]]
    assert picked.ratio_length_scale.tolist() == rows.ratio_length_scale[[2, 0]].tolist()

"""Broker.step: capability update, per-learner advantages and ω, self-first/cross-last views, all modes."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_hacpo.algo import CapabilityTracker, group_advantages, hacpo_advantages
from nemo_hacpo.broker import (
    AgentRollout,
    Broker,
    LearnerTokenizer,
    ReencodePool,
    Trajectory,
    read_jsonl,
    reencode_batch,
    reencode_for_learner,
    render_prompt_ids,
    write_jsonl,
)

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


def _broker(tokenizers, mode="hacpo", limit=256, **kwargs):
    specs = {a: LearnerTokenizer(tokenizers[TOKENIZER_OF[a]], limit) for a in AGENTS}
    return Broker(AGENTS, specs, mode=mode, **kwargs)


def test_three_agents_hand_computed(tokenizers):
    step = _broker(tokenizers).step(_rollouts(tokenizers))
    assert step.accuracy == {"alpha": 0.75, "beta": 0.25, "gamma": 0.5}
    # ω(j→k) = P̂_j / P̂_k after one step (window includes it)
    assert step.omega["alpha"] == pytest.approx({"alpha": 1.0, "beta": 1 / 3, "gamma": 2 / 3})
    assert step.omega["beta"] == pytest.approx({"alpha": 3.0, "beta": 1.0, "gamma": 2.0})

    view = step.views["alpha"]
    # B·G = 4 self rows, then (n−1)·G = 4 cross rows per prompt pair → 8, source-major, prompt, sample order
    assert len(view) == 12 and view.counts["self_rows"] == 4 and view.counts["cross_rows"] == 8
    assert view.source.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert view.prompt_index.tolist() == [0, 0, 1, 1] * 3
    assert view.is_cross.tolist() == [False] * 4 + [True] * 8
    assert view.omega.tolist() == pytest.approx([1.0] * 4 + [1 / 3] * 4 + [2 / 3] * 4)
    assert view.behaviour_mean_logprob.tolist() == pytest.approx([-0.1, -0.11] * 2 + [-0.2, -0.21] * 2 + [-0.3, -0.31] * 2)

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
    beta = step.views["beta"]
    assert beta.source.tolist() == [1] * 4 + [0] * 4 + [2] * 4
    assert beta.advantages[0].item() == pytest.approx((0 - 2 / 9) / sigma, rel=1e-6)

    # and exactly what the algorithm functions give
    rewards = torch.tensor([[REWARDS[a][p] for a in AGENTS] for p in PROMPTS], dtype=torch.float64)
    for k, learner in enumerate(AGENTS):
        view = step.views[learner]
        omega = torch.tensor([step.omega[learner][a] for a in AGENTS], dtype=torch.float64)
        expected = hacpo_advantages(rewards, k, omega)
        sample = torch.tensor([0, 1] * 6)
        assert torch.allclose(view.advantages.double(), expected[view.prompt_index, view.source, sample].float().double())
        assert view.rewards.tolist() == rewards[view.prompt_index, view.source, sample].tolist()


def test_self_rows_use_generated_ids_and_cross_rows_are_reencoded(tokenizers):
    rollouts = _rollouts(tokenizers)
    view = _broker(tokenizers).step(rollouts).views["beta"]
    own = rollouts["beta"]
    assert view.token_ids[:4] == [r.token_ids for r in own]
    tok = tokenizers["tiny-unigram"]
    first_cross = rollouts["alpha"][0].trajectory  # alpha p0 sample 0, re-encoded for beta
    expected = reencode_for_learner(first_cross.messages, first_cross.response_text, True, tok, 256)
    assert view.token_ids[4] == expected.token_ids and view.response_mask[4] == expected.response_mask
    assert view.token_ids[4][-1] == tok.eos_token_id


def test_naive_mode_marks_cross_rows_as_self_with_plain_joint_baseline(tokenizers):
    step = _broker(tokenizers, mode="naive").step(_rollouts(tokenizers))
    view = step.views["alpha"]
    assert len(view) == 12 and not view.is_cross.any() and torch.all(view.omega == 1)
    joint = torch.tensor([[sum((REWARDS[a][p] for a in AGENTS), [])] for p in PROMPTS], dtype=torch.float64)[:, 0]
    # plain joint GRPO over the n·G group: p0 rewards [1,0,0,0,1,1] → mean 0.5
    expected_p0 = group_advantages(joint)[0]
    assert view.advantages[0].item() == pytest.approx(expected_p0[0].item(), rel=1e-6)
    assert view.advantages[0].item() == pytest.approx(0.5 / (math.sqrt(0.3) + 1e-6), rel=1e-6)


def test_isolated_mode_has_only_self_rows(tokenizers):
    step = _broker(tokenizers, mode="isolated").step(_rollouts(tokenizers))
    view = step.views["alpha"]
    assert len(view) == 4 and view.counts["cross_rows"] == 0 and not view.is_cross.any()
    # p0 alpha [1, 0]: mean 0.5, std_unbiased sqrt(0.5) → ±0.5/sqrt(0.5)
    assert view.advantages[:2].tolist() == pytest.approx([0.5 / (math.sqrt(0.5) + 1e-6), -0.5 / (math.sqrt(0.5) + 1e-6)])
    assert view.advantages[2:].tolist() == [0.0, 0.0]  # p1 alpha [1, 1]: all equal
    assert step.generated == {"alpha": 4, "beta": 4, "gamma": 4}


def test_ablations(tokenizers):
    no_mod = _broker(tokenizers, gradient_modulation=False).step(_rollouts(tokenizers)).views["alpha"]
    assert torch.all(no_mod.omega == 1) and no_mod.is_cross[4:].all()
    no_base = _broker(tokenizers, capability_baseline=False).step(_rollouts(tokenizers)).views["alpha"]
    naive = _broker(tokenizers, mode="naive").step(_rollouts(tokenizers)).views["alpha"]
    assert torch.allclose(no_base.advantages, naive.advantages)  # −adv: plain baseline
    assert no_base.omega[4:].tolist() == pytest.approx([1 / 3] * 4 + [2 / 3] * 4)  # ω still modulates


def test_truncation_counts_when_reencoded_response_exceeds_learner_limit(tokenizers):
    step = _broker(tokenizers, limit=40).step(_rollouts(tokenizers, long_for="gamma"))
    view = step.views["alpha"]
    assert view.counts["reencode_truncated"] == 4
    assert view.truncated.tolist() == [False] * 8 + [True] * 4
    assert all(sum(m) == 40 for m in view.response_mask[8:])


def test_source_truncated_rollouts_carry_no_eos(tokenizers):
    view = _broker(tokenizers).step(_rollouts(tokenizers, finished=False)).views["alpha"]
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
        Broker(["solo"], {}, mode="hacpo")


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


def test_advantage_stats_hand_computed():
    import torch

    from nemo_hacpo.broker.broker import LearnerView, advantage_stats

    n = 5
    view = LearnerView(
        learner="a", token_ids=[[1, 2]] * n, response_mask=[[0, 1]] * n,
        advantages=torch.tensor([1.0, -1.0, 0.0, 2.0, 0.0]),
        is_cross=torch.tensor([False, False, False, True, True]),
        omega=torch.tensor([1.0, 1.0, 1.0, 0.5, 0.25]),
        behaviour_mean_logprob=torch.zeros(n), source=torch.tensor([0, 0, 0, 1, 1]),
        prompt_index=torch.zeros(n, dtype=torch.long), rewards=torch.zeros(n), truncated=torch.zeros(n, dtype=torch.bool),
        counts={"self_rows": 3, "cross_rows": 2})
    stats = advantage_stats(view)
    # self rows: [1, -1, 0] -> mean 0, population std sqrt(2/3); cross rows: [2, 0] -> mean 1, std 1
    assert stats["adv/self_mean"] == 0.0 and abs(stats["adv/self_std"] - (2 / 3) ** 0.5) < 1e-12
    assert (stats["adv/self_min"], stats["adv/self_max"]) == (-1.0, 1.0)
    assert stats["adv/cross_mean"] == 1.0 and stats["adv/cross_std"] == 1.0
    assert stats["adv/zero_frac"] == 2 / 5 and stats["adv/cross_omega_mean"] == 0.375
    # naive sharing: the loss treats every row as its own (is_cross all false), the statistics still split by source
    naive = LearnerView(**{**view.__dict__, "is_cross": torch.zeros(n, dtype=torch.bool)})
    assert advantage_stats(naive) == stats
    own_only = LearnerView(**{**view.__dict__, "counts": {"self_rows": 5, "cross_rows": 0}})
    assert "adv/cross_mean" not in advantage_stats(own_only) and "adv/cross_omega_mean" not in advantage_stats(own_only)

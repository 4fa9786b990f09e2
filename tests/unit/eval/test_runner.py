"""Scoring of response lists (avg@k, pass@k, statuses, lengths) and the engine-driving runner.

The runner is driven by `ScriptedEngine`, a tiny real implementation of the `EvalEngine` protocol: prompts are
rendered one token per character, and each question is answered with scripted texts (cycled), so the
expected numbers can be worked out by hand. The vLLM engine itself runs in tests/integration/eval/.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nemo_hacpo.config import AgentConfig
from nemo_hacpo.data import MathProblem
from nemo_hacpo.eval.runner import (
    PROMPT_TOO_LONG,
    EvalSettings,
    GenerateCall,
    evaluate_engine,
    evaluate_responses,
    plan_generate_calls,
)
from nemo_hacpo.rewards import MathRewardScorer
from nemo_hacpo.rollout.outputs import GenerationResult, SampledResponse
from nemo_hacpo.rollout.sampling import SamplingSettings, request_seeds
from nemo_hacpo.rollout.settings import engine_settings

PROBLEMS = [MathProblem(id="p1", question="What is 3 + 4?", answer="7"),
            MathProblem(id="p2", question="What is 3 * 4?", answer="12")]
SAMPLED = [["so \\boxed{7}", "\\boxed{8}", "it is 7", "\\boxed{7}"],          # correct, wrong, no_answer, correct
           ["\\boxed{12}", "\\boxed{3}", "\\boxed{4}", "\\boxed{5}"]]         # c = 1


@pytest.fixture(scope="module")
def scorer():
    with MathRewardScorer(num_workers=0) as in_process:
        yield in_process


def test_sampled_scores_match_hand_computed_avg_and_pass_at_k(scorer):
    scored = evaluate_responses(SAMPLED, PROBLEMS, ks=(4, 1, 2), scorer=scorer)
    assert scored.num_samples == 4 and scored.pass_ks == (1, 2, 4)
    assert [p.num_correct for p in scored.problems] == [2, 1]
    assert [r.status for r in scored.problems[0].responses] == ["correct", "wrong", "no_answer", "correct"]
    # avg@4 = (2/4 + 1/4) / 2; pass@2 = ((1 − C(2,2)/C(4,2)) + (1 − C(3,2)/C(4,2))) / 2 = (5/6 + 1/2) / 2
    assert scored.metrics() == pytest.approx({"avg@4": 0.375, "pass@1": 0.375, "pass@2": 2 / 3, "pass@4": 1.0})
    assert scored.metrics(prefix="x_").keys() == {"x_avg@4", "x_pass@1", "x_pass@2", "x_pass@4"}
    assert math.isnan(scored.response_tokens_mean()) and math.isnan(scored.truncation_rate())  # no lengths given


def test_greedy_scores_lengths_and_truncation(scorer):
    scored = evaluate_responses([["\\boxed{7}"], ["\\boxed{13}"]], PROBLEMS, scorer=scorer,
                                num_tokens=[[3], [9]], finish_reasons=[["stop"], ["length"]])
    assert scored.metrics() == {"avg@1": 0.5}
    assert scored.response_tokens_mean() == 6.0 and scored.truncation_rate() == 0.5
    assert scored.problems[1].responses[0].num_tokens == 9


def test_default_scorer_is_strict_in_process():
    scored = evaluate_responses([["the answer is 7"], ["\\boxed{12}"]], PROBLEMS)
    assert [r.status for p in scored.problems for r in p.responses] == ["no_answer", "correct"]


def test_prompt_too_long_problems_score_zero_and_are_left_out_of_lengths(scorer):
    scored = evaluate_responses([["x", "y"], ["\\boxed{12}", "\\boxed{1}"]], PROBLEMS, ks=(2,), scorer=scorer,
                                num_tokens=[[0, 0], [4, 6]], finish_reasons=[["length", "length"], ["stop", "stop"]],
                                prompt_too_long=[True, False])
    first = scored.problems[0].responses
    assert [(r.text, r.reward, r.status, r.generated) for r in first] == [("", 0.0, PROMPT_TOO_LONG, False)] * 2
    assert scored.metrics() == {"avg@2": 0.25, "pass@2": 0.5}
    assert scored.num_prompt_too_long() == 1
    assert scored.response_tokens_mean() == 5.0 and scored.truncation_rate() == 0.0


@pytest.mark.parametrize(("texts", "kwargs", "match"), [
    ([["a"]], {}, "1 response lists for 2 problems"),
    ([["a"], ["b", "c"]], {}, "same number n ≥ 1 of responses; got \\[1, 2\\]"),
    ([[], []], {}, "same number n ≥ 1"),
    ([["a"], ["b"]], {"ks": (2,)}, "1 ≤ k ≤ n = 1 responses per problem; got k = \\[2\\]"),
    ([["a"], ["b"]], {"num_tokens": [[1]]}, "num_tokens must have the shape of texts_per_problem: \\[2\\]\\[1\\]"),
    ([["a"], ["b"]], {"finish_reasons": [["stop"], ["stop", "stop"]]}, "finish_reasons must have the shape"),
    ([["a"], ["b"]], {"prompt_too_long": [True]}, "1 flags for 2 problems"),
])
def test_evaluate_responses_rejects_bad_shapes(texts, kwargs, match):
    with pytest.raises(ValueError, match=match):
        evaluate_responses(texts, PROBLEMS, **kwargs)
    with pytest.raises(ValueError, match="no problems"):
        evaluate_responses([], [])


# ------------------------------------------------------------------------------------------ with an engine
@dataclass
class ScriptedEngine:
    """Renders one token per character of the user message; answers each question with its scripted texts."""

    answers: dict[str, list[str]]
    max_prompt_length: int
    max_response_length: int = 8
    calls: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        agent = AgentConfig(name="scripted", max_prompt_length=self.max_prompt_length,
                            max_response_length=self.max_response_length)
        self.settings = engine_settings(agent, "/nonexistent", "/nonexistent", device="cpu",
                                        total_memory_bytes=24 << 30)

    def render(self, messages):
        return [ord(ch) for ch in messages[-1]["content"]]

    def generate_from_ids(self, prompt_token_ids, n, *, max_tokens=None, seed=None, sampling=None):
        self.calls.append({"questions": ["".join(map(chr, ids)).split("\n")[0] for ids in prompt_token_ids],
                           "n": n, "seed": seed, "sampling": sampling, "max_tokens": max_tokens})
        limit = max_tokens or self.max_response_length
        responses = []
        for b, ids in enumerate(prompt_token_ids):
            scripted = self.answers["".join(map(chr, ids)).split("\n")[0]]
            group = []
            for g in range(n):
                text = scripted[g % len(scripted)]
                length = min(len(text), limit)
                group.append(SampledResponse(prompt_index=b, sample_index=g, token_ids=[1] * length, text=text,
                                             finish_reason="length" if len(text) >= limit else "stop",
                                             logprobs=[0.0] * length))
            responses.append(group)
        return GenerationResult(prompt_token_ids=[list(i) for i in prompt_token_ids], responses=responses,
                                seeds=list(request_seeds(seed or 0, len(prompt_token_ids), n)))


def _engine(max_prompt_length: int = 200) -> ScriptedEngine:
    return ScriptedEngine({p.question: texts for p, texts in zip(PROBLEMS, SAMPLED, strict=True)},
                          max_prompt_length=max_prompt_length, max_response_length=10)


def test_engine_greedy_and_sampled(scorer):
    engine = _engine()
    settings = EvalSettings(greedy=True, samples=4, pass_ks=(1, 4), temperature=0.7, top_p=0.9, seed=5)
    result = evaluate_engine(engine, PROBLEMS, settings, scorer=scorer, dataset="toy")
    assert (result.agent, result.dataset, result.num_problems) == ("scripted", "toy", 2)
    greedy_call, sampled_call = engine.calls
    assert greedy_call["n"] == 1 and greedy_call["sampling"] == SamplingSettings(temperature=0.0)
    assert sampled_call["n"] == 4 and sampled_call["sampling"] == SamplingSettings(temperature=0.7, top_p=0.9)
    assert sampled_call["seed"] == 5
    summary = result.summary()
    # greedy = first scripted text: p1 "so \boxed{7}" (correct), p2 "\boxed{12}" (correct)
    assert summary["greedy_avg@1"] == 1.0
    assert summary["avg@4"] == 0.375 and summary["pass@1"] == 0.375 and summary["pass@4"] == 1.0
    # max 10 tokens: "so \boxed{7}" (12 chars) is cut to 10, "\boxed{12}" (10 chars) fills it: both "length";
    # greedy 10, 10; sampled p1: 10, 9, 7, 9; p2: 10, 9, 9, 9 → mean 72/8 = 9, 2 of 8 cut
    assert summary["greedy_response_tokens"] == 10.0 and summary["greedy_truncation_rate"] == 1.0
    assert summary["sampled_response_tokens"] == 9.0 and summary["sampled_truncation_rate"] == 2 / 8
    assert summary["prompt_too_long"] == 0.0
    assert list(summary) == ["greedy_avg@1", "avg@4", "pass@1", "pass@4", "greedy_response_tokens",
                             "greedy_truncation_rate", "sampled_response_tokens", "sampled_truncation_rate",
                             "prompt_too_long"]
    assert result.problems_per_s > 0


def _sample_seeds(engine: ScriptedEngine) -> dict[tuple[str, int], int]:
    """(question, sample index) → the seed vLLM gives that sample: request seed s_b = seed + b·n, child g: s_b + g."""
    out: dict[tuple[str, int], int] = {}
    counts: dict[str, int] = {}
    for call in engine.calls:
        for question, request_seed in zip(call["questions"], request_seeds(call["seed"], len(call["questions"]),
                                                                             call["n"]), strict=True):
            for g in range(call["n"]):
                index = counts.get(question, 0)
                out[(question, index)] = request_seed + g
                counts[question] = index + 1
    return out


@pytest.mark.parametrize(("batch_size", "max_batch_tokens", "num_calls"),
                         [(2, None, 3), (5, None, 1), (5, 40, 15), (5, 150, 10), (5, 450, 3)])
def test_sample_seeds_do_not_depend_on_how_calls_are_split(scorer, batch_size, max_batch_tokens, num_calls):
    problems = [MathProblem(id=f"q{i}", question=f"q{i}?", answer="1") for i in range(5)]
    engine = ScriptedEngine({p.question: ["\\boxed{1}"] for p in problems}, max_prompt_length=200)
    settings = EvalSettings(greedy=False, samples=3, seed=100, batch_size=batch_size,
                            max_batch_tokens=max_batch_tokens)
    result = evaluate_engine(engine, problems, settings, scorer=scorer)
    assert result.summary()["avg@3"] == 1.0
    assert _sample_seeds(engine) == {(f"q{j}?", g): 100 + 3 * j + g for j in range(5) for g in range(3)}
    # every prompt renders to 3 + 1 + 70 = 74 tokens ("q0?", "\\n", the instruction); 3 samples cost 222:
    # budget 40 → 1 sample per call (15 calls), 150 → 2 + 1 samples (10), 450 → 2 + 2 + 1 problems (3)
    assert len(engine.calls) == num_calls
    if max_batch_tokens is not None:
        assert all(call["n"] * 74 * len(call["questions"]) <= max(max_batch_tokens, 74) for call in engine.calls)


def test_greedy_calls_ignore_the_token_budget(scorer):
    problems = [MathProblem(id=f"q{i}", question=f"q{i}?", answer="1") for i in range(4)]
    engine = ScriptedEngine({p.question: ["\\boxed{1}"] for p in problems}, max_prompt_length=200)
    evaluate_engine(engine, problems, EvalSettings(max_batch_tokens=10), scorer=scorer)
    assert len(engine.calls) == 1 and engine.calls[0]["n"] == 1  # greedy requests carry no sampler state


def test_plan_generate_calls_hand_cases():
    assert plan_generate_calls([10, 10, 30], 2, 256, 40) == [
        GenerateCall(0, 2, 0, 2), GenerateCall(2, 1, 0, 1), GenerateCall(2, 1, 1, 1)]
    assert plan_generate_calls([5] * 5, 3, 2) == [GenerateCall(0, 2, 0, 3), GenerateCall(2, 2, 0, 3),
                                                  GenerateCall(4, 1, 0, 3)]
    assert plan_generate_calls([50, 5], 1, 8, 20) == [GenerateCall(0, 1, 0, 1), GenerateCall(1, 1, 0, 1)]
    assert plan_generate_calls([], 4, 8, 100) == []


@given(st.lists(st.integers(1, 40), max_size=12), st.integers(1, 6), st.integers(1, 5),
       st.one_of(st.none(), st.integers(1, 120)))
def test_plan_generate_calls_covers_every_sample_once_within_limits(lengths, n, batch_size, budget):
    calls = plan_generate_calls(lengths, n, batch_size, budget)
    covered = [(j, g) for c in calls for j in range(c.first, c.first + c.count)
               for g in range(c.first_sample, c.first_sample + c.samples)]
    assert sorted(covered) == [(j, g) for j in range(len(lengths)) for g in range(n)]
    for c in calls:
        assert 1 <= c.count <= batch_size and c.samples >= 1
        assert c.count == 1 or c.samples == n  # a call shares one n, so split samples travel alone
        cost = c.samples * sum(lengths[c.first:c.first + c.count])
        assert budget is None or cost <= budget or (c.count == 1 and c.samples == 1)


def test_engine_skips_prompts_longer_than_the_agent_allows(scorer):
    long_question = MathProblem(id="long", question="What is " + "1 + " * 60 + "1?", answer="61")
    engine = ScriptedEngine({PROBLEMS[0].question: ["\\boxed{7}"]}, max_prompt_length=120)
    result = evaluate_engine(engine, [PROBLEMS[0], long_question], EvalSettings(samples=2), scorer=scorer)
    assert [q for call in engine.calls for q in call["questions"]] == [PROBLEMS[0].question] * 2  # greedy, sampled
    assert result.greedy.problems[1].responses[0].status == PROMPT_TOO_LONG
    summary = result.summary()
    assert summary["greedy_avg@1"] == 0.5 and summary["avg@2"] == 0.5 and summary["prompt_too_long"] == 1.0
    assert summary["pass@1"] == 0.5 and summary["pass@2"] == 0.5  # default ks for 2 samples: (1, 2)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"greedy": False}, "nothing to evaluate"),
    ({"samples": 4, "pass_ks": (8,)}, "1 ≤ k ≤ samples = 4; got k = \\[8\\]"),
    ({"samples": 2, "temperature": 0.0}, "temperature > 0"),
    ({"batch_size": 0}, "batch_size ≥ 1"),
    ({"max_batch_tokens": 0}, "max_batch_tokens must be ≥ 1 or None"),
])
def test_settings_reject_impossible_combinations(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EvalSettings(**kwargs)


def test_engine_rejects_an_empty_dataset(scorer):
    with pytest.raises(ValueError, match="dataset 'empty': no problems"):
        evaluate_engine(_engine(), [], EvalSettings(), scorer=scorer, dataset="empty")

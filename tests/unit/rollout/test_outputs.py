"""The EOS / finish-reason contract of a response, the trainer's view of a generation, and the mapping onto the
broker's AgentRollout."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_hacpo.rollout.outputs import (
    GenerationResult,
    ResponseError,
    SampledResponse,
    agent_rollouts,
    check_response,
    rollout_metrics,
)

EOS = 2


def test_valid_responses_pass():
    check_response([5, 7, EOS], [-1.0, -2.0, -0.1], "stop", EOS, max_tokens=4)
    check_response([EOS], [-0.5], "stop", EOS, max_tokens=4)
    check_response([5, 0, 7, 9], [-1.0] * 4, "length", EOS, max_tokens=4)  # 0 is another special token: fine
    check_response([5, 7, EOS], [-1.0] * 3, "stop", EOS, max_tokens=3)  # EOS as the last allowed token: stop


@pytest.mark.parametrize(("token_ids", "logprobs", "reason", "message"), [
    ([5, 7], [-1.0, -1.0], "stop", "not the agent's EOS"),              # stopped on some other token
    ([5, 0], [-1.0, -1.0], "stop", "not the agent's EOS"),
    ([], [], "stop", "not the agent's EOS"),
    ([5, EOS, 7, 9], [-1.0] * 4, "length", "inside the response"),
    ([5, 7, 9, EOS], [-1.0] * 4, "length", "ends with the EOS"),
    ([5, 7], [-1.0, -1.0], "length", "after 2 tokens"),                  # cut before max_tokens
    ([5, EOS], [-1.0], "stop", "1 log-probs for 2 tokens"),
    ([5, EOS], [-1.0, 0.5], "stop", "≤ 0"),
    ([5, EOS], [-1.0, math.nan], "stop", "finite"),
    ([5, 7], [-1.0, -1.0], "abort", "finish reason"),
])
def test_broken_responses_are_errors(token_ids, logprobs, reason, message):
    with pytest.raises(ResponseError, match=message):
        check_response(token_ids, logprobs, reason, EOS, max_tokens=4)


def _response(b: int, g: int, ids: list[int], reason: str) -> SampledResponse:
    return SampledResponse(prompt_index=b, sample_index=g, token_ids=ids, text=f"r{b}{g}", finish_reason=reason,
                           logprobs=[-1.0] * len(ids))


def test_agent_rollouts_mapping():
    result = GenerationResult(
        prompt_token_ids=[[1, 10, 11], [1, 12]],
        responses=[[_response(0, 0, [20, EOS], "stop"), _response(0, 1, [21, 22, 23], "length")],
                   [_response(1, 0, [EOS], "stop"), _response(1, 1, [24, 25, 26], "length")]],
        seeds=[3, 5],
    )
    prompts = [[{"role": "user", "content": "1+1?"}], [{"role": "user", "content": "2+2?"}]]
    rollouts = agent_rollouts(result, prompts, source="llama_tiny", prompt_ids=["p0", "p1"], golds=["2", "4"],
                              rewards=[[1.0, 0.0], [0.0, 1.0]], mean_logprobs=[[-0.5, -1.5], [-0.1, -2.0]], step=3,
                              metadata=[{"level": "1"}, {"level": "2"}])
    assert len(rollouts) == 4
    first, last = rollouts[0], rollouts[3]
    assert first.token_ids == [1, 10, 11, 20, EOS] and first.response_mask == [0, 0, 0, 1, 1]
    assert last.token_ids == [1, 12, 24, 25, 26] and last.response_mask == [0, 0, 1, 1, 1]
    t = first.trajectory
    assert (t.prompt_id, t.source, t.sample_index, t.finish_reason, t.reward, t.source_mean_logprob,
            t.source_num_tokens, t.gold, t.step, t.response_text) == ("p0", "llama_tiny", 0, "stop", 1.0, -0.5, 2, "2",
                                                                      3, "r00")
    assert t.messages[0].content == "1+1?" and dict(t.metadata) == {"level": "1"}
    assert (last.trajectory.finish_reason, last.trajectory.sample_index, last.trajectory.reward) == ("length", 1, 1.0)
    with pytest.raises(ValueError, match="rewards"):
        agent_rollouts(result, prompts, source="x", prompt_ids=["p0", "p1"], golds=["2", "4"],
                       rewards=[[1.0]], mean_logprobs=[[0.0, 0.0], [0.0, 0.0]])
    with pytest.raises(ValueError, match="prompt 1"):
        agent_rollouts(result, prompts, source="x", prompt_ids=["p0", "p1"], golds=["2", "4"],
                       rewards=[[1.0, 0.0], [1.0]], mean_logprobs=[[0.0, 0.0], [0.0, 0.0]])


def test_sampled_response_properties():
    response = _response(0, 0, [5, EOS], "stop")
    assert response.finished and response.num_tokens == 2 and response.sampler_mean_logprob == -1.0
    assert math.isnan(_response(0, 0, [], "length").sampler_mean_logprob)
    assert [r.token_ids for r in GenerationResult([[1]], [[response, response]], [0]).flat()] == [[5, EOS]] * 2


def _two_prompt_result() -> GenerationResult:
    return GenerationResult(
        prompt_token_ids=[[1, 10, 11], [1, 12]],
        responses=[[_response(0, 0, [20, EOS], "stop"), _response(0, 1, [21, 22, 23], "length")],
                   [_response(1, 0, [EOS], "stop"), _response(1, 1, [24, 25, 26], "length")]],
        seeds=[3, 5], stats={"tokens_per_s": 10.0, "generate_s": 2.0, "num_generated_tokens": 9.0})


def test_training_rows_and_response_starts():
    result = _two_prompt_result()
    token_ids, masks = result.training_rows()
    assert token_ids == [[1, 10, 11, 20, EOS], [1, 10, 11, 21, 22, 23], [1, 12, EOS], [1, 12, 24, 25, 26]]
    assert masks == [[0, 0, 0, 1, 1], [0, 0, 0, 1, 1, 1], [0, 0, 1], [0, 0, 1, 1, 1]]
    # shifted layout: column t scores token t + 1, so a response starts at column (prompt length − 1)
    assert result.response_starts() == [2, 2, 1, 1]


def test_rollout_metrics_of_one_agent():
    metrics = rollout_metrics(_two_prompt_result(), [1.0, 0.0, 0.0, 1.0])
    # lengths 2, 3, 1, 3 → mean 9/4; two of four cut at the limit
    assert metrics == {"reward_mean": 0.5, "response_length_mean": 2.25, "response_length_max": 3.0,
                       "truncation_rate": 0.5}
    with pytest.raises(ValueError, match="3 rewards for 4 responses"):
        rollout_metrics(_two_prompt_result(), [1.0, 0.0, 0.0])


def test_merge_concatenates_slices_in_order_and_adds_throughput():
    first = _two_prompt_result()
    second = GenerationResult(prompt_token_ids=[[1, 13]], responses=[[_response(0, 0, [EOS], "stop")] * 2],
                              seeds=[9], stats={"tokens_per_s": 5.0, "generate_s": 3.0, "num_generated_tokens": 2.0})
    merged = GenerationResult.merge([first, second])
    assert merged.prompt_token_ids == [[1, 10, 11], [1, 12], [1, 13]] and merged.seeds == [3, 5, 9]
    assert [len(group) for group in merged.responses] == [2, 2, 2]
    assert dict(merged.stats) == {"tokens_per_s": 15.0, "generate_s": 3.0, "num_generated_tokens": 11.0}
    with pytest.raises(ValueError, match="no generation results"):
        GenerationResult.merge([])


def test_agent_rollouts_carry_old_token_logprobs_when_given():
    result = _two_prompt_result()
    token_ids, _ = result.training_rows()
    rows = [torch.full((len(ids) - 1,), -float(n)) for n, ids in enumerate(token_ids)]
    prompts = [[{"role": "user", "content": "1+1?"}], [{"role": "user", "content": "2+2?"}]]
    rollouts = agent_rollouts(result, prompts, source="a", prompt_ids=["p0", "p1"], golds=["2", "4"],
                              rewards=[[1.0, 0.0], [0.0, 1.0]], mean_logprobs=[[0.0, 0.0], [0.0, 0.0]],
                              token_logprobs=rows)
    assert [r.old_token_logprobs.tolist() for r in rollouts] == [[-0.0] * 4, [-1.0] * 5, [-2.0] * 2, [-3.0] * 4]
    with pytest.raises(ValueError, match="old_token_logprobs must have shape"):
        agent_rollouts(result, prompts, source="a", prompt_ids=["p0", "p1"], golds=["2", "4"],
                       rewards=[[1.0, 0.0], [0.0, 1.0]], mean_logprobs=[[0.0, 0.0], [0.0, 0.0]],
                       token_logprobs=[torch.zeros(1)] * 4)

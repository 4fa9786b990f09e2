"""What the rollout engine returns (the records that cross Ray), and the mapping onto the broker's `AgentRollout`s.

Per prompt b and sample g, a `SampledResponse` holds the generated ids (ending with the agent's EOS iff it
finished), the text (special tokens skipped, decoded by the agent's tokenizer), the finish reason and the
sampler's log-prob of every generated token. `GenerationResult.training_rows()` gives the trainer's view of
them (prompt + response ids, response mask); `agent_rollouts` pairs them with rewards and the trainer's
recomputed mean log-probs:

    AgentRollout(trajectory=Trajectory(..., response_text=text, finish_reason=..., reward=r[b][g],
                                       source_mean_logprob=m_old[b][g], source_num_tokens=len(token_ids)),
                 token_ids=prompt_ids[b] + response.token_ids,
                 response_mask=[0]·len(prompt_ids[b]) + [1]·len(response.token_ids))
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from nemo_hacpo.broker.broker import AgentRollout
from nemo_hacpo.broker.trajectory import FINISH_REASONS, FinishReason, Trajectory
from nemo_hacpo.models.chat import Message, as_messages

LOGPROB_SLACK = 1e-4
"""A log-prob may exceed 0 by this much (float rounding of log-softmax near p = 1)."""


class ResponseError(ValueError):
    """A response from vLLM breaks the EOS / finish-reason contract."""


@dataclass(frozen=True)
class SampledResponse:
    """One generated response (prompt excluded)."""

    prompt_index: int
    """b: index of the prompt in the generate call."""
    sample_index: int
    """g: index among the prompt's G responses."""
    token_ids: list[int]
    """Generated ids; end with the agent's EOS exactly when `finish_reason == "stop"`."""
    text: str
    """`tokenizer.decode(token_ids, skip_special_tokens=True)` with the agent's tokenizer."""
    finish_reason: FinishReason
    """`stop`: ended with the agent's EOS; `length`: cut at max_tokens (no EOS)."""
    logprobs: list[float]
    """Sampler log-prob of each generated token (same length as token_ids), model distribution."""

    @property
    def finished(self) -> bool:
        return self.finish_reason == "stop"

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def sampler_mean_logprob(self) -> float:
        """Mean of `logprobs` (NaN for an empty response)."""
        return sum(self.logprobs) / len(self.logprobs) if self.logprobs else math.nan


@dataclass(frozen=True)
class GenerationResult:
    """All responses of one generate call: `responses[b][g]`, B prompts × G samples."""

    prompt_token_ids: list[list[int]]
    """Rendered prompt ids fed to vLLM, one list per prompt."""
    responses: list[list[SampledResponse]]
    """[B][G] responses."""
    seeds: list[int | None]
    """Per-prompt request seed (responses g use seed + g)."""
    stats: Mapping[str, float] = field(default_factory=dict)
    """generate_s, num_prompts, num_responses, num_generated_tokens, tokens_per_s."""

    def flat(self) -> list[SampledResponse]:
        """Responses in (prompt, sample) order."""
        return [r for group in self.responses for r in group]

    def training_rows(self) -> tuple[list[list[int]], list[list[int]]]:
        """`(token_ids, response_mask)` of every response in (prompt, sample) order: prompt ids + generated ids,
        and a mask that is 1 exactly on the generated part (what the trainer scores)."""
        token_ids, masks = [], []
        for prompt, group in zip(self.prompt_token_ids, self.responses, strict=True):
            for response in group:
                token_ids.append(list(prompt) + list(response.token_ids))
                masks.append([0] * len(prompt) + [1] * response.num_tokens)
        return token_ids, masks

    def response_starts(self) -> list[int]:
        """Per response (flat order), the first column of its tokens in the trainer's shifted layout
        (`[:, t]` scores token t + 1): its prompt length − 1."""
        return [len(prompt) - 1 for prompt, group in zip(self.prompt_token_ids, self.responses, strict=True)
                for _ in group]

    @classmethod
    def merge(cls, parts: Sequence[GenerationResult]) -> GenerationResult:
        """Concatenate the results of several engines (slices of one batch, in order); throughputs add up."""
        if not parts:
            raise ValueError("no generation results to merge")
        stats = [dict(part.stats) for part in parts]
        merged = {key: sum(s.get(key, 0.0) for s in stats) if key in ("tokens_per_s", "num_generated_tokens")
                  else max(s.get(key, 0.0) for s in stats) for key in stats[0]}
        return cls(prompt_token_ids=[ids for part in parts for ids in part.prompt_token_ids],
                   responses=[group for part in parts for group in part.responses],
                   seeds=[seed for part in parts for seed in part.seeds], stats=merged)


@dataclass(frozen=True)
class RefitStats:
    """One weight refit of an engine."""

    seconds: float
    tensors: int
    bytes: int
    transport: str
    """`rpc` (safetensors chunks over collective_rpc) or `ipc` (CUDA IPC handles)."""


def check_response(token_ids: Sequence[int], logprobs: Sequence[float], finish_reason: str,
                   eos_token_id: int, max_tokens: int) -> None:
    """Raise `ResponseError` unless the response keeps the contract:

    - finish_reason is `stop` or `length` (an aborted request is an error, not a sample);
    - one log-prob per token, all finite and ≤ 0 (+ LOGPROB_SLACK);
    - `stop`  ⇔ the last id is the agent's EOS; EOS appears nowhere else;
    - `length` ⇒ exactly max_tokens ids.
    """
    if finish_reason not in FINISH_REASONS:
        raise ResponseError(f"finish reason {finish_reason!r} is not one of {FINISH_REASONS}")
    if len(logprobs) != len(token_ids):
        raise ResponseError(f"{len(logprobs)} log-probs for {len(token_ids)} tokens")
    if any(not math.isfinite(lp) or lp > LOGPROB_SLACK for lp in logprobs):
        raise ResponseError(f"log-probs must be finite and ≤ 0, got {list(logprobs)}")
    ends_with_eos = bool(token_ids) and token_ids[-1] == eos_token_id
    if eos_token_id in token_ids[:-1]:
        raise ResponseError(f"EOS {eos_token_id} inside the response at {list(token_ids).index(eos_token_id)}")
    if finish_reason == "stop" and not ends_with_eos:
        last = token_ids[-1] if token_ids else None
        raise ResponseError(f"finish reason 'stop' but the response ends with {last}, not the agent's EOS "
                            f"{eos_token_id}")
    if finish_reason == "length":
        if ends_with_eos:
            raise ResponseError("finish reason 'length' but the response ends with the EOS")
        if len(token_ids) != max_tokens:
            raise ResponseError(f"finish reason 'length' after {len(token_ids)} tokens, max_tokens={max_tokens}")


def completion_logprobs(completion: Any) -> list[float]:
    """Chosen-token log-probs of a vLLM `CompletionOutput` (requested with `logprobs=0`)."""
    if completion.logprobs is None:
        raise ResponseError("the completion carries no log-probs (request logprobs=0)")
    return [float(step[token].logprob) for step, token in zip(completion.logprobs, completion.token_ids,
                                                             strict=True)]


def agent_rollouts(result: GenerationResult, prompts: Sequence[Sequence[Message] | Sequence[dict]], *,
                   source: str, prompt_ids: Sequence[str], golds: Sequence[str],
                   rewards: Sequence[Sequence[float]], mean_logprobs: Sequence[Sequence[float]],
                   token_logprobs: Sequence[torch.Tensor] | None = None, step: int = 0,
                   metadata: Sequence[Mapping[str, str]] | None = None) -> list[AgentRollout]:
    """`AgentRollout`s of one generate call, in (prompt, sample) order.

    Shapes: `prompts`, `prompt_ids`, `golds`, `metadata`: [B]; `rewards`, `mean_logprobs`: [B][G] — the
    mean log-prob is the trainer's recompute m_old (algorithm.md §4), not the sampler's. `token_logprobs`:
    one shifted-layout row per response (flat order), when the agent's loss needs them.
    """
    num_prompts = len(result.responses)
    for name, values in (("prompts", prompts), ("prompt_ids", prompt_ids), ("golds", golds),
                         ("rewards", rewards), ("mean_logprobs", mean_logprobs)):
        if len(values) != num_prompts:
            raise ValueError(f"{name} has {len(values)} entries for {num_prompts} prompts")
    out: list[AgentRollout] = []
    for b, group in enumerate(result.responses):
        if len(rewards[b]) != len(group) or len(mean_logprobs[b]) != len(group):
            raise ValueError(f"prompt {b}: {len(group)} responses but {len(rewards[b])} rewards and "
                             f"{len(mean_logprobs[b])} mean log-probs")
        messages = as_messages(prompts[b])
        prompt = result.prompt_token_ids[b]
        for g, response in enumerate(group):
            trajectory = Trajectory(
                prompt_id=prompt_ids[b], messages=messages, response_text=response.text, source=source,
                sample_index=g, finish_reason=response.finish_reason, reward=float(rewards[b][g]),
                source_mean_logprob=float(mean_logprobs[b][g]), source_num_tokens=response.num_tokens,
                gold=golds[b], step=step, metadata=dict(metadata[b]) if metadata is not None else {},
            )
            old_tokens = token_logprobs[len(out)] if token_logprobs is not None else None
            out.append(AgentRollout(trajectory=trajectory, token_ids=list(prompt) + list(response.token_ids),
                                    response_mask=[0] * len(prompt) + [1] * response.num_tokens,
                                    old_token_logprobs=old_tokens))
    return out


def rollout_metrics(result: GenerationResult, rewards: Sequence[float]) -> dict[str, float]:
    """One agent's generation numbers of a step: `reward_mean`, `response_length_mean` / `_max` (tokens) and
    `truncation_rate` (share cut at the length limit). `rewards` in flat (prompt, sample) order."""
    responses = result.flat()
    if len(rewards) != len(responses):
        raise ValueError(f"{len(rewards)} rewards for {len(responses)} responses")
    lengths = [r.num_tokens for r in responses]
    return {"reward_mean": sum(rewards) / len(rewards) if rewards else math.nan,
            "response_length_mean": sum(lengths) / len(lengths) if lengths else math.nan,
            "response_length_max": float(max(lengths, default=0)),
            "truncation_rate": sum(r.finish_reason == "length" for r in responses) / max(len(responses), 1)}

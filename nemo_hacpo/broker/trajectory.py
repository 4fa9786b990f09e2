"""Tokenizer-neutral rollout records: what crosses between agents (docs/algorithm.md §7).

A `Trajectory` holds one response as **text** plus the few scalars another agent needs to learn from it:
the reward, how it finished, and the source policy's mean log-prob over the source's own tokens (the
denominator of the cross-sample ratio, algorithm.md §4). Token ids never cross between agents; they stay in the
source's `AgentRollout` (its self samples are trained on exactly the generated ids).

Trajectories serialise to JSONL, one per line, so every step's rollouts can be inspected or replayed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from nemo_hacpo.models.chat import Message, as_messages, messages_as_dicts

FinishReason = Literal["stop", "length"]
FINISH_REASONS = ("stop", "length")


@dataclass(frozen=True)
class Trajectory:
    """One response of one agent to one prompt, without any token ids.

    `source_mean_logprob` = m_j,old(y) = mean over the source's L_j(y) response tokens of
    log π_j,old(y_t | prompt_j, y_<t), recomputed by the source's trainer at the sampling weights (algorithm.md §4).
    """

    prompt_id: str
    """Identifier of the prompt (shared by all n·G responses of its joint group)."""
    messages: tuple[Message, ...]
    """The prompt as chat messages, before any chat template."""
    response_text: str
    """The response, decoded with special tokens skipped (the source's EOS is not in it)."""
    source: str
    """Name of the agent that generated it."""
    sample_index: int
    """Index among the source's G responses to this prompt."""
    finish_reason: FinishReason
    """`stop`: ended with the source's EOS; `length`: cut at the source's max response length."""
    reward: float
    """Verifier reward R(y) ∈ {0, 1} (math-verify, or `reward.function`)."""
    source_mean_logprob: float
    """m_j,old(y): mean log-prob of the response under the source's old policy, on the source's tokens."""
    source_num_tokens: int
    """L_j(y): response tokens in the source's tokenization (EOS included when it finished)."""
    gold: str
    """Gold answer the reward was computed against."""
    step: int = 0
    """Training step that produced it."""
    metadata: Mapping[str, str] = field(default_factory=dict)
    """Free-form extras (e.g. the dataset's problem level)."""

    def __post_init__(self) -> None:
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")
        if not math.isfinite(self.reward) or not math.isfinite(self.source_mean_logprob):
            raise ValueError(f"non-finite reward or log-prob in trajectory {self.prompt_id}/{self.source}")
        if self.source_num_tokens < 0:
            raise ValueError("source_num_tokens must be ≥ 0")
        object.__setattr__(self, "messages", as_messages(self.messages))

    @property
    def finished(self) -> bool:
        return self.finish_reason == "stop"

    def to_json(self) -> str:
        record = asdict(self)
        record["messages"] = messages_as_dicts(self.messages)
        record["metadata"] = dict(self.metadata)
        return json.dumps(record, ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Trajectory:
        record = json.loads(line)
        record["messages"] = as_messages(record["messages"])
        return cls(**record)


def write_jsonl(path: str | Path, trajectories: Iterable[Trajectory]) -> int:
    """Write one JSON object per line (atomically: a temp file renamed into place); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    count = 0
    with tmp.open("w", encoding="utf-8") as fh:
        for trajectory in trajectories:
            fh.write(trajectory.to_json() + "\n")
            count += 1
    tmp.replace(path)
    return count


def read_jsonl(path: str | Path) -> Iterator[Trajectory]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no trajectory file at {path}")
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if line.strip():
                try:
                    yield Trajectory.from_json(line)
                except (ValueError, TypeError, KeyError) as err:
                    raise ValueError(f"{path}:{number}: not a trajectory record: {err}") from err

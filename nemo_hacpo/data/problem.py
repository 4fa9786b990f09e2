"""The one record type every math data source produces.

Generated arithmetic problems, GSM8K and AIME all become :class:`MathProblem`; the prompt builder,
the reward (verifier against ``answer``) and the training iterator only ever see this type.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MathProblem:
    """A question with a verifiable gold answer.

    Attributes:
        id: stable identifier, unique within its source and split, e.g. ``"arith-train-000123"``
            or ``"gsm8k-test-0042"``.
        question: the problem text shown to the model (without any answer-format instruction).
        answer: the gold final answer as a string (``"42"``), compared by the verifier.
        level: difficulty; for generated arithmetic the number of operation steps (1-3), ``None``
            for external data without a level.
        solution: a short worked solution ending with ``\\boxed{answer}`` (supervised warm start);
            ``""`` when the source has none.
        source: where the problem came from (``"arithmetic"``, ``"gsm8k"``, ``"aime2025"``, a file).
        expression: for generated arithmetic, the arithmetic expression whose value is ``answer``
            (e.g. ``"(3 + 4) * 2"``); ``None`` otherwise.
        origin: where the record came from, for messages about it (``"data/train.jsonl:17"``); ``""`` for
            generated problems.
    """

    id: str
    question: str
    answer: str
    level: int | None = None
    solution: str = ""
    source: str = ""
    expression: str | None = None
    origin: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict with every field (inverse of :meth:`from_dict`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> MathProblem:
        """Build from :meth:`to_dict` output; unknown keys are an error, missing optional ones default."""
        field_names = {field.name for field in dataclasses.fields(cls)}
        unknown = set(record) - field_names
        if unknown:
            raise ValueError(f"MathProblem.from_dict: unknown keys {sorted(unknown)}; expected {sorted(field_names)}")
        return cls(**record)

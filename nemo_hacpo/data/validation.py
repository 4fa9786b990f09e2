"""Bad records: found at load time, reported with their file and line, then refused or skipped by policy.

Every data source turns a record into a `MathProblem` or into a `DataIssue` saying where it is (`path:line`,
`path:row 12`) and what is wrong. `apply_policy` decides what happens (`data.on_invalid`):

- `error` (default): `DataError` lists every issue (a run stops at start-up, before any worker starts);
- `skip`: the bad records are dropped, and the log says how many and shows the first few.

The same check runs for training (`HacpoRun`) and for `recipes/evaluate.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from nemo_hacpo.config import ConfigError, ConfigIssue
from nemo_hacpo.data.problem import MathProblem

logger = logging.getLogger(__name__)

Policy = Literal["error", "skip"]
SHOWN_WHEN_SKIPPING = 5


@dataclass(frozen=True)
class DataIssue:
    """One bad record: where it is and what is wrong with it."""

    where: str
    """`path:line` (JSONL), `path:record i` (JSON array), `path:row i` (parquet) or a problem id."""
    problem: str
    problem_id: str | None = None
    """The id of the problem it concerns, when the record became one (e.g. a prompt that is too long)."""

    def __str__(self) -> str:
        return f"{self.where}: {self.problem}"


class DataError(ConfigError):
    """Invalid data: every issue with its file and line, and how to get past it."""

    heading = "invalid data"


def data_error(what: str, issues: Sequence[DataIssue]) -> DataError:
    return DataError([ConfigIssue(what, str(issue), "fix the record, or drop such records: data.on_invalid=skip "
                                  "(recipes/evaluate.py: --on-invalid skip)")
                      for issue in issues])


def apply_policy(problems: Sequence[MathProblem], issues: Sequence[DataIssue], policy: Policy,
                 what: str) -> list[MathProblem]:
    """The problems without the ones `issues` name (by `problem_id`), or DataError under the `error` policy.

    `what` names the data set in messages (`data.train`). Issues without a problem id concern records that never
    became problems (they are already absent)."""
    if policy not in ("error", "skip"):
        raise ValueError(f"unknown policy {policy!r}; use 'error' or 'skip'")
    if not issues:
        return list(problems)
    if policy == "error":
        raise data_error(what, issues)
    dropped = {issue.problem_id for issue in issues if issue.problem_id is not None}
    kept = [p for p in problems if p.id not in dropped]
    shown = "; ".join(str(issue) for issue in issues[:SHOWN_WHEN_SKIPPING])
    more = f" (+{len(issues) - SHOWN_WHEN_SKIPPING} more)" if len(issues) > SHOWN_WHEN_SKIPPING else ""
    logger.warning("%s: skipped %d invalid record(s) (data.on_invalid=skip): %s%s", what, len(issues), shown, more)
    if not kept:
        raise DataError([ConfigIssue(what, f"every record is invalid ({len(issues)}; the first: {issues[0]})",
                                     "fix the data")])
    return kept

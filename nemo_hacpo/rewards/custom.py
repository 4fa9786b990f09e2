"""A reward function of the user's: `reward.function: my_project.rewards:score` instead of math-verify.

The function scores one answer::

    def score(response: str, gold: str) -> bool:    # correct or not (True/False, or 1/0)
        ...

It runs where math-verify would (`MathRewardScorer`: the reward worker processes, or the driver with
`reward.num_workers=0`), under the same guards: the response keeps its last `reward.max_response_chars`
characters; `reward.timeout_s` bounds each call (SIGALRM inside the worker, and a worker that does not answer
within the time limit plus a grace is killed and replaced). Whatever goes wrong with one answer scores it 0 and
never stops the run: an exception (`error`, its type and message in the detail), a timeout (`timeout`), a value
other than True/False/1/0 (`error`). The driver logs the first of each kind (`MathRewardScorer._record`).

The reward is a verdict, not a score: HACPO's capability estimate is each agent's accuracy (the share of its
responses that are correct, docs/algorithm.md §1) and the held-out pass@k counts correct answers, so partial
credit has no meaning there. A response that is not correct is `wrong` in the reason counts. The function is imported at start-up by the config check (`resolve_reward_function`): a wrong path, a missing
attribute or a signature that cannot take `(response, gold)` stops the run naming `reward.function`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Protocol

from nemo_hacpo.rewards.extract import truncate_tail
from nemo_hacpo.rewards.guards import AnswerTimeout, alarm_time_limit
from nemo_hacpo.rewards.math import RewardReason, ScoredAnswer, coerce_text

logger = logging.getLogger(__name__)

KEY = "reward.function"


class RewardFunction(Protocol):
    """What `reward.function` names: whether one answer is correct (True/False, or 1/0)."""

    def __call__(self, response: str, gold: str) -> bool | int | float: ...


@dataclass(frozen=True)
class CustomAnswer:
    """One answer for a reward function (plain, picklable: it travels to a worker process).

    Attributes:
        response: the response's text, cut to its last `max_response_chars` characters.
        gold: the gold answer as the data set gives it.
        truncated: the response was cut.
    """

    response: str
    gold: str
    truncated: bool = False


def custom_answer(response: object, gold: object, max_response_chars: int) -> CustomAnswer | ScoredAnswer:
    """The function's input (the response cut to its last `max_response_chars` characters, as for math-verify), or
    a verdict when there is nothing to score: no gold (`invalid_gold`), no response (`empty`), a value that is
    neither text nor bytes (`error`)."""
    texts: list[str | None] = []
    for value, name in ((response, "response"), (gold, "gold")):
        text = coerce_text(value)  # bytes decoded as math-verify's inputs are
        if value is not None and text is None:
            return ScoredAnswer.of(RewardReason.ERROR, detail=f"{name} of type {type(value).__name__}")
        texts.append(text)
    text, gold_text = texts
    if gold_text is None or not gold_text.strip():
        return ScoredAnswer.of(RewardReason.INVALID_GOLD, detail="empty gold")
    if text is None or not text.strip():
        return ScoredAnswer.of(RewardReason.EMPTY)
    kept, truncated = truncate_tail(text, max_response_chars)
    return CustomAnswer(kept, gold_text, truncated)


def _load_module(module_name: str) -> ModuleType:
    """An importable module by name, or a Python file by path (`rewards.py`, `/abs/dir/rewards.py`: loaded under a
    name of its own, so that each reward process loads the same file the same way)."""
    if not module_name.endswith(".py"):
        return importlib.import_module(module_name)
    path = Path(module_name).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no file at {path}")
    name = f"_nemo_hacpo_reward_{abs(hash(str(path))):x}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except BaseException:
        del sys.modules[name]
        raise
    return module


def resolve_reward_function(spec: str) -> RewardFunction:
    """The callable that `module:function` or `path/to/file.py:function` names (dotted attributes allowed after
    the colon); ValueError saying what is wrong (the format, the import, the attribute, not callable, a signature
    that cannot take `(response, gold)`)."""
    module_name, sep, attribute = spec.rpartition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{spec!r} is not `module:function` or `file.py:function` (e.g. my_project.rewards:score)")
    try:
        target: object = _load_module(module_name)
    except Exception as err:  # noqa: BLE001 - any failure of the user's module is reported, not raised
        where = ("a module must be importable: on PYTHONPATH" if not module_name.endswith(".py") else
                 "a relative path is read from the working directory")
        raise ValueError(f"cannot load {module_name!r}: {type(err).__name__}: {err} ({where})") from err
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{spec} is not a function (its type: {type(target).__name__})")
    try:
        inspect.signature(target).bind("response", "gold")
    except TypeError as err:
        raise ValueError(f"{spec} cannot be called as f(response: str, gold: str) -> float: {err}") from err
    except ValueError:  # a builtin without a signature: trust it
        pass
    return target  # type: ignore[return-value]


def score_custom(function: Callable[[str, str], object], answer: CustomAnswer, timeout_s: float | None,
                 *, delay_s: float = 0.0) -> ScoredAnswer:
    """`function(answer.response, answer.gold)` under a SIGALRM time limit (main thread only) → a verdict; never
    raises. `delay_s` (tests): sleep that long inside the limit first, an answer slow by construction."""
    truncated = answer.truncated
    try:
        with alarm_time_limit(timeout_s):
            if delay_s > 0:
                time.sleep(delay_s)
            value = function(answer.response, answer.gold)
    except AnswerTimeout:
        return ScoredAnswer.of(RewardReason.TIMEOUT, truncated, f"exceeded {timeout_s} s")
    except MemoryError:
        return ScoredAnswer.of(RewardReason.ERROR, truncated, "reward function: out of memory")
    except Exception as err:  # noqa: BLE001 - the user's function must not stop the run
        return ScoredAnswer.of(RewardReason.ERROR, truncated, f"reward function raised {type(err).__name__}: {err}")
    if isinstance(value, bool) or (isinstance(value, (int, float)) and value in (0, 1)):
        return ScoredAnswer.of(RewardReason.CORRECT if value else RewardReason.WRONG, truncated)
    return ScoredAnswer.of(RewardReason.ERROR, truncated,
                           f"reward function returned {value!r:.80}; it must return True/False (or 1/0)")

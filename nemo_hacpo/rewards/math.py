"""Math answer verification against a gold answer with math-verify: ``R(y) ∈ {0, 1}``.

One answer goes through two stages, split so that a process pool can run the second one in a worker
that may be killed (:mod:`nemo_hacpo.rewards.scorer`):

1. :func:`prepare_answer` (cheap, pure string work, runs in the caller): coerce and clean the text,
   keep the last ``max_response_chars``, extract the answer and apply the string guards. It returns
   either a finished :class:`ScoredAnswer` (empty, no answer, rejected, invalid gold) or a
   :class:`PreparedAnswer` to verify.
2. :func:`verify_prepared` (sympy work, may be slow): parse gold and answer with math-verify, refuse
   over-large expressions, ``verify``.

Grading modes:

- **strict** (training default): only the LAST ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed 5``)
  counts, extracted by :func:`nemo_hacpo.rewards.extract.extract_last_boxed`; no box → 0.
- **lenient**: the last ``\\boxed{...}`` when the response has one (math-verify alone would read several
  boxes as a set); otherwise math-verify's own extraction over the whole (truncated) response: LaTeX
  environments, "final answer is ...", plain numbers and expressions, where its rightmost answer-like match wins.

A gold answer written in words (``"four apples"``) is ``invalid_gold``: math-verify would read it as a product
of single letters and compare nonsense.

Semantics inherited from math-verify (``verify(gold, answer)``, ``float_rounding=6``): a float equals a
rational when both round to the same 6 decimals (``0.333333 == 1/3`` but ``0.333 != 1/3``);
``\\frac{1}{2} == 0.5 == 1/2``; ``x = 5`` against gold ``5`` compares the right-hand side; units in
``\\text{}`` and a leading ``\\$`` are dropped (``5 \\text{ cm} == 5``); ``5%`` equals both 5 and 0.05;
``1,234 == 1234``; ``\\pi != 3.14159``.

Every 0 carries a :class:`RewardReason`, so a training step can log why answers failed.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from dataclasses import dataclass
from enum import StrEnum

import math_verify.grader
import math_verify.parser
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException as MathVerifyTimeout

from nemo_hacpo.rewards.extract import (
    clean_text,
    extract_last_boxed,
    max_bracket_depth,
    normalize_answer_text,
    truncate_tail,
)
from nemo_hacpo.rewards.guards import AnswerTimeout, alarm_time_limit, expression_size_error

__all__ = [
    "DEFAULT_LIMITS",
    "PreparedAnswer",
    "RewardReason",
    "ScoredAnswer",
    "VerifyLimits",
    "prepare_answer",
    "score_math",
    "score_math_detailed",
    "score_prepared",
    "verify_prepared",
]

logger = logging.getLogger(__name__)

# We always bound the time ourselves (SIGALRM in a main thread, a killable worker process otherwise),
# so math-verify's "timeout is disabled" warning would only be noise in every worker.
math_verify.parser.TIMEOUT_WARNING_SHOWN = True
math_verify.grader.TIMEOUT_WARNING_SHOWN = True

_EXTRACTION_TARGETS = (LatexExtractionConfig(), ExprExtractionConfig())
_PLAIN_INTEGER_RE = re.compile(r"[+-]?[0-9]{1,1000}")  # ASCII digits only
_LATEX_TEXT_RE = re.compile(r"\\(?:text|mathrm|textbf|operatorname|mbox)\s*\{[^{}]*\}|\\[A-Za-z]+")
"""LaTeX commands and the text inside \\text{} (units, which math-verify drops): not words of a gold."""
_WORD_RE = re.compile(r"[A-Za-z]{3,}")
_NUMBER_WORDS = frozenset({
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty", "thirty", "forty",
    "fifty", "sixty", "seventy", "eighty", "ninety", "hundred", "thousand", "million", "billion", "half", "quarter",
})
"""A gold that is a number in words (`four`) is invalid: the model's `4` would score wrong. One other word (`abc`,
`even`, `yes`) stays a gold: math-verify compares it symbolically, the same on both sides; a phrase does not."""
_MATH_WORDS = frozenset({
    "sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "log", "ln",
    "exp", "sqrt", "max", "min", "gcd", "lcm", "mod", "det", "inf", "sup", "lim", "deg", "pmod",
})
"""Letter runs of three or more that are mathematics, not words (e.g. `\\sin` written without its backslash)."""


class RewardReason(StrEnum):
    """Why an answer got its reward. Only ``CORRECT`` pays 1.0."""

    CORRECT = "correct"
    WRONG = "wrong"  # parsed, compared, not equal
    NO_ANSWER = "no_answer"  # strict: no / malformed / empty box; lenient: nothing answer-like
    UNPARSABLE = "unparsable"  # an answer was extracted but math-verify could not parse it
    EMPTY = "empty"  # empty or whitespace-only response (or None)
    REJECTED = "rejected"  # refused by a guard: too long, nested too deeply, numbers too large
    TIMEOUT = "timeout"  # verification exceeded its time limit
    INVALID_GOLD = "invalid_gold"  # the gold answer is empty or math-verify cannot parse it (data error)
    ERROR = "error"  # unexpected failure (a bug, a dead worker, memory exhaustion)


@dataclass(frozen=True)
class VerifyLimits:
    """Guards applied to every answer. Defaults suit short final answers of math problems.

    Attributes:
        max_response_chars: keep only the last this many characters of a response (<= 0: keep all).
        max_answer_chars: longer extracted answers (strict mode) and golds are refused.
        max_bracket_depth: deeper nesting of ``{}()[]`` is refused (math-verify/sympy are exponential
            in ``\\frac`` nesting: depth 15 takes ~1 s, depth 20 > 5 s).
        max_number_digits: refuse expressions where a number may exceed this many decimal digits
            (``2^{2024}`` has 610; ``10^{10^{10}}`` would have 10^10).
        max_expression_nodes: refuse parsed expressions with more sympy nodes than this.
        float_rounding: decimals compared when a float is involved (math-verify's ``float_rounding``).
        numeric_precision: significant digits of math-verify's numeric comparison.
    """

    max_response_chars: int = 16_384
    max_answer_chars: int = 1_000
    max_bracket_depth: int = 12
    max_number_digits: int = 10_000
    max_expression_nodes: int = 2_000
    float_rounding: int = 6
    numeric_precision: int = 15


DEFAULT_LIMITS = VerifyLimits()


@dataclass(frozen=True)
class ScoredAnswer:
    """The verdict for one response.

    Attributes:
        reward: 1.0 when ``reason is CORRECT`` else 0.0.
        reason: why.
        truncated: the response was longer than ``max_response_chars`` and was cut (any reason).
        detail: a short human-readable note for the non-obvious reasons (never the full text).
    """

    reward: float
    reason: RewardReason
    truncated: bool = False
    detail: str = ""

    @classmethod
    def of(cls, reason: RewardReason, truncated: bool = False, detail: str = "") -> ScoredAnswer:
        return cls(1.0 if reason is RewardReason.CORRECT else 0.0, reason, truncated, detail[:200])


@dataclass(frozen=True)
class PreparedAnswer:
    """An answer that passed the string guards, ready for math-verify (plain, picklable).

    Attributes:
        answer_text: strict: the normalised content of the last box; lenient: the cleaned response tail.
        gold_text: the normalised gold answer.
        strict: grading mode.
        truncated: the response was cut to ``max_response_chars``.
    """

    answer_text: str
    gold_text: str
    strict: bool
    truncated: bool = False


def coerce_text(value: object) -> str | None:
    """``str`` as is, ``bytes`` decoded leniently, ``None``/other types -> ``None``."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    return None


def _prepare_gold(gold: object, limits: VerifyLimits) -> str | ScoredAnswer:
    gold_raw = coerce_text(gold)
    if gold_raw is None:
        return ScoredAnswer.of(RewardReason.INVALID_GOLD, detail=f"gold of type {type(gold).__name__}")
    gold_text = normalize_answer_text(clean_text(gold_raw[: 4 * limits.max_answer_chars]))
    if not gold_text:
        return ScoredAnswer.of(RewardReason.INVALID_GOLD, detail="empty gold")
    if len(gold_text) > limits.max_answer_chars or max_bracket_depth(gold_text) > limits.max_bracket_depth:
        return ScoredAnswer.of(RewardReason.INVALID_GOLD, detail="gold too long or nested too deeply")
    words = [w for w in _WORD_RE.findall(_LATEX_TEXT_RE.sub(" ", gold_text)) if w.lower() not in _MATH_WORDS]
    if len(words) > 1 or any(w.lower() in _NUMBER_WORDS for w in words):
        return ScoredAnswer.of(RewardReason.INVALID_GOLD, detail=f"gold is written in words ({' '.join(words)!r}): "
                               "math-verify would read it as a product of single letters")
    return gold_text


def prepare_answer(
    response: object, gold: object, strict: bool = True, limits: VerifyLimits = DEFAULT_LIMITS
) -> PreparedAnswer | ScoredAnswer:
    """Clean, truncate and extract; return a finished verdict when no parsing is needed.

    Order of checks: gold (invalid_gold) → response type/emptiness (error/empty) → extraction
    (no_answer) → answer length and bracket depth (rejected). Linear time in ``len(response)``.
    """
    gold_text = _prepare_gold(gold, limits)
    if isinstance(gold_text, ScoredAnswer):
        return gold_text
    if response is None:
        return ScoredAnswer.of(RewardReason.EMPTY, detail="response is None")
    response_raw = coerce_text(response)
    if response_raw is None:
        return ScoredAnswer.of(RewardReason.ERROR, detail=f"response of type {type(response).__name__}")
    response_tail, truncated = truncate_tail(response_raw, limits.max_response_chars)
    response_text = clean_text(response_tail)
    if not response_text.strip():
        return ScoredAnswer.of(RewardReason.EMPTY, truncated)

    if strict:
        boxed = extract_last_boxed(response_text, max_unbraced_chars=limits.max_answer_chars + 1)
        if boxed is None:
            return ScoredAnswer.of(RewardReason.NO_ANSWER, truncated, "no \\boxed answer")
        if boxed.content is None:
            return ScoredAnswer.of(RewardReason.NO_ANSWER, truncated, "malformed last \\boxed")
        answer_text = normalize_answer_text(boxed.content)
        if not answer_text:
            return ScoredAnswer.of(RewardReason.NO_ANSWER, truncated, "empty \\boxed")
        if len(answer_text) > limits.max_answer_chars:
            return ScoredAnswer.of(
                RewardReason.REJECTED, truncated, f"answer longer than {limits.max_answer_chars} chars"
            )
        if _PLAIN_INTEGER_RE.fullmatch(answer_text) and _PLAIN_INTEGER_RE.fullmatch(gold_text):
            # Fast path with math-verify's semantics (integers compare exactly; "+5" == "005" == 5):
            # integer answers dominate arithmetic tasks and skip sympy entirely.
            is_equal = int(answer_text) == int(gold_text)
            return ScoredAnswer.of(RewardReason.CORRECT if is_equal else RewardReason.WRONG, truncated)
    else:
        # lenient: the last well-formed box when there is one (several boxes would otherwise be read as a set);
        # else math-verify's own extraction over the whole text, where its rightmost answer-like match wins
        boxed = extract_last_boxed(response_text, max_unbraced_chars=limits.max_answer_chars + 1)
        box = normalize_answer_text(boxed.content) if boxed is not None and boxed.content is not None else ""
        answer_text = f"${box}$" if box and len(box) <= limits.max_answer_chars else response_text
    depth = max_bracket_depth(answer_text)
    if depth > limits.max_bracket_depth:
        return ScoredAnswer.of(
            RewardReason.REJECTED, truncated, f"bracket depth {depth} > {limits.max_bracket_depth}"
        )
    return PreparedAnswer(answer_text=answer_text, gold_text=gold_text, strict=strict, truncated=truncated)


def _parse_math(text: str) -> list:
    """math-verify ``parse`` with our extraction targets; no own timeout (the caller bounds time)."""
    return parse(
        text,
        extraction_config=_EXTRACTION_TARGETS,
        fallback_mode="no_fallback",
        extraction_mode="any_match",
        parsing_timeout=None,
        raise_on_error=True,
    )


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold_text: str, max_number_digits: int, max_expression_nodes: int) -> tuple[list, str]:
    """Parsed gold (cached: the G responses of a prompt share it) and an error note ("" when valid)."""
    try:
        parsed = _parse_math(f"${gold_text}$")
    except Exception as exc:  # noqa: BLE001 - any parser failure means the gold is unusable
        return [], f"gold parse failed: {type(exc).__name__}"
    if not parsed:
        return [], "math-verify cannot parse the gold"
    size_error = expression_size_error(parsed, max_number_digits, max_expression_nodes)
    if size_error is not None:
        return [], f"gold too large: {size_error}"
    return parsed, ""


def verify_prepared(prepared: PreparedAnswer, limits: VerifyLimits = DEFAULT_LIMITS) -> ScoredAnswer:
    """Parse gold and answer with math-verify and compare them. No time limit of its own.

    May raise :class:`AnswerTimeout` (from an enclosing :func:`alarm_time_limit`); other failures are
    turned into verdicts. Use :func:`score_prepared` for a bounded, never-raising call.
    """
    truncated = prepared.truncated
    gold_parsed, gold_error = _parse_gold(
        prepared.gold_text, limits.max_number_digits, limits.max_expression_nodes
    )
    if gold_error:
        return ScoredAnswer.of(RewardReason.INVALID_GOLD, truncated, gold_error)

    # Strict: the box content is one answer; "$...$" lets math-verify read "5\%"/"\$5"/"x = 5" as math.
    answer_source = f"${prepared.answer_text}$" if prepared.strict else prepared.answer_text
    try:
        answer_parsed = _parse_math(answer_source)
    except Exception as exc:  # noqa: BLE001 - a parser crash on model output is an unparsable answer
        return ScoredAnswer.of(RewardReason.UNPARSABLE, truncated, f"parse failed: {type(exc).__name__}")
    if not answer_parsed:
        reason = RewardReason.UNPARSABLE if prepared.strict else RewardReason.NO_ANSWER
        return ScoredAnswer.of(reason, truncated, "math-verify extracted nothing")
    size_error = expression_size_error(answer_parsed, limits.max_number_digits, limits.max_expression_nodes)
    if size_error is not None:
        return ScoredAnswer.of(RewardReason.REJECTED, truncated, size_error)

    is_equal = verify(
        gold_parsed,
        answer_parsed,
        float_rounding=limits.float_rounding,
        numeric_precision=limits.numeric_precision,
        timeout_seconds=None,
        raise_on_error=False,  # a sympy comparison error means "not equal", as in math-verify
    )
    return ScoredAnswer.of(RewardReason.CORRECT if is_equal else RewardReason.WRONG, truncated)


def gold_problem(gold: object, limits: VerifyLimits = DEFAULT_LIMITS, timeout_s: float | None = 5.0) -> str | None:
    """Why math-verify cannot use `gold` as a gold answer (every answer checked against it would score 0,
    `invalid_gold`), or None when it can. Checked at start-up over a whole data set: integers take a fast path,
    other golds are parsed once (cached for scoring) under `timeout_s` (SIGALRM, main thread)."""
    prepared = _prepare_gold(gold, limits)
    if isinstance(prepared, ScoredAnswer):
        return prepared.detail
    if _PLAIN_INTEGER_RE.fullmatch(prepared):
        return None
    try:
        with alarm_time_limit(timeout_s):
            _, error = _parse_gold(prepared, limits.max_number_digits, limits.max_expression_nodes)
    except (AnswerTimeout, MathVerifyTimeout):
        return f"parsing it took over {timeout_s} s"
    return error or None


def score_prepared(
    prepared: PreparedAnswer, limits: VerifyLimits = DEFAULT_LIMITS, timeout_s: float | None = 5.0, *,
    delay_s: float = 0.0,
) -> ScoredAnswer:
    """:func:`verify_prepared` under a SIGALRM time limit (main thread only); never raises.

    Off the main thread no limit can be armed: the call then relies on the static guards alone, so run
    untrusted answers through :class:`nemo_hacpo.rewards.scorer.MathRewardScorer` workers there.
    `delay_s` (tests) sleeps that long inside the time limit first: an answer slow by construction.
    """
    try:
        with alarm_time_limit(timeout_s):
            if delay_s > 0:
                time.sleep(delay_s)
            return verify_prepared(prepared, limits)
    except (AnswerTimeout, MathVerifyTimeout):
        return ScoredAnswer.of(RewardReason.TIMEOUT, prepared.truncated, f"exceeded {timeout_s} s")
    except RecursionError:
        return ScoredAnswer.of(RewardReason.REJECTED, prepared.truncated, "recursion limit")
    except MemoryError:
        return ScoredAnswer.of(RewardReason.ERROR, prepared.truncated, "out of memory")
    except Exception as exc:  # noqa: BLE001 - the verifier must never raise on any content
        logger.exception("math verification failed unexpectedly")
        return ScoredAnswer.of(RewardReason.ERROR, prepared.truncated, f"{type(exc).__name__}: {exc}"[:200])


def score_math_detailed(
    response: object,
    gold: object,
    strict: bool = True,
    *,
    limits: VerifyLimits = DEFAULT_LIMITS,
    timeout_s: float | None = 5.0,
) -> ScoredAnswer:
    """Score one response in this process: reward, reason and whether the input was truncated.

    The time limit uses SIGALRM and therefore works only in the main thread (see :func:`score_prepared`).
    Never raises for any response or gold content.
    """
    try:
        prepared = prepare_answer(response, gold, strict=strict, limits=limits)
    except Exception as exc:  # noqa: BLE001
        logger.exception("answer preparation failed unexpectedly")
        return ScoredAnswer.of(RewardReason.ERROR, detail=f"prepare: {type(exc).__name__}")
    scored = prepared if isinstance(prepared, ScoredAnswer) else score_prepared(prepared, limits, timeout_s)
    if scored.reason is RewardReason.INVALID_GOLD:
        logger.warning("invalid gold answer %r: %s", str(gold)[:100], scored.detail)
    return scored


def score_math(
    response: str,
    gold: str,
    strict: bool = True,
    *,
    limits: VerifyLimits = DEFAULT_LIMITS,
    timeout_s: float | None = 5.0,
) -> float:
    """1.0 if ``response`` answers ``gold`` correctly, else 0.0; never raises.

    Example: ``score_math("so \\\\boxed{\\\\frac{1}{2}}", "0.5") == 1.0``;
    ``score_math("the answer is 0.5", "0.5") == 0.0`` (strict: no box), ``== 1.0`` with ``strict=False``.
    """
    return score_math_detailed(response, gold, strict, limits=limits, timeout_s=timeout_s).reward

"""Guards that keep one adversarial answer from hanging or exhausting a verifier.

Two layers (the process pool in :mod:`nemo_hacpo.rewards.scorer` adds a third, a hard kill):

- :func:`expression_size_error` walks a parsed sympy expression and refuses it when it has too many
  nodes or when an upper bound on the size of a number in it is too large. ``10^{10^{10}}`` parses in
  milliseconds as an unevaluated power, but math-verify's numeric comparison then calls ``doit()``,
  which tries to build a ten-billion-digit integer.
- :func:`alarm_time_limit` raises :class:`AnswerTimeout` after a wall-clock limit via ``SIGALRM``. Only
  the main thread of a process can own signals, so off the main thread it arms nothing.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sympy import Add, Basic, Float, MatrixBase, Mul, Pow, Rational, exp
from sympy.functions.combinatorial.factorials import (
    FallingFactorial,
    RisingFactorial,
    binomial,
    factorial,
    factorial2,
    subfactorial,
)
from sympy.functions.special.gamma_functions import gamma

__all__ = ["AnswerTimeout", "alarm_time_limit", "expression_size_error", "log10_magnitude_bound"]

_LOG10_2 = math.log10(2.0)
_LOG10_E = math.log10(math.e)
# Functions whose value at n grows like n^n: bound log10 f(n) by n * log10 n.
_FACTORIAL_LIKE = (factorial, factorial2, subfactorial, gamma, RisingFactorial, FallingFactorial, binomial)
# Past 10^300 digits every bound is "infinitely" over any sane limit; avoids float overflow.
_MAX_FINITE_LOG10 = 300.0


class AnswerTimeout(BaseException):
    """An answer exceeded its verification time limit.

    A ``BaseException`` (like math-verify's own ``TimeoutException``) so that the many
    ``except Exception`` blocks inside math-verify and sympy do not swallow it.
    """


class _TooLarge(Exception):
    pass


def _int_log10(value: int) -> float:
    """log10 |value| for a Python int of any size (0 for |value| < 2), without float overflow."""
    value = abs(value)
    if value < 2:
        return 0.0
    if value.bit_length() < 1000:
        return math.log10(value)
    return value.bit_length() * _LOG10_2


def _pow10(log10_value: float) -> float:
    """10 ** log10_value, saturating at +inf instead of overflowing."""
    return math.inf if log10_value > _MAX_FINITE_LOG10 else 10.0**log10_value


class _Walk:
    """Counts visited nodes so that a huge tree is refused before it is fully walked."""

    def __init__(self, max_nodes: int, max_depth: int) -> None:
        self.max_nodes = max_nodes
        self.max_depth = max_depth
        self.nodes = 0

    def bound(self, expr: object, depth: int) -> float:
        self.nodes += 1
        if self.nodes > self.max_nodes:
            raise _TooLarge(f"more than {self.max_nodes} expression nodes")
        if depth > self.max_depth:
            raise _TooLarge(f"expression nested deeper than {self.max_depth}")
        if isinstance(expr, MatrixBase):
            return max((self.bound(element, depth + 1) for element in expr), default=0.0)
        if isinstance(expr, (list, tuple)):
            return max((self.bound(element, depth + 1) for element in expr), default=0.0)
        if not isinstance(expr, Basic):
            return 0.0
        if isinstance(expr, Rational):  # includes Integer
            return max(_int_log10(expr.p), _int_log10(expr.q))
        if isinstance(expr, Float):
            _sign, mantissa, exponent, bit_count = expr._mpf_
            return 0.0 if mantissa == 0 else abs(exponent + bit_count) * _LOG10_2
        if not expr.args:  # symbols, pi, E, I, oo, nan: treated as magnitude ~10
            return 1.0
        arg_bounds = [self.bound(arg, depth + 1) for arg in expr.args]
        if isinstance(expr, Add):
            return max(arg_bounds) + math.log10(len(arg_bounds))
        if isinstance(expr, Mul):
            return sum(arg_bounds)
        if isinstance(expr, Pow):
            base_bound, exponent_bound = arg_bounds
            # A symbolic base is counted as >= 10 so that (x+1)^{10^{10}} is refused (sympy may expand it).
            base_magnitude = base_bound if expr.base.is_number else max(base_bound, 1.0)
            return _pow10(exponent_bound) * base_magnitude
        if isinstance(expr, exp):
            return _pow10(arg_bounds[0]) * _LOG10_E
        if isinstance(expr, _FACTORIAL_LIKE):
            n_bound = max(arg_bounds)
            return _pow10(n_bound) * max(n_bound, 1.0)
        return max(arg_bounds)  # functions, relations, sets, tuples: as large as their largest part


def log10_magnitude_bound(expr: object, max_nodes: int = 100_000, max_depth: int = 200) -> float:
    """Upper bound on ``|log10 |x||`` over every number ``x`` the expression can evaluate to.

    Recurrences (``m`` = bound, symbols count as 1):
    ``m(p/q) = max(log10|p|, log10 q)``, ``m(a+b) = max(m(a), m(b)) + log10 2``, ``m(a*b) = m(a) + m(b)``,
    ``m(b^e) = 10^{m(e)} * m(b)``, ``m(e^x) = 10^{m(x)} * log10 e``, ``m(n!) = 10^{m(n)} * m(n)``.

    Example: ``m(2^{2024}) = 2024 * log10 2 ≈ 609.3`` (the number has 610 digits);
    ``m(10^{10^{10}}) = 10^{10}``. Raises nothing; returns ``inf`` when the walk is refused.
    """
    try:
        return _Walk(max_nodes, max_depth).bound(expr, 0)
    except (_TooLarge, RecursionError):
        return math.inf


def expression_size_error(
    expr: object, max_digits: float, max_nodes: int, max_depth: int = 200
) -> str | None:
    """Why ``expr`` is too large to verify safely, or ``None`` when it is fine.

    Refuses more than ``max_nodes`` nodes, nesting deeper than ``max_depth``, and any number bound
    (see :func:`log10_magnitude_bound`) above ``max_digits`` decimal digits.
    """
    walk = _Walk(max_nodes, max_depth)
    try:
        digits = walk.bound(expr, 0)
    except _TooLarge as too_large:
        return str(too_large)
    except RecursionError:
        return "expression nested too deeply"
    if digits > max_digits:
        return f"a number may have ~{digits:.3g} digits (limit {max_digits:g})"
    return None


@contextmanager
def alarm_time_limit(seconds: float | None) -> Iterator[bool]:
    """Raise :class:`AnswerTimeout` in the body once ``seconds`` of wall-clock time have passed.

    Yields whether a limit is armed: ``False`` when ``seconds`` is ``None``/``<= 0`` or when the caller
    is not the main thread (signals cannot be used there; bound the time from outside, e.g. with a
    worker process). An interval timer that was already running (pytest-timeout, an outer limit) is
    restored afterwards with its remaining time.
    """
    if (
        seconds is None
        or seconds <= 0
        or not hasattr(signal, "setitimer")
        or threading.current_thread() is not threading.main_thread()
    ):
        yield False
        return

    def _on_alarm(signum: int, frame: object) -> None:
        raise AnswerTimeout(f"answer verification exceeded {seconds:g} s")

    previous_handler = signal.signal(signal.SIGALRM, _on_alarm)
    started = time.monotonic()
    previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield True
    finally:
        while True:  # an alarm landing inside this cleanup must not leave our handler installed
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous_handler)
                if previous_delay > 0:
                    remaining = max(previous_delay - (time.monotonic() - started), 1e-3)
                    signal.setitimer(signal.ITIMER_REAL, remaining, previous_interval)
                break
            except AnswerTimeout:
                continue

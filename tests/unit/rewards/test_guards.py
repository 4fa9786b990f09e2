"""Expression-size bound and the SIGALRM time limit, with hand-computed bounds."""

from __future__ import annotations

import math
import signal
import threading
import time

import pytest
import sympy
from sympy import Float, Integer, Matrix, Pow, Rational, Symbol, factorial

from nemo_hacpo.rewards.guards import (
    AnswerTimeout,
    alarm_time_limit,
    expression_size_error,
    log10_magnitude_bound,
)

x = Symbol("x")
LOG10_2 = math.log10(2)


def _unevaluated_pow(base: int, exponent: object) -> Pow:
    return Pow(Integer(base), exponent, evaluate=False)


@pytest.mark.parametrize(
    ("expr", "bound"),
    [
        (Integer(12345), math.log10(12345)),
        (Rational(3, 4000), math.log10(4000)),  # |log10(3/4000)| <= log10 4000
        (Integer(1), 0.0),
        (x, 1.0),  # a symbol counts as magnitude 10
        (sympy.Mul(2, 3, x, evaluate=False), LOG10_2 + math.log10(3) + 1.0),
        (sympy.Add(Integer(100), Integer(1000), evaluate=False), 3.0 + LOG10_2),
        (_unevaluated_pow(2, Integer(2024)), 2024 * LOG10_2),  # 2^2024 has 610 digits
        (_unevaluated_pow(10, _unevaluated_pow(10, Integer(10))), 1e10),
        (Pow(x + 1, Integer(100), evaluate=False), 100 * (1.0 + LOG10_2)),
        (factorial(Integer(10**6), evaluate=False), 1e6 * 6.0),
        (sympy.exp(Integer(1000), evaluate=False), 1000 * math.log10(math.e)),
        (Matrix([[1, 10], [100, 1000]]), 3.0),
        ([Integer(5), Integer(10**20)], 20.0),
    ],
)
def test_log10_magnitude_bound_hand_computed(expr: object, bound: float) -> None:
    assert log10_magnitude_bound(expr) == pytest.approx(bound, rel=1e-9)


def test_float_bound_uses_binary_exponent() -> None:
    # 1e-300 = m * 2^e with e + bitcount(m) = ceil(log2 1e-300) = -996 -> 996 * log10 2 ≈ 299.83
    assert log10_magnitude_bound(Float("1e-300")) == pytest.approx(996 * LOG10_2, rel=1e-12)
    assert log10_magnitude_bound(Float("1e300")) == pytest.approx(997 * LOG10_2, rel=1e-12)
    assert log10_magnitude_bound(Float(0)) == 0.0


def test_tower_saturates_to_infinity() -> None:
    tower = _unevaluated_pow(10, _unevaluated_pow(10, _unevaluated_pow(10, Integer(10))))
    assert log10_magnitude_bound(tower) == math.inf


def test_expression_size_error_messages() -> None:
    assert expression_size_error(_unevaluated_pow(2, Integer(2024)), 10_000, 100) is None
    too_big = expression_size_error(_unevaluated_pow(10, _unevaluated_pow(10, Integer(10))), 10_000, 100)
    assert too_big is not None and "digits" in too_big
    wide = sympy.Add(*[Symbol(f"a{i}") for i in range(50)], evaluate=False)
    assert expression_size_error(wide, 10_000, 20) == "more than 20 expression nodes"
    deep: object = x
    for _ in range(30):
        deep = sympy.sin(deep)
    assert expression_size_error(deep, 10_000, 1000, max_depth=10) == "expression nested deeper than 10"


def test_answer_timeout_is_not_an_exception() -> None:
    """math-verify and sympy catch Exception all over; the timeout must pass through them."""
    assert issubclass(AnswerTimeout, BaseException) and not issubclass(AnswerTimeout, Exception)


def test_alarm_interrupts_python_work() -> None:
    # the loop ends only through the alarm: reaching the asserts below is the proof
    with pytest.raises(AnswerTimeout):
        with alarm_time_limit(0.2) as armed:
            assert armed
            try:
                while True:
                    sum(range(1000))
            except Exception:  # noqa: BLE001 - shows that `except Exception` does not swallow it
                pytest.fail("AnswerTimeout was caught as an Exception")
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_alarm_restores_an_outer_timer() -> None:
    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    try:
        started = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        with alarm_time_limit(5.0):
            time.sleep(0.05)
        remaining, _interval = signal.getitimer(signal.ITIMER_REAL)
        elapsed = time.monotonic() - started
        # the outer timer still runs, minus the time that passed (however long that was on this machine)
        assert remaining == pytest.approx(1.0 - elapsed, abs=0.05) and fired == []
        time.sleep(remaining + 0.5)
        assert fired == [signal.SIGALRM]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_alarm_is_not_armed_off_the_main_thread() -> None:
    armed: list[bool] = []

    def run() -> None:
        with alarm_time_limit(0.1) as is_armed:
            armed.append(is_armed)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert armed == [False]


@pytest.mark.parametrize("seconds", [None, 0, -1.0])
def test_alarm_disabled_values(seconds: float | None) -> None:
    with alarm_time_limit(seconds) as armed:
        assert not armed

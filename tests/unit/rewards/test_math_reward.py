"""score_math / score_math_detailed: a table of tricky answers, each with the reward AND the reason.

Decisions pinned here (see nemo_hacpo/rewards/math.py):
- strict: only the last \\boxed counts; a malformed last box is no answer (no fallback to an earlier one).
- units in \\text{}, a leading \\$, degrees and trailing sentence marks are ignored: "5 \\text{ cm}" == 5.
- percent: "5\\%" and "5%" both mean math-verify's percentage, equal to 5 AND to 0.05.
- thousands separators "1,234", "1\\,234", "1{,}234" == 1234; "12,34" is the set {12, 34}.
- floats match rationals to 6 decimals (math-verify's float_rounding): 0.333333 == 1/3, 0.333 != 1/3.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_hacpo.rewards.math import (
    PreparedAnswer,
    RewardReason,
    VerifyLimits,
    prepare_answer,
    score_math,
    score_math_detailed,
    score_prepared,
    verify_prepared,
)

C, W, N, U, E, R, INV = (
    RewardReason.CORRECT,
    RewardReason.WRONG,
    RewardReason.NO_ANSWER,
    RewardReason.UNPARSABLE,
    RewardReason.EMPTY,
    RewardReason.REJECTED,
    RewardReason.INVALID_GOLD,
)

FRAC_BOMB = "\\boxed{" + "\\frac{" * 30 + "1" + "}{2}" * 30 + "}"

# (response, gold, strict, expected reward, expected reason)
CASES = [
    # fractions, decimals, \frac vs /
    ("so \\boxed{\\frac{1}{2}}", "0.5", True, 1.0, C),
    ("\\boxed{0.5}", "\\frac{1}{2}", True, 1.0, C),
    ("\\boxed{1/2}", "\\frac12", True, 1.0, C),
    ("\\boxed{\\dfrac{3}{4}}", "3/4", True, 1.0, C),
    ("\\boxed{\\tfrac34}", "0.75", True, 1.0, C),
    ("\\boxed{-\\frac{3}{4}}", "-0.75", True, 1.0, C),
    # close but wrong: 6-decimal rounding decides
    ("\\boxed{0.333}", "1/3", True, 0.0, W),
    ("\\boxed{0.333333}", "1/3", True, 1.0, C),
    ("\\boxed{0.67}", "2/3", True, 0.0, W),
    ("\\boxed{0.666667}", "2/3", True, 1.0, C),
    ("\\boxed{5.0000001}", "5", True, 0.0, W),  # math-verify: a Float never equals an Integer after rounding
    ("\\boxed{\\pi}", "3.14159", True, 0.0, W),
    # units, currency, percent, degrees
    ("\\boxed{5 \\text{ cm}}", "5", True, 1.0, C),
    ("\\boxed{\\$5}", "5", True, 1.0, C),
    ("\\boxed{5\\%}", "5", True, 1.0, C),
    ("\\boxed{5\\%}", "0.05", True, 1.0, C),
    ("\\boxed{5%}", "5", True, 1.0, C),
    ("\\boxed{50}", "5\\%", True, 0.0, W),
    ("\\boxed{90^\\circ}", "90", True, 1.0, C),
    # thousands separators
    ("\\boxed{1,234}", "1234", True, 1.0, C),
    ("\\boxed{1234}", "1,234", True, 1.0, C),
    ("\\boxed{1\\,234}", "1234", True, 1.0, C),
    ("\\boxed{1{,}234,567}", "1234567", True, 1.0, C),
    ("\\boxed{12,34}", "1234", True, 0.0, W),
    # several boxes, nesting, brace-less, \fbox
    ("First \\boxed{1}, then \\boxed{2}.", "2", True, 1.0, C),
    ("First \\boxed{1}, then \\boxed{2}.", "1", True, 0.0, W),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{\\sqrt{2}}{2}", True, 1.0, C),
    ("\\boxed{\\boxed{5}}", "5", True, 1.0, C),
    ("\\boxed{{5}}", "5", True, 1.0, C),
    ("\\boxed 5", "5", True, 1.0, C),
    ("The answer is $\\boxed 42$.", "42", True, 1.0, C),
    ("\\fbox{7}", "7", True, 1.0, C),
    # signs, scientific notation
    ("\\boxed{-7}", "-7", True, 1.0, C),
    ("\\boxed{\u22127}", "-7", True, 1.0, C),  # Unicode minus
    ("\\boxed{+7}", "7", True, 1.0, C),
    ("\\boxed{007}", "7", True, 1.0, C),
    ("\\boxed{-7}", "7", True, 0.0, W),
    ("\\boxed{1.5 \\times 10^{3}}", "1500", True, 1.0, C),
    ("\\boxed{1.5e3}", "1500", True, 1.0, C),
    ("\\boxed{2.5E-2}", "0.025", True, 1.0, C),
    # equations, text around the box
    ("\\boxed{x = 5}", "5", True, 1.0, C),
    ("\\boxed{y = 5}", "x = 5", True, 0.0, W),
    ("So \\boxed{12}. Hope this helps! {", "12", True, 1.0, C),
    ("\\boxed{12.}", "12", True, 1.0, C),
    ("\\boxed{5}}", "5", True, 1.0, C),
    # structures
    ("\\boxed{(1, 2)}", "(1,2)", True, 1.0, C),
    ("\\boxed{3, 4}", "4, 3", True, 1.0, C),
    ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", True, 1.0, C),
    ("\\boxed{x^2-1}", "(x-1)(x+1)", True, 1.0, C),
    ("\\boxed{2^{2024}}", "2^{2024}", True, 1.0, C),
    # gold spellings
    ("\\boxed{5}", "\\boxed{5}", True, 1.0, C),
    ("\\boxed{3/4}", "$\\frac{3}{4}$", True, 1.0, C),
    # no answer / empty / malformed
    ("The answer is 42", "42", True, 0.0, N),
    ("", "42", True, 0.0, E),
    ("  \n\t ", "42", True, 0.0, E),
    ("\\boxed{}", "42", True, 0.0, N),
    ("\\boxed{   }", "42", True, 0.0, N),
    ("\\boxed{42", "42", True, 0.0, N),
    ("\\boxed{42} and then \\boxed{4", "42", True, 0.0, N),
    ("\\boxed", "42", True, 0.0, N),
    ("\\boxed{\\frac{}{}\\left(}", "42", True, 0.0, U),
    ("\\boxed{@#&}", "42", True, 0.0, U),
    # non-UTF-8-like text
    ("\x00\\boxed{4\ud8002}\x00", "42", True, 1.0, C),
    ("\\boxed{4\x07\u200b2}", "42", True, 1.0, C),
    ("\ud800\udfff\x00\x1b", "42", True, 0.0, E),
    # adversarial LaTeX -> refused quickly
    (FRAC_BOMB, "1", True, 0.0, R),
    ("\\boxed{10^{10^{10}}}", "5", True, 0.0, R),
    ("\\boxed{10^{10^{10^{10}}}}", "5", True, 0.0, R),
    ("\\boxed{10^{-10^{10}}}", "5", True, 0.0, R),
    ("\\boxed{1000000!}", "5", True, 0.0, R),
    ("\\boxed{e^{10^{10}}}", "5", True, 0.0, R),
    ("\\boxed{" + "1+" * 600 + "1}", "601", True, 0.0, R),  # 1201 chars > max_answer_chars
    # invalid gold
    ("\\boxed{3}", "\\frac{", True, 0.0, INV),
    ("\\boxed{3}", "", True, 0.0, INV),
    ("\\boxed{3}", "   ", True, 0.0, INV),
    # lenient: math-verify's own extraction over the whole text
    ("The answer is 42", "42", False, 1.0, C),
    ("so x = 3 and the final answer is $\\frac{1}{2}$.", "0.5", False, 1.0, C),
    ("I think 7, no wait, it is 8", "8", False, 1.0, C),
    ("First \\boxed{1}, then \\boxed{2}.", "2", False, 1.0, C),  # the last box (math-verify alone: the set {1, 2})
    ("\\boxed{8} was wrong; the answer is \\boxed{7}", "7", False, 1.0, C),
    ("\\boxed{8} was wrong; the answer is \\boxed{7}", "8", False, 0.0, W),
    ("\\boxed{4}", "four apples", True, 0.0, INV),  # a gold in words
    ("\\boxed{4}", "four", True, 0.0, INV),  # a number in words: the model's 4 would score wrong
    ("\\boxed{yes}", "yes", False, 1.0, C),  # one word: compared symbolically, the same on both sides
    ("\\boxed{no}", "yes", True, 0.0, W),
    ("\\boxed{abc}", "abc", True, 1.0, C),
    ("\\boxed{5}", "5 \\text{ apples}", True, 1.0, C),  # a unit in \\text{} is not a word of the gold
    ("\\boxed{\\sin x}", "\\sin x", True, 1.0, C),
    ("First $\\boxed{1}$, then $\\boxed{2}$.", "2", False, 1.0, C),
    ("No numbers here at all.", "8", False, 0.0, N),
]


@pytest.mark.parametrize(("response", "gold", "strict", "expected_reward", "expected_reason"), CASES)
def test_score_table(response: str, gold: str, strict: bool, expected_reward: float, expected_reason) -> None:
    scored = score_math_detailed(response, gold, strict, timeout_s=5.0)
    assert (scored.reward, scored.reason) == (expected_reward, expected_reason), scored.detail
    assert score_math(response, gold, strict) == expected_reward


def test_table_has_forty_distinct_cases() -> None:
    assert len({(case[0], case[1], case[2]) for case in CASES}) == len(CASES) >= 40


def test_guard_reasons_carry_a_detail() -> None:
    scored = score_math_detailed("\\boxed{10^{10^{10}}}", "5")
    assert scored.reason is RewardReason.REJECTED and "digits" in scored.detail
    assert "bracket depth 30 > 12" in score_math_detailed(FRAC_BOMB, "1").detail


def test_one_megabyte_response_is_truncated_to_its_tail() -> None:
    filler = "Consider the sum of the first n integers. " * 25_000  # ~1 MB of reasoning
    assert len(filler) > 1_000_000
    correct = score_math_detailed(filler + "Hence \\boxed{\\frac{1}{2}}.", "0.5")
    no_box = score_math_detailed(filler, "0.5")
    early_box = score_math_detailed("\\boxed{0.5} " + filler, "0.5")
    assert (correct.reward, correct.reason, correct.truncated) == (1.0, RewardReason.CORRECT, True)
    assert (no_box.reason, no_box.truncated) == (RewardReason.NO_ANSWER, True)
    assert early_box.reason is RewardReason.NO_ANSWER  # the box fell outside the kept tail


def test_truncation_limit_is_configurable() -> None:
    response = "\\boxed{7}" + " padding" * 10
    assert score_math_detailed(response, "7", limits=VerifyLimits(max_response_chars=20)).reason is N
    kept = score_math_detailed(response, "7", limits=VerifyLimits(max_response_chars=0))
    assert (kept.reason, kept.truncated) == (C, False)


@pytest.mark.parametrize(
    ("response", "gold", "expected_reason"),
    [
        (None, "5", RewardReason.EMPTY),
        (b"\\boxed{5}", "5", RewardReason.CORRECT),
        (b"\\boxed{5}\xff\xfe", "5", RewardReason.CORRECT),
        (5, "5", RewardReason.ERROR),
        (["\\boxed{5}"], "5", RewardReason.ERROR),
        ("\\boxed{5}", None, RewardReason.INVALID_GOLD),
        ("\\boxed{5}", 5, RewardReason.INVALID_GOLD),
    ],
)
def test_non_string_inputs_never_raise(response: object, gold: object, expected_reason: RewardReason) -> None:
    assert score_math_detailed(response, gold).reason is expected_reason


def test_invalid_gold_logs_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="nemo_hacpo.rewards.math"):
        assert score_math("\\boxed{3}", "\\frac{") == 0.0
    assert "invalid gold" in caplog.text


def test_slow_answer_times_out_in_process() -> None:
    """An answer slow by construction (an hour of sleep inside the time limit) is cut at the limit by the alarm,
    whatever the speed of math-verify on this machine; the alarm is cleaned up after."""
    prepared = prepare_answer("\\boxed{\\frac{1}{2}}", "3")
    scored = score_prepared(prepared, timeout_s=0.5, delay_s=3600.0)
    assert (scored.reason, scored.detail) == (RewardReason.TIMEOUT, "exceeded 0.5 s")
    assert score_math("\\boxed{3}", "3", timeout_s=0.5) == 1.0  # the alarm was cleaned up


def test_prepare_answer_returns_the_box_content_for_verification() -> None:
    prepared = prepare_answer("work... \\boxed{\\dfrac{1}{2}}.", "$0.5$")
    assert prepared == PreparedAnswer(
        answer_text="\\dfrac{1}{2}", gold_text="0.5", strict=True, truncated=False
    )
    assert prepare_answer("\\boxed{12}", "12").reason is RewardReason.CORRECT  # integer fast path


@settings(max_examples=40, deadline=None)
@given(answer=st.integers(-(10**12), 10**12), gold=st.integers(-(10**12), 10**12), plus=st.booleans())
def test_integer_fast_path_agrees_with_math_verify(answer: int, gold: int, plus: bool) -> None:
    answer_text = f"+{answer}" if plus and answer >= 0 else str(answer)
    fast = prepare_answer(f"\\boxed{{{answer_text}}}", str(gold))
    slow = verify_prepared(PreparedAnswer(answer_text=answer_text, gold_text=str(gold), strict=True))
    assert fast.reason is slow.reason
    assert fast.reason is (RewardReason.CORRECT if answer == gold else RewardReason.WRONG)

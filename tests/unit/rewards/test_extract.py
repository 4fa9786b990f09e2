"""String stage of the math reward: cleaning, truncation, last-box extraction, normalisation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_hacpo.rewards.extract import (
    BoxedAnswer,
    clean_text,
    extract_last_boxed,
    max_bracket_depth,
    normalize_answer_text,
    truncate_tail,
)


@pytest.mark.parametrize(
    ("text", "content", "braced"),
    [
        ("so \\boxed{42}.", "42", True),
        ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}", True),
        ("\\boxed{1} then \\boxed{2}", "2", True),
        ("\\boxed{\\boxed{1} + \\boxed{2}}", "\\boxed{1} + \\boxed{2}", True),  # outer box wins
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}", True),  # escaped braces do not close the box
        ("\\boxed {  7 }", "  7 ", True),
        ("\\boxed 5", "5", False),
        ("$\\boxed 42$ is it", "42", False),
        ("\\boxed 3.\nNext line", "3", False),
        ("\\[\\boxed x+1\\]", "x+1", False),
        ("\\fbox{9}", "9", True),
        ("\\boxed{}", "", True),
    ],
)
def test_extract_last_boxed_content(text: str, content: str, braced: bool) -> None:
    boxed = extract_last_boxed(text)
    assert boxed is not None
    assert (boxed.content, boxed.braced) == (content, braced)


def test_extract_last_boxed_reports_position() -> None:
    assert extract_last_boxed("ab \\boxed{1} \\boxed{2}") == BoxedAnswer(content="2", braced=True, start=13)


@pytest.mark.parametrize("text", ["no box here", "\\boxedfoo{3}", "\\mathbf{3}", ""])
def test_extract_last_boxed_none_without_a_box(text: str) -> None:
    assert extract_last_boxed(text) is None


@pytest.mark.parametrize("text", ["\\boxed{5", "\\boxed{1} and \\boxed{\\frac{1}{2}", "\\boxed", "\\boxed}"])
def test_malformed_last_box_has_no_content(text: str) -> None:
    boxed = extract_last_boxed(text)
    assert boxed is not None and boxed.content is None


def test_unbraced_argument_is_capped() -> None:
    boxed = extract_last_boxed("\\boxed " + "9" * 500, max_unbraced_chars=10)
    assert boxed is not None and boxed.content == "9" * 10


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("  42 ", "42"),
        ("$\\frac{3}{4}$", "\\frac{3}{4}"),
        ("\\(5\\)", "5"),
        ("\\[ 5 \\]", "5"),
        ("{{5}}", "5"),
        ("{1}{2}", "{1}{2}"),  # not one outer group
        ("\\boxed{5}", "5"),
        ("$\\boxed{{5}}$.", "5"),
        ("12.", "12"),
        ("1\\,234", "1234"),
        ("1{,}234,567", "1234567"),
        ("1\\!234\\!567.5", "1234567.5"),
        ("1,234", "1,234"),  # plain commas: left to math-verify
        ("(1,234)", "(1,234)"),
        ("1.5e3", "1.5\\times 10^{3}"),
        ("-2E-4", "-2\\times 10^{-4}"),
        ("x2e3", "x2e3"),  # not a number
        ("5\\%", "5%"),
        ("\\$5", "\\$5"),
        ("$5", "5"),
        ("a\nb", "a b"),
    ],
)
def test_normalize_answer_text(raw: str, normalized: str) -> None:
    assert normalize_answer_text(raw) == normalized


def test_clean_text_removes_unprintable_and_maps_minus() -> None:
    dirty = "\x00a\ud800b\u200bc\x07d\x9f\ufeff \u2212e\tf\ng\r"
    assert clean_text(dirty) == "abcd -e\tf\ng\r"


@settings(max_examples=60, deadline=None)
@given(st.text())
def test_clean_text_is_idempotent_and_utf8_safe(text: str) -> None:
    cleaned = clean_text(text)
    cleaned.encode("utf-8")  # raises on lone surrogates
    assert clean_text(cleaned) == cleaned
    assert not any(ord(char) < 32 and char not in "\t\n\r" for char in cleaned)


def test_truncate_tail_keeps_the_end() -> None:
    assert truncate_tail("abcdef", 4) == ("cdef", True)
    assert truncate_tail("abcdef", 6) == ("abcdef", False)
    assert truncate_tail("abcdef", 0) == ("abcdef", False)


@pytest.mark.parametrize(
    ("text", "depth"),
    [("", 0), ("42", 0), ("\\frac{1}{\\sqrt{2}}", 2), ("f((x)[{y}])", 3), (")))((", 2), ("{" * 50, 50)],
)
def test_max_bracket_depth(text: str, depth: int) -> None:
    assert max_bracket_depth(text) == depth


_BALANCED = st.recursive(
    st.text(alphabet="abc123+-^_ ", max_size=5),
    lambda inner: st.builds(lambda a, b: a + "{" + b + "}", inner, inner),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(
    prefix=st.text(alphabet="xyz ${}", max_size=20),
    content=_BALANCED,
    suffix=st.text(alphabet="xyz. $", max_size=10),
)
def test_extract_round_trips_balanced_content(prefix: str, content: str, suffix: str) -> None:
    boxed = extract_last_boxed(f"{prefix} \\boxed{{{content}}}{suffix}")
    assert boxed is not None and boxed.content == content


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="\\boxed{}fx1 $\n", max_size=60))
def test_extraction_never_raises(text: str) -> None:
    boxed = extract_last_boxed(text)
    if boxed is not None and boxed.content is not None:
        normalize_answer_text(boxed.content)

"""Text hygiene and answer extraction for math rewards: pure string functions, no sympy.

Everything here is linear in the input length and never raises on any ``str``; it runs in the
driver process before an answer is shipped to a verification worker, so a 1 MB response costs
milliseconds, not a worker.

Pipeline for one response (see :func:`nemo_hacpo.rewards.math.prepare_answer`)::

    raw ──truncate_tail──► last N chars ──clean_text──► printable text
        ──extract_last_boxed──► BoxedAnswer(content) ──normalize_answer_text──► "\\frac{1}{2}"
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "BoxedAnswer",
    "clean_text",
    "extract_last_boxed",
    "max_bracket_depth",
    "normalize_answer_text",
    "truncate_tail",
]

# Lone UTF-16 surrogates (from bad decodes), C0 controls except \t \n \r, DEL, C1 controls, and
# zero-width characters / BOM that split tokens invisibly ("4\u200b2" must read as "42").
_UNPRINTABLE_RE = re.compile("[\ud800-\udfff\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b-\u200d\u2060\ufeff]")
# Unicode minus and other dashes models emit for a negative sign.
_MINUS_RE = re.compile("[\u2212\u2012\u2013\ufe63\uff0d]")

# \boxed or \fbox as a whole control word (not \boxedfoo).
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
# Where an unbraced "\boxed 5" argument stops: end of math mode or of the line.
_UNBRACED_STOP_RE = re.compile(r"\$|\n|\\\]|\\\)")

# A number written with thousands separators: "1\,234", "1{,}234,567", "1\!234" (groups of three).
_GROUPED_NUMBER_RE = re.compile(r"(?<![\d.])\d{1,3}(?:(?:\\[,!;:]|\{,\}|,)\d{3})+(?![\d])")
_LATEX_SEPARATOR_RE = re.compile(r"\\[,!;:]|\{,\}")
# Plain scientific notation "1.5e3", "2E-4" (math-verify reads the e as Euler's number).
_SCI_NOTATION_RE = re.compile(r"(?<![\w.\\])([+-]?\d+(?:\.\d+)?)[eE]([+-]?\d+)(?![\w.])")
# Unescaped dollar signs left inside an answer ("\boxed{$5$}").
_BARE_DOLLAR_RE = re.compile(r"(?<!\\)\$")
_BRACKET_RE = re.compile(r"[{}()\[\]]")
_MATH_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


@dataclass(frozen=True)
class BoxedAnswer:
    """The last ``\\boxed``/``\\fbox`` in a text.

    Attributes:
        content: text inside the box (braces stripped), or ``None`` when the box is malformed
            (unbalanced braces, nothing after ``\\boxed``).
        braced: whether the argument was a ``{...}`` group (``False`` for ``\\boxed 5``).
        start: index of the backslash of the last ``\\boxed`` in the searched text.
    """

    content: str | None
    braced: bool
    start: int


def truncate_tail(text: str, max_chars: int) -> tuple[str, bool]:
    """Keep the last ``max_chars`` characters (final answers sit at the end).

    Returns ``(text, was_truncated)``; ``max_chars <= 0`` disables truncation.
    """
    if max_chars > 0 and len(text) > max_chars:
        return text[-max_chars:], True
    return text, False


def clean_text(text: str) -> str:
    """Drop lone surrogates, NULs, control characters and zero-width marks; map Unicode minus to ``-``.

    Tabs and newlines are kept. The result always encodes as UTF-8.
    """
    return _MINUS_RE.sub("-", _UNPRINTABLE_RE.sub("", text))


def _braced_group_end(text: str, open_index: int) -> int | None:
    """Index just past the ``}`` closing the ``{`` at ``open_index``; ``None`` if never closed.

    Escaped braces ``\\{`` / ``\\}`` and any other ``\\x`` pair are skipped, so ``\\boxed{\\{1,2\\}}``
    closes at the last brace.
    """
    depth = 0
    index = open_index
    length = len(text)
    while index < length:
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    return None


def _read_boxed_argument(text: str, after: int, max_unbraced_chars: int) -> tuple[str | None, bool, int]:
    """Read the argument of a ``\\boxed`` ending at index ``after``.

    Returns ``(content, braced, end)``. A braced argument is the balanced group; an unbraced one
    (``\\boxed 5``) runs to the end of math mode or of the line — TeX would take one token, but
    models write ``\\boxed 42`` meaning 42.
    """
    index = after
    length = len(text)
    while index < length and text[index] in " \t\r\n":
        index += 1
    if index >= length:
        return None, False, length
    if text[index] == "{":
        end = _braced_group_end(text, index)
        if end is None:
            return None, True, length
        return text[index + 1 : end - 1], True, end
    if text[index] == "}":  # "\boxed}" - nothing boxed
        return None, False, index
    stop = _UNBRACED_STOP_RE.search(text, index, min(length, index + max_unbraced_chars))
    end = stop.start() if stop else min(length, index + max_unbraced_chars)
    return text[index:end].rstrip(" \t.,;:"), False, end


def extract_last_boxed(text: str, max_unbraced_chars: int = 200) -> BoxedAnswer | None:
    """The last top-level ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed x``) in ``text``.

    Boxes are read left to right and each one's argument is skipped, so a box nested inside another
    (``\\boxed{\\boxed{5}}``) belongs to the outer one; the last top-level box wins. Returns ``None``
    when there is no box at all, and a :class:`BoxedAnswer` with ``content=None`` when the last box
    is malformed (unbalanced braces, e.g. a generation cut off inside the box): strict grading gives
    that no answer rather than falling back to an earlier box.

    Example: ``"\\boxed{1} so \\boxed{\\frac{1}{\\sqrt{2}}}."`` -> ``content="\\frac{1}{\\sqrt{2}}"``.
    """
    last: BoxedAnswer | None = None
    position = 0
    while True:
        match = _BOXED_RE.search(text, position)
        if match is None:
            return last
        content, braced, end = _read_boxed_argument(text, match.end(), max_unbraced_chars)
        last = BoxedAnswer(content=content, braced=braced, start=match.start())
        position = max(end, match.end())


def _strip_outer_group(text: str) -> str:
    """``"{5}"`` -> ``"5"`` when the first ``{`` closes at the last character."""
    while len(text) >= 2 and text[0] == "{" and _braced_group_end(text, 0) == len(text):
        text = text[1:-1].strip()
    return text


def _strip_math_delimiters(text: str) -> str:
    changed = True
    while changed:
        changed = False
        for opening, closing in _MATH_DELIMITERS:
            if (
                len(text) > len(opening) + len(closing)
                and text.startswith(opening)
                and text.endswith(closing)
            ):
                text = text[len(opening) : -len(closing)].strip()
                changed = True
    return text


def _drop_latex_grouping(match: re.Match[str]) -> str:
    """Remove the separators of a grouped number that uses at least one LaTeX separator.

    Plain-comma groupings ("1,234", "(1,234)") are left to math-verify, which reads a bare "1,234" as
    1234 but an interval "(1,234)" as an interval.
    """
    number = match.group()
    if not _LATEX_SEPARATOR_RE.search(number):
        return number
    return _LATEX_SEPARATOR_RE.sub("", number).replace(",", "")


def normalize_answer_text(text: str) -> str:
    """Normalise one answer string (a box's content or a gold answer) before math-verify parses it.

    - strips whitespace, surrounding ``$..$`` / ``\\(..\\)`` / ``\\[..\\]`` and redundant outer braces;
    - unwraps a box around the whole answer (``\\boxed{5}`` as a gold, ``\\boxed{\\boxed{5}}``);
    - removes a trailing sentence mark (``"12."`` -> ``"12"``);
    - removes LaTeX thousands separators between 3-digit groups (``1\\,234``, ``1{,}234`` -> ``1234``;
      math-verify reads ``1\\,234`` as 1 + 234); plain ``1,234`` is left to math-verify, which reads it
      as 1234 (and ``12,34`` as the set {12, 34});
    - rewrites plain scientific notation ``1.5e3`` as ``1.5\\times 10^{3}`` (math-verify reads ``e`` as
      Euler's number);
    - drops unescaped ``$`` and turns newlines into spaces (the answer is re-wrapped in ``$..$``);
    - ``\\%`` -> ``%``: math-verify treats ``5%`` as a percentage equal to both 5 and 0.05, but ``5\\%``
      as plain 5; both spellings get the same (percentage) meaning.
    """
    text = text.strip()
    for _ in range(4):  # a few rounds cover "$\boxed{{5}}$." without looping on adversarial input
        before = text
        text = _strip_math_delimiters(text).rstrip(" .,;:").strip()
        text = _strip_outer_group(text)
        boxed = _BOXED_RE.match(text)
        if boxed is not None:
            content, _braced, end = _read_boxed_argument(text, boxed.end(), len(text))
            if content is not None and end >= len(text.rstrip(" .,;:")):
                text = content.strip()
        if text == before:
            break
    text = _GROUPED_NUMBER_RE.sub(_drop_latex_grouping, text)
    text = _SCI_NOTATION_RE.sub(r"\1\\times 10^{\2}", text)
    text = _BARE_DOLLAR_RE.sub("", text)
    text = text.replace("\\%", "%").replace("\r", " ").replace("\n", " ")
    return text.strip()


def max_bracket_depth(text: str) -> int:
    """Deepest nesting of ``{}``, ``()``, ``[]`` together (escaped ``\\{`` counts as a bracket too).

    Unmatched closers do not go below zero, so prose with a stray ``)`` stays shallow. Used as a guard:
    math-verify's LaTeX parser and sympy's simplification are exponential in ``\\frac`` nesting depth
    (20 nested ``\\frac`` take > 5 s to verify).
    """
    depth = 0
    deepest = 0
    for match in _BRACKET_RE.finditer(text):  # visits brackets only: long prose costs little
        if match.group() in "{([":
            depth += 1
            if depth > deepest:
                deepest = depth
        elif depth > 0:
            depth -= 1
    return deepest

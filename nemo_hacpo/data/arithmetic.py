"""Seeded generator of arithmetic word problems (the training data; no offline GSM8K train split exists).

A problem is a short story: a person starts with ``a`` objects and then ``level`` operations happen to
them (buy more: ``+``, give away: ``-``, end up with k times as many: ``*``, split into k equal groups
and keep one: exact ``/``). Every value along the way is an integer in ``[2, numbers.max_value]``, and each
operand lies in its operation's range (:class:`~nemo_hacpo.config.ArithmeticNumbers`; the defaults: values up
to 100, ``+`` up to 20, ``*`` up to 5, ``/`` up to 10), so tiny models can learn the task. Example (level 1)::

    Tom has 3 apples and buys 4 more. How many apples does Tom have now?
    solution: "Tom starts with 3 apples.\\n3 + 4 = 7\\nThe answer is \\boxed{7}"

Determinism: each split draws from its own ``random.Random`` whose seed is derived from
``(split, seed)`` with SHA-256 (never the salted builtin ``hash``), so the same call gives the same
problems in every process and on every platform.

Disjointness: the question-text space is partitioned by a SHA-256 bucket of the question
(:func:`split_of_question`); a generator for one split rejects every candidate whose question belongs
to the other split. Train and eval can therefore never share a question, whatever seeds are used.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from nemo_hacpo.config import ArithmeticNumbers
from nemo_hacpo.data.problem import MathProblem

Split = Literal["train", "eval"]

ORIGINAL_NUMBERS = ArithmeticNumbers()
"""The default number ranges: the original task."""

MAX_VALUE = ORIGINAL_NUMBERS.max_value
"""Default upper bound for the start value, every intermediate value and the answer."""

LEVELS: tuple[int, ...] = (1, 2, 3, 4)
"""Supported difficulty levels (= number of operations)."""

DEFAULT_SEEDS: dict[str, int] = {"train": 20240601, "eval": 20240602}
"""Seed used by :func:`generate_problems` when none is given."""

EVAL_BUCKETS = 10
"""One in ``EVAL_BUCKETS`` question texts belongs to the eval split, the rest to train."""

# (name, subject pronoun, possessive pronoun)
PEOPLE: tuple[tuple[str, str, str], ...] = (
    ("Tom", "he", "his"), ("Anna", "she", "her"), ("Ben", "he", "his"), ("Maria", "she", "her"),
    ("Sam", "he", "his"), ("Lily", "she", "her"), ("Omar", "he", "his"), ("Chloe", "she", "her"),
    ("Raj", "he", "his"), ("Emma", "she", "her"), ("Leo", "he", "his"), ("Sofia", "she", "her"),
    ("Jack", "he", "his"), ("Mia", "she", "her"), ("Noah", "he", "his"), ("Zoe", "she", "her"),
    ("Ivan", "he", "his"), ("Nora", "she", "her"), ("Kenji", "he", "his"), ("Grace", "she", "her"),
)

OBJECTS: tuple[str, ...] = (
    "apples", "marbles", "stickers", "pencils", "coins", "books", "cookies", "stamps",
    "shells", "cards", "balloons", "oranges", "crayons", "buttons", "beads", "candies",
    "flowers", "toy cars", "eggs", "rocks",
)

START_TEMPLATES: tuple[str, ...] = (
    "{name} has {a} {obj}",
    "{name} starts with {a} {obj}",
    "{name} owns {a} {obj}",
)

# Verb phrases (subject omitted) per operation; {b} is the operand.
STEP_TEMPLATES: dict[str, tuple[str, ...]] = {
    "+": (
        "buys {b} more",
        "finds {b} more {obj}",
        "gets {b} more {obj} from {friend}",
        "receives {b} more as a gift",
    ),
    "-": (
        "gives {b} {obj} to {friend}",
        "loses {b} of them",
        "sells {b} of them",
        "gives away {b}",
    ),
    "*": (
        "ends up with {b} times as many {obj} as before",
        "collects enough to have {b} times as many as before",
    ),
    "/": (
        "splits {pos} {obj} into {b} equal groups and keeps one group",
        "shares them equally among {b} boxes and keeps only one box",
    ),
}

QUESTION_TEMPLATES: tuple[str, ...] = (
    "How many {obj} does {name} have now?",
    "How many {obj} does {name} have in the end?",
)

OPERATIONS: tuple[str, ...] = ("+", "-", "*", "/")


@dataclass(frozen=True)
class Step:
    """One operation ``value_before <op> operand = value_after``."""

    operation: str
    operand: int
    value_before: int
    value_after: int


def derive_seed(*parts: object) -> int:
    """A 64-bit seed from any printable parts, stable across processes (SHA-256, not ``hash``)."""
    digest = hashlib.sha256(":".join(str(part) for part in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def split_of_question(question: str) -> Split:
    """The split a question text belongs to: ``"eval"`` iff ``sha256(question) mod EVAL_BUCKETS == 0``."""
    bucket = int.from_bytes(hashlib.sha256(question.encode("utf-8")).digest()[:8], "big") % EVAL_BUCKETS
    return "eval" if bucket == 0 else "train"


def apply_operation(operation: str, value: int, operand: int) -> int:
    """``value <operation> operand`` with exact integer division (raises if not exact)."""
    if operation == "+":
        return value + operand
    if operation == "-":
        return value - operand
    if operation == "*":
        return value * operand
    if operation == "/":
        if value % operand != 0:
            raise ValueError(f"{value} / {operand} is not an integer")
        return value // operand
    raise ValueError(f"unknown operation {operation!r}; expected one of {OPERATIONS}")


def _feasible_operands(operation: str, value: int, numbers: ArithmeticNumbers = ORIGINAL_NUMBERS) -> list[int]:
    """Operands in the operation's range that keep the result an integer in ``[2, numbers.max_value]`` (and the
    story sensible).

    Results of 0 or 1 are excluded so that no single answer dominates the data set.
    """
    if operation == "+":
        return list(range(2, min(numbers.max_addend, numbers.max_value - value) + 1))
    if operation == "-":
        return list(range(2, min(numbers.max_subtrahend, value - 2) + 1))  # at least two objects left
    if operation == "*":
        return [k for k in range(2, numbers.max_factor + 1) if value * k <= numbers.max_value]
    if operation == "/":
        return [k for k in range(2, numbers.max_divisor + 1) if value % k == 0 and value // k >= 2]
    raise ValueError(f"unknown operation {operation!r}")


def _sample_steps(rng: random.Random, start: int, level: int, numbers: ArithmeticNumbers) -> list[Step]:
    steps: list[Step] = []
    value = start
    for _ in range(level):
        choices = [(op, _feasible_operands(op, value, numbers)) for op in OPERATIONS]
        choices = [(op, operands) for op, operands in choices if operands]
        operation, operands = rng.choice(choices)
        operand = rng.choice(operands)
        new_value = apply_operation(operation, value, operand)
        steps.append(Step(operation, operand, value, new_value))
        value = new_value
    return steps


def _expression(start: int, steps: Sequence[Step]) -> str:
    """``"(3 + 4) * 2"``: the left-to-right computation with explicit parentheses."""
    expression = str(start)
    for index, step in enumerate(steps):
        left = f"({expression})" if index > 0 else expression
        expression = f"{left} {step.operation} {step.operand}"
    return expression


def _sample_problem(rng: random.Random, level: int, numbers: ArithmeticNumbers) -> tuple[str, str, str, str]:
    """Return ``(question, answer, solution, expression)`` for one random problem of ``level`` steps."""
    name, pronoun, possessive = rng.choice(PEOPLE)
    friend = rng.choice([person[0] for person in PEOPLE if person[0] != name])
    obj = rng.choice(OBJECTS)
    start = rng.randint(2, numbers.max_start)
    steps = _sample_steps(rng, start, level, numbers)

    def clause(step: Step) -> str:
        template = rng.choice(STEP_TEMPLATES[step.operation])
        return template.format(b=step.operand, obj=obj, friend=friend, pos=possessive)

    opening = rng.choice(START_TEMPLATES).format(name=name, a=start, obj=obj)
    if level == 1:
        story = f"{opening} and {clause(steps[0])}."
    else:
        sentences = [f"{opening}.", f"{pronoun.capitalize()} {clause(steps[0])}."]
        sentences += [f"Then {pronoun} {clause(step)}." for step in steps[1:]]
        story = " ".join(sentences)
    question = f"{story} {rng.choice(QUESTION_TEMPLATES).format(name=name, obj=obj)}"

    answer = str(steps[-1].value_after)
    lines = [f"{name} starts with {start} {obj}."]
    lines += [f"{s.value_before} {s.operation} {s.operand} = {s.value_after}" for s in steps]
    lines.append(f"The answer is \\boxed{{{answer}}}")
    return question, answer, "\n".join(lines), _expression(start, steps)


def generate_problems(
    split: Split,
    num_problems: int,
    *,
    seed: int | None = None,
    levels: Sequence[int] = (1, 2, 3),
    numbers: ArithmeticNumbers = ORIGINAL_NUMBERS,
) -> list[MathProblem]:
    """Generate ``num_problems`` distinct problems of ``split``.

    Args:
        split: ``"train"`` or ``"eval"``; only questions with ``split_of_question(q) == split`` are kept.
        num_problems: how many problems to return.
        seed: RNG seed (``DEFAULT_SEEDS[split]`` when ``None``); the stream is ``Random(sha256(split, seed))``.
        levels: levels to draw from, uniformly per problem (a subset of :data:`LEVELS`).
        numbers: the number ranges (the defaults: the original task).

    Returns:
        ``num_problems`` records with ids ``f"arith-{split}-{i:06d}"``, distinct question texts,
        ``source="arithmetic"`` and the ``expression`` whose value is the answer.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    if num_problems < 0:
        raise ValueError(f"num_problems must be >= 0, got {num_problems}")
    bad_levels = [level for level in levels if level not in LEVELS]
    if not levels or bad_levels:
        raise ValueError(f"levels must be a non-empty subset of {LEVELS}, got {list(levels)}")
    if numbers.problems():
        raise ValueError(f"number ranges {numbers}: {'; '.join(numbers.problems())}")
    rng = random.Random(derive_seed("arithmetic", split, DEFAULT_SEEDS[split] if seed is None else seed))
    problems: list[MathProblem] = []
    seen_questions: set[str] = set()
    attempts, max_attempts = 0, 200 * num_problems + 1000
    while len(problems) < num_problems:
        attempts += 1
        if attempts > max_attempts:
            raise RuntimeError(f"could not generate {num_problems} distinct {split} problems for levels {levels}")
        level = rng.choice(list(levels))
        question, answer, solution, expression = _sample_problem(rng, level, numbers)
        if question in seen_questions or split_of_question(question) != split:
            continue
        seen_questions.add(question)
        problems.append(
            MathProblem(
                id=f"arith-{split}-{len(problems):06d}",
                question=question,
                answer=answer,
                level=level,
                solution=solution,
                source="arithmetic",
                expression=expression,
            )
        )
    return problems


def stopped_early(problem: MathProblem) -> str:
    """A generated problem's solution cut after its first operation, which is then given as the answer: the start
    line, the first ``a <op> b = c`` line and ``The answer is \\boxed{c}`` — right only when the problem has a
    single operation (the other habit of the warm-start corpus, `warmstart.stop_early_fraction`)."""
    lines = problem.solution.split("\n")
    first = _STEP_LINE.match(lines[1])
    if first is None:
        raise ValueError(f"not a generated arithmetic solution: {problem.solution!r}")
    return "\n".join([lines[0], lines[1], f"The answer is \\boxed{{{first.group(4)}}}"])


def narrated(problem: MathProblem, *, stop_early: bool = False) -> str:
    """The narrated form of a generated problem's solution: after the start line, each operation's sentence of the
    story, then its equation, then the boxed answer (the other *style* of the warm-start corpus,
    `warmstart.narrated_fraction`; every word is the question's own, so every tokenizer spells it as it spells the
    question)::

        Lily starts with 8 stickers.          Lily starts with 8 stickers.
        8 + 2 = 10                            She buys 2 more.
        10 - 4 = 6                   →        8 + 2 = 10
        The answer is \\boxed{6}              Then she sells 4 of them.
                                              10 - 4 = 6
                                              The answer is \\boxed{6}

    With `stop_early` the narration stops after the first operation and boxes its result, like `stopped_early`.
    """
    lines = problem.solution.split("\n")
    equations = lines[1:-1]
    if not equations or not all(_STEP_LINE.match(line) for line in equations):
        raise ValueError(f"not a generated arithmetic solution: {problem.solution!r}")
    sentences = _operation_sentences(problem.question, lines[0], len(equations))
    if stop_early:
        sentences, equations = sentences[:1], equations[:1]
    answer = _STEP_LINE.match(equations[-1]).group(4)
    body = [line for pair in zip(sentences, equations, strict=True) for line in pair]
    return "\n".join([lines[0], *body, f"The answer is \\boxed{{{answer}}}"])


def _operation_sentences(question: str, start_line: str, operations: int) -> list[str]:
    """One sentence per operation, read back from a generated question: the story's sentences after the opening
    (`She buys 2 more.`, `Then she sells 4 of them.`), or for one operation the clause after the opening's " and "
    with the person's pronoun (`He buys 4 more.`)."""
    name = start_line.split(" ", 1)[0]
    story = question[:question.rindex(". ") + 1] if ". " in question else ""
    if operations == 1:
        opening, _, clause = story.partition(" and ")
        pronoun = next((p[1] for p in PEOPLE if p[0] == name), None)
        sentences = [f"{pronoun.capitalize()} {clause}"] if clause and pronoun and opening.startswith(name) else []
    else:
        sentences = [part + "." for part in story[:-1].split(". ")[1:]]
    if len(sentences) != operations or not all(s.endswith(".") and len(s) > 2 for s in sentences):
        raise ValueError(f"not a generated arithmetic question with {operations} operation(s): {question!r}")
    return sentences


def direct_answer(problem: MathProblem) -> str:
    """The answer-only form of a generated problem's solution: its last line, ``The answer is \\boxed{N}``, with no
    worked steps before it (the other style of the warm-start corpus, `warmstart.direct_answer_fraction`)."""
    return f"The answer is \\boxed{{{problem.answer}}}"


# ------------------------------------------------------------------------------------------ error analysis
ERROR_KINDS: tuple[str, ...] = (
    "no_answer", "start_value", "steps", "carry_over", "operation", "operand", "arithmetic", "final_answer",
    "none",
)
"""What :func:`classify_response` can return, in the order it checks (the first failing check wins).

``no_answer``: no ``\\boxed{}``; ``start_value``: the first line does not state the problem's start value;
``steps``: not one ``a <op> b = c`` line per operation; ``carry_over``: a line does not start from the previous
line's result (or the start value); ``operation`` / ``operand``: the wrong operation or operand for the story's
step; ``arithmetic``: ``a <op> b = c`` with a wrong ``c`` (a wrong fact); ``final_answer``: every line right but
the boxed answer is not the last result; ``none``: the worked solution is right throughout."""

_STEP_LINE = re.compile(r"^\s*(\d+)\s*([-+*/])\s*(\d+)\s*=\s*(\d+)\s*$")
_START = re.compile(r"starts with (\d+)")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def classify_response(solution: str, response: str) -> str:
    """Where a response to a generated problem first departs from its worked ``solution`` (one of
    :data:`ERROR_KINDS`). The solution format is the generator's: a start line, one ``a <op> b = c`` line per
    operation, then ``The answer is \\boxed{c}``. Diagnostic only; rewards come from the verifier."""
    gold_lines = solution.strip().split("\n")
    gold_start = _START.search(gold_lines[0])
    gold_steps = [_STEP_LINE.match(line) for line in gold_lines[1:-1]]
    if gold_start is None or not gold_steps or not all(gold_steps):
        raise ValueError(f"not a generated arithmetic solution: {solution!r}")
    boxed = _BOXED.findall(response)
    if not boxed:
        return "no_answer"
    lines = [line for line in response.strip().split("\n") if line.strip()]
    start = _START.search(lines[0]) if lines else None
    if start is None or start.group(1) != gold_start.group(1):
        return "start_value"
    steps = [_STEP_LINE.match(line) for line in lines[1:] if "\\boxed" not in line]
    if len(steps) != len(gold_steps) or not all(steps):
        return "steps"
    value = int(start.group(1))
    for step, gold in zip(steps, gold_steps, strict=True):
        left, operation, operand, result = step.groups()
        if int(left) != value:
            return "carry_over"
        if operation != gold.group(2):
            return "operation"
        if operand != gold.group(3):
            return "operand"
        correct = apply_operation(operation, value, int(operand))  # the gold step's own: exact
        if int(result) != correct:
            return "arithmetic"
        value = correct
    return "none" if boxed[-1].strip() == str(value) else "final_answer"

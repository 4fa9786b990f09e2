"""The arithmetic generator: determinism, disjoint splits, levels and answers recomputed independently."""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import os
import re
import subprocess
import sys
from fractions import Fraction

import pytest

from nemo_hacpo.config import ArithmeticNumbers
from nemo_hacpo.data import MathProblem
from nemo_hacpo.data.arithmetic import (
    DEFAULT_SEEDS,
    ERROR_KINDS,
    MAX_VALUE,
    apply_operation,
    classify_response,
    derive_seed,
    direct_answer,
    generate_problems,
    narrated,
    split_of_question,
    stopped_early,
)

_BINARY_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate_exactly(expression: str) -> Fraction:
    """Evaluate ``+ - * /`` over integer literals with exact fractions (independent of the generator)."""

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPERATORS:
            return _BINARY_OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return Fraction(node.value)
        raise ValueError(f"unexpected node {ast.dump(node)}")

    return walk(ast.parse(expression, mode="eval"))


@pytest.fixture(scope="module")
def train_problems():
    return generate_problems("train", 3000)


@pytest.fixture(scope="module")
def eval_problems():
    return generate_problems("eval", 1000)


def test_apply_operation_hand_computed():
    assert apply_operation("+", 3, 4) == 7
    assert apply_operation("-", 10, 4) == 6
    assert apply_operation("*", 6, 5) == 30
    assert apply_operation("/", 18, 3) == 6
    with pytest.raises(ValueError, match="not an integer"):
        apply_operation("/", 7, 2)
    with pytest.raises(ValueError, match="unknown operation"):
        apply_operation("%", 7, 2)


def test_same_call_gives_same_problems():
    assert generate_problems("train", 200, seed=3) == generate_problems("train", 200, seed=3)
    assert generate_problems("train", 200, seed=3) != generate_problems("train", 200, seed=4)


def test_prefix_property_more_problems_extend_the_list():
    short, long = generate_problems("eval", 50), generate_problems("eval", 120)
    assert long[:50] == short


def test_generation_does_not_depend_on_the_process_hash_seed():
    """Two fresh interpreters with different PYTHONHASHSEED produce identical problems."""
    script = (
        "import json; from nemo_hacpo.data.arithmetic import generate_problems;"
        "print(json.dumps([p.to_dict() for p in generate_problems('train', 50, seed=11)]))"
    )
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        outputs.append(json.loads(result.stdout))
    assert outputs[0] == outputs[1]
    assert outputs[0] == [p.to_dict() for p in generate_problems("train", 50, seed=11)]


def test_derive_seed_is_stable_sha256():
    # `printf 'a:1' | sha256sum` = 2b2c40a6706d9e5f...; the seed is its first 8 bytes, big-endian.
    assert derive_seed("a", 1) == 0x2B2C40A6706D9E5F == 3110932526201151071
    assert derive_seed("a", 1) != derive_seed("a", 2)
    assert derive_seed("train", 5) == derive_seed("train", "5")


def test_splits_are_disjoint_by_question_text(train_problems, eval_problems):
    train_questions = {p.question for p in train_problems}
    assert not train_questions & {p.question for p in eval_problems}
    # Same seed for both splits still cannot collide: the question space itself is partitioned.
    same_seed_eval = generate_problems("eval", 500, seed=DEFAULT_SEEDS["train"])
    assert not train_questions & {p.question for p in same_seed_eval}
    assert all(split_of_question(p.question) == "train" for p in train_problems)
    assert all(split_of_question(p.question) == "eval" for p in eval_problems)


def test_eval_bucket_holds_about_a_tenth_of_all_questions():
    questions = [f"question number {i}" for i in range(5000)]
    eval_share = sum(split_of_question(q) == "eval" for q in questions) / len(questions)
    assert 0.08 < eval_share < 0.12


def test_ids_are_sequential_and_questions_unique(train_problems):
    assert [p.id for p in train_problems[:3]] == ["arith-train-000000", "arith-train-000001", "arith-train-000002"]
    assert len({p.id for p in train_problems}) == len(train_problems)
    assert len({p.question for p in train_problems}) == len(train_problems)


def test_levels_equal_number_of_operations(train_problems):
    assert {p.level for p in train_problems} == {1, 2, 3}
    for problem in train_problems:
        assert len(re.findall(r" [-+*/] ", problem.expression)) == problem.level
        assert problem.solution.count(" = ") == problem.level


def test_requested_levels_only():
    problems = generate_problems("train", 100, levels=(2,))
    assert {p.level for p in problems} == {2}
    with pytest.raises(ValueError, match="levels"):
        generate_problems("train", 10, levels=(5,))
    four = generate_problems("eval", 20, levels=(4,))  # the held-out tail: one operation more than training's
    assert {p.level for p in four} == {4} and all(p.solution.count(" = ") == 4 for p in four)


def test_answers_match_an_independent_evaluation(train_problems, eval_problems):
    for problem in train_problems + eval_problems:
        value = evaluate_exactly(problem.expression)
        assert value.denominator == 1, problem
        assert 2 <= value <= MAX_VALUE
        assert problem.answer == str(value.numerator)


def test_solutions_are_correct_chains_ending_in_boxed_answer(train_problems):
    step_pattern = re.compile(r"^(\d+) ([-+*/]) (\d+) = (\d+)$")
    for problem in train_problems:
        lines = problem.solution.split("\n")
        assert problem.solution.endswith(f"\\boxed{{{problem.answer}}}")
        steps = [step_pattern.match(line) for line in lines[1:-1]]
        assert all(steps), problem.solution
        previous = None
        for step in steps:
            left, op, right, result = int(step[1]), step[2], int(step[3]), int(step[4])
            assert evaluate_exactly(f"{left} {op} {right}") == result
            assert previous is None or left == previous
            assert 2 <= result <= MAX_VALUE
            previous = result
        assert str(previous) == problem.answer


def test_question_states_every_number_of_the_expression(train_problems):
    for problem in train_problems[:500]:
        numbers_in_expression = re.findall(r"\d+", problem.expression)
        numbers_in_question = re.findall(r"\d+", problem.question)
        assert numbers_in_question == numbers_in_expression


def test_level_one_wording():
    problem = next(p for p in generate_problems("train", 50) if p.level == 1)
    assert re.fullmatch(r"\w+ (has|starts with|owns) \d+ [a-z ]+ and [^.]+\. How many [a-z ]+ does \w+ have (now|in the end)\?",
                        problem.question), problem.question


def test_bad_arguments():
    with pytest.raises(ValueError, match="split"):
        generate_problems("test", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_problems"):
        generate_problems("train", -1)
    assert generate_problems("train", 0) == []


SOLUTION = "Tom starts with 13 apples.\n13 - 8 = 5\n5 * 2 = 10\nThe answer is \\boxed{10}"


@pytest.mark.parametrize(("response", "kind"), [
    (SOLUTION, "none"),
    ("Tom starts with 13 pears.\n13 - 8 = 5\n5 * 2 = 10\nThe answer is \\boxed{10}", "none"),  # object not checked
    ("Tom starts with 13 apples.\n13 - 8 = 5\n5 * 2 = 10\nThe answer is 10", "no_answer"),
    ("Sam starts with 10 apples.\n10 - 8 = 2\n2 * 2 = 4\nThe answer is \\boxed{4}", "start_value"),
    ("Tom has apples.\n13 - 8 = 5\nThe answer is \\boxed{5}", "start_value"),
    ("Tom starts with 13 apples.\n13 - 8 = 5\nThe answer is \\boxed{5}", "steps"),
    ("Tom starts with 13 apples.\n13 - 8 = 5\n5 times 2 is 10\nThe answer is \\boxed{10}", "steps"),
    ("Tom starts with 13 apples.\n13 - 8 = 5\n6 * 2 = 12\nThe answer is \\boxed{12}", "carry_over"),
    ("Tom starts with 13 apples.\n13 + 8 = 21\n21 * 2 = 42\nThe answer is \\boxed{42}", "operation"),
    ("Tom starts with 13 apples.\n13 - 9 = 4\n4 * 2 = 8\nThe answer is \\boxed{8}", "operand"),
    ("Tom starts with 13 apples.\n13 - 8 = 6\n6 * 2 = 12\nThe answer is \\boxed{12}", "arithmetic"),
    ("Tom starts with 13 apples.\n13 - 8 = 5\n5 * 2 = 11\nThe answer is \\boxed{11}", "arithmetic"),
    ("Tom starts with 13 apples.\n13 - 8 = 5\n5 * 2 = 10\nThe answer is \\boxed{5}", "final_answer"),
])
def test_classify_response_names_the_first_departure(response, kind):
    assert classify_response(SOLUTION, response) == kind
    assert kind in ERROR_KINDS


def test_classify_response_on_generated_problems_and_bad_solutions():
    for problem in generate_problems("eval", 30, seed=3):
        assert classify_response(problem.solution, problem.solution) == "none"
    division = "Ana starts with 12 beads.\n12 / 5 = 2\nThe answer is \\boxed{2}"
    assert classify_response("Ana starts with 12 beads.\n12 / 4 = 3\nThe answer is \\boxed{3}", division) == "operand"
    with pytest.raises(ValueError, match="not a generated arithmetic solution"):
        classify_response("The answer is 3", "\\boxed{3}")


SMALL = ArithmeticNumbers(max_value=20, max_start=9, max_addend=9, max_subtrahend=9, max_factor=3, max_divisor=3)


def test_number_ranges_bound_every_operand_and_value():
    problems = generate_problems("train", 2000, levels=(1, 2, 3), numbers=SMALL)
    bounds = {"+": SMALL.max_addend, "-": SMALL.max_subtrahend, "*": SMALL.max_factor, "/": SMALL.max_divisor}
    seen = set()
    for problem in problems:
        lines = problem.solution.split("\n")
        start = int(re.search(r"starts with (\d+)", lines[0])[1])
        assert 2 <= start <= SMALL.max_start
        for line in lines[1:-1]:
            left, op, right, result = re.fullmatch(r"(\d+) ([-+*/]) (\d+) = (\d+)", line).groups()
            assert 2 <= int(right) <= bounds[op] and 2 <= int(result) <= SMALL.max_value, line
            seen.add((op, int(right)))
        assert evaluate_exactly(problem.expression) == int(problem.answer)
    # every operation and the edges of each range occur: the ranges bound the draw, they do not replace it
    assert {("+", 9), ("-", 9), ("*", 3), ("/", 3), ("+", 2), ("-", 2), ("*", 2), ("/", 2)} <= seen
    assert len({line for p in problems for line in p.solution.split("\n")[1:-1]}) < 300  # few facts to learn


def test_default_number_ranges_keep_the_original_problems():
    """The ranges' defaults are the original task: the same seeds give the same problems as before the ranges
    existed (sha256 of 2,000 training and 500 held-out problems, measured with the generator before the change),
    so every earlier config, warm start and recorded result keeps its data."""
    problems = generate_problems("train", 2000, seed=0) + generate_problems("eval", 500, seed=1)
    digest = hashlib.sha256(str([p.to_dict() for p in problems]).encode()).hexdigest()
    assert digest == "c99ee0c782b7569a08c3aae3bd63c2b1267d8544191b50503291ec94792d2a6e"


def test_number_ranges_that_cannot_generate_are_refused_naming_the_field():
    assert ArithmeticNumbers().problems() == [] and SMALL.problems() == []
    assert ArithmeticNumbers(max_factor=1).problems() == ["max_factor=1 must be ≥ 2"]
    assert ArithmeticNumbers(max_value=4, max_start=4).problems() == ["max_value=4 must be ≥ max_start (4) and ≥ 5"]
    assert ArithmeticNumbers(max_value=8, max_start=9).problems() == ["max_value=8 must be ≥ max_start (9) and ≥ 5"]
    with pytest.raises(ValueError, match="max_addend=0 must be ≥ 2"):
        generate_problems("train", 3, numbers=ArithmeticNumbers(max_addend=0))
    # the smallest usable ranges still generate every level: no story runs out of operations
    tiny = ArithmeticNumbers(max_value=5, max_start=2, max_addend=2, max_subtrahend=2, max_factor=2, max_divisor=2)
    assert len(generate_problems("train", 30, levels=(4,), numbers=tiny)) == 30


def test_direct_answer_is_the_boxed_answer_alone():
    problem = generate_problems("train", 1, seed=0)[0]
    assert direct_answer(problem) == f"The answer is \\boxed{{{problem.answer}}}"
    assert problem.solution.endswith(direct_answer(problem))  # the worked solution's last line


def test_stopped_early_gives_the_first_result_as_the_answer():
    problem = next(p for p in generate_problems("train", 50, seed=2) if p.level == 3)
    lines = problem.solution.split("\n")
    early = stopped_early(problem)
    first = re.fullmatch(r"(\d+) ([-+*/]) (\d+) = (\d+)", lines[1])[4]
    assert early == f"{lines[0]}\n{lines[1]}\nThe answer is \\boxed{{{first}}}"
    assert classify_response(problem.solution, early) == "steps"  # one operation line where three belong
    one = next(p for p in generate_problems("train", 50, seed=2) if p.level == 1)
    assert stopped_early(one) == one.solution  # with one operation, stopping after it is the whole solution


def test_narrated_writes_each_operation_s_sentence_before_its_equation():
    problem = MathProblem(
        id="x", question="Lily has 8 stickers. She buys 2 more. Then she sells 4 of them. How many stickers does "
                         "Lily have now?", answer="6", level=2,
        solution="Lily starts with 8 stickers.\n8 + 2 = 10\n10 - 4 = 6\nThe answer is \\boxed{6}")
    assert narrated(problem) == ("Lily starts with 8 stickers.\nShe buys 2 more.\n8 + 2 = 10\n"
                                 "Then she sells 4 of them.\n10 - 4 = 6\nThe answer is \\boxed{6}")
    assert narrated(problem, stop_early=True) == ("Lily starts with 8 stickers.\nShe buys 2 more.\n8 + 2 = 10\n"
                                                  "The answer is \\boxed{10}")
    one = MathProblem(id="y", question="Tom owns 5 candies and splits his candies into 5 equal groups and keeps one "
                                       "group. How many candies does Tom have now?", answer="1", level=1,
                      solution="Tom starts with 5 candies.\n5 / 5 = 1\nThe answer is \\boxed{1}")
    assert narrated(one) == ("Tom starts with 5 candies.\nHe splits his candies into 5 equal groups and keeps one "
                             "group.\n5 / 5 = 1\nThe answer is \\boxed{1}")


def test_narrated_reads_every_generated_problem_and_refuses_other_text():
    for problem in generate_problems("train", 400, seed=3, levels=(1, 2, 3, 4)):
        text = narrated(problem)
        lines = text.split("\n")
        assert len(lines) == 2 + 2 * problem.level and lines[-1] == problem.solution.split("\n")[-1]
        assert lines[2::2] == problem.solution.split("\n")[1:-1]  # the equations, in order
        if problem.level > 1:  # the story's own sentences, verbatim
            assert all(sentence in problem.question for sentence in lines[1::2][:-1])
    bad = MathProblem(id="z", question="What is 2 + 2?", answer="4", level=1,
                      solution="Tom starts with 2 apples.\n2 + 2 = 4\nThe answer is \\boxed{4}")
    with pytest.raises(ValueError, match="not a generated arithmetic question"):
        narrated(bad)
    with pytest.raises(ValueError, match="not a generated arithmetic solution"):
        narrated(MathProblem(id="w", question="q", answer="4", solution="The answer is \\boxed{4}"))

"""Gold answers checked at start-up: a gold math-verify cannot read would score every answer 0 (`invalid_gold`)."""

from __future__ import annotations

import json

import pytest

from nemo_hacpo.config import RewardConfig, load_config
from nemo_hacpo.data.problem import MathProblem
from nemo_hacpo.data.splits import load_split
from nemo_hacpo.data.validation import DataError
from nemo_hacpo.eval.targets import check_golds
from nemo_hacpo.rewards.math import gold_problem

MATH = RewardConfig()


@pytest.mark.parametrize(("gold", "readable"), [
    ("72", True), ("-3", True), ("\\frac{1}{2}", True), ("x^2+1", True), ("0.25", True),
    ("She sells 16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\n#### 18", False),  # a GSM8K solution, not its answer
    ("seventy-two", False), ("", False), ("\\frac{", False),
])
def test_which_golds_math_verify_can_read(gold, readable):
    assert (gold_problem(gold) is None) == readable, gold_problem(gold)


def _problems(golds: list[str]) -> list[MathProblem]:
    return [MathProblem(id=f"p{i}", question=f"q{i}", answer=g, origin=f"own.jsonl:{i + 1}")
            for i, g in enumerate(golds)]


def test_under_error_one_unreadable_gold_stops_naming_its_line_the_share_and_the_fixes():
    problems = _problems(["1", "2", "text then #### 3", "4"])
    with pytest.raises(DataError) as caught:
        check_golds(problems, "data.train", "error", MATH)
    message = str(caught.value)
    assert "1 of 4 gold answers (25%) cannot be read by math-verify" in message
    assert "own.jsonl:3: gold answer 'text then #### 3' cannot be verified" in message
    assert "data.train.answer_field" in message and "data.train.answer_format=gsm8k" in message
    assert "data.on_invalid=skip" in message


def test_under_skip_a_few_are_dropped_and_a_share_above_the_threshold_still_stops():
    few = _problems([str(i) for i in range(39)] + ["#### 5 words here"])  # 1 of 40: 2.5 % ≤ 5 %
    assert [p.id for p in check_golds(few, "data.train", "skip", MATH, max_share=0.05)] == [f"p{i}" for i in range(39)]
    many = _problems(["1", "#### 2 words", "#### 3 words", "4"])  # 50 %
    with pytest.raises(DataError) as caught:
        check_golds(many, "data.eval", "skip", MATH, max_share=0.05)
    assert "2 of 4 gold answers (50%)" in str(caught.value)
    assert "data.max_invalid_gold_share = 0.05" in str(caught.value)


def test_a_reward_function_of_the_users_reads_golds_its_own_way():
    problems = _problems(["not math at all", "#### 3"])
    assert check_golds(problems, "data.train", "error", RewardConfig(function="m:f")) == problems


def test_answer_format_gsm8k_reads_the_answer_after_the_last_marker(tmp_path):
    path = tmp_path / "own.jsonl"
    path.write_text("\n".join(json.dumps({"question": f"q{i}", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i:,}0"})
                              for i in range(1, 4)) + "\n")
    cfg = load_config("pair_tiny_gpt", ["data.train.source=jsonl", f"data.train.path={path}",
                                        "data.train.answer_format=gsm8k"])
    assert [p.answer for p in load_split(cfg.data.train, "train")] == ["20", "40", "60"]
    plain = load_config("pair_tiny_gpt", ["data.train.source=jsonl", f"data.train.path={path}"])
    with pytest.raises(DataError, match="data.train.answer_format=gsm8k"):
        check_golds(load_split(plain.data.train, "train"), "data.train", "error", MATH)

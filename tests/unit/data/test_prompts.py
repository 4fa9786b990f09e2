"""Chat messages built from problems."""

from __future__ import annotations

import pytest

from nemo_hacpo.data.problem import MathProblem
from nemo_hacpo.data.prompts import (
    DEFAULT_INSTRUCTION,
    build_chat_messages,
    problem_to_messages,
    problem_to_sft_messages,
)

PROBLEM = MathProblem(id="p-1", question="Tom has 3 apples and buys 4 more. How many apples does Tom have now?",
                      answer="7", level=1, solution="Tom starts with 3 apples.\n3 + 4 = 7\nThe answer is \\boxed{7}")


def test_user_message_is_question_then_boxed_instruction():
    messages = problem_to_messages(PROBLEM)
    assert messages == [{"role": "user", "content": PROBLEM.question + "\n" + DEFAULT_INSTRUCTION}]
    assert "\\boxed{}" in DEFAULT_INSTRUCTION


def test_system_prompt_is_optional_and_first():
    assert problem_to_messages(PROBLEM, system_prompt="You are a careful solver.")[0] == {
        "role": "system", "content": "You are a careful solver."}
    assert [m["role"] for m in problem_to_messages(PROBLEM, system_prompt="")] == ["user"]


def test_instruction_can_be_replaced_or_dropped():
    assert build_chat_messages("Q?", instruction=None) == [{"role": "user", "content": "Q?"}]
    assert build_chat_messages("Q?", instruction="Answer in \\boxed{}.", separator=" ") == [
        {"role": "user", "content": "Q? Answer in \\boxed{}."}]


def test_sft_messages_end_with_the_solution():
    messages = problem_to_sft_messages(PROBLEM)
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[-1]["content"].endswith("\\boxed{7}")
    with pytest.raises(ValueError, match="no solution"):
        problem_to_sft_messages(MathProblem(id="x", question="q", answer="1"))


def test_record_round_trips_through_dict():
    assert MathProblem.from_dict(PROBLEM.to_dict()) == PROBLEM
    with pytest.raises(ValueError, match="unknown keys"):
        MathProblem.from_dict({**PROBLEM.to_dict(), "extra": 1})


def test_a_prompt_format_fills_its_template_literally_and_the_default_is_the_instruction():
    from nemo_hacpo.data.prompts import PromptFormat

    assert PromptFormat().messages(PROBLEM) == problem_to_messages(PROBLEM)  # the default: question + instruction
    custom = PromptFormat(template="Solve: {question}\nEnd with: The answer is <number>. {not a field} \\boxed{}",
                          system_prompt="You are terse.")
    assert custom.messages(PROBLEM) == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": f"Solve: {PROBLEM.question}\nEnd with: The answer is <number>. {{not a field}} "
                                    "\\boxed{}"}]
    assert custom.sft_messages(PROBLEM)[-1] == {"role": "assistant", "content": PROBLEM.solution}


def test_each_data_set_has_its_own_template_and_system_prompt_else_the_shared_one():
    from nemo_hacpo.config import load_config
    from nemo_hacpo.data.prompts import PromptFormat

    cfg = load_config("pair_tiny_gpt", ["data.system_prompt=Be careful.", "data.eval.system_prompt=",
                                        "data.train.prompt_template='Q: {question}'"])  # quoted: Hydra
    assert PromptFormat.of(cfg.data, "train") == PromptFormat("Q: {question}", "Be careful.")
    evaluation = PromptFormat.of(cfg.data, "eval")
    assert evaluation.system_prompt == "" and evaluation.messages(PROBLEM) == problem_to_messages(PROBLEM)


@pytest.mark.parametrize("template", ["no placeholder", "{question} and {question}"])
def test_a_template_without_exactly_one_question_fails_at_start_up_naming_its_key(template):
    from nemo_hacpo.config import ConfigError, load_config

    with pytest.raises(ConfigError) as caught:
        load_config("pair_tiny_gpt", [f"data.eval.prompt_template='{template}'"])
    assert "data.eval.prompt_template" in str(caught.value) and "exactly once" in str(caught.value)

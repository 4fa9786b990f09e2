"""Turn a problem into chat messages; each agent renders them with its own chat template (algorithm.md §7).

The messages are the tokenizer-independent form of a prompt: the broker and the rollout engine pass
them to ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)`` of each agent.
"""

from __future__ import annotations

from nemo_hacpo.data.problem import MathProblem

DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
"""Appended to every question; the verifier extracts the last ``\\boxed{...}`` of the response."""

ChatMessage = dict[str, str]
"""``{"role": "system" | "user" | "assistant", "content": str}``."""


def build_chat_messages(
    question: str,
    *,
    system_prompt: str | None = None,
    instruction: str | None = DEFAULT_INSTRUCTION,
    separator: str = "\n",
) -> list[ChatMessage]:
    """Chat messages for one question.

    Args:
        question: the problem text.
        system_prompt: optional system message, placed first; ``None`` or ``""`` for none.
        instruction: the answer-format instruction appended to the question (``None`` or ``""``: none).
        separator: text between question and instruction.

    Returns:
        ``[{"role": "system", ...}?, {"role": "user", "content": question + separator + instruction}]``.
    """
    messages: list[ChatMessage] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    content = f"{question}{separator}{instruction}" if instruction else question
    messages.append({"role": "user", "content": content})
    return messages


def problem_to_messages(
    problem: MathProblem,
    *,
    system_prompt: str | None = None,
    instruction: str | None = DEFAULT_INSTRUCTION,
) -> list[ChatMessage]:
    """:func:`build_chat_messages` for ``problem.question``."""
    return build_chat_messages(problem.question, system_prompt=system_prompt, instruction=instruction)


def problem_to_sft_messages(
    problem: MathProblem,
    *,
    system_prompt: str | None = None,
    instruction: str | None = DEFAULT_INSTRUCTION,
) -> list[ChatMessage]:
    """Prompt messages plus the worked solution as the assistant turn (supervised warm start).

    Raises:
        ValueError: if the problem has no ``solution``.
    """
    if not problem.solution:
        raise ValueError(f"problem {problem.id!r} has no solution to train on")
    messages = problem_to_messages(problem, system_prompt=system_prompt, instruction=instruction)
    messages.append({"role": "assistant", "content": problem.solution})
    return messages

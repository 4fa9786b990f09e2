"""Turn a problem into chat messages; each agent renders them with its own chat template (algorithm.md §7).

The messages are the tokenizer-independent form of a prompt: the broker and the rollout engine pass
them to ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)`` of each agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nemo_hacpo.config.schema import DEFAULT_PROMPT_TEMPLATE, QUESTION
from nemo_hacpo.data.problem import MathProblem

DEFAULT_INSTRUCTION = DEFAULT_PROMPT_TEMPLATE.split("\n", 1)[1]
"""Appended to every question by the default template; the verifier extracts the last ``\\boxed{...}``."""

ChatMessage = dict[str, str]
"""``{"role": "system" | "user" | "assistant", "content": str}``."""


@dataclass(frozen=True)
class PromptFormat:
    """How a data set's problems become chat messages: a system message (or none) and the user message's template.

    `PromptFormat.of(cfg.data, "train")` is what training, the warm start and the prompt-length check use;
    `"eval"` what the held-out evaluation and `recipes/evaluate.py` with a run's config use."""

    template: str = DEFAULT_PROMPT_TEMPLATE
    system_prompt: str | None = None

    @classmethod
    def of(cls, data: Any, split: str) -> PromptFormat:
        """The format of `data.<split>` (a `DataConfig`): its own system prompt, else `data.system_prompt`."""
        dataset = getattr(data, split)
        system = dataset.system_prompt if dataset.system_prompt is not None else data.system_prompt
        return cls(template=dataset.prompt_template, system_prompt=system)

    def user_message(self, question: str) -> str:
        return self.template.replace(QUESTION, question, 1)

    def messages(self, problem: MathProblem) -> list[ChatMessage]:
        """`[{"role": "system", ...}?, {"role": "user", "content": template with the question}]`."""
        messages: list[ChatMessage] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": self.user_message(problem.question)})
        return messages

    def sft_messages(self, problem: MathProblem) -> list[ChatMessage]:
        """`messages` plus the worked solution as the assistant turn (supervised warm start); ValueError without
        a solution."""
        if not problem.solution:
            raise ValueError(f"problem {problem.id!r} has no solution to train on")
        return [*self.messages(problem), {"role": "assistant", "content": problem.solution}]


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

"""Chat prompts: the message record every agent starts from, and rendering it with one agent's chat template.

Agents exchange prompts as plain chat messages; each one renders them with **its own** template and tokenizer
(algorithm.md §7). The rollout engine, the broker's re-encoding and the warm start all render through
`render_prompt_ids`, so an agent's own samples and the cross samples it is trained on share one prompt encoding.

    ids = render_prompt_ids([{"role": "user", "content": "What is 2 + 3?"}], tokenizer)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nemo_hacpo.data.prompts import PromptFormat


@dataclass(frozen=True)
class Message:
    """One chat turn."""

    role: str
    content: str


def as_messages(messages: Iterable[Mapping[str, str] | Message]) -> tuple[Message, ...]:
    """Normalise `[{"role": ..., "content": ...}, ...]` (or Messages) into an immutable tuple."""
    out = []
    for m in messages:
        if isinstance(m, Message):
            out.append(m)
        else:
            unknown = set(m) - {"role", "content"}
            if unknown or "role" not in m or "content" not in m:
                raise ValueError(f"a message needs exactly 'role' and 'content', got keys {sorted(m)}")
            out.append(Message(str(m["role"]), str(m["content"])))
    if not out:
        raise ValueError("a prompt needs at least one message")
    return tuple(out)


def messages_as_dicts(messages: Sequence[Message]) -> list[dict[str, str]]:
    """The list-of-dicts form that `tokenizer.apply_chat_template` takes."""
    return [{"role": m.role, "content": m.content} for m in messages]


def render_prompt_text(messages: Sequence[Message] | Sequence[dict], tokenizer: Any,
                       chat_template: str | None = None) -> str:
    """The prompt rendered with the tokenizer's (or the given) chat template, generation prompt on."""
    return tokenizer.apply_chat_template(messages_as_dicts(as_messages(messages)), tokenize=False,
                                         add_generation_prompt=True, chat_template=chat_template)


def render_prompt_ids(messages: Sequence[Message] | Sequence[dict], tokenizer: Any,
                      chat_template: str | None = None) -> list[int]:
    """Token ids of the rendered prompt. The template writes any BOS itself, so no special tokens are added
    (adding them would duplicate the BOS). The rollout engine feeds exactly these ids to vLLM."""
    text = render_prompt_text(messages, tokenizer, chat_template)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_token_counts(prompts: Sequence[Sequence[Message] | Sequence[dict]], tokenizer: Any,
                        chat_template: str | None = None) -> list[int]:
    """Tokens of each rendered prompt (what the engine is fed), with one batched tokenizer call."""
    texts = [render_prompt_text(messages, tokenizer, chat_template) for messages in prompts]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []


def prompt_length_issues(problems: Sequence[Any], agents: Sequence[tuple[str, Any, str | None, int]],
                         prompt_format: PromptFormat | None = None) -> list[Any]:
    """A `DataIssue` for every problem whose prompt is longer than an agent's `max_prompt_length` in that agent's
    own chat template and tokenizer (`agents`: `(name, tokenizer, chat_template, max_prompt_length)`).

    Every agent must read every prompt: a prompt too long for one agent cannot be shared, so it is an issue of
    the data set, found before training starts rather than when the batch that holds it is sampled."""
    from nemo_hacpo.data.prompts import PromptFormat
    from nemo_hacpo.data.validation import DataIssue

    prompt_format = prompt_format or PromptFormat()
    messages = [prompt_format.messages(p) for p in problems]
    too_long: dict[str, list[str]] = {}
    for name, tokenizer, template, limit in agents:
        for problem, count in zip(problems, prompt_token_counts(messages, tokenizer, template), strict=True):
            if count > limit:
                too_long.setdefault(problem.id, []).append(f"{name}: {count} > {limit}")
    return [DataIssue(p.origin or p.id, f"prompt too long in tokens ({'; '.join(too_long[p.id])}; "
                      "raise max_prompt_length or shorten the question)", problem_id=p.id)
            for p in problems if p.id in too_long]

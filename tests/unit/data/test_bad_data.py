"""Bad data is found at load time and reported with its file and line; `data.on_invalid=skip` drops it instead.

One test per fault a user hits (missing / null / empty / non-text fields, malformed JSON lines, a line that is not
UTF-8, an empty file, a parquet file without the column), the skip policy's count, and a fuzz test: whatever the
bytes of a JSONL file, loading either gives problems whose every field is real text or a `DataError` naming a line.
"""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_hacpo.data.loaders import load_problems, read_records
from nemo_hacpo.data.problem import MathProblem
from nemo_hacpo.data.validation import DataError, DataIssue, apply_policy


def _jsonl(tmp_path, lines: list[str], name: str = "train.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _problems_of(error: DataError) -> list[str]:
    return [issue.problem for issue in error.issues]


@pytest.mark.parametrize(("record", "message"), [
    ({"question": "q"}, "field 'answer': no key 'answer'"),
    ({"question": "q", "answer": None}, "answer field 'answer' is null"),
    ({"question": "q", "answer": "  "}, "answer field 'answer' is empty"),
    ({"question": "q", "answer": [1, 2]}, "answer field 'answer' is a list, not text"),
    ({"question": "q", "answer": True}, "answer field 'answer' is a bool, not text"),
    ({"answer": "4"}, "field 'question': no key 'question'"),
    ({"question": None, "answer": "4"}, "question field 'question' is null"),
    ({"question": "", "answer": "4"}, "question field 'question' is empty"),
    ({"question": 12, "answer": "4"}, "question field 'question' is a int, not text"),
])
def test_each_bad_record_is_named_with_its_file_and_line(tmp_path, record, message):
    path = _jsonl(tmp_path, [json.dumps({"question": "2 + 2?", "answer": 4}), json.dumps(record)])
    with pytest.raises(DataError) as info:
        load_problems(path, what="data.train")
    assert [issue.key for issue in info.value.issues] == ["data.train"]
    (problem,) = _problems_of(info.value)
    assert problem.startswith(f"{path}:2: {message}"), problem
    assert "data.on_invalid=skip" in str(info.value) and str(info.value).startswith("invalid data (1 problem(s))")


def test_numbers_are_answers_and_blank_lines_are_not_records(tmp_path):
    path = _jsonl(tmp_path, [json.dumps({"question": "2 + 2?", "answer": 4}), "",
                             json.dumps({"question": "1 / 2?", "answer": 0.5})])
    problems = load_problems(path)
    assert [(p.answer, p.origin) for p in problems] == [("4", f"{path}:1"), ("0.5", f"{path}:3")]


def test_malformed_and_non_utf8_lines_are_named(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"question": "q", "answer": "1"}\n{"question": "q", "answer": \n[1, 2]\n'
                     b'{"question": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(DataError) as info:
        load_problems(path)
    assert _problems_of(info.value) == [
        f"{path}:2: not a JSON object: Expecting value at column 29",
        f"{path}:3: a list, not an object",
        f"{path}:4: not UTF-8 (byte 0xe9 at column 18)",
    ]


def test_an_empty_file_and_an_unreadable_json_array_are_errors(tmp_path):
    empty = _jsonl(tmp_path, [""], "empty.jsonl")
    with pytest.raises(DataError, match="the file holds no records"):
        load_problems(empty)
    broken = tmp_path / "broken.json"
    broken.write_text('[{"question": "q", "answer": "1"},')
    with pytest.raises(DataError, match="not a readable JSON array"):
        load_problems(broken)
    array = tmp_path / "ok.json"
    array.write_text(json.dumps([{"question": "q", "answer": "1"}, 7]))
    with pytest.raises(DataError, match=r"ok.json:record 1: a int, not an object"):
        load_problems(array)


def test_a_parquet_file_without_the_field_names_the_row(tmp_path):
    import pyarrow
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pyarrow.table({"problem": ["1 + 1?"], "answer": ["2"]}), path)
    with pytest.raises(DataError, match=r"train.parquet:row 0: field 'question': no key 'question' \(available: "
                                        r"\['answer', 'problem'\]\)"):
        load_problems(path)
    assert load_problems(path, question_field="problem")[0].origin == f"{path}:row 0"
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="not a readable parquet file"):
        load_problems(garbage)


def test_skip_drops_the_bad_records_and_says_how_many(tmp_path, caplog):
    lines = [json.dumps({"question": f"q{i}", "answer": str(i)}) for i in range(4)]
    lines[1] = json.dumps({"question": "q1"})
    lines[3] = "{oops"
    path = _jsonl(tmp_path, lines)
    with caplog.at_level(logging.WARNING, logger="nemo_hacpo.data.validation"):
        problems = load_problems(path, on_invalid="skip")
    assert [p.question for p in problems] == ["q0", "q2"]
    assert "skipped 2 invalid record(s)" in caplog.text and f"{path}:2" in caplog.text and f"{path}:4" in caplog.text
    only_bad = _jsonl(tmp_path, ["{oops"], "bad.jsonl")
    with pytest.raises(DataError, match="every record is invalid"):
        load_problems(only_bad, on_invalid="skip")


def test_apply_policy_drops_problems_by_id():
    problems = [MathProblem(id=f"p{i}", question="q", answer="1") for i in range(3)]
    issues = [DataIssue("p1", "prompt too long", problem_id="p1")]
    assert [p.id for p in apply_policy(problems, issues, "skip", "data.train")] == ["p0", "p2"]
    with pytest.raises(DataError, match="data.train: p1: prompt too long"):
        apply_policy(problems, issues, "error", "data.train")
    with pytest.raises(ValueError, match="unknown policy"):
        apply_policy(problems, issues, "ignore", "data.train")  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(
    st.binary(max_size=40),
    st.dictionaries(st.sampled_from(["question", "answer", "other"]),
                    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                              st.text(max_size=8), st.lists(st.integers(), max_size=2)), max_size=3)), max_size=6))
def test_fuzzed_jsonl_loads_clean_problems_or_names_a_line(tmp_path, rows):
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(b"\n".join(row if isinstance(row, bytes) else json.dumps(row).encode() for row in rows))
    try:
        problems = load_problems(path, on_invalid="skip")
    except DataError as err:  # an empty file, or every record bad: named, never a raw traceback
        assert err.issues and all(str(path) in str(issue) for issue in err.issues)
        return
    for problem in problems:
        assert problem.question.strip() and problem.answer.strip() and problem.origin.startswith(f"{path}:")
    assert len(problems) <= len([r for r in read_records(path) if not isinstance(r[1], DataIssue)])

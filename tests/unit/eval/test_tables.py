"""The result files, byte for byte, for a small hand-made evaluation."""

from __future__ import annotations

import json
import math

from nemo_hacpo.data import MathProblem
from nemo_hacpo.eval.runner import EvalResult, ProblemResponses, ScoredResponse, ScoredResponses
from nemo_hacpo.eval.tables import (
    answers_file_name,
    csv_text,
    json_text,
    markdown_text,
    progress_line,
    result_row,
    write_results,
)

P1 = MathProblem(id="p1", question="3 + 4?", answer="7", level=1, source="toy")
P2 = MathProblem(id="p2", question="3 * 4?", answer="12", source="toy")


def _response(reward: float, tokens: int, finish: str, text: str = "t") -> ScoredResponse:
    return ScoredResponse(text=text, reward=reward, status="correct" if reward else "wrong", num_tokens=tokens,
                          finish_reason=finish)


def _results() -> list[EvalResult]:
    greedy = ScoredResponses(problems=(ProblemResponses(P1, (_response(1.0, 5, "stop", "\\boxed{7}"),)),
                                       ProblemResponses(P2, (_response(0.0, 8, "length", "\\boxed{1}"),))),
                             num_samples=1)
    sampled = ScoredResponses(problems=(ProblemResponses(P1, (_response(1.0, 4, "stop"), _response(0.0, 6, "stop"))),
                                        ProblemResponses(P2, (_response(0.0, 2, "length"), _response(0.0, 8, "stop")))),
                              num_samples=2, pass_ks=(1, 2))
    both = EvalResult(agent="a", dataset="toy", num_problems=2, greedy=greedy, sampled=sampled, elapsed_s=2.0)
    greedy_only = EvalResult(agent="b/x", dataset="toy", num_problems=2, greedy=greedy, sampled=None, elapsed_s=4.0)
    return [both, greedy_only]


COLUMNS = ("agent,dataset,n_problems,greedy_avg@1,avg@2,pass@1,pass@2,greedy_response_tokens,greedy_truncation_rate,"
           "sampled_response_tokens,sampled_truncation_rate,prompt_too_long,elapsed_s,problems_per_s")


def test_rows_hold_hand_computed_numbers():
    row = result_row(_results()[0])
    # greedy 1 of 2; sampled [1, 0], [0, 0]: avg@2 = 0.25, pass@2 = (1 + 0) / 2; tokens (5 + 8) / 2 and 20 / 4
    assert row == {"agent": "a", "dataset": "toy", "n_problems": 2, "greedy_avg@1": 0.5, "avg@2": 0.25,
                   "pass@1": 0.25, "pass@2": 0.5, "greedy_response_tokens": 6.5, "greedy_truncation_rate": 0.5,
                   "sampled_response_tokens": 5.0, "sampled_truncation_rate": 0.25, "prompt_too_long": 0,
                   "elapsed_s": 2.0, "problems_per_s": 1.0}
    assert ",".join(row) == COLUMNS


def test_csv_markdown_and_json_text():
    rows = [result_row(r) for r in _results()]
    assert csv_text(rows) == (
        COLUMNS + "\n"
        "a,toy,2,0.500000,0.250000,0.250000,0.500000,6.500000,0.500000,5.000000,0.250000,0,2.000000,1.000000\n"
        "b/x,toy,2,0.500000,,,,6.500000,0.500000,,,0,4.000000,0.500000\n")
    header = "| " + " | ".join(COLUMNS.split(",")) + " |"
    assert markdown_text(rows, "Eval", "seed=0") == "\n".join([
        "# Eval", "", "seed=0", "", header, "|" + "|".join(["---"] * 14) + "|",
        "| a | toy | 2 | 0.500 | 0.250 | 0.250 | 0.500 | 6.500 | 0.500 | 5.000 | 0.250 | 0 | 2.000 | 1.000 |",
        "| b/x | toy | 2 | 0.500 |  |  |  | 6.500 | 0.500 |  |  | 0 | 4.000 | 0.500 |", ""])
    rows[1]["greedy_response_tokens"] = math.nan
    document = json.loads(json_text(rows, {"samples": 2}))
    assert document["settings"] == {"samples": 2}
    assert document["results"][0] == result_row(_results()[0])
    assert document["results"][1]["greedy_response_tokens"] is None and "avg@2" not in document["results"][1]
    assert csv_text(rows).splitlines()[2] == "b/x,toy,2,0.500000,,,,,0.500000,,,0,4.000000,0.500000"


def test_write_results_files_and_answers(tmp_path):
    settings = {"samples": 2, "pass_ks": [1, 2], "agents": {"a": "/ckpt/a"}}
    paths = write_results(_results(), tmp_path, settings, title="Eval")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["answers", "results.csv", "results.json", "results.md"]
    assert paths["markdown"].read_text().splitlines()[:3] == ["# Eval", "", "samples=2, pass_ks=1,2"]
    assert paths["csv"].read_text() == csv_text([result_row(r) for r in _results()])
    assert json.loads(paths["json"].read_text())["settings"] == settings
    assert sorted(p.name for p in (tmp_path / "answers").iterdir()) == ["a__toy.jsonl", "b_x__toy.jsonl"]
    lines = (tmp_path / "answers" / "a__toy.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {
        "id": "p1", "question": "3 + 4?", "gold": "7", "solution": "", "source": "toy", "level": 1,
        "num_correct": {"greedy": 1, "sampled": 1},
        "responses": [
            {"mode": "greedy", "index": 0, "text": "\\boxed{7}", "reward": 1.0, "status": "correct", "num_tokens": 5,
             "finish_reason": "stop"},
            {"mode": "sampled", "index": 0, "text": "t", "reward": 1.0, "status": "correct", "num_tokens": 4,
             "finish_reason": "stop"},
            {"mode": "sampled", "index": 1, "text": "t", "reward": 0.0, "status": "wrong", "num_tokens": 6,
             "finish_reason": "stop"}]}
    second = json.loads(lines[1])
    assert second["id"] == "p2" and second["level"] is None and second["num_correct"] == {"greedy": 0, "sampled": 0}
    greedy_only = json.loads((tmp_path / "answers" / "b_x__toy.jsonl").read_text().splitlines()[0])
    assert [r["mode"] for r in greedy_only["responses"]] == ["greedy"]


def test_file_names_and_progress_line():
    assert answers_file_name("llama_tiny", "gsm8k") == "llama_tiny__gsm8k.jsonl"
    assert answers_file_name("a b", "my/data.v1") == "a_b__my_data.v1.jsonl"
    assert progress_line(_results()[0]) == ("a on toy | 2 problems in 2.0 s (1.00 problems/s) | greedy_avg@1=0.500 | "
                                            "avg@2=0.250 | pass@1=0.250 | pass@2=0.500")

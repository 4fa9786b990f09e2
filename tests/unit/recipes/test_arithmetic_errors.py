"""recipes/arithmetic_errors.py: per-level accuracy and first-error counts from evaluate.py's answer files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from nemo_hacpo.data.arithmetic import generate_problems

REPO = Path(__file__).resolve().parents[3]


def _recipe():
    spec = importlib.util.spec_from_file_location("arithmetic_errors", REPO / "recipes" / "arithmetic_errors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(problem, *texts_rewards, mode="greedy"):
    return {"id": problem.id, "question": problem.question, "gold": problem.answer, "solution": problem.solution,
            "source": problem.source, "level": problem.level,
            "responses": [{"mode": mode, "index": i, "text": t, "reward": r} for i, (t, r) in enumerate(texts_rewards)]}


def test_breakdown_table_and_plot(tmp_path, capsys):
    one, two = generate_problems("eval", 2, seed=5, levels=[1])
    wrong_fact = one.solution.replace(f"= {one.answer}", f"= {int(one.answer) + 1}")
    answers = tmp_path / "a__heldout.jsonl"
    answers.write_text("\n".join(json.dumps(r) for r in [
        _record(one, (wrong_fact, 0.0)),
        _record(two, (two.solution, 1.0)),
        {"id": "g1", "question": "q", "gold": "1", "solution": "", "source": "gsm8k", "level": None,
         "responses": [{"mode": "greedy", "index": 0, "text": "\\boxed{1}", "reward": 1.0}]},
    ]) + "\n")
    recipe = _recipe()
    row = recipe.breakdown(answers, "greedy")
    assert row["responses"] == 2 and row["accuracy"] == 0.5 and row["level 1"] == 0.5
    assert row["arithmetic"] == 1 and row["wrong"] == 1 and row["skipped problems"] == 1
    assert sum(row[k] for k in recipe.WRONG_KINDS) == 1
    assert recipe.main([str(answers), "--out", str(tmp_path / "errors")]) == 0
    assert "| a__heldout | 2 | 0.500 | 0.500 |" in capsys.readouterr().out
    assert (tmp_path / "errors.md").read_text().startswith("# Arithmetic errors (greedy)")
    assert (tmp_path / "errors.png").stat().st_size > 0
    assert recipe.main([str(answers), "--mode", "sampled"]) == 2  # no sampled responses: a clear error


def test_missing_and_malformed_files(tmp_path, capsys):
    recipe = _recipe()
    assert recipe.main([str(tmp_path / "nope.jsonl")]) == 2
    assert "no answers file at" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not JSON"):
        recipe.breakdown(bad, "greedy")

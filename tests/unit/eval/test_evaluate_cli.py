"""recipes/evaluate.py's argument checks: every mistake exits 2 with one line naming the cause, before any engine."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from nemo_hacpo.config import dump_config, load_config

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("evaluate_recipe", ROOT / "recipes" / "evaluate.py")
recipe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recipe)


def _fails(capsys, *argv: str) -> str:
    assert recipe.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    return err


def test_defaults():
    args = recipe.parse_args(["--run", "r"])
    assert (args.greedy, args.samples, args.pass_k, args.temperature, args.seed, args.dataset, args.out) == (
        True, 0, None, 1.0, 0, [], None)
    assert recipe.parse_args(["--run", "r", "--no-greedy", "--samples", "4"]).greedy is False


def test_what_to_evaluate_must_be_given_once(capsys, tmp_path):
    assert "give either --run DIR or one or more --model NAME=DIR" in _fails(capsys)
    assert "give either" in _fails(capsys, "--run", str(tmp_path), "--model", f"m={tmp_path}")
    assert "--config-name is for --model" in _fails(capsys, "--run", str(tmp_path), "--config-name", "pair_tiny_gpt")


def test_missing_paths_are_named(capsys, tmp_path):
    assert f"no run config at {tmp_path / 'config.yaml'}" in _fails(capsys, "--run", str(tmp_path))
    missing = tmp_path / "ckpt"
    assert f"model 'm': no checkpoint directory at {missing}" in _fails(capsys, "--model", f"m={missing}")


@pytest.fixture
def run_dir(tmp_path):
    (tmp_path / "config.yaml").write_text(dump_config(load_config("pair_tiny_gpt")))
    for name in ("llama_tiny", "gpt_tiny"):
        (tmp_path / "hf" / name).mkdir(parents=True)
        (tmp_path / "hf" / name / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
        (tmp_path / "hf" / name / "tokenizer.json").write_text("{}")
    return tmp_path


def test_option_mistakes(capsys, run_dir):
    run = str(run_dir)
    assert "--pass-k needs --samples K" in _fails(capsys, "--run", run, "--pass-k", "1,2")
    assert "pass@16 needs at least 16 samples" in _fails(capsys, "--run", run, "--samples", "8", "--pass-k", "1,16")
    missing = run_dir / "data.jsonl"
    assert f"no file exists at {missing}" in _fails(capsys, "--run", run, "--dataset", str(missing))
    assert "unknown key 'q'" in _fails(capsys, "--run", run, "--field", "q=problem")
    assert "has no agent ['qwen']" in _fails(capsys, "--run", run, "--agent", "qwen")
    assert "nothing to evaluate" in _fails(capsys, "--run", run, "--no-greedy", "--limit", "2")


def test_engine_settings_are_checked_before_any_engine_starts(capsys, run_dir):
    (run_dir / "hf" / "gpt_tiny" / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    err = _fails(capsys, "--run", str(run_dir), "--limit", "2", "--device", "cpu")
    assert f"the checkpoint in {run_dir / 'hf' / 'gpt_tiny'} has 64 positions, fewer than" in err
    assert "max_prompt_length + max_response_length = 480" in err

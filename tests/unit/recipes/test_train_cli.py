"""recipes/train.py as a user runs it: config errors name the key and exit 2; --describe and --cfg job work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "recipes" / "train.py"), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_invalid_config_fails_at_startup_naming_keys():
    proc = _run("agents.0.parallel.tp=3", "algo.delta=2")
    assert proc.returncode == 2
    assert "agents[0].parallel.tp" in proc.stderr and "algo.delta" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cfg_job_prints_resolved_config():
    proc = _run("--cfg", "job", "algo=gspo_x2")
    assert proc.returncode == 0, proc.stderr
    assert "name: gspo_x2" in proc.stdout and "llama_tiny" in proc.stdout


def test_describe_lists_documented_keys():
    proc = _run("--describe")
    assert proc.returncode == 0
    assert "algo.delta_step = 0.025 — " in proc.stdout


def test_compose_errors_are_one_message_not_a_traceback():
    for args, message in ((("--config-name", "nope"), "no config 'nope'"),
                          (("algo=nope",), "Could not find 'algo/nope'"),
                          (("agents.0.optimizer.lr=[",), "cannot compose config 'pair_tiny'")):
        proc = _run(*args)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_plan_with_zero_sizes_names_the_keys_instead_of_dividing_by_zero():
    proc = _run("--plan", "agents.0.parallel.micro_batch_size=0", "agents.1.parallel.dp=0",
                "agents.0.model.tiny.num_attention_heads=0", "agents.1.model.tiny.num_layers=0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    for key in ("agents[0].parallel.micro_batch_size", "agents[1].parallel.dp",
                "agents[0].model.tiny.num_attention_heads", "agents[1].model.tiny.num_layers"):
        assert key in proc.stderr


def test_cfg_job_validates_before_printing_and_an_unknown_tokenizer_is_named():
    proc = _run("--cfg", "job", "algo.delta=2")
    assert proc.returncode == 2 and proc.stdout == "" and "algo.delta" in proc.stderr
    proc = _run("--plan", "agents.1.tokenizer.source=no-such-tokenizer")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "agents[1].tokenizer.source: tokenizer source 'no-such-tokenizer' is not one of" in proc.stderr


def test_plan_of_checkpoints_without_tokenizer_files(tmp_path):
    """`--plan` on directories that hold only config.json: the plan is printed, with a note naming each directory
    and what it lacks, and exit 0 (before: a transformers traceback). The shapes are Llama-3.3-70B's and Qwen3-8B's."""
    import json
    import os

    from tests.helpers.large_models import LLAMA_33_70B, QWEN3_8B

    env = dict(os.environ)
    for name, hf in (("HACPO_LLAMA70B_PATH", LLAMA_33_70B), ("HACPO_QWEN8B_PATH", QWEN3_8B)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(hf))
        env[name] = str(tmp_path / name)
    env["HACPO_TRAIN_DATA"] = env["HACPO_EVAL_DATA"] = str(tmp_path / "math.jsonl")
    proc = subprocess.run([sys.executable, str(ROOT / "recipes" / "train.py"), "--config-name", "pair_large", "--plan"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    for name in ("HACPO_LLAMA70B_PATH", "HACPO_QWEN8B_PATH"):
        assert f"{tmp_path / name} has no tokenizer files (none of: tokenizer.json" in proc.stdout
    assert proc.stdout.count("its vocabulary check (tokenizer ids ≤ embedding rows) was skipped") == 2
    assert "| llama70b | 61.2 | 71.5 | 41.0 | 50.3 | 71.5 | yes |" in proc.stdout

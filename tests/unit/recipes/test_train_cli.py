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

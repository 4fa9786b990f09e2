"""benchmarks/gpu_two_agent_step.py --quick on a CUDA GPU: both agents step together, then train in bf16 and FP8.

Skipped without CUDA (tests/gpu/conftest.py). Estimated at about 3 minutes on an H200 (not run on a GPU yet);
the subprocess is given 8.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.integration, pytest.mark.slow, pytest.mark.needs("vllm", "transformer_engine")]

ROOT = Path(__file__).resolve().parents[2]


def test_two_agent_step_quick(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_two_agent_step.py"), "--quick",
                           "--json", str(out)], capture_output=True, text=True, timeout=480, cwd=ROOT)
    print(proc.stdout[-6000:])
    assert proc.returncode == 0, proc.stderr[-6000:]
    rows = json.loads(out.read_text())
    step = {(r["what"], r["agent"]): r for r in rows if r["part"] == "step"}
    assert step[("generate", "both")]["tokens/s"] > 0
    for agent in ("llama_1b", "qwen3_1p7b"):
        assert step[("generate", agent)]["tokens/s"] > 0
        assert step[("train", agent)]["TFLOP/s"] > 0
    assert 0 < step[("train", "both")]["MFU %"] < 100
    trained = {(r["agent"], r["precision"]): r for r in rows if r["part"] == "train only"}
    assert ("llama_1b", "bf16") in trained and ("qwen3_1p7b", "bf16") in trained
    fp8 = [r for r in trained.values() if r["precision"].startswith("fp8")]
    assert fp8, "no FP8 row: Transformer Engine's FP8 step failed (see the output above)"
    for row in trained.values():
        assert math.isfinite(row["TFLOP/s"]) and 0 < row["MFU %"] < 100

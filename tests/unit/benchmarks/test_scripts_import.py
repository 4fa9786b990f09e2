"""Every script under benchmarks/ imports on CPU without running (a `__main__` guard, no CUDA-only import at module
level), and every file of tests/gpu/ collects on CPU (its tests are skipped only at the CUDA check)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").glob("*.py"))
LIBRARIES = ("smollm", "study_report", "study_stats")
"""Sibling modules the scripts import; they run nothing, so they need no `__main__` guard."""


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_benchmark_script_imports_without_running(script: Path, monkeypatch) -> None:
    assert 'if __name__ == "__main__":' in script.read_text() or script.stem in LIBRARIES, script.name
    monkeypatch.syspath_prepend(str(script.parent))  # sibling modules (train_step_mfu, smollm)
    spec = importlib.util.spec_from_file_location(f"bench_import_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)  # a script that ran its benchmark here would take minutes, or fail


def test_every_gpu_test_file_collects_on_cpu() -> None:
    files = sorted(p.name for p in (ROOT / "tests" / "gpu").glob("test_*.py"))
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "tests/gpu"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    collected = {line.split("::")[0].rsplit("/", 1)[-1] for line in done.stdout.splitlines() if "::" in line}
    assert collected == set(files), (collected, files)

"""Every script under benchmarks/ imports on CPU without running (a `__main__` guard, no CUDA-only import at module
level), and every file of tests/gpu/ collects on CPU (its tests are skipped only at the CUDA check)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__")
LIBRARIES = ("run_archive", "smollm", "study_report", "study_stats")
"""Modules the scripts share; they run nothing, so they need no `__main__` guard."""


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_benchmark_script_imports_without_running(script: Path) -> None:
    """As `benchmarks.<name>`: a sibling imported by its bare name (found only with benchmarks/ on sys.path)
    fails here."""
    assert 'if __name__ == "__main__":' in script.read_text() or script.stem in LIBRARIES, script.name
    importlib.import_module(f"benchmarks.{script.stem}")  # a script that ran its benchmark here would take minutes


def test_scripts_run_from_any_working_directory_and_import_from_the_root(tmp_path) -> None:
    """A script run by its path from elsewhere finds its siblings; the shared modules import from the root."""
    for script in ("heterogeneous_study.py", "sample_efficiency.py"):
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--help"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.startswith("usage: "), done.stderr[-2000:]
    done = subprocess.run([sys.executable, "-c", "import benchmarks.study_report, benchmarks.heterogeneous_study"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_every_gpu_test_file_collects_on_cpu() -> None:
    files = sorted(p.name for p in (ROOT / "tests" / "gpu").glob("test_*.py"))
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "tests/gpu"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    collected = {line.split("::")[0].rsplit("/", 1)[-1] for line in done.stdout.splitlines() if "::" in line}
    assert collected == set(files), (collected, files)

"""Where a short run's CPU time goes: CPU-seconds per kind of process of the tests' tiny run, and what is start-up
and what is per step.

    python benchmarks/run_cpu.py                       # pair_tiny_gpt, the tests' shape, 1 and 9 steps
    python benchmarks/run_cpu.py --steps 3 --json /tmp/run_cpu.json

Each run is `recipes/train.py --config-name pair_tiny_gpt` with the overrides every resume, stop and Slurm test uses
(`tests.helpers.runs.tiny_overrides`: B = 2, G = 2, 16-token responses, no warm start, a small KV cache), started
in its own session. Every 0.2 s the script reads (psutil) the user + system CPU time of each process below
the run's driver (Ray's GCS and raylet, the trainer ranks, each engine's vLLM processes, the watchdogs) and its
name at that moment; a process counts under the last name it had while it ran (`ray::AgentRank` imports torch
and megatron-core before Ray renames it; an exiting process keeps its kind). A process that lives less than one interval is missed, so the totals are
a lower bound. With two step counts the difference gives the CPU of one step, the rest is the run's fixed cost
(start-up, the evaluation at step 0, the closing export and shutdown).

CPU-seconds, not wall time: on the 2-core machine both cores are busy through most of a run and through most of a
parallel test suite, so the suite's wall time is about its CPU-seconds over two (docs/testing.md) — a fixed cost
paid once per run is paid once per test that starts one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from nemo_hacpo.reporting import markdown_table  # noqa: E402

KINDS = (
    ("vLLM engine core", ("EngineCor",)),  # the name in /proc/<pid>/stat is cut to 15 characters
    ("vLLM worker", ("VLLM::Worker", "VllmWorker")),
    ("trainer rank (ray::AgentRank)", ("AgentRank",)),
    ("engine watchdog", ("engine_watchdog",)),
    ("Ray (GCS, raylet, agents, monitors)", ("gcs_server", "raylet", "ray::", "ray/", "default_worker")),
)
"""(kind, substrings of a process's name or command line), the first match wins; the driver is the run's own
process; anything else is `other`."""
INTERVAL_S = 0.2


def classify(name: str, cmdline: str, is_driver: bool) -> str:
    if is_driver:
        return "driver (recipes/train.py)"
    for kind, needles in KINDS:
        if any(needle in name or needle in cmdline for needle in needles):
            return kind
    return "other"


@dataclass
class Usage:
    """One run: CPU-seconds and process count per kind, its wall time and exit status."""
    steps: int
    wall_s: float = 0.0
    status: int | None = None
    cpu_s: dict[str, float] = field(default_factory=dict)
    processes: dict[str, int] = field(default_factory=dict)
    names: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per kind, the processes' last names (/proc/<pid>/stat) and how many had each."""

    @property
    def total_s(self) -> float:
        return sum(self.cpu_s.values())


def sample_tree(root: int, seen: dict[int, tuple[float, str, str]]) -> None:
    """Update `seen` ({pid: (CPU-seconds, kind, name)}) with every live process at or below `root` (psutil)."""
    import psutil

    try:
        top = psutil.Process(root)
        processes = [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for process in processes:
        try:
            with process.oneshot():
                times = process.cpu_times()
                cpu, name = times.user + times.system, process.name()
                try:
                    cmdline = " ".join(process.cmdline())
                except psutil.ZombieProcess:
                    cmdline = ""
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if not cmdline and process.pid in seen:  # exiting (a zombie has no command line): its kind stays
            seen[process.pid] = (cpu, *seen[process.pid][1:])
        else:
            seen[process.pid] = (cpu, classify(name, cmdline, process.pid == root), name)


def measure(steps: int, extra: Sequence[str]) -> Usage:
    from tests.helpers.runs import tiny_overrides

    out = Path(tempfile.mkdtemp(prefix="run_cpu_")) / "run"
    log = out.parent / "train.log"
    command = [sys.executable, str(ROOT / "recipes" / "train.py"), "--config-name", "pair_tiny_gpt",
               *tiny_overrides(out, steps, *extra)]
    seen: dict[int, tuple[float, str, str]] = {}
    start = time.monotonic()
    with log.open("wb") as err:
        proc = subprocess.Popen(command, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        while proc.poll() is None:
            sample_tree(proc.pid, seen)
            time.sleep(INTERVAL_S)
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        raise
    usage = Usage(steps=steps, wall_s=time.monotonic() - start, status=proc.returncode)
    if proc.returncode != 0:
        print(f"[run_cpu] the {steps}-step run ended with status {proc.returncode}; its log: {log}", file=sys.stderr)
    for cpu, kind, name in seen.values():
        usage.cpu_s[kind] = usage.cpu_s.get(kind, 0.0) + cpu
        usage.processes[kind] = usage.processes.get(kind, 0) + 1
        usage.names.setdefault(kind, {})
        usage.names[kind][name] = usage.names[kind].get(name, 0) + 1
    return usage


def tables(runs: Sequence[Usage]) -> str:
    """Per kind: processes and CPU-seconds of each run (and its share of the run); with two step counts, the
    CPU-seconds of one step and the fixed cost."""
    kinds = sorted({k for run in runs for k in run.cpu_s}, key=lambda k: -runs[0].cpu_s.get(k, 0.0))
    rows = []
    for kind in [*kinds, "all"]:
        row: dict[str, object] = {"process kind": kind}
        for run in runs:
            cpu = run.total_s if kind == "all" else run.cpu_s.get(kind, 0.0)
            count = sum(run.processes.values()) if kind == "all" else run.processes.get(kind, 0)
            row[f"{run.steps} steps: processes"] = count
            row[f"{run.steps} steps: CPU s"] = f"{cpu:.1f} ({100 * cpu / run.total_s:.0f} %)"
        if len(runs) == 2:
            a, b = sorted(runs, key=lambda r: r.steps)
            cpu_a = a.total_s if kind == "all" else a.cpu_s.get(kind, 0.0)
            cpu_b = b.total_s if kind == "all" else b.cpu_s.get(kind, 0.0)
            per_step = (cpu_b - cpu_a) / (b.steps - a.steps)
            row["CPU s per step"] = f"{per_step:.1f}"
            row["fixed CPU s"] = f"{cpu_a - a.steps * per_step:.1f}"
        rows.append(row)
    columns = list(rows[0])
    walls = ", ".join(f"{run.steps} steps {run.wall_s:.0f} s (status {run.status})" for run in runs)
    return markdown_table(rows, columns) + f"\n\nwall time: {walls}; load average at the end: {os.getloadavg()[0]:.1f}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="1,9", help="comma-separated step counts, one run each (default 1,9: a "
                        "step costs a few CPU-seconds, within the run-to-run noise of the fixed cost at a gap of 2)")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument("overrides", nargs="*", help="key=value overrides added to the tests' tiny ones")
    args = parser.parse_args(argv)
    steps = [int(s) for s in args.steps.split(",")]
    if len(set(steps)) != len(steps) or min(steps) < 1:
        parser.error(f"--steps: distinct step counts of at least 1, not {args.steps!r}")
    runs = []
    for count in steps:
        print(f"[run_cpu] {count}-step run of pair_tiny_gpt (the tests' shape) …", file=sys.stderr, flush=True)
        runs.append(measure(count, args.overrides))
    if args.json:
        args.json.write_text(json.dumps([asdict(run) for run in runs], indent=1) + "\n")
    print(tables(runs))
    return 0 if all(run.status == 0 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())

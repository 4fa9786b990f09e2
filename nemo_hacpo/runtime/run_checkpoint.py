"""Run checkpoints: every agent's trainer state + the driver's (step, capability tracker, data position, totals).

    <output_dir>/checkpoints/step_000010/
        agents/<agent>/      trainer checkpoint (model, optimizer, scheduler, RNG; Megatron dist-checkpointing)
        driver.json          written last

A checkpoint is written under `step_000010.tmp/` and renamed into place only when every agent and the driver
state are on disk, so a crash mid-save leaves the previous checkpoint as the latest complete one.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DRIVER_FILE = "driver.json"

RUN_ARTIFACTS = ("checkpoints", "metrics.jsonl", "tensorboard", "rollouts", "summary.md", "reward_curve.png",
                 "eval_accuracy.png", "hf", "eval", "engines")
"""What a run writes into its output directory that belongs to that run (config.yaml is rewritten at start).
`logs/` is not among them: a launcher (the Slurm job) writes there before the run starts, and the workers
only ever append to their log files."""


@dataclass(frozen=True)
class RunCheckpoint:
    path: Path

    @property
    def step(self) -> int:
        return int(self.path.name.split("_")[-1])

    def agent_dir(self, agent: str) -> Path:
        return self.path / "agents" / agent

    def load_driver_state(self) -> dict[str, Any]:
        return json.loads((self.path / DRIVER_FILE).read_text())


def checkpoints(out_dir: str | Path) -> list[RunCheckpoint]:
    """Complete checkpoints (with their driver file), oldest first."""
    root = Path(out_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [RunCheckpoint(p) for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp")
             and (p / DRIVER_FILE).is_file()]
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(out_dir: str | Path) -> RunCheckpoint | None:
    found = checkpoints(out_dir)
    return found[-1] if found else None


def save_run_checkpoint(out_dir: str | Path, step: int, driver_state: dict[str, Any], groups, keep: int = 2) -> Path:
    """Collective over every agent's ranks; atomic; keeps the newest `keep` checkpoints."""
    root = Path(out_dir) / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "agents").mkdir(parents=True)
    pending = {name: group.save_checkpoint(str(tmp / "agents" / name), step) for name, group in groups.items()}
    for call in pending.values():
        call.result()
    (tmp / DRIVER_FILE).write_text(json.dumps(driver_state, indent=1))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    # keep-last-N among this run's steps: never the checkpoint just written, whatever else lies there
    earlier = [c for c in checkpoints(out_dir) if c.step < step]
    for old in earlier[:max(0, len(earlier) - (keep - 1))] if keep > 0 else []:
        shutil.rmtree(old.path, ignore_errors=True)
    return final


def archive_previous_run(out_dir: str | Path) -> Path | None:
    """Move an earlier run's artifacts (checkpoints, metrics, plots, rollouts, exports) out of the way.

    A run that starts over in an output directory that already holds one (`runtime.resume=false`, or a run that
    died before its first checkpoint) would otherwise append to its metrics and prune its checkpoints by step
    number. Nothing is deleted: they move to `<out_dir>/previous/<time>/`. Returns that folder, or None when
    there was nothing to move.
    """
    out = Path(out_dir)
    found = [out / name for name in RUN_ARTIFACTS if (out / name).exists()]
    if not found:
        return None
    target = out / "previous" / time.strftime("%Y%m%d-%H%M%S")
    suffix = 0
    while target.exists():
        suffix += 1
        target = target.with_name(f"{target.name.split('.')[0]}.{suffix}")
    target.mkdir(parents=True)
    for path in found:
        path.rename(target / path.name)
    return target

"""Metric sinks for the step loop: a console step line with rate and ETA, JSONL, TensorBoard; curves as plots.

    logger = MetricsLogger(out_dir, sinks=("console", "jsonl", "tensorboard"), total_steps=100)
    logger.log(step, {"llama_tiny/reward_mean": 0.4, ...})
    logger.close()
    write_curves(out_dir / "metrics.jsonl", out_dir / "reward_curve.png", keys=["*/reward_mean"])

Metric names are `<agent>/<group>/<name>` (or `<agent>/<name>`); values are python floats (0-d tensors are
converted). The JSONL file is the source of truth: tables and plots are made from it after the fact.
"""

from __future__ import annotations

import fnmatch
import json
import math
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

SINKS = ("console", "jsonl", "tensorboard", "wandb")


def to_float(value: Any) -> float:
    if hasattr(value, "item"):
        value = value.item()
    return float(value)


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def drop_records_after(path: str | Path, step: int) -> int:
    """Rewrite a metrics JSONL file without its records of steps after `step` (atomically); how many went.

    A torn last line (the process died mid-write) is dropped too.
    """
    path = Path(path)
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1
            continue
        if isinstance(record, dict) and record.get("step", 0) > step:
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
        tmp.replace(path)
    return dropped


class MetricsLogger:
    """Writes every step's metrics to the chosen sinks; the console line shows progress, rate and ETA."""

    def __init__(self, out_dir: str | Path, sinks: Sequence[str] = ("console", "jsonl"), total_steps: int | None = None,
                 console_keys: Sequence[str] = ("*/reward_mean", "*/accuracy"), stream: TextIO | None = None,
                 start_step: int = 0, progress_bar: bool | None = None, wandb_project: str | None = None,
                 wandb_run_name: str | None = None, run_config: Mapping[str, Any] | None = None):
        """`progress_bar`: a live rich progress bar (step, rate, ETA) under the step lines; None = when the
        stream is a terminal. `wandb_*`, `run_config`: for the `wandb` sink (imported only then)."""
        unknown = [s for s in sinks if s not in SINKS]
        if unknown:
            raise ValueError(f"unknown metric sinks {unknown}; choose from {SINKS}")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.sinks = tuple(sinks)
        self.total_steps = total_steps
        self.console_keys = tuple(console_keys)
        self.stream = stream or sys.stderr
        self._jsonl = (self.out_dir / "metrics.jsonl").open("a", encoding="utf-8") if "jsonl" in sinks else None
        self._tb = None
        if "tensorboard" in sinks:
            from torch.utils.tensorboard import SummaryWriter  # lazy: pulls in tensorboard

            # a run resumed at step S repeats the steps an interrupted run may have logged after S: purge_step
            # makes TensorBoard drop those events (the JSONL file: `drop_records_after` before opening)
            self._tb = SummaryWriter(log_dir=str(self.out_dir / "tensorboard"),
                                     purge_step=start_step + 1 if start_step > 0 else None)
        self._wandb = None
        if "wandb" in sinks:
            import wandb  # lazy: optional dependency, checked by config validation

            self._wandb = wandb.init(project=wandb_project, name=wandb_run_name or self.out_dir.name,
                                     dir=str(self.out_dir), config=dict(run_config or {}), resume="allow")
        self._start = time.monotonic()
        self._start_step = start_step
        self._last_step = start_step
        self._progress = self._task = None
        if "console" in self.sinks and (self.stream.isatty() if progress_bar is None else progress_bar):
            self._start_progress()

    def _start_progress(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"),
                                  TimeRemainingColumn(), console=Console(file=self.stream), transient=False)
        self._task = self._progress.add_task("train", total=self.total_steps, completed=self._start_step, rate="")
        self._progress.start()

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        values = {key: to_float(value) for key, value in metrics.items()}
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"step": step, "time": time.time(), **values}) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for key, value in values.items():
                if math.isfinite(value):
                    self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in values.items() if math.isfinite(v)}, step=step)
        self._last_step = step
        if "console" in self.sinks:
            line = self.step_line(step, values)
            if self._progress is not None:
                done = step - self._start_step
                rate = (time.monotonic() - self._start) / done if done > 0 else float("nan")
                self._progress.console.print(line, markup=False, highlight=False)
                self._progress.update(self._task, completed=step,
                                      rate=f"{rate:.1f} s/step" if math.isfinite(rate) else "")
            else:
                print(line, file=self.stream, flush=True)
        return values

    def step_line(self, step: int, values: Mapping[str, float]) -> str:
        done = step - self._start_step
        elapsed = time.monotonic() - self._start
        rate = elapsed / done if done > 0 else float("nan")
        parts = [f"step {step}" + (f"/{self.total_steps}" if self.total_steps else "")]
        if done > 0:
            parts.append(f"{rate:.1f} s/step")
            if self.total_steps:
                parts.append(f"ETA {format_duration(rate * (self.total_steps - step))}")
        for key in sorted(values):
            if any(fnmatch.fnmatchcase(key, pattern) for pattern in self.console_keys):
                parts.append(f"{key}={values[key]:.3f}")
        return " | ".join(parts)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CrossPathMonitor:
    """Names an agent whose cross samples have given no gradient for `patience` steps in a row.

    A cross sample gets zero gradient when its ratio s falls outside ``[lo_u, 1]`` (`spec/hacpo.md` §5). When
    that holds for every cross row, step after step, the agent learns from its own rollouts only and the
    run is, for it, GSPO with HACPO's baseline: worth saying once, with the numbers, rather than leaving it
    to be found in `train/cross_zero_grad_frac`. Reads the step's metrics; returns the warnings it issues
    (at most one per agent per run).
    """

    def __init__(self, agents: Sequence[str], patience: int = 3):
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        self.patience = patience
        self.streak = {a: 0 for a in agents}
        self.warned: set[str] = set()

    def update(self, metrics: Mapping[str, float]) -> list[str]:
        messages = []
        for agent in self.streak:
            num_cross = metrics.get(f"{agent}/train/num_cross", 0.0)
            zero_frac = metrics.get(f"{agent}/train/cross_zero_grad_frac")
            if not num_cross or zero_frac is None:  # isolated modes, or no cross rows this step
                self.streak[agent] = 0
                continue
            self.streak[agent] = self.streak[agent] + 1 if zero_frac >= 1.0 else 0
            if self.streak[agent] >= self.patience and agent not in self.warned:
                self.warned.add(agent)
                ratio = metrics.get(f"{agent}/train/cross_ratio_mean", float("nan"))
                lower = metrics.get(f"{agent}/train/cross_clip_lower", float("nan"))
                messages.append(
                    f"{agent}: every cross sample got zero gradient for {self.streak[agent]} steps in a row "
                    f"(mean ratio s = {ratio:.3g}, clip range [{lower:.3g}, 1]); it learns from its own rollouts "
                    f"only. Its policy and its partners' are too far apart for the stepwise clip "
                    f"(README: 'Does HACPO beat isolated training?').")
        return messages


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}")
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def select_series(records: Iterable[Mapping[str, float]], patterns: Sequence[str]) -> dict[str, list[tuple[int, float]]]:
    """`{metric: [(step, value), ...]}` for every metric matching one of the glob patterns."""
    series: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for key, value in record.items():
            if key in ("step", "time"):
                continue
            if any(fnmatch.fnmatchcase(key, p) for p in patterns):
                series.setdefault(key, []).append((int(record["step"]), float(value)))
    return series


def write_curves(metrics_path: str | Path, plot_path: str | Path, patterns: Sequence[str],
                 title: str = "", ylabel: str = "") -> Path:
    """Plot every metric matching `patterns` against the step (PNG, matplotlib's Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = select_series(read_metrics(metrics_path), patterns)
    if not series:
        raise ValueError(f"no metric in {metrics_path} matches {list(patterns)}")
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, points in sorted(series.items()):
        steps, values = zip(*points, strict=True)
        ax.plot(steps, values, marker="o", markersize=3, label=key)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel or ", ".join(patterns))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    plot_path = Path(plot_path)
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(plot_path, dpi=120)
    plt.close(fig)
    return plot_path


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A markdown table; floats to 3 decimals."""
    def cell(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)

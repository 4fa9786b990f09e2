"""Metric sinks of the step loop: a console step line with rate and ETA, JSONL, TensorBoard, wandb.

    logger = MetricsLogger(out_dir, sinks=("console", "jsonl", "tensorboard"), total_steps=100)
    logger.log(step, {"llama_tiny/reward_mean": 0.4, ...})
    logger.close()

Metric names are `<agent>/<group>/<name>` (or `<agent>/<name>`); values are python floats (0-d tensors are
converted). The JSONL file is the source of truth: tables and plots are made from it after the fact
(`nemo_hacpo.reporting`).
"""

from __future__ import annotations

import fnmatch
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from nemo_hacpo.reporting import format_duration, to_float
from nemo_hacpo.runtime.run_checkpoint import write_text_atomic

SINKS = ("console", "jsonl", "tensorboard", "wandb")


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
        write_text_atomic(path, "".join(f"{line}\n" for line in kept))
    return dropped


def agent_line(agent: str, values: Mapping[str, float]) -> str:
    """What a person watches of one agent at a step, short enough for a terminal line of all agents:

        llama_tiny r=0.53 len=24 x=0.38 eval=0.538

    r = mean training reward (`reward_mean`), len = mean response length in tokens (`response_length_mean`), x = the
    share of the partners' rows that carried gradient into this agent (the mean of `<agent>/from/*/grad_frac`; only
    when it trains on shared rows), eval = held-out greedy accuracy (`eval_accuracy`; at an evaluation). Every metric
    in full: metrics.jsonl, TensorBoard."""
    parts = [agent]
    for label, key in (("r", f"{agent}/reward_mean"), ("len", f"{agent}/response_length_mean")):
        if key in values and math.isfinite(values[key]):
            parts.append(f"{label}={values[key]:.{0 if label == 'len' else 2}f}")
    cross = [v for k, v in values.items() if k.startswith(f"{agent}/from/") and k.endswith("/grad_frac")
             and math.isfinite(v)]
    if cross:
        parts.append(f"x={sum(cross) / len(cross):.2f}")
    if math.isfinite(values.get(f"{agent}/eval_accuracy", math.nan)):
        parts.append(f"eval={values[f'{agent}/eval_accuracy']:.3f}")
    return " ".join(parts)


class MetricsLogger:
    """Writes every step's metrics to the chosen sinks; the console line shows progress, rate and ETA."""

    def __init__(self, out_dir: str | Path, sinks: Sequence[str] = ("console", "jsonl"), total_steps: int | None = None,
                 console_keys: Sequence[str] = ("*/reward_mean", "*/accuracy"), stream: TextIO | None = None,
                 start_step: int = 0, progress_bar: bool | None = None, wandb_project: str | None = None,
                 wandb_run_name: str | None = None, run_config: Mapping[str, Any] | None = None,
                 agents: Sequence[str] = ()):
        """`progress_bar`: a live rich progress bar (step, rate, ETA) under the step lines; None = when the
        stream is a terminal. `wandb_*`, `run_config`: for the `wandb` sink (imported only then). `agents`: the
        console line is the short per-agent one (`agent_line`); without, the `console_keys` metrics in full."""
        unknown = [s for s in sinks if s not in SINKS]
        if unknown:
            raise ValueError(f"unknown metric sinks {unknown}; choose from {SINKS}")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.sinks = tuple(sinks)
        self.total_steps = total_steps
        self.console_keys = tuple(console_keys)
        self.agents = tuple(agents)
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
        if self.agents:  # short: `step 12/30 8.9s ETA 2:40`, then one part per agent
            head = " ".join(parts).replace(" s/step", "s")
            return " | ".join([head, *(agent_line(agent, values) for agent in self.agents)])
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

"""Stopping early without losing the steps since the last checkpoint: on SIGUSR1, and before the time limit.

    SIGUSR1 (`kill -USR1 <driver pid>`; under Slurm `#SBATCH --signal=B:USR1@<lead>`, forwarded by the job script)
      while the run starts (warm start, engines, the first evaluation): no step has been trained since the last
          checkpoint, so the run stops at once (`Preempted` is raised in the main thread);
      while it trains: the step in progress finishes, its evaluation included; a checkpoint of it is saved
          (whatever `runtime.checkpoint_interval` says; not again if the interval just saved it) and verified
          against its manifest; the run stops. Later SIGUSR1s change nothing.
    the time limit: the earlier of `runtime.stop_by` and the Slurm job's end time (`squeue -h -j $SLURM_JOB_ID -o %e`,
      asked again every minute: an administrator may extend it). Before each step the run stops, saving first, when

          now + step_s + checkpoint_s + runtime.stop_margin_s > end

      step_s: the longest step this process has run (an evaluation step included); checkpoint_s: the longest save
      this process has made, before its first save assumed as long as step_s; stop_margin_s: the shutdown after
      the save (engines, Ray, the job script's teardown). Before any step has run, only now + margin > end stops.

Either way the driver prints `preempted: checkpoint step N`, shuts the worker groups down and exits with
`EXIT_PREEMPTED` (75, sysexits' EX_TEMPFAIL: run the same command again to continue; the Slurm job script
requeues itself with it when submitted with `--requeue`). SIGTERM keeps its meaning: stop now (exit 143); one that
arrives during the save leaves the previous checkpoint as the newest complete one (the folder is renamed into
place only when its manifest is written).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from nemo_hacpo.config import ConfigError, ConfigIssue, RuntimeConfig
from nemo_hacpo.reporting import format_duration

logger = logging.getLogger(__name__)

EXIT_PREEMPTED = 75
"""The driver's exit status after stopping early with a checkpoint to continue from (EX_TEMPFAIL)."""
PREEMPT_SIGNAL = signal.SIGUSR1
SLURM_REFRESH_S = 60.0
"""How often the job's end time is asked again (`scontrol update TimeLimit=…` moves it)."""
_NO_END = {"", "N/A", "NONE", "UNKNOWN", "UNLIMITED", "INFINITE"}


class Preempted(KeyboardInterrupt):
    """SIGUSR1 arrived while the run was starting: it stops at once (nothing trained since the last checkpoint).

    A KeyboardInterrupt, as `loop.Terminated`: Ray's blocking calls hand an interrupt raised by a signal handler
    back to the caller (as a plain KeyboardInterrupt: `StopSignal.raised` says that it was this one), any other
    exception as a SystemError."""


class StopSignal:
    """The SIGUSR1 handler. Before `begin_training()` it raises `Preempted` (the start-up is abandoned); after,
    it only records the signal and the step loop stops at the end of the step in progress."""

    def __init__(self) -> None:
        self.received: str | None = None
        self.training = False
        self.raised = False
        self.shutting_down = False

    def begin_training(self) -> None:
        self.training = True

    def begin_shutdown(self) -> None:
        """The run is shutting down (after a failure, a stop or its end): a SIGUSR1 from here on is recorded and
        never raised — raised inside the shutdown it would leave engines running and the lock held."""
        self.shutting_down = True

    def __call__(self, signum: int, frame: Any) -> None:
        if self.received is not None:  # the first one decides; a second one must not cut the save short
            return
        self.received = signal.Signals(signum).name
        if self.shutting_down:
            os.write(2, f"{self.received}: the run is already stopping\n".encode())
            return
        if not self.training:
            self.raised = True
            raise Preempted(self.received)
        # not print(): the main thread may be inside a print to the same stream (a reentrant call fails)
        os.write(2, f"{self.received}: finishing the step in progress, then a checkpoint and a clean stop\n".encode())


# ---------------------------------------------------------------------------------------------- the time limit
def parse_time(text: str) -> float:
    """An ISO 8601 date and time (`2026-07-01T18:00`, `2026-07-01 18:00:00+02:00`; without a zone: local time)
    → seconds since the epoch. ValueError when it is none."""
    return datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()


def slurm_end_time(job_id: str, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> float | None:
    """The end time of Slurm job `job_id` (its start plus its time limit), from `squeue -h -j <id> -o %e`, else from
    `scontrol show job -o <id>` (EndTime=); None when the job has no limit or Slurm does not answer."""
    asks = (["squeue", "-h", "-j", job_id, "-o", "%e"], ["scontrol", "show", "job", "-o", job_id])
    for command in asks:
        try:
            done = run(command, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode != 0:
            continue
        text = done.stdout.strip()
        if command[0] == "scontrol":
            text = next((item.split("=", 1)[1] for item in text.split() if item.startswith("EndTime=")), "")
        text = text.splitlines()[0].strip() if text else ""
        if text.upper() in _NO_END:
            return None
        try:
            return parse_time(text)
        except ValueError:
            continue
    return None


class Deadline:
    """When the run must have stopped: the earlier of `runtime.stop_by` and the Slurm job's end time.

    `wall`: the clock (seconds since the epoch); `ask_slurm`: job id → end time (`slurm_end_time`). Both are
    arguments so that a test can move time and the job's limit.
    """

    def __init__(self, stop_by: float | None, slurm_job: str | None, margin_s: float,
                 wall: Callable[[], float] = time.time,
                 ask_slurm: Callable[[str], float | None] = slurm_end_time) -> None:
        self.stop_by, self.slurm_job, self.margin_s = stop_by, slurm_job, margin_s
        self.wall, self.ask_slurm = wall, ask_slurm
        self._slurm_end: float | None = None
        self._asked_at: float | None = None

    @classmethod
    def of(cls, runtime: RuntimeConfig, environ: dict[str, str] | None = None) -> Deadline:
        """The run's deadline: `runtime.stop_by` (a ConfigError naming it when it has passed) and, inside a Slurm
        job (SLURM_JOB_ID), that job's end time."""
        environ = os.environ if environ is None else environ
        stop_by = parse_time(runtime.stop_by) if runtime.stop_by else None
        if stop_by is not None and stop_by <= time.time():
            raise ConfigError([ConfigIssue("runtime.stop_by", f"{runtime.stop_by} has passed",
                                           "give a time in the future, or drop runtime.stop_by")])
        return cls(stop_by, environ.get("SLURM_JOB_ID") or None, runtime.stop_margin_s)

    def slurm_end(self) -> float | None:
        """The Slurm job's end time, asked at most every `SLURM_REFRESH_S` seconds."""
        if self.slurm_job is None:
            return None
        now = self.wall()
        if self._asked_at is None or now - self._asked_at >= SLURM_REFRESH_S:
            first = self._asked_at is None
            self._slurm_end, self._asked_at = self.ask_slurm(self.slurm_job), now
            if first and self._slurm_end is None:
                logger.warning("Slurm job %s: no end time (no time limit, or squeue/scontrol did not answer); "
                               "only runtime.stop_by and SIGUSR1 stop the run early", self.slurm_job)
        return self._slurm_end

    def end(self) -> tuple[float, str] | None:
        """(end time, what sets it) of the earliest limit, or None without one. On a tie the Slurm job is named:
        the job script sets runtime.stop_by to the job's own end, read from squeue."""
        limits = []
        slurm = self.slurm_end()
        if slurm is not None:
            limits.append((slurm, 0, f"the end of Slurm job {self.slurm_job}"))
        if self.stop_by is not None:
            limits.append((self.stop_by, 1, "runtime.stop_by"))
        if not limits:
            return None
        end, _, what = min(limits)
        return end, what

    def describe(self) -> str | None:
        """One line for the console at the start of training; None without a limit."""
        found = self.end()
        if found is None:
            return None
        end, what = found
        return (f"time limit: {what} at {_clock(end)} (in {format_duration(end - self.wall())}); the run saves and "
                f"stops before it when the next step and a checkpoint would not end {self.margin_s:.0f} s ahead of it")

    def too_close(self, step_s: float | None, checkpoint_s: float | None) -> str | None:
        """Why the run must stop before its next step, or None. `step_s`/`checkpoint_s`: the estimates (None: not
        measured yet; a missing checkpoint estimate is taken as long as a step)."""
        found = self.end()
        if found is None:
            return None
        end, what = found
        now = self.wall()
        if step_s is None:
            needed, parts = self.margin_s, f"the stop margin ({self.margin_s:.0f} s)"
        else:
            save_s = step_s if checkpoint_s is None else checkpoint_s
            needed = step_s + save_s + self.margin_s
            parts = (f"the next step (≈ {step_s:.0f} s), a checkpoint (≈ {save_s:.0f} s"
                     f"{'' if checkpoint_s is not None else ', not measured yet: taken as long as a step'}) and the "
                     f"stop margin ({self.margin_s:.0f} s)")
        if now + needed <= end:
            return None
        return (f"stopping before the time limit: {what} is at {_clock(end)}, {max(0.0, end - now):.0f} s from now, "
                f"too soon for {parts}")


def _clock(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M:%S")


# ---------------------------------------------------------------------------------------------- both together
class Preemption:
    """What decides an early stop: the SIGUSR1 handler's record, the deadline, and the measured durations."""

    def __init__(self, deadline: Deadline, stop_signal: StopSignal | None = None) -> None:
        self.deadline = deadline
        self.signal = stop_signal or StopSignal()
        self.step_s: float | None = None
        self.checkpoint_s: float | None = None

    def step_took(self, seconds: float) -> None:
        self.step_s = seconds if self.step_s is None else max(self.step_s, seconds)

    def checkpoint_took(self, seconds: float) -> None:
        self.checkpoint_s = seconds if self.checkpoint_s is None else max(self.checkpoint_s, seconds)

    def reason(self, deadline: bool = True) -> str | None:
        """Why the run stops now (a signal, or with `deadline` the time limit), or None to go on."""
        if self.signal.received is not None:
            return f"{self.signal.received}: the step in progress has ended; saving a checkpoint and stopping"
        return self.deadline.too_close(self.step_s, self.checkpoint_s) if deadline else None


def install_preempt_handler(handler: StopSignal) -> Any:
    """Make `handler` the SIGUSR1 handler (main thread only); returns the previous one for `restore_preempt_handler`."""
    return signal.signal(PREEMPT_SIGNAL, handler)


def restore_preempt_handler(previous: Any) -> None:
    signal.signal(PREEMPT_SIGNAL, signal.SIG_DFL if previous is None else previous)

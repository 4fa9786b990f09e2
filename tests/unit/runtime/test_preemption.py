"""Stopping early without losing work (`runtime/preemption.py`), with a fake clock, a fake Slurm and real signals.

- the time limit: the run stops before the step that, with a checkpoint and the stop margin, would end after it
  (hand-computed with a fake clock), the earlier of `runtime.stop_by` and the Slurm job's end (`squeue %e`, else
  `scontrol EndTime=`), asked again every minute; a `stop_by` that has passed is refused naming the key;
- SIGUSR1 while the run starts interrupts it (`Preempted`); while it trains it is only recorded;
- SIGUSR1 inside a checkpoint (twice, even): the save completes and verifies, and the stop saves nothing again;
  SIGTERM inside a checkpoint: the previous checkpoint stays the newest complete one (the manifest rule).

Before this change there was no SIGUSR1 handler (the signal killed the driver), no deadline and no `stop_early`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from nemo_hacpo.config import ConfigError, load_config
from nemo_hacpo.runtime.preemption import (
    EXIT_PREEMPTED,
    SLURM_REFRESH_S,
    Deadline,
    Preempted,
    Preemption,
    StopSignal,
    install_preempt_handler,
    parse_time,
    restore_preempt_handler,
    slurm_end_time,
)
from nemo_hacpo.runtime.run_checkpoint import checkpoints, latest_checkpoint, save_run_checkpoint
from nemo_hacpo.training.checkpoint_files import bytes_record


# ------------------------------------------------------------------------------------------ the time limit
def test_the_deadline_with_a_fake_clock():
    """stop when now + step + checkpoint + margin > end; an unmeasured checkpoint counts as long as a step."""
    now = [1000.0]
    deadline = Deadline(stop_by=2000.0, slurm_job=None, margin_s=100.0, wall=lambda: now[0])
    assert deadline.too_close(None, None) is None  # before any step: 1000 + 100 ≤ 2000
    assert deadline.too_close(200.0, None) is None  # 1000 + 200 + 200 + 100 = 1500
    now[0] = 1500.0
    assert deadline.too_close(200.0, None) is None  # 1500 + 500 = 2000: exactly in time
    now[0] = 1500.5
    why = deadline.too_close(200.0, None)
    assert why is not None and "runtime.stop_by" in why and "not measured yet" in why
    assert deadline.too_close(200.0, 50.0) is None  # measured: 1500.5 + 200 + 50 + 100 = 1850.5
    now[0] = 1650.0
    assert deadline.too_close(200.0, 50.0) is None  # 2000
    now[0] = 1651.0
    assert "a checkpoint (≈ 50 s)" in deadline.too_close(200.0, 50.0)
    now[0] = 1901.0
    assert "stop margin" in deadline.too_close(None, None)  # no step measured: 1901 + 100 > 2000


def test_the_loop_stops_before_the_step_that_would_not_fit():
    """100 s steps, a 40 s checkpoint every third, end at 1000 s, margin 60 s: step 8 ends at 880 s; a 9th would
    need 880 + 100 + 40 + 60 = 1080 s. So 8 steps run, the save ends at 920 s and the shutdown has its 60 s (980)."""
    clock = [0.0]
    preemption = Preemption(Deadline(stop_by=1000.0, slurm_job=None, margin_s=60.0, wall=lambda: clock[0]))
    steps = 0
    while (why := preemption.reason()) is None:
        clock[0] += 100.0
        preemption.step_took(100.0)
        steps += 1
        if steps % 3 == 0:
            clock[0] += 40.0
            preemption.checkpoint_took(40.0)
    assert steps == 8 and clock[0] == 880.0
    assert "the next step (≈ 100 s)" in why and "a checkpoint (≈ 40 s)" in why, why


def _fake_run(answers: dict[str, tuple[int, str]]):
    """`subprocess.run` for `squeue`/`scontrol`: `answers[command] = (returncode, stdout)`; absent: not installed."""
    asked = []

    def run(command, **kwargs):
        asked.append(command[0])
        if command[0] not in answers:
            raise FileNotFoundError(command[0])
        rc, out = answers[command[0]]
        return subprocess.CompletedProcess(command, rc, out, "")

    return run, asked


def test_the_slurm_end_time_from_squeue_else_scontrol():
    end = parse_time("2026-12-03T18:00:00")
    assert end == datetime(2026, 12, 3, 18).timestamp()  # Slurm prints local time
    run, asked = _fake_run({"squeue": (0, "2026-12-03T18:00:00\n")})
    assert slurm_end_time("42", run) == end and asked == ["squeue"]
    run, asked = _fake_run({"squeue": (1, ""), "scontrol": (0, "JobId=42 TimeLimit=01:00:00 EndTime=2026-12-03T18:00:00 "
                                                               "Deadline=N/A")})
    assert slurm_end_time("42", run) == end and asked == ["squeue", "scontrol"]
    for no_limit in ("N/A", "Unknown", "NONE", ""):
        assert slurm_end_time("42", _fake_run({"squeue": (0, no_limit)})[0]) is None
    assert slurm_end_time("42", _fake_run({})[0]) is None  # not a Slurm machine


def test_the_earlier_limit_counts_and_slurm_is_asked_again_every_minute():
    now = [0.0]
    answers = iter([5000.0, 9000.0])
    asked = []

    def ask(job):
        asked.append(job)
        return next(answers)

    deadline = Deadline(stop_by=7000.0, slurm_job="42", margin_s=0.0, wall=lambda: now[0], ask_slurm=ask)
    assert deadline.end() == (5000.0, "the end of Slurm job 42")
    now[0] = SLURM_REFRESH_S - 1
    assert deadline.end()[0] == 5000.0 and asked == ["42"]  # not asked again yet
    now[0] = SLURM_REFRESH_S
    assert deadline.end() == (7000.0, "runtime.stop_by")  # the limit was extended past stop_by
    assert asked == ["42", "42"]


def test_on_a_tie_the_slurm_job_is_named():
    """The job script passes the job's end as runtime.stop_by: the same time, and the line names the job."""
    deadline = Deadline(stop_by=5000.0, slurm_job="42", margin_s=0.0, wall=lambda: 0.0, ask_slurm=lambda job: 5000.0)
    assert deadline.end() == (5000.0, "the end of Slurm job 42")
    assert Deadline(stop_by=4999.0, slurm_job="42", margin_s=0.0, wall=lambda: 0.0,
                    ask_slurm=lambda job: 5000.0).end() == (4999.0, "runtime.stop_by")


def test_the_deadline_of_a_config(monkeypatch):
    cfg = load_config("pair_tiny_gpt", ["runtime.stop_by=2000-01-01T00:00", "runtime.stop_margin_s=30"])
    with pytest.raises(ConfigError, match=r"runtime.stop_by: 2000-01-01T00:00 has passed"):
        Deadline.of(cfg.runtime, environ={})
    cfg = load_config("pair_tiny_gpt", ["runtime.stop_by=2999-01-01T00:00+00:00"])
    deadline = Deadline.of(cfg.runtime, environ={"SLURM_JOB_ID": "77"})
    assert deadline.stop_by == datetime.fromisoformat("2999-01-01T00:00+00:00").timestamp()
    assert deadline.slurm_job == "77" and deadline.margin_s == 300.0
    assert Deadline.of(load_config("pair_tiny_gpt", []).runtime, environ={}).end() is None


# ------------------------------------------------------------------------------------------ SIGUSR1
@pytest.fixture
def usr1():
    """A fresh `StopSignal` installed as this process's SIGUSR1 handler (the previous one put back after)."""
    handler = StopSignal()
    previous = install_preempt_handler(handler)
    yield handler
    restore_preempt_handler(previous)


def _deliver(sig: int) -> None:
    """Send `sig` to this process and give the main thread the moment to run its handler."""
    os.kill(os.getpid(), sig)
    for _ in range(100):
        time.sleep(0.01)


def test_sigusr1_while_starting_interrupts_and_while_training_is_only_recorded(usr1):
    with pytest.raises(Preempted):
        _deliver(signal.SIGUSR1)
    assert usr1.raised and usr1.received == "SIGUSR1"
    _deliver(signal.SIGUSR1)  # a second one while the start-up unwinds changes nothing

    training = StopSignal()
    install_preempt_handler(training)
    training.begin_training()
    _deliver(signal.SIGUSR1)
    assert training.received == "SIGUSR1" and not training.raised
    assert "SIGUSR1: the step in progress has ended" in Preemption(Deadline(None, None, 0.0), training).reason(deadline=False)


class _SignallingGroup:
    """An AgentGroup stand-in whose checkpoint sends `signals` to this process while the save is in progress
    (its shard written, the driver state and the manifest not yet)."""

    def __init__(self, *signals: int) -> None:
        self.signals = signals
        self.saves = 0

    def save_checkpoint(self, path, step, digest=None):
        data = bytes(range(256)) * 64
        Path(path).mkdir(parents=True)
        (Path(path) / "__0_0.distcp").write_bytes(data)
        self.saves += 1

        def result():
            for sig in self.signals:
                _deliver(sig)
            return {"__0_0.distcp": bytes_record(data, digest)}  # as the writing rank records its file

        return SimpleNamespace(result=result)


def test_sigusr1_inside_a_checkpoint_lets_it_complete_and_the_stop_saves_nothing_again(tmp_path, usr1, capsys):
    """The real `HacpoRun.checkpoint` and `stop_early` (no Ray: the groups stand in): a SIGUSR1, then a second one,
    arrive inside the step-1 checkpoint; it completes and verifies; the stop that follows does not save again."""
    from nemo_hacpo.runtime.loop import HacpoRun

    run = HacpoRun(load_config("pair_tiny_gpt", [f"runtime.output_dir={tmp_path}", "data.train.size=8",
                                                 "data.eval.size=2"]), usr1)
    usr1.begin_training()
    group = _SignallingGroup(signal.SIGUSR1, signal.SIGUSR1)
    run.groups = {"llama_tiny": group}
    run.step = 1
    path = run.checkpoint()
    assert usr1.received == "SIGUSR1" and latest_checkpoint(tmp_path).path == path
    why = run.preemption.reason()
    assert why is not None and why.startswith("SIGUSR1: the step in progress has ended")
    assert run.stop_early(why) == EXIT_PREEMPTED and group.saves == 1
    assert f"preempted: checkpoint step 1 ({path})" in capsys.readouterr().err

    run.step = 2  # a step trained since: the stop saves it first
    group.signals = ()
    assert run.stop_early(why) == EXIT_PREEMPTED and group.saves == 2
    assert latest_checkpoint(tmp_path).step == 2 and latest_checkpoint(tmp_path).problems() == []
    assert "preempted: checkpoint step 2" in capsys.readouterr().err


def test_sigterm_inside_a_checkpoint_leaves_the_previous_one_the_newest_complete(tmp_path):
    """SIGTERM (the real handler of `train()`: it interrupts) inside the step-2 save: the folder is never renamed
    into place, step 1 stays the newest checkpoint and verifies; the next save of step 2 replaces the leftover."""
    from nemo_hacpo.runtime.loop import Terminated, _StopSignal

    save_run_checkpoint(tmp_path, 1, {"step": 1}, {"a": _SignallingGroup()}, keep=0)
    previous = signal.signal(signal.SIGTERM, _StopSignal())
    try:
        with pytest.raises(Terminated):
            save_run_checkpoint(tmp_path, 2, {"step": 2}, {"a": _SignallingGroup(signal.SIGTERM)}, keep=0)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (tmp_path / "checkpoints" / "step_000002.tmp").is_dir()  # the half checkpoint, never counted
    assert [c.step for c in checkpoints(tmp_path)] == [1]
    assert latest_checkpoint(tmp_path).step == 1 and latest_checkpoint(tmp_path).problems() == []
    save_run_checkpoint(tmp_path, 2, {"step": 2}, {"a": _SignallingGroup()}, keep=0)
    assert latest_checkpoint(tmp_path).step == 2
    assert not (tmp_path / "checkpoints" / "step_000002.tmp").exists()


def test_sigusr1_during_the_shutdown_after_a_start_up_failure_is_only_recorded(tmp_path, monkeypatch, capfd):
    """Issue #41: a run whose start failed (a worker) shuts down; Slurm's SIGUSR1 arriving then raised Preempted
    inside `run.close()` (the handler still thought the run was starting), cutting the shutdown short — engines left
    running, the lock held. Now the shutdown runs to its end, and the exit status is the failure's."""
    from nemo_hacpo.runtime import loop
    from nemo_hacpo.runtime.groups import WorkerFailure

    closed = []

    class FailingRun:
        def __init__(self, cfg, preempt):
            self.out_dir = tmp_path

        def fit(self):
            raise WorkerFailure("agent 'llama_tiny' rank 0 failed while starting its engine")

        def close(self, timeout_s):
            _deliver(signal.SIGUSR1)  # Slurm's early warning, right now
            closed.append(timeout_s)

    monkeypatch.setattr(loop, "HacpoRun", FailingRun)
    monkeypatch.setattr(loop, "startup_checks", lambda cfg: cfg)
    assert loop.train(load_config("pair_tiny_gpt")) == 1
    assert closed == [30.0]  # the shutdown ran to its end (a worker failure's budget)
    assert "SIGUSR1: the run is already stopping" in capfd.readouterr().err


def test_a_ranks_shutdown_releases_the_staging_buffers_first_and_everything_when_a_part_fails(tmp_path, monkeypatch):
    """`AgentRank.shutdown`: the refit's staging buffers before the engine that reads them, and the trainer and the
    agent's world even when the engine's shutdown fails (before: buffers closed after the engine, nothing after a
    failure)."""
    from nemo_hacpo.runtime.worker import AgentRank

    events = []

    class Part:
        def __init__(self, name, fails=False):
            self.name, self.fails = name, fails

        def close(self):
            events.append(f"{self.name} closed")

        def shutdown(self):
            events.append(f"{self.name} shut down")
            if self.fails:
                raise RuntimeError("the engine core did not answer")

    import nemo_hacpo.training as training

    monkeypatch.setattr(training, "destroy_distributed", lambda: events.append("world destroyed"))
    cfg = load_config("pair_tiny_gpt", ["warmstart.enabled=false"])
    rank = AgentRank(cfg.agents[0], 0, seed=0, run_dir=str(tmp_path), total_updates=1, keep_reference=False)
    rank.refit_strategy, rank.engine, rank.trainer = Part("staging"), Part("engine", fails=True), Part("trainer")
    with pytest.raises(RuntimeError, match="did not answer"):
        rank.shutdown()
    assert events == ["staging closed", "engine shut down", "trainer closed", "world destroyed"]
    assert (rank.engine, rank.trainer, rank.refit_strategy) == (None, None, None)

"""Stopping early without losing work, and one run per directory, on real runs of the tiny pair (pair_tiny_gpt):

* SIGUSR1 inside step 2 of a run that checkpoints only at its end: a second driver started on the same directory
  meanwhile refuses at once naming the holder, and writes nothing; a further SIGUSR1 inside the save changes
  nothing; the first saves a verified step-2 checkpoint and exits 75; the rerun continues to the metrics of an
  uninterrupted run (the session's shared one);
* SIGUSR1 during an evaluation: the evaluation and the step finish, the step's checkpoint is saved once, exit 75;
* SIGUSR1 during the warm start: the start-up stops at once, nothing cached, exit 75.

The signals are real (sent to this process, where `train()` installed its handlers); only the moment is chosen,
by wrapping the call in progress. The deadline's arithmetic is tested with a fake clock in
tests/unit/runtime/test_preemption.py, a stale lock in tests/unit/runtime/test_run_lock.py, the dead driver's
lock taken over in test_resume_and_failures.py, the Slurm path in tests/integration/slurm/test_sbatch_job.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from nemo_hacpo.config import load_config
from nemo_hacpo.runtime.preemption import EXIT_PREEMPTED
from nemo_hacpo.runtime.run_checkpoint import checkpoints, latest_checkpoint
from tests.helpers.runs import (
    REPO,
    assert_prompts_as_drawn,
    assert_same_metrics,
    records_by_step,
    tiny_overrides,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _signal_self() -> None:
    os.kill(os.getpid(), signal.SIGUSR1)


def _save_calls(monkeypatch, during=None) -> list[int]:
    """Count every agent's checkpoint saves (their steps); `during(step)` runs while the workers write."""
    from nemo_hacpo.runtime.groups import AgentGroup

    saves: list[int] = []
    original = AgentGroup.save_checkpoint

    def save_checkpoint(self, directory, step, **kwargs):
        pending = original(self, directory, step, **kwargs)
        saves.append(step)
        if during is not None:
            during(step)
        return pending

    monkeypatch.setattr(AgentGroup, "save_checkpoint", save_checkpoint)
    return saves


def test_sigusr1_inside_step_2_then_a_rerun_continues_as_uninterrupted_and_a_second_driver_refuses(
        tmp_path, monkeypatch, capfd, uninterrupted_tiny_run):
    import ray

    from nemo_hacpo.broker import Broker
    from nemo_hacpo.runtime.loop import train

    out = tmp_path / "run"
    overrides = tiny_overrides(out, 3, "runtime.checkpoint_interval=0")  # a checkpoint only at the end
    second: dict[str, object] = {}
    original_step = Broker.step
    brokered = []

    def broker_step(self, rollouts, *args):  # the middle of a step: generated, scored, not yet trained
        brokered.append(1)
        if len(brokered) == 2:  # step 2
            tick = time.monotonic()
            second["done"] = subprocess.run(
                [sys.executable, str(REPO / "recipes" / "train.py"), "--config-name", "pair_tiny_gpt", *overrides],
                cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=600)
            second["seconds"] = time.monotonic() - tick
            _signal_self()
        return original_step(self, rollouts, *args)

    monkeypatch.setattr(Broker, "step", broker_step)
    saves = _save_calls(monkeypatch, during=lambda step: _signal_self())  # one more SIGUSR1 inside the save
    try:
        assert train(load_config("pair_tiny_gpt", overrides)) == EXIT_PREEMPTED
    finally:
        ray.shutdown()
    err = capfd.readouterr().err
    assert "SIGUSR1: the step in progress has ended; saving a checkpoint and stopping" in err
    assert f"preempted: checkpoint step 2 ({out / 'checkpoints' / 'step_000002'})" in err

    done = second["done"]
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"is in use by another run: pid {os.getpid()} on " in done.stderr and "runtime.output_dir" in done.stderr
    print(f"\nthe second driver refused after {second['seconds']:.1f} s (its whole process, imports included)")
    assert not (out / "previous").exists()  # it moved nothing aside

    assert saves == [2, 2]  # once per agent, for the stop only (checkpoint_interval=0)
    assert [c.step for c in checkpoints(out)] == [2] and latest_checkpoint(out).problems() == []
    assert sorted(records_by_step(out)) == [0, 1, 2] and not (out / "run.lock").exists()

    monkeypatch.undo()
    try:
        assert train(load_config("pair_tiny_gpt", overrides)) == 0  # a plain rerun continues from step 2
    finally:
        ray.shutdown()
    assert f"resuming from {out / 'checkpoints' / 'step_000002'} (step 2)" in capfd.readouterr().out
    resumed = records_by_step(out)
    assert sorted(resumed) == sorted(uninterrupted_tiny_run) == [0, 1, 2, 3]
    assert_same_metrics(resumed, uninterrupted_tiny_run, steps=(1, 2, 3))  # 1, 2: the first run's, untouched
    # one record per step: the rerun did not evaluate again at the step it resumed from; and it drew step 3's
    # prompts where the data order had stopped
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]
    assert_prompts_as_drawn(out, steps=(1, 2, 3))


def test_sigusr1_during_an_evaluation_finishes_it_the_step_and_its_checkpoint(tmp_path, monkeypatch, capfd):
    import ray

    from nemo_hacpo.runtime.loop import HacpoRun, train

    out = tmp_path / "run"
    original = HacpoRun.evaluate

    def evaluate(self, scorer):
        if self.step == 1:  # the evaluation of step 1 (eval_interval=1), not the one before training
            _signal_self()
        return original(self, scorer)

    monkeypatch.setattr(HacpoRun, "evaluate", evaluate)
    saves = _save_calls(monkeypatch)
    try:
        assert train(load_config("pair_tiny_gpt", tiny_overrides(out, 2, "runtime.eval_interval=1"))) == EXIT_PREEMPTED
    finally:
        ray.shutdown()
    assert "preempted: checkpoint step 1" in capfd.readouterr().err
    records = records_by_step(out)
    assert sorted(records) == [0, 1]
    assert all(f"{agent}/eval_accuracy" in records[1] for agent in ("llama_tiny", "gpt_tiny"))  # it finished
    assert saves == [1, 1]  # the interval's checkpoint, not a second one for the stop
    saved = latest_checkpoint(out)
    assert saved.step == 1 and [e["step"] for e in saved.load_driver_state()["eval_history"]] == [0, 1]


def test_sigusr1_during_the_warm_start_stops_at_once(tmp_path, monkeypatch, capfd):
    import ray

    from nemo_hacpo.runtime.groups import AgentGroup
    from nemo_hacpo.runtime.loop import train
    from nemo_hacpo.runtime.warmstart import MARKER

    out, cache = tmp_path / "run", tmp_path / "warmstart"
    original = AgentGroup.sft
    sent: list[float] = []

    def sft(self, *args, **kwargs):
        pending = original(self, *args, **kwargs)
        if not sent:  # while the driver waits for the first chunk of the warm start
            sent.append(time.monotonic())
            threading.Timer(1.0, _signal_self).start()
        return pending

    monkeypatch.setattr(AgentGroup, "sft", sft)
    overrides = tiny_overrides(out, 2, "warmstart.enabled=true", "warmstart.steps=200", "warmstart.batch_size=2",
                               "warmstart.num_problems=64", "warmstart.progress_interval=200",
                               f"warmstart.cache_dir={cache}")
    try:
        assert train(load_config("pair_tiny_gpt", overrides)) == EXIT_PREEMPTED
    finally:
        ray.shutdown()
    print(f"\nstopped {time.monotonic() - sent[0] - 1.0:.1f} s after the signal (the groups shut down)")
    err = capfd.readouterr().err
    assert "SIGUSR1 while the run was starting: stopping at once" in err, err[-3000:]
    assert "preempted: no checkpoint yet (a rerun starts over)" in err
    assert not list(cache.rglob(MARKER))  # no warm start half-done and taken for done
    assert not (out / "metrics.jsonl").exists() and not (out / "run.lock").exists()

"""Failure and recovery, for real:

* a run killed with SIGKILL in the middle of a step (driver, Ray and every worker at once), whose newest
  checkpoint is then found damaged, resumes from the last checkpoint that verifies, and its metrics equal those of
  a run that was never interrupted;
* SIGTERM stops a run with its engines shut down first;
* a worker process that dies stops the job with the agent and the rank named; a hung call is given up after
  `runtime.call_timeout_s`, the job exits 1, and the last checkpoint stays loadable (a rerun resumes from it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from nemo_hacpo.config import load_config
from nemo_hacpo.runtime.run_checkpoint import latest_checkpoint
from tests.helpers.runs import COMPARED, start_driver
from tests.helpers.runs import newest_step as _newest_step
from tests.helpers.runs import records_by_step as _records
from tests.helpers.runs import tiny_overrides as _overrides

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_sigkill_mid_step_then_a_damaged_checkpoint_then_resume_equals_uninterrupted(tmp_path, caplog,
                                                                                      uninterrupted_tiny_run):
    """Killed with SIGKILL inside step 3 (driver, Ray and every worker at once), and then the step-2 checkpoint
    found damaged (one byte flipped inside a shard, its size unchanged): the rerun takes the dead driver's lock
    over, names the file, moves that checkpoint aside, resumes from step 1 and computes steps 2 and 3 exactly as a
    run never interrupted."""
    import ray

    from nemo_hacpo.runtime.loop import train

    killed = tmp_path / "killed"
    log = tmp_path / "killed.log"
    proc = start_driver(killed, 3, log)
    try:
        deadline = time.monotonic() + 600
        while _newest_step(killed) < 2:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the run did not reach its step-2 checkpoint in time"
            time.sleep(0.02)
    finally:  # now inside step 3: the driver and everything it started die without warning
        with contextlib.suppress(ProcessLookupError):  # it may have died on its own (the assertion says why)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # step 3 may have been logged already, but its checkpoint was not written
    assert latest_checkpoint(killed).step == 2
    shard = max((killed / "checkpoints" / "step_000002" / "agents" / "gpt_tiny").glob("*.distcp"),
                key=lambda path: path.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the same size: only the manifest's digest can tell
    shard.write_bytes(bytes(data))

    assert json.loads((killed / "run.lock").read_text())["pid"] == proc.pid  # the dead driver's lock is left
    try:
        with caplog.at_level("WARNING"):
            assert train(load_config("pair_tiny_gpt", _overrides(killed, 3))) == 0  # resumes from step 1
    finally:
        ray.shutdown()
    assert f"taking over the lock of a run that is gone (pid {proc.pid} on " in caplog.text
    assert f"agents/gpt_tiny/{shard.name}: its content does not match the manifest's" in caplog.text
    assert len(list((killed / "checkpoints").glob("step_000002.corrupt-*"))) == 1
    assert not (killed / "run.lock").exists()  # released at the end
    # whatever the killed run logged after its checkpoint was dropped on resume: every step once, as uninterrupted
    steps = [json.loads(line)["step"] for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(uninterrupted_tiny_run) == [0, 1, 2, 3]
    for step in (2, 3):
        resumed, expected = _records(killed)[step], uninterrupted_tiny_run[step]
        for agent in ("llama_tiny", "gpt_tiny"):
            for key in COMPARED:  # eval_accuracy: the last step only (eval_interval=0)
                name = f"{agent}/{key}"
                assert (name in resumed) == (name in expected) == (key != "eval_accuracy" or step == 3), (step, name)
                if name in expected:
                    assert resumed[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-6), (step, name)
    for agent in ("llama_tiny", "gpt_tiny"):
        assert _records(killed)[3][f"{agent}/rollouts_generated_total"] == 12
    assert latest_checkpoint(killed).step == 3


def test_dead_worker_and_hung_call_stop_the_job_naming_agent_and_rank(tmp_path):
    import ray

    from nemo_hacpo.rewards import MathRewardScorer
    from nemo_hacpo.runtime.groups import WorkerFailure
    from nemo_hacpo.runtime.loop import HacpoRun, train

    out = tmp_path / "run"
    run = HacpoRun(load_config("pair_tiny_gpt", _overrides(out, 3)))
    try:
        run.start()
        with MathRewardScorer(num_workers=0) as scorer:
            run.run_step(scorer)
            run.checkpoint()
            # a hung rank: the driver gives up after the deadline and names it (the call itself ends 6 s
            # later, so the actor serves the next step instead of holding the test for minutes)
            hang = run.groups["llama_tiny"].actors[0].__ray_call__.remote(lambda self: time.sleep(8))
            with pytest.raises(WorkerFailure, match=r"agent 'llama_tiny' rank 0 did not finish train within 2 s"):
                run.groups["llama_tiny"].get([hang], "train", timeout_s=2.0)
            assert ray.wait([hang], timeout=0)[1] == [hang]  # given up on while it still ran
            # a rank whose process dies (killed by the OS, not by Ray)
            victim = run.groups["gpt_tiny"].actors[0]
            pid = ray.get(victim.__ray_call__.remote(lambda self: os.getpid()))
            os.kill(pid, signal.SIGKILL)
            start = time.monotonic()
            with pytest.raises(WorkerFailure, match=r"agent 'gpt_tiny' rank 0 failed in \w+"):
                run.run_step(scorer)
            assert time.monotonic() - start < 60
    finally:
        run.close(timeout_s=10)
        ray.shutdown()
    assert latest_checkpoint(out).step == 1

    # the whole job: a call that cannot finish in time → exit status 1, the checkpoint untouched
    hung = load_config("pair_tiny_gpt", [*_overrides(out, 3), "runtime.call_timeout_s=0.5"])
    try:
        assert train(hung) == 1
        assert latest_checkpoint(out).step == 1
        assert train(load_config("pair_tiny_gpt", _overrides(out, 2))) == 0  # and it resumes from there
    finally:
        ray.shutdown()
    # the hand-driven run logged nothing; the resumed one evaluates where it starts (step 1), then runs step 2
    assert latest_checkpoint(out).step == 2 and sorted(_records(out)) == [1, 2]


def _descendants(pid: int) -> dict[int, str]:
    """`{pid: name}` of every process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        names[int(entry.name)] = name
        children.setdefault(int(rest[1]), []).append(int(entry.name))
    found, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = names[child]
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_stops_the_run_and_takes_the_engines_with_it(tmp_path):
    """A `kill` (or a scheduler's stop) mid-run: exit status 143 naming the last checkpoint, and no vLLM process
    of the run outlives it (without the handler, Ray's own SIGTERM handler killed the actors at once and their
    engine processes lived on for a minute or more)."""
    out = tmp_path / "run"
    log = tmp_path / "run.log"
    proc = start_driver(out, 3, log)
    engines: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 600
        while _newest_step(out) < 1:  # step 1 done: both engines are up
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the run did not reach its first checkpoint in time"
            time.sleep(0.2)
        engines = {pid: name for pid, name in _descendants(proc.pid).items() if name.startswith("VLLM")}
        assert engines, _descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)  # the driver only, as `kill <pid>` does
        assert proc.wait(timeout=180) == 143, log.read_text(errors="replace")[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    assert "job stopped: stopped by SIGTERM" in text and f"{out}/checkpoints/step_00000" in text
    assert [pid for pid in engines if _alive(pid)] == [], engines  # gone with the run, not a minute later

"""One run per output directory (`runtime/run_lock.py`): the lock file, a live holder refused by name, stale
holders taken over (a dead pid, a reused pid, a silent heartbeat, an ended or requeued Slurm job), the heartbeat
thread, a lock taken over under a run, and the readers (`evaluate.py` / `export_hf.py --run`) that do not take it.

Before this change there was no lock: a second driver on a live run's directory trained into it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemo_hacpo.config import ConfigError, dump_config, load_config
from nemo_hacpo.runtime.run_lock import (
    LOCK_FILE,
    Holder,
    LockLost,
    RunDirBusy,
    RunLock,
    host_identity,
    pid_running,
    process_start,
    slurm_job_running,
)

REPO = Path(__file__).resolve().parents[3]


def _write_holder(out: Path, **fields) -> Holder:
    """A lock file as another run would have left it (defaults: this host, a live pid — this one)."""
    here = host_identity()
    now = time.time()
    holder = Holder(**{"host": here["host"], "pid": os.getpid(), "job_id": None, "restart_count": None,
                       "started": now, "heartbeat": now, "token": "theirs", "boot_id": here["boot_id"],
                       "pid_ns": here["pid_ns"], "pid_start": process_start(os.getpid()), **fields})
    out.mkdir(parents=True, exist_ok=True)
    (out / "lock.tmp").write_text(json.dumps(holder.__dict__))
    os.replace(out / "lock.tmp", out / LOCK_FILE)  # whole, as a run writes it (a running heartbeat reads it)
    return holder


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_lock_names_its_holder_beats_and_goes_at_the_end(tmp_path):
    lock = RunLock(tmp_path, stale_s=0.5, environ={"SLURM_JOB_ID": "123"}).acquire()
    try:
        held = json.loads((tmp_path / LOCK_FILE).read_text())
        assert held["pid"] == os.getpid() and held["host"] == host_identity()["host"] and held["job_id"] == "123"
        assert held["restart_count"] == "0" and held["started"] == held["heartbeat"]
        time.sleep(0.3)  # heartbeats every 0.05 s
        assert json.loads((tmp_path / LOCK_FILE).read_text())["heartbeat"] > held["heartbeat"]
        lock.check()  # still ours
    finally:
        lock.release()
    assert not (tmp_path / LOCK_FILE).exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary file left behind


def test_a_second_run_on_a_held_directory_refuses_naming_the_holder(tmp_path):
    first = RunLock(tmp_path, environ={"SLURM_JOB_ID": "4242"}).acquire()
    try:
        with pytest.raises(RunDirBusy) as refused:
            RunLock(tmp_path, environ={}).acquire()
        message = str(refused.value)
        assert isinstance(refused.value, ConfigError) and "runtime.output_dir" in message
        assert f"in use by another run: pid {os.getpid()} on {host_identity()['host']}, Slurm job 4242" in message
        assert json.loads((tmp_path / LOCK_FILE).read_text())["token"] == first.holder.token  # untouched
    finally:
        first.release()


def test_a_dead_pid_on_this_host_is_taken_over_with_a_warning(tmp_path, caplog):
    dead = _dead_pid()
    _write_holder(tmp_path, pid=dead, pid_start=None)
    with caplog.at_level("WARNING"):
        lock = RunLock(tmp_path).acquire()
    lock.release()
    assert f"taking over the lock of a run that is gone (pid {dead} on " in caplog.text
    assert f"pid {dead} is not running on {host_identity()['host']}" in caplog.text


def test_a_reused_pid_is_gone_too(tmp_path):
    assert pid_running(os.getpid()) and not pid_running(_dead_pid())
    assert not pid_running(os.getpid(), started=process_start(os.getpid()) + 1)  # this pid, another process
    _write_holder(tmp_path, pid_start=process_start(os.getpid()) + 1)
    assert "is not running" in RunLock(tmp_path).gone(RunLock(tmp_path).read())
    _write_holder(tmp_path, boot_id="an-earlier-boot")  # another boot, or another host of this name: not decisive
    assert RunLock(tmp_path).gone(RunLock(tmp_path).read()) is None  # (test_a_host_name_alone_is_not_this_host)


def test_elsewhere_a_silent_heartbeat_older_than_the_bound_is_taken_over(tmp_path, caplog):
    now = [10_000.0]
    _write_holder(tmp_path, host="node7", pid=1234, heartbeat=now[0] - 299.0)
    with pytest.raises(RunDirBusy, match=r"pid 1234 on node7, started .*, last heartbeat 299 s ago"):
        RunLock(tmp_path, stale_s=300.0, clock=lambda: now[0]).acquire()
    now[0] += 2.0  # 301 s of silence
    with caplog.at_level("WARNING"):
        lock = RunLock(tmp_path, stale_s=300.0, clock=lambda: now[0]).acquire()
    lock.release()
    assert "its heartbeat is 301 s old, older than runtime.lock_stale_s=300 s" in caplog.text


def test_in_slurm_the_holders_job_decides(tmp_path):
    _write_holder(tmp_path, host="node7", pid=1234, job_id="88", restart_count="0", heartbeat=0.0)  # long silent
    running = {"88": True}
    lock = RunLock(tmp_path, environ={"SLURM_JOB_ID": "99"}, job_running=running.get)
    with pytest.raises(RunDirBusy, match="Slurm job 88"):
        lock.acquire()  # its job runs (suspended, say): the heartbeat does not count
    running["88"] = False
    assert lock.gone(lock.read()) == "Slurm job 88 is no longer running"
    requeued = RunLock(tmp_path, environ={"SLURM_JOB_ID": "88", "SLURM_RESTART_COUNT": "1"}, job_running=running.get)
    assert "has been requeued (this is run 1)" in requeued.gone(requeued.read())
    running.clear()  # Slurm does not answer: the heartbeat decides
    assert "heartbeat" in RunLock(tmp_path, environ={}, job_running=running.get).gone(RunLock(tmp_path).read())


def test_asking_slurm_about_a_job():
    def run(answer: tuple[int, str, str]):
        return lambda command, **kwargs: subprocess.CompletedProcess(command, *answer)

    assert slurm_job_running("5", run((0, "RUNNING\n", ""))) is True
    assert slurm_job_running("5", run((0, "COMPLETING\n", ""))) is True
    assert slurm_job_running("5", run((0, "PENDING\n", ""))) is False  # requeued: its driver is gone
    assert slurm_job_running("5", run((0, "TIMEOUT\n", ""))) is False
    assert slurm_job_running("5", run((0, "", ""))) is False
    assert slurm_job_running("5", run((1, "", "slurm_load_jobs error: Invalid job id specified"))) is False
    assert slurm_job_running("5", run((1, "", "Unable to contact slurm controller"))) is None


def test_a_lock_taken_over_under_a_run_stops_its_writes(tmp_path):
    lock = RunLock(tmp_path, stale_s=0.5).acquire()
    try:
        _write_holder(tmp_path, host="node7", pid=1234)  # another run decided this one was gone
        time.sleep(0.3)
        assert json.loads((tmp_path / LOCK_FILE).read_text())["token"] == "theirs"  # the heartbeat did not overwrite
        with pytest.raises(LockLost, match=r"another run has taken this run's lock over \(pid 1234 on node7"):
            lock.check()
    finally:
        lock.release()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["token"] == "theirs"  # release leaves theirs alone


def test_an_unreadable_lock_counts_by_its_age(tmp_path):
    (tmp_path / LOCK_FILE).write_text("{torn")
    with pytest.raises(RunDirBusy, match="pid -1 on \\?"):
        RunLock(tmp_path).acquire()
    old = time.time() - 1000
    os.utime(tmp_path / LOCK_FILE, (old, old))
    RunLock(tmp_path, stale_s=300.0).acquire().release()


def _recipe(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_evaluate_and_export_read_a_held_run_without_taking_its_lock(tmp_path, capsys):
    """Both go past the lock of a live run to their own checks (here: nothing exported, no checkpoint yet)."""
    (tmp_path / "config.yaml").write_text(dump_config(load_config("pair_tiny_gpt", [f"runtime.output_dir={tmp_path}"])))
    lock = RunLock(tmp_path).acquire()
    try:
        before = (tmp_path / LOCK_FILE).read_text()
        assert _recipe("export_hf").main(["--run", str(tmp_path)]) == 2
        assert "no complete checkpoint" in capsys.readouterr().err
        assert _recipe("evaluate").main(["--run", str(tmp_path), "--device", "cpu"]) == 2
        assert "hf" in capsys.readouterr().err
        assert json.loads((tmp_path / LOCK_FILE).read_text())["token"] == json.loads(before)["token"]
    finally:
        lock.release()


# ------------------------------------------------------------------------------------ issue #41: the lock on NFS
def test_a_holder_of_this_very_run_of_the_job_is_decided_by_its_heartbeat(tmp_path):
    """A driver started again inside the same allocation (same job id, same restart count) after the first died on
    another node: Slurm says the job runs — ours — which says nothing of the holder; its heartbeat decides. Before,
    that answer made the lock impossible to take over for as long as the job ran."""
    now = [10_000.0]
    _write_holder(tmp_path, host="node7", pid=1234, job_id="88", restart_count="0", heartbeat=now[0] - 100.0)
    asked = []
    lock = RunLock(tmp_path, stale_s=300.0, clock=lambda: now[0], environ={"SLURM_JOB_ID": "88"},
                   job_running=lambda job: asked.append(job) or True)
    assert lock.gone(lock.read()) is None  # 100 s of silence: it may still run
    now[0] += 250.0
    assert "heartbeat is 350 s old" in lock.gone(lock.read()) and asked == []


def test_a_host_name_alone_is_not_this_host(tmp_path):
    """Two containers on two nodes may carry one host name: a lock from a host of this name but another boot is not
    proof that this host restarted — Slurm or the heartbeat decide (before: taken over at once)."""
    now = [10_000.0]
    _write_holder(tmp_path, boot_id="another-machine-or-boot", pid=1234, heartbeat=now[0] - 10.0)
    lock = RunLock(tmp_path, stale_s=300.0, clock=lambda: now[0], environ={})
    assert lock.gone(lock.read()) is None
    with pytest.raises(RunDirBusy):
        lock.acquire()
    now[0] += 400.0
    assert "heartbeat" in lock.gone(lock.read())


def test_a_valid_json_lock_of_another_program_is_taken_over_by_its_age_and_nothing_is_left(tmp_path):
    """A lock file holding JSON this module did not write (no token) counted as unreadable by its age but was put
    back at every takeover (its token did not match): it could never be taken over. Nor are `.taken-*` files left."""
    (tmp_path / LOCK_FILE).write_text(json.dumps({"owner": "someone else"}))
    old = time.time() - 1000
    os.utime(tmp_path / LOCK_FILE, (old, old))
    lock = RunLock(tmp_path, stale_s=300.0).acquire()
    try:
        assert json.loads((tmp_path / LOCK_FILE).read_text())["token"] == lock.holder.token
    finally:
        lock.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no lock, no .run.lock.taken-*, no temporary file


def test_a_link_that_succeeds_but_reports_failure_is_still_this_runs_lock(tmp_path, monkeypatch):
    """Over NFS the reply to link() can be lost and the retried call fail with EEXIST although the first made the
    lock: the run then refused its own lock (RunDirBusy naming itself). The source's link count tells."""
    real_link = os.link

    def lossy_link(src, dst):
        real_link(src, dst)
        raise FileExistsError(17, "File exists (the retransmitted request)", str(dst))

    monkeypatch.setattr(os, "link", lossy_link)
    lock = RunLock(tmp_path).acquire()
    try:
        assert lock.read().token == lock.holder.token
    finally:
        lock.release()


def test_an_unreadable_lock_does_not_stop_the_heartbeat(tmp_path, monkeypatch, caplog):
    """An OSError while reading the lock (NFS: ESTALE, EIO) ended the heartbeat thread silently, so the lock went
    stale under a live run. Now the beat is skipped with a warning, and the next one writes."""
    lock = RunLock(tmp_path, stale_s=0.5).acquire()
    try:
        real_read, failures = RunLock.read, [3]

        def flaky_read(self):
            if failures[0] > 0:
                failures[0] -= 1
                raise OSError(116, "Stale file handle")
            return real_read(self)

        first = lock.read().heartbeat
        with caplog.at_level("WARNING"):
            monkeypatch.setattr(RunLock, "read", flaky_read)
            time.sleep(0.4)  # ~8 beats: 3 fail, the others write
            monkeypatch.setattr(RunLock, "read", real_read)
        assert lock._thread.is_alive() and lock.lost is None
        assert lock.read().heartbeat > first and "Stale file handle" in caplog.text
        lock.check()  # still ours
    finally:
        lock.release()


def test_a_takeover_between_two_steps_is_noticed_at_the_next_step(tmp_path):
    """The loop checks its lock before each step and before it logs one: a run taken over while it trains stops at
    once, naming the new holder, instead of at its next checkpoint (up to runtime.checkpoint_interval steps)."""
    from nemo_hacpo.runtime.loop import HacpoRun

    cfg = load_config("pair_tiny_gpt", [f"runtime.output_dir={tmp_path}", "runtime.logging=[jsonl]",
                                        "runtime.steps=5", "runtime.eval_interval=0", "runtime.checkpoint_interval=5",
                                        "runtime.save_hf=false", "warmstart.enabled=false", "reward.num_workers=0"])
    checkpoints = []

    class FakeRun(HacpoRun):  # the real loop and lock; no Ray, no engines
        def start(self):
            self._lock = RunLock(self.out_dir, cfg.runtime.lock_stale_s).acquire()
            self.eval_history.append({"step": 0})

        def run_step(self, scorer):
            self.step += 1
            if self.step == 2:  # meanwhile another run decided this one was gone and took the directory
                _write_holder(tmp_path, host="node7", pid=1234)
            return {"llama_tiny/reward_mean": 0.5}

        def checkpoint(self):
            checkpoints.append(self.step)

        def close(self, timeout_s=None):
            if self._lock is not None:
                self._lock.release()

    run = FakeRun(cfg)
    try:
        with pytest.raises(LockLost, match=r"another run has taken this run's lock over \(pid 1234 on node7"):
            run.fit()
    finally:
        run.close()
    logged = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1] and checkpoints == []  # step 2 trained but wrote nothing; no step 3
    assert json.loads((tmp_path / LOCK_FILE).read_text())["token"] == "theirs"


def test_closing_sweeps_only_a_directory_it_holds_and_always_releases(tmp_path, monkeypatch, caplog):
    """`HacpoRun.close` sweeps the engines' recorded /dev/shm files only while it holds the directory: a run whose
    lock was taken over leaves the new holder's records alone. A sweep that fails is logged and the lock is
    released all the same."""
    import nemo_hacpo.runtime.loop as loop
    from nemo_hacpo.runtime.loop import HacpoRun

    swept = []
    monkeypatch.setattr(loop, "sweep_recorded", lambda directory, wait_s=0.0: swept.append((directory, wait_s)) or [])
    cfg = load_config("pair_tiny_gpt", [f"runtime.output_dir={tmp_path}", "warmstart.enabled=false"])

    run = HacpoRun(cfg)  # no start: the lock alone (close() of a run without groups)
    run._lock = RunLock(tmp_path, cfg.runtime.lock_stale_s).acquire()
    run.close()
    # waiting for the processes of engines whose actors were killed just now
    assert swept == [(tmp_path / "engines" / ".shm", loop.ENGINE_EXIT_WAIT_S)] and not (tmp_path / LOCK_FILE).exists()

    swept.clear()
    run._lock = RunLock(tmp_path, cfg.runtime.lock_stale_s).acquire()
    _write_holder(tmp_path, host="node7", pid=1234)  # taken over meanwhile
    with pytest.raises(LockLost):
        run._lock.check()
    run.close()
    assert swept == [] and json.loads((tmp_path / LOCK_FILE).read_text())["token"] == "theirs"

    (tmp_path / LOCK_FILE).unlink()
    run._lock = RunLock(tmp_path, cfg.runtime.lock_stale_s).acquire()

    def failing(directory, wait_s=0.0):
        raise OSError(116, "Stale file handle")

    monkeypatch.setattr(loop, "sweep_recorded", failing)
    with caplog.at_level(logging.ERROR, logger="nemo_hacpo.runtime.loop"):
        run.close()
    assert "sweeping the engines' shared memory" in caplog.text and not (tmp_path / LOCK_FILE).exists()
    assert run._lock is None

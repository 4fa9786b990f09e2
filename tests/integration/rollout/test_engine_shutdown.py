"""Shutting a rollout engine down leaves none of its processes' shared memory in /dev/shm.

vLLM's engine (EngineCore + one Worker process, also at TP=1) keeps its message queues in /dev/shm (`psm_*`,
160–240 MiB each). Each is unlinked by the process that created it during its own teardown, so a process
killed before that leaves the file behind — which vLLM's default 5 s grace did on the busy 2-core machine.
`clean`: the engine's normal shutdown (vLLM's 5 s grace: the EngineCore exits by itself or is killed). `killed`: vLLM is given no grace at all,
so it force-kills the EngineCore and the worker right away (a slow machine, or a hung teardown), and the files
must still be gone. In both, `shutdown` waits until the processes are gone (`ENGINE_GONE_WAIT_S` raised: the
runtime's 2 s bound, past which the files are left to the recorded sweep tested below, is a matter of the machine's
speed), so what is checked is that a shutdown whose processes are gone has left nothing, however busy the machine. The check is restricted to files the engine's own processes mapped, read from
/proc/<pid>/maps while they ran; other files in /dev/shm (other tests, other runs) do not matter.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import nemo_hacpo.rollout.engine as engine_module
from nemo_hacpo.config import load_config
from nemo_hacpo.models.tokenizers import load_tokenizer
from nemo_hacpo.rollout import RolloutEngine
from nemo_hacpo.rollout.engine_processes import SHM_DIR, engine_pids, engine_shm_files, wait_gone
from tests.helpers import hf_models as tiny
from tests.helpers.runs import small_kv_cache

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("grace", ["clean", "killed"])
def test_shutdown_leaves_no_shared_memory_of_the_engine(grace, tmp_path, monkeypatch):
    agent = {a.name: a for a in load_config("pair_tiny_gpt", small_kv_cache(2)).agents}["gpt_tiny"]
    tokenizer = load_tokenizer(agent.tokenizer.source)
    model = tiny.hf_model_from_spec(agent.model.tiny, tokenizer, seed=0, config_eos_token_id=tokenizer.pad_token_id)
    engine = RolloutEngine.from_agent(agent, tiny.save_checkpoint(model, tokenizer, tmp_path), device="cpu",
                                      default_seed=0)
    monkeypatch.setattr(engine_module, "ENGINE_GONE_WAIT_S", 600.0)  # a bound only a hung kernel would reach
    try:
        engine.generate([[{"role": "user", "content": "1 + 1 = ?"}]], n=2, max_tokens=4)
        pids = engine_pids(engine.llm)
        files = engine_shm_files(pids)
        assert len(pids) >= 2, "expected an EngineCore and a Worker process"
        assert any(name.startswith("psm_") for name in files), f"no message queue found in /dev/shm: {files}"
        if grace == "killed":
            monkeypatch.setattr(engine_module, "ENGINE_EXIT_TIMEOUT_S", 0.0)
    finally:
        engine.shutdown()

    assert wait_gone(pids, timeout=0) == []
    assert [name for name in sorted(files) if (SHM_DIR / name).exists()] == []


def test_an_engine_whose_actor_was_killed_leaves_queues_that_the_sweep_removes(tmp_path):
    """Issue #41: a rank actor `ray.kill`ed (after a failure, a hung call) takes its engine's processes with it
    before they can unlink their message queues. Each engine records its processes and files when it starts;
    `sweep_recorded` — what the driver runs when a run closes or starts — unlinks the files of recorded engines whose
    processes are all gone, and only those: an engine alive meanwhile (this test's second, recorded in the same place)
    keeps its files, and its record goes with them once it has shut down."""
    import json

    import ray

    from nemo_hacpo.rollout.engine_processes import sweep_recorded

    agent = {a.name: a for a in load_config("pair_tiny_gpt", small_kv_cache(2)).agents}["gpt_tiny"]
    tokenizer = load_tokenizer(agent.tokenizer.source)
    model_dir = tiny.save_checkpoint(tiny.hf_model_from_spec(agent.model.tiny, tokenizer, seed=0), tokenizer,
                                     tmp_path / "model")
    records = tmp_path / "records"

    class Holder:  # a rank actor's engine, and nothing else
        def __init__(self):
            self.engine = RolloutEngine.from_agent(agent, model_dir, device="cpu", default_seed=0,
                                                   shm_record=records / "killed.json")

        def files(self):
            return sorted(engine_shm_files(engine_pids(self.engine.llm))), engine_pids(self.engine.llm)

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    alive = RolloutEngine.from_agent(agent, model_dir, device="cpu", default_seed=0, shm_record=records / "alive.json")
    try:
        holder = ray.remote(Holder).remote()
        files, pids = ray.get(holder.files.remote(), timeout=300)
        assert any(name.startswith("psm_") for name in files), files
        assert any(name.startswith("sem.mp-") for name in files), files  # its lock, mapped as `sem.XXXXXX (deleted)`
        record = json.loads((records / "killed.json").read_text())
        assert set(record["shm"]) == set(files)
        assert Path(record["scratch"]).is_dir()  # its generation config and tokenizer view, the actor's to remove
        ray.kill(holder)  # SIGKILL: nothing of the engine's teardown runs
        wait_gone([*pids, record["owner"]], timeout=60)
        left = [name for name in files if (SHM_DIR / name).exists()]
        assert left, "the killed engine unlinked its queues after all: nothing to sweep"
        kept = sorted(engine_shm_files(engine_pids(alive.llm)))
        assert set(left) <= set(sweep_recorded(records))
        assert [name for name in files if (SHM_DIR / name).exists()] == []
        assert not Path(record["scratch"]).exists()
        assert all((SHM_DIR / name).exists() for name in kept)  # the live engine's queues are untouched
        assert sorted(p.name for p in records.iterdir()) == ["alive.json"]  # the swept record is dropped
    finally:
        alive.shutdown()
        ray.shutdown()
    sweep_recorded(records)  # as the driver's at the run's close: whatever the clean shutdown could not unlink yet
    assert list(records.iterdir()) == []  # every record dropped once its files are gone
    assert [name for name in kept if (SHM_DIR / name).exists()] == []


HOLDER = """
import json, sys, time
from nemo_hacpo.config import load_config
from nemo_hacpo.rollout import RolloutEngine
from nemo_hacpo.rollout.engine_processes import engine_pids
from tests.helpers.runs import small_kv_cache
agent = {a.name: a for a in load_config("pair_tiny_gpt", small_kv_cache(2)).agents}["gpt_tiny"]
engine = RolloutEngine.from_agent(agent, sys.argv[1], device="cpu", default_seed=0, shm_record=sys.argv[2])
print("STARTED", json.dumps({"pids": engine_pids(engine.llm), "watchdog": engine._watchdog.pid}), flush=True)
time.sleep(3600)
"""


def test_an_engine_whose_owner_is_sigkilled_goes_with_it(tmp_path):
    """vLLM's EngineCore does not watch its parent: an owner SIGKILLed along with Ray's processes (a killed driver
    of a local cluster) left an EngineCore and its worker running for hours, reparented to init. The engine's
    watchdog (`rollout/engine_watchdog.py`) kills them once the owner is gone; the sweep then removes their files.
    (Without the watchdog — stopped before the kill — the two processes were still alive a minute later.)"""
    import json
    import os
    import signal
    import subprocess
    import sys

    from nemo_hacpo.rollout.engine_processes import sweep_recorded
    from tests.helpers.runs import REPO

    agent = {a.name: a for a in load_config("pair_tiny_gpt", small_kv_cache(2)).agents}["gpt_tiny"]
    tokenizer = load_tokenizer(agent.tokenizer.source)
    model_dir = tiny.save_checkpoint(tiny.hf_model_from_spec(agent.model.tiny, tokenizer, seed=0), tokenizer,
                                     tmp_path / "model")
    records = tmp_path / "records"
    with (tmp_path / "holder.log").open("wb") as log:
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(model_dir), str(records / "engine.json")],
                                  cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO),
                                                     VLLM_LOGGING_STREAM="ext://sys.stderr"), stdout=subprocess.PIPE,
                                  stderr=log, start_new_session=True)
    try:
        lines = iter(holder.stdout.readline, b"")  # until the engine has started, or the holder died (EOF)
        line = next((line for line in lines if line.startswith(b"STARTED ")), None)
        assert line is not None, (tmp_path / "holder.log").read_text()[-3000:]
        started = json.loads(line.split(b" ", 1)[1])
        assert len(started["pids"]) >= 2 and wait_gone([started["watchdog"]], timeout=0) == [started["watchdog"]]
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        assert wait_gone(started["pids"], timeout=120) == [], "the engine outlived its owner"
        assert wait_gone([started["watchdog"]], timeout=30) == []  # its work done, the watchdog exits
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()
    sweep_recorded(records)
    assert list(records.iterdir()) == []  # every file the killed engine left is unlinked

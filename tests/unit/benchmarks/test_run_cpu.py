"""benchmarks/run_cpu.py: the process kinds, the per-step / fixed split by hand, and the process walk on real
processes that burn a known amount of CPU."""

from __future__ import annotations

import subprocess
import sys
import time

from benchmarks import run_cpu as rc


def test_processes_are_named_by_what_they_run():
    assert rc.classify("python", "python recipes/train.py ...", is_driver=True) == "driver (recipes/train.py)"
    assert rc.classify("ray::AgentRank", "ray::AgentRank.train", False) == "trainer rank (ray::AgentRank)"
    assert rc.classify("VLLM::EngineCor", "VLLM::EngineCore", False) == "vLLM engine core"
    assert rc.classify("VLLM::EngineCor", "", False) == "vLLM engine core"  # exiting: the cut name alone
    assert rc.classify("VLLM::Worker_TP", "VLLM::Worker_TP0", False) == "vLLM worker"
    assert rc.classify("python", "python /x/nemo_hacpo/rollout/engine_watchdog.py 12 34", False) == "engine watchdog"
    ray = "Ray (GCS, raylet, agents, monitors)"
    assert rc.classify("gcs_server", "/x/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp", False) == ray
    assert rc.classify("raylet", "/x/raylet --raylet_socket_name=/tmp/s", False) == ray
    assert rc.classify("ray::IDLE", "ray::IDLE", False) == ray
    assert rc.classify("python", "python -u /x/ray/_private/log_monitor.py", False) == ray
    assert rc.classify("sh", "/bin/sh -c true", False) == "other"


def test_per_step_and_fixed_cpu_by_hand():
    names = {"driver (recipes/train.py)": 1, "vLLM worker": 2}
    two = rc.Usage(2, 40.0, 0, {"driver (recipes/train.py)": 9.0, "vLLM worker": 20.0}, names)
    four = rc.Usage(4, 50.0, 0, {"driver (recipes/train.py)": 11.0, "vLLM worker": 26.0}, names)
    lines = rc.tables([four, two]).splitlines()  # the order given does not matter for the split
    worker = next(line for line in lines if line.startswith("| vLLM worker |"))
    # per step (26 − 20) / (4 − 2) = 3.0; fixed 20 − 2·3 = 14.0; share 20 / 29 = 69 %
    assert worker.split(" | ")[-2:] == ["3.0", "14.0 |"]
    assert "20.0 (69 %)" in worker and "26.0 (70 %)" in worker
    total = next(line for line in lines if line.startswith("| all |"))
    assert total.split(" | ")[-2:] == ["4.0", "21.0 |"]  # (37 − 29) / 2; 29 − 2·4
    assert lines[-1].startswith("wall time: 4 steps 50 s (status 0), 2 steps 40 s (status 0);")


BURN = ("import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', sys.argv[1]]) if len(sys.argv) > 1 else None\n"
        "while sum(os.times()[:2]) < 0.4: pass\n"  # 0.4 CPU-seconds, however fast the machine
        "time.sleep(30)\n")


def test_the_walk_finds_every_process_below_the_root_with_its_cpu():
    proc = subprocess.Popen([sys.executable, "-c", BURN, BURN])  # a child that starts a grandchild, both burning
    try:
        seen: dict[int, tuple[float, str, str]] = {}
        deadline = time.monotonic() + 120
        while not (len(seen) == 2 and all(cpu >= 0.4 for cpu, *_ in seen.values())):
            assert time.monotonic() < deadline, seen
            rc.sample_tree(proc.pid, seen)
            time.sleep(0.1)
        assert seen[proc.pid][1] == "driver (recipes/train.py)"  # the root counts as the run's driver
        (grandchild,) = set(seen) - {proc.pid}
        assert seen[grandchild][1] == "other"
        rc.sample_tree(proc.pid, seen)
        assert len(seen) == 2  # nothing outside the tree (this test's own process, its other children)
    finally:
        subprocess.run(["pkill", "-P", str(proc.pid)], check=False)
        proc.kill()
        proc.wait()

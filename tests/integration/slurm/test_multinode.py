"""`sbatch -N 2/-N 4 slurm/hacpo_70b_8b.sh` on the session's local Slurm cluster of four network-namespace nodes
(tests/integration/slurm/conftest.py: `scripts/slurm_local.sh start <dir> 4`): node k is its own network namespace
with address 10.77.0.k and host name nodek, so a component that advertises loopback to another node fails here as
on a real cluster.

With one Ray CPU per node and one CPU per agent rank, Ray's placement puts one rank on each node. Checked:
- 2 nodes, pair_tiny_gpt: the two agents on different nodes; Ray head and worker, the agents' rendezvous and vLLM
  on the nodes' own addresses; per-node Ray logs; metrics; nothing left on any node;
- 4 nodes, trio_tiny with HACPO for two steps and llama_tiny at dp = 2: its ranks on two nodes (its rendezvous,
  gradient all-reduce and metric reduction cross the bridge), gpt_tiny and qwen_tiny on a node each, and the
  loop's checks of tests/integration/runtime/test_algorithms.py for three agents (tests/helpers/loop_checks.py);
- node failure: every process of the job on node 2 is SIGKILLed inside step 2; the job ends within a bounded
  time, FAILED, naming the agent and rank that lived there and the last complete checkpoint (step 1); nothing is
  left on any node, not even the queues and semaphores the killed engine left in /dev/shm (the job's end swept
  them on that node); resubmitting the same line resumes from step 1 and finishes, its step 2 equal to the
  uninterrupted run's (the tolerance of tests/integration/runtime/test_resume_and_failures.py);
- `scancel` while the agents start: the job script reports Ray stopped on every node within its KillWait budget
  (by construction: every wait of its TERM path is bounded), and every node's processes are gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.loop_checks import (
    SHARED,
    B,
    G,
    check_last_record,
    check_summary_header,
    tiny_algo_overrides,
)
from tests.integration.slurm.cluster import (
    TINY_OVERRIDES,
    final_job_fields,
    job_processes,
    metrics_by_step,
    placements,
    sbatch,
    tail,
    wait_until_gone,
)
from tests.integration.slurm.conftest import NODES

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHM = Path("/dev/shm")
ADDRESS = {f"node{k}": f"10.77.0.{k}" for k in range(1, NODES + 1)}
COMPARED = ("reward_mean", "response_length_mean", "train/loss", "train/policy_loss", "train/grad_norm",
            "train/self_ratio_mean", "capability")
"""As tests/integration/runtime/test_resume_and_failures.py compares a resumed run with an uninterrupted one."""


def _completed(run, env) -> None:
    assert run.job_id.isdigit(), run.report()
    job = final_job_fields(run.job_id, env)
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", f"{job}\n{run.report()}"


def _job_nodes(run) -> list[str]:
    """The job's nodes: one Ray log per node, `<output>/logs/ray-<node>.log`."""
    return sorted(p.name.removeprefix("ray-").removesuffix(".log") for p in (run.run_dir / "logs").glob("ray-*.log"))


def _check_addresses(run_dir: Path, nodes: list[str]) -> dict[tuple[str, int], str]:
    """Every rank's host, address and rendezvous are its node's; every node's Ray log names its own address."""
    placed = placements(run_dir)
    assert placed, tail(run_dir / "logs" / "driver.log")
    for (agent, rank), (host, address, rendezvous, engine) in placed.items():
        assert host in nodes and address == ADDRESS[host], (agent, rank, host, address)
        assert not rendezvous.startswith("127.") and rendezvous.split(":")[0] in ADDRESS.values(), rendezvous
        assert engine in ("", address), (agent, rank, engine)  # vLLM advertises the node's address too
    for node in nodes:
        log = (run_dir / "logs" / f"ray-{node}.log").read_text(errors="replace")
        assert f"Local node IP: {ADDRESS[node]}" in log or f"node IP: {ADDRESS[node]}" in log, tail(
            run_dir / "logs" / f"ray-{node}.log")
    assert all(engine for (_, rank), (*_, engine) in placed.items() if rank == 0)  # every rank 0 owns an engine
    return {key: host for key, (host, *_) in placed.items()}


def test_two_nodes_one_agent_each(cluster, two_node_job):
    run, out = two_node_job, two_node_job.run_dir
    _completed(run, cluster)
    nodes = _job_nodes(run)
    assert len(nodes) == 2, nodes
    hosts = _check_addresses(out, nodes)
    assert set(hosts) == {("llama_tiny", 0), ("gpt_tiny", 0)}
    assert sorted(hosts.values()) == nodes, hosts  # the agents on different nodes
    text = run.output.read_text()
    assert f"2 node(s), head {nodes[0]} ({ADDRESS[nodes[0]]})" in text, run.report()
    assert "ray stopped on 2 node(s)" in text, run.report()
    steps = metrics_by_step(out)
    assert max(steps) == 2 and steps[2]["llama_tiny/broker/cross_rows"] == 4, steps.get(2)
    assert wait_until_gone(run.job_id, cluster["SLURM_CONF"]) == []


def _kill_node(job_id: str, slurm_conf: str, node: str) -> list[str]:
    """SIGKILL every process of the job on `node` (Ray's step there: `ray start`, raylet, workers, engines)."""
    killed = []
    for entry in job_processes(job_id, slurm_conf):
        pid, where = entry.split(" ", 1)[0], entry.split("[", 1)[1].split("]", 1)[0]
        if where == node:
            try:
                os.kill(int(pid), signal.SIGKILL)
                killed.append(entry)
            except ProcessLookupError:
                pass
    return killed


def test_node_failure_stops_the_job_and_a_resubmission_resumes(cluster, two_node_job, tmp_path):
    _completed(two_node_job, cluster)  # the reference: the same job, uninterrupted
    expected = metrics_by_step(two_node_job.run_dir)
    out = tmp_path / "run"
    conf = cluster["SLURM_CONF"]
    run = sbatch(cluster, out, nodes=2, ray_cpus=1, overrides=TINY_OVERRIDES, wait=False, tag="fail")
    assert run.submit.returncode == 0 and run.job_id.isdigit(), run.report()
    deadline = time.monotonic() + 900
    while not (out / "checkpoints" / "step_000001" / "manifest.json").is_file():  # step 1 saved: step 2 runs
        assert time.monotonic() < deadline, f"no step-1 checkpoint within 900 s\n{run.report()}"
        assert final_job_fields(run.job_id, cluster, wait_s=0)["JobState"] in ("PENDING", "RUNNING"), run.report()
        time.sleep(0.5)
    head = run.output.read_text().split(" node(s), head ", 1)[1].split()[0]
    hosts = {host: key for key, (host, *_) in placements(out).items()}
    victim = next(host for host in hosts if host != head)  # the node of the agent that is not on the head
    victim_agent, victim_rank = hosts[victim]
    killed_at = time.monotonic()
    killed = _kill_node(run.job_id, conf, victim)
    assert any("raylet" in k for k in killed) and any("AgentRank" in k or "ray::" in k for k in killed), killed
    # the killed node's engine leaves its queues and semaphores in /dev/shm; the driver, on the other node, leaves
    # them (its sweep judges its own node's processes only); the job's end sweeps every node
    left = _recorded_shm(out, host=victim)
    assert any(name.startswith("psm_") for name in left), f"the killed engine recorded no /dev/shm file: {left}"

    while final_job_fields(run.job_id, cluster, wait_s=0)["JobState"] in ("PENDING", "RUNNING", "COMPLETING"):
        assert time.monotonic() - killed_at < 300, f"the job still runs 300 s after {victim} died\n{run.report()}"
        time.sleep(1)
    stopped_s = time.monotonic() - killed_at
    job = final_job_fields(run.job_id, cluster)
    assert job["JobState"] == "FAILED" and job["ExitCode"] != "0:0", f"{job}\n{run.report()}"
    driver = (out / "logs" / "driver.log").read_text(errors="replace")
    assert f"agent {victim_agent!r} rank {victim_rank}" in driver, driver[-3000:]
    assert "last complete checkpoint: " in driver and "step_000001" in driver.split("last complete checkpoint: ")[-1]
    assert wait_until_gone(run.job_id, conf) == []  # every node, not only the one that died
    print(f"\n{victim} killed ({victim_agent} rank {victim_rank}): the job ended {stopped_s:.0f} s later")
    assert not any((SHM / name).exists() for name in left), [name for name in left if (SHM / name).exists()]
    swept = [line for line in run.output.read_text().splitlines() if line.startswith(f"[hacpo] {victim}: unlinked ")]
    assert swept and set(left) <= set(swept[0].split(": ")[-1].split()), (left, swept, tail(run.output))

    again = sbatch(cluster, out, nodes=2, ray_cpus=1, overrides=TINY_OVERRIDES, wait=True, tag="again")
    _completed(again, cluster)
    assert not any((SHM / name).exists() for name in left), [name for name in left if (SHM / name).exists()]
    assert _recorded_shm(out) == []  # and the clean shutdown of the second run's engines left nothing recorded
    log = (out / "logs" / "driver.log").read_text(errors="replace")
    assert "resuming from " in log and "(step 1)" in log.split("resuming from ")[-1].splitlines()[0], log[-3000:]
    resumed = metrics_by_step(out)
    assert max(resumed) == 2
    for agent in ("llama_tiny", "gpt_tiny"):
        for key in COMPARED:
            name = f"{agent}/{key}"
            if name in expected[2]:
                assert resumed[2][name] == pytest.approx(expected[2][name], rel=1e-5, abs=1e-6), name
    assert wait_until_gone(again.job_id, conf) == []


def _recorded_shm(run_dir: Path, host: str | None = None) -> list[str]:
    """The /dev/shm files the run's engines (those on `host`, or all) recorded (`engine_processes.record_engine`)
    that still exist."""
    names = []
    for path in sorted((run_dir / "engines" / ".shm").glob("*.json")):
        record = json.loads(path.read_text())
        if host is None or record["host"] == host:
            names += [name for name in record["shm"] if (SHM / name).exists()]
    return names


def test_scancel_tears_down_every_node(cluster, tmp_path):
    out = tmp_path / "run"
    conf = cluster["SLURM_CONF"]
    run = sbatch(cluster, out, nodes=2, ray_cpus=1, overrides=TINY_OVERRIDES, wait=False, tag="cancel")
    assert run.submit.returncode == 0 and run.job_id.isdigit(), run.report()
    deadline = time.monotonic() + 600
    while not {"node1", "node2"} <= {e.split("[", 1)[1].split("]", 1)[0] for e in job_processes(run.job_id, conf)
                                     if "AgentRank" in e}:  # an agent actor on each node
        assert time.monotonic() < deadline, f"no AgentRank actor on both nodes within 600 s\n{run.report()}"
        assert final_job_fields(run.job_id, cluster, wait_s=0)["JobState"] in ("PENDING", "RUNNING"), run.report()
        time.sleep(1)
    subprocess.run(["scancel", run.job_id], env=cluster, check=True)
    job = final_job_fields(run.job_id, cluster)
    assert job["JobState"] == "CANCELLED", job
    assert wait_until_gone(run.job_id, conf) == []
    text = run.output.read_text()
    assert "[hacpo] cancelled (SIGTERM)" in text and "ray stopped on 2 node(s)" in text, tail(run.output)


def test_four_nodes_trio_with_an_agent_at_dp_2_spanning_two_of_them(cluster, tmp_path):
    """trio_tiny with HACPO end to end through the job script, llama_tiny at dp = 2: its two ranks on two nodes,
    gpt_tiny and qwen_tiny on a node each, and the loop's checks of tests/integration/runtime/test_algorithms.py for
    n = 3 (one ω per other agent, both partners' groups as cross rows)."""
    out = tmp_path / "run"
    # an update's 6 sequences (B·G·n / updates_per_step) split into dp = 2 × micro-batches of 3
    dp_2 = {"agents.0.parallel.dp": "2", "agents.0.parallel.micro_batch_size": "3"}
    overrides = [o for o in tiny_algo_overrides(3) if o.split("=", 1)[0] not in dp_2]
    overrides += [f"{key}={value}" for key, value in dp_2.items()]
    run = sbatch(cluster, out, nodes=4, ray_cpus=1, overrides=overrides, config="trio_tiny", wait=True, tag="trio")
    _completed(run, cluster)
    nodes = sorted(ADDRESS)
    hosts = _check_addresses(out, nodes)
    assert set(hosts) == {("llama_tiny", 0), ("llama_tiny", 1), ("gpt_tiny", 0), ("qwen_tiny", 0)}
    assert sorted(hosts.values()) == nodes, hosts  # one rank per node: llama_tiny's two on two nodes
    rendezvous = {placements(out)[("llama_tiny", r)][2] for r in (0, 1)}
    assert rendezvous == {f"{ADDRESS[hosts[('llama_tiny', 0)]]}:{next(iter(rendezvous)).split(':')[1]}"}
    assert (out / "logs" / "llama_tiny_rank1.log").is_file()
    assert "ray stopped on 4 node(s)" in run.output.read_text()
    assert wait_until_gone(run.job_id, cluster["SLURM_CONF"]) == []

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    check_summary_header(out)
    agents = ["llama_tiny", "gpt_tiny", "qwen_tiny"]
    # both steps trained llama_tiny with its ranks on two nodes: every update's gradient all-reduce and metric
    # reduction crossed the bridge, and its metrics are those of the whole batch (the rows of both ranks)
    check_last_record(records[-1], agents, shares=True, samples=G, loss_keys=SHARED)
    for learner in agents:
        assert sum(k.startswith(f"{learner}/omega/") for k in records[-1]) == 2
        assert records[-1][f"{learner}/train/num_cross"] == 2 * B * G
        assert records[-1][f"{learner}/broker/cross_rows"] == 2 * B * G

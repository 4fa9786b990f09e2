"""`sbatch slurm/hacpo_70b_8b.sh` on a real single-node Slurm cluster (munged + slurmctld + slurmd, no cgroups).

The production script runs unchanged except for its size: the command line overrides the 5 × 8-GPU `#SBATCH`
lines with one CPU node, and `CONFIG=pair_tiny_gpt` with the tiny 2-step overrides of
tests/integration/runtime/test_train_loop.py. The job starts a Ray head (no workers on one node) in an `srun`
step, runs the driver against it, and stops Ray on exit. Checked: Slurm's record of the job (COMPLETED, exit
0:0), the run's metrics up to step 2, the per-node logs, and that no process of the job is left. The same script
on several (namespace) nodes, its failures and `scancel`: test_multinode.py.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from tests.integration.slurm.cluster import (
    TINY_OVERRIDES,
    final_job_fields,
    local_cluster,
    sbatch,
    tail,
    wait_until_gone,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def slurm_env() -> Iterator[dict[str, str]]:
    with local_cluster(1) as env:
        yield env


def test_sbatch_runs_the_tiny_pair_for_two_steps(slurm_env, tmp_path):
    out = tmp_path / "run"
    ranks = 2  # one Ray CPU per rank (pair_tiny_gpt: one rank per agent); vLLM runs in rank 0
    run = sbatch(slurm_env, out, nodes=1, ray_cpus=ranks, overrides=TINY_OVERRIDES, wait=True, tag="one")
    job_id, job_out, report = run.job_id, run.output, run.report()
    assert job_id.isdigit(), report

    job = final_job_fields(job_id, slurm_env)
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", f"{job}\n{report}"
    assert run.submit.returncode == 0, report

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert 2 in [r["step"] for r in records] and max(r["step"] for r in records) == 2
    step2 = next(r for r in records if r["step"] == 2 and "llama_tiny/broker/self_rows" in r)
    for agent in ("llama_tiny", "gpt_tiny"):  # B·G = 4 own and 4 shared rows per agent and step
        assert step2[f"{agent}/broker/self_rows"] == 4 and step2[f"{agent}/broker/cross_rows"] == 4
        assert step2[f"{agent}/sequences_trained_total"] == 16

    # per-node logs: the Ray head's (one node) and the driver's
    node = subprocess.run(["hostname", "-s"], check=True, capture_output=True, text=True).stdout.strip()
    ray_log = out / "logs" / f"ray-{node}.log"
    assert ray_log.is_file() and "Ray runtime started" in ray_log.read_text(), tail(ray_log)
    assert "driver exited with status 0" in job_out.read_text(), report
    assert "ray stopped on 1 node(s)" in job_out.read_text(), report
    assert "metrics.jsonl" in (out / "logs" / "driver.log").read_text()  # the driver's closing summary

    # clean teardown: nothing the job started (Ray, its workers, vLLM engine cores) is left on the node
    assert wait_until_gone(job_id, slurm_env["SLURM_CONF"]) == []

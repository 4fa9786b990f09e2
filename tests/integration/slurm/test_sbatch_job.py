"""`sbatch slurm/hacpo_70b_8b.sh` on a real single-node Slurm cluster (munged + slurmctld + slurmd, no cgroups).

The production script runs unchanged except for its size: the command line overrides the 5 × 8-GPU `#SBATCH`
lines with one CPU node, and `CONFIG=pair_tiny_gpt` with the tiny 2-step overrides of
tests/integration/runtime/test_train_loop.py. The job starts a Ray head (no workers on one node) in an `srun`
step, runs the driver against it, and stops Ray on exit. Checked: Slurm's record of the job (COMPLETED, exit
0:0), the run's metrics up to step 2, the per-node logs, and that no process of the job is left. Then the same job
submitted with `--requeue` and sent SIGUSR1 inside training (`scancel --signal=USR1 --batch`, the way of Slurm's own
`--signal=B:USR1@<lead>`): the job script passes it to the driver, which saves a checkpoint and exits 75; the job
requeues itself, and its next run resumes and finishes with the uninterrupted job's metrics. The same script on
several (namespace) nodes, its failures and `scancel`: test_multinode.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.helpers.runs import assert_same_metrics
from tests.integration.slurm.cluster import (
    TINY_OVERRIDES,
    Job,
    final_job_fields,
    local_cluster,
    metrics_by_step,
    sbatch,
    slurm_logs,
    tail,
    wait_until_gone,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def slurm_env() -> Iterator[dict[str, str]]:
    with local_cluster(1) as env:
        yield env


@pytest.fixture(scope="module")
def uninterrupted_job(slurm_env, tmp_path_factory) -> Job:
    """The tiny pair's 2-step job, run once: checked by the first test, the reference of the requeue test (so
    the latter needs no other test to run before it)."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    ranks = 2  # one Ray CPU per rank (pair_tiny_gpt: one rank per agent); vLLM runs in rank 0
    return sbatch(slurm_env, out, nodes=1, ray_cpus=ranks, overrides=TINY_OVERRIDES, wait=True, tag="one")


def test_sbatch_runs_the_tiny_pair_for_two_steps(slurm_env, uninterrupted_job):
    run = uninterrupted_job
    out, job_id, job_out, report = run.run_dir, run.job_id, run.output, run.report()
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


def test_sigusr1_saves_the_job_requeues_and_its_next_run_continues_as_uninterrupted(slurm_env, uninterrupted_job,
                                                                                    tmp_path):
    reference = metrics_by_step(uninterrupted_job.run_dir)
    out = tmp_path / "run"
    run = sbatch(slurm_env, out, nodes=1, ray_cpus=2, overrides=TINY_OVERRIDES, wait=False, tag="usr1",
                 options=["--requeue"])
    assert run.submit.returncode == 0 and run.job_id.isdigit(), run.report()
    deadline = time.monotonic() + 900
    metrics = out / "metrics.jsonl"
    while not (metrics.is_file() and metrics.read_text().strip()):  # the evaluation before training is logged
        assert time.monotonic() < deadline, f"no metrics within 900 s\n{run.report()}"
        assert final_job_fields(run.job_id, slurm_env, wait_s=0)["JobState"] in ("PENDING", "RUNNING"), run.report()
        time.sleep(0.5)
    subprocess.run(["scancel", "--signal=USR1", "--batch", run.job_id], env=slurm_env, check=True)

    deadline = time.monotonic() + 1500
    while (job := final_job_fields(run.job_id, slurm_env, wait_s=0))["JobState"] not in (
            "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
        assert time.monotonic() < deadline, f"the job did not end within 1500 s: {job}\n{run.report()}"
        # requeued: the job starts again once its first run's credential has expired (the local cluster's
        # cred_expire=10 s; Slurm's default holds it 2 minutes; released sooner, a run is killed as revoked)
        time.sleep(1)
    job = final_job_fields(run.job_id, slurm_env)
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", (
        f"{job}\n{run.report()}\n{slurm_logs(slurm_env)}")
    assert job["Restarts"] == "1", job

    text = run.output.read_text()  # both runs of the job (--open-mode=append)
    assert "[hacpo] SIGUSR1: asking the driver to save a checkpoint" in text, run.report()
    assert "driver exited with status 75" in text and f"requeueing job {run.job_id} (run 0)" in text, run.report()
    assert "driver exited with status 0" in text.split("driver exited with status 75", 1)[1], run.report()
    driver = (out / "logs" / "driver.log").read_text(errors="replace")
    # the script reads the job's end from squeue and passes it on (a container's driver has no squeue); here, outside
    # a container, the driver reads the same time itself
    assert text.count("[hacpo] the job ends at ") == 2, run.report()  # once per run of the job
    assert f"time limit: the end of Slurm job {run.job_id} at " in driver
    saved = re.search(r"preempted: checkpoint step (\d+) ", driver)
    assert saved is not None, driver[-3000:]
    step = int(saved.group(1))  # the step in progress when the signal came: 1, or 2 on a slow poll
    assert f"(step {step})" in driver.split("resuming from ", 1)[1].splitlines()[0], driver[-3000:]
    resumed = metrics_by_step(out)
    assert sorted(resumed) == sorted(reference) == [0, 1, 2]
    assert_same_metrics(resumed, reference, steps=(1, 2))
    assert wait_until_gone(run.job_id, slurm_env["SLURM_CONF"]) == []

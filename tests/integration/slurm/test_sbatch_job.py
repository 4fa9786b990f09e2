"""`sbatch --nodes=1 --requeue slurm/hacpo_70b_8b.sh` on the session's local Slurm cluster (munged + slurmctld +
slurmd, no cgroups; tests/integration/slurm/conftest.py), sent SIGUSR1 inside training.

The production script runs unchanged except for its size: the command line overrides the 5 × 8-GPU `#SBATCH`
lines with one CPU node, and `CONFIG=pair_tiny_gpt` with the tiny 2-step overrides of
tests/integration/runtime/test_train_loop.py. The job starts a Ray head (no workers on one node) in an `srun`
step, runs the driver against it, and stops Ray on exit. `scancel --signal=USR1 --batch` (the way of Slurm's own
`--signal=B:USR1@<lead>`) reaches the job script, which passes it to the driver; the driver saves a checkpoint and
exits 75, the job requeues itself, and its next run resumes and finishes. Checked: Slurm's record of the job
(COMPLETED, exit 0:0, one restart), both runs' lines, the per-node logs, the resumed run's metrics equal to those
of the session's uninterrupted job (two nodes: the placement changes nothing), and that no process of the job is
left. The same script on several nodes, its failures and `scancel`: test_multinode.py.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from tests.helpers.runs import assert_same_metrics
from tests.integration.slurm.cluster import (
    TINY_OVERRIDES,
    final_job_fields,
    metrics_by_step,
    sbatch,
    slurm_logs,
    wait_until_gone,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_sigusr1_saves_the_job_requeues_and_its_next_run_continues_as_uninterrupted(cluster, two_node_job, tmp_path):
    reference = metrics_by_step(two_node_job.run_dir)
    out = tmp_path / "run"
    run = sbatch(cluster, out, nodes=1, ray_cpus=2, overrides=TINY_OVERRIDES, wait=False, tag="usr1",
                 options=["--requeue"])
    assert run.submit.returncode == 0 and run.job_id.isdigit(), run.report()
    deadline = time.monotonic() + 900
    # step 1 is in progress once its rollouts are written (generated and shared, not yet trained). Not the first
    # metrics line: that is the evaluation before training, and a SIGUSR1 between it and step 1 (the driver asks
    # squeue for the job's end there) rightly stops with no checkpoint — CI once sent it in that gap
    rollouts = out / "rollouts" / "step_000001.jsonl"
    while not rollouts.is_file():
        assert time.monotonic() < deadline, f"step 1 did not start within 900 s\n{run.report()}"
        assert final_job_fields(run.job_id, cluster, wait_s=0)["JobState"] in ("PENDING", "RUNNING"), run.report()
        time.sleep(0.5)
    subprocess.run(["scancel", "--signal=USR1", "--batch", run.job_id], env=cluster, check=True)

    deadline = time.monotonic() + 1500
    while (job := final_job_fields(run.job_id, cluster, wait_s=0))["JobState"] not in (
            "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
        assert time.monotonic() < deadline, f"the job did not end within 1500 s: {job}\n{run.report()}"
        # requeued: the job starts again once its first run's credential has expired (the local cluster's
        # cred_expire=10 s; Slurm's default holds it 2 minutes; released sooner, a run is killed as revoked)
        time.sleep(1)
    job = final_job_fields(run.job_id, cluster)
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", (
        f"{job}\n{run.report()}\n{slurm_logs(cluster)}")
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
    for agent in ("llama_tiny", "gpt_tiny"):  # B·G = 4 own and 4 shared rows per agent and step
        assert resumed[2][f"{agent}/broker/self_rows"] == 4 and resumed[2][f"{agent}/broker/cross_rows"] == 4
        assert resumed[2][f"{agent}/sequences_trained_total"] == 16

    # one node: the Ray head's log and the driver's; Ray stopped after each run; nothing the job started (Ray, its
    # workers, vLLM engine cores) is left
    ray_logs = sorted((out / "logs").glob("ray-*.log"))
    assert len(ray_logs) == 1 and "Ray runtime started" in ray_logs[0].read_text(), ray_logs
    assert text.count("ray stopped on 1 node(s)") == 2, run.report()
    assert "metrics.jsonl" in driver.split("resuming from ", 1)[1]  # the resumed driver's closing summary
    assert wait_until_gone(run.job_id, cluster["SLURM_CONF"]) == []

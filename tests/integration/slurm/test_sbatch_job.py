"""`sbatch slurm/hacpo_70b_8b.sh` on a real single-node Slurm cluster (munged + slurmctld + slurmd, no cgroups).

The production script runs unchanged except for its size: the command line overrides the 5 × 8-GPU `#SBATCH`
lines with one CPU node, and `CONFIG=pair_tiny` with the tiny 2-step overrides of
tests/integration/runtime/test_train_loop.py. The job starts a Ray head (no workers on one node) in an `srun`
step, runs the driver against it, and stops Ray on exit. Checked: Slurm's record of the job (COMPLETED, exit
0:0), the run's metrics up to step 2, the per-node logs, and that no process of the job is left; and, for a
job cancelled while the agents' actors start their engines, that the teardown leaves nothing either.

Needs root and Debian's slurm-wlm + munge (`bash scripts/install_ci_deps.sh`); skipped without them, except
under CI=true, where a skip would hide the check: there it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemo_hacpo.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "slurm" / "hacpo_70b_8b.sh"
SLURM_LOCAL = REPO / "scripts" / "slurm_local.sh"
PYTHON = REPO / ".venv" / "bin" / "python"
JOB_TIMEOUT_S = 1500
TINY_OVERRIDES = [  # as in tests/integration/runtime/test_train_loop.py::_config, for steps = 2
    "runtime.steps=2", "runtime.checkpoint_interval=1",
    "runtime.eval_interval=0", "runtime.logging=[jsonl]", "warmstart.enabled=false",
    "algo.batch_size=2", "algo.group_size=2", "algo.updates_per_step=2",
    "agents.0.max_response_length=16", "agents.1.max_response_length=16",
    "agents.0.parallel.micro_batch_size=2", "agents.1.parallel.micro_batch_size=2",
    "data.eval.size=4", "reward.num_workers=0",
]


def _skip_or_fail(reason: str) -> None:
    """Skip locally; fail under CI=true, so that CI cannot pass without running the job."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but the Slurm test cannot run: {reason} (bash scripts/install_ci_deps.sh)")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _final_job_fields(job_id: str, env: dict[str, str], wait_s: float = 120.0) -> dict[str, str]:
    """`scontrol show job -o` as a dict (JobState, ExitCode, ...) once the job has left COMPLETING.

    `sbatch --wait` returns when the batch script ends; Slurm still reports COMPLETING while it reaps the
    job's steps (KillWait), so poll until the state is final.
    """
    deadline = time.monotonic() + wait_s
    while True:
        line = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, check=True, capture_output=True,
                              text=True).stdout
        fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
        if fields.get("JobState") != "COMPLETING" or time.monotonic() > deadline:
            return fields
        time.sleep(1)


def _job_processes(job_id: str, slurm_conf: str) -> list[str]:
    """`pid: command line` of every live process of this cluster's job `job_id`.

    Slurm puts SLURM_JOB_ID into the environment of the batch script and of every step, and everything they
    start inherits it (ray start → GCS, raylet → Ray workers, renamed `ray::AgentRank...` → vLLM engine cores),
    so the environment finds them where command lines would not. SLURM_CONF tells this cluster's jobs apart.
    """
    wanted = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURM_CONF={slurm_conf}".encode()}
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = set((proc / "environ").read_bytes().split(b"\0"))
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # exited meanwhile
            continue
        if wanted <= environ:
            found.append(f"{proc.name}: {cmdline[:160]}")
    return found


def _wait_until_gone(job_id: str, slurm_conf: str, wait_s: float = 60.0) -> list[str]:
    """The job's processes still alive after up to `wait_s` (Slurm reaps steps within KillWait)."""
    deadline = time.monotonic() + wait_s
    while (left := _job_processes(job_id, slurm_conf)) and time.monotonic() < deadline:
        time.sleep(1)
    return left


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else f"({path}: none)"


@pytest.fixture(scope="module")
def slurm_env() -> Iterator[dict[str, str]]:
    """A private single-node Slurm cluster; yields the environment (SLURM_CONF, PATH) that reaches it."""
    env = dict(os.environ)
    env["PATH"] = f"{env.get('PATH', '')}:/usr/sbin:/sbin"  # the daemons live in sbin
    missing = [c for c in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol") if not shutil.which(c, path=env["PATH"])]
    if missing:
        _skip_or_fail(f"Slurm/munge not installed (missing {', '.join(missing)})")
    if os.geteuid() != 0:
        _skip_or_fail("the local Slurm cluster needs root (slurmd, munged as the munge user)")
    if not PYTHON.is_file():
        _skip_or_fail(f"no project venv at {PYTHON}")
    state = Path(tempfile.mkdtemp(prefix="hacpo-slurm-", dir="/tmp"))  # short: munge's socket path
    try:
        started = subprocess.run(["bash", str(SLURM_LOCAL), "start", str(state)], env=env, capture_output=True,
                                 text=True, timeout=120)
        assert started.returncode == 0, f"local Slurm did not start:\n{started.stdout}\n{started.stderr}"
        env["SLURM_CONF"] = str(state / "slurm.conf")
        assert started.stdout.strip() == f"export SLURM_CONF={env['SLURM_CONF']}"
        env["HACPO_TEST_SLURM_STATE"] = str(state)
        yield env
    finally:
        subprocess.run(["bash", str(SLURM_LOCAL), "stop", str(state)], env=env, timeout=180)
        shutil.rmtree(state, ignore_errors=True)


def _sbatch(env: dict[str, str], tmp_path: Path, *, wait: bool) -> tuple[subprocess.CompletedProcess, str, Path]:
    """Submit the production script as CI runs it: one CPU node, pair_tiny, 2 tiny steps, outputs in tmp_path.

    Returns sbatch's result, the job id and the job's output file.
    """
    out = tmp_path / "run"
    cfg = load_config("pair_tiny", [f"runtime.output_dir={out}", *TINY_OVERRIDES])
    ranks = sum(agent.parallel.world_size for agent in cfg.agents)  # one Ray CPU per rank; vLLM runs in rank 0
    exports = {"CONFIG": "pair_tiny", "PYTHON": str(PYTHON), "HACPO_OUTPUT_DIR": str(out),
               "RAY_PORT": str(_free_port()), "RAY_NUM_CPUS": str(ranks), "RAY_WAIT_S": "300",
               "RAY_TEMP_DIR": f"{env['HACPO_TEST_SLURM_STATE']}/ray-{tmp_path.name[-12:]}"}
    job_out = tmp_path / "job.out"
    submit = subprocess.run(
        ["sbatch", *(["--wait"] if wait else []), "--parsable", "--nodes=1", "--gpus-per-node=0", "--cpus-per-task=2",
         "--time=00:30:00", f"--output={job_out}", f"--chdir={REPO}",
         "--export=ALL," + ",".join(f"{k}={v}" for k, v in exports.items()), str(SCRIPT), *TINY_OVERRIDES],
        env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    job_id = submit.stdout.split()[0].split(";")[0] if submit.stdout.split() else ""
    return submit, job_id, job_out


def test_sbatch_runs_the_tiny_pair_for_two_steps(slurm_env, tmp_path):
    submit, job_id, job_out = _sbatch(slurm_env, tmp_path, wait=True)
    out = tmp_path / "run"
    report = (f"sbatch rc {submit.returncode}\n{submit.stderr}\n--- job output:\n{_tail(job_out)}\n"
              f"--- driver.log:\n{_tail(out / 'logs' / 'driver.log')}")
    assert job_id.isdigit(), report

    job = _final_job_fields(job_id, slurm_env)
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", f"{job}\n{report}"
    assert submit.returncode == 0, report

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert 2 in [r["step"] for r in records] and max(r["step"] for r in records) == 2
    step2 = next(r for r in records if r["step"] == 2 and "llama_tiny/broker/self_rows" in r)
    for agent in ("llama_tiny", "gpt_tiny"):  # B·G = 4 own and 4 shared rows per agent and step
        assert step2[f"{agent}/broker/self_rows"] == 4 and step2[f"{agent}/broker/cross_rows"] == 4
        assert step2[f"{agent}/sequences_trained_total"] == 16

    # per-node logs: the Ray head's (one node) and the driver's
    node = subprocess.run(["hostname", "-s"], check=True, capture_output=True, text=True).stdout.strip()
    ray_log = out / "logs" / f"ray-{node}.log"
    assert ray_log.is_file() and "Ray runtime started" in ray_log.read_text(), _tail(ray_log)
    assert "driver exited with status 0" in job_out.read_text(), report
    assert "ray stopped on 1 node(s)" in job_out.read_text(), report
    assert "metrics.jsonl" in (out / "logs" / "driver.log").read_text()  # the driver's closing summary

    # clean teardown: nothing the job started (Ray, its workers, vLLM engine cores) is left on the node
    assert _wait_until_gone(job_id, slurm_env["SLURM_CONF"]) == []


def test_scancel_tears_down_ray_and_the_engines(slurm_env, tmp_path):
    """Cancelled while the agents' actors run: the trap stops the driver and Ray within Slurm's KillWait (30 s
    here; the job is SIGKILLed after it, and the trap's last line would be missing); no process of the job is
    left; the driver's stop message, which names the checkpoint to resume from, reaches its log."""
    submit, job_id, job_out = _sbatch(slurm_env, tmp_path, wait=False)
    assert submit.returncode == 0 and job_id.isdigit(), submit.stderr
    conf = slurm_env["SLURM_CONF"]
    deadline = time.monotonic() + 600
    while not any("AgentRank" in p for p in _job_processes(job_id, conf)):  # the driver placed its actors
        assert time.monotonic() < deadline, f"no AgentRank actor within 600 s\n{_tail(job_out)}"
        assert _final_job_fields(job_id, slurm_env, wait_s=0)["JobState"] in ("PENDING", "RUNNING"), _tail(job_out)
        time.sleep(1)
    time.sleep(5)  # let setup start the vLLM engines

    subprocess.run(["scancel", job_id], env=slurm_env, check=True)
    job = _final_job_fields(job_id, slurm_env)
    assert job["JobState"] == "CANCELLED", job
    assert _wait_until_gone(job_id, conf) == []
    text = job_out.read_text()
    assert "[hacpo] cancelled (SIGTERM)" in text and "ray stopped on 1 node(s)" in text, _tail(job_out)
    driver_log = (tmp_path / "run" / "logs" / "driver.log").read_text()
    assert "job stopped: stopped by SIGTERM\nlast complete checkpoint: none" in driver_log, driver_log[-2000:]

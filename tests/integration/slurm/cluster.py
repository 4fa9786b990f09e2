"""Shared pieces of the Slurm tests: a private cluster of 1..N nodes (`scripts/slurm_local.sh`), submitting the
production job script to it, and reading back what Slurm and the job's processes did.

Needs root and Debian's slurm-wlm + munge (`bash scripts/install_ci_deps.sh`); without them a test is skipped,
except under CI=true, where a skip would hide the check: there it fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.distributed import free_port
from tests.helpers.runs import small_kv_cache

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "slurm" / "hacpo_70b_8b.sh"
SLURM_LOCAL = REPO / "scripts" / "slurm_local.sh"
PYTHON = REPO / ".venv" / "bin" / "python"
JOB_TIMEOUT_S = 1500
TINY_OVERRIDES = (  # as in tests/integration/runtime/test_train_loop.py::_config, for steps = 2
    "runtime.steps=2", "runtime.checkpoint_interval=1",
    "runtime.eval_interval=0", "runtime.logging=[jsonl]", "warmstart.enabled=false",
    "algo.batch_size=2", "algo.group_size=2", "algo.updates_per_step=2",
    "agents.0.max_response_length=16", "agents.1.max_response_length=16",
    "agents.0.parallel.micro_batch_size=2", "agents.1.parallel.micro_batch_size=2",
    "data.eval.size=4", "reward.num_workers=0", *small_kv_cache(2),
)
UNFINISHED = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED")
"""Job states `scontrol show job` reports before the job is over."""
NAMESPACE_PREFIX = "hacpo-n"
"""scripts/slurm_local.sh: node k of a multi-node cluster is network namespace hacpo-n<k>, address 10.77.0.<k>."""


def skip_or_fail(reason: str) -> None:
    """Skip locally; fail under CI=true, so that CI cannot pass without running the job."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but the Slurm test cannot run: {reason} (bash scripts/install_ci_deps.sh)")
    pytest.skip(reason)


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else f"({path}: none)"


def _base_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{env.get('PATH', '')}:/usr/sbin:/sbin"  # the daemons live in sbin
    missing = [c for c in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol") if not shutil.which(c, path=env["PATH"])]
    if missing:
        skip_or_fail(f"Slurm/munge not installed (missing {', '.join(missing)})")
    if os.geteuid() != 0:
        skip_or_fail("the local Slurm cluster needs root (slurmd, munged as the munge user, namespaces)")
    if not PYTHON.is_file():
        skip_or_fail(f"no project venv at {PYTHON}")
    return env


@contextlib.contextmanager
def local_cluster(nodes: int) -> Iterator[dict[str, str]]:
    """A private Slurm cluster of `nodes` nodes; yields the environment (SLURM_CONF, PATH) that reaches it."""
    env = _base_env()
    state = Path(tempfile.mkdtemp(prefix="hacpo-slurm-", dir="/tmp"))  # short: munge's socket path
    # a port range of its own per cluster size: the one-node and the 3-node cluster may start side by side (two
    # pytest-xdist workers), and each takes the first free pair from its start
    env["SLURM_LOCAL_PORT"] = str(int(env.get("SLURM_LOCAL_PORT", "16817")) + 100 * (nodes - 1))
    try:
        started = subprocess.run(["bash", str(SLURM_LOCAL), "start", str(state), str(nodes)], env=env,
                                 capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, f"local Slurm did not start:\n{started.stdout}\n{started.stderr}"
        env["SLURM_CONF"] = str(state / "slurm.conf")
        assert started.stdout.strip() == f"export SLURM_CONF={env['SLURM_CONF']}"
        env["HACPO_TEST_SLURM_STATE"] = str(state)
        yield env
    finally:
        subprocess.run(["bash", str(SLURM_LOCAL), "stop", str(state)], env=env, timeout=180)
        shutil.rmtree(state, ignore_errors=True)


@dataclass
class Job:
    submit: subprocess.CompletedProcess
    job_id: str
    output: Path
    run_dir: Path

    def report(self) -> str:
        return (f"sbatch rc {self.submit.returncode}\n{self.submit.stderr}\n--- job output:\n{tail(self.output)}\n"
                f"--- driver.log:\n{tail(self.run_dir / 'logs' / 'driver.log')}")


def sbatch(env: dict[str, str], run_dir: Path, *, nodes: int, ray_cpus: int, overrides: Sequence[str],
           config: str = "pair_tiny_gpt", wait: bool, tag: str, options: Sequence[str] = ()) -> Job:
    """Submit the production script as CI runs it: `nodes` CPU nodes, `config`, outputs in `run_dir`.

    `ray_cpus`: Ray CPUs per node (one per agent rank: with 1, Ray places one rank per node). `tag` keeps the
    job's output file and Ray's temp dirs apart from other submissions of the same test. `options`: more sbatch
    options (`--requeue`). `wait`: return once the job has ended (`wait_for_job`). The time limit's SIGUSR1 comes
    60 s ahead of the 30 minutes (the script asks 900 s ahead: a slow job on a loaded machine would save and stop at
    15 minutes).
    """
    exports = {"CONFIG": config, "PYTHON": str(PYTHON), "HACPO_OUTPUT_DIR": str(run_dir),
               "RAY_PORT": str(free_port()), "RAY_NUM_CPUS": str(ray_cpus), "RAY_WAIT_S": "300",
               "RAY_TEMP_DIR": f"/tmp/rh-{tag}-{os.getpid() % 10000}"}  # short: Ray's socket paths
    job_out = run_dir.parent / f"job-{tag}.out"
    submit = subprocess.run(
        ["sbatch", "--parsable", f"--nodes={nodes}", "--gpus-per-node=0",
         "--cpus-per-task=2", "--time=00:30:00", "--signal=B:USR1@60", *options, f"--output={job_out}",
         f"--chdir={REPO}",
         "--export=ALL," + ",".join(f"{k}={v}" for k, v in exports.items()), str(SCRIPT), *overrides],
        env=env, capture_output=True, text=True, timeout=60)
    job_id = submit.stdout.split()[0].split(";")[0] if submit.stdout.split() else ""
    job = Job(submit, job_id, job_out, run_dir)
    if wait and submit.returncode == 0 and job_id.isdigit():
        wait_for_job(job_id, env)
    return job


def wait_for_job(job_id: str, env: dict[str, str], timeout_s: float = JOB_TIMEOUT_S) -> dict[str, str]:
    """Poll until the job has ended (a final state, COMPLETING over): `sbatch --wait` polls with a back-off of
    up to 10 s, which a suite of ten jobs paid in full; this asks twice a second."""
    deadline = time.monotonic() + timeout_s
    while (fields := final_job_fields(job_id, env, wait_s=0)).get("JobState") in UNFINISHED:
        assert time.monotonic() < deadline, f"job {job_id} still {fields.get('JobState')} after {timeout_s:.0f} s"
        time.sleep(0.5)
    return fields


def final_job_fields(job_id: str, env: dict[str, str], wait_s: float = 120.0) -> dict[str, str]:
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


def process_node(pid: str) -> str:
    """The namespace node (`node<k>`) a process runs on, or "" for the host itself."""
    try:
        link = os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return "?"
    for ns in Path("/run/netns").glob(f"{NAMESPACE_PREFIX}*") if Path("/run/netns").is_dir() else []:
        try:
            if os.stat(ns).st_ino == int(link.split("[")[1].rstrip("]")):
                return "node" + ns.name.removeprefix(NAMESPACE_PREFIX)
        except (OSError, ValueError, IndexError):
            continue
    return ""


def job_processes(job_id: str, slurm_conf: str) -> list[str]:
    """`pid [node]: command line` of every live process of this cluster's job `job_id`.

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
            found.append(f"{proc.name} [{process_node(proc.name) or 'host'}]: {cmdline[:160]}")
    return found


def wait_until_gone(job_id: str, slurm_conf: str, wait_s: float = 60.0) -> list[str]:
    """The job's processes still alive after up to `wait_s` (Slurm reaps steps within KillWait)."""
    deadline = time.monotonic() + wait_s
    while (left := job_processes(job_id, slurm_conf)) and time.monotonic() < deadline:
        time.sleep(1)
    return left


def slurm_logs(env: dict[str, str], lines: int = 25) -> str:
    """The last lines of the cluster's slurmctld and slurmd logs, for a failure's message."""
    state = Path(env.get("HACPO_TEST_SLURM_STATE", "/nonexistent"))
    return "\n".join(f"--- {log.name}:\n{tail(log, lines)}" for log in sorted(state.glob("slurm*.log")))


def metrics_by_step(run_dir: Path) -> dict[int, dict]:
    """Every step's records of metrics.jsonl merged (the step line and the evaluation's)."""
    steps: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(record["step"], {}).update(record)
    return steps


def placements(run_dir: Path) -> dict[tuple[str, int], tuple[str, str, str, str]]:
    """(agent, rank) → (host, address, rendezvous, engine address or ""), from the driver's `placement:` lines
    (of its last run, when the log holds several)."""
    found = {}
    for line in (run_dir / "logs" / "driver.log").read_text(errors="replace").splitlines():
        if "placement: agent " not in line:
            continue
        words = line.split("placement: agent ", 1)[1].replace(",", "").split()
        # <agent> rank <r> on <host> (<address>) rendezvous <host:port> [engine on <address>]
        found[(words[0], int(words[2]))] = (words[4], words[5].strip("()"), words[7],
                                            words[10] if len(words) > 10 else "")
    return found

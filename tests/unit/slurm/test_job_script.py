"""slurm/hacpo_70b_8b.sh with stand-ins for srun/scontrol/squeue/scancel: what it asks Slurm to run.

The real job runs under a single-node Slurm in tests/integration/slurm (on the host). This checks the parts that
need a multi-node allocation or pyxis, which no CI machine has: one Ray step per node, the driver on the head
node, and with a container image every step in the job's one named container with the data mounted; and the
preemption path: SIGUSR1 ahead of the limit reaches the driver, whose early stop (75) requeues a `--requeue` job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "slurm" / "hacpo_70b_8b.sh"

FAKE_SRUN = r"""#!/usr/bin/env python3
import json, os, sys, time
argv = sys.argv[1:]
log_path = os.environ["SRUN_LOG"]
with open(log_path, "a") as log:
    log.write(json.dumps({"argv": argv, "pythonpath": os.environ.get("PYTHONPATH", ""),
                          "nvls": os.environ.get("NCCL_NVLS_ENABLE")}) + "\n")
if any(arg.endswith("slurm/node_address.py") for arg in argv):
    print("10.0.0.1")
if "start" in argv and "--block" in argv:
    # a Ray node: up until the job's teardown; FAKE_RAY_FAIL=node:n makes the node's first n starts fail as a
    # raylet that missed Ray's 30 s to register does
    node = argv[argv.index("-w") + 1]
    tries = f"{log_path}.tries-{node}"
    tried = (int(open(tries).read()) if os.path.exists(tries) else 0) + 1
    open(tries, "w").write(str(tried))
    fail = dict(item.split(":") for item in os.environ.get("FAKE_RAY_FAIL", "").split(",") if item)
    if tried <= int(fail.get(node, 0)):
        output = next(arg.split("=", 1)[1] for arg in argv if arg.startswith("--output="))
        with open(output, "a") as out:
            out.write("Exception: The current node timed out during startup.\n")
        sys.exit(1)
    open(f"{log_path}.up-{node}", "w").close()
    # until the job's teardown stops the Ray steps (scancel --signal=TERM; FAKE_RAY_STUCK=1: a node that ignores
    # it) or kills them (scancel --signal=KILL)
    stops = [f"{log_path}.killed"] + ([] if os.environ.get("FAKE_RAY_STUCK") else [f"{log_path}.stopped"])
    deadline = time.monotonic() + 60
    while not any(os.path.exists(path) for path in stops) and time.monotonic() < deadline:
        time.sleep(0.02)
if "-" in argv:  # the wait for the Ray cluster: until that many nodes are up
    want, deadline = int(argv[argv.index("-") + 2]), time.monotonic() + 30
    while len([n for n in os.listdir(os.path.dirname(log_path)) if ".up-" in n]) < want:
        if time.monotonic() > deadline:
            sys.exit(1)
        time.sleep(0.02)
    print(f"[hacpo] ray cluster ready: {want} node(s)")
if any(arg.endswith("recipes/train.py") for arg in argv) and os.environ.get("FAKE_DRIVER_PID"):
    import signal  # the driver: runs until SIGUSR1, then "saves" and exits 75 as the real one does
    signal.signal(signal.SIGUSR1, lambda *_: sys.exit(75))
    if os.environ.get("FAKE_DRIVER_SLOW_STOP"):  # a driver whose shutdown outlasts the job's stop budget
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(os.environ["FAKE_DRIVER_PID"], "w") as out:
        out.write(str(os.getpid()))
    time.sleep(60)
"""
FAKE_SCONTROL = r"""#!/bin/sh
echo "$*" >> "$SRUN_LOG.scontrol"
case "$1 $2" in
    "show hostnames") printf 'node1\nnode2\n' ;;
    "show job") echo "JobId=4242 JobName=hacpo-70b-8b Requeue=${FAKE_REQUEUE:-0} Restarts=0" ;;
    "show config") printf 'KillTimeout             = 0 sec\nKillWait                = %s sec\n' "${FAKE_KILL_WAIT:-30}" ;;
esac
"""


def _job_env(tmp_path: Path, output_dir: bool = True, **env: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    # the job's Ray steps, and scancel --signal=TERM stopping them at teardown
    # the job's Ray steps (--steps), or its end time (-o %e: FAKE_END, default a time in local time, as Slurm
    # prints it)
    (bin_dir / "squeue").write_text('#!/bin/sh\ncase "$*" in *%e*) echo "${FAKE_END-2099-07-01T18:00:00}" ;;\n'
                                    "*) echo '4242.1 hacpo-ray' ;; esac\n")
    (bin_dir / "scancel").write_text('#!/bin/sh\necho "$*" >> "$SRUN_LOG.scancel"\n'
                                     '[ "$1" = --signal=TERM ] && touch "$SRUN_LOG.stopped"\n'
                                     '[ "$1" = --signal=KILL ] && touch "$SRUN_LOG.killed"\nexit 0\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    log = tmp_path / "srun.jsonl"
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "SRUN_LOG": str(log),
            "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_GPUS_ON_NODE": "8",
            "SLURM_CPUS_PER_TASK": "16", "SLURM_SUBMIT_DIR": str(REPO),
            **({"HACPO_OUTPUT_DIR": str(tmp_path / "out")} if output_dir else {}), **env}


def _run_job(tmp_path: Path, output_dir: bool = True, **env: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    full_env = _job_env(tmp_path, output_dir, **env)
    log = Path(full_env["SRUN_LOG"])
    done = subprocess.run(["bash", str(SCRIPT), "runtime.steps=2"], env=full_env, capture_output=True, text=True,
                          timeout=60)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    return done, calls


def test_one_ray_step_per_node_and_the_driver_on_the_head(tmp_path):
    done, calls = _run_job(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    starts = [c for c in calls if "start" in c["argv"] and "--block" in c["argv"]]
    assert [c["argv"][c["argv"].index("-w") + 1] for c in starts] == ["node1", "node2"]
    assert "--head" in starts[0]["argv"] and "--address=10.0.0.1:6379" in starts[1]["argv"]
    assert all("--num-gpus=8" in c["argv"] and "--num-cpus=16" in c["argv"] for c in starts)
    driver = next(c for c in calls if any(a.endswith("recipes/train.py") for a in c["argv"]))
    assert driver["argv"][driver["argv"].index("-w") + 1] == "node1"
    assert "runtime.cluster.ray_address=10.0.0.1:6379" in driver["argv"] and "runtime.steps=2" in driver["argv"]
    assert "runtime.cluster.num_nodes=2" in driver["argv"]
    assert not any(a.startswith("--container") for c in calls for a in c["argv"])  # on the host without an image


def test_the_driver_gets_the_jobs_end_time_and_nvlink_sharp_off(tmp_path):
    """Issue #38, items 12 and 13: inside the container the driver cannot ask Slurm for the job's end time (no
    squeue there), so the script asks on the host and passes it as runtime.stop_by, its time zone written out; and
    every step runs with NVLink SHARP's buffers off (NCCL_NVLS_ENABLE=0), as the plan assumes."""
    done, calls = _run_job(tmp_path, TZ="UTC", CONTAINER_IMAGE="/images/hacpo.sqsh")
    assert done.returncode == 0, done.stdout + done.stderr
    driver = next(c for c in calls if any(a.endswith("recipes/train.py") for a in c["argv"]))
    assert "runtime.stop_by=2099-07-01T18:00:00+00:00" in driver["argv"]
    assert "[hacpo] the job ends at 2099-07-01T18:00:00+00:00" in done.stdout
    assert {c["nvls"] for c in calls} == {"0"}
    # a stop_by given to sbatch wins; no time limit (squeue: N/A), no stop_by; NCCL_NVLS_ENABLE=1 is kept
    for case, env, extra, want in (("given", {}, ["runtime.stop_by=2099-01-01T00:00"], ["runtime.stop_by=2099-01-01T00:00"]),
                                   ("unlimited", {"FAKE_END": "N/A"}, [], []),
                                   ("nvls", {"NCCL_NVLS_ENABLE": "1"}, [], None)):
        full_env = _job_env(tmp_path / case, **env)
        done = subprocess.run(["bash", str(SCRIPT), "runtime.steps=2", *extra], env=full_env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        calls = [json.loads(line) for line in Path(full_env["SRUN_LOG"]).read_text().splitlines()]
        driver = next(c for c in calls if any(a.endswith("recipes/train.py") for a in c["argv"]))
        if want is not None:
            assert [a for a in driver["argv"] if a.startswith("runtime.stop_by=")] == want, case
        else:
            assert {c["nvls"] for c in calls} == {"1"}
    assert "no end time from squeue (N/A)" in subprocess.run(
        ["bash", str(SCRIPT)], env=_job_env(tmp_path / "again", FAKE_END="N/A"), capture_output=True, text=True,
        timeout=60).stdout


def test_with_an_image_every_step_shares_the_jobs_container_and_sees_the_data(tmp_path):
    ckpt = tmp_path / "ckpt" / "Llama-3.3-70B-Instruct"
    ckpt.mkdir(parents=True)
    data = tmp_path / "data"
    data.mkdir()
    done, calls = _run_job(tmp_path, CONTAINER_IMAGE="/images/hacpo.sqsh", HACPO_LLAMA70B_PATH=str(ckpt),
                           HACPO_TRAIN_DATA=str(data / "math_train.jsonl"), CONTAINER_MOUNTS="/scratch:/scratch:ro")
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(calls) >= 5  # the head's address, 2 Ray starts, 2 waits, the driver
    for call in calls:
        argv = call["argv"]
        # one named container for the whole job: the driver and the raylet of a node share its /tmp sockets
        assert "--container-image=/images/hacpo.sqsh" in argv and "--container-name=hacpo-4242" in argv
        mounts = next(a for a in argv if a.startswith("--container-mounts=")).split("=", 1)[1].split(",")
        assert f"{REPO}:{REPO}" in mounts and f"{tmp_path / 'out'}:{tmp_path / 'out'}" in mounts
        assert f"{ckpt}:{ckpt}" in mounts and f"{data}:{data}" in mounts and "/scratch:/scratch:ro" in mounts
        assert call["pythonpath"].split(":")[0] == str(REPO)  # the checkout's package, not the image's copy


def test_the_head_address_comes_from_node_address_py_on_the_head_or_from_hacpo_head_ip(tmp_path):
    done, calls = _run_job(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    probe = calls[0]["argv"]
    assert probe[probe.index("-w") + 1] == "node1" and probe[-1] == str(REPO / "slurm" / "node_address.py")
    assert "head node1 (10.0.0.1)" in done.stdout

    done, calls = _run_job(tmp_path / "given", HACPO_HEAD_IP="10.1.2.3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not any(c["argv"][-1].endswith("node_address.py") for c in calls)
    driver = next(c for c in calls if any(a.endswith("recipes/train.py") for a in c["argv"]))
    assert "runtime.cluster.ray_address=10.1.2.3:6379" in driver["argv"]


def test_a_resubmitted_job_writes_to_the_same_output_dir_and_so_resumes(tmp_path):
    """The default output dir names the config, not the job id: a second job of the same config continues."""
    checkout = tmp_path / "checkout"  # the submit dir: the default output dir lies under it
    dirs = []
    for job in ("4242", "4243"):
        done, calls = _run_job(tmp_path / job, output_dir=False, SLURM_JOB_ID=job, CONFIG="pair_tiny_gpt",
                               SLURM_SUBMIT_DIR=str(checkout))
        assert done.returncode == 0, done.stdout + done.stderr
        driver = next(c for c in calls if any(a.endswith("recipes/train.py") for a in c["argv"]))
        dirs += [a.split("=", 1)[1] for a in driver["argv"] if a.startswith("runtime.output_dir=")]
    assert dirs == [str(checkout / "outputs" / "pair_tiny_gpt")] * 2


def test_the_job_asks_for_sigusr1_ahead_of_its_limit_and_keeps_its_output_when_requeued():
    lines = SCRIPT.read_text().splitlines()
    assert "#SBATCH --signal=B:USR1@900" in lines  # the batch shell only: Ray's processes would die of it
    assert "#SBATCH --open-mode=append" in lines  # a requeued run appends to the job's output file


def _signalled_job(tmp_path: Path, signum: int, **env: str) -> tuple[int, str, dict[str, str], int]:
    """Run the job script until its (fake) driver runs, send the script `signum` as Slurm does, let it end; the
    exit status, the output, the environment and the driver's pid."""
    pid_file = tmp_path / "driver.pid"
    env = _job_env(tmp_path, FAKE_DRIVER_PID=str(pid_file), **env)
    output = tmp_path / "job.out"  # a file, not a pipe: a driver that outlives the script would hold a pipe open
    with output.open("w") as out:
        job = subprocess.Popen(["bash", str(SCRIPT)], env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not pid_file.is_file() or not pid_file.read_text():
        assert job.poll() is None and time.monotonic() < deadline, output.read_text()
        time.sleep(0.05)
    job.send_signal(signum)
    job.wait(timeout=120)
    return job.returncode, output.read_text(), env, int(pid_file.read_text())


def _preempted_job(tmp_path: Path, requeue: str) -> tuple[int, str, list[str]]:
    """SIGUSR1 as Slurm sends it ahead of the limit: the exit status, the output, the scontrol calls."""
    rc, out, env, _ = _signalled_job(tmp_path, signal.SIGUSR1, FAKE_REQUEUE=requeue)
    return rc, out, Path(env["SRUN_LOG"] + ".scontrol").read_text().splitlines()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_cancelled_job_reports_ray_stopped_first_and_does_not_wait_past_its_budget_for_the_driver(tmp_path):
    """scancel (SIGTERM) with a driver whose shutdown outlasts the budget: the Ray steps are stopped through Slurm
    and reported first, and the script ends while the driver still runs (Slurm's SIGKILL at KillWait ends it),
    so the lines that report the stop are written before KillWait, by construction rather than by speed."""
    rc, out, env, driver = _signalled_job(tmp_path, signal.SIGTERM, FAKE_DRIVER_SLOW_STOP="1", FAKE_KILL_WAIT="12")
    try:
        still_running = _alive(driver)
    finally:
        if _alive(driver):
            os.kill(driver, signal.SIGKILL)
    assert rc == 143, out
    assert still_running, out  # the script did not wait for the driver's end
    lines = out.splitlines()
    cancelled = lines.index("[hacpo] cancelled (SIGTERM)")
    ray = next(i for i, line in enumerate(lines) if line.startswith("[hacpo] ray stopped on 2 node(s)"))
    driver_line = next(i for i, line in enumerate(lines) if line.startswith("[hacpo] the driver still stops after"))
    assert cancelled < ray < driver_line, out
    assert "Slurm's SIGKILL ends it at KillWait (12 s after SIGTERM)" in lines[driver_line]
    assert Path(env["SRUN_LOG"] + ".scancel").read_text().splitlines()[0] == "--signal=TERM 4242.1"


def test_a_cancelled_jobs_ray_that_ignores_sigterm_is_killed_within_the_budget(tmp_path):
    """A Ray node that does not stop on SIGTERM: at half the budget the script SIGKILLs its step through Slurm and
    still reports Ray stopped, naming the SIGKILL; the driver (which does stop) is waited for."""
    rc, out, env, driver = _signalled_job(tmp_path, signal.SIGTERM, FAKE_RAY_STUCK="1", FAKE_KILL_WAIT="8")
    assert rc == 143, out
    assert not _alive(driver)
    scancel = Path(env["SRUN_LOG"] + ".scancel").read_text().splitlines()
    assert scancel == ["--signal=TERM 4242.1", "--signal=KILL 4242.1"], scancel
    ray = next(line for line in out.splitlines() if line.startswith("[hacpo] ray stopped on 2 node(s)"))
    assert "(SIGKILLed " in ray and " s after SIGTERM)" in ray, ray
    assert "the driver still stops" not in out, out


def test_sigusr1_reaches_the_driver_and_its_early_stop_requeues_a_requeue_job(tmp_path):
    rc, out, scontrol = _preempted_job(tmp_path / "requeue", requeue="1")
    assert rc == 75, out
    assert "SIGUSR1: asking the driver to save a checkpoint" in out and "driver exited with status 75" in out
    assert "requeueing job 4242" in out and scontrol[-1] == "requeue 4242", (out, scontrol)

    rc, out, scontrol = _preempted_job(tmp_path / "plain", requeue="0")  # submitted without --requeue
    assert rc == 75 and "resubmit the same command to continue" in out, out
    assert not any(call.startswith("requeue") for call in scontrol)


def test_a_node_whose_ray_start_dies_while_starting_is_started_again(tmp_path):
    """The head's first start and node2's first two fail (a raylet that missed Ray's 30 s to register): each is
    started again, what it left running killed first, and the job runs; a node failing RAY_START_TRIES times
    stops the job before the driver, naming the node and its log."""
    done, calls = _run_job(tmp_path, FAKE_RAY_FAIL="node1:1,node2:2")
    assert done.returncode == 0, done.stdout + done.stderr
    starts = [c["argv"][c["argv"].index("-w") + 1] for c in calls if "start" in c["argv"] and "--block" in c["argv"]]
    assert starts == ["node1", "node1", "node2", "node2", "node2"]
    kills = [c["argv"][c["argv"].index("-w") + 1:] for c in calls if "pkill" in c["argv"]]
    assert kills == [["node1", "pkill", "-KILL", "-f", "--", "/tmp/ray-hacpo-4242/[s]ession_"]] + \
        [["node2", "pkill", "-KILL", "-f", "--", "/tmp/ray-hacpo-4242-node2/[s]ession_"]] * 2
    assert "[hacpo] ray on node1 exited while starting (try 1 of 3): Exception: The current node timed out" \
        in done.stdout
    assert "ray on node2 exited while starting (try 2 of 3)" in done.stdout
    assert any(any(a.endswith("recipes/train.py") for a in c["argv"]) for c in calls)

    done, calls = _run_job(tmp_path / "fails", FAKE_RAY_FAIL="node1:1,node2:2", RAY_START_TRIES="2")
    assert done.returncode != 0
    assert f"[hacpo] ray did not start on node2: see {tmp_path / 'fails' / 'out' / 'logs' / 'ray-node2.log'}" \
        in done.stdout
    assert not any(any(a.endswith("recipes/train.py") for a in c["argv"]) for c in calls)

"""Finding the /dev/shm files an engine's processes map, and unlinking only those nobody can still be using.

The files here are plain files in /dev/shm named like vLLM's (`vllm_…`), created and mapped by this test itself
or by a child process it starts, so the rules are checked without starting vLLM."""

from __future__ import annotations

import json
import mmap
import os
import secrets
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from nemo_hacpo.rollout.engine_processes import (
    SHM_DIR,
    engine_pids,
    engine_shm_files,
    mapped_shm_files,
    record_engine,
    sweep_recorded,
    unlink_orphans,
    wait_gone,
)

pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir() or not Path("/proc/self/maps").exists(),
                                reason="needs Linux /dev/shm and /proc")

MAPPER = """
import mmap, sys, time
with open(sys.argv[1], "r+b") as f:
    m = mmap.mmap(f.fileno(), 4096)
print("mapped", flush=True)
time.sleep(60)
"""

SEMAPHORE_HOLDER = """
import multiprocessing, time
from multiprocessing import resource_tracker
lock = multiprocessing.get_context("spawn").Lock()  # a named semaphore, as vLLM's processes hold one
resource_tracker.unregister(lock._semlock.name, "semaphore")  # as when Ray kills the tracker with its actor
print(lock._semlock.name, flush=True)
time.sleep(60)
"""


@pytest.fixture
def shm_file():
    path = SHM_DIR / f"vllm_test_{os.getpid()}_{secrets.token_hex(4)}"
    path.write_bytes(b"\0" * 4096)
    yield path
    path.unlink(missing_ok=True)


def _mapper(path: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", MAPPER, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "mapped"
    return proc


def test_the_files_a_process_maps_are_found_by_name_and_unlinked_ones_are_not(shm_file):
    with open(shm_file, "r+b") as f, mmap.mmap(f.fileno(), 4096):
        assert shm_file.name in mapped_shm_files([os.getpid()])
        assert shm_file.name in engine_shm_files([os.getpid()])
        shm_file.unlink()
        assert shm_file.name not in mapped_shm_files([os.getpid()])  # "(deleted)": no longer a file in /dev/shm


def test_a_semaphore_is_found_by_its_name_although_glibc_maps_it_under_another():
    """glibc's sem_open maps a new semaphore as `/dev/shm/sem.XXXXXX`, links it to `sem.mp-…` and unlinks the
    temporary name, so the holder's maps say `sem.XXXXXX (deleted)`: matched by inode, the semaphore is the
    engine's (and recorded, and swept once its holder is killed), and while its holder lives it is left alone."""
    proc = subprocess.Popen([sys.executable, "-c", SEMAPHORE_HOLDER], stdout=subprocess.PIPE, text=True)
    name = "sem." + proc.stdout.readline().strip().lstrip("/")
    try:
        assert name.startswith("sem.mp-") and (SHM_DIR / name).exists()
        assert name not in Path(f"/proc/{proc.pid}/maps").read_text()  # mapped under its temporary name
        assert name in engine_shm_files([proc.pid])
        assert unlink_orphans({name}, [], forget=False) == []  # a live process holds it
        assert (SHM_DIR / name).exists()
        proc.kill()
        proc.wait()
        assert unlink_orphans({name}, [proc.pid], forget=False) == [name]
        assert not (SHM_DIR / name).exists()
    finally:
        proc.kill()
        proc.wait()
        (SHM_DIR / name).unlink(missing_ok=True)


def test_only_vllm_named_files_count_as_the_engines():
    path = SHM_DIR / f"nemo_hacpo_refit_test_{os.getpid()}_{secrets.token_hex(4)}"  # a trainer's staging buffer
    path.write_bytes(b"\0" * 4096)
    try:
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 4096):
            assert path.name in mapped_shm_files([os.getpid()])
            assert path.name not in engine_shm_files([os.getpid()])
    finally:
        path.unlink(missing_ok=True)


def test_a_file_left_by_exited_engine_processes_is_unlinked(shm_file):
    proc = _mapper(shm_file)
    recorded = engine_shm_files([proc.pid])
    assert shm_file.name in recorded
    proc.kill()
    proc.wait()
    assert wait_gone([proc.pid], timeout=5) == []
    assert unlink_orphans(recorded, [proc.pid]) == [shm_file.name]
    assert not shm_file.exists()


def test_nothing_is_unlinked_while_an_engine_process_lives(shm_file):
    proc = _mapper(shm_file)
    try:
        assert unlink_orphans({shm_file.name}, [proc.pid]) == []
        assert shm_file.exists()
    finally:
        proc.kill()
        proc.wait()


def test_a_file_another_live_process_maps_is_left_alone(shm_file):
    other = _mapper(shm_file)  # not one of the engine's processes, but it still uses the file
    try:
        assert unlink_orphans({shm_file.name}, []) == []
        assert shm_file.exists()
    finally:
        other.kill()
        other.wait()


def test_files_already_gone_and_engines_without_processes_are_fine():
    assert unlink_orphans({f"vllm_missing_{secrets.token_hex(4)}"}, []) == []
    assert engine_pids(object()) == []


def test_the_sweep_takes_only_records_of_this_host_boot_and_pid_namespace(shm_file, tmp_path):
    """A record of an engine whose processes are gone is swept; the same record written from another pid namespace
    (a container sharing /dev/shm: from here its engine's processes look gone while they run) or of another boot is
    left, and a record that is not an engine's (another program's JSON, a list) is skipped without failing."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # a pid that is gone
    records = tmp_path / "records"
    record_engine(records / "gone.json", [proc.pid], [shm_file.name])
    mine = json.loads((records / "gone.json").read_text())
    assert set(mine) == {"host", "boot_id", "pid_ns", "pids", "shm"} and mine["pid_ns"].startswith("pid:[")
    (records / "other_ns.json").write_text(json.dumps({**mine, "pid_ns": "pid:[1]"}))
    (records / "other_boot.json").write_text(json.dumps({**mine, "boot_id": "another-boot"}))
    (records / "list.json").write_text("[1, 2]")
    (records / "gone.json").rename(records / "z_gone.json")  # swept last: the others are read first

    assert sweep_recorded(records) == [shm_file.name]
    assert not shm_file.exists()
    assert sorted(p.name for p in records.iterdir()) == ["list.json", "other_boot.json", "other_ns.json"]


def test_the_sweep_waits_for_engine_processes_that_are_still_exiting(shm_file, tmp_path):
    """An engine whose rank actor was just killed exits a moment later: without a wait its record is left as still
    running (and its files stay until a later run); with `wait_s` the sweep waits for it, then unlinks them."""
    # runs until its stdin closes: alive for the first sweep whatever the machine's speed, gone during the second
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    records = tmp_path / "records"
    try:
        record_engine(records / "exiting.json", [proc.pid], [shm_file.name])
        assert sweep_recorded(records) == [] and shm_file.exists()  # still running: left
        threading.Timer(0.5, proc.stdin.close).start()  # it exits after the second sweep has begun waiting
        assert sweep_recorded(records, wait_s=120.0) == [shm_file.name]
        assert not shm_file.exists() and list(records.iterdir()) == []
    finally:
        proc.kill()
        proc.wait()


def test_the_sweep_removes_a_killed_engines_scratch_directory_once_its_owner_is_gone_too(tmp_path):
    """The engine's scratch directory (generation config, tokenizer view) belongs to the process that started it:
    a killed rank never removes it. The sweep does, once the engine and its owner are gone — not while the owner
    lives (it removes it itself), and never a directory that is not an engine's scratch."""
    import tempfile

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    records = tmp_path / "records"
    scratch = {name: Path(tempfile.mkdtemp(prefix=f"nemo_hacpo_{name}_engine_")) for name in ("killed", "living")}
    other = tmp_path / "nemo_hacpo_x_engine_y"  # the right name in the wrong place
    other.mkdir()
    try:
        for directory in (*scratch.values(), other):
            (directory / "generation_config.json").write_text("{}")
        record_engine(records / "living.json", [gone.pid], [], scratch=scratch["living"])  # owner: this process
        for name, directory in (("killed", scratch["killed"]), ("other", other)):
            record_engine(records / f"{name}.json", [gone.pid], [], scratch=directory)
            (records / f"{name}.json").write_text(json.dumps(
                {**json.loads((records / f"{name}.json").read_text()), "owner": gone.pid}))

        assert sweep_recorded(records) == []  # no shared memory recorded: only directories
        assert not scratch["killed"].exists()
        assert scratch["living"].exists() and other.exists()
        assert sorted(p.name for p in records.iterdir()) == ["living.json"]  # kept until its owner is gone
        shutil.rmtree(scratch["living"])  # what the living owner's shutdown does
        sweep_recorded(records)
        assert list(records.iterdir()) == []
    finally:
        for directory in scratch.values():
            shutil.rmtree(directory, ignore_errors=True)


def test_the_sweep_run_by_path_as_the_slurm_job_does_names_the_node_and_what_it_unlinked(shm_file, tmp_path):
    """`slurm/hacpo_70b_8b.sh` runs the module by path on every node at the job's end: standard library only (no
    package import), one line where it unlinked something, none where there was nothing to do."""
    import socket

    import nemo_hacpo.rollout.engine_processes as module

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    records = tmp_path / "engines" / ".shm"
    record_engine(records / "killed.json", [gone.pid], [shm_file.name])
    command = [sys.executable, "-I", module.__file__, str(records), "--wait-s", "0"]  # -I: not even the repo on path
    first = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert first.stdout == (f"[hacpo] {socket.gethostname()}: unlinked 1 shared-memory file(s) that killed engines "
                            f"left in /dev/shm: {shm_file.name}\n")
    assert not shm_file.exists() and list(records.iterdir()) == []
    again = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout == ""

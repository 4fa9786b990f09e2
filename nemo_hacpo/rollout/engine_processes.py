"""The processes a vLLM engine runs and the /dev/shm files they create, so shutting it down leaves none behind.

vLLM's V1 engine (`LLM`) runs an EngineCore process, which runs one Worker process per TP rank
(`MultiprocExecutor`), also at TP=1. They talk through shared memory: the executor's broadcast `MessageQueue`
(`/dev/shm/psm_*`, 16 MiB × 10 chunks, created by the EngineCore), each worker's response queue (`psm_*`,
24 MiB × 10, created by the worker), a multiprocessing lock (`sem.mp-*`) and, at TP ≥ 2 on CPU, the
communicator's `vllm_dist_*-cpushm_*` buffers. Each is unlinked by the process that created it, during its own
teardown (`ShmRingBuffer.__del__`, `SemLock` finalizers); a process killed before that leaves the file in
/dev/shm until the parent's multiprocessing resource tracker exits (or for good, if the tracker is killed too).

`RolloutEngine.shutdown` therefore lets the EngineCore exit by itself if it does so within vLLM's grace, and then
`unlink_orphans` removes the files that were mapped by the engine's own processes — recorded from
`/proc/<pid>/maps` while they ran — once those processes are gone and no live process maps the file.

An engine that never gets to its shutdown — its rank actor `ray.kill`ed after a failure or a hung call, a SIGKILL,
a node's processes killed — leaves them all (160–240 MiB apparent each, ~32 MiB touched; 137 had piled up on one
machine, issue #41). So an engine started with a `record` writes its processes and their files there
(`record_engine`: host, boot, pids, names), and `sweep_recorded` — the driver's, when a run closes (its actors gone
or killed) and when one starts (what a killed driver left), and each rank's before its engine starts (what a killed
node left: the driver judges only its own node's processes) — unlinks the recorded files of this host once every
recorded process is gone and no live process maps them, exactly `unlink_orphans`. Only what this project's engines
recorded is ever touched: `psm_` and `sem.mp-` are Python's own names, which other programs use too.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
ENGINE_SHM_PREFIXES = ("psm_", "vllm_", "sem.mp-")
"""Names vLLM's processes give their own shared memory: `multiprocessing.shared_memory` segments (the message
queues), vLLM's CPU communicator buffers, multiprocessing's named semaphores. Other files an engine maps (the
trainer's staging buffers, `nemo_hacpo_refit_*`) belong to other processes and are never touched."""


def engine_pids(llm: Any) -> list[int]:
    """The pids of `llm`'s EngineCore process(es) and all their descendants (the workers); [] for an in-process
    engine or one whose processes are gone."""
    import psutil

    manager = getattr(getattr(getattr(getattr(llm, "llm_engine", None), "engine_core", None), "resources", None),
                      "engine_manager", None)
    pids: list[int] = []
    for proc in getattr(manager, "processes", None) or []:
        if proc.pid is None:
            continue
        try:
            core = psutil.Process(proc.pid)
            pids.append(core.pid)
            pids.extend(child.pid for child in core.children(recursive=True))
        except psutil.Error:
            continue
    return pids


def mapped_shm_files(pids: Iterable[int]) -> set[str]:
    """Names of the files in /dev/shm that the processes `pids` map (read from /proc/<pid>/maps; processes that are
    gone or unreadable are skipped).

    A mapping is matched to a name by its inode, not by the path the maps show: glibc's `sem_open` creates a
    semaphore under a temporary name (`sem.XXXXXX`), maps it and then links it to its real name (`sem.mp-…`) and
    unlinks the temporary one, so a process holding multiprocessing's lock shows `/dev/shm/sem.XXXXXX (deleted)`
    for the file that /dev/shm lists as `sem.mp-…`. A file truly unlinked has no name left, and its inode cannot be
    reused while it is mapped."""
    names_by_inode: dict[int, set[str]] = {}
    try:
        entries = list(os.scandir(SHM_DIR))
    except OSError:
        return set()
    for entry in entries:
        try:
            names_by_inode.setdefault(entry.inode(), set()).add(entry.name)
        except OSError:
            continue
    names: set[str] = set()
    prefix = f"{SHM_DIR}/"
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(prefix) and fields[4].isdigit():
                names |= names_by_inode.get(int(fields[4]), set())
    return names


def engine_shm_files(pids: Iterable[int]) -> set[str]:
    """The vLLM-named files in /dev/shm (`ENGINE_SHM_PREFIXES`) mapped by the engine processes `pids`."""
    return {name for name in mapped_shm_files(pids) if name.startswith(ENGINE_SHM_PREFIXES)}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def start_watchdog(pids: Iterable[int]) -> subprocess.Popen | None:
    """A process that SIGKILLs the engine processes `pids` if this process dies without shutting them down
    (`engine_watchdog`); None when there is nothing to watch (an in-process engine, processes already gone)."""
    from nemo_hacpo.rollout.engine_watchdog import start_time

    watched = [f"{pid}:{start}" for pid in pids if (start := start_time(pid)) is not None]
    own = start_time(os.getpid())
    if not watched or own is None:
        return None
    script = Path(__file__).with_name("engine_watchdog.py")
    # SIGUSR1 blocked while it starts (the mask passes through exec): one that Slurm forwards before the watchdog
    # ignores it waits instead of killing it, as for the reward workers
    import signal

    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        return subprocess.Popen([sys.executable, str(script), f"{os.getpid()}:{own}", *watched],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def stop_watchdog(watchdog: subprocess.Popen | None) -> None:
    """Stop a watchdog (the engine was shut down, or is being: its processes are not to be killed by it)."""
    if watchdog is not None and watchdog.poll() is None:
        watchdog.kill()
    if watchdog is not None:
        watchdog.wait(timeout=10)


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait up to `timeout` s for the processes `pids` to exit; the ones still alive (zombies count as gone)."""
    pending = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        pending = [pid for pid in pending if _alive(pid)]
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(0.05)


def _all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def unlink_orphans(names: Iterable[str], engine_pids: Iterable[int], forget: bool = True) -> list[str]:
    """Unlink those of `names` (files in /dev/shm the engine's processes mapped) still present once the engine's
    processes `engine_pids` have all exited and no live process maps them; the names unlinked. Nothing is
    unlinked while any of the engine's processes is still alive. `forget`: also tell this process's resource
    tracker (only where the engine was this process's own: its processes registered the files with it)."""
    present = {name for name in names if (SHM_DIR / name).exists()}
    if not present:
        return []
    still = [pid for pid in engine_pids if _alive(pid)]
    if still:
        logger.warning("engine processes %s still alive; leaving %d shared-memory file(s) in %s: %s", still,
                       len(present), SHM_DIR, sorted(present))
        return []
    orphans = sorted(present - mapped_shm_files(_all_pids()))
    removed = []
    for name in orphans:
        try:
            (SHM_DIR / name).unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            logger.warning("could not unlink %s: %s", SHM_DIR / name, exc)
            continue
        removed.append(name)
        if forget:
            _forget(name)
    return removed


def _forget(name: str) -> None:
    """Tell this process's multiprocessing resource tracker — which vLLM's spawned processes share, and with
    which they registered their segments and semaphores — that `name` is gone, so it does not try (and warn)
    again at exit."""
    from multiprocessing import resource_tracker

    if name.startswith("psm_"):
        resource_tracker.unregister(f"/{name}", "shared_memory")
    elif name.startswith("sem.mp-"):
        resource_tracker.unregister(f"/{name[len('sem.'):]}", "semaphore")


def record_engine(path: Path, pids: Iterable[int], names: Iterable[str], scratch: str | Path | None = None) -> None:
    """Write what a started engine's processes are and which /dev/shm files they map (atomic, JSON). `scratch`:
    the engine's scratch directory (generation config, tokenizer view), which its owner — this process — removes
    when it shuts the engine down or is collected; the sweep removes it once this process is gone too."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    record: dict[str, object] = {**_this_host(), "pids": sorted(pids), "shm": sorted(names)}
    if scratch is not None:
        record |= {"scratch": str(scratch), "owner": os.getpid()}
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def _is_engine_scratch(path: Path) -> bool:
    """Only what `RolloutEngine` creates is ever removed: `nemo_hacpo_<agent>_engine_*` in the temporary directory."""
    import tempfile

    return (path.parent == Path(tempfile.gettempdir()) and path.name.startswith("nemo_hacpo_")
            and "_engine_" in path.name)


def _this_host() -> dict[str, str]:
    """Host name, boot id and pid namespace (as `runtime.run_lock.host_identity`, a layer above): a recorded pid
    means the same process only when all three match — containers on one machine share its boot id and may share a
    host name, and from another pid namespace every recorded engine would look gone while it runs."""
    def read(path: str, link: bool = False) -> str:
        try:
            return os.readlink(path) if link else Path(path).read_text().strip()
        except OSError:
            return ""

    return {"host": socket.gethostname(), "boot_id": read("/proc/sys/kernel/random/boot_id"),
            "pid_ns": read("/proc/self/ns/pid", link=True)}


def sweep_recorded(directory: Path, wait_s: float = 0.0) -> list[str]:
    """Unlink the /dev/shm files of the engines recorded in `directory` (`record_engine`) whose processes are all
    gone — what a killed engine left — and drop their records; records of another host, boot or pid namespace,
    unreadable ones, and those of engines still running are left. `wait_s`: how long, in all, to wait for recorded
    processes to exit (an engine whose rank actor was just killed dies a moment later). A recorded scratch directory
    goes too once its owner has exited as well. Returns the names unlinked."""
    removed: list[str] = []
    here = _this_host()
    deadline = time.monotonic() + wait_s
    for record_path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            record = json.loads(record_path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or any(record.get(key) != value for key, value in here.items()):
            continue  # another node's (or container's) engine: its files are not this one's to judge
        pids, names = record.get("pids", []), record.get("shm", [])
        if wait_gone(pids, max(deadline - time.monotonic(), 0.0)):
            continue  # still running
        removed += unlink_orphans(names, pids, forget=False)  # another process's engine: not our tracker's
        scratch = Path(record["scratch"]) if isinstance(record.get("scratch"), str) else None
        if scratch is not None and not _is_engine_scratch(scratch):
            scratch = None  # never another directory, whatever a record says
        owner = record.get("owner")
        if scratch is not None and isinstance(owner, int) and not _alive(owner):
            shutil.rmtree(scratch, ignore_errors=True)  # its owner (a killed rank) never got to remove it
        if not any((SHM_DIR / name).exists() for name in names) and not (scratch is not None and scratch.exists()):
            record_path.unlink(missing_ok=True)
    if removed:
        logger.warning("unlinked %d shared-memory file(s) that killed engines left in %s: %s", len(removed), SHM_DIR,
                       removed)
    return removed


def main(argv: list[str] | None = None) -> int:
    """`python nemo_hacpo/rollout/engine_processes.py <output_dir>/engines/.shm`: the sweep, as the Slurm job runs it
    on each of its nodes at its end (run by path: standard library only, so it starts in a fraction of a second,
    inside the container where the engines ran). Prints one line per node where it unlinked something."""
    import argparse

    parser = argparse.ArgumentParser(description="Unlink the /dev/shm files that killed engines recorded in a run's "
                                                 "engines/.shm directory left on this node.")
    parser.add_argument("records", type=Path, help="<output_dir>/engines/.shm")
    parser.add_argument("--wait-s", type=float, default=5.0,
                        help="how long to wait, in all, for recorded engine processes to exit (default 5)")
    args = parser.parse_args(argv)
    removed = sweep_recorded(args.records, wait_s=args.wait_s)
    if removed:
        print(f"[hacpo] {socket.gethostname()}: unlinked {len(removed)} shared-memory file(s) that killed engines "
              f"left in {SHM_DIR}: {' '.join(removed)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

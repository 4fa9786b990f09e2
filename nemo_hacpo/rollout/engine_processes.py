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
machine, issue #41). `sweep_orphans` finds them afterwards without knowing the engine: this user's vLLM-named files,
older than `ORPHAN_MIN_AGE_S` (one an engine is creating right now is not yet mapped), that no live process maps.
The driver sweeps its node when a run closes (its actors gone or killed) and when one starts (what a killed driver
left).
"""

from __future__ import annotations

import logging
import os
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
    """Names of the files in /dev/shm that the processes `pids` map (read from /proc/<pid>/maps; files already
    unlinked — `(deleted)` — and processes that are gone or unreadable are skipped)."""
    names: set[str] = set()
    prefix = f"{SHM_DIR}/"
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(maxsplit=5)
            path = fields[5].strip() if len(fields) == 6 else ""
            if path.startswith(prefix) and not path.endswith("(deleted)") and "/" not in path[len(prefix):]:
                names.add(path[len(prefix):])
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


def unlink_orphans(names: Iterable[str], engine_pids: Iterable[int]) -> list[str]:
    """Unlink those of `names` (files in /dev/shm the engine's processes mapped) still present once the engine's
    processes `engine_pids` have all exited and no live process maps them; the names unlinked. Nothing is
    unlinked while any of the engine's processes is still alive."""
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


ORPHAN_MIN_AGE_S = 10.0
"""`sweep_orphans` leaves files younger than this: an engine starting right now creates its queues before it maps
them."""


def orphaned_files(min_age_s: float = ORPHAN_MIN_AGE_S, uid: int | None = None, now: float | None = None) -> list[str]:
    """Names of this user's (`uid`, default ours) vLLM-named files in /dev/shm (`ENGINE_SHM_PREFIXES`), last
    modified more than `min_age_s` ago, that no live process maps."""
    uid = os.getuid() if uid is None else uid
    now = time.time() if now is None else now
    candidates = set()
    for path in SHM_DIR.glob("*"):
        if not path.name.startswith(ENGINE_SHM_PREFIXES):
            continue
        try:
            info = path.stat()
        except FileNotFoundError:
            continue
        if info.st_uid == uid and now - info.st_mtime > min_age_s:
            candidates.add(path.name)
    return sorted(candidates - mapped_shm_files(_all_pids())) if candidates else []


def sweep_orphans(min_age_s: float = ORPHAN_MIN_AGE_S) -> list[str]:
    """Unlink what killed engines left in /dev/shm (`orphaned_files`); the names unlinked, each logged."""
    removed = []
    for name in orphaned_files(min_age_s):
        path = SHM_DIR / name
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            logger.warning("could not unlink %s: %s", path, exc)
            continue
        removed.append(name)
        logger.info("unlinked %s (%.0f MiB): a killed engine left it", path, size / 2**20)
    return removed

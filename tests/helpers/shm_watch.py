"""What the tests leave in /dev/shm (issue #41): vLLM's message queues (`psm_*`, 160–240 MiB each), semaphores and
CPU communicator buffers that no live process maps any more once a test has ended.

`tests/conftest.py` takes the engine-named files (`engine_processes.ENGINE_SHM_PREFIXES`) before and after each
test, its fixtures' teardown included, and at the end of the session; a file that appeared and that nobody maps is
left behind. Each is listed after the run with the test it appeared in (under xdist: the test its worker ran, so a
file the other worker's test left can be named against this one; the session's count is exact). The list is a
report, not a failure: another program on the machine (a study running beside the suite) can leave files too.
"""

from __future__ import annotations

import os
from pathlib import Path

from nemo_hacpo.rollout.engine_processes import ENGINE_SHM_PREFIXES, SHM_DIR, mapped_shm_files


def engine_files() -> set[str]:
    """The engine-named files in /dev/shm now (empty where there is no /dev/shm)."""
    try:
        return {name for name in os.listdir(SHM_DIR) if name.startswith(ENGINE_SHM_PREFIXES)}
    except OSError:
        return set()


def left_behind(before: set[str]) -> list[str]:
    """Engine files present now, not in `before`, and mapped by no live process."""
    new = engine_files() - before
    if not new:
        return []
    pids = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    return sorted(new - mapped_shm_files(pids))


def describe(names: list[str]) -> str:
    """`psm_ab12 (160 MiB), …`: each file with its size."""
    parts = []
    for name in names:
        try:
            size = (Path(SHM_DIR) / name).stat().st_size
        except OSError:
            continue
        parts.append(f"{name} ({size / 2**20:.0f} MiB)")
    return ", ".join(parts)

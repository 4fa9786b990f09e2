"""Kill a vLLM engine's processes when the process that owns the engine dies without shutting it down.

vLLM's EngineCore does not watch its parent: when the owner (a rank actor, the evaluation script) is SIGKILLed
together with Ray's own processes — the driver of a local Ray cluster killed, a node's processes killed — nothing
is left to stop the EngineCore and its workers, and they run on, reparented to init, holding gigabytes and their
/dev/shm queues (seen for hours after a killed test run). `RolloutEngine` therefore starts this watchdog next to
each engine: a small process of its own, run by path so that it imports nothing of the project (nor vLLM)::

    python engine_watchdog.py <owner pid>:<start> <engine pid>:<start> [...]

Every `POLL_S` it looks at the owner; once the owner is gone it SIGKILLs every engine process that is still the
one recorded (pid and start time in clock ticks since boot, from /proc/<pid>/stat: a reused pid is never hit), then
exits. It also exits, doing nothing, once every engine process is gone (a normal shutdown; `RolloutEngine.shutdown`
also stops it). The /dev/shm files the killed processes leave are the recorded sweep's
(`engine_processes.sweep_recorded`). Linux only (/proc).
"""

from __future__ import annotations

import os
import signal
import sys
import time

POLL_S = 0.5
"""How often the owner is looked at."""


def start_time(pid: int) -> int | None:
    """The process's start time (field 22 of /proc/<pid>/stat, clock ticks since boot); None when it is gone or a
    zombie (a zombie holds nothing)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces and parentheses
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _parse(item: str) -> tuple[int, int]:
    pid, start = item.split(":", 1)
    return int(pid), int(start)


def watch(owner: tuple[int, int], engine: list[tuple[int, int]], poll_s: float = POLL_S) -> list[int]:
    """Wait for the owner or the engine to go; the engine pids killed (empty when the engine went first)."""
    while True:
        alive = [(pid, start) for pid, start in engine if start_time(pid) == start]
        if not alive:
            return []
        if start_time(owner[0]) != owner[1]:
            killed = []
            for pid, start in alive:
                if start_time(pid) == start:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                    except OSError:
                        pass
            return killed
        time.sleep(poll_s)


def main(argv: list[str]) -> int:
    # Slurm forwards SIGUSR1 to the whole job (its default action would kill the watchdog) and Ctrl-C reaches the
    # foreground group: the owner decides about both; SIGTERM and SIGKILL still stop the watchdog
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})  # blocked by the owner while this started
    if len(argv) < 2:
        print("usage: engine_watchdog.py <owner pid>:<start> <engine pid>:<start> [...]", file=sys.stderr)
        return 2
    killed = watch(_parse(argv[0]), [_parse(item) for item in argv[1:]])
    if killed:
        print(f"engine_watchdog: owner {argv[0].split(':')[0]} is gone; killed its engine processes {killed}",
              file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""One reward worker process of `MathRewardScorer` (nemo_hacpo/rewards/scorer.py): its settings, its start-up and
its loop.

At start-up a worker limits its address space (`reward.worker_memory_mb` more than it holds once started: its
interpreter, math-verify and whatever its parent's main module imports — ~64 MB under recipes/train.py, but a main
module that imports torch adds ~0.6 GB with its CPU build and ~3.1 GB with a CUDA build), loads the reward function or checks that math-verify verifies a known
answer (which also warms sympy's lazy imports), and says "ready" — or says why it cannot score and exits, so that the
pool stops naming the cause instead of scoring every answer 0.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from nemo_hacpo.rewards.custom import CustomAnswer, RewardFunction, resolve_reward_function, score_custom
from nemo_hacpo.rewards.math import PreparedAnswer, RewardReason, ScoredAnswer, VerifyLimits, score_prepared

DEBUG_ACTIONS = ("hang", "sleep", "crash")
"""What a worker does with an answer holding a `_debug_markers` string (tests only): `hang` blocks SIGALRM and
sleeps, like a hang inside C code (the driver must kill it); `sleep` sleeps where SIGALRM can interrupt it (the
worker's own time limit fires: slow by construction, whatever the machine); `crash` exits at once."""
EXIT_CANNOT_SCORE = 4
"""A worker's exit status after it sent ("failed", why): it cannot score (over its memory limit, a broken install)."""
KNOWN_ANSWER = ("\\frac{1}{2}", "0.5")
"""The answer every math-verify worker must verify as correct before it says ready."""


@dataclass(frozen=True)
class WorkerSettings:
    limits: VerifyLimits
    soft_timeout_s: float
    memory_limit_mb: int | None
    """Address space the worker may add to what it holds once started (None: no limit)."""
    debug_markers: tuple[tuple[str, str], ...] = ()
    function: str | None = None
    """`reward.function` (`module:function`): workers import it and score with it instead of math-verify."""


Task = PreparedAnswer | CustomAnswer
"""What a worker scores: an answer for math-verify, or one for the reward function."""


def score_task(task: Task, settings: WorkerSettings, function: RewardFunction | None,
               action: str | None) -> ScoredAnswer:
    """One verdict, under the soft time limit (`function`: the resolved `reward.function`, for `CustomAnswer`s)."""
    if isinstance(task, CustomAnswer):
        return score_custom(function, task, settings.soft_timeout_s, delay_s=_debug_delay(action))
    return score_prepared(task, settings.limits, settings.soft_timeout_s, delay_s=_debug_delay(action))


def address_space_bytes() -> int | None:
    """This process's address space now (VmSize of /proc/self/status), None where there is no /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return None


def limit_address_space(memory_limit_mb: int | None) -> int | None:
    """RLIMIT_AS = what the process holds now + `memory_limit_mb`; returns the limit set (None: none)."""
    if not memory_limit_mb:
        return None
    try:
        import resource

        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = (address_space_bytes() or 0) + (memory_limit_mb << 20)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        return limit
    except (ImportError, ValueError, OSError):  # not Linux, or not permitted: run without the limit
        return None


def debug_action(settings: WorkerSettings, task: Task) -> str | None:
    """The `DEBUG_ACTIONS` entry whose marker the answer holds (tests only), else None."""
    text = task.response if isinstance(task, CustomAnswer) else task.answer_text
    for marker, action in settings.debug_markers:
        if marker in text:
            return action
    return None


def _debug_delay(action: str | None) -> float:
    """An hour for the `sleep` action (the time limit must cut it short), else 0."""
    return 3600.0 if action == "sleep" else 0.0


def start_up(settings: WorkerSettings) -> tuple[RewardFunction | None, str | None]:
    """`(the reward function or None for math-verify, None)` once this process can score, else `(None, why not)`."""
    over = (f"more than the {settings.memory_limit_mb} MB of address space a reward process may add to its start: "
            "raise reward.worker_memory_mb, or set it to null")
    try:
        # the config check has imported it once already: a failure here is the worker's (exit, the pool restarts it)
        function = resolve_reward_function(settings.function) if settings.function else None
    except (MemoryError, ValueError) as err:
        if settings.memory_limit_mb and (isinstance(err, MemoryError) or isinstance(err.__cause__, MemoryError)):
            return None, f"loading {settings.function} needed {over}"
        raise
    if function is None:
        known = score_prepared(PreparedAnswer(*KNOWN_ANSWER, strict=True), settings.limits, settings.soft_timeout_s)
        if known.reason is not RewardReason.CORRECT:  # math-verify swallows a MemoryError: it extracts nothing
            why = (f"math-verify scored the known answer {KNOWN_ANSWER[0]} = {KNOWN_ANSWER[1]} as "
                   f"{known.reason.value} ({known.detail or 'no detail'})")
            return None, why + (f"; it may have needed {over}" if settings.memory_limit_mb else "")
    return function, None


def worker_main(conn: Connection, settings: WorkerSettings) -> None:
    """Worker loop: receive ``(task_key, Task)``, reply ``(task_key, ScoredAnswer)``; ``None`` stops."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides when workers stop
    # SIGUSR1 asks the driver to save and stop; Slurm (srun forwarding it) signals the driver's children too,
    # and its default action would kill a worker in the middle of an answer
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    # blocked by the driver while this process started (`_start_worker`): one that came meanwhile is discarded now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    limit_address_space(settings.memory_limit_mb)
    function, why_not = start_up(settings)
    if why_not is not None:
        conn.send(("failed", why_not))
        os._exit(EXIT_CANNOT_SCORE)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the driver went away
            return
        if message is None:
            return
        task_key, prepared = message
        action = debug_action(settings, prepared) if settings.debug_markers else None
        if action == "hang":
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            while True:
                time.sleep(3600)
        elif action == "crash":
            os._exit(3)
        conn.send((task_key, score_task(prepared, settings, function, action)))

"""Batch math rewards in killable worker processes: one hung answer costs one timeout, not the batch.

``MathRewardScorer.score(responses, golds)`` prepares every answer in the caller (cheap string work,
:func:`~nemo_hacpo.rewards.math.prepare_answer`) and ships the survivors, one at a time, to
``num_workers`` long-lived worker processes that run :func:`~nemo_hacpo.rewards.math.score_prepared`.

Time limits, two layers:

- soft: inside the worker (its main thread) a SIGALRM limit of ``timeout_s`` interrupts slow
  Python-level work (sympy, math-verify's regexes); the worker answers ``timeout`` and stays alive.
- hard: the driver gives each task ``timeout_s + kill_grace_s``; a worker that has not answered by
  then (stuck in C code, signals blocked, dead) is killed, the answer counts as ``timeout`` and a
  fresh worker is started in the background while the others keep working.

Workers start with the ``spawn`` method by default: the driver also hosts Ray and vLLM threads, and
forking a multi-threaded process is unsafe. Workers are reused across batches (start-up ~1 s) and
get an address-space limit so a memory bomb becomes a ``MemoryError`` instead of an OOM kill. The worker's side
(its start-up check, its loop): :mod:`nemo_hacpo.rewards.worker`.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING

from nemo_hacpo.rewards.custom import custom_answer, resolve_reward_function
from nemo_hacpo.rewards.math import (
    DEFAULT_LIMITS,
    RewardReason,
    ScoredAnswer,
    VerifyLimits,
    prepare_answer,
)
from nemo_hacpo.rewards.worker import (
    DEBUG_ACTIONS,
    Task,
    WorkerSettings,
    debug_action,
    score_task,
    worker_main,
)

if TYPE_CHECKING:
    from nemo_hacpo.config import RewardConfig

__all__ = ["MathRewardScorer", "RewardBatch", "RewardPoolError", "count_reasons"]

logger = logging.getLogger(__name__)

TRUNCATED_INPUT = "truncated_input"


class RewardPoolError(RuntimeError):
    """The worker pool cannot run at all (workers fail to start). Never raised for answer content."""


def count_reasons(scored: Sequence[ScoredAnswer]) -> dict[str, int]:
    """``{reason: count}`` over every :class:`RewardReason` (zeros included) plus ``truncated_input``."""
    counts = Counter(answer.reason.value for answer in scored)
    result = {reason.value: counts.get(reason.value, 0) for reason in RewardReason}
    result[TRUNCATED_INPUT] = sum(answer.truncated for answer in scored)
    return result


@dataclass(frozen=True)
class RewardBatch:
    """Verdicts for one batch, in input order.

    Attributes:
        rewards: ``[N]`` 0.0/1.0.
        reasons: ``[N]`` why each reward was given.
        truncated: ``[N]`` whether each response was cut to ``max_response_chars``.
        details: ``[N]`` short notes for guard/failure reasons ("" otherwise).
        counts: reason counts over the batch plus ``truncated_input`` (see :func:`count_reasons`).
        elapsed_s: wall-clock seconds spent in ``score``.
    """

    rewards: list[float]
    reasons: list[RewardReason]
    truncated: list[bool]
    details: list[str]
    counts: dict[str, int]
    elapsed_s: float

    @classmethod
    def from_scored(cls, scored: Sequence[ScoredAnswer], elapsed_s: float) -> RewardBatch:
        return cls(
            rewards=[answer.reward for answer in scored],
            reasons=[answer.reason for answer in scored],
            truncated=[answer.truncated for answer in scored],
            details=[answer.detail for answer in scored],
            counts=count_reasons(scored),
            elapsed_s=elapsed_s,
        )

    @property
    def accuracy(self) -> float:
        """Mean reward (0.0 for an empty batch)."""
        return sum(self.rewards) / len(self.rewards) if self.rewards else 0.0

    def metrics(self, prefix: str = "reward/") -> dict[str, float]:
        """Flat scalars for a logger: accuracy, every count, elapsed seconds."""
        scalars = {f"{prefix}{name}": float(value) for name, value in self.counts.items()}
        scalars[f"{prefix}accuracy"] = self.accuracy
        scalars[f"{prefix}elapsed_s"] = self.elapsed_s
        return scalars


class _State(Enum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"


@dataclass(eq=False)
class _Worker:
    """Driver-side handle of one worker process and the task it holds."""

    process: multiprocessing.process.BaseProcess
    conn: Connection
    started_at: float
    state: _State = _State.STARTING
    task_index: int = -1
    task_key: int = -1
    task_truncated: bool = False
    task: Task | None = None
    task_attempt: int = 0
    deadline: float = 0.0
    failure: str = ""  # why it cannot score, as it said before exiting


class MathRewardScorer:
    """Pooled, time-limited math reward scoring. Use as a context manager, or call :meth:`close`.

    Args:
        num_workers: worker processes; ``0`` scores in this process (SIGALRM limit, main thread only).
        timeout_s: per-answer verification time limit; an answer over it scores 0 (``timeout``).
        strict: default grading mode (see :mod:`nemo_hacpo.rewards.math`); ``score`` can override it.
        limits: string/expression guards.
        kill_grace_s: extra time after ``timeout_s`` before a silent worker is killed.
        start_method: ``"spawn"`` (default) or ``"forkserver"``; never ``"fork"`` next to Ray/vLLM.
        worker_memory_limit_mb: address space (MB) a worker may add to what it holds once started (``None``:
            unlimited).
        startup_timeout_s: a worker not ready after this long is restarted.
        function: `module:function` of a reward function of the user's (`nemo_hacpo.rewards.custom`), scored
            instead of math-verify under the same time limits and guards; None: math-verify.
        _debug_markers: tests only: `{marker: action}` (`DEBUG_ACTIONS`), so that the kill, time-limit and
            crash paths run for real on inputs that are slow or fatal by construction.

    A worker that dies while it holds an answer (killed from outside, out of memory) costs that answer nothing:
    the answer goes to another worker, once; only an answer that kills a second worker scores 0 (`error`).

    Example::

        with MathRewardScorer(num_workers=2, timeout_s=5.0) as scorer:
            batch = scorer.score(["\\\\boxed{4}", "I think 5"], ["4", "5"])
        batch.rewards == [1.0, 0.0]; batch.counts["no_answer"] == 1
    """

    _MAX_STARTUP_FAILURES = 3

    def __init__(
        self,
        num_workers: int = 2,
        timeout_s: float = 5.0,
        strict: bool = True,
        limits: VerifyLimits = DEFAULT_LIMITS,
        kill_grace_s: float = 1.0,
        start_method: str = "spawn",
        worker_memory_limit_mb: int | None = 2048,
        startup_timeout_s: float = 120.0,
        function: str | None = None,
        _debug_markers: Mapping[str, str] | None = None,
    ) -> None:
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if start_method == "fork":
            raise ValueError(
                "start_method='fork' is unsafe next to Ray/vLLM threads; use 'spawn' or 'forkserver'"
            )
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.strict = strict
        self.limits = limits
        self.kill_grace_s = kill_grace_s
        self.startup_timeout_s = startup_timeout_s
        unknown = sorted(set((_debug_markers or {}).values()) - set(DEBUG_ACTIONS))
        if unknown:
            raise ValueError(f"unknown debug actions {unknown}; use {DEBUG_ACTIONS}")
        self.function = function
        # resolved here too: an unimportable function fails in the caller, not in every worker
        self._function = resolve_reward_function(function) if function else None
        self._settings = WorkerSettings(limits, timeout_s, worker_memory_limit_mb,
                                         tuple(sorted((_debug_markers or {}).items())), function)
        self._context = multiprocessing.get_context(start_method)
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._next_task_key = 0
        self._startup_failures = 0
        self._closed = False
        self._totals: Counter[str] = Counter()
        self._total_seconds = 0.0
        self._warned_golds: set[str] = set()
        self._warned_errors: set[str] = set()
        self._warned_no_time_limit = False
        for _ in range(num_workers):
            self._workers.append(self._start_worker())

    @classmethod
    def from_config(cls, reward: RewardConfig, **overrides: object) -> MathRewardScorer:
        """The scorer of a run's `reward` section (workers, time limit, grading mode, response length limit, the
        workers' memory limit, the reward function)."""
        settings: dict[str, object] = {
            "num_workers": reward.num_workers, "timeout_s": reward.timeout_s, "strict": reward.strict,
            "limits": dataclasses.replace(DEFAULT_LIMITS, max_response_chars=reward.max_response_chars),
            "function": reward.function, "worker_memory_limit_mb": reward.worker_memory_mb}
        return cls(**{**settings, **overrides})  # type: ignore[arg-type]

    # ----------------------------------------------------------------------------------- lifecycle

    def __enter__(self) -> MathRewardScorer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def close(self) -> None:
        """Stop all workers (politely, then by force). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 2.0
        for worker in self._workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            self._kill(worker)
        self._workers.clear()

    def wait_until_ready(self, timeout_s: float | None = None) -> bool:
        """Block until every worker has started; ``False`` if ``timeout_s`` passed first.

        Optional: :meth:`score` waits for workers by itself. Useful to pay the start-up (~1 s per worker)
        before the first training step, and in tests that time a batch.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            while True:
                starting = [w for w in self._workers if w.state is _State.STARTING]
                if not starting:
                    return True
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return False
                wake_at = min(w.started_at + self.startup_timeout_s for w in starting)
                if deadline is not None:
                    wake_at = min(wake_at, deadline)
                wait(
                    [w.conn for w in starting] + [w.process.sentinel for w in starting],
                    max(0.0, wake_at - now),
                )
                for worker in starting:
                    self._collect(worker, results=[])
                now = time.monotonic()
                for worker in list(self._workers):
                    if worker.state is _State.STARTING and now >= worker.started_at + self.startup_timeout_s:
                        self._startup_failed(worker, "not ready in time")

    @property
    def worker_pids(self) -> list[int | None]:
        """PIDs of the current workers (for tests and debugging)."""
        return [worker.process.pid for worker in self._workers]

    def _start_worker(self) -> _Worker:
        parent_conn, child_conn = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=worker_main, args=(child_conn, self._settings), daemon=True, name="math-reward-worker"
        )
        # SIGUSR1 blocked while the worker starts: a spawned process inherits the mask through exec, so one that
        # Slurm forwards before `worker_main` has set it to be ignored waits there instead of killing the worker
        # (the pool's start, a replacement). Forkserver children inherit the server's mask instead.
        previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        child_conn.close()
        return _Worker(process=process, conn=parent_conn, started_at=time.monotonic())

    @staticmethod
    def _kill(worker: _Worker) -> None:
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(5.0)
        worker.conn.close()
        try:
            worker.process.close()  # release its sentinel fd: a long run may replace many workers
        except ValueError:  # still running after 5 s (unkillable?): leave it to the OS
            pass

    def _replace(self, worker: _Worker) -> _Worker:
        self._kill(worker)
        self._totals["worker_restarts"] += 1
        replacement = self._start_worker()
        self._workers[self._workers.index(worker)] = replacement
        return replacement

    # ------------------------------------------------------------------------------------- scoring

    def score(
        self, responses: Sequence[object], golds: Sequence[object], strict: bool | None = None
    ) -> RewardBatch:
        """Score ``responses[i]`` against ``golds[i]``; results keep the input order.

        Never raises for any response or gold content (``ValueError`` only for mismatched lengths or a
        closed scorer, :class:`RewardPoolError` only when workers cannot start at all). Wall time is
        about ``total work / num_workers``, plus at most ``timeout_s + kill_grace_s`` per hung answer.
        """
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} golds")
        if self._closed:
            raise ValueError("MathRewardScorer is closed")
        grading_strict = self.strict if strict is None else strict
        started = time.monotonic()
        with self._lock:
            results: list[ScoredAnswer | None] = [None] * len(responses)
            to_verify: deque[tuple[int, Task, int]] = deque()  # (index, answer, attempt)
            for index, (response, gold) in enumerate(zip(responses, golds, strict=True)):
                try:
                    prepared = (custom_answer(response, gold, self.limits.max_response_chars) if self.function else
                                prepare_answer(response, gold, strict=grading_strict, limits=self.limits))
                except Exception as exc:  # noqa: BLE001 - must never raise on content
                    logger.exception("answer preparation failed unexpectedly")
                    prepared = ScoredAnswer.of(RewardReason.ERROR, detail=f"prepare: {type(exc).__name__}")
                if isinstance(prepared, ScoredAnswer):
                    results[index] = prepared
                else:
                    to_verify.append((index, prepared, 0))
            if self.num_workers == 0:
                self._score_in_process(to_verify, results)
            else:
                self._score_in_workers(to_verify, results)
            scored = [answer for answer in results if answer is not None]
            assert len(scored) == len(responses), "every answer gets a verdict"
            batch = RewardBatch.from_scored(scored, time.monotonic() - started)
            self._record(batch, golds)
        return batch

    def _score_in_process(self, to_verify: deque[tuple[int, Task, int]], results: list) -> None:
        if threading.current_thread() is not threading.main_thread() and not self._warned_no_time_limit:
            logger.warning("num_workers=0 off the main thread: no time limit can be armed; use workers")
            self._warned_no_time_limit = True
        for index, task, _ in to_verify:
            results[index] = score_task(task, self._settings, self._function, debug_action(self._settings, task))

    def _score_in_workers(self, to_verify: deque[tuple[int, Task, int]], results: list) -> None:
        hard_timeout_s = self.timeout_s + self.kill_grace_s
        for worker in list(self._workers):
            # Dead since the last batch, or still busy with a task of a batch that was interrupted
            # (KeyboardInterrupt): its late answer must not land in this batch.
            if worker.state is _State.BUSY or not worker.process.is_alive():
                self._replace(worker)
        while to_verify or any(worker.state is _State.BUSY for worker in self._workers):
            for worker in list(self._workers):
                if worker.state is _State.IDLE and to_verify:
                    self._dispatch(worker, to_verify, hard_timeout_s)
            waiting = [w for w in self._workers if w.state is not _State.IDLE]
            if not waiting:
                continue
            now = time.monotonic()
            deadlines = [
                w.deadline if w.state is _State.BUSY else w.started_at + self.startup_timeout_s
                for w in waiting
            ]
            handles = [w.conn for w in waiting] + [w.process.sentinel for w in waiting]
            wait(handles, timeout=max(0.0, min(deadlines) - now))
            for worker in waiting:
                self._collect(worker, results, to_verify)
            now = time.monotonic()
            for worker in list(self._workers):
                if worker.state is _State.BUSY and now >= worker.deadline:
                    results[worker.task_index] = ScoredAnswer.of(
                        RewardReason.TIMEOUT,
                        truncated=worker.task_truncated,
                        detail=f"worker killed after {hard_timeout_s:g} s without an answer",
                    )
                    self._totals["worker_kills"] += 1
                    self._replace(worker)
                elif worker.state is _State.STARTING and now >= worker.started_at + self.startup_timeout_s:
                    self._startup_failed(worker, "not ready in time")

    def _dispatch(
        self, worker: _Worker, to_verify: deque[tuple[int, Task, int]], hard_timeout_s: float
    ) -> None:
        index, prepared, attempt = to_verify.popleft()
        self._next_task_key += 1
        try:
            worker.conn.send((self._next_task_key, prepared))
        except (OSError, ValueError):  # died while idle: the answer goes to another worker
            to_verify.appendleft((index, prepared, attempt))
            self._replace(worker)
            return
        worker.state = _State.BUSY
        worker.task_index = index
        worker.task_key = self._next_task_key
        worker.task_truncated = prepared.truncated
        worker.task, worker.task_attempt = prepared, attempt
        worker.deadline = time.monotonic() + hard_timeout_s

    def _collect(self, worker: _Worker, results: list,
                 to_verify: deque[tuple[int, Task, int]] | None = None) -> None:
        """Read whatever the worker sent; handle its death (its answer is retried once on another worker)."""
        try:
            while worker.conn.poll():
                message = worker.conn.recv()
                if message[0] == "ready":
                    worker.state = _State.IDLE
                    self._startup_failures = 0
                elif message[0] == "failed":  # it cannot score (nemo_hacpo/rewards/worker.py: `start_up`)
                    worker.failure = message[1]
                elif worker.state is _State.BUSY and message[0] == worker.task_key:
                    scored: ScoredAnswer = message[1]
                    results[worker.task_index] = scored
                    worker.state = _State.IDLE
        except (EOFError, OSError):
            pass
        if worker.process.is_alive():
            return
        exit_code = worker.process.exitcode
        if worker.state is _State.BUSY:
            self._totals["worker_deaths"] += 1
            if to_verify is not None and worker.task is not None and worker.task_attempt == 0:
                to_verify.appendleft((worker.task_index, worker.task, 1))  # not this answer's fault, probably
            else:
                results[worker.task_index] = ScoredAnswer.of(
                    RewardReason.ERROR,
                    truncated=worker.task_truncated,
                    detail=f"worker died (exit code {exit_code}) twice on this answer",
                )
            self._replace(worker)
        elif worker.state is _State.STARTING:
            self._startup_failed(worker, worker.failure or f"exited with code {exit_code}")
        else:
            self._replace(worker)

    def _startup_failed(self, worker: _Worker, why: str) -> None:
        self._startup_failures += 1
        logger.error("math reward worker failed to start (%s), attempt %d", why, self._startup_failures)
        if self._startup_failures > self._MAX_STARTUP_FAILURES * max(1, self.num_workers):
            self.close()
            raise RewardPoolError(f"reward workers keep failing to start ({why})")
        self._replace(worker)

    # ------------------------------------------------------------------------------------- metrics

    def _record(self, batch: RewardBatch, golds: Sequence[object]) -> None:
        self._totals.update(batch.counts)
        self._totals["answers"] += len(batch.rewards)
        self._totals["batches"] += 1
        self._total_seconds += batch.elapsed_s
        for gold, reason, detail in zip(golds, batch.reasons, batch.details, strict=True):
            if self.function and reason is RewardReason.ERROR and len(self._warned_errors) < 100:
                key = detail.split(":", 1)[0]  # one line per kind of failure ("reward function raised KeyError")
                if key not in self._warned_errors:
                    self._warned_errors.add(key)
                    logger.warning("%s scored an answer 0: %s", self.function, detail)
            if reason is RewardReason.INVALID_GOLD and len(self._warned_golds) < 100:
                key = str(gold)[:100]
                if key not in self._warned_golds:
                    self._warned_golds.add(key)
                    logger.warning("invalid gold answer %r scored 0: %s", key, detail)

    def metrics(self) -> dict[str, float]:
        """Cumulative counters since construction: every reason, ``truncated_input``, ``answers``,
        ``batches``, ``worker_restarts``/``worker_kills``/``worker_deaths``, ``accuracy``, ``seconds``."""
        totals = {reason.value: float(self._totals.get(reason.value, 0)) for reason in RewardReason}
        for name in (
            TRUNCATED_INPUT,
            "answers",
            "batches",
            "worker_restarts",
            "worker_kills",
            "worker_deaths",
        ):
            totals[name] = float(self._totals.get(name, 0))
        totals["accuracy"] = (
            totals[RewardReason.CORRECT.value] / totals["answers"] if totals["answers"] else 0.0
        )
        totals["seconds"] = self._total_seconds
        return totals

"""One run per output directory: `<output_dir>/run.lock`, held by the driver from its start to its end.

The file (JSON) names the holder — host, pid, Slurm job id and restart count, start time — and carries a
heartbeat the holder rewrites every `stale_s / 10` seconds from a thread. The output directory may lie on a file
system that several nodes share, where `flock` does not reach across nodes, so the file itself is the lock: it is
created by `os.link` of a complete temporary file (atomic, and refused when the name exists, NFS included), its
heartbeat is refreshed by rename (readers never see a torn file), and it is removed when the run ends.

A second run on a held directory refuses at once, naming the holder (`RunDirBusy`: exit status 2). A lock whose
holder is gone is taken over with a warning; the holder is gone when
  1. it ran on this host (same host name, same boot, same pid namespace) and its pid is not running, or is
     another process now (its start time differs) — decisive either way on the same host;
  2. otherwise, with a Slurm job id on the lock and Slurm answering: that job no longer runs, or it is an
     earlier run of this very job (requeued: same id, another SLURM_RESTART_COUNT) — decisive either way; but
     a holder of this very run of this job (a driver started again inside the same allocation) is decided by
     rule 1 or 3, since Slurm can only say that the job — this one — runs;
  3. otherwise: its heartbeat is older than `stale_s` (`runtime.lock_stale_s`).
So the rerun of a SIGKILLed driver resumes at once, the resubmission of a job whose node failed as soon as Slurm
has ended that job, and anything else `stale_s` after its holder fell silent. A host name is not an identity:
another host may carry the same name (containers), so a lock from a host of this name but another boot is decided
by rules 2 and 3, not taken as this host restarted.

What the lock guarantees on a shared file system: two drivers never both hold it (the lock is created by a hard
link, atomic on NFS too; a link whose reply was lost and retried is recognised as this run's own by the link count
of its source), a live holder is never taken over while its heartbeat is fresher than `stale_s`, and a run whose
lock was taken over notices it before its next step (`check`, and the heartbeat thread within `stale_s / 10`) and
writes nothing more. What it does not: a holder frozen (SIGSTOP, a hung NFS mount) for longer than `stale_s` is
taken over while it still lives — it then stops at its next step, but what it had started writing may land; and
clocks skewed between hosts by more than `stale_s` misjudge heartbeats.

Readers (`recipes/evaluate.py --run`, `recipes/export_hf.py --run`) do not take the lock.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from nemo_hacpo.config import ConfigError, ConfigIssue

logger = logging.getLogger(__name__)

LOCK_FILE = "run.lock"
HEARTBEATS_PER_STALE = 10
"""The holder refreshes its heartbeat `stale_s / HEARTBEATS_PER_STALE` seconds apart."""
_SLURM_ALIVE = {"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "STOPPED", "SIGNALING", "STAGE_OUT",
                "RESIZING", "REQUEUE_HOLD"}
"""Slurm job states in which a driver of the job may still be running (PENDING: it was requeued, its driver is
gone; COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED, …: it ended)."""


class RunDirBusy(ConfigError):
    """Another live run holds the output directory."""

    heading = "output directory in use"


class LockLost(RuntimeError):
    """This run's lock was taken over by another run (its heartbeat had fallen silent for longer than the bound):
    it must write nothing more into the directory."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: what `run.lock` says."""

    host: str
    pid: int
    job_id: str | None
    restart_count: str | None
    started: float
    heartbeat: float
    token: str
    boot_id: str = ""
    pid_ns: str = ""
    pid_start: int | None = None

    def describe(self, now: float) -> str:
        job = f", Slurm job {self.job_id}" if self.job_id else ""
        return (f"pid {self.pid} on {self.host}{job}, started {_clock(self.started)}, last heartbeat "
                f"{max(0.0, now - self.heartbeat):.0f} s ago")


def _clock(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M:%S")


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def host_identity() -> dict[str, str]:
    """This process's host name, boot id and pid namespace: a pid means the same process only when all three
    match (another boot reuses pids; a container may have its own pid namespace)."""
    try:
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pid_ns = ""
    return {"host": socket.gethostname(), "boot_id": _read_text("/proc/sys/kernel/random/boot_id"), "pid_ns": pid_ns}


def process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks after boot, /proc/<pid>/stat field 22), None when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def pid_running(pid: int, started: int | None = None) -> bool:
    """Whether `pid` is a live process of this host (not a zombie) and, with `started`, still the same one."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        state = ""
    if state == "Z":
        return False
    return started is None or process_start(pid) in (None, started)


def slurm_job_running(job_id: str, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> bool | None:
    """Whether Slurm job `job_id` still runs (`squeue -h -j <id> -o %T`): None when Slurm cannot be asked."""
    try:
        done = run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        # an id Slurm has forgotten (older than MinJobAge): "Invalid job id specified"
        return False if "invalid job id" in (done.stderr + done.stdout).lower() else None
    states = done.stdout.split()
    return any(state in _SLURM_ALIVE for state in states)


class RunLock:
    """The lock of one output directory. `acquire()` takes it (or raises `RunDirBusy`), a thread keeps its
    heartbeat, `check()` raises `LockLost` once another run has taken it over, `release()` gives it back.

    `clock`, `environ` and `job_running` are the wall clock, the environment (SLURM_JOB_ID,
    SLURM_RESTART_COUNT) and the Slurm query, as arguments so that a test can stand in for them.
    """

    def __init__(self, out_dir: str | Path, stale_s: float = 300.0, *, clock: Callable[[], float] = time.time,
                 environ: dict[str, str] | None = None,
                 job_running: Callable[[str], bool | None] = slurm_job_running) -> None:
        self.path = Path(out_dir) / LOCK_FILE
        self.stale_s = stale_s
        self.clock, self.job_running = clock, job_running
        environ = os.environ if environ is None else environ
        self.job_id = environ.get("SLURM_JOB_ID") or None
        self.restart_count = environ.get("SLURM_RESTART_COUNT") or ("0" if self.job_id else None)
        self.holder: Holder | None = None  # ours, once acquired
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------------------ reading
    def read(self) -> Holder | None:
        """What the lock file says; None when there is none (`parse_holder`)."""
        return _read_holder(self.path)

    def gone(self, holder: Holder) -> str | None:
        """Why `holder` is gone (its lock may be taken over), or None when it may still be running."""
        here = host_identity()
        if (holder.host, holder.boot_id, holder.pid_ns) == (here["host"], here["boot_id"], here["pid_ns"]):
            if holder.pid > 0 and not pid_running(holder.pid, holder.pid_start):
                return f"pid {holder.pid} is not running on {holder.host}"
            if holder.pid > 0:
                return None  # a live process of this host: decisive
        if holder.job_id:
            ours = holder.job_id == self.job_id
            if ours and holder.restart_count != self.restart_count:
                return (f"it was run {holder.restart_count} of Slurm job {holder.job_id}, which has been requeued "
                        f"(this is run {self.restart_count})")
            running = None if ours else self.job_running(holder.job_id)  # ours runs: that says nothing of it
            if running is not None:
                return None if running else f"Slurm job {holder.job_id} is no longer running"
        age = self.clock() - holder.heartbeat
        if age > self.stale_s:
            return f"its heartbeat is {age:.0f} s old, older than runtime.lock_stale_s={self.stale_s:g} s"
        return None

    # ------------------------------------------------------------------------------------------ taking
    def acquire(self) -> RunLock:
        """Take the lock, taking over one whose holder is gone (with a warning); `RunDirBusy` naming a live
        holder. Starts the heartbeat thread."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        now = self.clock()
        here = host_identity()
        mine = Holder(host=here["host"], pid=os.getpid(), job_id=self.job_id, restart_count=self.restart_count,
                      started=now, heartbeat=now, token=uuid.uuid4().hex, boot_id=here["boot_id"],
                      pid_ns=here["pid_ns"], pid_start=process_start(os.getpid()))
        for _ in range(5):  # each round: create, or take a stale lock away; a race with another taker retries
            if self._create(mine):
                self.holder = mine
                self._start_heartbeat()
                return self
            holder = self.read()
            if holder is None:
                continue  # released meanwhile
            why = self.gone(holder)
            if why is None:
                raise RunDirBusy([ConfigIssue(
                    "runtime.output_dir",
                    f"{self.path.parent} is in use by another run: {holder.describe(self.clock())} ({self.path})",
                    "wait for that run to end or stop it, or give this run another runtime.output_dir (evaluate.py "
                    "and export_hf.py --run read a live run's directory freely); a holder that died is taken over: "
                    "on its own host at once, in Slurm once its job has ended, elsewhere when its heartbeat is "
                    f"older than runtime.lock_stale_s={self.stale_s:g} s")])
            if self._take_away(holder):
                logger.warning("%s: taking over the lock of a run that is gone (%s; %s)", self.path.parent,
                               holder.describe(self.clock()), why)
        raise RunDirBusy([ConfigIssue("runtime.output_dir", f"{self.path} kept changing while this run tried to "
                                      "take it (several runs starting at once?)", "start one run per directory")])

    def _create(self, holder: Holder) -> bool:
        tmp = self.path.with_name(f".{LOCK_FILE}.{holder.token}")
        _write(tmp, holder)
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            # over NFS a link whose reply was lost is sent again and then fails, although the first one made the
            # lock: the source's link count (2) says it did (the classic NFS lock test)
            try:  # the link count, or the token (a random one: proof enough where a client caches the count)
                return tmp.stat().st_nlink == 2 or _read_holder(self.path).token == holder.token
            except (OSError, AttributeError):
                return False
        finally:
            tmp.unlink(missing_ok=True)

    def _take_away(self, stale: Holder) -> bool:
        """Move the stale lock aside; False when the file at the path was no longer that lock (it is put back)."""
        moved = self.path.with_name(f".{LOCK_FILE}.taken-{uuid.uuid4().hex}")
        try:
            os.rename(self.path, moved)
        except FileNotFoundError:
            return False
        taken = _read_holder(moved)  # read as `read` did: whatever the file held, the same token means the same file
        if taken is not None and taken.token == stale.token:
            moved.unlink(missing_ok=True)
            return True
        try:  # another run's fresh lock: give it back
            os.link(moved, self.path)
        except FileExistsError:
            pass
        moved.unlink(missing_ok=True)
        return False

    # ------------------------------------------------------------------------------------------ holding
    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="run-lock-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        interval = max(0.01, self.stale_s / HEARTBEATS_PER_STALE)
        while not self._stop.wait(interval):
            try:
                if not self.refresh():
                    return
            except Exception as err:  # noqa: BLE001 - whatever a sick file system raises, the next beat tries again
                logger.warning("%s: heartbeat failed (%s: %s); trying again", self.path, type(err).__name__, err)

    def refresh(self) -> bool:
        """Rewrite the heartbeat; False (and `lost` set) once the file is not this run's lock any more."""
        if self.holder is None or self.lost is not None:
            return False
        try:
            current = self.read()
        except OSError as err:  # NFS: ESTALE, EIO, a timed-out mount — the next beat tries again
            logger.warning("%s: the lock could not be read for the heartbeat (%s)", self.path, err)
            return True
        if current is None or current.token != self.holder.token:
            self.lost = current.describe(self.clock()) if current is not None else "no lock file"
            logger.error("%s: this run's lock was taken over (%s); it will write no checkpoint there",
                         self.path.parent, self.lost)
            return False
        self.holder = Holder(**{**asdict(self.holder), "heartbeat": self.clock()})
        tmp = self.path.with_name(f".{LOCK_FILE}.{self.holder.token}")
        try:
            _write(tmp, self.holder)
            os.replace(tmp, self.path)
        except OSError as err:  # a full or unreachable file system: the next beat tries again
            logger.warning("%s: heartbeat not written (%s)", self.path, err)
            try:
                tmp.unlink(missing_ok=True)
            except OSError:  # the same outage
                pass
        return True

    def check(self) -> None:
        """Raise `LockLost` when another run has taken this run's lock over."""
        if self.holder is None:
            return
        try:
            current = self.read()
        except OSError as err:  # unreadable just now (NFS): the heartbeat thread keeps watching
            logger.warning("%s: the lock could not be read (%s)", self.path, err)
            current = self.holder
        if self.lost is None and (current is None or current.token != self.holder.token):
            self.lost = current.describe(self.clock()) if current is not None else "no lock file"
        if self.lost is not None:
            raise LockLost(f"{self.path.parent}: another run has taken this run's lock over ({self.lost}); this "
                           "run stops without writing into the directory")

    def release(self) -> None:
        """Stop the heartbeat and remove the lock file if it is still this run's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self.holder is None:
            return
        current = self.read()
        if current is not None and current.token == self.holder.token:
            self.path.unlink(missing_ok=True)
        self.holder = None


def parse_holder(text: str, mtime: float) -> Holder:
    """A lock file's holder. Anything that is not a lock this module wrote — torn, another program's JSON — reads
    as a holder of unknown pid whose heartbeat is the file's modification time (so it can be taken over once
    that is older than the bound), its token derived from that time (the same file reads the same)."""
    try:
        holder = Holder(**json.loads(text))
        if isinstance(holder.token, str) and isinstance(holder.heartbeat, int | float) and holder.token:
            return holder
    except (ValueError, TypeError):
        pass
    return Holder(host="?", pid=-1, job_id=None, restart_count=None, started=mtime, heartbeat=mtime,
                  token=f"unreadable-{mtime}")


def _read_holder(path: Path) -> Holder | None:
    try:
        text = path.read_text(errors="replace")  # another program's binary file reads as unreadable, not as a crash
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return None
    return parse_holder(text, mtime)


def _write(path: Path, holder: Holder) -> None:
    with path.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps(asdict(holder), indent=1))
        fh.flush()
        os.fsync(fh.fileno())

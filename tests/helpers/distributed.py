"""Run a function on N gloo ranks (one fresh Python process each) and collect each rank's return value.

    results = run_distributed(check_tp2, 2, checkpoint_dir)     # [rank 0's result, rank 1's result]

`fn` must be a module-level function in a file (a test module is fine): each rank loads that file by path,
joins a gloo world (RANK and WORLD_SIZE in its environment), calls `fn(*args)` and saves its return value with `torch.save` (tensors, dicts, lists, numbers). Arguments travel
the same way. If a rank fails, the others are stopped and the failure's output is raised in the parent.
Each rank runs with OMP_NUM_THREADS=1; spawning costs a few seconds per run (imports), so batch checks.

The rendezvous: rank 0 starts the world's TCP store on a port the OS picks and writes it to the run's folder,
the others connect to it — as `runtime/worker.py` does. (A port picked free here and bound by rank 0 seconds
later, after its imports, could be taken in between by a connection of a test running beside it: EADDRINUSE,
seen in CI.) `free_port` keeps that race for the ports tests hand to `fn`; it picks below the kernel's
ephemeral range, where no outgoing connection takes a port.
"""

from __future__ import annotations

import datetime
import importlib.util
import inspect
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1, below the kernel's ephemeral range (where the OS
    assigns the local ports of outgoing connections, and would hand out port 0 binds) and above Ray's worker
    ports (10002–19999): between this call and the caller's bind, only another explicit bind can take it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = list(range(20000, low)) if low > 21000 else []
    random.SystemRandom().shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # no room below the ephemeral range: any port the OS picks
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 600.0,
                    env: dict[str, str] | None = None) -> list[Any]:
    """`fn(*args)` on ranks 0..world_size−1 of a fresh gloo world; returns the results in rank order."""
    source = inspect.getsourcefile(fn)
    if source is None or "<locals>" in fn.__qualname__:
        raise ValueError(f"{fn!r} must be a module-level function defined in a file")
    with tempfile.TemporaryDirectory(prefix="run_distributed-") as work:
        work_dir = Path(work)
        torch.save({"source": source, "name": fn.__qualname__, "args": args}, work_dir / "call.pt")
        processes = []
        for rank in range(world_size):
            rank_env = dict(os.environ, **(env or {}), RANK=str(rank), WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1",
                            PYTHONWARNINGS="ignore", PYTHONPATH=os.pathsep.join(
                                [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
            log = open(work_dir / f"rank{rank}.log", "w")  # closed in _wait_all
            # `-m`, not the file path: the script's folder on sys.path would shadow packages (megatron, ...)
            processes.append((subprocess.Popen([sys.executable, "-m", "tests.helpers.distributed", str(work_dir)],
                                               env=rank_env, cwd=REPO_ROOT,
                                               stdout=log, stderr=subprocess.STDOUT), log))
        failure = _wait_all(processes, timeout_s)
        if failure is not None:
            rank, reason = failure
            output = (work_dir / f"rank{rank}.log").read_text()[-6000:]
            raise AssertionError(f"rank {rank} of {world_size} {reason}:\n{output}")
        return [torch.load(work_dir / f"result{rank}.pt", weights_only=False) for rank in range(world_size)]


def _wait_all(processes: list[tuple[subprocess.Popen, Any]], timeout_s: float) -> tuple[int, str] | None:
    """Wait for every rank; on the first failure (or the deadline) stop the others. Returns (rank, reason)."""
    deadline = time.monotonic() + timeout_s
    failure = None
    try:
        while failure is None and any(p.poll() is None for p, _ in processes):
            failure = next(((r, f"exited with {p.returncode}") for r, (p, _) in enumerate(processes)
                            if p.returncode not in (None, 0)), None)
            if failure is None and time.monotonic() > deadline:
                failure = next(r for r, (p, _) in enumerate(processes) if p.poll() is None), f"timed out ({timeout_s} s)"
            time.sleep(0.05)
        if failure is None:
            failure = next(((r, f"exited with {p.returncode}") for r, (p, _) in enumerate(processes)
                            if p.returncode != 0), None)
    finally:
        for process, log in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    return failure


def _rendezvous(work_dir: Path, rank: int, world_size: int, timeout_s: float = 1800.0) -> torch.distributed.Store:
    """Rank 0: a TCP store on a port the OS picks, published in `work_dir/port`; the others: a client of it. The
    timeout is torch's default for a process group (the parent's `timeout_s` stops a rank that waits too long)."""
    from torch.distributed import TCPStore

    timeout = datetime.timedelta(seconds=timeout_s)
    port_file = work_dir / "port"
    if rank == 0:
        store = TCPStore("127.0.0.1", 0, world_size=world_size, is_master=True, timeout=timeout,
                         wait_for_workers=False)
        staged = work_dir / "port.tmp"
        staged.write_text(str(store.port))
        staged.rename(port_file)  # whole or absent for the readers
        return store
    deadline = time.monotonic() + timeout_s
    while not port_file.is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 did not publish its store's port in {port_file} within {timeout_s} s")
        time.sleep(0.05)
    return TCPStore("127.0.0.1", int(port_file.read_text()), world_size=world_size, is_master=False, timeout=timeout)


def _rank_main(work_dir: Path) -> None:
    call = torch.load(work_dir / "call.pt", weights_only=False)
    spec = importlib.util.spec_from_file_location(f"_distributed_target_{Path(call['source']).stem}", call["source"])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    fn = module
    for part in call["name"].split("."):
        fn = getattr(fn, part)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.distributed.init_process_group("gloo", store=_rendezvous(work_dir, rank, world_size), rank=rank,
                                         world_size=world_size)
    try:
        result = fn(*call["args"])
    finally:
        if torch.distributed.is_initialized():  # `fn` may have torn it down itself (e.g. to join another world)
            torch.distributed.destroy_process_group()
    torch.save(result, work_dir / f"result{os.environ['RANK']}.pt")


if __name__ == "__main__":
    _rank_main(Path(sys.argv[1]))

"""Run a function on N gloo ranks (one fresh Python process each) and collect each rank's return value.

    results = run_distributed(check_tp2, 2, checkpoint_dir)     # [rank 0's result, rank 1's result]

`fn` must be a module-level function in a file (a test module is fine): each rank loads that file by path,
initialises `torch.distributed` with gloo from env:// (RANK, WORLD_SIZE, MASTER_ADDR/PORT), calls
`fn(*args)` and saves its return value with `torch.save` (tensors, dicts, lists, numbers). Arguments travel
the same way. If a rank fails, the others are stopped and the failure's output is raised in the parent.
Each rank runs with OMP_NUM_THREADS=1; spawning costs a few seconds per run (imports), so batch checks.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
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
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 600.0,
                    env: dict[str, str] | None = None) -> list[Any]:
    """`fn(*args)` on ranks 0..world_size−1 of a fresh gloo world; returns the results in rank order."""
    source = inspect.getsourcefile(fn)
    if source is None or "<locals>" in fn.__qualname__:
        raise ValueError(f"{fn!r} must be a module-level function defined in a file")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="run_distributed-") as work:
        work_dir = Path(work)
        torch.save({"source": source, "name": fn.__qualname__, "args": args}, work_dir / "call.pt")
        processes = []
        for rank in range(world_size):
            rank_env = dict(os.environ, **(env or {}), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                            RANK=str(rank), WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1",
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


def _rank_main(work_dir: Path) -> None:
    call = torch.load(work_dir / "call.pt", weights_only=False)
    spec = importlib.util.spec_from_file_location(f"_distributed_target_{Path(call['source']).stem}", call["source"])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    fn = module
    for part in call["name"].split("."):
        fn = getattr(fn, part)
    torch.distributed.init_process_group("gloo", init_method="env://")
    try:
        result = fn(*call["args"])
    finally:
        if torch.distributed.is_initialized():  # `fn` may have torn it down itself (e.g. to join another world)
            torch.distributed.destroy_process_group()
    torch.save(result, work_dir / f"result{os.environ['RANK']}.pt")


if __name__ == "__main__":
    _rank_main(Path(sys.argv[1]))

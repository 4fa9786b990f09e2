"""What an agent rank's process needs of the host it runs on: its GPU, its network interface, its log file, the
environment it hands its engine. Functions of the process, no Megatron or vLLM (`runtime.worker.AgentRank` uses them).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import torch

TRAINER_ENVIRONMENT = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
"""What the trainer ranks run with and their engines must not: one hardware queue per device, so that Megatron's
tensor-parallel communication is issued in order with the GEMMs it overlaps (what Megatron-LM's launch scripts set).
In the rank actors' Ray runtime_env (`runtime.groups.AgentGroup`); `worker.AgentRank._new_engine` keeps it out of the
engine processes it spawns, which would otherwise inherit it and lose vLLM's concurrent streams."""


def wait_visible(path: Path, agent: str, rank: int, timeout_s: float = 60.0) -> None:
    """Wait until `path`, written on another node, shows here: shared filesystems (NFS) may cache a directory's
    listing for seconds after the barrier that says it is complete."""
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() > deadline:
            raise FileNotFoundError(f"agent {agent!r} rank {rank}: {path} is not visible on this node "
                                    f"{timeout_s:.0f} s after rank 0 wrote it; runtime.output_dir must be on a "
                                    "filesystem every node shares")
        time.sleep(0.5)


def set_environment(values: dict[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def assigned_gpu() -> int | None:
    """The GPU Ray gave this actor (its index among the node's devices; actors see every GPU of their node,
    `RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`), or None outside Ray / on CPU."""
    if not torch.cuda.is_available():
        return None
    try:
        import ray

        ids = ray.get_gpu_ids() if ray.is_initialized() else []
    except Exception:  # noqa: BLE001 - not inside a Ray worker
        return None
    return int(ids[0]) if ids else None


def interface_of(address: str) -> str | None:
    """The name of this host's network interface that carries `address` (None if none does)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addresses):
            return name
    return None


def pin_gloo_interface() -> str | None:
    """Point gloo at the interface of this node's routable address (GLOO_SOCKET_IFNAME, unless already set).

    Without it gloo picks its address by resolving the host name, and falls back to loopback when the name does
    not resolve, or resolves to 127.0.1.1 (/etc/hosts): the ranks of an agent on other nodes then cannot reach
    this one. Returns the interface used (None: left to gloo).
    """
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return os.environ["GLOO_SOCKET_IFNAME"]
    try:
        address = node_ip_address()
    except Exception:  # noqa: BLE001 - outside Ray
        return None
    name = interface_of(address) if address and not address.startswith("127.") else None
    if name:
        os.environ["GLOO_SOCKET_IFNAME"] = name
    return name


def node_ip_address() -> str:
    """This node's address as the other nodes reach it (Ray's choice, the one its raylet registered with).

    Not `gethostbyname(gethostname())`: many hosts map their own name to 127.0.1.1 in /etc/hosts, which the
    ranks on other nodes of a multi-node agent cannot connect to.
    """
    import ray.util

    return ray.util.get_node_ip_address()


def rank_log_file(log_dir: str | Path, agent: str, rank: int) -> Path:
    """`<log_dir>/<agent>_rank<rank>.log`: where a rank's process output goes."""
    return Path(log_dir) / f"{agent}_rank{rank}.log"


def redirect_output(log_file: Path) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2, so also the engine processes it spawns
    and C++ libraries) to `log_file`, appending: third-party chatter belongs in the run's logs, not the console."""
    import sys

    log_file.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def engine_records(run_dir: str | Path) -> Path:
    """Where a run's engines record their processes and /dev/shm files (`engine_processes.record_engine`), so that
    the driver, and each rank on its own node, can sweep what a killed one left (`engine_processes.sweep_recorded`)."""
    return Path(run_dir) / "engines" / ".shm"

"""Sizes and content digests of checkpoint files, computed where the bytes are written and checked in parallel.

A run checkpoint's manifest (`runtime.run_checkpoint`) lists every file with its size and digest. pair_large's
checkpoint is ~1.3 TB: read back and hashed by the driver alone, on a shared file system, that took tens of
minutes per checkpoint and again on every resume. Instead each trainer rank hashes the files it wrote, right after
writing them (their pages are still in its node's cache), all ranks at once; the records travel to the driver
with the save's result, and the driver only lists the folder and compares sizes. On resume the digests are
checked by a pool of threads (`digest_files`; hashlib and blake3 release the GIL while they hash).

Which rank wrote which file of a Megatron `torch_dist` checkpoint: torch.distributed.checkpoint names the files of
global rank r `__<r>_<k>.distcp`; everything else (`.metadata`, `common.pt`, `metadata.json`, the trainer's own
JSON) is written by rank 0 (`written_by`).

A record is `{"bytes": size}` plus `"digest": hex` when an algorithm is given — the manifest's entry format.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

DIGEST_CHUNK = 8 << 20
_RANK_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")


def digest_algorithm() -> str:
    """`blake3` (fast, multi-threaded; shipped with vLLM) when importable, else `sha256`."""
    try:
        import blake3  # noqa: F401
    except ImportError:
        return "sha256"
    return "blake3"


def new_hasher(algorithm: str) -> Any:
    if algorithm == "blake3":
        import blake3

        return blake3.blake3(max_threads=blake3.blake3.AUTO)
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown digest algorithm {algorithm!r}")


def file_digest(path: Path, algorithm: str) -> str:
    """Hex digest of the file's content (read in chunks of `DIGEST_CHUNK`)."""
    hasher = new_hasher(algorithm)
    with Path(path).open("rb") as fh:
        while chunk := fh.read(DIGEST_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def bytes_record(data: bytes, algorithm: str | None) -> dict[str, Any]:
    """The record of a file whose content the writer still holds (no read back)."""
    record: dict[str, Any] = {"bytes": len(data)}
    if algorithm:
        hasher = new_hasher(algorithm)
        hasher.update(data)
        record["digest"] = hasher.hexdigest()
    return record


def file_record(path: Path, algorithm: str | None) -> dict[str, Any]:
    """`{"bytes": size[, "digest": hex]}` of one file."""
    record: dict[str, Any] = {"bytes": Path(path).stat().st_size}
    if algorithm:
        record["digest"] = file_digest(path, algorithm)
    return record


def written_by(name: str) -> int:
    """The global rank that writes file `name` of a torch_dist checkpoint: r for `__<r>_<k>.distcp`, else 0.

    >>> written_by("__3_0.distcp"), written_by(".metadata"), written_by("common.pt")
    (3, 0, 0)
    """
    match = _RANK_FILE.match(name)
    return int(match.group(1)) if match else 0


def own_files(directory: Path, rank: int) -> list[str]:
    """The files below `directory` (relative names, sorted) that `rank` wrote (`written_by` of the file name)."""
    directory = Path(directory)
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                  if p.is_file() and written_by(p.name) == rank)


def parallel_workers() -> int:
    """Threads for hashing several files at once: the CPUs this process may use, at least 4 (reading from a
    shared file system waits on the network more than on a CPU) and at most 16."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(4, min(16, cpus))


def digest_files(root: Path, names: Iterable[str], algorithm: str | None,
                 workers: int | None = None) -> dict[str, dict[str, Any]]:
    """The record of each file `root/name`, hashed by `workers` threads (default `parallel_workers()`), the
    largest files first so that one big file does not start last. An unreadable file raises (OSError)."""
    root = Path(root)
    names = sorted(names, key=lambda n: -(root / n).stat().st_size)
    if not names:
        return {}
    workers = workers or parallel_workers()
    if workers == 1 or len(names) == 1:
        return {name: file_record(root / name, algorithm) for name in names}
    with ThreadPoolExecutor(max_workers=min(workers, len(names)), thread_name_prefix="digest") as pool:
        records = pool.map(lambda name: file_record(root / name, algorithm), names)
        return dict(zip(names, records, strict=True))

"""Checkpoint hashing throughput: the driver hashing every file alone vs every writer hashing its own files.

    python benchmarks/checkpoint_hashing.py [--files 8] [--mb 32] [--writers 2] [--algorithms sha256 blake3]

Writes `--files` files of `--mb` MB of random bytes into a temporary folder and hashes them three ways with the
project's own functions (`nemo_hacpo.training.checkpoint_files`):

- **driver, serial**: one process, one file after the other (`file_digest`) — what the driver did after every
  save and again on resume before #26;
- **writers, parallel**: `--writers` processes, each hashing the files it has just written (its share, still in
  the page cache), all at once — what each trainer rank does now inside the save (`trainer_checkpoint`);
- **verify, thread pool**: one process, `digest_files` with its default threads — the resume-time check now.

Prints a table of MB/s, and pair_large's ~1.3 TB per checkpoint at those rates (the writers' row: 40 trainer ranks
hashing 1/40 each at the measured per-writer rate, assuming a core per rank). Caveats: the files are in this
machine's page cache, so this measures hashing, not a shared file system's reads — the driver's reads of 1.3 TB
over the network were the larger part of the old cost and are gone entirely from the save; blake3 uses several
threads per file by itself (`max_threads=AUTO`), so its serial row already uses every core.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import time
from pathlib import Path

PAIR_LARGE_BYTES = 1.3e12
PAIR_LARGE_RANKS = 40  # llama70b 32 + qwen8b 8


def _write(path: Path, megabytes: int) -> None:
    with path.open("wb") as fh:
        for _ in range(megabytes):
            fh.write(os.urandom(1 << 20))


def _writer(root: str, names: list[str], algorithm: str, barrier, queue) -> None:
    from nemo_hacpo.training.checkpoint_files import file_digest

    barrier.wait()
    start = time.monotonic()
    for name in names:
        file_digest(Path(root) / name, algorithm)
    queue.put((start, time.monotonic()))


def driver_serial(root: Path, names: list[str], algorithm: str) -> float:
    from nemo_hacpo.training.checkpoint_files import file_digest

    start = time.perf_counter()
    for name in names:
        file_digest(root / name, algorithm)
    return time.perf_counter() - start


def writers_parallel(root: Path, names: list[str], algorithm: str, writers: int) -> float:
    """Wall time from the common start to the last writer's end; writer w hashes names[w::writers]."""
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(writers), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(root), names[w::writers], algorithm, barrier, queue))
             for w in range(writers)]
    for proc in procs:
        proc.start()
    spans = [queue.get(timeout=3600) for _ in procs]
    for proc in procs:
        proc.join()
    return max(end for _, end in spans) - min(start for start, _ in spans)


def verify_pool(root: Path, names: list[str], algorithm: str) -> float:
    from nemo_hacpo.training.checkpoint_files import digest_files

    start = time.perf_counter()
    digest_files(root, names, algorithm)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--mb", type=int, default=32, help="MB per file")
    parser.add_argument("--writers", type=int, default=2, help="processes hashing their own files at once")
    parser.add_argument("--algorithms", nargs="+", default=["sha256", "blake3"])
    parser.add_argument("--repeat", type=int, default=2, help="best of this many runs per row")
    args = parser.parse_args()
    from nemo_hacpo.training.checkpoint_files import parallel_workers

    rows = []
    with tempfile.TemporaryDirectory(prefix="hash_bench_") as tmp:
        root = Path(tmp)
        names = [f"__{i % args.writers}_{i // args.writers}.distcp" for i in range(args.files)]
        for name in names:
            _write(root / name, args.mb)
        total_mb = args.files * args.mb * (1 << 20) / 1e6
        modes = (("driver, serial", driver_serial),
                 (f"writers, parallel ({args.writers} processes)",
                  lambda root, names, algorithm: writers_parallel(root, names, algorithm, args.writers)),
                 (f"verify, thread pool ({parallel_workers()} threads)", verify_pool))
        for algorithm in args.algorithms:
            for mode, run in modes:
                seconds = min(run(root, names, algorithm) for _ in range(args.repeat))
                rows.append((algorithm, mode, total_mb, seconds, total_mb / seconds))
    print(f"\n{args.files} files x {args.mb} MB, {os.cpu_count()} CPUs (best of {args.repeat})\n")
    print("| algorithm | mode | MB | s | MB/s | pair_large 1.3 TB |")
    print("|---|---|---:|---:|---:|---:|")
    for algorithm, mode, total, seconds, rate in rows:
        if mode.startswith("writers"):  # each writer's own rate, times 40 ranks with a core each
            per_writer = rate / args.writers
            projected = PAIR_LARGE_BYTES / 1e6 / (per_writer * PAIR_LARGE_RANKS)
        else:
            projected = PAIR_LARGE_BYTES / 1e6 / rate
        print(f"| {algorithm} | {mode} | {total:.0f} | {seconds:.2f} | {rate:.0f} | {projected / 60:.1f} min |")


if __name__ == "__main__":
    main()

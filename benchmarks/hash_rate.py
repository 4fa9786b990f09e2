"""In-memory hash rate of the checkpoint digests (blake3 on one thread and on its own threads, sha256): the
per-core rate `planning.host_memory.BLAKE3_GBPS_PER_CORE` that `--plan` uses for hashing in the writers.

    python benchmarks/hash_rate.py [--mib 256] [--repeats 4]

Prints one table row per algorithm: MB/s, the best of the repeats (a shared machine's noise only slows a run).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time


def best_rate(digest, data: bytes, repeats: int) -> float:
    """The best of `repeats` MB/s of `digest(data)`."""
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        digest(data)
        best = max(best, len(data) / (time.perf_counter() - start) / 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=256, help="bytes hashed per repeat (MiB of random data)")
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    data = os.urandom(args.mib << 20)
    rows = [("sha256", lambda d: hashlib.sha256(d).hexdigest())]
    try:
        import blake3

        rows = [("blake3, 1 thread", lambda d: blake3.blake3(d).hexdigest()),
                (f"blake3, AUTO threads ({os.cpu_count()} CPUs)",
                 lambda d: blake3.blake3(d, max_threads=blake3.blake3.AUTO).hexdigest())] + rows
    except ImportError:
        pass
    print("| digest | MB/s |\n|---|---|")
    for name, digest in rows:
        print(f"| {name} | {best_rate(digest, data, args.repeats):,.0f} |")


if __name__ == "__main__":
    main()

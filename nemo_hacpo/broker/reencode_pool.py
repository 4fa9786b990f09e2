"""Re-encoding in parallel worker processes.

`ReencodePool(num_workers)` splits a learner's cross samples into one chunk per worker and runs
`reencode_batch` in spawned processes (each holding its tokenizers, sent once per task as pickled bytes and
cached by digest). With `num_workers <= 1` everything runs in the calling process — the tokenizer's Rust
batch encoder is already fast; the pool is for production steps (2 agents × 1,024 responses × 4k tokens)
where the Python side of templating and checking would otherwise stall the driver.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import pickle
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from nemo_hacpo.broker.reencode import ReencodedSample, ReencodeError, reencode_batch

_WORKER_TOKENIZERS: dict[str, Any] = {}


def _init_worker() -> None:
    # One Rust thread per worker: the pool is the parallelism; nested thread pools would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"


def _worker_reencode(digest: str, payload: bytes, items: list, max_response_tokens: int,
                     chat_template: str | None, eos_token_id: int | None) -> list:
    tokenizer = _WORKER_TOKENIZERS.get(digest)
    if tokenizer is None:
        tokenizer = _WORKER_TOKENIZERS[digest] = pickle.loads(payload)
    return reencode_batch(items, tokenizer, max_response_tokens, chat_template=chat_template,
                          eos_token_id=eos_token_id)


class ReencodePool:
    """Parallel `reencode_batch`. Use as a context manager (or call `close()`)."""

    def __init__(self, num_workers: int = 0):
        if num_workers < 0:
            raise ValueError(f"num_workers must be ≥ 0, got {num_workers}")
        self.num_workers = num_workers
        self._executor: ProcessPoolExecutor | None = None
        # id(tokenizer) → (tokenizer, digest, pickled bytes); holding the tokenizer keeps its id unique
        self._payloads: dict[int, tuple[Any, str, bytes]] = {}

    def __enter__(self) -> ReencodePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def _payload(self, tokenizer: Any) -> tuple[str, bytes]:
        if id(tokenizer) not in self._payloads:
            payload = pickle.dumps(tokenizer)
            self._payloads[id(tokenizer)] = (tokenizer, hashlib.sha1(payload).hexdigest(), payload)
        _, digest, payload = self._payloads[id(tokenizer)]
        return digest, payload

    def reencode(self, items: Sequence[tuple], tokenizer: Any, max_response_tokens: int, *,
                 chat_template: str | None = None,
                 eos_token_id: int | None = None) -> list[ReencodedSample | ReencodeError]:
        """Same contract as `reencode_batch`, results in input order."""
        items = list(items)
        if self.num_workers <= 1 or len(items) < 2 * self.num_workers:
            return reencode_batch(items, tokenizer, max_response_tokens, chat_template=chat_template,
                                  eos_token_id=eos_token_id)
        if self._executor is None:
            self._executor = ProcessPoolExecutor(self.num_workers, mp_context=mp.get_context("spawn"),
                                                 initializer=_init_worker)
        digest, payload = self._payload(tokenizer)
        size = -(-len(items) // self.num_workers)
        futures = [self._executor.submit(_worker_reencode, digest, payload, items[start:start + size],
                                         max_response_tokens, chat_template, eos_token_id)
                   for start in range(0, len(items), size)]
        out: list[ReencodedSample | ReencodeError] = []
        for future in futures:
            out.extend(future.result())
        return out

"""A reward module whose import takes 3 GiB of address space (`bytes(n)` is calloc'd: no memory is touched), as
one that imports torch or loads a model does: tests/unit/rewards/test_custom_reward.py starts it in reward processes
with and without `reward.worker_memory_mb`."""

from __future__ import annotations

_MAPPED = len(bytes(3 << 30))


def matches(response: str, gold: str) -> bool:
    return response.strip() == gold

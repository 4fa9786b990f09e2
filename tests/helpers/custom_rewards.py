"""Reward functions for the tests of `reward.function` (tests/unit/rewards/test_custom_reward.py): imported by name
in the reward worker processes, as a user's module would be."""

from __future__ import annotations

from examples.own_task.reward import last_number_matches

__all__ = ["last_number_matches", "needs_3_gib", "one_argument", "raises", "returns_half", "returns_text"]

NOT_A_FUNCTION = 3


def raises(response: str, gold: str) -> bool:
    return {"only": True}[response]


def returns_half(response: str, gold: str) -> float:
    return 0.5


def returns_text(response: str, gold: str) -> str:
    return "yes"


def one_argument(response: str) -> bool:
    return True


def needs_3_gib(response: str, gold: str) -> bool:
    """Takes 3 GiB of address space, not of memory: `bytes(n)` is calloc'd, and fresh pages are never touched."""
    block = bytes(3 << 30)
    return len(block) > 0 and response.strip() == gold

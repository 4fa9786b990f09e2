"""Fixtures shared by the integration tests (helpers live in tests/helpers/)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.megatron_setup import gloo_world_of_one, megatron_parallel_state


@pytest.fixture(scope="module")
def megatron_world_size_1() -> Iterator[None]:
    """An in-process gloo world of one with Megatron's TP = PP = 1 state; destroyed after the module."""
    with gloo_world_of_one(), megatron_parallel_state(tp=1, pp=1):
        yield

"""Fixtures shared by the integration tests (helpers live in tests/helpers/)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.megatron_setup import gloo_world_of_one, megatron_parallel_state
from tests.helpers.runs import records_by_step, tiny_overrides


@pytest.fixture(scope="module")
def megatron_world_size_1() -> Iterator[None]:
    """An in-process gloo world of one with Megatron's TP = PP = 1 state; destroyed after the module."""
    with gloo_world_of_one(), megatron_parallel_state(tp=1, pp=1):
        yield


@pytest.fixture(scope="session")
def uninterrupted_tiny_run(tmp_path_factory) -> dict[int, dict]:
    """Every step's metrics of one uninterrupted 3-step run of pair_tiny_gpt (`tests.helpers.runs.tiny_overrides`),
    made once per session for every test that compares a resumed or stopped run with it."""
    import ray

    from nemo_hacpo.config import load_config
    from nemo_hacpo.runtime.loop import train

    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    try:
        assert train(load_config("pair_tiny_gpt", tiny_overrides(out, 3))) == 0
    finally:
        ray.shutdown()
    return records_by_step(out)

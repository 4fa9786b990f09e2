"""Fixtures shared by the integration tests (helpers live in tests/helpers/)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.megatron_setup import gloo_world_of_one, megatron_parallel_state
from tests.helpers.runs import records_by_step, tiny_overrides


@pytest.fixture(scope="module")
def megatron_world_size_1() -> Iterator[None]:
    """An in-process gloo world of one with Megatron's TP = PP = 1 state; destroyed after the module."""
    with gloo_world_of_one(), megatron_parallel_state(tp=1, pp=1):
        yield


@pytest.fixture(scope="session")
def uninterrupted_tiny_dir(tmp_path_factory) -> Path:
    """The output directory of one uninterrupted 3-step run of pair_tiny_gpt (`tests.helpers.runs.tiny_overrides`,
    with its final HF export), made once per session: tests/integration/runtime/test_train_loop.py checks what it
    wrote, and every test that compares a resumed or stopped run reads its metrics (`uninterrupted_tiny_run`).
    Their modules are one unit of work (`UNITS` in tests/conftest.py), so that a parallel run makes it once."""
    import ray

    from nemo_hacpo.config import load_config
    from nemo_hacpo.runtime.loop import train

    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    try:
        assert train(load_config("pair_tiny_gpt", tiny_overrides(out, 3, "runtime.save_hf=true"))) == 0
    finally:
        ray.shutdown()
    return out


@pytest.fixture(scope="session")
def uninterrupted_tiny_run(uninterrupted_tiny_dir) -> dict[int, dict]:
    """Every step's metrics of the session's uninterrupted run (`uninterrupted_tiny_dir`)."""
    return records_by_step(uninterrupted_tiny_dir)

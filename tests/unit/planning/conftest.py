"""The `large_env` fixture: pair_large's environment pointing at config.json-only checkpoint directories."""

from __future__ import annotations

import pytest

from tests.helpers.large_models import write_large_env


@pytest.fixture
def large_env(tmp_path, monkeypatch):
    return write_large_env(tmp_path, monkeypatch)

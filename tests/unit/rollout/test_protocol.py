"""RolloutEngine offers every call of the RolloutBackend seam, with compatible parameters (no engine started)."""

from __future__ import annotations

import inspect

from nemo_hacpo.rollout import RolloutBackend, RolloutEngine

MEMBERS = ("generate", "score", "refit", "sleep", "wake_up", "stats", "shutdown")


def test_engine_implements_the_backend_protocol():
    for name in MEMBERS:
        assert hasattr(RolloutBackend, name) and hasattr(RolloutEngine, name), name
        wanted, offered = getattr(RolloutBackend, name), getattr(RolloutEngine, name)
        if isinstance(wanted, property):
            assert isinstance(offered, property), name
            continue
        wanted_params = list(inspect.signature(wanted).parameters)
        offered_params = list(inspect.signature(offered).parameters)
        assert offered_params[:len(wanted_params)] == wanted_params, name

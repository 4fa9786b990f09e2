"""AgentGroup.get on real Ray actors: which rank a failure or a hang is blamed on, and how fast.

In a collective call every rank waits on the others, so when rank 1 dies, rank 0 stays blocked (NCCL) or fails
later with a connection error (gloo). The report must name the rank that died, at once, not whichever rank the
driver happened to wait on first.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from nemo_hacpo.runtime.groups import AgentGroup, WorkerFailure

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # real Ray actors: seconds each


class _Rank:
    def block(self, seconds: float) -> str:
        time.sleep(seconds)
        return "late"

    def die(self) -> None:
        os._exit(1)  # the process is gone, as after the OOM killer or a lost node

    def fail(self) -> None:
        raise RuntimeError("connection reset by peer")  # what a blocked peer sees once the dead rank is gone

    def ok(self, value: int) -> int:
        return value

    def peer_failed(self) -> None:  # what the other ranks of an engine group raise when one of them failed
        from nemo_hacpo.rollout.engine_group import PeerFailure

        raise PeerFailure("rank 1: stopped refit bucket 2 because rank 0 of its engine group [0, 1] failed: ...")

    def fail_after(self, seconds: float) -> None:
        time.sleep(seconds)
        raise RuntimeError("Worker failed with error 'CUDA error: out of memory'")


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(num_cpus=3, include_dashboard=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def _group(ray, world: int) -> AgentGroup:
    group = object.__new__(AgentGroup)  # the call logic only; the actors are plain ones, not trainers
    group.agent = SimpleNamespace(name="llama70b")
    group.call_timeout_s = 60.0
    group.log_dir = None
    group.actors = [ray.remote(num_cpus=1)(_Rank).remote() for _ in range(world)]
    ray.get([actor.ok.remote(0) for actor in group.actors])  # started: the deadlines below time calls, not start-up
    return group


def test_results_come_back_in_rank_order(ray_local):
    group = _group(ray_local, 3)
    futures = [group.actors[r].ok.remote(r * 10) for r in (2, 0, 1)]
    assert group.get(futures, "ok", ranks=[2, 0, 1]) == [20, 0, 10]
    for actor in group.actors:
        ray_local.kill(actor)


def test_a_dead_rank_is_named_at_once_while_its_peer_is_blocked(ray_local):
    group = _group(ray_local, 2)
    futures = [group.actors[0].block.remote(60), group.actors[1].die.remote()]
    with pytest.raises(WorkerFailure, match=r"agent 'llama70b' rank 1 failed in train: \w*Actor\w*Error"):
        group.get(futures, "train")
    # reported while rank 0 is still stuck in its call: the report did not wait for it
    assert ray_local.wait([futures[0]], timeout=0)[1] == [futures[0]]
    for actor in group.actors:
        ray_local.kill(actor)


def test_the_dead_rank_is_blamed_even_when_a_peer_reports_first(ray_local):
    group = _group(ray_local, 3)
    futures = [group.actors[0].fail.remote(), group.actors[1].ok.remote(1), group.actors[2].die.remote()]
    with pytest.raises(WorkerFailure, match=r"(?s)rank 2 failed in train: .*\(rank 0 failed too\)"):
        group.get(futures, "train")
    for actor in group.actors:
        ray_local.kill(actor)


def test_the_rank_that_failed_is_blamed_not_the_peer_that_stopped_because_of_it(ray_local):
    """Rank 1 reports first, but only with `PeerFailure` (it stopped because rank 0 of its engine group failed):
    the report names rank 0 and its own error. Before, whichever rank reported first was blamed."""
    group = _group(ray_local, 2)
    futures = [group.actors[0].fail_after.remote(1.0), group.actors[1].peer_failed.remote()]
    with pytest.raises(WorkerFailure, match=r"(?s)agent 'llama70b' rank 0 failed in refit: .*out of memory.*"
                                            r"\(rank 1 failed too\)"):
        group.get(futures, "refit")
    for actor in group.actors:
        ray_local.kill(actor)


def test_every_hung_rank_is_named(ray_local):
    group = _group(ray_local, 3)
    futures = [group.actors[0].ok.remote(0), group.actors[1].block.remote(60), group.actors[2].block.remote(60)]
    with pytest.raises(WorkerFailure, match=r"agent 'llama70b' ranks 1, 2 did not finish save within 2 s"):
        group.get(futures, "save", timeout_s=2.0)
    assert ray_local.wait(futures[1:], num_returns=2, timeout=0)[1] == futures[1:]  # given up on, still running
    for actor in group.actors:
        ray_local.kill(actor)


def _groups_left(ray, name: str) -> list[str]:
    from ray.util.placement_group import placement_group_table

    return [g["state"] for g in placement_group_table().values() if g["name"] == f"hacpo-{name}"
            and g["state"] != "REMOVED"]


def test_a_placement_that_cannot_be_reserved_is_given_back_and_named(ray_local):
    """Issue #41: placements are reserved before anything starts; one that does not fit in time is removed (not
    left pending, to be granted later to nobody) and the error names the agent and what was free."""
    from nemo_hacpo.runtime.groups import reserve_placement

    agent = SimpleNamespace(name="too_wide", parallel=SimpleNamespace(world_size=8))
    with pytest.raises(WorkerFailure, match=r"agent 'too_wide': Ray could not reserve 8 bundle\(s\) of \{'CPU': 1\}"):
        reserve_placement(agent, "cpu", timeout_s=1.0)
    assert _groups_left(ray_local, "too_wide") == []


def test_a_stop_signal_while_reserving_gives_the_placement_back(ray_local, monkeypatch):
    """A SIGTERM (the loop's `Terminated`, a KeyboardInterrupt) arriving while Ray reserves a placement: the group
    being reserved is not yet in the loop's list of placements to release, so the reservation removes it itself."""
    from nemo_hacpo.runtime.groups import reserve_placement
    from nemo_hacpo.runtime.loop import Terminated

    real_get = ray_local.get

    def interrupted(*args, **kwargs):
        monkeypatch.setattr(ray_local, "get", real_get)
        raise Terminated()

    monkeypatch.setattr(ray_local, "get", interrupted)
    agent = SimpleNamespace(name="stopped", parallel=SimpleNamespace(world_size=8))  # never fits: pending until removed
    with pytest.raises(Terminated):
        reserve_placement(agent, "cpu", timeout_s=60.0)
    assert _groups_left(ray_local, "stopped") == []

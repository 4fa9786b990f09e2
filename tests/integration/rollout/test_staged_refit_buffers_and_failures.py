"""The staged (`ipc`) refit's buffers and failures, with two real gloo ranks, real shared-memory staging buffers,
the engine's own process group and a small real engine that reads the buffers as vLLM's workers do
(`tests/helpers/staged_engine.py`). The vLLM-CPU end-to-end run of the same strategy is test_staged_refit.py.

* Buffers: a Llama-like export (the embedding over the bound first, the output head over the bound last) is staged
  in a bound-sized buffer, and each tensor over the bound in a buffer of its own, freed right after — as
  `refit_plan` says. Before this change the first reservation (the embedding's) stayed for the whole refit.
* Failures: when one engine worker's load fails, or one rank cannot stage its bucket, every rank of the group
  raises within seconds — the failed rank its own error, the others `PeerFailure` naming it — after draining the
  (collective) export. Before, the other rank waited in the bucket's barrier for the 30-minute collective timeout
  (the first case) or the engine rank in its gather (the second).
"""

from __future__ import annotations

import glob
import os

import pytest

from nemo_hacpo.rollout.refit import MIB
from tests.helpers.distributed import run_distributed

pytestmark = [pytest.mark.integration]

FLOATS = MIB // 4
SHAPES = {"embed": (6 * FLOATS,), "a": (FLOATS * 3 // 2,), "b": (FLOATS * 3 // 2,), "c": (FLOATS * 3 // 2,),
          "norm": (4,), "head": (6 * FLOATS,)}
BOUND = 4 * MIB
FAILURE_BOUND_S = 60.0
"""Far below the collective timeout (1,800 s), far above what the failure takes (well under a second)."""


def staged(what: str) -> dict:
    import time

    import torch
    import torch.distributed as dist

    from nemo_hacpo.rollout.engine_group import PeerFailure
    from nemo_hacpo.rollout.refit import StagedRefit
    from tests.helpers.staged_engine import LoadingEngine, collective_export, export_tensor

    rank = dist.get_rank()
    strategy = StagedRefit(rank, 2, engine_tp=2, device="cpu", bound=BOUND, tag=f"test_{what.replace(' ', '_')}")
    engine = LoadingEngine(2, fail_at=(2, 1) if what == "load fails" else None) if rank == 0 else None
    if what == "staging fails" and rank == 1:
        append = strategy.buffer.append

        def failing_append(name, tensor, offset):
            if name == "c":
                raise RuntimeError("CUDA error: out of memory (staging 'c')")
            return append(name, tensor, offset)

        strategy.buffer.append = failing_append
    yielded: list[str] = []
    start = time.monotonic()
    try:
        stats = strategy.refit(collective_export(SHAPES, yielded), engine)
        error = None
    except Exception as err:  # noqa: BLE001 - what each rank raised is the result
        stats, error = None, (type(err).__name__, str(err), isinstance(err, PeerFailure))
    seconds = time.monotonic() - start
    dist.barrier()  # the export was drained on both ranks: this collective is not stuck behind it
    out = {"pid": os.getpid(), "error": error, "seconds": seconds, "yielded": yielded, "allocations": strategy.buffer.allocations,
           "deliveries": [(d.tensors, d.nbytes, d.buffer) for d in strategy.deliveries]}
    if engine is not None and error is None:
        out["stats"] = (stats.tensors, stats.bytes)
        out["exact"] = all(torch.equal(engine.loaded[w][name], export_tensor(name, shape))
                           for w in range(2) for name, shape in SHAPES.items())
    strategy.close()
    return out


def _left_behind(what: str, *results: dict) -> list[str]:
    """Staging files these ranks left in /dev/shm (named with the writer's pid: a killed earlier run's are not)."""
    tag = f"test_{what.replace(' ', '_')}"
    return [f for r in results for f in glob.glob(f"/dev/shm/nemo_hacpo_refit_{tag}_{r['pid']}_*")]


def test_a_tensor_over_the_bound_travels_alone_in_a_buffer_freed_after_it():
    from nemo_hacpo.rollout.refit import refit_plan

    first, second = run_distributed(staged, 2, "ok", timeout_s=300)
    plan = refit_plan(SHAPES, 4, bound=BOUND, world=2, engine_tp=2, device="cpu", transport="ipc")
    assert first["error"] is None and second["error"] is None
    assert first["exact"] and first["stats"] == (6, plan.total_bytes)
    # engine rank: per bucket (tensors, bytes, the buffer it went through) — the plan's buckets and buffers
    assert first["deliveries"] == [(len(b.names), b.nbytes, b.buffer) for b in plan.buckets] == [
        (1, 6 * MIB, 6 * MIB), (2, 3 * MIB, 4 * MIB), (2, 1.5 * MIB + 16, 4 * MIB), (1, 6 * MIB, 6 * MIB)]
    # both ranks: the embedding's buffer, then the bound-sized one (reused for two buckets), then the head's
    assert first["allocations"] == second["allocations"] == [6 * MIB, 4 * MIB, 6 * MIB]
    assert not _left_behind("ok", first, second)


@pytest.mark.parametrize("what", ["load fails", "staging fails"])
def test_a_failure_on_one_rank_stops_every_rank_of_the_group_within_seconds(what):
    first, second = run_distributed(staged, 2, what, timeout_s=300)
    culprit, peer = (first, second) if what == "load fails" else (second, first)
    failed_rank = 0 if what == "load fails" else 1
    name, message, is_peer = culprit["error"]
    assert not is_peer and "out of memory" in message
    peer_name, peer_message, is_peer = peer["error"]
    assert is_peer and peer_name == "PeerFailure"
    assert f"rank {failed_rank} of its engine group [0, 1] failed: RuntimeError: " in peer_message
    assert "refit bucket" in peer_message
    for result in (first, second):
        assert result["seconds"] < FAILURE_BOUND_S
        assert result["yielded"] == list(SHAPES)  # the collective export was drained by both
    assert not _left_behind(what, first, second)

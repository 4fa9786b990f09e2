"""What every algorithm's short run through the loop must show (tests/integration/runtime/test_algorithms.py, and
trio_tiny on four Slurm nodes in tests/integration/slurm/test_multinode.py): the rollout accounting (HACPO generates
G per prompt per agent and trains on n·G; gspo_x2 generates and trains on 2G; isolated algorithms train on their
own G), the cross rows, the own rows' ratio of 1 at the first update, vLLM = trainer after every refit, and finite
metrics."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.helpers.runs import small_kv_cache

TINY = ["runtime.steps=2", "runtime.checkpoint_interval=0", "runtime.eval_interval=0", "runtime.logging=[jsonl]",
        "runtime.save_hf=false", "warmstart.enabled=false", "algo.batch_size=2", "algo.group_size=2",
        "algo.updates_per_step=2", "data.eval.size=2", "runtime.eval_samples=2", "reward.num_workers=0"]
B, G = 2, 2


def tiny_algo_overrides(n_agents: int) -> list[str]:
    """Two steps of B = 2 prompts × G = 2 samples, 12-token responses, an evaluation with 2 samples at the end, a
    small KV cache (`tests.helpers.runs.SMALL_KV_GIB`)."""
    per_agent = [f"agents.{i}.{key}" for i in range(n_agents)
                 for key in ("max_response_length=12", "parallel.micro_batch_size=2")]
    return TINY + per_agent + small_kv_cache(n_agents)


def check_last_record(last: dict, agents: list[str], *, shares: bool, samples: int, loss_keys: tuple[str, ...]):
    """The step-2 record of a `tiny_algo_overrides` run: `shares` (HACPO, naive: every other agent's rows
    brokered), `samples` generated per prompt, the loss's metrics `loss_keys`."""
    bad = {k: v for k, v in last.items() if k not in ("step", "time") and not math.isfinite(v)}
    assert not bad, f"non-finite metrics: {bad}"
    n = len(agents)
    for a in agents:
        assert last[f"{a}/rollouts_generated_total"] == 2 * B * samples  # 2 steps
        trained = B * samples * (n if shares else 1)
        assert last[f"{a}/sequences_trained_total"] == 2 * trained
        assert last[f"{a}/broker/self_rows"] == B * samples
        assert last.get(f"{a}/broker/cross_rows", 0) == (B * samples * (n - 1) if shares else 0)
        assert last[f"{a}/train/num_rows"] == trained  # the loss saw every row of the step once
        assert (f"{a}/adv/cross_mean" in last) == shares
        # own rows at the first update: the trainer's ratio against its own m_old, float noise only
        assert last[f"{a}/train/own_ratio_u0"] == pytest.approx(1.0, abs=1e-5)
        assert 1.0 <= last[f"{a}/mismatch_token_mult_prob_error"] < 1.01  # the refit kept vLLM = trainer
        for key in ("reward_mean", "accuracy", "capability", "response_length_mean", "truncation_rate",
                    "mismatch_token_mult_prob_error", "train/grad_norm", "train/lr", "train/loss",
                    "adv/self_mean", "generate_tokens_per_s", "train/tokens_per_s"):
            assert f"{a}/{key}" in last, key
        for key in loss_keys:
            assert f"{a}/train/{key}" in last, key
        for key in ("eval_accuracy", "eval/avg@2", "eval/pass@1", "eval/pass@2", "eval/response_length"):
            assert f"{a}/{key}" in last, key
        assert last[f"{a}/eval/pass@2"] >= last[f"{a}/eval/pass@1"] == pytest.approx(last[f"{a}/eval/avg@2"])


SEQUENCE = ("policy_loss", "kl_loss", "self_ratio_mean", "self_clip_active_frac")
SHARED = (*SEQUENCE, "cross_ratio_mean", "cross_zero_grad_frac", "cross_weight_mean", "cross_clip_lower")


def check_summary_header(out: Path) -> None:
    """The summary's table compares start and end on the same held-out problems, with avg@2 and pass@2."""
    header = (out / "summary.md").read_text().splitlines()[2]  # the table's header row
    assert "eval_accuracy_start" in header and "avg@2_start" in header and "pass@2_end" in header
    assert "| gained | lost | mcnemar_p |" in header

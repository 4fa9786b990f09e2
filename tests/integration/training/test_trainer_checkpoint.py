"""Trainer checkpoints (Megatron dist_checkpointing over gloo): save → load reproduces the next step.

Run A (2 ranks): a TP = 2 trainer (Adam, weight decay, warm-up + cosine LR, grad clipping, reference model
for β > 0) takes step 0, saves, takes step 1; then a DP = 2 trainer with the distributed optimizer does
the same. Run B (2 fresh ranks) builds both layouts from a different seed, loads, and takes step 1: every
metric and every weight must be bit-identical. Run C (1 rank) loads both checkpoints at TP = 1 / DP = 1
(resharding TP 2 → 1, and DP 2 → 1 for the distributed optimizer's "fully_reshardable" state): step 1
agrees within float tolerance. (Switching between the distributed and the plain optimizer is not
supported by Megatron's formats — the param-group metadata differ, KeyError 'pre_wd_mult' — and is refused
with a clear error.) The same rank checks that a never-updated trainer round-trips without optimizer state.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from tests.helpers.distributed import run_distributed
from tests.integration.training.tiny_setup import (
    assemble_full,
    comparable_metrics,
    local_parameters,
    mean_logprobs,
    plain_rows,
    tiny_agent,
    tiny_arch,
    token_rows,
    train,
    training_rows,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU/gloo test (GPU: tests/gpu/)"),
]

LAYOUTS = {"tp2": (2, 1), "dp2": (1, 2), "dp2-shards": (1, 2)}  # label → (tp, dp) of the saving run
FORMATS = {"dp2": "fully_reshardable", "dp2-shards": "dp_reshardable"}
"""The distributed optimizer's `checkpoint_format` per label: gathered over gloo onto DP rank 0, or written by
every rank (issue #26: reshardable along DP only, here DP 2 → 1)."""
RESHARD_ATOL = 1e-5


def _agent(tp: int, dp: int, distributed_optimizer: bool, checkpoint_format: str = "fully_reshardable"):
    from nemo_hacpo.config import OptimizerConfig

    optimizer = OptimizerConfig(name="adam", lr=1e-3, weight_decay=0.01, clip_grad=0.5, lr_warmup_steps=2,
                                lr_decay_style="cosine", min_lr=1e-4, use_distributed_optimizer=distributed_optimizer,
                                checkpoint_format=checkpoint_format)
    return dataclasses.replace(tiny_agent(tp=tp, dp=dp), optimizer=optimizer)


def _algo():
    from nemo_hacpo.config import AlgoConfig

    return AlgoConfig(updates_per_step=2, kl_coef=0.05)


def _trainer(tp: int, dp: int, seed: int, distributed_optimizer: bool, label: str = "tp2"):
    from nemo_hacpo.training import MegatronTrainer

    agent = _agent(tp, dp, distributed_optimizer, FORMATS.get(label, "fully_reshardable"))
    return MegatronTrainer(agent, tiny_arch(agent), seed=seed, total_updates=8, reference_model=True)


def _rows(trainer):
    token_ids, response_mask = token_rows(seed=3)
    plain = plain_rows(token_ids, response_mask)
    return training_rows(mean_logprobs(trainer, plain), seed=3)


def save_rank(directory: str) -> dict:
    """Step 0, save, step 1 — for each layout; plus a second save over an existing checkpoint."""
    out = {}
    for label, (tp, dp) in LAYOUTS.items():
        trainer = _trainer(tp, dp, seed=1234, distributed_optimizer=dp > 1, label=label)
        rows = _rows(trainer)
        train(trainer, rows, _algo(), step=0)
        trainer.save_checkpoint(f"{directory}/{label}", step=0)
        metrics = train(trainer, rows, _algo(), step=1)
        trainer.save_checkpoint(f"{directory}/{label}-replaced", step=0)
        trainer.save_checkpoint(f"{directory}/{label}-replaced", step=1)  # replaces the first
        out[label] = {"rows": rows, "metrics": comparable_metrics(metrics), "weights": local_parameters(trainer)}
        trainer.close()
    return out


def load_rank(directory: str, rows_by_label: dict, tp: int | None = None, dp: int | None = None) -> dict:
    """Fresh trainers (another seed) load each checkpoint and take step 1, at the saving layout or (tp, dp)."""
    out = {}
    for label, (saved_tp, saved_dp) in LAYOUTS.items():
        # The optimizer kind stays (Megatron's distributed and plain optimizer states are different formats).
        trainer = _trainer(tp or saved_tp, dp or saved_dp, seed=4321, distributed_optimizer=saved_dp > 1, label=label)
        meta = trainer.load_checkpoint(f"{directory}/{label}")
        metrics = train(trainer, rows_by_label[label], _algo(), step=1)
        out[label] = {"meta": meta, "metrics": comparable_metrics(metrics), "weights": local_parameters(trainer),
                      "updates_done": trainer.updates_done}
        trainer.close()
    return out


def single_rank(directory: str, rows_by_label: dict) -> dict:
    """World of 1: load both checkpoints at TP = 1 / DP = 1; then the edge cases below."""
    resharded = load_rank(directory, rows_by_label, 1, 1)

    # A never-updated trainer saves no optimizer state; loading it gives the same weights and next step.
    fresh = _trainer(1, 1, seed=5, distributed_optimizer=False)
    fresh.save_checkpoint(f"{directory}/fresh")
    fresh_metrics = train(fresh, rows_by_label["tp2"], _algo(), step=0)
    fresh.close()
    reloaded = _trainer(1, 1, seed=6, distributed_optimizer=False)
    reloaded.load_checkpoint(f"{directory}/fresh")
    reloaded_metrics = train(reloaded, rows_by_label["tp2"], _algo(), step=0)
    reloaded.close()

    # Plain optimizer state into a distributed optimizer: a clear error, not a KeyError deep in Megatron.
    other_kind = _trainer(1, 1, seed=7, distributed_optimizer=True)
    try:
        other_kind.load_checkpoint(f"{directory}/tp2")
        mismatch = ""
    except ValueError as error:
        mismatch = str(error)
    other_kind.close()
    return {"resharded": resharded, "fresh": (comparable_metrics(fresh_metrics), comparable_metrics(reloaded_metrics)),
            "mismatch": mismatch}


def test_save_then_load_reproduces_the_next_step(tmp_path: Path) -> None:
    saved = run_distributed(save_rank, 2, str(tmp_path))
    rows_by_label = {label: saved[0][label]["rows"] for label in LAYOUTS}
    loaded = run_distributed(load_rank, 2, str(tmp_path), rows_by_label)
    (single,) = run_distributed(single_rank, 1, str(tmp_path), rows_by_label)
    resharded = single["resharded"]
    assert single["fresh"][0] == single["fresh"][1]
    assert "use_distributed_optimizer to False" in single["mismatch"]

    for label in LAYOUTS:
        # Atomic writes: complete directories only, nothing left over; the second save replaced the first.
        assert (tmp_path / label / "nemo_hacpo_trainer.json").is_file()
        assert json.loads((tmp_path / f"{label}-replaced" / "nemo_hacpo_trainer.json").read_text())["step"] == 1
        leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith((".tmp", ".old"))]
        assert leftovers == []

        expected_metrics = saved[0][label]["metrics"]
        expected_weights = assemble_full([rank[label]["weights"] for rank in saved])
        # the KL term is live, and update 3 is past the 2-update warm-up: cosine decay from 1e-3 over 8 updates
        assert 0 < expected_metrics["kl_mean"] and expected_metrics["lr"] == pytest.approx(
            1e-4 + 0.9e-3 * (1 + math.cos(math.pi * 1 / 6)) / 2)
        for rank in loaded:
            assert rank[label]["meta"]["step"] == 0 and rank[label]["updates_done"] == 4
            assert rank[label]["meta"]["optimizer_format"] == FORMATS.get(label, "fully_reshardable")
            assert rank[label]["metrics"] == expected_metrics, label  # bit-identical, same layout
        same_layout = assemble_full([rank[label]["weights"] for rank in loaded])
        for name, weight in expected_weights.items():
            assert torch.equal(same_layout[name], weight), f"{label}: {name}"

        other_layout = resharded[label]
        assert other_layout["metrics"].keys() == expected_metrics.keys()
        for key, value in expected_metrics.items():
            assert other_layout["metrics"][key] == pytest.approx(value, abs=RESHARD_ATOL, nan_ok=True), f"{label}: {key}"
        reloaded = assemble_full([other_layout["weights"]])
        metric_gap = max(abs(other_layout["metrics"][k] - v) for k, v in expected_metrics.items() if v == v)
        weight_gap = max(float((reloaded[n] - w).abs().max()) for n, w in expected_weights.items())
        print(f"{label} → tp1/dp1: max |Δmetric| = {metric_gap:.1e}, max |Δweight| = {weight_gap:.1e}")  # with -s
        for name, weight in expected_weights.items():
            torch.testing.assert_close(reloaded[name], weight, rtol=0, atol=RESHARD_ATOL,
                                       msg=lambda m, n=name, lab=label: f"{lab} → tp1: {n}: {m}")

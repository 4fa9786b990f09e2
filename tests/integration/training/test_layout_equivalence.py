"""The trainer's loss and gradients do not depend on the layout: TP = 1 (micro-batch sizes 1, 2, 4, a
token budget, padding to a multiple of 16, sequence packing with and without a token budget), TP = 2,
PP = 2 (each also packed) and DP = 2 with the distributed optimizer agree on the same rows and weights.

A 1-rank run initialises the tiny model (seed 1234) and records its full weights W0, a perturbed copy W1,
and the rows (m_old from the TP = 1 trainer). Every layout then loads the shards of those weights and runs
one optimizer update (M = 1) for two objectives:
  * hacpo (β = 0) from W0: 8 self rows, 8 cross rows of which 4 are clipped (s > 1 or s < lo_0);
  * grpo with the KL term (β = 0.1): policy W1, reference model W0, old token log-probs recomputed.
Weights before and after the update are gathered back to the TP = 1 layout from every rank, and the
gradient is read off the update (Adam with lr = ε = 1000, whose first update is g / (1 + |g|/1000):
tests/integration/training/tiny_setup.py). Loss, every metric, each row's ratio and gradient flags (`TrainMetrics.rows`)
and the gradients must match within 1e-5
(measured: |Δloss| ≤ 8e-8 and |Δgrad| ≤ 1.2e-7, the fp32 resolution of the probe; unpacked PP = 2 is exact).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.distributed import run_distributed
from tests.integration.training.tiny_setup import (
    assemble_full,
    comparable_metrics,
    gradients,
    load_full_state,
    local_parameters,
    mean_logprobs,
    plain_rows,
    tiny_agent,
    tiny_arch,
    token_rows,
    training_rows,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU/gloo layout test (GPU: tests/gpu/)"),
]

ATOL = 1e-5
KL_COEF = 0.1
TP1_VARIANTS = {"mbs1": (1, None, None, False), "mbs2": (2, None, None, False), "mbs4": (4, None, None, False),
                "budget160": (4, 160, None, False), "pad16": (2, None, 16, False),
                "packed_mbs4": (4, None, None, True), "packed_budget160_pad16": (8, 160, 16, True)}
"""label → (micro_batch_size, max_tokens_per_micro_batch, pad_to_multiple, sequence_packing) of the TP = 1 runs."""
LAYOUTS = {"tp2": (2, 1, 1, False), "pp2": (1, 2, 1, False), "dp2": (1, 1, 2, False),
           "tp2_packed": (2, 1, 1, True), "pp2_packed": (1, 2, 1, True)}
"""label → (tp, pp, dp, sequence_packing) of the 2-rank runs."""


def _algo(name: str):
    from nemo_hacpo.config import AlgoConfig

    return AlgoConfig(name=name, updates_per_step=1, kl_coef=KL_COEF if name == "grpo" else 0.0)


def _run_objectives(agent, rows, w0, w1, max_tokens: int | None = None, pad_to_multiple: int | None = None,
                    packing: bool = False) -> dict:
    """One hacpo update from W0 and one grpo+KL update from W1 (reference W0), each by a fresh trainer
    (the gradient probe needs Adam's *first* update); metrics and weights before/after."""
    from nemo_hacpo.training import MegatronTrainer
    from nemo_hacpo.training.objective import Objective

    out = {}
    for objective in ("hacpo", "grpo_kl"):
        trainer = MegatronTrainer(agent, tiny_arch(agent), seed=99, reference_model=True,
                                  max_tokens_per_micro_batch=max_tokens, pad_to_multiple=pad_to_multiple,
                                  sequence_packing=packing)
        load_full_state(trainer, w0, module=trainer.reference)
        load_full_state(trainer, w0 if objective == "hacpo" else w1)
        before = local_parameters(trainer)
        result = trainer.train_step(rows, Objective.of(_algo("hacpo" if objective == "hacpo" else "grpo")), 0)
        out[objective] = {"metrics": comparable_metrics(result.flat()), "rows": result.rows, "before": before,
                          "after": local_parameters(trainer)}
        trainer.close()
    return out


def reference_rank() -> dict:
    """World of 1, TP = 1: weights, rows and the four micro-batching variants."""
    from nemo_hacpo.training import MegatronTrainer

    agent = tiny_agent()
    trainer = MegatronTrainer(agent, tiny_arch(agent), seed=1234)
    w0 = {name: value.clone() if isinstance(value, torch.Tensor) else value
          for name, value in trainer.module.state_dict().items()}
    generator = torch.Generator().manual_seed(7)
    w1 = {name: value + 0.02 * torch.randn(value.shape, generator=generator) if isinstance(value, torch.Tensor)
          else value for name, value in w0.items()}
    token_ids, response_mask = token_rows()
    rows_only = plain_rows(token_ids, response_mask)
    rows = training_rows(mean_logprobs(trainer, rows_only))
    trainer.close()
    runs = {label: _run_objectives(tiny_agent(micro_batch_size=size), rows, w0, w1, max_tokens, multiple, packing)
            for label, (size, max_tokens, multiple, packing) in TP1_VARIANTS.items()}
    return {"w0": w0, "w1": w1, "rows": rows, "runs": runs}


def layout_rank(w0: dict, w1: dict, rows) -> dict:
    """World of 2: the TP = 2, PP = 2 and DP = 2 layouts one after another; then DP = 2 scoring a single
    row (one replica has nothing to score but still joins the reduction)."""
    from nemo_hacpo.training import MegatronTrainer

    runs = {label: _run_objectives(tiny_agent(tp=tp, pp=pp, dp=dp), rows, w0, w1, packing=packing)
            for label, (tp, pp, dp, packing) in LAYOUTS.items()}
    agent = tiny_agent(dp=2)
    trainer = MegatronTrainer(agent, tiny_arch(agent), seed=99)
    load_full_state(trainer, w0)
    one_row = plain_rows(rows.token_ids[:1], rows.response_mask[:1])
    runs["dp2_one_row"] = mean_logprobs(trainer, one_row)
    trainer.close()
    return runs


def _full_gradients(rank_runs: list[dict], objective: str) -> dict[str, torch.Tensor]:
    before = assemble_full([run[objective]["before"] for run in rank_runs])
    after = assemble_full([run[objective]["after"] for run in rank_runs])
    return gradients(before, after)


def _assert_metrics_close(actual: dict, expected: dict, label: str) -> None:
    assert actual.keys() == expected.keys(), label
    for key, value in expected.items():
        assert actual[key] == pytest.approx(value, abs=ATOL, nan_ok=True), f"{label}: {key}"


def test_loss_and_gradients_agree_across_layouts_and_micro_batch_sizes() -> None:
    (reference,) = run_distributed(reference_rank, 1)
    layout_ranks = run_distributed(layout_rank, 2, reference["w0"], reference["w1"], reference["rows"])

    for rank_runs in layout_ranks:  # self row 0's behaviour log-prob is the TP = 1 m_old of that row
        assert rank_runs["dp2_one_row"].tolist() == pytest.approx([float(reference["rows"].old_mean_logprob[0])],
                                                                  abs=1e-6)
    runs = {label: [run] for label, run in reference["runs"].items()}
    runs |= {label: [rank_runs[label] for rank_runs in layout_ranks] for label in LAYOUTS}
    baseline = runs.pop("mbs2")

    for objective in ("hacpo", "grpo_kl"):
        expected_metrics = baseline[0][objective]["metrics"]
        expected_grads = _full_gradients(baseline, objective)
        # The case is not degenerate: real gradients everywhere, clipped cross rows, a live KL term.
        assert all(g.abs().max() > 1e-4 for g in expected_grads.values()), objective
        if objective == "hacpo":
            assert expected_metrics["cross_zero_grad_frac"] == pytest.approx(0.5)
            assert expected_metrics["self_ratio_mean"] == pytest.approx(1.0, abs=1e-6)
            # the per-row outcome (gathered over replicas / from the last stage): 4 of the 8 cross rows in the window
            outcome = baseline[0][objective]["rows"]
            assert sum(outcome.in_window[8:]) == 4 and outcome.ratio[:8] == pytest.approx([1.0] * 8, abs=1e-6)
        else:
            assert baseline[0][objective]["rows"] is None  # the token loss has no per-row ratio
            assert expected_metrics["kl_loss"] > 1e-4
            assert expected_metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # old = current weights
        for label, rank_runs in runs.items():
            actual_metrics = rank_runs[0][objective]["metrics"]
            _assert_metrics_close(actual_metrics, expected_metrics, f"{label}/{objective}")
            if objective == "hacpo":  # every rank of every layout reports every row, as the TP = 1 run
                for run in rank_runs:
                    outcome = run[objective]["rows"]
                    assert outcome.ratio == pytest.approx(baseline[0][objective]["rows"].ratio, abs=ATOL), label
                    assert outcome.in_window == baseline[0][objective]["rows"].in_window, label
                    assert outcome.gradient == baseline[0][objective]["rows"].gradient, label
            actual_grads = _full_gradients(rank_runs, objective)
            assert actual_grads.keys() == expected_grads.keys()
            grad_gap = max(float((actual_grads[n] - g).abs().max()) for n, g in expected_grads.items())
            print(f"{label}/{objective}: |Δloss| = {abs(actual_metrics['loss'] - expected_metrics['loss']):.1e}, "
                  f"max |Δgrad| = {grad_gap:.1e}")  # shown with -s: the measured agreement
            for name, expected in expected_grads.items():
                torch.testing.assert_close(actual_grads[name], expected, rtol=0, atol=ATOL,
                                           msg=lambda m, n=name, lab=label, o=objective: f"{lab}/{o} {n}: {m}")

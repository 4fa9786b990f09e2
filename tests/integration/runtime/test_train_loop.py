"""The whole step loop on CPU: Ray worker groups, Megatron trainers, vLLM engines, broker, checkpoints, export.

Tiny and short on purpose (random init, B = 2, G = 2, 16-token responses): this checks that every component
runs through the real code path, on the session's uninterrupted 3-step run (tests/integration/conftest.py), not
that the models learn (that is what `python recipes/train.py` shows, see the README and docs/quickstart.md). That a resumed run
continues exactly where the run stopped — its prompts, its metrics, no second evaluation at the step it resumes
from — is checked on the runs that stop: tests/integration/runtime/test_preemption_and_lock.py (SIGUSR1, then a
rerun) and test_resume_and_failures.py (SIGKILL and a damaged checkpoint).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nemo_hacpo.runtime.run_checkpoint import checkpoints, latest_checkpoint
from tests.helpers.runs import assert_prompts_as_drawn

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[3]


def test_three_steps_checkpoint_every_step_and_the_export_command_reproduces_the_final_export(
        uninterrupted_tiny_dir, tmp_path):
    out = uninterrupted_tiny_dir
    assert [c.step for c in checkpoints(out)] == [2, 3]  # a checkpoint every step, the last two kept
    assert all(c.problems() == [] for c in checkpoints(out))
    state = checkpoints(out)[0].load_driver_state()
    assert state["tracker"]["steps"] == 2 and state["totals"]["llama_tiny"]["sequences_trained"] == 16

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3]  # one start-of-run eval, then one record per step
    step3 = records[-1]
    for agent in ("llama_tiny", "gpt_tiny"):
        assert step3[f"{agent}/broker/self_rows"] == 4 and step3[f"{agent}/broker/cross_rows"] == 4
        assert step3[f"{agent}/sequences_trained_total"] == 24 and step3[f"{agent}/rollouts_generated_total"] == 12
        assert 1.0 <= step3[f"{agent}/mismatch_token_mult_prob_error"] < 1.01  # refit kept vLLM = trainer
        assert f"{agent}/train/grad_norm" in step3 and f"{agent}/eval_accuracy" in step3
    assert_prompts_as_drawn(out, steps=(1, 2, 3))
    assert "| llama_tiny |" in (out / "summary.md").read_text()
    assert (out / "reward_curve.png").is_file() and (out / "eval_accuracy.png").is_file()

    # the HF export command on the final checkpoint reproduces the run's own final export, tensor for tensor
    import importlib.util

    from safetensors.torch import load_file

    spec = importlib.util.spec_from_file_location("export_hf", REPO / "recipes" / "export_hf.py")
    export_hf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(export_hf)
    assert latest_checkpoint(out).step == 3
    assert export_hf.main(["--run", str(out), "--step", "3", "--agent", "gpt_tiny", "--out", str(tmp_path / "x")]) == 0
    exported = load_file(tmp_path / "x" / "gpt_tiny" / "model.safetensors")
    final = load_file(out / "hf" / "gpt_tiny" / "model.safetensors")
    assert exported.keys() == final.keys() and all(torch.equal(exported[k], final[k]) for k in final)
    assert export_hf.main(["--run", str(out), "--step", "7"]) == 2  # no such checkpoint: a clear error

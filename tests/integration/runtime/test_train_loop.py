"""The whole step loop on CPU: Ray worker groups, Megatron trainers, vLLM engines, broker, checkpoint, resume.

Tiny and short on purpose (random init, B = 2, G = 2, 16-token responses): this checks that every component
runs through the real code path and that resume continues exactly where the run stopped, not that the
models learn (that is what `python recipes/train.py` shows, see the README).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nemo_hacpo.broker import read_jsonl
from nemo_hacpo.config import load_config
from nemo_hacpo.data import PromptDataset
from nemo_hacpo.data.splits import load_split
from nemo_hacpo.runtime.run_checkpoint import latest_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[3]


def _config(out_dir, steps):
    return load_config("pair_tiny_gpt", [
        f"runtime.output_dir={out_dir}", f"runtime.steps={steps}", "runtime.checkpoint_interval=1",
        "runtime.eval_interval=0", "runtime.logging=[jsonl]", "warmstart.enabled=false",
        "algo.batch_size=2", "algo.group_size=2", "algo.updates_per_step=2",
        "agents.0.max_response_length=16", "agents.1.max_response_length=16",
        "agents.0.parallel.micro_batch_size=2", "agents.1.parallel.micro_batch_size=2",
        "data.eval.size=4", "reward.num_workers=0",
    ])


def test_two_steps_with_checkpoint_and_exact_resume(tmp_path):
    import ray

    from nemo_hacpo.runtime.loop import train

    out = tmp_path / "run"
    try:
        assert train(_config(out, steps=1)) == 0
        first = latest_checkpoint(out)
        assert first is not None and first.step == 1
        state = first.load_driver_state()
        assert state["tracker"]["steps"] == 1 and state["totals"]["llama_tiny"]["sequences_trained"] == 8

        assert train(_config(out, steps=2)) == 0  # resumes from step 1
    finally:
        ray.shutdown()

    assert latest_checkpoint(out).step == 2 and len(list((out / "checkpoints").glob("step_??????"))) == 2
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]  # one start-of-run eval, then steps 1 and 2 (no re-eval)
    step2 = records[-1]
    for agent in ("llama_tiny", "gpt_tiny"):
        assert step2[f"{agent}/broker/self_rows"] == 4 and step2[f"{agent}/broker/cross_rows"] == 4
        assert step2[f"{agent}/sequences_trained_total"] == 16 and step2[f"{agent}/rollouts_generated_total"] == 8
        assert 1.0 <= step2[f"{agent}/mismatch_token_mult_prob_error"] < 1.01  # refit kept vLLM = trainer
        assert f"{agent}/train/grad_norm" in step2 and f"{agent}/eval_accuracy" in step2
    # the resumed run drew exactly the prompts an uninterrupted run draws at step 2
    cfg = _config(out, 2)
    dataset = PromptDataset(load_split(cfg.data.train, "train"), seed=cfg.data.shuffle_seed)
    expected = [[p.id for p in dataset.next_batch(2)] for _ in range(2)]
    for step in (1, 2):
        ids = {t.prompt_id for t in read_jsonl(out / "rollouts" / f"step_{step:06d}.jsonl")}
        assert ids == set(expected[step - 1])
    assert "| llama_tiny |" in (out / "summary.md").read_text()
    assert (out / "reward_curve.png").is_file() and (out / "eval_accuracy.png").is_file()

    # the HF export command on the final checkpoint reproduces the run's own final export, tensor for tensor
    import importlib.util

    from safetensors.torch import load_file

    spec = importlib.util.spec_from_file_location("export_hf", REPO / "recipes" / "export_hf.py")
    export_hf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(export_hf)
    assert export_hf.main(["--run", str(out), "--step", "2", "--agent", "gpt_tiny", "--out", str(tmp_path / "x")]) == 0
    exported = load_file(tmp_path / "x" / "gpt_tiny" / "model.safetensors")
    final = load_file(out / "hf" / "gpt_tiny" / "model.safetensors")
    assert exported.keys() == final.keys() and all(torch.equal(exported[k], final[k]) for k in final)
    assert export_hf.main(["--run", str(out), "--step", "7"]) == 2  # no such checkpoint: a clear error

"""benchmarks/gpu_two_agent_step.py on CPU: argument checks, the agents it builds and the step table, by hand."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_two_agent_step as gpu

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "gpu_two_agent_step.py"


def test_defaults_and_quick_defaults():
    full, quick = gpu.parse_args([]), gpu.parse_args(["--quick"])
    assert (full.batch_size, full.group_size, full.response_len, full.steps, full.eager) == (16, 8, 512, 2, False)
    assert (quick.batch_size, quick.group_size, quick.response_len, quick.steps, quick.eager) == (4, 4, 128, 1, True)
    assert gpu.parse_args(["--quick", "--batch-size", "8"]).batch_size == 8
    assert gpu.validate_args(full) == [] and gpu.validate_args(quick) == []


@pytest.mark.parametrize(("argv", "message"), [
    (["--batch-size", "3", "--group-size", "3"], "do not split"),      # n·B·G = 18 rows vs 4 × 8
    (["--train-rows", "40"], "--train-rows 40 do not split"),
    (["--train-seq-len", "200"], "must exceed --prompt-len"),
    (["--response-len", "4000"], "positions"),
    (["--gpu-memory-utilization", "0.5"], "below 0.8"),
    (["--steps", "0"], "must be ≥ 1"),
])
def test_invalid_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        gpu.parse_args(argv)
    assert message in capsys.readouterr().err


def test_agents_are_the_advertised_shapes():
    from nemo_hacpo.models.architecture import model_arch

    args = gpu.parse_args([])
    llama = gpu.agent_config("llama_1b", *gpu.AGENTS["llama_1b"], args, gpu.mfu.PRECISIONS["bf16"])
    qwen = gpu.agent_config("qwen3_1p7b", *gpu.AGENTS["qwen3_1p7b"], args, gpu.mfu.PRECISIONS["bf16"])
    llama_arch, qwen_arch = model_arch(llama, 50257), model_arch(qwen, 151669)
    assert (llama_arch.family, qwen_arch.family) == ("llama", "qwen3")
    assert (qwen_arch.head_dim, qwen_arch.num_query_groups, qwen_arch.qk_layernorm) == (128, 8, True)
    assert llama.tokenizer.source == "gpt2" and qwen.tokenizer.source == "qwen3"
    assert llama.rollout.colocated and llama.rollout.gpu_memory_utilization == 0.15
    assert gpu.layers(gpu.QWEN3_1P7B, quick=True).num_layers == 4


def test_step_rows_by_hand():
    sample = {"time/generate_s": 2.0, "time/reward_s": 0.5, "time/logprob_s": 1.0, "time/broker_s": 0.25,
              "time/train_s": 4.0, "time/refit_s": 1.0,
              "a/response_length_mean": 100.0, "b/response_length_mean": 50.0,
              "a/generate_tokens_per_s": 400.0, "b/generate_tokens_per_s": 300.0,
              "a/train/tflops_per_gpu": 100.0, "a/train/step_time_s": 3.0, "a/train/tokens_per_s": 1000.0,
              "b/train/tflops_per_gpu": 50.0, "b/train/step_time_s": 4.0, "b/train/tokens_per_s": 500.0}
    rows = gpu.step_rows([sample, sample], ["a", "b"], batch=2, samples_per_prompt=4, peak=1000.0)
    by = {(r["what"], r["agent"]): r for r in rows}
    assert by[("generate", "both")]["tokens/s"] == pytest.approx(600.0)  # (100 + 50) · 2 · 4 / 2 s
    assert by[("generate", "a")]["tokens/s"] == 400.0
    both = by[("train", "both")]
    assert both["TFLOP/s"] == pytest.approx(125.0)  # (100 · 3 + 50 · 4) / 4 s
    assert both["MFU %"] == pytest.approx(12.5) and both["tokens/s"] == pytest.approx(1250.0)  # (3000 + 2000) / 4
    assert by[("train", "b")]["MFU %"] == pytest.approx(5.0)
    assert by[("whole step", "both")]["seconds"] == pytest.approx(8.75)
    assert math.isnan(gpu.step_rows([sample], ["a", "b"], 2, 4, peak=None)[0]["MFU %"])
    table = gpu.format_table(rows).splitlines()
    assert table[0].split() == ["part", "what", "agent", "precision", "seconds", "tokens/s", "TFLOP/s", "MFU", "%"]
    assert len(table) == len(rows) + 1


def test_check_runs_without_a_gpu():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check", "--quick"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "llama_1b (4 layers, gpt2 tokenizer)" in proc.stdout and "qwen3_1p7b (4 layers" in proc.stdout


def test_step_config_puts_both_agents_on_one_gpu(tmp_path):
    from nemo_hacpo.runtime.loop import HacpoRun

    args = gpu.parse_args(["--quick"])
    cfg = gpu.step_config(args, str(tmp_path))
    assert [a.name for a in cfg.agents] == ["llama_1b", "qwen3_1p7b"]
    assert [a.model.tiny.num_layers for a in cfg.agents] == [4, 4]
    assert all(a.precision.dtype == "bf16" and a.parallel.micro_batch_size == 8 for a in cfg.agents)
    assert (cfg.runtime.cluster.device, cfg.runtime.cluster.gpus_per_node, cfg.runtime.steps) == ("cuda", 1, 2)
    assert (cfg.algo.name, cfg.algo.batch_size, cfg.algo.group_size) == ("hacpo", 4, 4)
    run = HacpoRun(cfg)  # data and tracker only: no Ray, no GPU
    assert run.agents == ["llama_1b", "qwen3_1p7b"] and run.samples_per_prompt == 4

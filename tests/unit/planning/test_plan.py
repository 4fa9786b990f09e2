"""The --plan estimate with hand-computed numbers: exact parameter counts, every term of the 70B + 8B layout on
5 × 8 H100 (79.6 GiB each, two processes outside the allocator and NCCL counted), the engines' budget derived from
the generate phase, and every phase's refusal.

Before issue #26 the plan used 80 GiB, left out the contexts, NCCL, the export's doubled gather, vLLM's graph
pools and reload buffer, and said qwen8b trained in 68.0 GiB under a 72 limit; these tests fail on it. Issue #38
replaced its constants with the first H200 run's measurements (tests/unit/planning/test_gpu_memory.py): 2.42 GiB
per trainer process, 6.4 bytes per logit, SwiGLU/GQA/QK-norm-aware activations, CUDA graphs that stay on the GPU
while the engine sleeps, and FP8 weight copies that stay between steps.
"""

from __future__ import annotations

import pytest

from nemo_hacpo.config import load_config
from nemo_hacpo.models.architecture import arch_from_hf, model_arch
from nemo_hacpo.planning.gpu_memory import H100_REPORTED_GIB, pinned_gib, pow2ceil, stage_tensors
from nemo_hacpo.planning.plan import format_plan, parameter_counts, plan_agent, plan_run, total_parameters

GIB = 1024**3
# llama70b at tp=8, pp=4 — one TP rank of stage 0: the padded embedding (128256 → 129024 rows, a multiple of
# 128·8) / 8, and 20 layers of qkv (8192 + 2·1024)·8192/8, proj 8192²/8, fc1 2·28672·8192/8, fc2 8192·28672/8
# and two RMSNorm weights of 8192
LLAMA_LAYER = 10240 * 1024 + 8192 * 1024 + 2 * 28672 * 1024 + 8192 * 3584 + 2 * 8192  # 106,971,136
LLAMA_PS = 16128 * 8192 + 20 * LLAMA_LAYER  # 2,271,543,296
# all of it: embedding and lm_head 128256·8192 each, 80 layers of 855,654,400, the final norm
LLAMA_TOTAL = 2 * 128256 * 8192 + 80 * (8192 * 10240 + 8192 * 8192 + 3 * 28672 * 8192 + 2 * 8192) + 8192
# qwen8b at tp=2, pp=1: embedding and output 152064/2 rows each, 36 layers of qkv (4096 + 2·1024)·4096/2,
# proj 4096²/2, fc1 2·12288·4096/2, fc2 4096·12288/2, two norms of 4096 and the q/k norms of 128; final norm
QWEN_LAYER = 6144 * 2048 + 4096 * 2048 + 2 * 12288 * 2048 + 4096 * 6144 + 2 * 4096 + 2 * 128  # 96,477,440
QWEN_PS = 2 * 76032 * 4096 + 4096 + 36 * QWEN_LAYER  # 4,096,046,080
LIMIT = 0.9 * 79.6


def _plans(config: str = "pair_large", overrides: tuple[str, ...] = ()):
    cfg = load_config(config, list(overrides))
    return [plan_agent(agent, model_arch(agent), cfg) for agent in cfg.agents], cfg


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


def test_public_model_sizes_and_the_busiest_ranks_tensors(large_env):
    llama, qwen = arch_from_hf(large_env / "HACPO_LLAMA70B_PATH"), arch_from_hf(large_env / "HACPO_QWEN8B_PATH")
    assert total_parameters(llama) == LLAMA_TOTAL == 70_553_706_496
    assert total_parameters(qwen) == pytest.approx(8.19e9, rel=5e-3)
    assert sum(stage_tensors(llama, 8, 4)) == LLAMA_PS and sum(stage_tensors(qwen, 2, 1)) == QWEN_PS


def test_pair_large_every_term_by_hand(large_env):
    (llama, qwen), cfg = _plans()
    assert cfg.runtime.cluster.gpu_memory_gib == H100_REPORTED_GIB == 79.6  # what an H100 80 GB reports, not 80
    assert [p.gpus for p in (llama, qwen)] == [32, 8] and llama.fits and qwen.fits
    # two processes per GPU outside the allocator: a trainer 2.42 GiB (measured), a vLLM worker 1.60; NCCL 0.5 GiB per
    # communicator: llama's world, TP, pipeline and embedding groups + vLLM's TP group = 5; qwen's world, TP, DP + 1
    assert (llama.contexts, llama.nccl, qwen.contexts, qwen.nccl) == pytest.approx((4.02, 2.5, 4.02, 2.0))
    assert llama.weights == pytest.approx(2 * LLAMA_PS / GIB) == pytest.approx(4.2311, abs=1e-4)
    assert (llama.gradients, llama.optimizer) == pytest.approx((4 * LLAMA_PS / GIB, 12 * LLAMA_PS / GIB))  # dp = 1
    # activations per token and layer (Transformer Engine's attention, sequence parallel, tp 8): norms 8·8192/8,
    # Q, K, V, output 4·1024 + 4·128, SwiGLU 6·28672/8 = 34,304 bytes; · 80 layers · 4096 tokens
    assert llama.activations == pytest.approx(80 * 4096 * 34304 / GIB) == pytest.approx(10.469, abs=1e-3)
    assert llama.logits == pytest.approx(4096 * 16128 * 6.4 / GIB)  # 129024/8 vocabulary rows, 6.4 bytes each
    # + 1.5 GiB of the sleeping engine's CUDA graphs
    assert llama.train_total == pytest.approx(6.52 + 1.5 + 20 * LLAMA_PS / GIB + 80 * 4096 * 34304 / GIB
                                              + 4096 * 16128 * 6.4 / GIB)
    assert llama.train_total == pytest.approx(61.19, abs=0.01)
    # qwen8b, micro_batch_size 1: 11 bytes per parameter (2 weights + 4 grads + 12/4 optimizer + 2 reference);
    # activations per token and layer (tp 2, sequence parallel): norms 8·4096/2, attention 4·2048 + 4·512, QK-norm
    # 2·2048 + 2·512, SwiGLU 6·12288/2 = 68,608 bytes, · 36 layers · 4096 tokens; logits 4096 · 76032 · 6.4
    assert qwen.train_total == pytest.approx(6.02 + 1.5 + 11 * QWEN_PS / GIB + 36 * 4096 * 68608 / GIB
                                             + 4096 * 76032 * 6.4 / GIB)
    assert qwen.train_total == pytest.approx(60.76, abs=0.01)
    # checkpoint (engine asleep, its graphs on the GPU): the trainer's whole state, no gather on the GPU
    assert llama.checkpoint_total == pytest.approx(6.52 + 1.5 + 20 * LLAMA_PS / GIB) == pytest.approx(50.33, abs=0.01)
    # refit: the gathered 129024 × 8192 bf16 embedding twice (TP shards + their concatenation across the yield),
    # the staging buffer and the worker's copy of the embedding's bucket (128256 rows, 1.96 GiB each), vLLM's
    # layer-wise reload of its largest module (the embedding shard, 128256/8 rows), vLLM's weights and pools
    embedding = 128256 * 8192 * 2 / GIB
    assert llama.export_buffers == pytest.approx(2 * 129024 * 8192 * 2 / GIB)
    assert (llama.staging, llama.worker_copy) == pytest.approx((embedding, embedding))
    assert llama.reload_buffer == pytest.approx(16032 * 8192 * 2 / GIB)
    assert llama.refit_total == pytest.approx(6.52 + 4 * LLAMA_PS / GIB + LLAMA_TOTAL * 2 / 8 / GIB + 1.5
                                              + 2 * 129024 * 8192 * 2 / GIB + 2 * embedding + 16032 * 8192 * 2 / GIB)
    assert all(p.peak <= LIMIT for p in (llama, qwen))
    text = format_plan(plan_run(cfg, [model_arch(a) for a in cfg.agents]), cfg)
    assert "GPUs: 40 of 40 used; limit = 90% of each GPU's 79.6 GiB, CUDA contexts and NCCL counted;" in text
    assert "first offload of the train state per rank: llama70b ~14 s (29.6 GiB), qwen8b ~8 s (15.7 GiB)" in text
    assert "| agent | train | generate | refit | checkpoint | peak GiB/GPU (limit 71.6) | fits |" in text


def test_the_engines_budget_is_what_the_generate_phase_leaves(large_env):
    """gpu_memory_utilization: auto = ⌊(0.9 · 79.6 − processes − NCCL − resident) / 79.6⌋ to 0.01, and the KV cache
    the rest of vLLM's budget after its weights, activation peak and graph pools."""
    (llama, qwen), _ = _plans()
    resident = 4 * LLAMA_PS / GIB  # weights + reference (offload_train_state: optimizer state on the host)
    assert llama.vllm_utilization == 0.71  # (71.64 − 6.52 − 8.46) / 79.6 = 0.7118
    assert llama.generate_total == pytest.approx(6.52 + resident + 0.71 * 79.6)
    assert llama.generate_total <= LIMIT
    # vLLM's profiling peak: 16384 tokens · (2·8192 + 1280 + 3·28672/8) · 2 bytes + 1024 · 128256 · 4 · 2
    assert llama.vllm_activations == pytest.approx((16384 * 28416 * 2 + 1024 * 128256 * 8) / GIB)
    kv = 0.71 * 79.6 - LLAMA_TOTAL * 2 / 8 / GIB - llama.vllm_activations - 1.5
    assert llama.kv_cache == pytest.approx(kv) == pytest.approx(36.74, abs=0.01)
    # a 4096-token sequence: K and V · 80 layers · 1 KV head per GPU · 128 · 2 bytes per token
    assert llama.kv_cache_sequences == pytest.approx(kv * GIB / (2 * 80 * 128 * 2 * 4096))
    assert int(llama.kv_cache_sequences) == 235 and llama.requests_per_engine == 128 * 8 // 4
    assert qwen.vllm_utilization == 0.63  # (71.64 − 6.02 − 15.26) / 79.6 = 0.6327
    assert int(qwen.kv_cache_sequences) == 138  # 4 KV heads per GPU: 72 KiB per token, 288 MiB a sequence
    # the old fixed 0.35 left llama70b 8.1 GiB of KV cache for ~51 sequences of its 256 requests per engine
    (fixed, _), _ = _plans(overrides=("agents.0.rollout.gpu_memory_utilization=0.35",))
    assert fixed.kv_cache == pytest.approx(0.35 * 79.6 - LLAMA_TOTAL * 2 / 8 / GIB - fixed.vllm_activations - 1.5)
    assert int(fixed.kv_cache_sequences) == 51


def test_qwen8b_at_two_sequences_per_micro_batch_does_not_fit(large_env):
    """The choice of micro_batch_size 1: at 2 the activations (18.8) and the logits (3.7) double and qwen8b needs
    72.0 GiB, over the 71.64 limit; at 1 it needs 60.8."""
    (_, qwen2), _ = _plans(overrides=("agents.1.parallel.micro_batch_size=2",))
    assert qwen2.train_total == pytest.approx(6.02 + 1.5 + 11 * QWEN_PS / GIB + 2 * 36 * 4096 * 68608 / GIB
                                              + 2 * 4096 * 76032 * 6.4 / GIB) == pytest.approx(72.04, abs=0.01)
    assert not qwen2.fits and any(p.startswith("training needs ~72.0 GiB") for p in qwen2.problems)
    (_, qwen_offload), _ = _plans(overrides=("agents.1.parallel.micro_batch_size=2", "agents.1.offload_reference=true"))
    assert qwen_offload.train_total == pytest.approx(qwen2.train_total - 2 * QWEN_PS / GIB)  # only the reference


def test_fp8_training_adds_transformer_engines_weight_copies(large_env):
    """pair_large_fp8: 2 bytes per linear weight of the busiest rank (row- and column-wise FP8), in every phase:
    Transformer Engine keeps them between steps, also while vLLM generates (issue #38, item 9: the plan had them
    in training only, and its `auto` budget would have run the first wake out of memory)."""
    (llama, qwen), _ = _plans()
    (llama8, qwen8), cfg = _plans("pair_large_fp8")
    assert {a.precision.fp8 for a in cfg.agents} == {"e4m3"} and not any(a.precision.fp8_param for a in cfg.agents)
    linear_llama = 20 * (10240 * 1024 + 8192 * 1024 + 2 * 28672 * 1024 + 8192 * 3584)
    assert llama8.fp8_cache == pytest.approx(2 * linear_llama / GIB) == pytest.approx(3.99, abs=0.01)
    assert llama8.train_total == pytest.approx(llama.train_total + llama8.fp8_cache)
    assert qwen8.train_total == pytest.approx(qwen.train_total + 2 * 36 * (6144 * 2048 + 4096 * 2048
                                                                           + 3 * 12288 * 2048) / GIB)
    assert llama8.fits and qwen8.fits and max(qwen8.peak, llama8.peak) <= LIMIT
    assert llama8.resident == pytest.approx(llama.resident + llama8.fp8_cache)
    assert llama8.checkpoint_total == pytest.approx(llama.checkpoint_total + llama8.fp8_cache)
    assert llama8.refit_total == pytest.approx(llama.refit_total + llama8.fp8_cache)
    # the engines' budget shrinks by the copies: (71.64 − 6.52 − 8.46 − 3.99) / 79.6 = 0.662; qwen8b 0.551
    assert (llama8.vllm_utilization, qwen8.vllm_utilization) == (0.66, 0.55)
    assert llama8.generate_total == pytest.approx(6.52 + llama8.resident + 0.66 * 79.6)
    assert llama8.generate_total <= LIMIT


def test_a_layout_that_cannot_fit_is_refused(large_env):
    (llama, _), cfg = _plans(overrides=("agents.0.parallel.tp=2", "agents.0.parallel.pp=1", "agents.0.parallel.dp=16",
                                        "agents.0.rollout.tensor_parallel_size=2"))
    assert not llama.fits and any("training needs" in p for p in llama.problems)
    assert "✗ llama70b: training needs" in format_plan([llama], cfg)


def test_kv_cache_too_small_is_refused(large_env):
    (llama, _), _ = _plans(overrides=("agents.0.rollout.gpu_memory_utilization=0.2",))
    # 70B bf16 over vLLM tp=8 is 16.4 GiB per GPU + 1.8 activations + 1.5 graph pools > 0.2 · 79.6 = 15.9
    assert llama.kv_cache < 0 and any("KV cache" in p for p in llama.problems)


def test_generation_counts_what_the_trainer_keeps_on_the_gpu(large_env):
    # without offloading, the trainer keeps 20 bytes per parameter (42.3 GiB): auto leaves vLLM
    # (71.64 − 6.52 − 42.31) / 79.6 = 0.287 of the GPU, and a fixed 0.6 no longer fits next to it
    (kept, _), _ = _plans(overrides=("agents.0.offload_train_state=false",))
    resident = (2 + 4 + 12 + 2) * LLAMA_PS / GIB
    assert kept.resident == pytest.approx(resident)
    assert kept.vllm_utilization == 0.28 and kept.generate_total == pytest.approx(6.52 + resident + 0.28 * 79.6)
    (fixed, _), _ = _plans(overrides=("agents.0.rollout.gpu_memory_utilization=0.6", "agents.0.offload_train_state=false"))
    assert any(p.startswith("generation needs") and "resident" in p for p in fixed.problems), fixed.problems
    (offloaded, _), _ = _plans(overrides=("agents.0.offload_reference=true",))
    (base, _), _ = _plans()
    assert offloaded.reference == 0 and offloaded.resident == pytest.approx(base.resident - base.reference)
    assert offloaded.vllm_utilization == 0.76  # the reference's 4.2 GiB go to the KV cache


def test_nothing_left_for_the_engine_is_refused_with_the_fix(large_env):
    # pp=2, dp=2, the optimizer not sharded and kept on the GPU: 20 bytes per parameter of ~4.4B per rank
    (llama, _), _ = _plans(overrides=("agents.0.offload_train_state=false", "agents.0.parallel.pp=2",
                                      "agents.0.parallel.dp=2", "agents.0.optimizer.use_distributed_optimizer=false",
                                      "agents.0.optimizer.checkpoint_format=fully_reshardable"))
    assert llama.vllm_utilization <= 0 and any("nothing is left for vLLM" in p for p in llama.problems)


def test_each_phase_is_checked_on_its_own(large_env):
    # qwen8b without TP: its checkpoint (the whole trainer state at 4.1 · 2 = 8.2B parameters per rank) does not fit
    (_, qwen), _ = _plans(overrides=("agents.1.parallel.tp=1", "agents.1.parallel.dp=8",
                                     "agents.1.parallel.sequence_parallel=false", "agents.1.rollout.tensor_parallel_size=1"))
    assert any(p.startswith("saving a checkpoint needs") for p in qwen.problems), qwen.problems
    # the rpc refit has no staging bucket: only the gathered largest tensor twice (Qwen3-8B's 152064 × 4096 bf16
    # embedding at tp=2's padding) and the reload of vLLM's largest module (151936/2 embedding rows)
    (_, rpc), _ = _plans(overrides=("agents.1.rollout.refit_transport=rpc",))
    assert rpc.refit_buffers == pytest.approx((2 * 152064 * 4096 * 2 + 75968 * 4096 * 2) / GIB)


def test_pinned_buffers_round_up_to_powers_of_two():
    """torch's host caching allocator: every pinned block is the next power of two of its request."""
    assert [pow2ceil(n) for n in (1, 2, 3, 64, 65, 41_943_040)] == [1, 2, 4, 64, 128, 67_108_864]
    # llama70b's qkv shard (10,485,760 fp32 = 40 MiB) takes a 64 MiB block; Adam's three copies of it, 3 · 64 MiB
    assert pinned_gib([10_485_760], 4, copies=3) == pytest.approx(3 * 64 / 1024)
    assert pinned_gib([10], 4, shards=4) == 16 / GIB  # ⌈10/4⌉ = 3 elements · 4 bytes = 12 → a 16-byte block

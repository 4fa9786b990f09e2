"""Model specs → ModelArch → Megatron TransformerConfig: tiny specs, HF config.json dicts, padding, precision."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nemo_hacpo.config import ParallelConfig, PrecisionConfig, TinyModelSpec, load_config
from nemo_hacpo.models.architecture import (
    ModelArch,
    arch_from_hf,
    arch_from_hf_config,
    arch_from_recipe,
    arch_from_tiny,
    layer_spec,
    model_arch,
    transformer_config,
)

LLAMA_3_1_8B = {  # the fields of meta-llama/Llama-3.1-8B's config.json that matter (transformers 4 style)
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "max_position_embeddings": 131072, "hidden_act": "silu", "tie_word_embeddings": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
QWEN2_5_0_5B = {
    "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "max_position_embeddings": 32768, "hidden_act": "silu", "tie_word_embeddings": True,
}
QWEN3_0_6B = {  # head_dim 128 although hidden / heads = 1024 / 16 = 64
    "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960, "hidden_act": "silu",
    "tie_word_embeddings": True, "attention_bias": False,
}
MISTRAL_7B_V0_3 = {
    "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32768, "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0, "max_position_embeddings": 32768, "hidden_act": "silu", "sliding_window": None,
}
GPT2_SMALL = {
    "model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257,
    "layer_norm_epsilon": 1e-5, "activation_function": "gelu", "initializer_range": 0.02,
}


# --------------------------------------------------------------------------------------------- tiny specs
def test_pair_tiny_agents_map_to_llama_and_gpt2() -> None:
    llama_agent, gpt_agent = load_config("pair_tiny_gpt").agents
    llama = model_arch(llama_agent, tokenizer_vocab=1000)
    assert llama == ModelArch(
        family="llama", num_layers=4, hidden_size=256, num_attention_heads=4, num_query_groups=2, head_dim=64,
        ffn_hidden_size=512, vocab_size=1000, normalization="RMSNorm", norm_eps=1e-6, activation="swiglu",
        position_embedding="rope", rotary_base=10000.0, rope_scaling_factor=None, max_position_embeddings=512,
        tie_embeddings=False, qk_layernorm=False, add_bias_linear=False, add_qkv_bias=False, init_std=0.02)
    gpt = model_arch(gpt_agent, tokenizer_vocab=700)
    assert (gpt.family, gpt.num_layers, gpt.hidden_size, gpt.num_attention_heads, gpt.num_query_groups) == (
        "gpt2", 4, 128, 2, 2)
    assert (gpt.head_dim, gpt.vocab_size, gpt.norm_eps, gpt.tie_embeddings, gpt.add_bias_linear) == (
        64, 700, 1e-5, True, True)
    assert (gpt.normalization, gpt.activation, gpt.position_embedding) == ("LayerNorm", "gelu", "learned_absolute")
    with pytest.raises(ValueError, match="tokenizer's vocabulary size"):
        model_arch(llama_agent)


def test_tiny_specs_without_an_hf_twin_have_no_family() -> None:
    assert arch_from_tiny(TinyModelSpec(qk_layernorm=True), 100).family == "qwen3"
    assert arch_from_tiny(TinyModelSpec(activation="gelu"), 100).family is None  # RMSNorm + GELU
    gqa_gpt = TinyModelSpec(normalization="LayerNorm", activation="gelu", position_embedding="learned_absolute",
                            num_attention_heads=2, num_query_groups=1)
    assert arch_from_tiny(gqa_gpt, 100).family is None  # GPT-2 has no GQA
    assert arch_from_tiny(gqa_gpt, 100).add_bias_linear is False


# --------------------------------------------------------------------------------------------- HF config.json
def test_llama_3_1_config_with_llama3_rope_scaling() -> None:
    arch = arch_from_hf_config(LLAMA_3_1_8B)
    assert (arch.family, arch.num_layers, arch.hidden_size, arch.num_attention_heads, arch.num_query_groups) == (
        "llama", 32, 4096, 32, 8)
    assert (arch.head_dim, arch.ffn_hidden_size, arch.vocab_size, arch.norm_eps) == (128, 14336, 128256, 1e-5)
    assert (arch.rotary_base, arch.rope_scaling_factor, arch.tie_embeddings) == (500000.0, 8.0, False)
    assert (arch.qk_layernorm, arch.add_qkv_bias, arch.add_bias_linear) == (False, False, False)


def test_transformers_5_rope_parameters_are_read() -> None:
    """transformers ≥ 5 writes `rope_parameters` (theta and scaling together) instead of rope_theta/rope_scaling."""
    v5 = {k: v for k, v in LLAMA_3_1_8B.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = dict(LLAMA_3_1_8B["rope_scaling"], rope_theta=500000.0)
    assert arch_from_hf_config(v5) == arch_from_hf_config(LLAMA_3_1_8B)
    default = dict(v5, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    assert (arch_from_hf_config(default).rotary_base, arch_from_hf_config(default).rope_scaling_factor) == (1e6, None)


def test_qwen2_has_qkv_bias_and_tied_embeddings() -> None:
    arch = arch_from_hf_config(QWEN2_5_0_5B)
    assert (arch.family, arch.head_dim, arch.num_query_groups) == ("qwen2", 64, 2)
    assert (arch.add_qkv_bias, arch.add_bias_linear, arch.qk_layernorm, arch.tie_embeddings) == (True, False, False,
                                                                                               True)


def test_qwen3_head_dim_is_read_and_qk_norm_is_on() -> None:
    arch = arch_from_hf_config(QWEN3_0_6B)
    assert (arch.family, arch.head_dim, arch.hidden_size, arch.qk_layernorm, arch.add_qkv_bias) == (
        "qwen3", 128, 1024, True, False)


def test_mistral_and_gpt2_configs() -> None:
    mistral = arch_from_hf_config(MISTRAL_7B_V0_3)
    assert (mistral.family, mistral.head_dim, mistral.rotary_base, mistral.tie_embeddings) == (
        "mistral", 128, 1e6, False)
    gpt2 = arch_from_hf_config(GPT2_SMALL)
    assert (gpt2.family, gpt2.head_dim, gpt2.ffn_hidden_size, gpt2.max_position_embeddings) == ("gpt2", 64, 3072, 1024)
    assert (gpt2.normalization, gpt2.activation, gpt2.position_embedding) == ("LayerNorm", "gelu", "learned_absolute")
    assert (gpt2.tie_embeddings, gpt2.add_bias_linear, gpt2.num_query_groups) == (True, True, 12)


@pytest.mark.parametrize(("config", "message"), [
    ({**GPT2_SMALL, "model_type": "gemma"}, "unsupported HF model_type 'gemma'"),
    ({**GPT2_SMALL, "activation_function": "gelu_new"}, "exact erf form"),
    ({k: v for k, v in GPT2_SMALL.items() if k != "activation_function"}, "'gelu_new'"),  # HF's default
    ({**LLAMA_3_1_8B, "hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({**LLAMA_3_1_8B, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "'yarn' is not supported"),
    ({**LLAMA_3_1_8B, "rope_scaling": {**LLAMA_3_1_8B["rope_scaling"], "low_freq_factor": 2.0}}, "fixed low/high"),
    ({**LLAMA_3_1_8B, "attention_bias": True}, "attention_bias"),
    ({**LLAMA_3_1_8B, "mlp_bias": True}, "mlp_bias"),
    ({**QWEN3_0_6B, "attention_bias": True}, "attention_bias"),
])
def test_unsupported_hf_configs_raise(config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        arch_from_hf_config(config)


def test_arch_from_a_local_checkpoint_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_0_6B))
    assert arch_from_hf(tmp_path) == arch_from_hf_config(QWEN3_0_6B)
    with pytest.raises(FileNotFoundError, match="never downloaded"):
        arch_from_hf(tmp_path / "missing")


def test_recipes_need_megatron_bridge() -> None:
    with pytest.raises(ImportError, match="Megatron-Bridge"):
        arch_from_recipe("llama3_8b")


# --------------------------------------------------------------------------------------------- vocabulary
@pytest.mark.parametrize(("vocab", "tp", "padded"), [
    (500, 1, 512), (500, 2, 512), (500, 8, 1024), (512, 1, 512), (513, 1, 640), (513, 2, 768),
    (128256, 1, 128256), (128256, 8, 129024),  # 128256 = 1002 · 128; / 1024 = 125.25 → 126 · 1024
    (151936, 8, 152576),  # 151936 / 1024 = 148.4 → 149 · 1024
])
def test_padded_vocab_is_the_next_multiple_of_128_tp(vocab: int, tp: int, padded: int) -> None:
    arch = dataclasses.replace(arch_from_hf_config(QWEN2_5_0_5B), vocab_size=vocab)
    assert arch.padded_vocab_size(tp) == padded


# --------------------------------------------------------------------------------------------- TransformerConfig
def test_cpu_transformer_config_fields() -> None:
    llama_agent, gpt_agent = load_config("pair_tiny_gpt").agents
    llama = transformer_config(model_arch(llama_agent, 1000), ParallelConfig(tp=2, pp=2), PrecisionConfig())
    assert (llama.num_layers, llama.hidden_size, llama.ffn_hidden_size, llama.kv_channels) == (4, 256, 512, 64)
    assert (llama.num_attention_heads, llama.num_query_groups, llama.normalization) == (4, 2, "RMSNorm")
    assert (llama.gated_linear_unit, llama.activation_func, llama.layernorm_epsilon) == (True, F.silu, 1e-6)
    assert (llama.add_bias_linear, llama.add_qkv_bias, llama.qk_layernorm) == (False, False, False)
    assert (llama.tensor_model_parallel_size, llama.pipeline_model_parallel_size) == (2, 2)
    assert (llama.params_dtype, llama.bf16, llama.fp8) == (torch.float32, False, None)
    assert (llama.hidden_dropout, llama.attention_dropout) == (0.0, 0.0)
    assert not any((llama.bias_dropout_fusion, llama.apply_rope_fusion, llama.masked_softmax_fusion,
                    llama.bias_activation_fusion, llama.gradient_accumulation_fusion))

    gpt = transformer_config(model_arch(gpt_agent, 1000), ParallelConfig(), PrecisionConfig())
    assert (gpt.gated_linear_unit, gpt.activation_func, gpt.normalization) == (False, F.gelu, "LayerNorm")
    assert (gpt.add_bias_linear, gpt.add_qkv_bias, gpt.layernorm_epsilon) == (True, True, 1e-5)
    qwen2 = transformer_config(arch_from_hf_config(QWEN2_5_0_5B), ParallelConfig(), PrecisionConfig())
    assert (qwen2.add_bias_linear, qwen2.add_qkv_bias) == (False, True)


@pytest.mark.parametrize("precision", [PrecisionConfig(dtype="bf16"), PrecisionConfig(fp8="e4m3")])
def test_cpu_refuses_bf16_and_fp8(precision: PrecisionConfig) -> None:
    with pytest.raises(ValueError, match="CPU training runs in fp32"):
        transformer_config(arch_from_hf_config(GPT2_SMALL), ParallelConfig(), precision)


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise", "mxfp8"])
def test_gpu_fp8_fields_are_mapped(recipe: str) -> None:
    """TransformerConfig(device="cuda") builds without CUDA for learned positions (the RoPE fusion alone
    checks for Transformer Engine), so the FP8 mapping is checked on Megatron's own config object."""
    precision = PrecisionConfig(dtype="bf16", fp8="hybrid", fp8_recipe=recipe, fp8_param=True,
                                num_layers_at_start_in_bf16=2, num_layers_at_end_in_bf16=1)
    config = transformer_config(arch_from_hf_config(GPT2_SMALL), ParallelConfig(tp=2), precision, device="cuda")
    assert (config.fp8, config.fp8_recipe, config.fp8_param) == ("hybrid", recipe, True)
    assert (config.first_last_layers_bf16, config.num_layers_at_start_in_bf16, config.num_layers_at_end_in_bf16) == (
        True, 2, 1)
    assert (config.params_dtype, config.pipeline_dtype, config.bf16, config.fp16) == (
        torch.bfloat16, torch.bfloat16, True, False)
    assert config.bias_dropout_fusion and config.bias_activation_fusion
    assert not config.apply_rope_fusion  # learned positions


def test_a_cuda_config_without_transformer_engine_builds_with_the_fusions_that_exist() -> None:
    """Issue #38, item 1: on an H200 with torch + megatron-core and no Transformer Engine the trainer stopped at
    start-up ("apply_rope_fusion is not available. Please install TE >= 1.4"). This machine has neither Transformer
    Engine nor the compiled softmax extension, as that GPU had not: the config builds, with the jit fusions on and
    the two kernel fusions off."""
    config = transformer_config(arch_from_hf_config(LLAMA_3_1_8B), ParallelConfig(tp=8), PrecisionConfig(dtype="bf16"),
                                device="cuda")
    assert (config.fp8, config.bf16, config.num_query_groups, config.kv_channels) == (None, True, 8, 128)
    assert (config.apply_rope_fusion, config.masked_softmax_fusion) == (False, False)
    assert (config.bias_dropout_fusion, config.bias_activation_fusion) == (True, True)


def test_cuda_fusions_follow_their_kernels_and_the_architecture() -> None:
    from nemo_hacpo.models.architecture import cuda_fusions

    llama, gpt2 = arch_from_hf_config(LLAMA_3_1_8B), arch_from_hf_config(GPT2_SMALL)
    assert not any(cuda_fusions(llama, on_gpu=False).values())
    with_te = cuda_fusions(llama, on_gpu=True, rope_kernel=True, softmax_kernel=True)
    assert with_te == dict(bias_dropout_fusion=True, apply_rope_fusion=True, masked_softmax_fusion=True,
                           bias_activation_fusion=True)
    assert not cuda_fusions(gpt2, on_gpu=True, rope_kernel=True, softmax_kernel=False)["apply_rope_fusion"]
    assert cuda_fusions(gpt2, on_gpu=True, rope_kernel=True, softmax_kernel=False)["bias_activation_fusion"]  # biased
    unbiased_gelu = dataclasses.replace(gpt2, add_bias_linear=False)  # megatron-core refuses the fusion for it
    assert not cuda_fusions(unbiased_gelu, on_gpu=True)["bias_activation_fusion"]


def test_delayed_fp8_with_bf16_edge_layers_is_refused_by_megatron() -> None:
    """The config default first_last_layers_bf16=True is incompatible with the delayed recipe."""
    precision = PrecisionConfig(dtype="bf16", fp8="hybrid", fp8_recipe="delayed")
    with pytest.raises(ValueError, match="Delayed scaling does not support first / last layer in BF16"):
        transformer_config(arch_from_hf_config(GPT2_SMALL), ParallelConfig(), precision, device="cuda")
    ok = transformer_config(arch_from_hf_config(GPT2_SMALL), ParallelConfig(),
                            dataclasses.replace(precision, first_last_layers_bf16=False), device="cuda")
    assert (ok.fp8_recipe, ok.first_last_layers_bf16) == ("delayed", False)


def test_transformer_engine_spec_needs_transformer_engine() -> None:
    arch = arch_from_hf_config(QWEN3_0_6B)
    with pytest.raises(ImportError, match="transformer-engine"):
        layer_spec(arch, use_te=True)
    from megatron.core.transformer.identity_op import IdentityOp

    with_qk_norm = layer_spec(arch, use_te=False).submodules.self_attention.submodules
    without = layer_spec(arch_from_hf_config(QWEN2_5_0_5B), use_te=False).submodules.self_attention.submodules
    assert with_qk_norm.q_layernorm is not IdentityOp and with_qk_norm.k_layernorm is not IdentityOp
    assert without.q_layernorm is IdentityOp

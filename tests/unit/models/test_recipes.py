"""NeMo-framework (Megatron-Bridge) recipes → ModelArch + default layout, without Megatron-Bridge installed.

Megatron-Bridge cannot be installed on the CPU machines, so these tests pin *our* side: the error where it
is missing, the recipe-name resolution against a namespace shaped like `megatron.bridge.recipes`, and the
mapping of a provider's fields onto `ModelArch`. The providers below are plain dataclasses carrying the field
names of Megatron-Bridge's `GPTModelProvider` (a `TransformerConfig`), of its 0.1-era `Llama31ModelProvider`
(`scale_factor`, …) and of its builder-backed `ModelConfig` (GPT fields outside, transformer fields in a
nested `transformer`), with the values Bridge's HF conversion gives (`CONFIG_MAPPING`: max_position_embeddings
→ seq_length, rms_norm_eps → layernorm_epsilon, …). Each is checked against `arch_from_hf_config` of the
same model's config.json: the two mappings must agree.
"""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch.nn.functional as F

from nemo_hacpo.config import AgentConfig, ModelSource
from nemo_hacpo.models.architecture import (
    RecipeLayout,
    arch_from_hf_config,
    arch_from_provider,
    arch_from_recipe,
    layout_from_provider,
    model_arch,
    recipe_model,
    resolve_recipe,
)

LLAMA_3_1_8B_HF = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "max_position_embeddings": 131072, "hidden_act": "silu", "tie_word_embeddings": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
QWEN3_8B_HF = {
    "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960, "hidden_act": "silu",
    "tie_word_embeddings": False,
}
QWEN2_5_7B_HF = {
    "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "max_position_embeddings": 32768, "hidden_act": "silu", "tie_word_embeddings": False,
}


@dataclass
class FakeGPTProvider:
    """The GPTModelProvider / TransformerConfig fields `arch_from_provider` reads (Bridge's defaults)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int | None = None
    num_query_groups: int | None = None
    kv_channels: int | None = None
    vocab_size: int | None = None
    normalization: str = "RMSNorm"
    layernorm_epsilon: float = 1e-5
    activation_func: Any = F.silu
    gated_linear_unit: bool = True
    position_embedding_type: str = "rope"
    rotary_base: int = 10000
    rotary_percent: float = 1.0
    rope_scaling: bool = False
    rope_scaling_factor: float = 1.0
    seq_len_interpolation_factor: float | None = None
    seq_length: int = 1024
    share_embeddings_and_output_weights: bool = False
    qk_layernorm: bool = False
    add_bias_linear: bool = False
    add_qkv_bias: bool = False
    init_method_std: float = 0.02
    num_moe_experts: int | None = None
    multi_latent_attention: bool = False
    window_size: tuple[int, int] | None = None
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    sequence_parallel: bool = False
    virtual_pipeline_model_parallel_size: int | None = None
    hf_model_id: str | None = None


def llama31_8b(**overrides: Any) -> FakeGPTProvider:
    """What Bridge's LlamaBridge makes of Llama-3.1-8B (rope_type llama3 → rope_scaling, factor 8)."""
    return dataclasses.replace(FakeGPTProvider(
        num_layers=32, hidden_size=4096, num_attention_heads=32, ffn_hidden_size=14336, num_query_groups=8,
        vocab_size=128256, layernorm_epsilon=1e-5, rotary_base=500000, rope_scaling=True, rope_scaling_factor=8.0,
        seq_length=131072, hf_model_id="meta-llama/Llama-3.1-8B"), **overrides)


def test_llama31_provider_maps_like_its_hf_config() -> None:
    assert arch_from_provider(llama31_8b()) == arch_from_hf_config(LLAMA_3_1_8B_HF)


def test_qwen3_and_qwen2_providers_map_like_their_hf_configs() -> None:
    qwen3 = FakeGPTProvider(num_layers=36, hidden_size=4096, num_attention_heads=32, ffn_hidden_size=12288,
                            num_query_groups=8, kv_channels=128, vocab_size=151936, layernorm_epsilon=1e-6,
                            rotary_base=1000000, seq_length=40960, qk_layernorm=True)
    assert arch_from_provider(qwen3) == arch_from_hf_config(QWEN3_8B_HF)
    qwen2 = FakeGPTProvider(num_layers=28, hidden_size=3584, num_attention_heads=28, ffn_hidden_size=18944,
                            num_query_groups=4, vocab_size=152064, layernorm_epsilon=1e-6, rotary_base=1000000,
                            seq_length=32768, add_qkv_bias=True)
    assert arch_from_provider(qwen2) == arch_from_hf_config(QWEN2_5_7B_HF)


def test_defaults_fill_unset_fields() -> None:
    """num_query_groups None → heads, kv_channels None → hidden/heads, ffn None → 4·hidden, vocab from the caller."""
    arch = arch_from_provider(FakeGPTProvider(num_layers=2, hidden_size=256, num_attention_heads=4), vocab_size=1000)
    assert (arch.num_query_groups, arch.head_dim, arch.ffn_hidden_size, arch.vocab_size) == (4, 64, 1024, 1000)
    assert arch.family == "llama" and arch.rope_scaling_factor is None and arch.max_position_embeddings == 1024
    with pytest.raises(ValueError, match="no vocab_size"):
        arch_from_provider(FakeGPTProvider(num_layers=2, hidden_size=256, num_attention_heads=4))


def test_gpt2_like_provider() -> None:
    provider = FakeGPTProvider(num_layers=12, hidden_size=768, num_attention_heads=12, ffn_hidden_size=3072,
                               vocab_size=50257, normalization="LayerNorm", activation_func=F.gelu,
                               gated_linear_unit=False, position_embedding_type="learned_absolute",
                               add_bias_linear=True, share_embeddings_and_output_weights=True, seq_length=1024)
    arch = arch_from_provider(provider)
    assert (arch.family, arch.activation, arch.position_embedding, arch.tie_embeddings) == (
        "gpt2", "gelu", "learned_absolute", True)
    assert arch.add_bias_linear and not arch.add_qkv_bias  # QKV biases are part of add_bias_linear


@dataclass
class FakeLlama31ProviderV01(FakeGPTProvider):
    """Bridge 0.1's `Llama31ModelProvider`: RoPE scaling in `scale_factor` and three fixed companions."""

    scale_factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    old_context_len: int = 8192


def test_legacy_llama31_scale_factor() -> None:
    base = dataclasses.asdict(llama31_8b(rope_scaling=False, rope_scaling_factor=1.0))
    assert arch_from_provider(FakeLlama31ProviderV01(**base)).rope_scaling_factor == 8.0
    with pytest.raises(ValueError, match="Megatron's fixed values"):
        arch_from_provider(FakeLlama31ProviderV01(**base, low_freq_factor=2.0))


@dataclass
class FakeTransformer:
    """The nested `transformer` (a TransformerConfig) of a builder-backed ModelConfig."""

    num_layers: int = 32
    hidden_size: int = 4096
    num_attention_heads: int = 32
    ffn_hidden_size: int = 14336
    num_query_groups: int = 8
    kv_channels: int | None = None
    normalization: str = "RMSNorm"
    layernorm_epsilon: float = 1e-5
    activation_func: Any = "silu"  # serialised form
    gated_linear_unit: bool = True
    qk_layernorm: bool = False
    add_bias_linear: bool = False
    add_qkv_bias: bool = False
    init_method_std: float = 0.02
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 2
    sequence_parallel: bool = False
    virtual_pipeline_model_parallel_size: int | None = None


@dataclass
class FakeBuilderModelConfig:
    """Bridge ≥ 0.6 `BridgeGPTModelConfig`: GPT build fields outside, transformer fields nested."""

    transformer: FakeTransformer = field(default_factory=FakeTransformer)
    vocab_size: int = 128256
    seq_length: int = 131072
    position_embedding_type: str = "rope"
    rotary_base: int = 500000
    rope_scaling: bool = True
    rope_scaling_factor: float = 8.0
    share_embeddings_and_output_weights: bool = False
    extra_checkpoint_metadata: dict = field(default_factory=lambda: {"hf_model_id": "meta-llama/Llama-3.1-8B"})


def test_builder_backed_model_config_reads_nested_transformer_fields() -> None:
    config = FakeBuilderModelConfig()
    assert arch_from_provider(config) == arch_from_hf_config(LLAMA_3_1_8B_HF)
    assert layout_from_provider(config) == RecipeLayout(tp=1, pp=1, cp=2)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"num_moe_experts": 8}, "mixture-of-experts"),
    ({"multi_latent_attention": True}, "multi-latent"),
    ({"window_size": (4096, 0)}, "sliding-window"),
    ({"rotary_percent": 0.5}, "partial rotary"),
    ({"seq_len_interpolation_factor": 4.0}, "interpolated"),
    ({"position_embedding_type": "yarn"}, "yarn"),
    ({"normalization": "L2Norm"}, "L2Norm"),
    ({"activation_func": F.relu}, "relu"),
    ({"activation_func": F.silu, "gated_linear_unit": False}, "silu"),
])
def test_unsupported_providers_raise(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        arch_from_provider(llama31_8b(**overrides))


def test_layout_is_the_providers_parallel_fields() -> None:
    provider = llama31_8b(tensor_model_parallel_size=4, pipeline_model_parallel_size=2, context_parallel_size=2,
                          sequence_parallel=True, virtual_pipeline_model_parallel_size=5)
    assert layout_from_provider(provider) == RecipeLayout(tp=4, pp=2, cp=2, sequence_parallel=True, virtual_pp=5)


# ----------------------------------------------------------------------------------------- resolution
def _fake_recipes(**functions: Any) -> types.ModuleType:
    """A namespace shaped like `megatron.bridge.recipes` (its recipe functions as attributes)."""
    module = types.ModuleType("fake_bridge_recipes")
    for name, function in functions.items():
        setattr(module, name, function)
    return module


def _container(provider: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(model=provider, train=types.SimpleNamespace(micro_batch_size=1))


def test_short_and_full_recipe_names_resolve() -> None:
    def llama31_8b_pretrain_config():
        return _container(llama31_8b(context_parallel_size=2))

    recipes = _fake_recipes(llama31_8b_pretrain_config=llama31_8b_pretrain_config,
                            qwen3_8b_pretrain_config=lambda: None)
    assert resolve_recipe("llama31_8b", recipes) == ("llama31_8b_pretrain_config", llama31_8b_pretrain_config)
    assert resolve_recipe("llama31_8b_pretrain_config", recipes)[0] == "llama31_8b_pretrain_config"
    with pytest.raises(ValueError, match=r"unknown Megatron-Bridge recipe 'llama31_8bb'; closest: \['llama31_8b'"):
        resolve_recipe("llama31_8bb", recipes)


def test_recipe_model_maps_the_built_recipe() -> None:
    recipes = _fake_recipes(llama31_8b_pretrain_config=lambda: _container(llama31_8b(context_parallel_size=2)))
    model = recipe_model("llama31_8b", recipes=recipes)
    assert model.recipe == "llama31_8b_pretrain_config"
    assert model.arch == arch_from_hf_config(LLAMA_3_1_8B_HF)
    assert model.layout == RecipeLayout(tp=1, pp=1, cp=2)
    assert model.hf_model_id == "meta-llama/Llama-3.1-8B"
    builder_backed = recipe_model("llama31_8b", recipes=_fake_recipes(
        llama31_8b_pretrain_config=lambda: _container(FakeBuilderModelConfig())))
    assert builder_backed.hf_model_id == "meta-llama/Llama-3.1-8B" and builder_backed.arch == model.arch


def test_a_failing_recipe_says_where_its_hf_config_comes_from() -> None:
    def needs_the_hub():
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    with pytest.raises(RuntimeError, match=r"(?s)could not build its config.*HF cache.*model.source: hf"):
        recipe_model("llama3_8b", recipes=_fake_recipes(llama3_8b_pretrain_config=needs_the_hub))


def test_without_megatron_bridge_the_error_names_the_package_and_the_alternative() -> None:
    with pytest.raises(ImportError, match=r"(?s)Megatron-Bridge.*pip install megatron-bridge.*model.source: hf"):
        arch_from_recipe("llama3_8b")
    agent = AgentConfig(name="a", model=ModelSource(source="recipe", recipe="qwen3_8b"))
    with pytest.raises(ImportError, match="'qwen3_8b'"):
        model_arch(agent, tokenizer_vocab=1000)

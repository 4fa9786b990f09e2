"""HF ↔ Megatron names and layouts (pure functions): hand-built layouts, exact round trips, shapes, configs."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_hacpo.models.architecture import ModelArch, arch_from_hf_config
from nemo_hacpo.models.hf_layouts import (
    WeightMapping,
    check_convertible,
    hf_config,
    hf_tensor_shapes,
    interleave_qkv,
    shard,
    split_qkv,
    to_hf,
    to_megatron,
    unshard,
    weight_mappings,
)
from tests.helpers.hf_models import FAMILIES, tiny_hf_causal_lm


def _llama_arch(**changes) -> ModelArch:
    fields = dict(
        family="llama", num_layers=2, hidden_size=4, num_attention_heads=4, num_query_groups=2, head_dim=1,
        ffn_hidden_size=6, vocab_size=5, normalization="RMSNorm", norm_eps=1e-6, activation="swiglu",
        position_embedding="rope", rotary_base=10000.0, rope_scaling_factor=None, max_position_embeddings=16,
        tie_embeddings=False, qk_layernorm=False, add_bias_linear=False, add_qkv_bias=False)
    return ModelArch(**(fields | changes))


def _gpt2_arch(**changes) -> ModelArch:
    gpt2 = _llama_arch(family="gpt2", hidden_size=2, num_attention_heads=2, num_query_groups=2, head_dim=1,
                       normalization="LayerNorm", norm_eps=1e-5, activation="gelu",
                       position_embedding="learned_absolute", tie_embeddings=True, add_bias_linear=True)
    return dataclasses.replace(gpt2, **changes)


def _mapping(arch: ModelArch, megatron_name: str) -> WeightMapping:
    return next(m for m in weight_mappings(arch) if m.megatron_name == megatron_name)


def _column(values: list[float]) -> torch.Tensor:
    return torch.tensor(values).reshape(-1, 1)


# --------------------------------------------------------------------------------------------- layouts
def test_qkv_rows_are_grouped_per_kv_group() -> None:
    """4 query heads, 2 KV groups, head_dim 1: group j = [q_{2j}, q_{2j+1}, k_j, v_j]."""
    q, k, v = _column([0, 1, 2, 3]), _column([10, 11]), _column([20, 21])
    qkv = interleave_qkv(q, k, v, num_query_groups=2)
    assert qkv.flatten().tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    assert [t.flatten().tolist() for t in split_qkv(qkv, 2, 4, 1)] == [[0, 1, 2, 3], [10, 11], [20, 21]]


def test_qkv_with_head_dim_2_moves_whole_heads() -> None:
    """2 query heads, 1 KV group, head_dim 2 (a bias): [q_0 (2 rows), q_1 (2), k_0 (2), v_0 (2)]."""
    q, k, v = torch.tensor([0.0, 1, 2, 3]), torch.tensor([10.0, 11]), torch.tensor([20.0, 21])
    assert interleave_qkv(q, k, v, num_query_groups=1).tolist() == [0, 1, 2, 3, 10, 11, 20, 21]


def test_qkv_tp2_shards_hold_whole_kv_groups() -> None:
    arch = _llama_arch()
    mapping = _mapping(arch, "decoder.layers.0.self_attention.linear_qkv.weight")
    full = to_megatron(mapping, arch, [_column([0, 1, 2, 3]), _column([10, 11]), _column([20, 21])])
    shards = [shard(mapping, full, rank, 2) for rank in range(2)]
    assert [s.flatten().tolist() for s in shards] == [[0, 1, 10, 20], [2, 3, 11, 21]]
    assert torch.equal(unshard(mapping, shards), full)


def test_swiglu_fc1_tp2_takes_a_chunk_of_gate_and_of_up() -> None:
    arch = _llama_arch(ffn_hidden_size=4)
    mapping = _mapping(arch, "decoder.layers.1.mlp.linear_fc1.weight")
    assert mapping.hf_names == ("model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight")
    full = to_megatron(mapping, arch, [_column([0, 1, 2, 3]), _column([4, 5, 6, 7])])
    shards = [shard(mapping, full, rank, 2) for rank in range(2)]
    assert [s.flatten().tolist() for s in shards] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert torch.equal(unshard(mapping, shards), full)


def test_row_parallel_splits_the_input_dimension() -> None:
    arch = _llama_arch()
    mapping = _mapping(arch, "decoder.layers.0.self_attention.linear_proj.weight")
    o_proj = torch.arange(8.0).reshape(2, 4)  # [[0 1 2 3], [4 5 6 7]]
    shards = [shard(mapping, to_megatron(mapping, arch, [o_proj]), rank, 2) for rank in range(2)]
    assert [s.tolist() for s in shards] == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]


def test_vocab_rows_are_zero_padded_then_trimmed() -> None:
    arch = _llama_arch(vocab_size=3, hidden_size=1)
    mapping = _mapping(arch, "embedding.word_embeddings.weight")
    padded = to_megatron(mapping, arch, [_column([1, 2, 3])], padded_vocab=4)
    assert padded.flatten().tolist() == [1, 2, 3, 0]
    assert [s.flatten().tolist() for s in (shard(mapping, padded, r, 2) for r in range(2))] == [[1, 2], [3, 0]]
    assert to_hf(mapping, arch, padded)[0].flatten().tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="do not fit"):
        to_megatron(mapping, arch, [_column([1, 2, 3])], padded_vocab=2)


def test_gpt2_fused_c_attn_is_transposed_and_regrouped_per_head() -> None:
    """Conv1D c_attn.weight is [in = H, out = 3H]; its columns are [q0 q1 | k0 k1 | v0 v1] (2 heads, d = 1).
    Megatron wants rows [q0 k0 v0 | q1 k1 v1] of the [out, in] matrix."""
    arch = _gpt2_arch()
    mapping = _mapping(arch, "decoder.layers.0.self_attention.linear_qkv.weight")
    columns = torch.tensor([[0.0, 1, 10, 11, 20, 21], [0.5, 1.5, 10.5, 11.5, 20.5, 21.5]])  # [H=2, 3H=6]
    full = to_megatron(mapping, arch, [columns])
    assert full.tolist() == [[0, 0.5], [10, 10.5], [20, 20.5], [1, 1.5], [11, 11.5], [21, 21.5]]
    assert torch.equal(to_hf(mapping, arch, full)[0], columns)
    bias = _mapping(arch, "decoder.layers.0.self_attention.linear_qkv.bias")
    assert to_megatron(bias, arch, [torch.tensor([0.0, 1, 10, 11, 20, 21])]).tolist() == [0, 10, 20, 1, 11, 21]


def test_gpt2_conv1d_linears_are_transposed() -> None:
    arch = _gpt2_arch()
    mapping = _mapping(arch, "decoder.layers.1.mlp.linear_fc1.weight")
    assert (mapping.hf_names, mapping.layout) == (("transformer.h.1.mlp.c_fc.weight",), "transpose")
    c_fc = torch.arange(6.0).reshape(2, 3)  # [in, out]
    assert torch.equal(to_megatron(mapping, arch, [c_fc]), c_fc.t())
    exported = to_hf(mapping, arch, c_fc.t())[0]
    assert torch.equal(exported, c_fc) and exported.is_contiguous()


# --------------------------------------------------------------------------------------------- whole models
def test_mappings_name_every_family_specific_tensor() -> None:
    qwen3 = _llama_arch(family="qwen3", qk_layernorm=True, tie_embeddings=True)
    names = {n for m in weight_mappings(qwen3) for n in m.hf_names}
    assert "model.layers.1.self_attn.q_norm.weight" in names and "lm_head.weight" not in names
    qwen2 = _llama_arch(family="qwen2", add_qkv_bias=True)
    qkv_bias = _mapping(qwen2, "decoder.layers.0.self_attention.linear_qkv.bias")
    assert qkv_bias.hf_names == tuple(f"model.layers.0.self_attn.{p}_proj.bias" for p in "qkv")
    gpt2_names = [n for m in weight_mappings(_gpt2_arch()) for n in m.hf_names]
    assert gpt2_names[:2] == ["transformer.wte.weight", "transformer.wpe.weight"]
    assert gpt2_names[-1] == "transformer.ln_f.bias" and len(gpt2_names) == len(set(gpt2_names)) == 2 + 2 * 12 + 2


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_tensor_shapes_match_transformers(family: str) -> None:
    model = tiny_hf_causal_lm(family)
    arch = arch_from_hf_config(model.config.to_dict())
    state = model.state_dict()
    expected = {name: tuple(t.shape) for name, t in state.items() if not (arch.tie_embeddings and name == "lm_head.weight")}
    assert hf_tensor_shapes(arch) == expected


@st.composite
def _archs(draw) -> ModelArch:
    family = draw(st.sampled_from(FAMILIES))
    groups = draw(st.sampled_from([1, 2, 4]))
    if family == "gpt2":
        heads, head_dim = groups, draw(st.sampled_from([1, 2]))
        return _gpt2_arch(num_attention_heads=heads, num_query_groups=heads, head_dim=head_dim,
                          hidden_size=heads * head_dim, ffn_hidden_size=4 * heads * head_dim,
                          vocab_size=draw(st.integers(3, 9)), tie_embeddings=draw(st.booleans()))
    return _llama_arch(family=family, num_query_groups=groups, num_attention_heads=groups * draw(st.sampled_from([1, 2])),
                       head_dim=draw(st.sampled_from([1, 2])), hidden_size=draw(st.sampled_from([2, 4])),
                       ffn_hidden_size=draw(st.sampled_from([4, 8])), vocab_size=draw(st.integers(3, 9)),
                       qk_layernorm=family == "qwen3", add_qkv_bias=family == "qwen2",
                       tie_embeddings=draw(st.booleans()))


@settings(max_examples=40, deadline=None)
@given(arch=_archs(), tp=st.sampled_from([1, 2, 4]), seed=st.integers(0, 2**16))
def test_import_then_export_is_exact_for_any_tp(arch: ModelArch, tp: int, seed: int) -> None:
    """to_hf(unshard(shard(to_megatron(w)))) == w for every tensor, whenever TP divides the KV groups."""
    if arch.num_query_groups % tp:
        tp = 1
    generator = torch.Generator().manual_seed(seed)
    shapes = hf_tensor_shapes(arch)
    padded_vocab = -(-arch.vocab_size // tp) * tp + tp  # some padding rows on the last rank
    for mapping in weight_mappings(arch):
        hf = [torch.randn(shapes[n], generator=generator) for n in mapping.hf_names]
        full = to_megatron(mapping, arch, hf, padded_vocab=padded_vocab)
        shards = [shard(mapping, full, rank, tp) for rank in range(tp)]
        assert sum(s.numel() for s in shards) == full.numel() * (tp if mapping.tensor_parallel == "replicated" else 1)
        exported = to_hf(mapping, arch, unshard(mapping, shards))
        assert all(torch.equal(a, b) for a, b in zip(exported, hf, strict=True)), mapping.megatron_name


# --------------------------------------------------------------------------------------------- configs
@pytest.mark.parametrize("family", FAMILIES)
def test_hf_config_round_trips_through_arch_from_hf_config(family: str) -> None:
    arch = arch_from_hf_config(tiny_hf_causal_lm(family).config.to_dict())
    config = hf_config(arch, eos_token_id=2)
    assert arch_from_hf_config(config.to_dict()) == arch
    assert config.architectures == [{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                                     "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                                     "gpt2": "GPT2LMHeadModel"}[family]]
    assert config.eos_token_id == 2 and config.vocab_size == arch.vocab_size


def test_hf_config_of_the_pair_tiny_agents() -> None:
    from nemo_hacpo.config import load_config
    from nemo_hacpo.models.architecture import model_arch

    llama_tiny, gpt_tiny = (model_arch(agent, tokenizer_vocab=1000) for agent in load_config("pair_tiny_gpt").agents)
    llama = hf_config(llama_tiny)
    assert (llama.model_type, llama.hidden_size, llama.num_key_value_heads, llama.head_dim) == ("llama", 256, 2, 64)
    assert llama.rope_parameters["rope_theta"] == 10000.0 and llama.rms_norm_eps == 1e-6
    gpt = hf_config(gpt_tiny)
    assert (gpt.model_type, gpt.activation_function, gpt.n_inner, gpt.tie_word_embeddings) == ("gpt2", "gelu", 512, True)
    assert (gpt.resid_pdrop, gpt.embd_pdrop, gpt.attn_pdrop, gpt.layer_norm_epsilon) == (0.0, 0.0, 0.0, 1e-5)
    for arch in (llama_tiny, gpt_tiny):
        assert arch_from_hf_config(hf_config(arch).to_dict()) == arch


def test_unconvertible_architectures_are_refused() -> None:
    with pytest.raises(ValueError, match="no HF equivalent"):
        weight_mappings(_llama_arch(family=None))
    with pytest.raises(ValueError, match="QK-norm"):
        check_convertible(_llama_arch(qk_layernorm=True))  # Llama has no QK-norm: that is Qwen3
    with pytest.raises(ValueError, match="GPT-2 needs MHA"):
        check_convertible(_gpt2_arch(num_query_groups=1))
    with pytest.raises(ValueError, match="no linear biases"):
        hf_config(_llama_arch(add_bias_linear=True))

"""HF ↔ Megatron parameter names and tensor layouts (Llama / Mistral / Qwen2 / Qwen3 / GPT-2): pure functions.

One `WeightMapping` ties one Megatron `GPTModel` parameter (global layer numbering, local-spec names) to the
HF tensors it is made of, with the layout change between them and how Megatron shards it over TP:

    full   = to_megatron(mapping, arch, [hf tensors], padded_vocab)   # the TP = 1 Megatron tensor
    local  = shard(mapping, full, tp_rank, tp_size)                   # what TP rank r holds
    full   = unshard(mapping, [local_0, ..., local_{T-1}])
    hf     = to_hf(mapping, arch, full)                               # exact inverse of to_megatron

Layouts (d = head_dim, n_q = query heads, g = KV groups, q/g = n_q / g):
  * ``qkv``: HF q [n_q·d, …], k [g·d, …], v [g·d, …] → Megatron rows grouped per KV group,
    [q heads of group j (q/g·d rows); k_j (d); v_j (d)] for j = 0..g−1 (weights and biases alike);
  * ``gpt2_qkv``: GPT-2's fused c_attn [q; k; v] (Conv1D: weight stored [in, out], transposed here) → ``qkv``;
  * ``gated``: SwiGLU fc1 = [gate; up] on dim 0; TP rank r holds [gate chunk r; up chunk r];
  * ``transpose``: GPT-2 Conv1D weights are [in, out], Megatron linears [out, in];
  * ``vocab``: embedding / output rows zero-padded from the true vocabulary V to Megatron's padded size.
TP modes: ``column`` = chunk r of dim 0 (QKV, fc1, vocab rows), ``row`` = chunk r of dim 1 (proj, fc2
weights), ``replicated`` (norms, proj/fc2 biases, learned positions, QK-norm). RoPE needs no permutation:
HF's rotate-half convention is Megatron's non-interleaved RoPE.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from nemo_hacpo.models.architecture import ModelArch

Layout = Literal["copy", "transpose", "qkv", "gpt2_qkv", "gated", "vocab"]
TensorParallel = Literal["replicated", "column", "row", "gated_column"]

HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                    "qwen3": "Qwen3ForCausalLM", "gpt2": "GPT2LMHeadModel"}
# HF tensors that carry no weights Megatron needs: RoPE caches, GPT-2's old causal-mask buffers, and the
# output matrix of a tied model (a copy of the embedding).
IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")


@dataclass(frozen=True)
class WeightMapping:
    """One Megatron parameter and the HF tensors it is built from."""

    megatron_name: str  # global layer numbering, local-spec naming ("decoder.layers.3.mlp.linear_fc1.weight")
    hf_names: tuple[str, ...]  # HF checkpoint names, in the order `to_megatron` takes them
    layout: Layout
    tensor_parallel: TensorParallel


def _llama_like_mappings(arch: ModelArch) -> list[WeightMapping]:
    m = [WeightMapping("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab", "column")]
    for i in range(arch.num_layers):
        meg, hf = f"decoder.layers.{i}.", f"model.layers.{i}."
        attn = hf + "self_attn."
        m.append(WeightMapping(meg + "input_layernorm.weight", (hf + "input_layernorm.weight",), "copy", "replicated"))
        m.append(WeightMapping(meg + "self_attention.linear_qkv.weight",
                               tuple(f"{attn}{p}_proj.weight" for p in "qkv"), "qkv", "column"))
        if arch.add_qkv_bias:
            m.append(WeightMapping(meg + "self_attention.linear_qkv.bias",
                                   tuple(f"{attn}{p}_proj.bias" for p in "qkv"), "qkv", "column"))
        if arch.qk_layernorm:
            m.append(WeightMapping(meg + "self_attention.q_layernorm.weight", (attn + "q_norm.weight",), "copy",
                                   "replicated"))
            m.append(WeightMapping(meg + "self_attention.k_layernorm.weight", (attn + "k_norm.weight",), "copy",
                                   "replicated"))
        m.append(WeightMapping(meg + "self_attention.linear_proj.weight", (attn + "o_proj.weight",), "copy", "row"))
        m.append(WeightMapping(meg + "pre_mlp_layernorm.weight", (hf + "post_attention_layernorm.weight",), "copy",
                               "replicated"))
        m.append(WeightMapping(meg + "mlp.linear_fc1.weight", (hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight"),
                               "gated", "gated_column"))
        m.append(WeightMapping(meg + "mlp.linear_fc2.weight", (hf + "mlp.down_proj.weight",), "copy", "row"))
    m.append(WeightMapping("decoder.final_layernorm.weight", ("model.norm.weight",), "copy", "replicated"))
    if not arch.tie_embeddings:
        m.append(WeightMapping("output_layer.weight", ("lm_head.weight",), "vocab", "column"))
    return m


def _gpt2_mappings(arch: ModelArch) -> list[WeightMapping]:
    m = [WeightMapping("embedding.word_embeddings.weight", ("transformer.wte.weight",), "vocab", "column"),
         WeightMapping("embedding.position_embeddings.weight", ("transformer.wpe.weight",), "copy", "replicated")]
    for i in range(arch.num_layers):
        meg, hf = f"decoder.layers.{i}.", f"transformer.h.{i}."
        for p in ("weight", "bias"):
            m.append(WeightMapping(meg + f"input_layernorm.{p}", (hf + f"ln_1.{p}",), "copy", "replicated"))
        m.append(WeightMapping(meg + "self_attention.linear_qkv.weight", (hf + "attn.c_attn.weight",), "gpt2_qkv",
                               "column"))
        m.append(WeightMapping(meg + "self_attention.linear_qkv.bias", (hf + "attn.c_attn.bias",), "gpt2_qkv",
                               "column"))
        m.append(WeightMapping(meg + "self_attention.linear_proj.weight", (hf + "attn.c_proj.weight",), "transpose",
                               "row"))
        m.append(WeightMapping(meg + "self_attention.linear_proj.bias", (hf + "attn.c_proj.bias",), "copy",
                               "replicated"))
        for p in ("weight", "bias"):
            m.append(WeightMapping(meg + f"pre_mlp_layernorm.{p}", (hf + f"ln_2.{p}",), "copy", "replicated"))
        m.append(WeightMapping(meg + "mlp.linear_fc1.weight", (hf + "mlp.c_fc.weight",), "transpose", "column"))
        m.append(WeightMapping(meg + "mlp.linear_fc1.bias", (hf + "mlp.c_fc.bias",), "copy", "column"))
        m.append(WeightMapping(meg + "mlp.linear_fc2.weight", (hf + "mlp.c_proj.weight",), "transpose", "row"))
        m.append(WeightMapping(meg + "mlp.linear_fc2.bias", (hf + "mlp.c_proj.bias",), "copy", "replicated"))
    for p in ("weight", "bias"):
        m.append(WeightMapping(f"decoder.final_layernorm.{p}", (f"transformer.ln_f.{p}",), "copy", "replicated"))
    if not arch.tie_embeddings:
        m.append(WeightMapping("output_layer.weight", ("lm_head.weight",), "vocab", "column"))
    return m


def check_convertible(arch: ModelArch) -> None:
    """Raise `ValueError` if `arch` has no HF family this converter writes (or is inconsistent with it)."""
    if arch.family is None:
        raise ValueError("this architecture has no HF equivalent (family None): it cannot be converted or served "
                         "by vLLM; use a tiny spec that matches Llama/Qwen3 (RMSNorm+SwiGLU+RoPE) or GPT-2")
    if arch.family == "gpt2":
        if (arch.num_query_groups != arch.num_attention_heads or arch.head_dim * arch.num_attention_heads
                != arch.hidden_size or not arch.add_bias_linear or arch.position_embedding != "learned_absolute"):
            raise ValueError(f"GPT-2 needs MHA, head_dim = hidden/heads, biases and learned positions: {arch}")
    elif arch.add_bias_linear or arch.normalization != "RMSNorm" or arch.activation != "swiglu":
        raise ValueError(f"{arch.family} needs RMSNorm, SwiGLU and no linear biases: {arch}")
    elif arch.qk_layernorm != (arch.family == "qwen3") or arch.add_qkv_bias != (arch.family == "qwen2"):
        raise ValueError(f"{arch.family}: QK-norm is Qwen3's and the QKV bias Qwen2's; got qk_layernorm="
                         f"{arch.qk_layernorm}, add_qkv_bias={arch.add_qkv_bias}")


def weight_mappings(arch: ModelArch) -> tuple[WeightMapping, ...]:
    """Every Megatron parameter of the whole model (all PP stages), in HF checkpoint order."""
    check_convertible(arch)
    return tuple(_gpt2_mappings(arch) if arch.family == "gpt2" else _llama_like_mappings(arch))


def hf_tensor_shapes(arch: ModelArch) -> dict[str, tuple[int, ...]]:
    """Name → shape of every tensor in the HF checkpoint of `arch` (tied models have no `lm_head.weight`)."""
    h, d, f = arch.hidden_size, arch.head_dim, arch.ffn_hidden_size
    q_rows, kv_rows = arch.num_attention_heads * d, arch.num_query_groups * d
    by_suffix: dict[str, tuple[int, ...]] = {  # the name's last two components → shape
        "embed_tokens.weight": (arch.vocab_size, h), "lm_head.weight": (arch.vocab_size, h),
        "wte.weight": (arch.vocab_size, h), "wpe.weight": (arch.max_position_embeddings, h),
        "q_proj.weight": (q_rows, h), "k_proj.weight": (kv_rows, h), "v_proj.weight": (kv_rows, h),
        "q_proj.bias": (q_rows,), "k_proj.bias": (kv_rows,), "v_proj.bias": (kv_rows,),
        "o_proj.weight": (h, q_rows), "q_norm.weight": (d,), "k_norm.weight": (d,),
        "gate_proj.weight": (f, h), "up_proj.weight": (f, h), "down_proj.weight": (h, f),
        "c_attn.weight": (h, 3 * h), "c_attn.bias": (3 * h,), "c_fc.weight": (h, f), "c_fc.bias": (f,),
    }
    shapes = {}
    for mapping in weight_mappings(arch):
        for name in mapping.hf_names:
            suffix = ".".join(name.split(".")[-2:])
            if name.endswith("mlp.c_proj.weight"):  # GPT-2 Conv1D [in, out]
                shapes[name] = (f, h)
            elif name.endswith("attn.c_proj.weight"):
                shapes[name] = (h, h)
            else:  # everything else is a norm or an [H] bias
                shapes[name] = by_suffix.get(suffix, (h,))
    return shapes


# ------------------------------------------------------------------------------------------- layouts
def interleave_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_query_groups: int) -> torch.Tensor:
    """[q; k; v] per KV group. q: [n_q·d, *rest], k, v: [g·d, *rest] → [g·(q/g + 2)·d, *rest]."""
    g, rest = num_query_groups, q.shape[1:]
    return torch.cat([q.reshape(g, -1, *rest), k.reshape(g, -1, *rest), v.reshape(g, -1, *rest)],
                     dim=1).reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, num_query_groups: int, num_attention_heads: int,
              head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of `interleave_qkv`: [g·(q/g + 2)·d, *rest] → (q [n_q·d, *rest], k [g·d, *rest], v [g·d, *rest])."""
    g, d, rest = num_query_groups, head_dim, qkv.shape[1:]
    q_per_group = num_attention_heads // g
    q, k, v = qkv.reshape(g, (q_per_group + 2) * d, *rest).split([q_per_group * d, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def to_megatron(mapping: WeightMapping, arch: ModelArch, hf_tensors: Sequence[torch.Tensor],
                padded_vocab: int | None = None) -> torch.Tensor:
    """The full (TP = 1) Megatron tensor of `mapping` from its HF tensors (in `mapping.hf_names` order).

    `padded_vocab`: embedding/output rows in Megatron (≥ arch.vocab_size; the extra rows are zero).
    """
    if mapping.layout == "copy":
        return hf_tensors[0]
    if mapping.layout == "transpose":
        return hf_tensors[0].t()
    if mapping.layout == "gated":
        return torch.cat(list(hf_tensors), dim=0)  # [gate; up]: [2F, H]
    if mapping.layout == "qkv":
        return interleave_qkv(*hf_tensors, num_query_groups=arch.num_query_groups)
    if mapping.layout == "gpt2_qkv":
        fused = hf_tensors[0] if hf_tensors[0].dim() == 1 else hf_tensors[0].t()  # [3H, (H)] = [q; k; v]
        return interleave_qkv(*fused.chunk(3, dim=0), num_query_groups=arch.num_query_groups)
    if mapping.layout == "vocab":
        rows = hf_tensors[0]
        padded_vocab = padded_vocab or rows.shape[0]
        if padded_vocab < rows.shape[0]:
            raise ValueError(f"{mapping.megatron_name}: {rows.shape[0]} HF rows do not fit {padded_vocab}")
        return torch.cat([rows, rows.new_zeros(padded_vocab - rows.shape[0], *rows.shape[1:])], dim=0)
    raise ValueError(f"unknown layout {mapping.layout!r}")


def to_hf(mapping: WeightMapping, arch: ModelArch, full: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Exact inverse of `to_megatron`: the HF tensors (contiguous, true vocabulary) of a full Megatron tensor."""
    if mapping.layout == "copy":
        out: tuple[torch.Tensor, ...] = (full,)
    elif mapping.layout == "transpose":
        out = (full.t(),)
    elif mapping.layout == "gated":
        out = tuple(full.chunk(2, dim=0))
    elif mapping.layout == "qkv":
        out = split_qkv(full, arch.num_query_groups, arch.num_attention_heads, arch.head_dim)
    elif mapping.layout == "gpt2_qkv":
        fused = torch.cat(split_qkv(full, arch.num_query_groups, arch.num_attention_heads, arch.head_dim), dim=0)
        out = (fused if fused.dim() == 1 else fused.t(),)
    elif mapping.layout == "vocab":
        out = (full[: arch.vocab_size],)
    else:
        raise ValueError(f"unknown layout {mapping.layout!r}")
    return tuple(t.contiguous() for t in out)


def shard(mapping: WeightMapping, full: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """The part of the full Megatron tensor that TP rank `tp_rank` of `tp_size` holds."""
    if mapping.tensor_parallel == "replicated" or tp_size == 1:
        return full
    if mapping.tensor_parallel == "gated_column":  # [gate; up] → [gate_r; up_r]
        return torch.cat([half.chunk(tp_size, dim=0)[tp_rank] for half in full.chunk(2, dim=0)], dim=0)
    dim = 0 if mapping.tensor_parallel == "column" else 1
    if full.shape[dim] % tp_size:
        raise ValueError(f"{mapping.megatron_name}: dim {dim} of {tuple(full.shape)} is not divisible by TP={tp_size}")
    return full.chunk(tp_size, dim=dim)[tp_rank]


def unshard(mapping: WeightMapping, shards: Sequence[torch.Tensor]) -> torch.Tensor:
    """Inverse of `shard`: the full tensor from the shards of TP ranks 0..T−1 (replicated: rank 0's)."""
    if mapping.tensor_parallel == "replicated" or len(shards) == 1:
        return shards[0]
    if mapping.tensor_parallel == "gated_column":
        gates, ups = zip(*(s.chunk(2, dim=0) for s in shards), strict=True)
        return torch.cat([*gates, *ups], dim=0)
    return torch.cat(list(shards), dim=0 if mapping.tensor_parallel == "column" else 1)


# ------------------------------------------------------------------------------------------- config
def hf_config(arch: ModelArch, *, bos_token_id: int | None = None, eos_token_id: int | None = None,
              pad_token_id: int | None = None, dtype: torch.dtype = torch.float32) -> Any:
    """The transformers config (`LlamaConfig`, `Qwen3Config`, `GPT2Config`, …) of `arch`.

    `arch_from_hf_config(hf_config(arch).to_dict()) == arch`; `architectures` is set so vLLM finds the model
    class; GPT-2 uses the exact-erf GELU (`activation_function="gelu"`) that Megatron computes; no dropout;
    no sliding window (Megatron attends to the whole causal prefix).
    """
    import transformers

    check_convertible(arch)
    tokens = {"bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "pad_token_id": pad_token_id}
    common: dict[str, Any] = dict(vocab_size=arch.vocab_size, tie_word_embeddings=arch.tie_embeddings,
                                  initializer_range=arch.init_std, architectures=[HF_ARCHITECTURES[arch.family]],
                                  dtype=str(dtype).removeprefix("torch."), **tokens)
    if arch.family == "gpt2":
        return transformers.GPT2Config(
            n_embd=arch.hidden_size, n_layer=arch.num_layers, n_head=arch.num_attention_heads,
            n_inner=arch.ffn_hidden_size, n_positions=arch.max_position_embeddings, activation_function="gelu",
            layer_norm_epsilon=arch.norm_eps, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": arch.rotary_base}
    if arch.rope_scaling_factor is not None:  # Megatron's Llama-3.1 scaling: fixed low/high factors and 8192
        rope |= {"rope_type": "llama3", "factor": arch.rope_scaling_factor, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    fields: dict[str, Any] = dict(
        hidden_size=arch.hidden_size, intermediate_size=arch.ffn_hidden_size, num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_attention_heads, num_key_value_heads=arch.num_query_groups,
        head_dim=arch.head_dim, max_position_embeddings=arch.max_position_embeddings, rms_norm_eps=arch.norm_eps,
        hidden_act="silu", rope_parameters=rope, attention_dropout=0.0, **common)
    config_class = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
                    "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[arch.family]
    if arch.family in ("llama", "qwen3"):
        fields["attention_bias"] = False
    if arch.family == "llama":
        fields["mlp_bias"] = False
    if arch.family in ("mistral", "qwen2", "qwen3"):
        fields["sliding_window"] = None
    if arch.family in ("qwen2", "qwen3"):
        fields["use_sliding_window"] = False
    return config_class(**fields)

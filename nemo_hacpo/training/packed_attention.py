"""Packed (THD) sequences for Megatron's *local* layer spec: its `DotProductAttention`, one segment at a time.

megatron-core 0.16.1's local `DotProductAttention.forward` asserts `packed_seq_params is None` ("Packed
sequence is not supported by DotProductAttention. Please use TEDotProductAttention instead."); only the
Transformer Engine spec's `TEDotProductAttention` takes THD input. The rest of the local path already
handles THD (`Attention.forward` squeezes q/k/v to `[T, heads, head_dim]`, applies RoPE per segment from
`cu_seqlens` and reshapes the output back to `[T, 1, hidden]`), so this subclass is all the CPU trainer
needs to pack sequences.

For segment b = [cu_b, cu_{b+1}) it runs the parent's causal attention on `q/k/v[cu_b:cu_{b+1}]` as a
batch of one, so each segment gets exactly the maths (scale, softmax, GQA expansion) of an unpacked row.
Cost: Σ_b l_b² attention scores (no padding), a Python loop over the segments. Meant for CPU / tests:
on GPU the trainer uses the Transformer Engine spec.

Imports Megatron at module import: import this module lazily.
"""

from __future__ import annotations

import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.dot_product_attention import DotProductAttention


class PackedDotProductAttention(DotProductAttention):
    """`DotProductAttention` that also accepts `PackedSeqParams(qkv_format="thd")`.

    THD input: query `[T, heads/tp, head_dim]`, key/value `[T, groups/tp, head_dim]`; output `[T, hidden/tp]`.
    Anything else is passed to the parent unchanged.
    """

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type=None, attention_bias=None,
                packed_seq_params: PackedSeqParams | None = None) -> torch.Tensor:
        if packed_seq_params is None or packed_seq_params.qkv_format != "thd":
            return super().forward(query, key, value, attention_mask, attn_mask_type=attn_mask_type,
                                   attention_bias=attention_bias, packed_seq_params=packed_seq_params)
        if attention_mask is not None:
            raise ValueError("packed (THD) attention is causal within each segment; an attention mask is not supported")
        cu_seqlens_q = packed_seq_params.cu_seqlens_q_padded
        if cu_seqlens_q is None:
            cu_seqlens_q = packed_seq_params.cu_seqlens_q
        cu_seqlens_kv = packed_seq_params.cu_seqlens_kv_padded
        if cu_seqlens_kv is None:
            cu_seqlens_kv = packed_seq_params.cu_seqlens_kv
        bounds_q, bounds_kv = cu_seqlens_q.tolist(), cu_seqlens_kv.tolist()
        if bounds_q != bounds_kv:
            raise ValueError("packed self-attention needs the same segments for queries and keys")
        if bounds_q[-1] != query.shape[0]:
            raise ValueError(f"cu_seqlens end at {bounds_q[-1]} but the packed sequence has {query.shape[0]} positions")
        outputs = []
        for start, end in zip(bounds_q[:-1], bounds_q[1:], strict=True):
            # [l, 1, heads, head_dim] → parent → [l, 1, hidden/tp]
            outputs.append(super().forward(query[start:end].unsqueeze(1), key[start:end].unsqueeze(1),
                                           value[start:end].unsqueeze(1), None, attn_mask_type=attn_mask_type))
        return torch.cat(outputs, dim=0).squeeze(1)  # [T, hidden/tp]

"""Core attention through torch's `scaled_dot_product_attention` for Megatron's *local* layer spec.

On a GPU without Transformer Engine the trainer runs Megatron's local spec, whose `DotProductAttention` computes
the scores explicitly: it keeps every layer's s² probabilities for the backward pass (fp32 and bf16: 6 bytes per
score, 20 GiB at 4,096 tokens for 8 layers of 32 heads on the first H200 run) and ran at 13–18 % MFU there (issue
#38). torch's SDPA picks a flash, memory-efficient or cuDNN kernel on Hopper: O(s) memory per head, no s² tensor.
This subclass keeps everything of the local attention (its module, scale, state dict) and replaces the maths:

    softmax(Q Kᵀ · scale + causal mask) V,  K and V shared by groups of query heads (GQA, `enable_gqa`)

Query `[sq, b, heads/tp, d]`, key/value `[sk, b, groups/tp, d]`, output `[sq, b, heads/tp · d]`, as the parent's.
Causal only (the trainer's rows are right-padded: a causal mask is exact for every real token), no attention mask,
no bias; packed (THD) input runs segment by segment, each a causal attention of its own (as
`packed_attention.PackedDotProductAttention` does for the unfused path). Dropout follows the config (0 in RL).

Imports Megatron at module import: import this module lazily.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.dot_product_attention import DotProductAttention


class SdpaDotProductAttention(DotProductAttention):
    """`DotProductAttention` computed by `torch.nn.functional.scaled_dot_product_attention` (module docstring)."""

    @property
    def scale(self) -> float:
        """The scores' scale: the parent's softmax scale, with the query-key layer scaling its softmax undoes."""
        return self.softmax_scale * (self.layer_number if self.config.apply_query_key_layer_scaling else 1)

    def _attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """`[s, b, n, d]` query, `[s, b, g, d]` key and value → `[s, b, n·d]`."""
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        dropout = self.attention_dropout.p if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=self.scale,
                                             enable_gqa=q.shape[1] != k.shape[1])  # [b, n, s, d]
        return out.permute(2, 0, 1, 3).reshape(query.shape[0], query.shape[1], -1)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type=None, attention_bias=None,
                packed_seq_params: PackedSeqParams | None = None) -> torch.Tensor:
        if attention_mask is not None or attention_bias is not None:
            raise ValueError("SDPA attention is causal: an attention mask or bias is not supported")
        if self.config.softmax_type != "vanilla":
            raise ValueError(f"SDPA attention has no {self.config.softmax_type!r} softmax")
        if packed_seq_params is None:
            return self._attend(query, key, value)
        if packed_seq_params.qkv_format != "thd":
            raise ValueError(f"packed sequences in {packed_seq_params.qkv_format!r} are not supported (thd only)")
        bounds = (packed_seq_params.cu_seqlens_q_padded if packed_seq_params.cu_seqlens_q_padded is not None
                  else packed_seq_params.cu_seqlens_q).tolist()
        if bounds[-1] != query.shape[0]:
            raise ValueError(f"cu_seqlens end at {bounds[-1]} but the packed sequence has {query.shape[0]} positions")
        # [T, heads, d] → per segment [l, 1, heads, d] → [l, 1, heads·d] → [T, heads·d]
        return torch.cat([self._attend(query[a:b].unsqueeze(1), key[a:b].unsqueeze(1), value[a:b].unsqueeze(1))
                          for a, b in zip(bounds[:-1], bounds[1:], strict=True)], dim=0).squeeze(1)

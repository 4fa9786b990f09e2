"""Model FLOPs of a decoder forward pass (for tokens/s → TFLOP/s and MFU estimates).

Counted per sequence of length `s` (a multiply-add = 2 FLOPs), Megatron's convention without the causal
discount (the attention score and context products are counted over the full `s × s` square):

    matmul weights per layer  P_layer = h·(a·d + 2·g·d)  [QKV]  +  a·d·h  [proj]  +  (3 if gated else 2)·h·f  [MLP]
    forward(s)                = 2·s·(L·P_layer + h·V)  +  L · 4·s²·a·d
    training step (fwd+bwd)   = 3 · forward(s)

h hidden, a query heads, g KV groups, d head dim, f FFN width, L layers, V vocabulary (output layer; the
embedding lookup is free). Norms, activations, RoPE and the softmax are ignored (≪ 1 %). Only real tokens
count (padding is wasted work, not model FLOPs).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nemo_hacpo.models.architecture import ModelArch


def matmul_params_per_layer(arch: ModelArch) -> int:
    """Weights of one layer's matmuls (`P_layer` above; biases ignored)."""
    h, d = arch.hidden_size, arch.head_dim
    qkv = h * (arch.num_attention_heads * d + 2 * arch.num_query_groups * d)
    proj = arch.num_attention_heads * d * h
    mlp = (3 if arch.activation == "swiglu" else 2) * h * arch.ffn_hidden_size
    return qkv + proj + mlp


def forward_flops(arch: ModelArch, seq_len: int) -> float:
    """FLOPs of one forward pass over one sequence of `seq_len` tokens (formula in the module docstring)."""
    dense = 2.0 * seq_len * (arch.num_layers * matmul_params_per_layer(arch) + arch.hidden_size * arch.vocab_size)
    attention = arch.num_layers * 4.0 * seq_len**2 * arch.num_attention_heads * arch.head_dim
    return dense + attention


def batch_flops(arch: ModelArch, seq_lens: Iterable[int], *, backward: bool) -> float:
    """FLOPs over sequences: Σ forward(s), times 3 with the backward pass."""
    total = sum(forward_flops(arch, s) for s in seq_lens)
    return 3.0 * total if backward else total

"""Model FLOPs of the decoder (hand-computed on a toy shape)."""

from __future__ import annotations

import pytest

from nemo_hacpo.models.architecture import ModelArch
from nemo_hacpo.training.flops import batch_flops, forward_flops, matmul_params_per_layer


def _arch(activation: str = "swiglu") -> ModelArch:
    return ModelArch(family=None, num_layers=1, hidden_size=4, num_attention_heads=2, num_query_groups=1,
                     head_dim=2, ffn_hidden_size=8, vocab_size=10, normalization="RMSNorm", norm_eps=1e-6,
                     activation=activation, position_embedding="rope", rotary_base=10000.0,
                     rope_scaling_factor=None, max_position_embeddings=16, tie_embeddings=False,
                     qk_layernorm=False, add_bias_linear=False, add_qkv_bias=False)


def test_hand_computed_flops() -> None:
    # QKV 4·(2·2 + 2·1·2) = 32, proj 2·2·4 = 16, SwiGLU 3·4·8 = 96 → 144 weights per layer
    assert matmul_params_per_layer(_arch()) == 144
    assert matmul_params_per_layer(_arch("gelu")) == 32 + 16 + 2 * 4 * 8
    # forward(3) = 2·3·(144 + 4·10) + 4·3²·2·2 = 1104 + 144 = 1248
    assert forward_flops(_arch(), 3) == 1248
    assert batch_flops(_arch(), [3, 3], backward=True) == 3 * 2 * 1248
    assert batch_flops(_arch(), [3], backward=False) == 1248


def test_scale_of_a_billion_parameter_model() -> None:
    """Sanity at scale: a Llama-3.2-1B-like shape costs ≈ 6·N FLOPs per trained token at short length."""
    arch = ModelArch(family="llama", num_layers=16, hidden_size=2048, num_attention_heads=32, num_query_groups=8,
                     head_dim=64, ffn_hidden_size=8192, vocab_size=128256, normalization="RMSNorm", norm_eps=1e-5,
                     activation="swiglu", position_embedding="rope", rotary_base=500000.0,
                     rope_scaling_factor=None, max_position_embeddings=4096, tie_embeddings=True,
                     qk_layernorm=False, add_bias_linear=False, add_qkv_bias=False)
    matmul_params = 16 * matmul_params_per_layer(arch) + 2048 * 128256  # 1.236e9 (the output layer counts)
    attention = 3 * 16 * 4 * 1 * 32 * 64  # one token attends to itself: 4·s²·a·d per layer, ×3 with backward
    assert batch_flops(arch, [1], backward=True) == 6 * matmul_params + attention
    assert batch_flops(arch, [1], backward=True) == pytest.approx(6 * 1.236e9, rel=1e-3)

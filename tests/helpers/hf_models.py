"""Tiny random transformers causal LMs of each family the HF converter supports (fp32, eager attention).

Every parameter is drawn afresh — norms around 1, biases and weights N(0, 0.05²) — so that a mis-mapped norm,
bias or head changes the logits visibly (the default init has unit norms, zero biases and near-zero logits).
"""

from __future__ import annotations

from typing import Any

import torch

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gpt2")
VOCAB_SIZE = 500  # not a multiple of 128: Megatron pads the embedding to 512 (TP 1, 2)
WEIGHT_STD = 0.05


def tiny_hf_config(family: str, vocab_size: int = VOCAB_SIZE) -> Any:
    """2 layers, head_dim 64, GQA (4 query heads, 2 KV groups) for the Llama-like families.

    llama: Llama-3.1 RoPE scaling (θ = 5e5, llama3 factor 8), untied; mistral: θ = 1e6, no sliding window;
    qwen2: QKV bias, tied embeddings; qwen3: QK-norm with head_dim·heads (256) ≠ hidden (128);
    gpt2: exact-erf GELU, learned positions, biases, tied embeddings.
    """
    import transformers

    common: dict[str, Any] = dict(vocab_size=vocab_size, attn_implementation="eager", bos_token_id=1,
                                  eos_token_id=2, pad_token_id=0)
    llama_like = dict(common, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                      intermediate_size=384, num_hidden_layers=2, max_position_embeddings=256, rms_norm_eps=1e-6)
    if family == "llama":
        return transformers.LlamaConfig(**llama_like, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    if family == "mistral":
        return transformers.MistralConfig(**llama_like, sliding_window=None,
                                          rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    if family == "qwen2":
        return transformers.Qwen2Config(**llama_like, tie_word_embeddings=True)
    if family == "qwen3":
        return transformers.Qwen3Config(**(llama_like | {"hidden_size": 128}))
    if family == "gpt2":
        return transformers.GPT2Config(**common, n_embd=128, n_head=2, n_layer=2, n_inner=512, n_positions=64,
                                       activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    raise ValueError(f"unknown family {family!r}")


@torch.no_grad()
def tiny_hf_causal_lm(family: str, seed: int = 0, vocab_size: int = VOCAB_SIZE) -> Any:
    """A seeded random `<Family>ForCausalLM` / `GPT2LMHeadModel` in eval mode."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_config(tiny_hf_config(family, vocab_size)).float().eval()
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=generator)
        is_norm = "norm" in name or ".ln_" in name
        param.copy_(1.0 + 0.2 * noise if is_norm and name.endswith("weight") else WEIGHT_STD * noise)
    return model


def random_token_ids(batch: int, length: int, vocab_size: int = VOCAB_SIZE, seed: int = 0) -> torch.Tensor:
    """[batch, length] token ids drawn uniformly from the vocabulary."""
    return torch.randint(0, vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))

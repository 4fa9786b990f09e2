"""The tiny random Hugging Face causal LMs of the test suite — one module, two ways to ask for one:

- `tiny_hf_causal_lm(family)`: a model of each family the HF ↔ Megatron converter supports (Llama with
  Llama-3.1 RoPE scaling, Mistral, Qwen2 with QKV bias, Qwen3 with QK-norm, GPT-2), every parameter redrawn so
  that a mis-mapped norm, bias or head changes the logits visibly (the conversion tests);
- `hf_model_from_spec(spec, tokenizer)`: the HF twin of an agent's `TinyModelSpec` with that agent's vocabulary
  (RMSNorm + SwiGLU + RoPE → Llama, with QK-norm → Qwen3; LayerNorm + GELU + learned positions → GPT-2), the
  checkpoint a vLLM engine starts from in the rollout and evaluation tests.

Plus what those tests do with such a model: save it as a checkpoint, stream its weights as a refit would, score
sequences, take one SGD step, or rewrite it into a context-free distribution (`make_tokens_likely`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
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


def hf_model_from_spec(spec: Any, tokenizer: Any, *, seed: int = 0, config_eos_token_id: int | None = None) -> Any:
    """A seeded random fp32 HF causal LM with the spec's shape and the tokenizer's vocabulary.

    `config_eos_token_id` writes another EOS into config.json (the engine must ignore it and stop at the
    tokenizer's EOS); default: the tokenizer's.
    """
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    eos = tokenizer.eos_token_id if config_eos_token_id is None else config_eos_token_id
    special = {"eos_token_id": eos, "bos_token_id": tokenizer.bos_token_id, "pad_token_id": tokenizer.pad_token_id}
    llama_like = (spec.normalization, spec.activation, spec.position_embedding) == ("RMSNorm", "swiglu", "rope")
    gpt2_like = (spec.normalization, spec.activation, spec.position_embedding) == ("LayerNorm", "gelu",
                                                                                   "learned_absolute")
    if not (llama_like or gpt2_like) or (spec.qk_layernorm and not llama_like):
        raise NotImplementedError(f"no HF architecture for {spec}")
    if llama_like and spec.qk_layernorm:
        config = Qwen3Config(
            vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.ffn_hidden_size,
            num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_attention_heads,
            num_key_value_heads=spec.num_query_groups or spec.num_attention_heads,
            head_dim=spec.hidden_size // spec.num_attention_heads,
            max_position_embeddings=spec.max_position_embeddings, rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": float(spec.rotary_base)},
            tie_word_embeddings=spec.tie_embeddings, initializer_range=spec.init_std, **special)
        model_cls = Qwen3ForCausalLM
    elif llama_like:
        config = LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.ffn_hidden_size,
            num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_attention_heads,
            num_key_value_heads=spec.num_query_groups or spec.num_attention_heads,
            max_position_embeddings=spec.max_position_embeddings, rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": float(spec.rotary_base)},
            tie_word_embeddings=spec.tie_embeddings, initializer_range=spec.init_std, **special)
        model_cls = LlamaForCausalLM
    else:
        config = GPT2Config(
            vocab_size=len(tokenizer), n_embd=spec.hidden_size, n_layer=spec.num_layers, n_head=spec.num_attention_heads,
            n_inner=spec.ffn_hidden_size, n_positions=spec.max_position_embeddings, activation_function="gelu",
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
            tie_word_embeddings=spec.tie_embeddings, initializer_range=spec.init_std, **special)
        model_cls = GPT2LMHeadModel
    torch.manual_seed(seed)  # transformers' own initialisation (initializer_range = the spec's init_std)
    return model_cls(config).float().eval()


def save_checkpoint(model: Any, tokenizer: Any, directory: Path) -> Path:
    """config.json + model.safetensors + the tokenizer files in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory), safe_serialization=True)
    tokenizer.save_pretrained(str(directory))
    return directory


def hf_weights(model: Any) -> list[tuple[str, torch.Tensor]]:
    """The model's state dict as HF-layout `(name, tensor)` pairs (what a refit sends)."""
    return [(name, tensor.detach()) for name, tensor in model.state_dict().items()]


@torch.no_grad()
def hf_logprobs(model: Any, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
    """log p(seq[t] | seq[:t]) for t = 1..L−1 under the transformers model, one sequence at a time."""
    rows = []
    device = next(model.parameters()).device
    for seq in sequences:
        ids = torch.tensor([list(seq)], device=device)
        logits = model(input_ids=ids).logits[0].float()  # [L, V]
        logprobs = torch.log_softmax(logits, dim=-1)[:-1].gather(1, ids[0, 1:, None])[:, 0]
        rows.append(logprobs.tolist())
    return rows


def sgd_step_on_nll(model: Any, sequences: Sequence[Sequence[int]], lr: float) -> float:
    """One real optimizer update: SGD on the mean token NLL of `sequences`; returns the loss before the step."""
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    optimizer.zero_grad()
    losses = []
    device = next(model.parameters()).device
    for seq in sequences:
        ids = torch.tensor([list(seq)], device=device)
        losses.append(model(input_ids=ids, labels=ids).loss)
    loss = torch.stack(losses).mean()
    loss.backward()
    optimizer.step()
    model.eval()
    return float(loss.detach())


@torch.no_grad()
def make_tokens_likely(model: Any, logit_by_token: dict[int, float]) -> None:
    """Rewrite the weights so that every position's next-token logits are ≈ `logit_by_token[v]` for the given
    tokens and ≈ 0 for all others — a context-free distribution the test can reason about.

    GPT-2 (LayerNorm with bias, tied embeddings): ln_f weight 0 and bias e₀ make the final hidden state e₀
    everywhere, so the logits are column 0 of the (tied) embedding, set to the wanted logits.
    Llama (RMSNorm without bias): embedding dim 0 = 1000 for every token and no layer writes dim 0 (zero row 0
    of o_proj and down_proj), so the final RMSNorm with weight e₀ outputs √d·e₀ (the other dims are tiny next
    to 1000); lm_head column 0 = logits/√d, all else 0.
    """
    hidden = model.config.hidden_size
    if hasattr(model, "transformer"):  # GPT-2
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.zero_()
        model.transformer.ln_f.bias[0] = 1.0
        column = torch.zeros(model.config.vocab_size)
        for token, logit in logit_by_token.items():
            column[token] = logit
        model.transformer.wte.weight[:, 0] = column
        return
    base = model.model
    base.embed_tokens.weight[:, 0] = 1000.0
    for layer in base.layers:
        layer.self_attn.o_proj.weight[0].zero_()
        layer.mlp.down_proj.weight[0].zero_()
    base.norm.weight.zero_()
    base.norm.weight[0] = 1.0
    model.lm_head.weight.zero_()
    for token, logit in logit_by_token.items():
        model.lm_head.weight[token, 0] = logit / hidden**0.5

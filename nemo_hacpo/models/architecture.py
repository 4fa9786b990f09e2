"""Agent model source → a normalised architecture → Megatron `TransformerConfig`, layer spec and `GPTModel`.

    arch   = model_arch(agent, tokenizer_vocab=len(tokenizer))   # tiny spec, local HF config.json or recipe
    recipe = recipe_model("llama3_8b")                            # Megatron-Bridge: arch + default TP/PP/CP
    config = transformer_config(arch, agent.parallel, agent.precision, device="cpu")
    model  = build_gpt_model(arch, config, use_te=False, pre_process=..., post_process=...)

`ModelArch` is the one description both the Megatron builder and the HF converter read, so a tiny agent
can be exported to (and served by vLLM as) the HF family it resembles: RMSNorm + SwiGLU + RoPE → Llama
(Qwen3 with QK-norm), LayerNorm + GELU + learned positions (+ biases) → GPT-2.
CPU uses Megatron's local layer spec with every CUDA fusion off; GPU uses the Transformer Engine spec,
where FP8 is available. Transformer Engine and Megatron-Bridge are imported only when asked for.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import json
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:
    from nemo_hacpo.config import AgentConfig, ParallelConfig, PrecisionConfig, TinyModelSpec

Family = Literal["llama", "mistral", "qwen2", "qwen3", "gpt2"]
HF_FAMILIES: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3", "gpt2")
VOCAB_MULTIPLE = 128
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class ModelArch:
    """Everything that fixes a decoder's shapes and maths (what HF config.json and Megatron must agree on)."""

    family: Family | None  # HF family it exports to; None = no HF equivalent (not servable by vLLM)
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int  # true vocabulary (tokenizer / HF embedding rows); Megatron pads it (padded_vocab_size)
    normalization: Literal["RMSNorm", "LayerNorm"]
    norm_eps: float
    activation: Literal["swiglu", "gelu"]
    position_embedding: Literal["rope", "learned_absolute"]
    rotary_base: float
    rope_scaling_factor: float | None  # Llama-3.1-style RoPE scaling factor (None = off)
    max_position_embeddings: int
    tie_embeddings: bool
    qk_layernorm: bool
    add_bias_linear: bool  # biases on every linear layer (GPT-2)
    add_qkv_bias: bool  # biases on QKV only (Qwen2)
    init_std: float = 0.02

    def padded_vocab_size(self, tp: int) -> int:
        """Embedding rows in Megatron: the vocabulary rounded up to a multiple of 128·TP."""
        multiple = VOCAB_MULTIPLE * tp
        return -(-self.vocab_size // multiple) * multiple


def arch_from_tiny(spec: TinyModelSpec, vocab_size: int) -> ModelArch:
    """A built-in tiny spec, mapped to the HF family with the same maths when there is one."""
    llama_like = (spec.normalization, spec.activation, spec.position_embedding) == ("RMSNorm", "swiglu", "rope")
    gpt2_like = (spec.normalization, spec.activation, spec.position_embedding) == ("LayerNorm", "gelu",
                                                                                  "learned_absolute")
    family: Family | None = None
    if llama_like:
        family = "qwen3" if spec.qk_layernorm else "llama"
    elif gpt2_like and not spec.qk_layernorm and spec.num_query_groups in (None, spec.num_attention_heads):
        family = "gpt2"
    return ModelArch(
        family=family, num_layers=spec.num_layers, hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads,
        num_query_groups=spec.num_query_groups or spec.num_attention_heads,
        head_dim=spec.hidden_size // spec.num_attention_heads, ffn_hidden_size=spec.ffn_hidden_size,
        vocab_size=vocab_size, normalization=spec.normalization,
        norm_eps=1e-5 if spec.normalization == "LayerNorm" else 1e-6, activation=spec.activation,
        position_embedding=spec.position_embedding, rotary_base=float(spec.rotary_base), rope_scaling_factor=None,
        max_position_embeddings=spec.max_position_embeddings, tie_embeddings=spec.tie_embeddings,
        qk_layernorm=spec.qk_layernorm, add_bias_linear=family == "gpt2", add_qkv_bias=False, init_std=spec.init_std,
    )


def arch_from_hf_config(hf: dict[str, Any]) -> ModelArch:
    """Read a Llama / Mistral / Qwen2 / Qwen3 / GPT-2 `config.json` dict."""
    family = hf.get("model_type")
    if family not in HF_FAMILIES:
        raise ValueError(f"unsupported HF model_type {family!r}; supported: {list(HF_FAMILIES)}")
    if family == "gpt2":
        hidden, heads = hf["n_embd"], hf["n_head"]
        act = hf.get("activation_function", "gelu_new")
        if act != "gelu":
            raise ValueError(f"GPT-2 activation {act!r} is not supported (Megatron's GELU is the exact erf form: "
                             "use activation_function='gelu')")
        return ModelArch(
            family="gpt2", num_layers=hf["n_layer"], hidden_size=hidden, num_attention_heads=heads,
            num_query_groups=heads, head_dim=hidden // heads, ffn_hidden_size=hf.get("n_inner") or 4 * hidden,
            vocab_size=hf["vocab_size"], normalization="LayerNorm", norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            activation="gelu", position_embedding="learned_absolute", rotary_base=10000.0, rope_scaling_factor=None,
            max_position_embeddings=hf["n_positions"], tie_embeddings=hf.get("tie_word_embeddings", True),
            qk_layernorm=False, add_bias_linear=True, add_qkv_bias=False,
            init_std=hf.get("initializer_range", 0.02))
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{family}: hidden_act {hf.get('hidden_act')!r} is not supported (expected 'silu')")
    if (family != "qwen2" and hf.get("attention_bias")) or hf.get("mlp_bias"):
        raise ValueError(f"{family}: attention_bias / mlp_bias put biases on o_proj / the MLP, which Megatron's "
                         "QKV-only bias (add_qkv_bias) cannot hold; not supported")
    # transformers >= 5 writes RoPE settings (incl. llama3 scaling) under `rope_parameters`
    scaling = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type not in (None, "default", "llama3"):
        raise ValueError(f"{family}: rope_scaling type {rope_type!r} is not supported (default or llama3 only)")
    if rope_type == "llama3" and (scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0),
                                  scaling.get("original_max_position_embeddings", 8192)) != (1.0, 4.0, 8192):
        raise ValueError(f"{family}: llama3 rope_scaling must use Megatron's fixed low/high factors 1/4 and 8192")
    rope_theta = hf.get("rope_theta", (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    return ModelArch(
        family=family, num_layers=hf["num_hidden_layers"], hidden_size=hidden, num_attention_heads=heads,
        num_query_groups=hf.get("num_key_value_heads") or heads, head_dim=hf.get("head_dim") or hidden // heads,
        ffn_hidden_size=hf["intermediate_size"], vocab_size=hf["vocab_size"], normalization="RMSNorm",
        norm_eps=hf.get("rms_norm_eps", 1e-6), activation="swiglu", position_embedding="rope",
        rotary_base=float(rope_theta), rope_scaling_factor=scaling.get("factor") if rope_type == "llama3" else None,
        max_position_embeddings=hf["max_position_embeddings"], tie_embeddings=hf.get("tie_word_embeddings", False),
        qk_layernorm=family == "qwen3", add_bias_linear=False,
        add_qkv_bias=family == "qwen2" or bool(hf.get("attention_bias", False)),
        init_std=hf.get("initializer_range", 0.02))


def arch_from_hf(path: str | Path) -> ModelArch:
    config_path = Path(path) / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"no HF config at {config_path.resolve()} (checkpoints are never downloaded)")
    return arch_from_hf_config(json.loads(config_path.read_text()))


# ------------------------------------------------------------------------------- NeMo-framework recipes
BRIDGE_MISSING = ("needs Megatron-Bridge (`pip install megatron-bridge`, or the NeMo Framework container), which "
                  "is not installed here; use model.source: hf with a local checkpoint (model.path) instead")


@dataclass(frozen=True)
class RecipeLayout:
    """A recipe's default model-parallel layout (its provider's TP / PP / CP fields)."""

    tp: int
    pp: int
    cp: int
    sequence_parallel: bool = False
    virtual_pp: int | None = None


@dataclass(frozen=True)
class RecipeModel:
    """What a Megatron-Bridge recipe fixes for this project: the architecture and the default layout."""

    recipe: str  # the recipe function that was called (e.g. "llama3_8b_pretrain_config")
    arch: ModelArch
    layout: RecipeLayout
    hf_model_id: str | None  # HF checkpoint the provider was converted from (AutoBridge), when recorded


def _bridge_recipes(name: str) -> Any:
    """`megatron.bridge.recipes`, imported lazily (GPU containers only); a clear ImportError elsewhere."""
    try:
        from megatron.bridge import recipes
    except ImportError as err:
        raise ImportError(f"model.source 'recipe' ({name!r}) {BRIDGE_MISSING}") from err
    return recipes


def resolve_recipe(name: str, recipes: Any) -> tuple[str, Any]:
    """`(function name, zero-argument callable)` of recipe `name` in the `megatron.bridge.recipes` namespace.

    Looked up, in order: `name` itself (a full recipe function such as `llama3_8b_pretrain_config`),
    `{name}_pretrain_config` (Megatron-Bridge ≥ 0.2: `llama3_8b` → `llama3_8b_pretrain_config`), and the
    0.1-style module `recipes.<family>.<name>` with its `model_config()`. Raises ValueError with the closest
    names otherwise.
    """
    for candidate in (name, f"{name}_pretrain_config"):
        function = getattr(recipes, candidate, None)
        if callable(function) and not isinstance(function, type):
            return candidate, function
    for family in _recipe_families(recipes):
        try:
            module = importlib.import_module(f"{recipes.__name__}.{family}.{name}")
        except ImportError:
            continue
        if callable(getattr(module, "model_config", None)):
            return f"{family}.{name}.model_config", module.model_config
    known = sorted(n.removesuffix("_pretrain_config") for n in dir(recipes) if n.endswith("_pretrain_config"))
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
    hint = f"; closest: {close}" if close else (f"; known: {known[:20]}" if known else "")
    raise ValueError(f"unknown Megatron-Bridge recipe {name!r}{hint}")


def _recipe_families(recipes: Any) -> list[str]:
    """Sub-packages of the recipes package (`llama`, `qwen`, …); none for a plain namespace."""
    path = getattr(recipes, "__path__", None)
    return [] if path is None else sorted(m.name for m in pkgutil.iter_modules(path) if m.ispkg)


_ABSENT = object()


def _provider_field(provider: Any, name: str, default: Any = _ABSENT) -> Any:
    """A provider field: on the provider itself (GPTModelProvider, a TransformerConfig) or on its nested
    `transformer` config (Megatron-Bridge's builder-backed `ModelConfig`)."""
    for owner in (provider, getattr(provider, "transformer", None)):
        if owner is not None and hasattr(owner, name):
            return getattr(owner, name)
    if default is _ABSENT:
        raise ValueError(f"the recipe's model provider {type(provider).__name__} has no field {name!r}")
    return default


def _activation(provider: Any) -> Literal["swiglu", "gelu"]:
    function = _provider_field(provider, "activation_func")
    function_name = function if isinstance(function, str) else getattr(function, "__name__", repr(function))
    gated = bool(_provider_field(provider, "gated_linear_unit", False))
    if gated and function_name == "silu":
        return "swiglu"
    if not gated and function_name == "gelu":
        return "gelu"
    raise ValueError(f"activation {function_name!r} (gated_linear_unit={gated}) is not supported: "
                     "SwiGLU (silu, gated) or exact GELU (gelu, not gated) only")


def _rope_scaling_factor(provider: Any) -> float | None:
    """Llama-3.1 RoPE scaling: `scale_factor` (Bridge 0.1 `Llama31ModelProvider`) or `rope_scaling` +
    `rope_scaling_factor` (later providers); Megatron's fixed low/high factors 1/4 and 8192 only."""
    if _provider_field(provider, "scale_factor", None) is not None:
        fixed = tuple(_provider_field(provider, k, d) for k, d in
                      (("low_freq_factor", 1.0), ("high_freq_factor", 4.0), ("old_context_len", 8192)))
        if fixed != (1.0, 4.0, 8192):
            raise ValueError(f"llama3 RoPE scaling with low/high factors and context {fixed} is not supported "
                             "(Megatron's fixed values are 1, 4 and 8192)")
        return float(_provider_field(provider, "scale_factor"))
    if _provider_field(provider, "rope_scaling", False):
        return float(_provider_field(provider, "rope_scaling_factor"))
    return None


def arch_from_provider(provider: Any, vocab_size: int | None = None) -> ModelArch:
    """Map a Megatron-Bridge model provider (a `TransformerConfig` with GPT fields) onto `ModelArch`.

    provider field → ModelArch: num_layers, hidden_size, num_attention_heads, num_query_groups (None → heads),
    kv_channels → head_dim (None → hidden / heads), ffn_hidden_size (None → 4·hidden), vocab_size (None →
    the `vocab_size` argument), normalization, layernorm_epsilon → norm_eps, activation_func +
    gated_linear_unit → activation, position_embedding_type, rotary_base, Llama-3.1 RoPE scaling,
    seq_length → max_position_embeddings, share_embeddings_and_output_weights → tie_embeddings,
    qk_layernorm, add_bias_linear, add_qkv_bias, init_method_std → init_std. The HF family follows the
    maths (QK-norm → qwen3, QKV bias → qwen2, else llama; LayerNorm + GELU + learned positions → gpt2).
    MoE, MLA, sliding-window attention, partial / interpolated / YaRN RoPE are rejected (ValueError).
    `seq_length` is Bridge's image of HF `max_position_embeddings`, but a recipe may lower it to its training
    length (e.g. 8192 for Llama-3.1), which then bounds the exported config (and vLLM's max_model_len).
    """
    if _provider_field(provider, "num_moe_experts", None):
        raise ValueError("mixture-of-experts recipes are not supported (dense decoders only)")
    if _provider_field(provider, "multi_latent_attention", False):
        raise ValueError("multi-latent-attention recipes are not supported")
    if _provider_field(provider, "window_size", None) is not None:
        raise ValueError("sliding-window attention is not supported")
    if float(_provider_field(provider, "rotary_percent", 1.0)) != 1.0:
        raise ValueError("partial rotary embeddings (rotary_percent < 1) are not supported")
    if _provider_field(provider, "seq_len_interpolation_factor", None) is not None:
        raise ValueError("linearly interpolated RoPE (seq_len_interpolation_factor) is not supported")
    position = _provider_field(provider, "position_embedding_type", "rope")
    if position not in ("rope", "learned_absolute"):
        raise ValueError(f"position_embedding_type {position!r} is not supported (rope or learned_absolute)")
    normalization = _provider_field(provider, "normalization")
    if normalization not in ("RMSNorm", "LayerNorm"):
        raise ValueError(f"normalization {normalization!r} is not supported (RMSNorm or LayerNorm)")
    vocab = _provider_field(provider, "vocab_size", None) or vocab_size
    if vocab is None:
        raise ValueError("the recipe's provider sets no vocab_size; pass the tokenizer's vocabulary size")
    hidden, heads = int(_provider_field(provider, "hidden_size")), int(_provider_field(provider, "num_attention_heads"))
    groups = int(_provider_field(provider, "num_query_groups", None) or heads)
    activation = _activation(provider)
    qk_layernorm = bool(_provider_field(provider, "qk_layernorm", False))
    add_bias_linear = bool(_provider_field(provider, "add_bias_linear", False))
    add_qkv_bias = bool(_provider_field(provider, "add_qkv_bias", False))
    family: Family | None = None
    if (normalization, activation, position) == ("RMSNorm", "swiglu", "rope") and not add_bias_linear:
        family = "qwen3" if qk_layernorm else "qwen2" if add_qkv_bias else "llama"
    elif ((normalization, activation, position) == ("LayerNorm", "gelu", "learned_absolute") and add_bias_linear
          and not qk_layernorm and groups == heads):
        family = "gpt2"
    return ModelArch(
        family=family, num_layers=int(_provider_field(provider, "num_layers")), hidden_size=hidden,
        num_attention_heads=heads, num_query_groups=groups,
        head_dim=int(_provider_field(provider, "kv_channels", None) or hidden // heads),
        ffn_hidden_size=int(_provider_field(provider, "ffn_hidden_size", None) or 4 * hidden), vocab_size=int(vocab),
        normalization=normalization, norm_eps=float(_provider_field(provider, "layernorm_epsilon", 1e-5)),
        activation=activation, position_embedding=position,
        rotary_base=float(_provider_field(provider, "rotary_base", 10000)), rope_scaling_factor=_rope_scaling_factor(provider),
        max_position_embeddings=int(_provider_field(provider, "seq_length")),
        tie_embeddings=bool(_provider_field(provider, "share_embeddings_and_output_weights", False)),
        qk_layernorm=qk_layernorm, add_bias_linear=add_bias_linear, add_qkv_bias=add_qkv_bias and not add_bias_linear,
        init_std=float(_provider_field(provider, "init_method_std", 0.02)),
    )


def layout_from_provider(provider: Any) -> RecipeLayout:
    """The recipe's default TP / PP / CP (+ sequence parallel, virtual pipeline) from its provider."""
    return RecipeLayout(
        tp=int(_provider_field(provider, "tensor_model_parallel_size", 1)),
        pp=int(_provider_field(provider, "pipeline_model_parallel_size", 1)),
        cp=int(_provider_field(provider, "context_parallel_size", 1)),
        sequence_parallel=bool(_provider_field(provider, "sequence_parallel", False)),
        virtual_pp=_provider_field(provider, "virtual_pipeline_model_parallel_size", None))


def _hf_model_id(provider: Any) -> str | None:
    """The HF id the provider was built from: `hf_model_id` (GPTModelProvider) or the builder-backed
    config's `extra_checkpoint_metadata["hf_model_id"]`."""
    direct = _provider_field(provider, "hf_model_id", None)
    if direct:
        return str(direct)
    metadata = _provider_field(provider, "extra_checkpoint_metadata", None) or {}
    return str(metadata["hf_model_id"]) if metadata.get("hf_model_id") else None


def recipe_model(name: str, vocab_size: int | None = None, *, recipes: Any = None) -> RecipeModel:
    """Resolve and build the Megatron-Bridge recipe `name`; map its model provider and default layout.

    `recipes` defaults to `megatron.bridge.recipes` (ImportError naming the package and the `hf` alternative
    when Megatron-Bridge is missing). Recent recipes build their provider with
    `AutoBridge.from_hf_pretrained(<hub id>)`, which needs that model's config.json in the local HF cache
    on machines without hub access; a failure there is re-raised as a RuntimeError saying so.
    """
    recipes = _bridge_recipes(name) if recipes is None else recipes
    resolved, function = resolve_recipe(name, recipes)
    try:
        built = function()
    except Exception as err:  # the recipe's own failure (often: no HF config reachable)
        raise RuntimeError(
            f"Megatron-Bridge recipe {resolved!r} could not build its config ({type(err).__name__}: {err}). "
            "Recent recipes read the model's HF config through AutoBridge.from_hf_pretrained(<hub id>): put it "
            "in the local HF cache (HF_HUB_OFFLINE=1), or use model.source: hf with a local checkpoint") from err
    provider = getattr(built, "model", built)  # a ConfigContainer's model provider, or a provider itself
    return RecipeModel(recipe=resolved, arch=arch_from_provider(provider, vocab_size),
                       layout=layout_from_provider(provider), hf_model_id=_hf_model_id(provider))


def arch_from_recipe(name: str, vocab_size: int | None = None) -> ModelArch:
    """A NeMo-framework (Megatron-Bridge) recipe's architecture; see `recipe_model`."""
    return recipe_model(name, vocab_size).arch


def model_arch(agent: AgentConfig, tokenizer_vocab: int | None = None) -> ModelArch:
    """The architecture of an agent's model. Tiny models take their vocabulary from the tokenizer."""
    source = agent.model
    if source.source == "tiny":
        if tokenizer_vocab is None:
            raise ValueError(f"agent {agent.name!r}: a tiny model needs the tokenizer's vocabulary size")
        return arch_from_tiny(source.tiny, tokenizer_vocab)
    if source.source == "hf":
        return arch_from_hf(source.path)
    return arch_from_recipe(source.recipe, tokenizer_vocab)


def transformer_config(arch: ModelArch, parallel: ParallelConfig, precision: PrecisionConfig,
                       device: Literal["cpu", "cuda"] = "cpu", **overrides: Any):
    """Megatron `TransformerConfig` for `arch` under the agent's layout and numerics.

    CPU: fp32 (fp16 for tests), no fusions (their kernels need CUDA), no sequence parallel (torch's LayerNorm refuses it on CPU).
    CUDA: the dtype asked for, each fusion where its kernel exists (`cuda_fusions`: a GPU without Transformer
    Engine trains too, with the unfused paths), and FP8 (format, recipe, fp8_param, BF16 first/last layers) mapped
    onto Megatron's fields.
    """
    from megatron.core.transformer.transformer_config import TransformerConfig

    dtype = DTYPES[precision.dtype]
    on_gpu = device == "cuda"
    # fp16 runs on CPU (slowly), so its loss scaling is tested there; a run's config check still asks for fp32
    if not on_gpu and (precision.dtype == "bf16" or precision.fp8 is not None):
        raise ValueError("CPU training runs in fp32 without FP8 (precision.dtype: fp32, precision.fp8: null; "
                         "fp16 builds too, for tests)")
    fields: dict[str, Any] = dict(
        num_layers=arch.num_layers, hidden_size=arch.hidden_size, ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_attention_heads, num_query_groups=arch.num_query_groups,
        kv_channels=arch.head_dim, normalization=arch.normalization, layernorm_epsilon=arch.norm_eps,
        gated_linear_unit=arch.activation == "swiglu",
        activation_func=torch.nn.functional.silu if arch.activation == "swiglu" else torch.nn.functional.gelu,
        add_bias_linear=arch.add_bias_linear, add_qkv_bias=arch.add_qkv_bias or arch.add_bias_linear,
        qk_layernorm=arch.qk_layernorm, init_method_std=arch.init_std,
        hidden_dropout=0.0, attention_dropout=0.0,  # RL fine-tuning: log-probs must be deterministic
        tensor_model_parallel_size=parallel.tp, pipeline_model_parallel_size=parallel.pp,
        context_parallel_size=parallel.cp, sequence_parallel=parallel.sequence_parallel,
        params_dtype=dtype, pipeline_dtype=dtype, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
        gradient_accumulation_fusion=False, persist_layer_norm=False,
        **cuda_fusions(arch, on_gpu),
    )
    if precision.fp8 is not None:
        fields.update(fp8=precision.fp8, fp8_recipe=precision.fp8_recipe, fp8_param=precision.fp8_param,
                      first_last_layers_bf16=precision.first_last_layers_bf16,
                      num_layers_at_start_in_bf16=precision.num_layers_at_start_in_bf16,
                      num_layers_at_end_in_bf16=precision.num_layers_at_end_in_bf16)
    return TransformerConfig(**(fields | overrides))


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def transformer_engine_available() -> bool:
    """Transformer Engine can be imported here: the trainer then uses its layer spec on CUDA (fused attention,
    FP8), else Megatron's local spec."""
    return _module_exists("transformer_engine")


def _rope_fusion_available() -> bool:
    """Megatron's fused RoPE is Transformer Engine's kernel (megatron-core refuses `apply_rope_fusion` at config
    time without it: "apply_rope_fusion is not available. Please install TE >= 1.4")."""
    from megatron.core.models.common.embeddings import rope_utils

    return rope_utils.fused_apply_rotary_pos_emb is not None or rope_utils.fused_apply_rotary_pos_emb_thd is not None


def cuda_fusions(arch: ModelArch, on_gpu: bool, *, rope_kernel: bool | None = None,
                 softmax_kernel: bool | None = None) -> dict[str, bool]:
    """Megatron's fusion switches, each on only where its kernel exists (all off on CPU):

    - `bias_dropout_fusion`, `bias_activation_fusion`: torch.jit-scripted, any CUDA torch (the latter only with
      SwiGLU or a biased GELU, the combinations megatron-core accepts);
    - `apply_rope_fusion`: Transformer Engine's fused RoPE (`rope_kernel`; None: look for it);
    - `masked_softmax_fusion`: the compiled `scaled_masked_softmax_cuda` extension (`softmax_kernel`; None: look
      for it) — megatron-core imports it at the first forward of the local spec's attention, a fusion left on
      without it fails there, not at start-up. Transformer Engine's attention does not read it.

    A first run on an H200 with torch + megatron-core and no Transformer Engine stopped at start-up on the rope
    fusion (issue #38).
    """
    if not on_gpu:
        return dict(bias_dropout_fusion=False, apply_rope_fusion=False, masked_softmax_fusion=False,
                    bias_activation_fusion=False)
    rope = _rope_fusion_available() if rope_kernel is None else rope_kernel
    softmax = _module_exists("scaled_masked_softmax_cuda") if softmax_kernel is None else softmax_kernel
    activation = arch.activation == "swiglu" or arch.add_bias_linear
    return dict(bias_dropout_fusion=True, apply_rope_fusion=rope and arch.position_embedding == "rope",
                masked_softmax_fusion=softmax, bias_activation_fusion=activation)


def layer_spec(arch: ModelArch, use_te: bool, core_attention: type | None = None):
    """Megatron layer spec: Transformer Engine on GPU (needed for FP8), the local torch spec otherwise.

    `core_attention` replaces the spec's attention kernel class (e.g. the trainer's packed-sequence
    `PackedDotProductAttention` on the local spec); None keeps the spec's own.
    """
    from megatron.core.models.gpt import gpt_layer_specs

    if use_te:
        try:
            import transformer_engine  # noqa: F401
        except ImportError as err:
            raise ImportError("the Transformer Engine layer spec (GPU, FP8) needs transformer-engine; "
                              "install the `gpu` extra or use the NGC container") from err
        spec = gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=arch.qk_layernorm)
    else:
        spec = gpt_layer_specs.get_gpt_layer_local_spec(normalization=arch.normalization,
                                                        qk_layernorm=arch.qk_layernorm)
    if core_attention is None:
        return spec
    attention = spec.submodules.self_attention
    attention = dataclasses.replace(attention, submodules=dataclasses.replace(attention.submodules,
                                                                              core_attention=core_attention))
    return dataclasses.replace(spec, submodules=dataclasses.replace(spec.submodules, self_attention=attention))


def build_gpt_model(arch: ModelArch, config, *, use_te: bool = False, pre_process: bool = True,
                    post_process: bool = True, vp_stage: int | None = None, core_attention: type | None = None):
    """A Megatron `GPTModel` (this rank's pipeline stage) for `arch`; `config` from `transformer_config`."""
    from megatron.core.models.gpt import GPTModel

    return GPTModel(
        config=config, transformer_layer_spec=layer_spec(arch, use_te, core_attention),
        vocab_size=arch.padded_vocab_size(config.tensor_model_parallel_size),
        max_sequence_length=arch.max_position_embeddings, pre_process=pre_process, post_process=post_process,
        share_embeddings_and_output_weights=arch.tie_embeddings, position_embedding_type=arch.position_embedding,
        rotary_base=int(arch.rotary_base), rope_scaling=arch.rope_scaling_factor is not None,
        rope_scaling_factor=arch.rope_scaling_factor or 8.0, vp_stage=vp_stage,
    )

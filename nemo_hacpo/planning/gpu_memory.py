"""The memory model behind `--plan`: every constant with its source, every term a small pure function of the
architecture and the layout. Sizes are in GiB (2^30 bytes) unless a name ends in `_bytes`.

Sources are of three kinds: **docs** (a document or a library's source read here, named), **measured** (on this
project's CPU machine, how is said) and **derived** (computed from the shapes; the formula is in the docstring).
Where only an estimate exists it says so and gives the range it was taken from; `benchmarks/gpu_two_agent_step.py`
measures the real numbers on the first GPU run, and these constants are then to be replaced by them.

Two processes share each GPU of a colocated agent: the trainer rank and the vLLM worker that its engine placed
there (vLLM's front end runs inside the engine rank; its engine core process holds no GPU memory). Each has its
own CUDA context and its own NCCL communicators.
"""

from __future__ import annotations

import math

from nemo_hacpo.models.architecture import ModelArch

GIB = 1024**3

H100_REPORTED_GIB = 79.6
"""docs: an H100 SXM5 80 GB reports 81559 MiB = 79.65 GiB total (nvidia-smi `memory.total`, the same as
`torch.cuda.mem_get_info()[1]`), not 80: `runtime.cluster.gpu_memory_gib` of pair_large."""

MARGIN = 0.9
"""Usable fraction of a GPU's reported memory: every phase must stay under 90 % of it. The 10 % left is for the
caching allocator's fragmentation and the error of the estimates below; the CUDA contexts and NCCL buffers are
counted as terms of their own, not inside this margin."""

CUDA_CONTEXT_GIB = 0.75
"""Per process. docs: a CUDA context takes 287 MB with lazy module loading (pytorch/pytorch#86509; the default
since CUDA 12.2, docs.nvidia.com 'Lazy Loading'), 667 MB loaded eagerly; the kernels a trainer (cuBLAS, cuDNN,
Transformer Engine, flash attention) or a vLLM worker then loads on use and cuBLAS's workspaces add to it — an
estimate between the two figures plus that, rounded up."""

NCCL_COMMUNICATOR_GIB = 0.5
"""Per NCCL communicator that runs collectives. derived: NCCL_BUFFSIZE = 4 MiB for the Simple protocol (NCCL's
documented default) plus the LL128 and LL buffers ≈ 9 MiB per channel and peer, times up to 32 channels on
NVLink (NCCL_MAX_NCHANNELS) ≈ 0.3 GiB for a ring, more with tree or NVLS buffers: 0.5 assumed."""

VLLM_GRAPH_POOLS_GIB = 1.5
"""Per vLLM worker: its `cudagraph` and `runtime` memory pools. Neither is a deferrable tag
(`vllm/device_allocator/__init__.py`: DEFERRABLE_TAGS = ("weights", "kv_cache")), so `wake_up(["weights"])`
brings them back too (`device_allocator/cumem.py`: every non-deferrable tag is always loaded), and every sleep
backs them up to pinned host memory (`sleep_mode_backend.py`: offload_tags = ("runtime", "cudagraph")). Estimate:
vLLM's start-up line 'Graph capturing finished … took X GiB' reports about 0.3–1.5 GiB for dense 8B–70B models
at the default capture sizes; the upper end is taken."""

VLLM_MAX_NUM_BATCHED_TOKENS = 16384
VLLM_MAX_NUM_SEQS = 1024
"""docs: vLLM 0.32's offline (`LLM` class) defaults on GPUs with ≥ 70 GiB that are not A100s
(`vllm/engine/arg_utils.py`, _set_default_max_num_seqs_and_batched_tokens_args): its profiling run — the
activation peak it keeps free of KV cache — uses these."""

FP8_WEIGHT_CACHE_BYTES = 2
"""Bytes per linear-layer weight element that Transformer Engine adds in FP8 training. derived: it caches each
weight quantized for the micro-batches of an update, row-wise and column-wise (for the backward GEMM) at 1 byte
each; the block scales (one fp32 per 128 × 128 block) are negligible."""

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


# --------------------------------------------------------------------------------------------- shapes
def parameter_counts(arch: ModelArch, tp: int = 1) -> tuple[int, int, int]:
    """(embedding, one transformer layer, output layer) parameter counts, with the padded vocabulary."""
    h, d, f = arch.hidden_size, arch.head_dim, arch.ffn_hidden_size
    vocab = arch.padded_vocab_size(tp)
    q, kv = arch.num_attention_heads * d, arch.num_query_groups * d
    attention = h * (q + 2 * kv) + q * h
    if arch.add_bias_linear:
        attention += q + 2 * kv + h
    elif arch.add_qkv_bias:
        attention += q + 2 * kv
    mlp = h * f * (2 if arch.activation == "swiglu" else 1) + f * h
    if arch.add_bias_linear:
        mlp += f * (2 if arch.activation == "swiglu" else 1) + h
    norms = (2 if arch.normalization == "LayerNorm" else 1) * 2 * h + (2 * d if arch.qk_layernorm else 0)
    embedding = vocab * h + (arch.max_position_embeddings * h if arch.position_embedding == "learned_absolute" else 0)
    output = 0 if arch.tie_embeddings else vocab * h
    return embedding, attention + mlp + norms, output


def total_parameters(arch: ModelArch) -> int:
    embedding, layer, output = parameter_counts(arch)
    final_norm = (2 if arch.normalization == "LayerNorm" else 1) * arch.hidden_size
    return embedding + arch.num_layers * layer + output + final_norm


def layer_tensors(arch: ModelArch, tp: int) -> dict[str, int]:
    """Element counts of one transformer layer's tensors on one TP rank (Megatron's or vLLM's fused layout: QKV
    in one tensor, gate and up in one; norms replicated)."""
    h, d, f = arch.hidden_size, arch.head_dim, arch.ffn_hidden_size
    q, kv = arch.num_attention_heads * d, arch.num_query_groups * d
    up = (2 if arch.activation == "swiglu" else 1) * f
    norm = 2 * h if arch.normalization == "LayerNorm" else h
    tensors = {"qkv": (q + 2 * kv) * h // tp, "proj": h * q // tp, "fc1": up * h // tp, "fc2": h * f // tp,
               "input_norm": norm, "mlp_norm": norm}
    if arch.qk_layernorm:
        tensors |= {"q_norm": d, "k_norm": d}
    if arch.add_bias_linear:
        tensors |= {"qkv_bias": (q + 2 * kv) // tp, "proj_bias": h, "fc1_bias": up // tp, "fc2_bias": h}
    elif arch.add_qkv_bias:
        tensors |= {"qkv_bias": (q + 2 * kv) // tp}
    return tensors


LINEAR_WEIGHTS = ("qkv", "proj", "fc1", "fc2")


def stage_tensors(arch: ModelArch, tp: int, pp: int) -> list[int]:
    """Element counts of every parameter tensor on one rank of the busiest pipeline stage: its L/PP layers plus
    the embedding (stage 0), or with PP = 1 the embedding, the output layer and the final norm."""
    vocab_rows = arch.padded_vocab_size(tp) // tp
    embedding = [vocab_rows * arch.hidden_size]
    if arch.position_embedding == "learned_absolute":
        embedding.append(arch.max_position_embeddings * arch.hidden_size)
    ends = embedding if pp > 1 else embedding + ([] if arch.tie_embeddings else [vocab_rows * arch.hidden_size]) + \
        [arch.hidden_size * (2 if arch.normalization == "LayerNorm" else 1)]
    layers = -(-arch.num_layers // pp)
    return ends + [n for _ in range(layers) for n in layer_tensors(arch, tp).values()]


def stage_linear_weights(arch: ModelArch, tp: int, pp: int) -> int:
    """Elements of the busiest stage's linear-layer weights on one TP rank (what FP8 GEMMs quantize)."""
    per_layer = layer_tensors(arch, tp)
    return -(-arch.num_layers // pp) * sum(per_layer[name] for name in LINEAR_WEIGHTS)


def serving_tensors(arch: ModelArch, vllm_tp: int) -> list[int]:
    """Element counts of the tensors one vLLM TP worker holds: every layer, the vocabulary rows split over TP
    (vLLM pads them to a multiple of 64, not 128·TP: the difference is ignored)."""
    return stage_tensors(arch, vllm_tp, 1)


def largest_gathered_bytes(arch: ModelArch, tp: int, dtype_bytes: int) -> int:
    """Bytes of the largest full (TP-gathered) Megatron tensor: the padded embedding / output layer, or a fused
    QKV or gate-up weight (`models.hf_conversion.export_hf_weights` gathers one at a time)."""
    per_layer = layer_tensors(arch, 1)
    rows = arch.padded_vocab_size(tp) * arch.hidden_size
    return max(rows, per_layer["qkv"], per_layer["fc1"]) * dtype_bytes


def largest_module_bytes(arch: ModelArch, vllm_tp: int, dtype_bytes: int) -> int:
    """Bytes of the largest module one vLLM worker re-materializes in a layer-wise reload: the embedding or
    lm_head shard (vocabulary rows / TP), or a fused QKV / gate-up shard."""
    per_layer = layer_tensors(arch, vllm_tp)
    vocab_rows = -(-arch.vocab_size // vllm_tp)
    return max(vocab_rows * arch.hidden_size, per_layer["qkv"], per_layer["fc1"]) * dtype_bytes


# ----------------------------------------------------------------------------------------- terms (GiB)
def activation_gib(arch: ModelArch, seq: int, micro_batch: int, tp: int, sequence_parallel: bool,
                   dtype_bytes: int) -> float:
    """Activations kept for the backward pass, stage 0 of a 1F1B schedule (~L layers' worth), flash attention,
    no recompute (Korthikanti et al. 2022, Table 2): bytes = L · s · b · h · k · bytes/2, k = 34/TP with sequence
    parallelism, 10 + 24/TP without. The plan sizes every micro-batch at max_prompt + max_response tokens
    (Qwen3's long answers fill max_response_length)."""
    per_element = 34 / tp if sequence_parallel else 10 + 24 / tp
    return arch.num_layers * seq * micro_batch * arch.hidden_size * per_element * dtype_bytes / 2 / GIB


def logits_gib(arch: ModelArch, seq: int, micro_batch: int, tp: int) -> float:
    """fp32 logits, their log-softmax and their gradient on the last stage: s · b · V/TP · 4 · 3 bytes."""
    return seq * micro_batch * arch.padded_vocab_size(tp) / tp * 4 * 3 / GIB


def trainer_communicators(tp: int, pp: int, dp: int) -> int:
    """NCCL communicators a trainer rank runs collectives on: the world (metrics, barriers), TP if > 1, DP if
    > 1, and with PP > 1 the pipeline's point-to-point group and the embedding group (tied-gradient all-reduce)."""
    return 1 + (tp > 1) + (dp > 1) + 2 * (pp > 1)


def vllm_activation_gib(arch: ModelArch, vllm_tp: int) -> float:
    """The activation peak vLLM's profiling run keeps free of KV cache. derived: T = VLLM_MAX_NUM_BATCHED_TOKENS
    tokens through one layer — residual and normed input (2·h), QKV ((q + 2kv)/TP), gate-up (2f/TP) and the
    activation (f/TP), bf16 — plus the sampler's fp32 logits and log-softmax for VLLM_MAX_NUM_SEQS sequences
    over the whole vocabulary: bytes = T·(2h + (q+2kv)/TP + 3f/TP)·2 + S·V·4·2."""
    per_layer = layer_tensors(arch, vllm_tp)
    width = 2 * arch.hidden_size + per_layer["qkv"] // arch.hidden_size + 3 * arch.ffn_hidden_size // vllm_tp
    return (VLLM_MAX_NUM_BATCHED_TOKENS * width * 2 + VLLM_MAX_NUM_SEQS * arch.vocab_size * 4 * 2) / GIB


def kv_bytes_per_token(arch: ModelArch, vllm_tp: int) -> float:
    """K and V of every layer for one token on one worker, bf16: 2 · L · max(1, g/TP) · d · 2 bytes (a KV head
    is replicated when TP exceeds the KV heads)."""
    heads = max(1.0, arch.num_query_groups / vllm_tp)
    return 2 * arch.num_layers * heads * arch.head_dim * 2


def pow2ceil(n: int) -> int:
    """The next power of two ≥ n (n ≥ 1)."""
    return 1 << max(0, math.ceil(math.log2(n))) if n > 1 else 1


def pinned_gib(numels: list[int], element_bytes: int, copies: int = 1, shards: int = 1) -> float:
    """Host bytes of pinned buffers for these tensors, `copies` buffers each of numel/shards elements.

    docs: torch's CachingHostAllocator rounds every pinned allocation up to a power of two and keeps freed
    blocks cached until `torch._C._host_emptyCache()` (`torch/include/ATen/core/CachingHostAllocator.h`,
    PowerOf2Ceil; its default thresholds never skip the rounding). Example: a 42 MB tensor holds a 64 MiB block.
    """
    return copies * sum(pow2ceil(max(1, -(-n // shards)) * element_bytes) for n in numels) / GIB

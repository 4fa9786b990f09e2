"""The memory model behind `--plan`: every constant with its source, every term a small pure function of the
architecture and the layout. Sizes are in GiB (2^30 bytes) unless a name ends in `_bytes`.

Sources are of four kinds: **measured on a GPU** (the first H200 run, issue #38: `benchmarks/gpu_memory.py`
reproduces it on any GPU in one command), **measured** on this project's CPU machine, **docs** (a document or a
library's source read here, named) and **derived** (computed from the shapes; the formula is in the docstring).
Where only an estimate exists it says so.

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
caching allocator's fragmentation and the error of the estimates below; the processes' memory outside the
allocator and the NCCL buffers are counted as terms of their own, not inside this margin."""

TRAINER_PROCESS_GIB = 2.42
"""Per trainer rank, GPU memory outside torch's caching allocator. measured on a GPU (H200, torch 2.11 + CUDA 13,
megatron-core 0.16.1, no Transformer Engine; `torch.cuda.mem_get_info` minus `memory_reserved`): 0.51 GiB with the
CUDA context alone, 0.60 after the first tensor, 1.15 after building the trainer (Megatron's process groups), 1.60
after the first forward (cuBLAS workspaces, kernels), 2.42 after the first optimizer step (the buffers of the
communicators its collectives created, in an NCCL world of one). Communicators over more than one rank add
NCCL_COMMUNICATOR_GIB each. Transformer Engine's kernels and workspaces were not there: an underestimate with TE."""

VLLM_PROCESS_GIB = 1.60
"""Per vLLM worker, outside its memory pools: not measured (vLLM was not on the GPU machine). Taken as the trainer's
measured context, kernels and cuBLAS workspaces before any collective (1.60 of TRAINER_PROCESS_GIB); its TP group's
communicator is counted as an NCCL_COMMUNICATOR_GIB of its own."""

NCCL_COMMUNICATOR_GIB = 0.5
"""Per NCCL communicator over more than one rank that runs collectives. derived: NCCL_BUFFSIZE = 4 MiB for the
Simple protocol (NCCL's documented default) plus the LL128 and LL buffers ≈ 9 MiB per channel and peer, times up to
32 channels on NVLink (NCCL_MAX_NCHANNELS) ≈ 0.3 GiB for a ring, more with tree buffers: 0.5 assumed. Valid with
NVLink SHARP off: its buffers take 1.6 GB for one communicator and ~6 GB for three or more on H100 switch systems
(NVIDIA/nccl issue 864), so the job script sets NCCL_NVLS_ENABLE=0 (as NeMo's launcher does)."""

LOGITS_BYTES_PER_ELEMENT = 6.4
"""GPU bytes per (token × vocabulary row of this TP rank) that the logits path holds at its peak. measured on a GPU
(one layer with Qwen3's vocabulary of 151,936, so that the logits dominate): 6.43 in the log-prob pass, 6.39 in
training net of the activations, the same at 2 × 2,048 tokens, doubling with the micro-batch (bf16 logits, the fp32
log-softmax of the vocab-parallel cross entropy and its gradient, not all alive at once: the former 4 · 3 = 12 was
twice too much). With a 32,000 vocabulary the other terms dominate and the ratio reads 11–15: not a logits figure."""

SCORE_BYTES_STORED = 6
"""Unfused attention (Megatron's local spec: the trainer's attention on a GPU without Transformer Engine), bytes per
attention score kept for the backward pass: the fp32 softmax output (softmax in fp32, `attention_softmax_in_fp32`)
and its bf16 copy that multiplies V. derived, and with the two below it matches the measured peaks (see
`activation_gib`)."""

SCORE_BYTES_BACKWARD = 6
"""Unfused attention: bytes per score of one layer's gradients alive in its backward pass (bf16 and fp32). Fitted:
what the H200 peaks left after every other term — 1.5 GiB for the Llama-3.2-1B shape (32 heads, 2 × 2,048
tokens: 2.7e8 scores per layer) and 3.4 for the 8-layer Qwen3-8B shape (32 heads, 1 × 4,096: 5.4e8)."""

VLLM_GRAPH_POOLS_GIB = 1.5
"""Per vLLM worker: its CUDA-graph memory. It stays on the GPU while the engine sleeps: `sleep_mode_offload_cudagraph`
defaults to False (`vllm/config/model.py`) and the engine does not set it, so the graphs are captured outside the
cuMem pool that sleep releases (`vllm/config/vllm.py`, `use_cumem_cudagraph_pool`) — every phase counts it. Estimate:
vLLM's start-up line 'Graph capturing finished … took X GiB' reports about 0.3–1.5 GiB for dense 8B–70B models at
the default capture sizes; the upper end is taken."""

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
def layer_activation_bytes(arch: ModelArch, tp: int, sequence_parallel: bool, fused_attention: bool,
                           dtype_bytes: int) -> float:
    """Bytes one layer keeps per token for its backward pass on one TP rank, no recompute, no dropout (RL: p = 0,
    torch keeps no mask). In 2-byte units (scaled by dtype_bytes / 2), with q = heads · d, kv = KV heads · d, f the
    MLP width:

        norms      8h      both norms' inputs and outputs (the QKV and fc1 GEMMs' inputs); / TP with sequence
                           parallelism
        attention  fused (Transformer Engine, flash): Q, K, V, the output: 4q + 4kv
                   unfused (the local spec): Q, K and V expanded to every head (GQA repeats K and V), the
                   output: 8q — plus the scores, `attention_score_gib`
        QK-norm    2q + 2kv  its inputs
        MLP        SwiGLU 6f (the gate-up output 2f, the activation's output f); GELU 4f

    every term but the norms / TP. Korthikanti et al. (2022) count 34h for GPT's blocks (f = 4h, dropout masks);
    this is the same count for SwiGLU, GQA and QK-norm without the masks (GPT here: 32h)."""
    h, d = arch.hidden_size, arch.head_dim
    q, kv = arch.num_attention_heads * d / tp, max(1.0, arch.num_query_groups / tp) * d
    norms = 8 * h / (tp if sequence_parallel else 1)
    attention = 4 * q + 4 * kv if fused_attention else 8 * q
    qk_norm = 2 * q + 2 * kv if arch.qk_layernorm else 0.0
    mlp = (6 if arch.activation == "swiglu" else 4) * arch.ffn_hidden_size / tp
    return (norms + attention + qk_norm + mlp) * dtype_bytes / 2


def activation_gib(arch: ModelArch, seq: int, micro_batch: int, tp: int, sequence_parallel: bool,
                   dtype_bytes: int, fused_attention: bool = True) -> float:
    """Activations kept for the backward pass, stage 0 of a 1F1B schedule (~L layers' worth: it holds PP
    micro-batches of L/PP layers), no recompute: L · s · b · `layer_activation_bytes`, plus with unfused attention
    the scores (`attention_score_gib`). The plan sizes every micro-batch at max_prompt + max_response tokens (Qwen3's
    long answers fill max_response_length).

    Against the measured training peaks net of weights, gradients and optimizer (H200, bf16, local spec,
    unfused): Llama-3.2-1B's shape at 2 × 2,048 tokens 33.6 GiB measured, 5.0 + scores 25.5 + logits 3.1 = 33.6
    planned; the 8-layer Qwen3-8B shape at 1 × 4,096, 35.7 measured, 4.6 + 27.0 + 3.7 = 35.3 planned
    (tests/unit/planning/test_gpu_memory.py)."""
    per_token = layer_activation_bytes(arch, tp, sequence_parallel, fused_attention, dtype_bytes)
    stored = arch.num_layers * seq * micro_batch * per_token / GIB
    return stored + (0.0 if fused_attention else attention_score_gib(arch, seq, micro_batch, tp))


def attention_score_gib(arch: ModelArch, seq: int, micro_batch: int, tp: int) -> float:
    """Unfused attention's s² terms: every layer keeps its scores (SCORE_BYTES_STORED each) and the backward pass of
    one layer holds their gradients too (SCORE_BYTES_BACKWARD): (L · 6 + 6) · (heads / TP) · s² · b bytes. 20 GiB
    and more at 4,096 tokens for 8 layers of 32 heads — what a GPU without Transformer Engine pays."""
    scores = arch.num_attention_heads / tp * seq * seq * micro_batch
    return (arch.num_layers * SCORE_BYTES_STORED + SCORE_BYTES_BACKWARD) * scores / GIB


def logits_gib(arch: ModelArch, seq: int, micro_batch: int, tp: int) -> float:
    """The logits path on the last stage: s · b · V/TP · LOGITS_BYTES_PER_ELEMENT (measured)."""
    return seq * micro_batch * arch.padded_vocab_size(tp) / tp * LOGITS_BYTES_PER_ELEMENT / GIB


def trainer_communicators(tp: int, pp: int, dp: int) -> int:
    """NCCL communicators over more than one rank that a trainer rank runs collectives on: the world (metrics,
    barriers) when it has more than one rank, TP if > 1, DP if > 1, and with PP > 1 the pipeline's point-to-point
    group and the embedding group (tied-gradient all-reduce). A world of one's are inside TRAINER_PROCESS_GIB."""
    return (tp * pp * dp > 1) + (tp > 1) + (dp > 1) + 2 * (pp > 1)


def vllm_activation_gib(arch: ModelArch, vllm_tp: int) -> float:
    """The activation peak vLLM's profiling run keeps free of KV cache. derived: T = VLLM_MAX_NUM_BATCHED_TOKENS
    tokens through one layer — residual and normed input (2·h), QKV ((q + 2kv)/TP), gate-up (2f/TP) and the
    activation (f/TP), bf16 — plus the sampler's fp32 logits and log-softmax for VLLM_MAX_NUM_SEQS sequences
    over the whole vocabulary: bytes = T·(2h + (q+2kv)/TP + 3f/TP)·2 + S·V·4·2."""
    per_layer = layer_tensors(arch, vllm_tp)
    width = 2 * arch.hidden_size + per_layer["qkv"] // arch.hidden_size + 3 * arch.ffn_hidden_size // vllm_tp
    return (VLLM_MAX_NUM_BATCHED_TOKENS * width * 2 + VLLM_MAX_NUM_SEQS * arch.vocab_size * 4 * 2) / GIB


def kv_bytes_per_token(arch: ModelArch, vllm_tp: int, dtype_bytes: int = 2) -> float:
    """K and V of every layer for one token on one worker: 2 · L · max(1, g/TP) · d · bytes (bf16 on GPUs; a KV
    head is replicated when TP exceeds the KV heads)."""
    heads = max(1.0, arch.num_query_groups / vllm_tp)
    return 2 * arch.num_layers * heads * arch.head_dim * dtype_bytes


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

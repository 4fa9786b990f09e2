"""Weights on the wire for a refit over `collective_rpc`: HF-layout `(name, tensor)` pairs as safetensors bytes.

vLLM's RPC encoder (msgpack) carries `bytes` natively but turns tensors inside untyped arguments into plain
lists, so each chunk travels as one safetensors blob (name → tensor, any dtype, no pickle) and is decoded in
the worker. Chunks keep the trainer's order (the engine's layer-wise reload finishes a layer as soon as all
of its weights have arrived) and are cut once they reach `chunk_bytes`, so the sender never holds more than
one chunk's copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

DEFAULT_CHUNK_BYTES = 256 << 20
"""Largest serialized chunk before a cut (one tensor larger than this travels alone)."""


def encode_chunk(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> bytes:
    """safetensors bytes of `named_tensors` (moved to CPU, made contiguous; duplicate names are an error).

    Tensors sharing storage (tied embeddings) are copied, because safetensors refuses shared storage.
    """
    from safetensors.torch import save

    tensors: dict[str, torch.Tensor] = {}
    seen_storage: set[int] = set()
    for name, tensor in named_tensors:
        if name in tensors:
            raise ValueError(f"weight {name!r} appears twice in one refit chunk")
        cpu = tensor.detach().to("cpu").contiguous()
        pointer = cpu.untyped_storage().data_ptr()
        if pointer in seen_storage:
            cpu = cpu.clone()
        seen_storage.add(cpu.untyped_storage().data_ptr())
        tensors[name] = cpu
    return save(tensors)


def decode_chunk(payload: bytes) -> list[tuple[str, torch.Tensor]]:
    """The `(name, tensor)` pairs of an `encode_chunk` payload (safetensors may order them differently)."""
    from safetensors.torch import load

    return list(load(payload).items())


def iter_chunks(weights: Iterable[tuple[str, torch.Tensor]],
                chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group `weights` in order into lists of ≥ 1 tensors whose total size first reaches `chunk_bytes`."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be ≥ 1, got {chunk_bytes}")
    chunk: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in weights:
        chunk.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= chunk_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk

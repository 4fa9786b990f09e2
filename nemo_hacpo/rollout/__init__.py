"""vLLM rollouts per agent: sampling, scoring fixed sequences, in-place weight refit, sleep/wake.

- :mod:`~nemo_hacpo.rollout.settings` — `EngineSettings` from an agent's config → `vllm.LLM` kwargs (pure).
- :mod:`~nemo_hacpo.rollout.sampling` — sampling parameters, EOS stop, per-request seeds (pure).
- :mod:`~nemo_hacpo.rollout.outputs` — `SampledResponse` / `GenerationResult`, the EOS contract, `agent_rollouts`.
- :mod:`~nemo_hacpo.rollout.mismatch` — `token_mult_prob_error` train/inference mismatch metric (pure).
- :mod:`~nemo_hacpo.rollout.engine` — `RolloutEngine` (imports vLLM when started).
- :mod:`~nemo_hacpo.rollout.protocol` — `RolloutBackend`, the calls the runtime may make on an engine.
- :mod:`~nemo_hacpo.rollout.refit` — the refit strategy per agent rank (`rpc` or `ipc`: bounded buckets, per-device
  staging buffers, the engine's own process group); :mod:`~nemo_hacpo.rollout.weight_wire` (the `rpc` chunks) and
  :mod:`~nemo_hacpo.rollout.worker_extension` (what the engine's workers run).

Importing this package does not import vLLM (8 s); `RolloutEngine` does when an engine starts.
"""

from nemo_hacpo.rollout.engine import RolloutEngine
from nemo_hacpo.rollout.mismatch import pad_ragged, ragged_token_mult_prob_error, token_mult_prob_error
from nemo_hacpo.rollout.outputs import (
    GenerationResult,
    ResponseError,
    SampledResponse,
    agent_rollouts,
    check_response,
)
from nemo_hacpo.rollout.protocol import RolloutBackend
from nemo_hacpo.rollout.sampling import SamplingSettings, call_base_seed, request_seeds, sampling_kwargs
from nemo_hacpo.rollout.settings import EngineSettings, engine_settings, llm_kwargs

__all__ = [
    "EngineSettings", "GenerationResult", "ResponseError", "RolloutBackend", "RolloutEngine", "SampledResponse", "SamplingSettings",
    "agent_rollouts", "call_base_seed", "check_response", "engine_settings", "llm_kwargs", "pad_ragged",
    "ragged_token_mult_prob_error", "request_seeds", "sampling_kwargs", "token_mult_prob_error",
]

"""The seam between the runtime and an agent's rollout engine: what a rank may call on its engine.

`RolloutEngine` (vLLM) implements it and `AgentRank.engine` is typed with it, so another real implementation
(e.g. an engine in its own Ray actor forwarding each call) can stand in without touching the worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

import torch

from nemo_hacpo.models.chat import Message
from nemo_hacpo.rollout.outputs import GenerationResult, RefitStats
from nemo_hacpo.rollout.sampling import SamplingSettings


@runtime_checkable
class RolloutBackend(Protocol):
    """Generate, score, refit, sleep/wake and report — per agent, started once per run."""

    def generate(self, prompts: Sequence[Sequence[Message] | Sequence[dict]], n: int, *,
                 max_tokens: int | None = None, seed: int | None = None,
                 sampling: SamplingSettings | None = None) -> GenerationResult:
        """G = n responses per chat prompt: `result.responses[b][g]` (`sampling` overrides the agent's)."""
        ...

    def score(self, sequences: Sequence[Sequence[int]], num_prompt_tokens: Sequence[int] | None = None
              ) -> list[list[float]]:
        """Log-probs of fixed token sequences (response part only when prompt lengths are given)."""
        ...

    def refit(self, weights: Iterable[tuple[str, torch.Tensor]], *, chunk_bytes: int = ...) -> RefitStats:
        """Load new HF-layout weights in place (the `rpc` transport: chunks of ≤ `chunk_bytes`)."""
        ...

    def begin_refit(self) -> None:
        """Start a bucketed refit (`ipc` transport): wake the weights, begin the layer-wise reload."""
        ...

    def load_staged(self, payload: bytes) -> list[tuple[str, int]]:
        """One bucket of an `ipc` refit (`rollout.refit.encode_staged`); per worker: (device key read, tensors)."""
        ...

    def finish_refit(self, seconds: float, tensors: int, size: int, transport: str) -> RefitStats:
        """End a bucketed refit (every parameter must have been loaded) and record it."""
        ...

    @property
    def can_sleep(self) -> bool:
        """Whether `sleep` releases accelerator memory (colocated CUDA engines)."""
        ...

    def sleep(self, level: int = 1) -> None:
        """Release accelerator memory between phases (no-op where unsupported)."""
        ...

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Undo `sleep` for `tags` (None = all)."""
        ...

    @property
    def asleep(self) -> frozenset[str]:
        """What is released right now (`weights`, `kv_cache`)."""
        ...

    @property
    def stats(self) -> dict[str, float]:
        """Start-up time, last generation throughput, last refit time."""
        ...

    def shutdown(self) -> None:
        """Stop the engine's processes."""
        ...

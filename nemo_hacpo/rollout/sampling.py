"""Sampling parameters of one agent's rollouts, and the per-request seeds that make them reproducible.

Pure functions (no vLLM import); `engine.py` turns the dicts into `vllm.SamplingParams`.

Stopping: the only stop token is the agent tokenizer's EOS (`stop_token_ids=[eos]`; vLLM also checks the
tokenizer's EOS itself). A finished response's token ids end with that EOS; a response cut at `max_tokens`
is `length` and carries none. Log-probs: one per generated token, of the token that was chosen, under the
*model's* distribution (vLLM `logprobs_mode="raw_logprobs"`, before temperature / top-p / top-k) — the
quantity the trainer recomputes, so the train/inference mismatch metric compares like with like.

Seeds: every request gets its own seed, so a batch's samples do not depend on how vLLM schedules it.
vLLM gives the G children of a request with seed s the seeds s, s+1, …, s+G−1, so prompt b of a call with
base seed S gets s_b = (S + b·G) mod 2³¹ and no two responses of one call share a seed. vLLM draws the noise of
seeded requests one request at a time at every decode step; `rollout.seeded_requests: false` leaves the
requests unseeded (the engine's seed only) where that loop costs more than bit-exact reproducibility is worth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from nemo_hacpo.config import RolloutConfig

SEED_MODULUS = 2**31
"""Per-request seeds live in [0, 2³¹)."""


@dataclass(frozen=True)
class SamplingSettings:
    """Temperature / top-p / top-k of an agent's rollouts (from `RolloutConfig`)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    """-1 = off."""

    @classmethod
    def from_config(cls, rollout: RolloutConfig) -> SamplingSettings:
        return cls(temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k)


def call_base_seed(engine_seed: int, call_index: int) -> int:
    """Base seed of the `call_index`-th generate call of an engine seeded `engine_seed` (well mixed, in [0, 2³¹))."""
    if engine_seed < 0 or call_index < 0:
        raise ValueError(f"seeds and call indices must be ≥ 0, got {engine_seed}, {call_index}")
    return int(np.random.SeedSequence([engine_seed, call_index]).generate_state(1)[0]) % SEED_MODULUS


def request_seeds(base_seed: int, num_prompts: int, n: int) -> list[int]:
    """Seed of each prompt's request: s_b = (base_seed + b·n) mod 2³¹, b = 0..num_prompts−1.

    Example: base 10, 3 prompts, n = 4 → [10, 14, 18]; vLLM then seeds the 12 responses 10..21.
    """
    if num_prompts < 0 or n < 1:
        raise ValueError(f"need num_prompts ≥ 0 and n ≥ 1, got {num_prompts}, {n}")
    return [(base_seed + b * n) % SEED_MODULUS for b in range(num_prompts)]


def call_request_seeds(seeded: bool, engine_seed: int, call_index: int, seed: int | None, num_prompts: int,
                       n: int) -> list[int | None]:
    """Seed of each prompt's request in one generate call. Seeded: from the caller's base `seed`, else from the
    engine's seed and the call count (`call_base_seed`). Unseeded (`rollout.seeded_requests: false`): None for
    every request, whatever the caller passed — the engine's own generator, no per-request loop in vLLM's sampler.

    Example: seeded, seed 10, 3 prompts, n = 4 → [10, 14, 18]; unseeded → [None, None, None].
    """
    if not seeded:
        return [None] * num_prompts
    base = call_base_seed(engine_seed, call_index) if seed is None else seed
    return list(request_seeds(base, num_prompts, n))


def sampling_kwargs(sampling: SamplingSettings, *, n: int, max_tokens: int, eos_token_id: int,
                    seed: int | None) -> dict[str, Any]:
    """Keyword arguments of `vllm.SamplingParams` for one prompt's G = n responses.

    `logprobs=0` returns the chosen token's log-prob only; `detokenize=False` because the engine decodes the
    text itself with the agent's tokenizer (one decoding rule for self and cross samples).
    """
    if n < 1 or max_tokens < 1:
        raise ValueError(f"need n ≥ 1 and max_tokens ≥ 1, got n={n}, max_tokens={max_tokens}")
    return {
        "n": n,
        "max_tokens": max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else 0,
        "seed": seed,
        "stop_token_ids": [eos_token_id],
        "logprobs": 0,
        "detokenize": False,
        "skip_special_tokens": True,
    }


def scoring_kwargs() -> dict[str, Any]:
    """`vllm.SamplingParams` kwargs that only score the prompt: its tokens' log-probs, one throw-away token."""
    return {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0, "detokenize": False}

"""Sampling kwargs, EOS stop and per-request seeds."""

from __future__ import annotations

import pytest

from nemo_hacpo.config import RolloutConfig
from nemo_hacpo.rollout.sampling import (
    SEED_MODULUS,
    SamplingSettings,
    call_base_seed,
    call_request_seeds,
    request_seeds,
    sampling_kwargs,
    scoring_kwargs,
)


def test_request_seeds_hand_computed():
    # Prompt b gets base + b·n; vLLM seeds its n children seed, seed+1, ..., so no two responses share a seed.
    assert request_seeds(10, 3, 4) == [10, 14, 18]
    assert request_seeds(SEED_MODULUS - 2, 2, 4) == [SEED_MODULUS - 2, 2]
    children = [s + g for s in request_seeds(10, 3, 4) for g in range(4)]
    assert children == list(range(10, 22))
    with pytest.raises(ValueError):
        request_seeds(0, 1, 0)


def test_call_base_seed_is_deterministic_and_varies():
    assert call_base_seed(0, 0) == call_base_seed(0, 0)
    seeds = {call_base_seed(engine, call) for engine in range(3) for call in range(20)}
    assert len(seeds) == 60
    assert all(0 <= s < SEED_MODULUS for s in seeds)
    with pytest.raises(ValueError):
        call_base_seed(-1, 0)


def test_call_request_seeds_follow_the_switch_whatever_the_caller_passes():
    # Seeded: the caller's base seed, else the engine's seed and call count; the loop and the evaluation always
    # pass one, so an unseeded engine (rollout.seeded_requests: false) must drop it.
    assert call_request_seeds(True, 0, 0, 10, 3, 4) == [10, 14, 18]
    assert call_request_seeds(True, 7, 2, None, 2, 4) == request_seeds(call_base_seed(7, 2), 2, 4)
    assert call_request_seeds(False, 7, 2, 10, 3, 4) == [None, None, None]
    assert call_request_seeds(False, 7, 2, None, 2, 4) == [None, None]


def test_sampling_kwargs_from_config():
    sampling = SamplingSettings.from_config(RolloutConfig(temperature=0.7, top_p=0.9, top_k=-1))
    kwargs = sampling_kwargs(sampling, n=8, max_tokens=96, eos_token_id=2, seed=5)
    assert kwargs == {
        "n": 8, "max_tokens": 96, "temperature": 0.7, "top_p": 0.9, "top_k": 0, "seed": 5,
        "stop_token_ids": [2], "logprobs": 0, "detokenize": False, "skip_special_tokens": True,
    }
    assert sampling_kwargs(SamplingSettings(top_k=20), n=1, max_tokens=1, eos_token_id=0, seed=None)["top_k"] == 20
    with pytest.raises(ValueError):
        sampling_kwargs(sampling, n=1, max_tokens=0, eos_token_id=2, seed=None)


def test_scoring_kwargs():
    assert scoring_kwargs() == {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0, "detokenize": False}

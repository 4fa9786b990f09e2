"""The paper's Thm 4.1: with ω(j→k) = P_j / P_k, E[μ_k] = P_k (the learner's own success rate).

Two (or three) Bernoulli "agents" with success rates p, G responses each. The raw baseline is
unbiased whatever the pair. What the reference code's guards do to it (measured here, exactly):
  * learner weaker than the source (ω > 1): raw μ_k ≤ 1 always, so guard 2 never fires; guard 1
    fires only when all n·G rewards are 1 (probability p_k^G·p_j^G ≈ 4e-6 for 0.3/0.7) and moves μ
    from 0.714 to 1 there: bias ≈ +1e-6, invisible at Monte-Carlo precision.
  * learner stronger than the source (ω < 1): guard 2 (μ_k > 1 → learner's own mean) fires often and
    replaces a value above 1 by one at most 1, so the guarded baseline is biased **down**: for
    p_k = 0.7, p_j = 0.3, G = 8 the exact expectation is 0.6762 instead of 0.7.
The exact expectations come from enumerating all (G+1)^n success counts (the baseline depends on the
counts only); the Monte-Carlo test checks the same statements on sampled groups.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from nemo_hacpo.algo import hacpo_baseline

G = 8


def _binomial_pmf(count: int, p: float) -> float:
    return math.comb(G, count) * p**count * (1 - p) ** (G - count)


def exact_expected_baseline(success_rates: list[float], learner: int, guards: bool) -> float:
    """E[μ_learner] over independent Bernoulli agents, by enumerating every vector of success counts."""
    omega = [p / success_rates[learner] for p in success_rates]  # ω(j→k) = P_j / P_k
    groups, weights = [], []
    for counts in itertools.product(range(G + 1), repeat=len(success_rates)):
        rewards = torch.zeros(len(success_rates), G, dtype=torch.float64)
        for agent, count in enumerate(counts):
            rewards[agent, :count] = 1.0
        groups.append(rewards)
        weights.append(math.prod(_binomial_pmf(c, p) for c, p in zip(counts, success_rates, strict=True)))
    baselines = hacpo_baseline(torch.stack(groups), learner, omega, guards=guards)  # [(G+1)^n]
    return float((baselines * torch.tensor(weights, dtype=torch.float64)).sum())


@pytest.mark.parametrize("success_rates", [[0.3, 0.7], [0.7, 0.3], [0.3, 0.5, 0.7], [0.5, 0.2, 0.9]])
def test_raw_baseline_is_exactly_unbiased(success_rates):
    for learner in range(len(success_rates)):
        expected = exact_expected_baseline(success_rates, learner, guards=False)
        assert expected == pytest.approx(success_rates[learner], abs=1e-12)


def test_guarded_baseline_is_unbiased_for_the_weaker_learner_only():
    # weaker learner: bias = P(all 16 rewards = 1)·(1 − 0.714…) = 0.3^8·0.7^8·(1 − (8 + 8·3/7)/16)
    all_ones = 0.3**8 * 0.7**8
    raw_all_ones = (8 + 8 * 3 / 7) / 16
    guarded = exact_expected_baseline([0.3, 0.7], 0, guards=True)
    assert guarded - 0.3 == pytest.approx(all_ones * (1 - raw_all_ones), rel=1e-9)  # ≈ 1.08e-6
    # stronger learner: biased down by ≈ 0.024
    strong = exact_expected_baseline([0.7, 0.3], 0, guards=True)
    assert strong == pytest.approx(0.67623083, abs=1e-6)


def _sample_rewards(success_rates: list[float], num_groups: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    probs = torch.tensor(success_rates, dtype=torch.float64)[None, :, None].expand(num_groups, -1, G)
    return torch.bernoulli(probs, generator=generator)  # [num_groups, n, G]


def _z_score(baselines: torch.Tensor, target: float) -> float:
    """(mean − target) in units of the Monte-Carlo standard error."""
    standard_error = baselines.std() / math.sqrt(baselines.numel())
    return float((baselines.mean() - target) / standard_error)


@pytest.mark.parametrize(("p_learner", "p_source"), [(0.3, 0.7), (0.7, 0.3)])
def test_monte_carlo_raw_baseline_matches_learner_success_rate(p_learner, p_source):
    rewards = _sample_rewards([p_learner, p_source], num_groups=40_000, seed=1234)
    omega = [1.0, p_source / p_learner]
    raw = hacpo_baseline(rewards, 0, omega, guards=False)
    assert abs(_z_score(raw, p_learner)) < 3.0
    # a plain joint mean (ω = 1, the "−adv"/naive baseline) estimates (p_k + p_j)/2 = 0.5 instead:
    # 0.2 away, i.e. hundreds of standard errors.
    plain = hacpo_baseline(rewards, 0, [1.0, 1.0])
    assert abs(_z_score(plain, p_learner)) > 50.0
    assert abs(_z_score(plain, (p_learner + p_source) / 2)) < 3.0


def test_monte_carlo_guarded_baseline():
    # weaker learner: the guarded estimator also passes (its bias is ~1e-6, SE ≈ 4e-4)
    weak = _sample_rewards([0.3, 0.7], num_groups=40_000, seed=99)
    guarded_weak = hacpo_baseline(weak, 0, [1.0, 0.7 / 0.3])
    assert abs(_z_score(guarded_weak, 0.3)) < 3.0
    # stronger learner: the guarded mean matches the exact biased expectation, not p_k = 0.7
    strong = _sample_rewards([0.7, 0.3], num_groups=40_000, seed=99)
    guarded_strong = hacpo_baseline(strong, 0, [1.0, 0.3 / 0.7])
    assert abs(_z_score(guarded_strong, exact_expected_baseline([0.7, 0.3], 0, guards=True))) < 3.0
    assert _z_score(guarded_strong, 0.7) < -10.0


def test_monte_carlo_three_agents_raw_baseline():
    rates = [0.3, 0.5, 0.7]
    rewards = _sample_rewards(rates, num_groups=40_000, seed=7)
    for learner, p_learner in enumerate(rates):
        omega = [p / p_learner for p in rates]
        assert abs(_z_score(hacpo_baseline(rewards, learner, omega, guards=False), p_learner)) < 3.0

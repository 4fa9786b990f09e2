"""The algorithm registry's own rules (algorithm.md §8): what an entry may combine."""

from __future__ import annotations

import pytest

from nemo_hacpo.algo.registry import ALGORITHMS, Algorithm


def test_only_shared_rows_trained_as_own_can_take_the_learners_old_logprob() -> None:
    assert ALGORITHMS["naive_onpolicy"].cross_old_logprob == "learner"
    assert {name for name, a in ALGORITHMS.items() if a.cross_old_logprob == "learner"} == {"naive_onpolicy"}
    same_rows = {k: getattr(ALGORITHMS["naive"], k) for k in ("shares_rollouts", "cross_objective", "omega_on_rows",
                                                                "capability_baseline", "loss", "samples_factor")}
    assert same_rows == {k: getattr(ALGORITHMS["naive_onpolicy"], k) for k in same_rows}  # m_old is the difference
    with pytest.raises(ValueError, match="needs shared rows trained with the own-row objective"):
        Algorithm("x", "", shares_rollouts=True, cross_objective=True, omega_on_rows=True, capability_baseline=True,
                  cross_old_logprob="learner")  # HACPO's clip is defined against the source's m_old
    with pytest.raises(ValueError, match="needs shared rows"):
        Algorithm("x", "", shares_rollouts=False, cross_objective=False, omega_on_rows=False,
                  capability_baseline=False, cross_old_logprob="learner")
    with pytest.raises(ValueError, match="'source' or 'learner'"):
        Algorithm("x", "", shares_rollouts=True, cross_objective=False, omega_on_rows=False,
                  capability_baseline=False, cross_old_logprob="sampler")  # type: ignore[arg-type]

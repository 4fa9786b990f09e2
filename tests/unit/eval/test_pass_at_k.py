"""pass@k against its closed form and brute force, avg@k, and the k lists (hand-computed numbers)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nemo_hacpo.eval.pass_at_k import (
    avg_at_k,
    correct_count,
    default_pass_ks,
    mean_pass_at_k,
    parse_ks,
    pass_at_k,
)


def _closed_form(n: int, c: int, k: int) -> float:
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _brute_force(n: int, c: int, k: int) -> Fraction:
    """P(at least one correct) over every k-subset of n responses whose first c are correct."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(1 for subset in subsets if min(subset) < c), len(subsets))


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (5, 2, 2, 0.7),             # 1 − C(3,2)/C(5,2) = 1 − 3/10
    (5, 0, 3, 0.0),             # nothing correct
    (5, 3, 3, 1.0),             # n − c = 2 < k = 3: every 3-subset holds a correct one
    (10, 3, 1, 0.3),            # k = 1 → c/n
    (4, 1, 2, 0.5),             # 1 − C(3,2)/C(4,2) = 1 − 3/6
    (4, 2, 2, 5 / 6),           # 1 − C(2,2)/C(4,2) = 1 − 1/6
    (8, 1, 8, 1.0),             # pass@n = [c > 0]
    (6, 2, 3, 0.8),             # 1 − C(4,3)/C(6,3) = 1 − 4/20
])
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_stays_exact_for_large_n():
    # C(1000, 10) ≈ 2.6e23 overflows nothing here: the product form keeps the ratio in [0, 1]
    assert pass_at_k(1000, 10, 10) == pytest.approx(_closed_form(1000, 10, 10), rel=1e-12)
    assert pass_at_k(10_000, 1, 1) == pytest.approx(1e-4, rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k", "match"), [
    (0, 0, 1, "n ≥ 1"), (5, 6, 1, "0 ≤ c ≤ n"), (5, -1, 1, "0 ≤ c ≤ n"), (5, 2, 0, "1 ≤ k ≤ n"),
    (5, 2, 6, "1 ≤ k ≤ n = 5"),
])
def test_pass_at_k_rejects_impossible_arguments(n, c, k, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)


@given(st.integers(1, 7).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_brute_force_over_all_k_subsets(args):
    n, c, k = args
    assert pass_at_k(n, c, k) == pytest.approx(float(_brute_force(n, c, k)), abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(_closed_form(n, c, k), abs=1e-12)


@given(st.integers(2, 60).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n - 1))))
def test_pass_at_k_is_monotone_in_k_and_c(args):
    n, c, k = args
    value = pass_at_k(n, c, k)
    assert 0.0 <= value <= 1.0
    assert pass_at_k(n, c, k + 1) >= value - 1e-12
    if c < n:
        assert pass_at_k(n, c + 1, k) >= value - 1e-12
    assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)


def test_avg_at_k_is_the_mean_of_per_problem_means():
    assert avg_at_k([[1.0, 0.0], [1.0, 1.0]]) == 0.75
    assert avg_at_k([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0]]) == pytest.approx((0.25 + 0.5) / 2)  # ragged
    assert avg_at_k([[0.0]]) == 0.0
    with pytest.raises(ValueError, match="no problems"):
        avg_at_k([])
    with pytest.raises(ValueError, match="problem 1 has no responses"):
        avg_at_k([[1.0], []])


def test_mean_pass_at_k_and_correct_count():
    # problem 1: 1 − C(2,2)/C(3,2) = 2/3; problem 2: 0 → mean 1/3
    assert mean_pass_at_k([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], 2) == pytest.approx(1 / 3)
    assert mean_pass_at_k([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]], 1) == pytest.approx(avg_at_k([[1, 0, 0], [0, 1, 1]]))
    assert correct_count([1.0, 0.0, 1.0]) == 2
    with pytest.raises(ValueError, match="rewards in \\{0, 1\\}, got 0.5"):
        correct_count([1.0, 0.5])
    with pytest.raises(ValueError, match="no problems"):
        mean_pass_at_k([], 1)


def test_default_and_parsed_ks():
    assert default_pass_ks(1) == (1,)
    assert default_pass_ks(6) == (1, 2, 4, 6)
    assert default_pass_ks(8) == (1, 2, 4, 8)
    assert parse_ks("8, 1,4,4", 8) == (1, 4, 8)
    with pytest.raises(ValueError, match="pass@16 needs at least 16 samples per problem, but --samples is 8"):
        parse_ks("1,16", 8)
    with pytest.raises(ValueError, match="'x' is not a positive integer"):
        parse_ks("1,x", 8)
    with pytest.raises(ValueError, match="'0' is not a positive integer"):
        parse_ks("0", 8)
    with pytest.raises(ValueError, match="names no k"):
        parse_ks(" , ", 8)
    with pytest.raises(ValueError, match="n ≥ 1"):
        default_pass_ks(0)

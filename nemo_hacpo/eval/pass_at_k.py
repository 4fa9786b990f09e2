"""Accuracy estimators of sampled evaluation: avg@k and the unbiased pass@k of Chen et al. (2021).

For one problem with n sampled responses of which c are correct:

- avg@n   = c / n                                   (expected accuracy of one sample)
- pass@k  = 1 − C(n−c, k) / C(n, k),  1 ≤ k ≤ n       (probability that at least one of k responses drawn
                                                     without replacement from the n is correct)

A benchmark's score is the mean of the per-problem values. pass@1 = avg@n, pass@n = [c > 0].

The binomial ratio is computed as a product, never with factorials (Chen et al., "Evaluating Large Language
Models Trained on Code", fig. 3):

    C(n−c, k) / C(n, k) = Π_{i = n−c+1}^{n} (1 − k / i)        (n − c ≥ k; else the ratio is 0)

which stays in [0, 1] and loses no precision for n in the thousands.

    >>> pass_at_k(5, 2, 2)     # 1 − C(3, 2)/C(5, 2) = 1 − 3/10
    0.7
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["avg_at_k", "correct_count", "default_pass_ks", "mean_pass_at_k", "pass_at_k", "parse_ks"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem: 1 − C(n−c, k) / C(n, k) with n samples, c of them correct.

    Worked cases: (n=5, c=2, k=2) → 0.7; c = 0 → 0; n − c < k → 1; k = 1 → c / n.

    Raises:
        ValueError: unless 0 ≤ c ≤ n and 1 ≤ k ≤ n.
    """
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"pass@k needs n ≥ 1 and 0 ≤ c ≤ n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 ≤ k ≤ n = {n} samples per problem")
    if n - c < k:  # every k-subset holds a correct response
        return 1.0
    all_wrong = 1.0
    for i in range(n - c + 1, n + 1):  # C(n−c, k)/C(n, k) = Π (1 − k/i); empty product (c = 0) = 1
        all_wrong *= 1.0 - k / i
    return 1.0 - all_wrong


def correct_count(rewards: Sequence[float]) -> int:
    """c: how many of one problem's rewards are 1.0.

    Raises:
        ValueError: for a reward other than 0.0 or 1.0 (pass@k needs a verdict, not a score).
    """
    for reward in rewards:
        if reward not in (0.0, 1.0):
            raise ValueError(f"pass@k needs rewards in {{0, 1}}, got {reward!r}")
    return sum(1 for reward in rewards if reward == 1.0)


def avg_at_k(rewards_per_problem: Sequence[Sequence[float]]) -> float:
    """avg@k = (1/P) Σ_p (1/k_p) Σ_j r_pj: the per-problem mean reward, averaged over the P problems.

    `rewards_per_problem`: [P][k_p] rewards (k_p = k for a regular evaluation). Example: [[1, 0], [1, 1]] → 0.75.

    Raises:
        ValueError: for no problems or a problem without responses.
    """
    if not rewards_per_problem:
        raise ValueError("avg@k of no problems is undefined")
    total = 0.0
    for p, rewards in enumerate(rewards_per_problem):
        if not rewards:
            raise ValueError(f"problem {p} has no responses")
        total += sum(rewards) / len(rewards)
    return total / len(rewards_per_problem)


def mean_pass_at_k(rewards_per_problem: Sequence[Sequence[float]], k: int) -> float:
    """(1/P) Σ_p pass_at_k(n_p, c_p, k) over [P][n_p] 0/1 rewards (n_p ≥ k for every problem).

    Example: [[1, 0, 0], [0, 0, 0]], k = 2 → ((1 − C(2,2)/C(3,2)) + 0) / 2 = (2/3) / 2 = 1/3.
    """
    if not rewards_per_problem:
        raise ValueError("pass@k of no problems is undefined")
    return sum(pass_at_k(len(r), correct_count(r), k) for r in rewards_per_problem) / len(rewards_per_problem)


def default_pass_ks(n: int) -> tuple[int, ...]:
    """The k reported when none are asked for: powers of two up to n, and n itself (n = 6 → (1, 2, 4, 6))."""
    if n < 1:
        raise ValueError(f"need n ≥ 1 samples, got {n}")
    ks = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return tuple(ks if ks[-1] == n else [*ks, n])


def parse_ks(text: str, n: int) -> tuple[int, ...]:
    """`"1,4,8"` → (1, 4, 8): sorted, distinct, each in [1, n].

    Raises:
        ValueError: naming the offending entry and n.
    """
    ks: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"pass@k list {text!r}: {part!r} is not a positive integer")
        if int(part) > n:
            raise ValueError(f"pass@{part} needs at least {part} samples per problem, but --samples is {n}")
        ks.add(int(part))
    if not ks:
        raise ValueError(f"pass@k list {text!r} names no k")
    return tuple(sorted(ks))

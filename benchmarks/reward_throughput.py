"""Throughput of the pooled math reward scorer on synthetic responses; prints a table.

Usage: ``python benchmarks/reward_throughput.py [--answers 1000] [--workers 0 2] [--lenient]``

Responses are ~1 KB of reasoning ending in a boxed answer; answers mix integers, fractions, decimals,
radicals and polynomials, about half of them correct, plus a few without a box. Start-up of the
workers is excluded (they are reused across training steps); the first batch is timed separately.
"""

from __future__ import annotations

import argparse
import random
import time

from nemo_hacpo.rewards.scorer import MathRewardScorer

_FILLER = (
    "Let us compute step by step. First we note that $a + b = {a}$ and $a \\cdot b = {b}$, "
    "so by Vieta's formulas the quadratic is $x^2 - {a}x + {b} = 0$. "
)


def make_batch(num_answers: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """``num_answers`` (response, gold) pairs; deterministic for a seed."""
    rng = random.Random(seed)
    responses: list[str] = []
    golds: list[str] = []
    for index in range(num_answers):
        numerator, denominator = rng.randint(1, 99), rng.randint(2, 99)
        kind = index % 5
        if kind == 0:
            gold, right, wrong = str(numerator * 7), str(numerator * 7), str(numerator * 7 + 1)
        elif kind == 1:
            gold = f"{numerator}/{denominator}"
            right, wrong = (
                f"\\frac{{{numerator}}}{{{denominator}}}",
                f"\\frac{{{numerator + 1}}}{{{denominator}}}",
            )
        elif kind == 2:
            gold, right, wrong = (
                f"{numerator / 4:g}",
                f"\\dfrac{{{numerator}}}{{4}}",
                f"{numerator / 4 + 0.5:g}",
            )
        elif kind == 3:
            gold, right, wrong = (
                f"{numerator}\\sqrt{{2}}",
                f"\\sqrt{{{2 * numerator**2}}}",
                f"{numerator}\\sqrt{{3}}",
            )
        else:
            gold, right, wrong = (
                f"(x+{numerator})^2",
                f"x^2 + {2 * numerator}x + {numerator**2}",
                f"x^2 + {numerator}",
            )
        reasoning = "".join(_FILLER.format(a=rng.randint(1, 9), b=rng.randint(1, 9)) for _ in range(6))
        answer = right if rng.random() < 0.5 else wrong
        if rng.random() < 0.05:
            responses.append(reasoning + f"So the answer is {answer}.")
        else:
            responses.append(reasoning + f"Therefore the answer is $\\boxed{{{answer}}}$.")
        golds.append(gold)
    return responses, golds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=1000)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--lenient", action="store_true", help="math-verify extraction over the whole text")
    args = parser.parse_args()
    responses, golds = make_batch(args.answers)
    mode = "lenient" if args.lenient else "strict"
    print("| workers | mode | answers | start-up s | batch 1 s | batch 2 s | answers/s | accuracy |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for num_workers in args.workers:
        started = time.monotonic()
        with MathRewardScorer(num_workers=num_workers, strict=not args.lenient) as scorer:
            scorer.wait_until_ready()
            startup_s = time.monotonic() - started
            first = scorer.score(responses, golds)
            second = scorer.score(responses, golds)  # warm caches (gold parses) as in training
        print(
            f"| {num_workers} | {mode} | {args.answers} | {startup_s:.1f} | {first.elapsed_s:.2f} | "
            f"{second.elapsed_s:.2f} | {args.answers / second.elapsed_s:.0f} | {second.accuracy:.3f} |"
        )
        print("  counts:", {name: count for name, count in second.counts.items() if count})


if __name__ == "__main__":
    main()

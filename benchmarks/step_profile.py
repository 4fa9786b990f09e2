"""Time per phase of one training step, and HACPO's overhead over isolated GSPO at equal batch, in one run.

    python benchmarks/step_profile.py                                  # pair_tiny, random init, 1 warm-up + 3 pairs
    python benchmarks/step_profile.py --warmstart --pairs 5            # from the cached warm start
    python benchmarks/step_profile.py --warmup 1 --pairs 1 algo.batch_size=2 algo.group_size=2 \\
        agents.0.max_response_length=16 agents.1.max_response_length=16 \\
        agents.0.parallel.micro_batch_size=2 agents.1.parallel.micro_batch_size=2  # smoke run

One `HacpoRun` is started (Ray, one Megatron trainer and one vLLM engine per agent). After `--warmup` HACPO
steps, steps alternate between HACPO and isolated GSPO in ABBA order (h g g h h g ...) so a slow drift of
the machine falls on both equally. Both modes draw B prompts and generate G responses per prompt per agent
(equal batch); `HacpoRun.use_algorithm` switches the algorithm config and broker between steps (HACPO: shared rollouts,
re-encoding, n·B·G sequences per learner; GSPO: isolated, B·G). GSPO keeps its config's M (2 updates per
step, as in the paper) unless `--equal-updates` gives it HACPO's M.

Phases are the loop's own timers (`time/<phase>_s` of `HacpoRun.run_step`): generate (vLLM, all agents at
once), reward (math-verify), logprob (trainer's old log-probs of own samples), broker (capability tracker,
re-encoding, advantages), train (M updates, all agents at once), refit (trainer → engine). `step` is the
wall time of the whole `run_step`. The table gives the mean seconds per mode and the ratio HACPO / GSPO.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

PHASES = ("generate", "reward", "logprob", "broker", "train", "refit")
MODES = ("hacpo", "gspo")


def abba_schedule(pairs: int) -> list[str]:
    """`2·pairs` modes in ABBA order: pair p is (hacpo, gspo) for even p and (gspo, hacpo) for odd p.

    abba_schedule(3) == ["hacpo", "gspo", "gspo", "hacpo", "hacpo", "gspo"]
    """
    if pairs < 1:
        raise ValueError(f"pairs must be ≥ 1, got {pairs}")
    return [mode for p in range(pairs) for mode in (MODES if p % 2 == 0 else MODES[::-1])]


def phase_rows(samples: Mapping[str, Sequence[Mapping[str, float]]]) -> list[dict[str, float | str]]:
    """Rows `phase, hacpo s, gspo s, ratio` from per-step timings `{mode: [{"<phase>_s": s, "step_s": s}, ...]}`.

    Each cell is the mean over that mode's steps; ratio = hacpo mean / gspo mean. Row `phases` sums the
    phase means; row `step` is the wall time of the whole step (phases + bookkeeping between them).
    """
    def mean(mode: str, key: str) -> float:
        values = [s[key] for s in samples[mode] if key in s]
        return sum(values) / len(values) if values else math.nan

    rows: list[dict[str, float | str]] = []
    for phase in PHASES:
        rows.append({"phase": phase, **{f"{m} s": mean(m, f"{phase}_s") for m in MODES}})
    rows.append({"phase": "phases", **{f"{m} s": sum(float(r[f"{m} s"]) for r in rows) for m in MODES}})
    rows.append({"phase": "step", **{f"{m} s": mean(m, "step_s") for m in MODES}})
    for row in rows:
        hacpo, gspo = float(row["hacpo s"]), float(row["gspo s"])
        row["ratio"] = hacpo / gspo if gspo > 0 else math.nan
    return rows


def format_table(rows: Sequence[Mapping[str, float | str]]) -> str:
    """Right-aligned text table; floats to 3 significant digits (`-` for nan)."""
    def cell(value: float | str) -> str:
        if isinstance(value, float):
            return "-" if math.isnan(value) else f"{value:.3g}"
        return str(value)

    columns = list(rows[0])
    widths = {c: max(len(c), *(len(cell(r[c])) for r in rows)) for c in columns}
    lines = ["  ".join(c.rjust(widths[c]) for c in columns)]
    lines += ["  ".join(cell(r[c]).rjust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def step_timings(metrics: Mapping[str, float], step_s: float) -> dict[str, float]:
    """`{"<phase>_s": ..., "step_s": ...}` from a `run_step` metrics dict (`time/<phase>_s` keys)."""
    timings = {f"{p}_s": float(metrics[f"time/{p}_s"]) for p in PHASES if f"time/{p}_s" in metrics}
    return {**timings, "step_s": step_s}


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-name", default="pair_tiny")
    parser.add_argument("--warmstart", action=argparse.BooleanOptionalAction, default=False,
                        help="start from the cached warm start (default: random init, quicker)")
    parser.add_argument("--warmup", type=int, default=1, help="HACPO steps before timing (engine/kernel warm-up)")
    parser.add_argument("--pairs", type=int, default=3, help="timed (hacpo, gspo) pairs, in ABBA order")
    parser.add_argument("--equal-updates", action="store_true", help="give GSPO HACPO's updates per step (M)")
    parser.add_argument("--json", default=None, help="also write every step's timings here")
    args, extra = parser.parse_known_args(argv)
    unknown = [e for e in extra if e.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (config overrides are key=value)")
    if args.warmup < 0 or args.pairs < 1:
        parser.error("--warmup must be ≥ 0 and --pairs ≥ 1")
    return args, extra


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = parse_args(list(sys.argv[1:] if argv is None else argv))
    from nemo_hacpo.config import load_config

    with tempfile.TemporaryDirectory(prefix="step_profile_") as out_dir:
        common = [f"runtime.output_dir={out_dir}", "runtime.resume=false", "runtime.save_rollouts=false",
                  f"warmstart.enabled={str(args.warmstart).lower()}", *extra]
        cfg = load_config(args.config_name, ["algo=hacpo", *common])
        gspo_algo = load_config(args.config_name, ["algo=gspo", *common]).algo
        if args.equal_updates:
            gspo_algo = dataclasses.replace(gspo_algo, updates_per_step=cfg.algo.updates_per_step)
        if (gspo_algo.batch_size, gspo_algo.samples_per_prompt) != (cfg.algo.batch_size, cfg.algo.samples_per_prompt):
            raise SystemExit("hacpo and gspo resolve to different B or G; the comparison needs an equal batch")
        cfg = dataclasses.replace(cfg, runtime=dataclasses.replace(
            cfg.runtime, steps=args.warmup + 2 * args.pairs))  # the LR schedule's horizon
        return profile(cfg, gspo_algo, args)


def profile(cfg, gspo_algo, args: argparse.Namespace) -> int:
    """Start the run, time the steps, print the table; always stops the workers and Ray."""
    import ray

    from nemo_hacpo.rewards import MathRewardScorer
    from nemo_hacpo.runtime.loop import HacpoRun

    run = HacpoRun(cfg)
    try:
        start = time.perf_counter()
        run.start()
        print(f"# started in {time.perf_counter() - start:.1f} s: agents {run.agents}, B={cfg.algo.batch_size}, "
              f"G={cfg.algo.group_size}, M hacpo={cfg.algo.updates_per_step} gspo={gspo_algo.updates_per_step}, "
              f"warm start {'on' if cfg.warmstart.enabled else 'off'}", flush=True)
        algos = {"hacpo": cfg.algo, "gspo": gspo_algo}
        samples: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
        trained: dict[str, list[float]] = {m: [] for m in MODES}
        totals = dict.fromkeys(run.agents, 0.0)
        reward = cfg.reward
        scorer = MathRewardScorer.from_config(reward)
        with scorer:
            for i, mode in enumerate(["hacpo"] * args.warmup + abba_schedule(args.pairs)):
                run.use_algorithm(algos[mode])
                tick = time.perf_counter()
                metrics = run.run_step(scorer)
                elapsed = time.perf_counter() - tick
                now = {a: float(metrics[f"{a}/sequences_trained_total"]) for a in run.agents}
                sequences = sum(now[a] - totals[a] for a in run.agents)  # this step, all learners
                totals = now
                warm = i < args.warmup
                if not warm:
                    samples[mode].append(step_timings(metrics, elapsed))
                    trained[mode].append(sequences)
                print(f"step {run.step} {mode}{' (warm-up)' if warm else ''}: {elapsed:.2f} s, "
                      f"{sequences:.0f} sequences trained", flush=True)
        rows = phase_rows(samples)
        print(f"\n# {args.pairs} pair(s) in ABBA order after {args.warmup} warm-up step(s); mean seconds per step; "
              f"sequences trained per step (all learners): hacpo {_mean(trained['hacpo']):.0f}, "
              f"gspo {_mean(trained['gspo']):.0f}")
        print(format_table(rows))
        if args.json:
            Path(args.json).write_text(json.dumps({"samples": samples, "rows": rows}, indent=1), encoding="utf-8")
        return 0
    finally:
        run.close()
        if ray.is_initialized():
            ray.shutdown()


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


if __name__ == "__main__":
    sys.exit(main())

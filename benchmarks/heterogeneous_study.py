"""The study on pairs that differ (benchmarks/results/heterogeneous_pairs/DESIGN.md): every run in the order fixed
there, then the report.

    python benchmarks/heterogeneous_study.py run        # resumable: finished runs are skipped (hours on 2 cores)
    python benchmarks/heterogeneous_study.py run --phase main
    python benchmarks/heterogeneous_study.py report     # tables, paired tests, the per-direction diagnosis

One run at a time (two side by side need more than the 24 GB of the CPU machine: Ray's memory monitor killed
runs), seed by seed, the studies of a phase alternating within each seed: `benchmarks/sample_efficiency.py
--seeds <k>` for each study in turn, into `benchmarks/results/heterogeneous_pairs/<study>/`; their logs are
`<study>/study.log`. A run that was stopped resumes from its last checkpoint. At the end every study's command.txt
holds the one command that reproduces it whole (all its seeds).
`report` rebuilds every study's results.md, compares the ablations with hacpo seed by seed, and writes
`heterogeneous_pairs/results.md`: the primary and secondary comparisons per pair and agent, and per direction what
each sharing algorithm took from the partner's rows (s, and the share with gradient by the sign of the advantage),
a post-hoc look at the final answers (narrated equations, wrong arithmetic; marked as not in DESIGN.md), and for the
trio each agent's McNemar test of its answers at step 0 against its last evaluation.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import operator
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.run_archive import RunFiles, study_runs  # noqa: E402
from benchmarks.study_stats import format_pm, mean_std, paired_difference, t_critical_95  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "heterogeneous_pairs"
HETEROGENEITY = ROOT / "benchmarks" / "results" / "heterogeneity"
SEEDS = "0,1,2,3,4,5,6,7"
ALGOS = "hacpo,naive,naive_onpolicy,gspo,gspo_x2"
PRIMARY = (("hacpo", "naive"), ("naive", "gspo"), ("hacpo", "gspo_x2"), ("hacpo", "gspo"))
SECONDARY = (("naive_onpolicy", "gspo"), ("hacpo", "naive_onpolicy"), ("naive", "naive_onpolicy"), ("gspo_x2", "gspo"))
PAIRS = {
    "habit": ["agents.1.warmstart.stop_early_fraction=0.1"],
    "style": ["agents.1.warmstart.narrated_fraction=1.0"],
}
THRESHOLDS = {"habit": "llama_tiny=0.565,qwen_tiny=0.856", "style": "llama_tiny=0.565,qwen_tiny=0.555"}
ABLATIONS = {"habit_no_adv": "algo.ablation.capability_baseline=false",
             "habit_no_omega": "algo.ablation.gradient_modulation=false"}
SCHEDULE = ["--steps", "30", "--eval-interval", "5", "--order", "seed"]
BONFERRONI_T = 4.41
"""|t| over which a paired difference holds after Bonferroni over the 16 primary tests (two-sided 5 %, 7 d.f.)."""


def _compare(pairs: Sequence[tuple[str, str]]) -> str:
    return ",".join(f"{a}-{b}" for a, b in pairs)


def trio_gpt_overrides() -> list[str]:
    """gpt_tiny's size for the trio: of the two measured (`trio`: 4 × 256, `trio_gpt192`: 4 × 192), the one whose
    warm start answers more held-out problems greedily (DESIGN.md)."""
    from benchmarks.heterogeneity import CANDIDATES

    greedy = {}
    for name in ("trio", "trio_gpt192"):
        record = json.loads((HETEROGENEITY / name / "heterogeneity.json").read_text())
        greedy[name] = record["accuracy"]["gpt_tiny"]["greedy_avg@1"]
    return CANDIDATES[max(greedy, key=greedy.get)][1]


EARLIER_ORDER = "algo.row_order=own_first"
"""The row order the main, ablation and trio phases ran under (the default then; docs/algorithm.md §6), kept so
that re-running them reproduces their committed results."""


def studies(phase: str) -> dict[str, list[str]]:
    """`{study: sample_efficiency.py arguments}` of one phase."""
    if phase == "main":
        return {pair: ["--config-name", "pair_tiny", "--algos", ALGOS, "--seeds", SEEDS, *SCHEDULE,
                       "--threshold", THRESHOLDS[pair], "--compare", _compare(PRIMARY + SECONDARY),
                       "--out", str(OUT / pair), "runtime.eval_samples=0", *PAIRS[pair], EARLIER_ORDER]
                for pair in PAIRS}
    if phase == "ablations":
        return {name: ["--config-name", "pair_tiny", "--algos", "hacpo", "--seeds", SEEDS, *SCHEDULE,
                       "--threshold", THRESHOLDS["habit"], "--out", str(OUT / name), "runtime.eval_samples=0",
                       *PAIRS["habit"], EARLIER_ORDER, override] for name, override in ABLATIONS.items()}
    if phase == "trio":
        return {"trio": ["--config-name", "trio_tiny", "--algos", "hacpo,gspo", "--seeds", "0", *SCHEDULE,
                         "--compare", "hacpo-gspo", "--out", str(OUT / "trio"), "runtime.eval_samples=0",
                         *PAIRS["habit"], *trio_gpt_overrides(), EARLIER_ORDER]}
    if phase == "row_order":  # docs/algorithm.md §6, pre-registered (issue #48): both orders on one commit
        return {f"style_{order}": ["--config-name", "pair_tiny", "--algos", "hacpo,naive", "--seeds", "0,1,2,3",
                                   *SCHEDULE, "--threshold", THRESHOLDS["style"], "--compare", "hacpo-naive",
                                   "--out", str(OUT / f"style_{order}"), "runtime.eval_samples=0", *PAIRS["style"],
                                   f"algo.row_order={order}"] for order in ("own_first", "by_prompt")}
    raise ValueError(f"unknown phase {phase!r}")


PHASES = ("main", "ablations", "trio", "row_order")
ROW_ORDERS = ("own_first", "by_prompt")
"""The row-order phase's studies are `style_<order>` (docs/algorithm.md §6)."""


def _with_seeds(args: list[str], seeds: str) -> list[str]:
    index = args.index("--seeds")
    return [*args[:index + 1], seeds, *args[index + 2:]]


def run(phases: Sequence[str]) -> int:
    import shlex

    status = 0
    for phase in phases:
        plan = studies(phase)
        seeds = plan[next(iter(plan))][plan[next(iter(plan))].index("--seeds") + 1].split(",")
        for seed in seeds:
            for name, args in plan.items():
                (OUT / name).mkdir(parents=True, exist_ok=True)
                print(f"[study] {phase}: {name} seed {seed} → {OUT / name} (log: study.log)", flush=True)
                with (OUT / name / "study.log").open("a") as log:
                    rc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sample_efficiency.py"),
                                         *_with_seeds(args, seed)], cwd=ROOT, stdout=log,
                                        stderr=subprocess.STDOUT).returncode
                if rc:
                    print(f"[study] {phase}: {name} seed {seed} ended with status {rc}", flush=True)
                    status = status or rc
        for name, args in plan.items():  # the command that reproduces the study whole
            (OUT / name / "command.txt").write_text(
                shlex.join(["python", "benchmarks/sample_efficiency.py", *_relative(args)]) + "\n")
    return status


def _relative(args: list[str]) -> list[str]:
    return [arg.replace(f"{ROOT}/", "") for arg in args]


# ---------------------------------------------------------------------------------------------- report
def _results(name: str) -> dict | None:
    path = OUT / name / "results.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _finals(results: Mapping, agent: str, algo: str) -> dict[int, float]:
    return {run["seed"]: run["agents"][agent]["final_accuracy"] for run in results["runs"]
            if run["algo"] == algo and agent in run["agents"]}


def paired_lines(results: Mapping, pair: str, comparisons: Sequence[tuple[str, str]], label: str,
                 other: Mapping | None = None) -> list[dict[str, object]]:
    """One row per agent and comparison a − b: mean ± std over seeds, 95 % interval, t, seeds for / against.
    `other`: b's results come from another study (the ablations against hacpo)."""
    rows = []
    agents = sorted({a for run in results["runs"] for a in run["agents"]})
    for agent in agents:
        for a, b in comparisons:
            diff = paired_difference(_finals(results, agent, a), _finals(other or results, agent, b))
            if not diff.seeds:
                continue
            low, high = diff.interval_95
            rows.append({"pair": pair, "agent": agent, "comparison": f"{a}{label} − {b}", "seeds": len(diff.seeds),
                         "mean ± std": format_pm(diff.mean, diff.std), "95 % interval":
                         "n/a" if math.isnan(low) else f"[{low:+.3f}, {high:+.3f}]",
                         "for / against": f"{diff.wins} / {diff.losses}", "t": f"{diff.t:.2f}",
                         "reading": _reading(diff.t)})
    return rows


def _reading(t: float) -> str:
    if math.isnan(t):
        return "one seed"
    if abs(t) > BONFERRONI_T:
        return "holds (Bonferroni)"
    return "5 % level only" if abs(t) > 2.365 else "not distinguishable"


def row_order_rows() -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """The pre-registered row-order comparison (docs/algorithm.md §6) from `style_own_first` and `style_by_prompt`:
    per algorithm, order and agent the mean start and final held-out accuracy and the change over the seeds; and per
    algorithm and agent by_prompt − own_first in final accuracy, paired by seed (both orders start from the same
    step-0 evaluation of a seed, so this is also the difference in change). Empty until both studies have results."""
    results = {order: _results(f"style_{order}") for order in ROW_ORDERS}
    arms: list[dict[str, object]] = []
    paired: list[dict[str, object]] = []
    if any(r is None for r in results.values()):
        return arms, paired
    for algo in ("hacpo", "naive"):
        for order in ROW_ORDERS:
            runs = [r for r in results[order]["runs"] if r["algo"] == algo]
            for agent in sorted({a for r in runs for a in r["agents"]}):
                outcomes = [r["agents"][agent] for r in runs if agent in r["agents"]]
                change = mean_std([o["final_accuracy"] - o["start_accuracy"] for o in outcomes])
                arms.append({"algo": algo, "row_order": order, "agent": agent, "seeds": len(outcomes),
                             "start": f"{mean_std([o['start_accuracy'] for o in outcomes])[0]:.3f}",
                             "final": f"{mean_std([o['final_accuracy'] for o in outcomes])[0]:.3f}",
                             "change (mean ± std)": format_pm(*change)})
        for row in paired_lines(results["by_prompt"], "style", [(algo, algo)], "", other=results["own_first"]):
            # the pre-registered test: t over the seeds (3 d.f. for 4), two-sided 5 %; not the main study's
            # Bonferroni over its 16 tests at 7 d.f., which `paired_lines` reads against
            df, t = int(row["seeds"]) - 1, float(row["t"])
            reading = "5 % level" if df > 0 and abs(t) > t_critical_95(df) else "not distinguishable"
            paired.append({**row, "comparison": f"{algo}: by_prompt − own_first",
                           "reading": f"{reading} (critical t {t_critical_95(df):.3f}, {df} d.f.)" if df > 0 else reading})
    return arms, paired


def row_order_lines() -> list[str]:
    """The row-order section (`row_order_rows`) as markdown lines; none until both studies have results."""
    from nemo_hacpo.reporting import markdown_table

    arms, orders = row_order_rows()
    if not orders:
        return []
    return ["## Row order (pre-registered: docs/algorithm.md §6)", "",
            "The style pair under `algo.row_order` own_first (the authors' order) and by_prompt, seeds 0–3: each "
            "arm's held-out greedy accuracy at step 0 and at the last step, and the change "
            "([own_first](style_own_first/results.md), [by_prompt](style_by_prompt/results.md)).", "",
            markdown_table(arms, list(arms[0])), "", "by_prompt − own_first in final accuracy, paired by seed:", "",
            markdown_table(orders, list(orders[0])), ""]


def direction_rows(pair: str) -> list[dict[str, object]]:
    """Per sharing algorithm and direction source → learner: the means over steps and seeds of s p50 and the
    shares of the partner's rows with gradient (all, A > 0, A < 0), from every run's metrics (its metrics.jsonl, else
    its archive)."""
    rows = []
    values: dict[tuple[str, str], dict[str, list[float]]] = {}
    for run in study_runs(OUT / pair):
        algo = run.algo
        for record in run.metrics():
            for key, value in record.items():
                parts = key.split("/")
                if len(parts) == 4 and parts[1] == "from" and isinstance(value, int | float):
                    direction = f"{parts[2]} → {parts[0]}"
                    values.setdefault((algo, direction), {}).setdefault(parts[3], []).append(float(value))
    for (algo, direction), stats in sorted(values.items()):
        mean = {k: sum(v) / len(v) for k, v in stats.items() if v}
        rows.append({"pair": pair, "algo": algo, "direction": direction, "steps × seeds": len(stats.get("grad_frac", [])),
                     "s p50": f"{mean.get('s_p50', math.nan):.3g}",
                     "with gradient": f"{mean.get('grad_frac', math.nan):.3f}",
                     "A > 0 with gradient": f"{mean.get('grad_pos_frac', math.nan):.3f}",
                     "A < 0 with gradient": f"{mean.get('grad_neg_frac', math.nan):.3f}"})
    return rows


def learning_rows(name: str) -> list[dict[str, object]]:
    """Does each agent learn? Per run and agent of a study: held-out greedy accuracy at step 0 and at the run's last
    evaluation, and McNemar's exact test on the same problems (`eval/step_<n>/<agent>__heldout.jsonl`)."""
    from benchmarks.sample_efficiency import final_correct
    from nemo_hacpo.eval.paired import mcnemar_exact

    results = _results(name)
    rows = []
    for run in (results or {}).get("runs", []):
        run_dir = OUT / name / "runs" / f"{run['algo']}_seed{run['seed']}"
        for agent, outcome in sorted(run["agents"].items()):
            last = int(outcome["curve"][-1][0])
            before, after = dict(final_correct(run_dir, 0, agent)), dict(final_correct(run_dir, last, agent))
            common = sorted(before.keys() & after.keys())
            if not common:
                continue
            test = mcnemar_exact([before[k] for k in common], [after[k] for k in common])
            rows.append({"agent": agent, "algo": run["algo"], "seed": run["seed"],
                         "start": f"{sum(before[k] for k in common) / len(common):.3f}",
                         f"step {last}": f"{sum(after[k] for k in common) / len(common):.3f}",
                         "gained / lost": f"{test.gained} / {test.lost}", "McNemar p": f"{test.p_value:.2g}"})
    return rows


_EQUATION = re.compile(r"^\s*([\d\s+\-*/().]+)=\s*(-?[\d.]+)\s*$")
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _arithmetic(expression: str) -> float | None:
    """The value of a `+ - * /` expression of numbers, None for anything else (or a division by zero)."""
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(ast.dump(node))
    try:
        return value(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None


def equation_lines(text: str) -> list[tuple[bool, bool]]:
    """`(narrated, right)` per equation line of a response: narrated when the line before it is a sentence other
    than the response's first line (the narrated style puts each operation's sentence before its equation; the bare
    style writes the equations one after the other), right when its arithmetic holds."""
    lines = [line for line in text.split("\n") if line.strip()]
    out = []
    for i, line in enumerate(lines):
        match = _EQUATION.match(line)
        if match is None:
            continue
        narrated = i > 1 and _EQUATION.match(lines[i - 1]) is None and "boxed" not in lines[i - 1]
        left = _arithmetic(match.group(1))
        out.append((narrated, left is not None and abs(left - float(match.group(2))) < 1e-6))
    return out


def style_rows(pair: str) -> list[dict[str, object]]:
    """Post hoc (not in DESIGN.md): what the agents' greedy held-out answers look like at step 0 and at the last
    evaluation, pooled over seeds: the share of equation lines narrated and the share whose arithmetic is wrong."""
    rows = []
    for runs in _runs_by_algo(pair).values():
        for agent in sorted({agent for run in runs for agent in run.evaluations()}):
            for label, pick in (("start", min), ("end", max)):
                equations, answered, right = [], 0, 0
                for run in runs:
                    steps = run.evaluations().get(agent)
                    if not steps:
                        continue
                    for answer in run.answers(pick(steps), agent):
                        greedy = next(r for r in answer["responses"] if r["mode"] == "greedy")
                        equations += equation_lines(greedy["text"])
                        answered += 1
                        right += greedy["reward"] > 0
                if not answered:
                    continue
                rows.append({"pair": pair, "algo": runs[0].algo, "agent": agent,
                             "when": label, "answers": answered, "accuracy": f"{right / answered:.3f}",
                             "equations per answer": f"{len(equations) / answered:.2f}",
                             "narrated": f"{sum(n for n, _ in equations) / max(len(equations), 1):.3f}",
                             "arithmetic wrong": f"{sum(not ok for _, ok in equations) / max(len(equations), 1):.3f}"})
    return rows


def _runs_by_algo(pair: str) -> dict[str, list[RunFiles]]:
    runs: dict[str, list[RunFiles]] = {}
    for run in study_runs(OUT / pair):
        runs.setdefault(run.algo, []).append(run)
    return runs


def report(write: bool = True) -> str:
    """The study's results.md from every study's results.json and, where they are here, its runs; `write`: to
    `OUT/results.md` (else only returned)."""
    from nemo_hacpo.reporting import markdown_table

    lines = ["# Where HACPO's corrections matter: results", "",
             "Decided before it ran: [DESIGN.md](DESIGN.md). Per pair: [habit](habit/results.md), "
             "[style](style/results.md) (final accuracies, curves with ± std bands, McNemar pooled over seeds, "
             "rollouts to each agent's threshold).", ""]
    primary, secondary, directions = [], [], []
    for pair in PAIRS:
        results = _results(pair)
        if results is None:
            continue
        primary += paired_lines(results, pair, PRIMARY, "")
        secondary += paired_lines(results, pair, SECONDARY, "")
        directions += direction_rows(pair)
    if primary:
        lines += ["## Primary comparisons (final greedy held-out accuracy, paired by seed)", "",
                  markdown_table(primary, list(primary[0])), ""]
    if secondary:
        lines += ["## Secondary comparisons", "", markdown_table(secondary, list(secondary[0])), ""]
    hacpo = _results("habit")
    ablations = []
    for name in ABLATIONS:
        results = _results(name)
        if results is not None and hacpo is not None:
            label = " −Adv" if name.endswith("adv") else " −ω"
            ablations += paired_lines(results, "habit", [("hacpo", "hacpo")], label, other=hacpo)
    if ablations:
        lines += ["## Ablations on habit (each against full hacpo, the same seeds)", "",
                  markdown_table(ablations, list(ablations[0])), ""]
    if directions:
        lines += ["## What each sharing algorithm took from the partner's rows", "",
                  "Means over the 30 steps and the seeds of each run's per-direction metrics: the partner's rows' "
                  "ratio s when trained, and the share of them whose gradient was not zero, split by the sign of "
                  "the advantage (HACPO: inside [lo_u, 1]; naive, naive_onpolicy: the PPO minimum takes the "
                  "unclipped term).", "", markdown_table(directions, list(directions[0])), ""]
    lines += row_order_lines()
    styles = [row for pair in PAIRS for row in style_rows(pair)]
    if styles:
        lines += ["## Post hoc (not in DESIGN.md): what the answers look like", "",
                  "Each agent's greedy held-out answers at step 0 and at the last evaluation, pooled over the seeds: "
                  "equation lines per answer, the share of them narrated (a sentence of the story right before the "
                  "equation, as the `style` pair's qwen_tiny was taught), and the share whose arithmetic is wrong.",
                  "", markdown_table(styles, list(styles[0])), ""]
    trio = learning_rows("trio")
    if trio:
        lines += ["## Three agents (seed 0)", "", "Each agent's held-out greedy accuracy at the start and the end of "
                  "the run, and McNemar's exact test on the same 500 problems: does it learn?", "",
                  markdown_table(trio, list(trio[0])), ""]
        trio_directions = direction_rows("trio")
        if trio_directions:
            lines += ["What each learner took from each partner's rows (as above):", "",
                      markdown_table(trio_directions, list(trio_directions[0])), ""]
        lines += ["![trio](trio/accuracy_vs_rollouts.png)", ""]
    text = "\n".join(lines)
    if write:
        (OUT / "results.md").write_text(text + "\n")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["run", "report"])
    parser.add_argument("--phase", action="append", choices=PHASES, help="only these phases (default: all, in order)")
    args = parser.parse_args(argv)
    if args.what == "run":
        return run(args.phase or PHASES)
    absent = []
    for name in [*PAIRS, *ABLATIONS, "trio", *(f"style_{o}" for o in ROW_ORDERS)]:  # each study's results.md, from
        # its runs or their archives where they are here
        command = OUT / name / "command.txt"
        if not ((OUT / name / "runs").is_dir() or (OUT / name / "raw").is_dir()):  # the runs, or their archives
            absent += [name] if (OUT / name / "results.json").is_file() else []
        elif command.is_file():
            recorded = command.read_text().split()
            subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sample_efficiency.py"), *recorded[2:],
                            "--aggregate-only"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    if absent:  # the per-direction and post-hoc sections read the runs: without them results.md would lose them
        print(f"[report] no runs/ nor raw/ for {', '.join(absent)} here (studies run before the runs were archived): "
              "every results file is left as it is; the report below is printed only", file=sys.stderr)
    if section := row_order_lines():  # its own page: it needs only the row-order studies, which are archived
        (OUT / "row_order.md").write_text("# Row order: results\n\n" + "\n".join(section[1:]) + "\n")
    print(report(write=not absent))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

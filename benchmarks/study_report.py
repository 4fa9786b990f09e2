"""The sample-efficiency study's report (`sample_efficiency.py`): results.md, the accuracy-vs-rollouts plot, the CSV.
Functions of the aggregated rows only; the rows themselves are computed in `sample_efficiency.py`."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.study_stats import format_pm, t_critical_95


def verdict(row: Mapping[str, object]) -> str:
    """One factual sentence about a paired row: the difference, how the seeds split, the paired t-test."""
    n, mean, t = len(row["seeds"]), row["mean"], row["t"]
    first, second = str(row["comparison"]).split(" − ")
    if n < 2:
        return f"{row['agent']}: {row['comparison']} = {mean:+.3f} on one seed; no spread to test against."
    split = (f"{row['wins']}/{n} seeds favour {first}, {row['losses']}/{n} favour {second}, "
             f"{n - row['wins'] - row['losses']} tied")
    test = (f"paired t = {t:.2f} beyond ±{t_critical_95(n - 1):.2f}: a difference at the 5 % level"
            if row["significant"] else
            f"paired t = {t:.2f} within ±{t_critical_95(n - 1):.2f}: not distinguishable from 0 with {n} seeds")
    return f"{row['agent']}: {row['comparison']} = {format_pm(mean, row['std'])} ({split}); {test}."


def results_markdown(summary: Sequence[Mapping[str, object]], paired: Sequence[Mapping[str, object]],
                     missing: Sequence[str], command: str, setup: Sequence[Mapping[str, object]] = (),
                     reaching: Sequence[Mapping[str, object]] = (), pooled: Sequence[Mapping[str, object]] = ()) -> str:
    from nemo_hacpo.reporting import markdown_table

    table = [{"agent": r["agent"], "algo": r["algo"], "seeds": r["seeds"],
              "start acc": format_pm(r["start_mean"], r["start_std"]),
              "final acc": format_pm(r["final_mean"], r["final_std"]),
              "final − start": format_pm(r["gain_mean"], r["gain_std"]),
              "rollouts generated": f"{r['rollouts_generated']:.0f}",
              "sequences trained": f"{r['sequences_trained']:.0f}",
              "updates": f"{r['optimizer_updates']:.0f}", "min/run": f"{r['minutes_per_run']:.1f}"} for r in summary]
    lines = ["# Sample efficiency: held-out accuracy (greedy) per agent", "", f"`{command}`", ""]
    lines += [markdown_table(table, list(table[0])) if table else "(no finished run)", ""]
    lines += ["Accuracy: greedy answers to the held-out split, mean ± sample std over seeds. Rollouts generated: "
              "responses this agent sampled; sequences trained also counts the other agents' responses it trained "
              "on (hacpo, naive).", ""]
    if setup:
        lines += ["## Setup", "", markdown_table(setup, list(setup[0])), ""]
    if paired:
        pairs = [{"agent": r["agent"], "comparison": r["comparison"], "seeds": len(r["seeds"]),
                  "mean ± std": format_pm(r["mean"], r["std"]),
                  "95 % interval": "n/a" if math.isnan(r.get("ci95_low", math.nan)) else
                  f"[{r['ci95_low']:+.3f}, {r['ci95_high']:+.3f}]", "t": f"{r['t']:.2f}",
                  "per seed": ", ".join(f"{s}: {d:+.3f}" for s, d in zip(r["seeds"], r["differences"], strict=True))}
                 for r in paired]
        lines += ["## Paired final-accuracy differences (same seed = same prompts and init)", "",
                  markdown_table(pairs, list(pairs[0])), ""]
        lines += [f"- {verdict(r)}" for r in paired] + [""]
    if pooled:
        rows = [{"agent": r["agent"], "comparison": r["comparison"], "seeds": r["seeds"],
                 "problem pairs": r["pairs"], "right under the first only": r["a_only"],
                 "right under the second only": r["b_only"], "McNemar p": f"{r['p_value']:.3g}"} for r in pooled]
        lines += ["## Final greedy answers, McNemar's exact test pooled over seeds", "",
                  "Each seed pairs the two algorithms' answers to the same held-out problem; the discordant problems "
                  "of all seeds are counted together.", "", markdown_table(rows, list(rows[0])), ""]
    if reaching:
        rows = [{"agent": r["agent"], "algo": r["algo"], "threshold": f"{r['threshold']:g}",
                 "seeds reaching": f"{r['reached']}/{r['seeds']}",
                 "steps to reach": format_pm(r["steps_mean"], r["steps_std"], 1),
                 "rollouts generated to reach": format_pm(r["rollouts_mean"], r["rollouts_std"], 0)} for r in reaching]
        levels = sorted({r["threshold"] for r in reaching})
        title = f"≥ {levels[0]:g}" if len(levels) == 1 else "≥ each agent's threshold"
        lines += [f"## Sample efficiency: rollouts until held-out accuracy {title}", "",
                  "At the first evaluation reaching the threshold (mean ± std over the seeds that reach it).", "",
                  markdown_table(rows, list(rows[0])), ""]
    if missing:
        lines += ["## Runs not finished (left out)", "", *[f"- {m}" for m in missing], ""]
    lines += ["![accuracy vs rollouts](accuracy_vs_rollouts.png)", ""]
    return "\n".join(lines)


def write_plot(bands: Mapping[str, Mapping[str, Sequence[tuple[float, float, float]]]], path: str | Path) -> Path:
    """One panel per agent, one line per algorithm: accuracy vs rollouts generated, ± std band (Agg PNG)."""
    from nemo_hacpo.reporting import pyplot, save_figure

    plt = pyplot()
    agents = list(bands)
    if not agents:
        raise ValueError("nothing to plot")
    fig, axes = plt.subplots(1, len(agents), figsize=(5.5 * len(agents), 4), squeeze=False)
    for ax, agent in zip(axes[0], agents, strict=True):
        for algo, points in bands[agent].items():
            if not points:
                continue
            x, mean, std = (list(v) for v in zip(*points, strict=True))
            line = ax.plot(x, mean, marker="o", markersize=3, label=algo)[0]
            lo = [m - (0.0 if math.isnan(s) else s) for m, s in zip(mean, std, strict=True)]
            hi = [m + (0.0 if math.isnan(s) else s) for m, s in zip(mean, std, strict=True)]
            ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2)
        ax.set_title(agent)
        ax.set_xlabel("rollouts generated by this agent")
        ax.set_ylabel("held-out accuracy (greedy)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def finite_or_none(value: object) -> object:
    """`value` with every nan / ±inf float replaced by None, recursively (strict JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(v) for v in value]
    return value


def write_csv(rows: Sequence[Mapping[str, object]], path: str | Path) -> Path:
    path = Path(path)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["agent"])
        writer.writeheader()
        writer.writerows(rows)
    return path

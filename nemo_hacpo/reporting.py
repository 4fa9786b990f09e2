"""Reporting helpers shared by training, evaluation and the benchmarks: numbers to text, tables and plots.

    markdown_table(rows, ["agent", "accuracy"])                 # floats to 3 decimals
    write_curves("metrics.jsonl", "reward.png", ["*/reward_mean"])   # one line per matching metric
    write_curves("metrics.jsonl", "reward.png", ["*/reward_mean"], smooth=5)   # points + a 5-step mean
    format_duration(75.0)                                         # "1:15"
    plt = pyplot(); fig, ax = plt.subplots(); ...; save_figure(fig, "plot.png")   # Agg backend, 120-dpi PNG

No training state, no Ray: everything here reads plain records (the JSONL metrics file is the source of truth).
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


def to_float(value: Any) -> float:
    if hasattr(value, "item"):
        value = value.item()
    return float(value)



def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}")
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def select_series(records: Iterable[Mapping[str, float]], patterns: Sequence[str]) -> dict[str, list[tuple[int, float]]]:
    """`{metric: [(step, value), ...]}` for every metric matching one of the glob patterns."""
    series: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for key, value in record.items():
            if key in ("step", "time"):
                continue
            if any(fnmatch.fnmatchcase(key, p) for p in patterns):
                series.setdefault(key, []).append((int(record["step"]), float(value)))
    return series


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last `window` values (fewer at the start): `[1, 2, 3, 4]`, window 2 →
    `[1, 1.5, 2.5, 3.5]`."""
    if window < 1:
        raise ValueError(f"window must be ≥ 1, got {window}")
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def write_curves(metrics_path: str | Path, plot_path: str | Path, patterns: Sequence[str],
                 title: str = "", ylabel: str = "", smooth: int = 1, dashed: Sequence[str] = ()) -> Path:
    """Plot every metric matching `patterns` against the step (PNG, matplotlib's Agg backend), one colour per
    agent (the key's part before the first `/`); metrics matching a `dashed` pattern are drawn dashed. With
    `smooth` > 1 each metric's points are drawn faintly and its trailing `moving_average` over `smooth` steps as
    the line."""
    plt = pyplot()
    series = select_series(read_metrics(metrics_path), patterns)
    if not series:
        raise ValueError(f"no metric in {metrics_path} matches {list(patterns)}")
    fig, ax = plt.subplots(figsize=(7, 4))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colours: dict[str, str] = {}
    for key, points in sorted(series.items()):
        steps, values = zip(*points, strict=True)
        colour = colours.setdefault(key.split("/", 1)[0], palette[len(colours) % len(palette)])
        style = "--" if any(fnmatch.fnmatchcase(key, p) for p in dashed) else "-"
        if smooth > 1:
            ax.plot(steps, values, color=colour, linestyle=style, marker="o", markersize=2, linewidth=0.8, alpha=0.35)
            ax.plot(steps, moving_average(values, smooth), color=colour, linestyle=style,
                    label=f"{key} (mean of {smooth} steps)")
        else:
            ax.plot(steps, values, color=colour, linestyle=style, marker="o", markersize=3, label=key)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel or ", ".join(patterns))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, plot_path)


def pyplot() -> Any:
    """`matplotlib.pyplot` on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path) -> Path:
    """Lay `fig` out, write it as a 120-dpi PNG (creating the folder) and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A markdown table; floats to 3 decimals."""
    def cell(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)

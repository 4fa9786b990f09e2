"""A finished study run in one committed file, so that every number of a study can be recomputed on a fresh clone.

A run's directory (`<study>/runs/<algo>_seed<k>/`: checkpoints, HF weights, rollouts, logs) is too big to commit;
`write_archive` keeps what the study's tables are computed from in `<study>/raw/<algo>_seed<k>.json.xz` (~64 KiB
for a 30-step run of pair_tiny evaluated every 5 steps on 500 problems, from 2.3 MB): the run's record
(`study_run.json`: overrides, the commits it ran on, wall time), every line of its metrics.jsonl, and every held-out
evaluation's answers (`eval/step_<n>/<agent>__heldout.jsonl`, each problem's question and gold kept once).

`RunFiles` reads a run from its directory when it is here, else from its archive, with the same answers either way;
`study_runs` lists a study's runs from both. benchmarks/sample_efficiency.py writes the archive when a run
finishes and reads every run through `RunFiles`; `--archive-only` archives the finished runs of a study.
"""

from __future__ import annotations

import json
import lzma
from functools import cached_property
from pathlib import Path
from typing import Any

ARCHIVE_DIR = "raw"
RUN_RECORD = "study_run.json"
FORMAT = 1
PROBLEM_FIELDS = ("question", "gold", "solution", "source", "level")
"""Fields of a held-out answer record that belong to the problem: stored once per problem id."""


def archive_path(run_dir: str | Path) -> Path:
    """`<study>/raw/<run>.json.xz` of `<study>/runs/<run>`."""
    run_dir = Path(run_dir)
    return run_dir.parent.parent / ARCHIVE_DIR / f"{run_dir.name}.json.xz"


def _eval_file(run_dir: Path, step: int, agent: str) -> Path:
    return run_dir / "eval" / f"step_{step:06d}" / f"{agent}__heldout.jsonl"


def write_archive(run_dir: str | Path) -> Path:
    """Archive the run in `run_dir` (metrics.jsonl required) next to the study's `runs/`; returns the file."""
    run_dir = Path(run_dir)
    metrics_path = run_dir / "metrics.jsonl"
    if not metrics_path.is_file():
        raise FileNotFoundError(f"no metrics.jsonl in {run_dir}: nothing to archive")
    record_path = run_dir / RUN_RECORD
    problems: dict[str, dict[str, Any]] = {}
    answers: dict[str, list[dict[str, Any]]] = {}
    for path in sorted((run_dir / "eval").glob("step_*/*__heldout.jsonl")):
        step, agent = int(path.parent.name.removeprefix("step_")), path.name.removesuffix("__heldout.jsonl")
        rows = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            answer = json.loads(line)
            problems.setdefault(answer["id"], {k: answer[k] for k in PROBLEM_FIELDS if k in answer})
            rows.append({k: v for k, v in answer.items() if k not in PROBLEM_FIELDS})
        answers[f"{step}/{agent}"] = rows
    payload = {"format": FORMAT, "run": run_dir.name,
               "record": json.loads(record_path.read_text()) if record_path.is_file() else {},
               "metrics": [json.loads(line) for line in metrics_path.read_text(encoding="utf-8").splitlines()
                           if line.strip()],
               "problems": problems, "eval": answers}
    dest = archive_path(run_dir)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    with lzma.open(partial, "wt", encoding="utf-8", preset=9) as out:
        json.dump(payload, out, separators=(",", ":"))
    partial.replace(dest)
    return dest


class RunFiles:
    """One run's record, metrics and held-out answers: from `run_dir` when its metrics.jsonl is here, else from
    its archive (`archive_path`); `exists` says whether either is."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.name = self.run_dir.name
        self.algo = self.name.rsplit("_seed", 1)[0]
        self.archived = not (self.run_dir / "metrics.jsonl").is_file() and archive_path(self.run_dir).is_file()

    @property
    def exists(self) -> bool:
        return self.archived or (self.run_dir / "metrics.jsonl").is_file()

    @cached_property
    def _archive(self) -> dict[str, Any]:
        with lzma.open(archive_path(self.run_dir), "rt", encoding="utf-8") as fh:
            payload = json.load(fh)
        if payload.get("format") != FORMAT:
            raise ValueError(f"{archive_path(self.run_dir)}: archive format {payload.get('format')}, not {FORMAT}")
        return payload

    def record(self) -> dict[str, Any]:
        """The run's `study_run.json` ({} when it has none)."""
        if self.archived:
            return self._archive["record"]
        path = self.run_dir / RUN_RECORD
        return json.loads(path.read_text()) if path.is_file() else {}

    def metrics(self) -> list[dict[str, Any]]:
        """Every line of metrics.jsonl, in order ([] when neither the run nor its archive is here)."""
        if self.archived:
            return list(self._archive["metrics"])
        path = self.run_dir / "metrics.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def evaluations(self) -> dict[str, list[int]]:
        """`{agent: [steps evaluated, ascending]}`."""
        if self.archived:
            keys = [key.split("/", 1) for key in self._archive["eval"]]
        else:
            keys = [(p.parent.name.removeprefix("step_"), p.name.removesuffix("__heldout.jsonl"))
                    for p in (self.run_dir / "eval").glob("step_*/*__heldout.jsonl")]
        out: dict[str, list[int]] = {}
        for step, agent in keys:
            out.setdefault(agent, []).append(int(step))
        return {agent: sorted(steps) for agent, steps in sorted(out.items())}

    def answers(self, step: int, agent: str) -> list[dict[str, Any]]:
        """The agent's held-out answer records at `step`, as the loop wrote them ([] when it did not evaluate)."""
        if self.archived:
            problems = self._archive["problems"]
            return [{**problems.get(row["id"], {}), **row} for row in self._archive["eval"].get(f"{step}/{agent}", [])]
        path = _eval_file(self.run_dir, step, agent)
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def study_runs(study_dir: str | Path) -> list[RunFiles]:
    """Every run of a study that is here or archived (`runs/*_seed*`, `raw/*_seed*.json.xz`), by name."""
    study_dir = Path(study_dir)
    names = {p.name for p in (study_dir / "runs").glob("*_seed*") if p.is_dir()}
    names |= {p.name.removesuffix(".json.xz") for p in (study_dir / ARCHIVE_DIR).glob("*_seed*.json.xz")}
    return [RunFiles(study_dir / "runs" / name) for name in sorted(names)]

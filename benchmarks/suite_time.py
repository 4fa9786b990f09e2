"""Where the test suite's time goes: seconds per module and per unit of work from pytest's JUnit XML files.

    make test ARGS="--junitxml=/tmp/before.xml -o junit_family=xunit1"     # once per commit to compare
    python benchmarks/suite_time.py /tmp/before.xml /tmp/after.xml --top 25

A unit of work is what one pytest-xdist worker runs whole (`tests/conftest.py`: a Slurm module with its cluster,
the modules that read the session's uninterrupted run, else a module); its seconds are the sum of its tests'
(setup, call and teardown: JUnit's `time`), so with two workers the suite's wall time is at least half the total and
at least the largest unit. Columns: one per XML file, in the order given; rows the heaviest first (by the first file).
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from nemo_hacpo.reporting import markdown_table  # noqa: E402
from tests.conftest import unit_of_work  # noqa: E402


def module_seconds(junit_xml: Path) -> dict[str, float]:
    """Module path (tests/…/test_x.py) → seconds of its test cases (skipped ones count their setup)."""
    seconds: dict[str, float] = {}
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        module = case.get("file") or case.get("classname", "").rsplit(".", 1)[0].replace(".", "/") + ".py"
        seconds[module] = seconds.get(module, 0.0) + float(case.get("time") or 0.0)
    return seconds


def unit_seconds(modules: dict[str, float]) -> dict[str, float]:
    units: dict[str, float] = {}
    for module, seconds in modules.items():
        unit = unit_of_work(module)
        units[unit] = units.get(unit, 0.0) + seconds
    return units


def table(runs: Sequence[dict[str, float]], labels: Sequence[str], top: int, what: str) -> str:
    keys = sorted(set().union(*runs), key=lambda k: -runs[0].get(k, 0.0))
    rows = []
    for key in keys[:top]:
        row: dict[str, object] = {what: key}
        for label, run in zip(labels, runs, strict=True):
            row[label] = f"{run[key]:.0f}" if key in run else "–"
        rows.append(row)
    rows.append({what: "all", **{label: f"{sum(run.values()):.0f}" for label, run in zip(labels, runs, strict=True)}})
    return markdown_table(rows, [what, *labels])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", nargs="+", type=Path, help="pytest --junitxml files (junit_family=xunit1)")
    parser.add_argument("--labels", help="comma-separated column names (default: the files' names)")
    parser.add_argument("--top", type=int, default=20, help="rows per table (default 20)")
    args = parser.parse_args(argv)
    labels = args.labels.split(",") if args.labels else [path.stem for path in args.junit]
    if len(labels) != len(args.junit):
        parser.error(f"--labels names {len(labels)} columns for {len(args.junit)} files")
    missing = [str(path) for path in args.junit if not path.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    modules = [module_seconds(path) for path in args.junit]
    print("Seconds per unit of work (one xdist worker runs a unit whole):\n")
    print(table([unit_seconds(m) for m in modules], labels, args.top, "unit"))
    print("\nSeconds per module:\n")
    print(table(modules, labels, args.top, "module"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where agents go wrong on the generated arithmetic task: accuracy per level and the first error of every
wrong response, from the answer files `recipes/evaluate.py` writes.

    python recipes/evaluate.py --run outputs/pair_tiny                     # writes outputs/pair_tiny/eval/answers/
    python recipes/arithmetic_errors.py outputs/pair_tiny/eval/answers/*.jsonl
    python recipes/arithmetic_errors.py a.jsonl b.jsonl --mode sampled --out errors   # errors.md + errors.png

Each wrong response (reward 0) is compared line by line with the problem's worked solution
(`nemo_hacpo.data.arithmetic.classify_response`): no boxed answer, wrong start value, wrong number of steps,
a line not starting from the previous result, wrong operation, wrong operand, a wrong arithmetic fact
(`a <op> b = c` with a wrong `c`), or a wrong final answer after right steps. The kinds say what RL can be
expected to fix quickly (format, reading the question) and what it cannot (arithmetic facts the model never
learned). Problems without a generated worked solution (GSM8K, your own files) are skipped and counted.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from nemo_hacpo.data.arithmetic import ERROR_KINDS, classify_response
from nemo_hacpo.reporting import markdown_table, pyplot, save_figure

WRONG_KINDS = tuple(kind for kind in ERROR_KINDS if kind != "none")


def breakdown(path: Path, mode: str) -> dict:
    """One table row: responses, accuracy overall and per level, and the count of each error kind."""
    if not path.is_file():
        raise FileNotFoundError(f"no answers file at {path} (recipes/evaluate.py writes <out>/answers/*.jsonl)")
    correct_by_level: dict[str, list[float]] = {}
    kinds: Counter[str] = Counter()
    skipped = 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error})") from None
        solution = record.get("solution") or ""
        if record.get("source") != "arithmetic" or not solution:
            skipped += 1
            continue
        for response in record["responses"]:
            if response["mode"] != mode:
                continue
            correct_by_level.setdefault(str(record.get("level")), []).append(response["reward"])
            if response["reward"] <= 0:
                kind = classify_response(solution, response["text"])
                kinds["right steps, rejected" if kind == "none" else kind] += 1
    rewards = [r for values in correct_by_level.values() for r in values]
    row: dict = {"answers": path.stem, "responses": len(rewards),
                 "accuracy": sum(rewards) / len(rewards) if rewards else float("nan")}
    for level in sorted(correct_by_level):
        values = correct_by_level[level]
        row[f"level {level}"] = sum(values) / len(values)
    wrong = sum(kinds.values())
    for kind in (*WRONG_KINDS, "right steps, rejected"):
        row[kind] = kinds.get(kind, 0)
    row["wrong"] = wrong
    row["skipped problems"] = skipped
    return row


def plot(rows: list[dict], target: Path, mode: str) -> None:
    plt = pyplot()
    kinds = [k for k in (*WRONG_KINDS, "right steps, rejected") if any(row[k] for row in rows)]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(rows) + 2), 4.5))
    bottom = [0.0] * len(rows)
    for kind in kinds:
        shares = [row[kind] / row["responses"] if row["responses"] else 0.0 for row in rows]
        ax.bar([row["answers"] for row in rows], shares, bottom=bottom, label=kind)
        bottom = [b + s for b, s in zip(bottom, shares, strict=True)]
    ax.set_ylabel(f"share of {mode} responses")
    ax.set_ylim(0, 1)
    ax.set_title("wrong responses by first error (the rest are correct)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    save_figure(fig, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("answers", nargs="+", type=Path, help="answers/<agent>__<dataset>.jsonl of evaluate.py")
    parser.add_argument("--mode", choices=("greedy", "sampled"), default="greedy",
                        help="which responses to analyse (sampled: evaluate.py --samples K)")
    parser.add_argument("--out", type=Path, default=None, help="also write <out>.md (table) and <out>.png (plot)")
    args = parser.parse_args(argv)
    try:
        rows = [breakdown(path, args.mode) for path in args.answers]
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not any(row["responses"] for row in rows):
        print(f"error: no {args.mode} responses to generated arithmetic problems in {len(rows)} file(s)",
              file=sys.stderr)
        return 2
    columns = list(dict.fromkeys(key for row in rows for key in row))
    table = markdown_table(rows, columns)
    print(table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(f"# Arithmetic errors ({args.mode})\n\n{table}\n", encoding="utf-8")
        plot(rows, args.out.with_suffix(".png"), args.mode)
        print(f"wrote {args.out.with_suffix('.md')} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

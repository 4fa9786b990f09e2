"""How different are two agents before any RL? The heterogeneity of a pair, measured from its warm starts.

For each candidate pair (a config and its overrides) it prints, per agent, the greedy and sampled (avg@4, pass@4)
accuracy on the held-out problems (`recipes/evaluate.py` on the warm-start checkpoints: vLLM, the run's
scorer), and per direction source → learner the cross ratio s of the first HACPO step (`benchmarks/cross_path.py`:
p10 / p50 / p90, the share of cross rows inside the clip window, the share with gradient):

    python benchmarks/heterogeneity.py                                   # every candidate of CANDIDATES
    python benchmarks/heterogeneity.py --only default,state --prompts 64
    python benchmarks/heterogeneity.py --aggregate-only                   # the table of every candidate measured

The candidates differ from the default pair (`pair_tiny`) in one thing each, all in qwen_tiny (agent 1), so that
llama_tiny's warm start is the default run's: a capability gap (fewer warm-start steps, a smaller model, a
stronger habit of finishing) or a behaviour gap (another solution style that the verifier accepts,
`warmstart.narrated_fraction`). Each candidate's numbers go to `<out>/<candidate>/` (cross.json, eval/); the
table to `<out>/candidates.md` and `<out>/candidates.json`. A missing warm start is trained first (minutes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QWEN_3X128 = ["agents.1.model.tiny.num_layers=3", "agents.1.model.tiny.hidden_size=128",
              "agents.1.model.tiny.num_attention_heads=2", "agents.1.model.tiny.ffn_hidden_size=384"]
"""qwen_tiny at its earlier size (0.79M parameters), the one the pair search rejected."""

CANDIDATES: dict[str, tuple[str, list[str], str]] = {
    "default": ("pair_tiny", [], "the default pair: both warm-started alike"),
    "state": ("pair_tiny", ["agents.1.warmstart.steps=100"],
              "capability gap: qwen_tiny warm-started 100 steps instead of 300"),
    "state60": ("pair_tiny", ["agents.1.warmstart.steps=60"],
                "capability gap: qwen_tiny warm-started 60 steps instead of 300"),
    "size": ("pair_tiny", QWEN_3X128, "capability gap: qwen_tiny at 3 × 128 (0.79M parameters)"),
    "habit": ("pair_tiny", ["agents.1.warmstart.stop_early_fraction=0.1"],
              "capability gap: qwen_tiny stops early on 10 % of multi-step solutions instead of 60 %"),
    "style": ("pair_tiny", ["agents.1.warmstart.narrated_fraction=1.0"],
              "behaviour gap: qwen_tiny taught the narrated style on every solution"),
    "trio": ("trio_tiny", [], "three agents: the default pair and gpt_tiny at 4 × 256 (LayerNorm, GELU, digit-level "
             "Unigram)"),
    "trio_gpt192": ("trio_tiny", ["agents.2.model.tiny.hidden_size=192", "agents.2.model.tiny.num_attention_heads=3",
                                  "agents.2.model.tiny.ffn_hidden_size=768"],
                    "three agents: gpt_tiny at 4 × 192"),
    "style_half": ("pair_tiny", ["agents.1.warmstart.narrated_fraction=0.5"],
                   "behaviour gap: qwen_tiny taught the narrated style on half of the solutions"),
}
"""Every candidate tried: name → (config, overrides, what differs). Keep tried ones here: the table records them."""


def measure_candidate(name: str, out: Path, prompts: int, samples: int, seed: int) -> dict:
    """Warm starts (trained when missing), the cross path at step 0, and each agent's held-out accuracy."""
    from benchmarks.cross_path import measure
    from nemo_hacpo.config import load_config
    from nemo_hacpo.runtime.warmstart import ensure_warm_start

    config, overrides, what = CANDIDATES[name]
    cfg = load_config(config, overrides)
    target = out / name
    target.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    warm = ensure_warm_start(cfg)
    cross = measure(cfg, prompts, 4, seed)
    (target / "cross.json").write_text(json.dumps(cross, indent=1))
    evaluation = target / "eval"
    for agent in cfg.agents:  # each model with its own agent's settings (tokenizer, template, lengths)
        subprocess.run([sys.executable, str(ROOT / "recipes/evaluate.py"), f"--model={agent.name}={warm[agent.name]}",
                        f"--config-name={config}", f"--agent={agent.name}", f"--samples={samples}",
                        f"--pass-k={samples}", f"--seed={seed}", f"--out={evaluation / agent.name}"],
                       check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    accuracy = {}
    for agent in cfg.agents:
        row = json.loads((evaluation / agent.name / "results.json").read_text())["results"][0]
        accuracy[agent.name] = {key: row[key] for key in row if key.startswith(("greedy", "avg@", "pass@"))}
    record = {"candidate": name, "config": config, "overrides": overrides, "what": what,
              "warm_starts": warm, "accuracy": accuracy, "cross": cross, "elapsed_s": time.perf_counter() - start}
    (target / "heterogeneity.json").write_text(json.dumps(record, indent=1))
    return record


def table(records: list[dict]) -> str:
    """One row per candidate and direction source → learner (per-tokenizer ratio, each row at its update)."""
    lines = ["| candidate | what differs | agent | greedy | avg@4 | pass@4 | direction | s p10 / p50 / p90 | "
             "in window | with gradient |", "|---|---|---|---|---|---|---|---|---|---|"]
    for record in records:
        directions = record["cross"]["directions"]
        for agent, acc in record["accuracy"].items():
            for direction in (d for d in directions if d.endswith(f"→ {agent}")):
                e = directions[direction]["per_tokenizer"]
                lines.append(
                    f"| {record['candidate']} | {record['what']} | {agent} | "
                    f"{acc.get('greedy_avg@1', float('nan')):.3f} | {acc.get('avg@4', float('nan')):.3f} | "
                    f"{acc.get('pass@4', float('nan')):.3f} | {direction} | {e['s_p10']:.3g} / {e['s_p50']:.3g} / "
                    f"{e['s_p90']:.3g} | {e['in_window_frac']:.2f} | {e['grad_frac']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated candidates (default: all of CANDIDATES)")
    parser.add_argument("--prompts", type=int, default=64, help="training prompts of the cross-path sample")
    parser.add_argument("--samples", type=int, default=4, help="sampled responses per held-out problem (avg@k)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/heterogeneity")
    parser.add_argument("--aggregate-only", action="store_true", help="rebuild the table from what was measured")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(CANDIDATES)
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise SystemExit(f"unknown candidate(s) {unknown}; choose from {list(CANDIDATES)}")
    for name in names:
        if args.aggregate_only or (args.out / name / "heterogeneity.json").is_file():
            continue
        print(f"[heterogeneity] {name}: {CANDIDATES[name][2]}", flush=True)
        print(table([measure_candidate(name, args.out, args.prompts, args.samples, args.seed)]), flush=True)
    # the table holds every candidate measured so far, whichever this call measured
    records = [json.loads(path.read_text()) for name in CANDIDATES
               if (path := args.out / name / "heterogeneity.json").is_file()]
    markdown = table(records)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "candidates.md").write_text(markdown + "\n")
    (args.out / "candidates.json").write_text(json.dumps(records, indent=1))
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

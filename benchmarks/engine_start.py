"""What an agent's engine start costs: bytes written and read, seconds — the former export against today's starts.

    python benchmarks/engine_start.py                        # pair_tiny's llama_tiny (its warm start must be cached)
    python benchmarks/engine_start.py --agent qwen_tiny --json /tmp/start.json

One rank (a world of one, CPU), the agent's trainer loaded from its warm start, and three ways to give its vLLM
engine the trainer's weights, each measured from the call to a ready engine:

    export      what every start did before issue #40: the whole model written as an HF checkpoint (the ranks'
                all-gather, the host copy, safetensors), the engine started on it — reading it back
    fresh       a fresh run from an HF checkpoint (the agent's model.path, its warm start): the engine reads that
                checkpoint, nothing is written
    resume      a resume (or a random init): a config.json and the tokenizer written, the engine started on
                placeholder weights (`load_format="dummy"`), the trainer's weights refit into it — nothing read

`--plan` models the same for pair_large from the checkpoints' sizes and the shared file system's bandwidth.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _bytes(directory: Path, weights_only: bool = False) -> int:
    files = [p for p in directory.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files if not weights_only or p.suffix == ".safetensors")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(config: str, agent_name: str, overrides: list[str]) -> list[dict]:
    from nemo_hacpo.config import load_config
    from nemo_hacpo.runtime.warmstart import warm_start_dir
    from nemo_hacpo.runtime.worker import AgentRank

    cfg = load_config(config, overrides)
    agent = cfg.agent(agent_name)
    warm = warm_start_dir(agent, cfg)
    if not (warm / "config.json").is_file():
        raise SystemExit(f"no warm start of {agent_name} at {warm}: run `python recipes/warmstart.py --config-name "
                         f"{config}` first")
    run_dir = Path(tempfile.mkdtemp(prefix="engine_start_"))
    rank = AgentRank(agent, 0, seed=0, run_dir=str(run_dir), total_updates=10, keep_reference=False)
    rows = []
    try:
        rank.setup("127.0.0.1", _free_port(), init_weights=str(warm), start_engine=False)
        for how in ("export", "fresh", "resume"):
            start = time.perf_counter()
            if how == "export":
                exported = Path(rank.save_hf(str(run_dir / "export")))
                written, read = _bytes(exported), _bytes(exported, weights_only=True)
                rank.engine = rank._new_engine(str(exported))
            elif how == "fresh":
                written, read = 0, _bytes(warm, weights_only=True)
                rank.engine = rank._new_engine(str(warm))
            else:
                shutil.rmtree(run_dir / "engines", ignore_errors=True)
                rank.start_engine(None)
                written, read = _bytes(run_dir / "engines"), 0
            seconds = time.perf_counter() - start
            stats = rank.engine.stats
            rows.append({"start": how, "written_bytes": written, "read_bytes": read, "seconds": seconds,
                         "engine_startup_s": stats.get("startup_s"), "refit_s": stats.get("last_refit_s")})
            print(f"[engine_start] {how}: {seconds:.1f} s, wrote {written / 1e6:.2f} MB, read {read / 1e6:.2f} MB",
                  flush=True)
            rank.engine.shutdown()
            rank.engine = None
    finally:
        rank.shutdown()
        shutil.rmtree(run_dir, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-name", default="pair_tiny")
    parser.add_argument("--agent", default="llama_tiny")
    parser.add_argument("--json", type=Path)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    rows = measure(args.config_name, args.agent, args.overrides)
    print("| start | written | read | seconds to a ready engine | of which the engine's start | refit |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        refit = f"{r['refit_s']:.2f} s" if r["start"] == "resume" and r["refit_s"] is not None else "—"
        print(f"| {r['start']} | {r['written_bytes'] / 1e6:.2f} MB | {r['read_bytes'] / 1e6:.2f} MB | {r['seconds']:.1f} | "
              f"{r['engine_startup_s']:.1f} | {refit} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Export agents of a run checkpoint as HF checkpoints (config.json + safetensors + tokenizer).

    python recipes/export_hf.py --run outputs/pair_tiny                      # newest checkpoint, every agent
    python recipes/export_hf.py --run outputs/pair_tiny --step 5 --agent qwen_tiny --out /tmp/qwen_step5

Each agent's Megatron checkpoint is loaded by a worker group with the run's own layout (its GPUs on a cluster,
CPU processes here) and written in HF names and layout, loadable by transformers and vLLM. Training already
exports the final weights to `<run>/hf/<agent>`; this is for earlier checkpoints. Output: `<out>/<agent>/`
(default `<run>/hf_step<step>/`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True, help="a run's output_dir (config.yaml + checkpoints/)")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the newest complete one)")
    parser.add_argument("--agent", action="append", default=[], help="only these agents (repeatable)")
    parser.add_argument("--out", type=Path, help="output directory (default: <run>/hf_step<step>)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    from nemo_hacpo.config import ConfigError, load_run_config
    from nemo_hacpo.runtime.run_checkpoint import checkpoints

    try:
        cfg = load_run_config(args.run)
    except (FileNotFoundError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    found = {c.step: c for c in checkpoints(args.run)}
    if not found or (args.step is not None and args.step not in found):
        print(f"no complete checkpoint{'' if args.step is None else f' for step {args.step}'} under "
              f"{(args.run / 'checkpoints').resolve()} (have: {sorted(found) or 'none'})", file=sys.stderr)
        return 2
    ckpt = found[args.step if args.step is not None else max(found)]
    problems = ckpt.problems()
    if problems:
        print(f"checkpoint {ckpt.path} fails verification: {'; '.join(problems[:5])}", file=sys.stderr)
        return 2
    names = args.agent or [a.name for a in cfg.agents]
    unknown = [n for n in names if n not in {a.name for a in cfg.agents}]
    if unknown:
        print(f"unknown agent(s) {unknown}; the run has {[a.name for a in cfg.agents]}", file=sys.stderr)
        return 2
    out = args.out or args.run / f"hf_step{ckpt.step}"

    import ray

    from nemo_hacpo.runtime.groups import AgentGroup, WorkerFailure, start_ray

    start_ray(cfg)
    try:
        for name in names:
            agent = cfg.agent(name)
            group = AgentGroup(agent, seed=cfg.runtime.seed, run_dir=str(out / ".work"), keep_reference=False,
                               total_updates=cfg.runtime.steps * cfg.algo.updates_per_step,
                               device=cfg.runtime.cluster.device, start_engine=False,
                               resume_from=str(ckpt.agent_dir(name)), log_dir=str(out / ".work" / "logs"))
            try:
                group.wait_ready()
                group.save_hf(str(out / name)).result()
            finally:
                group.shutdown()
            print(f"{name}: step {ckpt.step} → {out / name}")
    except WorkerFailure as err:  # the checkpoint does not load into this agent (layout, architecture, files)
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

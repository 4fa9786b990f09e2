"""Supervised warm start of a config's tiny agents on generated worked solutions (cached; `train.py` runs it
on its own when the cache is missing).

    python recipes/warmstart.py                              # pair_tiny's agents
    python recipes/warmstart.py --config-name trio_tiny warmstart.steps=500
    python recipes/warmstart.py --force                      # train again even if cached

Each agent's checkpoint lands in `warmstart.cache_dir/<agent>-<hash>` (HF format), the hash covering everything
that shapes it, so a training run with the same agents and warm-start settings picks it up.
"""

from __future__ import annotations

import argparse
import shutil
import sys

from nemo_hacpo.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-name", "-cn", default="pair_tiny", help="config under conf/ (default: pair_tiny)")
    parser.add_argument("--force", action="store_true", help="delete the cached checkpoints and train again")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. warmstart.steps=500")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = load_config(args.config_name, ["warmstart.enabled=true", *args.overrides])
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    from nemo_hacpo.runtime.warmstart import ensure_warm_start, warm_start_dir

    tiny = [a for a in cfg.agents if a.model.source == "tiny"]
    if not tiny:
        print(f"{args.config_name}: no agent has model.source=tiny; nothing to warm-start", file=sys.stderr)
        return 0
    if args.force:
        for agent in tiny:
            shutil.rmtree(warm_start_dir(agent, cfg), ignore_errors=True)
    try:
        done = ensure_warm_start(cfg)
    finally:
        import ray

        ray.shutdown()
    for name, path in done.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

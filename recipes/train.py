"""Train several heterogeneous agents together (HACPO and its baselines).

    python recipes/train.py                                   # conf/pair_tiny.yaml on CPU
    python recipes/train.py --config-name pair_tiny algo=gspo runtime.steps=20
    python recipes/train.py --cfg job                         # print the resolved config and exit
    python recipes/train.py --describe                        # every config key with its docstring
    python recipes/train.py --config-name pair_large --plan   # GPUs, layout, memory per GPU; refuses a misfit

Exit status: 0 done, 1 a worker failed, 2 a start-up check failed (a config or data error, an output directory
that cannot be written or is held by another live run; nothing is written before these checks), 75 stopped early
with a verified checkpoint (SIGUSR1, runtime.stop_by or the Slurm job's end time; the same command continues),
143 stopped by SIGTERM.

Overrides are Hydra's `key=value` (list items by index: `agents.0.optimizer.lr=1e-5`), config groups
(`algo=gspo_x2`). The recipe composes components; the step loop lives in `nemo_hacpo.runtime`.
"""

from __future__ import annotations

import argparse
import difflib
import signal
import sys
import threading

from nemo_hacpo.config import ConfigError, compose, describe, dump_config, validate


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-name", "-cn", default="pair_tiny", help="config under conf/ (default: pair_tiny)")
    parser.add_argument("--config-dir", "-cd", default=None, help="directory holding the configs (default: conf/)")
    parser.add_argument("--cfg", choices=["job"], help="print the resolved config and exit")
    parser.add_argument("--describe", action="store_true", help="list every config key with its meaning and exit")
    parser.add_argument("--plan", action="store_true",
                        help="print GPUs, layout and memory per GPU of every agent; exit 2 if a layout cannot fit")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. algo=gspo runtime.steps=20")
    return parser.parse_args(argv)


class ComposeError(Exception):
    """A config that Hydra cannot compose (unknown config name, malformed override, missing group option)."""


def _compose(args: argparse.Namespace):
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    try:
        return compose(args.config_name, args.overrides, args.config_dir)
    except FileNotFoundError as err:
        raise ComposeError(f"error: {err}") from err
    except MissingConfigException as err:  # a config-group option without its file: algo=hacop
        group, _, option = (err.missing_cfg_file or "").rpartition("/")
        if not (group and err.options):
            raise ComposeError(f"error: cannot compose config {args.config_name!r}: {str(err).splitlines()[0]}") from err
        close = difflib.get_close_matches(option, err.options, n=1)
        raise ComposeError(f"error: {group}={option}: no option {option!r} in the config group {group} "
                           f"({args.config_dir or 'conf'}/{group}/*.yaml) — fix: choose one of "
                           f"{', '.join(err.options)}{f' (did you mean {group}={close[0]}?)' if close else ''}") from err
    except (HydraException, OmegaConfBaseException) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ComposeError(f"error: cannot compose config {args.config_name!r} with {args.overrides}: {first}\n"
                           "overrides are key=value (list items by index: agents.0.optimizer.lr=1e-5), config "
                           "groups by name (algo=gspo)") from err


def print_plan(cfg, notes: list[str]) -> int:
    """Print the plan (`planning.plan`); exit status 2 when something cannot fit. `notes`: checks that were skipped."""
    from nemo_hacpo.models.architecture import model_arch
    from nemo_hacpo.models.tokenizers import load_tokenizer
    from nemo_hacpo.planning.plan import format_plan, plan_run

    archs = [model_arch(agent, len(load_tokenizer(agent.tokenizer.source)) if agent.model.source == "tiny" else None)
             for agent in cfg.agents]  # HF models: shapes from config.json only
    plan = plan_run(cfg, archs, tuple(notes))
    print(format_plan(plan, cfg))
    return 0 if plan.fits else 2


def main(argv: list[str] | None = None) -> int:
    if threading.current_thread() is threading.main_thread():
        # SIGUSR1 asks a run to save and stop (nemo_hacpo/runtime/preemption.py); until the run has installed
        # its handler (after the imports), one must not kill the process with the default action
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.describe:
        print("\n".join(describe()))
        return 0
    notes: list[str] = []
    try:
        cfg = validate(_compose(args))
        if args.plan:
            from nemo_hacpo.planning.preflight import check_agents

            # the plan reads the tiny agents' tokenizers: check them first; an HF checkpoint without tokenizer
            # files (sizing a cluster before the weights are copied) is planned without its vocabulary check
            notes = check_agents(cfg, vocabulary_optional=True)
    except (ConfigError, ComposeError) as err:
        print(err, file=sys.stderr)
        return 2
    if args.cfg == "job":  # printed once it validated: what a run would use, every default included
        print(dump_config(cfg))
        return 0
    if args.plan:
        return print_plan(cfg, notes)

    from nemo_hacpo.runtime import train  # imports Ray, Megatron and vLLM lazily

    return train(cfg)


if __name__ == "__main__":
    sys.exit(main())

"""Evaluate agents (a finished run's or any HF checkpoints) with vLLM: greedy avg@1, sampled avg@k, pass@k.

    python recipes/evaluate.py --run outputs/pair_tiny                        # every agent of a finished run
    python recipes/evaluate.py --run outputs/pair_tiny --dataset gsm8k --samples 8 --pass-k 1,4,8
    python recipes/evaluate.py --model llama=/path/hf_dir --model other=/path2 --config-name pair_tiny --agent llama_tiny
    python recipes/evaluate.py --model /path/hf_dir --dataset /data/test.jsonl --field question=problem \\
        --field answer=solution --limit 100

Datasets (repeatable): `heldout` (the run's / config's data.eval split), `gsm8k`, `aime2025` (the `eval` extra),
or a local .jsonl/.json/.parquet file whose columns `--field KEY=COLUMN` maps (keys: question, answer, id,
level, solution). Output in --out (default <run>/eval, else outputs/eval): results.md, results.csv,
results.json (one row per agent × dataset) and answers/<agent>__<dataset>.jsonl. One engine runs at a time.
The console shows the plan, one line per agent × dataset and the table; everything vLLM and the other libraries
print goes to <out>/logs/evaluate.log (`--verbose`: to the console too, as it comes).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

DEFAULT_OUT = Path("outputs/eval")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_argument_group("what to evaluate")
    what.add_argument("--run", help="a finished training run: <run>/config.yaml and <run>/hf/<agent>/")
    what.add_argument("--model", action="append", default=[], metavar="NAME=DIR",
                      help="an HF checkpoint directory (repeatable); NAME labels it (default: the folder name)")
    what.add_argument("--config-name", "-cn", help="config under conf/ whose agent settings --model uses")
    what.add_argument("--config-dir", "-cd", help="directory holding the configs (default: conf/)")
    what.add_argument("--agent", action="append", default=[],
                      help="with --run: evaluate only these agents (repeatable); with --model and --config-name: "
                           "the config's agent whose settings every --model uses (default: the agent named NAME)")
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", action="append", default=[], metavar="NAME|PATH",
                      help="heldout | gsm8k | aime2025 | a local .jsonl/.parquet file (repeatable; default heldout)")
    data.add_argument("--field", action="append", default=[], metavar="KEY=COLUMN",
                      help="field mapping of local files, e.g. question=problem answer=solution")
    data.add_argument("--limit", type=int, help="first N problems of each dataset")
    data.add_argument("--on-invalid", choices=["error", "skip"],
                      help="a bad record or a prompt longer than an agent's max_prompt_length: stop naming each "
                           "(error) or drop it for every agent (skip); default: the run's data.on_invalid, else error")
    gen = parser.add_argument_group("generation and scoring")
    gen.add_argument("--greedy", action=argparse.BooleanOptionalAction, default=True,
                     help="greedy decoding, one response per problem → greedy_avg@1 (default: on)")
    gen.add_argument("--samples", type=int, default=0, metavar="K", help="K sampled responses per problem → avg@K")
    gen.add_argument("--pass-k", help="k of pass@k, comma-separated, each ≤ K (default: powers of two up to K, and K)")
    gen.add_argument("--temperature", type=float, default=1.0, help="temperature of the sampled responses")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus mass of the sampled responses")
    gen.add_argument("--seed", type=int, default=0, help="base seed of the sampled responses")
    gen.add_argument("--max-prompt-length", type=int, help="override every agent's max_prompt_length (tokens)")
    gen.add_argument("--max-response-length", type=int, help="override every agent's max_response_length (tokens)")
    gen.add_argument("--batch-size", type=int, default=256, help="problems per generate call")
    gen.add_argument("--lenient", action="store_true", help="lenient answer extraction (default: the run's mode, "
                                                            "else strict: last \\boxed{} only)")
    gen.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    parser.add_argument("--out", type=Path, help="output directory (default: <run>/eval, else outputs/eval)")
    parser.add_argument("--verbose", action="store_true",
                        help="print what vLLM and the other libraries log on the console too (default: only to "
                             "<out>/logs/evaluate.log)")
    return parser.parse_args(argv)


def _out_dir(args: argparse.Namespace) -> Path:
    return args.out or (Path(args.run) / "eval" if args.run else DEFAULT_OUT)


@contextlib.contextmanager
def third_party_output_to(log_file: Path | None) -> Iterator[None]:
    """Inside: file descriptors 1 and 2 (vLLM's engine processes, C++ libraries) and every log record go to
    `log_file`, appending, while this script's own prints and `nemo_hacpo`'s log records stay on the console, as
    in a training run (`runtime.rank_process.redirect_output`). None: everything on the console."""
    fmt = logging.Formatter("%(asctime)s %(name)s: %(message)s")
    if log_file is None:
        yield
        return
    log_file.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    streams = sys.stdout, sys.stderr
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
    # print() goes on to the console: a new stream on the console's descriptor (unless a caller replaced the
    # streams, e.g. pytest's capsys, whose objects do not write to fd 1/2)
    if sys.stdout is sys.__stdout__:
        sys.stdout = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    if sys.stderr is sys.__stderr__:
        sys.stderr = os.fdopen(os.dup(saved[2]), "w", buffering=1)
    log_stream = open(log_file, "a", buffering=1)  # noqa: SIM115 - closed in the finally below
    root, ours = logging.getLogger(), logging.getLogger("nemo_hacpo")
    to_file, to_console = logging.StreamHandler(log_stream), logging.StreamHandler(sys.stderr)
    to_file.setFormatter(fmt)
    to_console.setFormatter(fmt)
    previous = root.level, root.handlers[:], ours.level
    # vLLM logs through a handler of its own, (re)made when an engine is configured on the stream that
    # VLLM_LOGGING_STREAM names: the process's original stdout, now the log; one made earlier is pointed there too
    previous_stream = os.environ.get("VLLM_LOGGING_STREAM")
    os.environ["VLLM_LOGGING_STREAM"] = "ext://sys.__stdout__"
    vllm_handlers = [(h, h.stream) for h in logging.getLogger("vllm").handlers if isinstance(h, logging.StreamHandler)]
    root.handlers[:] = [to_file]
    root.setLevel(logging.INFO)
    ours.setLevel(logging.INFO)
    ours.addHandler(to_console)
    for handler, _ in vllm_handlers:
        handler.setStream(log_stream)
    try:
        yield
    finally:
        for handler, stream in vllm_handlers:
            handler.setStream(stream)
        if previous_stream is None:
            os.environ.pop("VLLM_LOGGING_STREAM", None)
        else:
            os.environ["VLLM_LOGGING_STREAM"] = previous_stream
        ours.removeHandler(to_console)
        root.handlers[:] = previous[1]
        root.setLevel(previous[0])
        ours.setLevel(previous[2])
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        if sys.stdout is not streams[0]:
            sys.stdout.close()
        if sys.stderr is not streams[1]:
            sys.stderr.close()
        sys.stdout, sys.stderr = streams
        for target, fd in saved.items():
            os.dup2(fd, target)
            os.close(fd)
        log_stream.close()


def _plan(args: argparse.Namespace):
    """(config or None, agent targets, dataset targets, EvalSettings, device, output dir) from the arguments."""
    import torch

    from nemo_hacpo.config import DataConfig, RewardConfig, load_config
    from nemo_hacpo.data.prompts import PromptFormat
    from nemo_hacpo.eval import EvalSettings, parse_ks
    from nemo_hacpo.eval.targets import (
        check_golds,
        check_prompt_lengths,
        load_dataset,
        model_targets,
        parse_field_mapping,
        run_targets,
        with_lengths,
    )
    from nemo_hacpo.rollout.settings import engine_settings

    if bool(args.run) == bool(args.model):
        raise ValueError("give either --run DIR or one or more --model NAME=DIR")
    # the options on their own first: nothing is loaded for a mistake in them
    if args.pass_k and args.samples < 1:
        raise ValueError("--pass-k needs --samples K (sampled responses per problem)")
    ks = parse_ks(args.pass_k, args.samples) if args.pass_k else ()
    settings = EvalSettings(greedy=args.greedy, samples=args.samples, pass_ks=ks, temperature=args.temperature,
                            top_p=args.top_p, seed=args.seed, batch_size=args.batch_size)
    fields = parse_field_mapping(args.field)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.run:
        if args.config_name:
            raise ValueError("--config-name is for --model; a run brings its own config.yaml")
        cfg, targets = run_targets(args.run, args.agent)
    else:
        if len(args.agent) > 1:
            raise ValueError("with --model, --agent names one config agent whose settings the models use")
        cfg = load_config(args.config_name, [], args.config_dir) if args.config_name else None
        targets = model_targets(args.model, cfg=cfg, agent=args.agent[0] if args.agent else None, device=device)
    targets = [with_lengths(t, args.max_prompt_length, args.max_response_length) for t in targets]
    for target in targets:  # the engine's own checks (lengths vs the checkpoint's positions, dtype) before any start
        engine_settings(target.agent, target.model_dir, target.tokenizer_dir or target.model_dir, device=device)

    heldout = cfg.data.eval if cfg is not None else None
    on_invalid = args.on_invalid or (cfg.data.on_invalid if cfg is not None else "error")
    prompt_format = PromptFormat.of(cfg.data, "eval") if cfg is not None else PromptFormat()
    datasets = [load_dataset(spec, heldout=heldout, fields=fields, limit=args.limit, on_invalid=on_invalid)
                for spec in (args.dataset or ["heldout"])]
    reward = cfg.reward if cfg is not None else RewardConfig()  # math-verify reads the golds: check them first
    max_share = cfg.data.max_invalid_gold_share if cfg is not None else DataConfig.max_invalid_gold_share
    datasets = [dataclasses.replace(d, problems=check_golds(d.problems, f"dataset {d.name}", on_invalid, reward,
                                                            max_share)) for d in datasets]
    datasets = check_prompt_lengths(datasets, targets, prompt_format, on_invalid)
    names = [d.name for d in datasets]
    if len(set(names)) != len(names):
        raise ValueError(f"two datasets share a name ({names}); rename a local file")
    settings = dataclasses.replace(settings, prompt_format=prompt_format)
    return cfg, targets, datasets, settings, device, _out_dir(args)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from nemo_hacpo.config import ConfigError

    try:  # every check before anything is written (the log included)
        planned = _plan(args)
    except (FileNotFoundError, ValueError, KeyError, ConfigError, ModuleNotFoundError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}", file=sys.stderr)
        return 2
    log_file = None if args.verbose else planned[-1] / "logs" / "evaluate.log"
    with third_party_output_to(log_file):
        status = _evaluate(args, *planned)
    if log_file is not None and status != 0:
        print(f"(what the libraries printed: {log_file})", file=sys.stderr)
    return status


def _evaluate(args: argparse.Namespace, cfg, targets, datasets, settings, device, out: Path) -> int:
    from nemo_hacpo.eval import evaluate_checkpoints, write_results
    from nemo_hacpo.eval.runner import CheckpointLoadError
    from nemo_hacpo.eval.tables import progress_line
    from nemo_hacpo.rewards import MathRewardScorer

    reward = cfg.reward if cfg is not None else None
    strict = not args.lenient and (reward.strict if reward is not None else True)
    print(f"evaluating {[t.name for t in targets]} on {[f'{d.name} ({len(d.problems)})' for d in datasets]} "
          f"on {device}: greedy={settings.greedy}, samples={settings.samples}, pass@k={list(settings.ks)}",
          flush=True)
    scorer_of = MathRewardScorer.from_config if reward is not None else None
    with (scorer_of(reward, strict=strict) if scorer_of else MathRewardScorer(num_workers=1, strict=strict)) as scorer:
        try:
            results = evaluate_checkpoints(targets, datasets, settings, scorer=scorer, device=device,
                                           on_result=lambda result: print(progress_line(result), flush=True))
        except CheckpointLoadError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    run_settings = {
        "greedy": settings.greedy, "samples": settings.samples, "pass_ks": list(settings.ks),
        "temperature": settings.temperature, "top_p": settings.top_p, "seed": settings.seed,
        "strict": strict, "limit": args.limit, "device": device,
        "agents": {t.name: str(t.model_dir) for t in targets},
        "datasets": {d.name: d.origin for d in datasets},
        "max_response_length": {t.name: t.agent.max_response_length for t in targets},
    }
    paths = write_results(results, out, run_settings, title=f"Evaluation of {args.run or 'models'}")
    print(paths["markdown"].read_text())
    print(f"outputs: {out} (results.md, results.csv, results.json, answers/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

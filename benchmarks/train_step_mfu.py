"""Trainer step time and model FLOPs utilisation of a ≈1B-parameter Llama-like agent on one GPU.

    python benchmarks/train_step_mfu.py                                  # bf16, fp8 blockwise, fp8 delayed
    python benchmarks/train_step_mfu.py --precisions bf16 --rows 128 --seq-len 2048 --micro-batch-size 2
    python benchmarks/train_step_mfu.py --tiny                           # CPU smoke run of the script itself

The model is Llama-3.2-1B-shaped (16 layers, hidden 2048, 32 heads / 8 KV groups, SwiGLU 8192, vocabulary
128256, tied embeddings: 1.24 B parameters), randomly initialised, trained by `MegatronTrainer` exactly as
an agent is (Transformer Engine spec, distributed optimizer, HACPO loss over vocab-parallel logits). One
RL step = `compute_mean_logprobs` over the rows, then `train_step` with M optimizer updates. Rows are
constant-length random token sequences (a `--prompt-len` prompt, the rest response), half self and half
cross rows. Reported per precision, over `--steps` timed steps after one warm-up step:

    step s        wall time of train_step (M updates: forward + backward + optimizer)
    logprob s     wall time of the no-grad log-prob pass over the same rows
    tokens/s      trained tokens (prompt + response) per second
    TFLOP/s       model FLOPs (training/flops.py: 6·N·tokens + attention) per second per GPU
    MFU           TFLOP/s over the GPU's dense BF16 peak (H200/H100 SXM: 989 TFLOP/s; --peak-tflops)
    peak GiB      torch.cuda.max_memory_allocated

A lent H200 runs the default (3 precisions × 4 steps of 64 × 1024 tokens) in about two minutes.
"""

from __future__ import annotations

import argparse
import gc
import math
import time

import torch

from nemo_hacpo.config import (
    AgentConfig,
    AlgoConfig,
    ModelSource,
    OptimizerConfig,
    ParallelConfig,
    PrecisionConfig,
    TinyModelSpec,
)

BF16_PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "B200": 2250.0, "GB200": 2500.0}
PRECISIONS = {
    "bf16": PrecisionConfig(dtype="bf16"),
    "fp8-blockwise": PrecisionConfig(dtype="bf16", fp8="e4m3", fp8_recipe="blockwise"),
    "fp8-delayed": PrecisionConfig(dtype="bf16", fp8="hybrid", fp8_recipe="delayed", first_last_layers_bf16=False),
    "fp32": PrecisionConfig(dtype="fp32"),  # the CPU smoke run
}
LLAMA_1B = TinyModelSpec(num_layers=16, hidden_size=2048, num_attention_heads=32, num_query_groups=8,
                         ffn_hidden_size=8192, tie_embeddings=True, max_position_embeddings=4096,
                         rotary_base=500000)
LLAMA_1B_VOCAB = 128256
TINY = TinyModelSpec(num_layers=2, hidden_size=128, num_attention_heads=2, ffn_hidden_size=256,
                     max_position_embeddings=256)
TINY_VOCAB = 300


def peak_tflops(override: float | None) -> float | None:
    if override is not None:
        return override
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((peak for key, peak in BF16_PEAK_TFLOPS.items() if key in name), None)


def make_rows(num_rows: int, seq_len: int, prompt_len: int, vocab: int, mean_logprob: torch.Tensor | None = None):
    """Seeded rows, half own and half cross; m_old = `mean_logprob` (+ a small offset on cross rows)."""
    from nemo_hacpo.algo.rows import TrainingRows

    generator = torch.Generator().manual_seed(0)
    token_ids = torch.randint(1, vocab, (num_rows, seq_len), generator=generator).tolist()
    response_mask = [[0] * prompt_len + [1] * (seq_len - prompt_len)] * num_rows
    is_cross = torch.arange(num_rows) >= num_rows // 2
    old_mean = mean_logprob if mean_logprob is not None else torch.zeros(num_rows)
    old_mean = old_mean + torch.where(is_cross, 0.05 * torch.randn(num_rows, generator=generator), 0.0)
    return TrainingRows(token_ids=token_ids, response_mask=response_mask,
                        advantages=torch.randn(num_rows, generator=generator), cross_objective=is_cross,
                        omega=torch.where(is_cross, 1.5, 1.0), old_mean_logprob=old_mean, is_own=~is_cross,
                        source=is_cross.long())


def bench(label: str, args: argparse.Namespace, peak: float | None) -> dict:
    from nemo_hacpo.models.architecture import model_arch
    from nemo_hacpo.training import MegatronTrainer
    from nemo_hacpo.training.objective import Objective

    spec, vocab = (TINY, TINY_VOCAB) if args.tiny else (LLAMA_1B, LLAMA_1B_VOCAB)
    agent = AgentConfig(name=f"bench_{label}", model=ModelSource(tiny=spec),
                        parallel=ParallelConfig(micro_batch_size=args.micro_batch_size),
                        optimizer=OptimizerConfig(lr=1e-6, use_distributed_optimizer=True), precision=PRECISIONS[label])
    arch = model_arch(agent, tokenizer_vocab=vocab)
    trainer = MegatronTrainer(agent, arch, seed=0)
    objective = Objective.of(AlgoConfig(updates_per_step=args.updates, kl_coef=0.0))
    try:
        parameters = sum(p.numel() for p in trainer.module.parameters())
        rows = make_rows(args.rows, args.seq_len, args.prompt_len, vocab)
        step_times, logprob_times, metrics = [], [], {}
        for step in range(args.steps + 1):  # step 0 = warm-up (allocations, kernel selection)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
            mean_logprob = trainer.compute_mean_logprobs(rows.token_ids, rows.response_mask)
            logprob_time = time.perf_counter() - start
            rows = rows.replace(old_mean_logprob=make_rows(
                args.rows, args.seq_len, args.prompt_len, vocab, mean_logprob).old_mean_logprob)
            metrics = trainer.train_step(rows, objective, step)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            if step > 0:
                step_times.append(metrics.step_time_s)
                logprob_times.append(logprob_time)
        step_time = sum(step_times) / len(step_times)
        tokens = args.rows * args.seq_len
        from nemo_hacpo.training.flops import batch_flops

        tflops = batch_flops(arch, [args.seq_len] * args.rows, backward=True) / step_time / 1e12
        return {"precision": label, "params (M)": parameters / 1e6, "step s": step_time,
                "logprob s": sum(logprob_times) / len(logprob_times), "tokens/s": tokens / step_time,
                "TFLOP/s": tflops, "MFU %": 100 * tflops / peak if peak else math.nan,
                "peak GiB": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else math.nan,
                "loss": metrics.loss, "grad norm": metrics.grad_norm}
    finally:
        trainer.close()
        del trainer
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


def print_table(results: list[dict]) -> None:
    columns = list(results[0])
    widths = {c: max(len(c), *(len(_fmt(r[c])) for r in results)) for c in columns}
    print("  ".join(c.rjust(widths[c]) for c in columns))
    for result in results:
        print("  ".join(_fmt(result[c]).rjust(widths[c]) for c in columns))


def _fmt(value) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precisions", nargs="+", default=None, choices=sorted(PRECISIONS))
    parser.add_argument("--rows", type=int, default=64, help="sequences per RL step")
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence (prompt + response)")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--updates", type=int, default=4, help="optimizer updates per step (M)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense BF16 peak per GPU (MFU denominator)")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: a 0.2M-parameter model, fp32")
    args = parser.parse_args()
    if args.tiny:
        args.rows, args.seq_len, args.prompt_len = min(args.rows, 8), min(args.seq_len, 64), min(args.prompt_len, 16)
    precisions = args.precisions or (["fp32"] if args.tiny else ["bf16", "fp8-blockwise", "fp8-delayed"])
    if not torch.cuda.is_available() and any(p != "fp32" for p in precisions):
        parser.error("bf16/fp8 need CUDA; on CPU run --tiny (fp32)")

    from nemo_hacpo.training import destroy_distributed, init_distributed
    from nemo_hacpo.training.distributed import default_backend

    port = 29000 + int(time.time()) % 1000
    init_distributed(0, 1, "127.0.0.1", port, backend=default_backend())
    try:
        peak = peak_tflops(args.peak_tflops)
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
        print(f"# {device}; {args.rows} rows × {args.seq_len} tokens, micro-batch {args.micro_batch_size}, "
              f"M = {args.updates} updates per step, {args.steps} timed steps; peak {peak or '?'} TFLOP/s (BF16)")
        results = []
        for label in precisions:
            try:
                results.append(bench(label, args, peak))
            except Exception as error:  # one unsupported recipe must not hide the other rows
                print(f"# {label}: failed: {type(error).__name__}: {error}")
        if results:
            print_table(results)
    finally:
        destroy_distributed()


if __name__ == "__main__":
    main()

"""GPU memory, step time and MFU of the trainer against `--plan`'s terms — on any CUDA machine with torch and
megatron-core (Transformer Engine and vLLM optional), in one command.

    python benchmarks/gpu_memory.py                          # every shape of SHAPES; JSON to outputs/gpu_memory.json
    python benchmarks/gpu_memory.py --shapes llama_1b --steps 3
    python benchmarks/gpu_memory.py --dry-run                # the script's own logic on CPU (gloo, a tiny shape)

Per shape and attention (`--attention`: Megatron's unfused local attention, torch SDPA — what a GPU without Transformer
Engine runs —, and Transformer Engine's spec where it is installed) it builds `MegatronTrainer` (bf16, the
distributed optimizer, an NCCL world of one), runs a log-prob pass and steps of 2 updates, a train-state offload
round trip twice (the second into the kept arena), and prints per shape and attention

    state         allocated after a step: weights + gradients + optimizer      | the plan's P·(2 + 4 + 12)
    transient     the peak above that                                          | activations + logits (+ the s²
                                                                                  scores with the local attention)
    outside       GPU memory outside torch's allocator after each phase         | TRAINER_PROCESS_GIB
    step s, TFLOP/s, MFU (of the GPU's dense bf16 peak), offload / restore GB/s, first and second offload

and, for a one-layer model with Qwen3's vocabulary, the logits path's bytes per (token × vocabulary) element
(LOGITS_BYTES_PER_ELEMENT). MEASURED holds what the first H200 run printed (torch 2.11 + CUDA 13, megatron-core
0.16.1, no Transformer Engine): the constants of `nemo_hacpo/planning/gpu_memory.py` cite it, and
tests/unit/planning/test_gpu_memory.py checks the plan against it. Run it inside the container (with Transformer
Engine) to calibrate the fused path.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nemo_hacpo.config import TinyModelSpec  # noqa: E402

GIB = 1024**3
QWEN3_8B_8L = TinyModelSpec(num_layers=8, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                            ffn_hidden_size=12288, qk_layernorm=True, tie_embeddings=False,
                            max_position_embeddings=8192, rotary_base=1000000)
LLAMA_1B = TinyModelSpec(num_layers=16, hidden_size=2048, num_attention_heads=32, num_query_groups=8,
                         ffn_hidden_size=8192, tie_embeddings=True, max_position_embeddings=4096, rotary_base=500000)
SMALL = TinyModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=8, num_query_groups=2, ffn_hidden_size=2816,
                      max_position_embeddings=1024)
LOGITS_1L = TinyModelSpec(num_layers=1, hidden_size=1024, num_attention_heads=8, num_query_groups=8,
                          ffn_hidden_size=1024, tie_embeddings=False, max_position_embeddings=4096)
TINY = TinyModelSpec(num_layers=2, hidden_size=128, num_attention_heads=2, ffn_hidden_size=256,
                     max_position_embeddings=256)

SHAPES: dict[str, tuple[TinyModelSpec, int, int, int, int]] = {
    # name: (spec, vocabulary, rows, tokens per row, micro-batch)
    "small_4l": (SMALL, 32000, 16, 512, 4),
    "llama_1b": (LLAMA_1B, 128256, 32, 2048, 2),
    "qwen3_8b_8l": (QWEN3_8B_8L, 151936, 8, 4096, 1),
    "logits_qwen_vocab": (LOGITS_1L, 151936, 4, 2048, 2),
}
"""The shapes of the first H200 run: Llama-3.2-1B's, 8 of Qwen3-8B's 36 layers, a one-layer model whose logits
dominate."""

MEASURED = {
    "device": "NVIDIA H200 (143,771 MiB), driver 580.159.04, torch 2.11.0+cu130, megatron-core 0.16.1, no TE",
    "outside_allocator_gib": {"context": 0.51, "first tensor": 0.60, "trainer built": 1.15, "first forward": 1.60,
                              "after first optimizer step": 2.42},
    "llama_1b": {"state_gib": None, "transient_gib": 33.6, "tflops": 130.0},
    "qwen3_8b_8l": {"state_gib": 47.74, "planned_state_gib": 46.74, "transient_gib": 35.7, "tflops": 181.0},
    "logits_bytes_per_element": 6.4,
    "pin_gbps": 2.2, "first_offload_s": 21.9, "second_offload_s": 0.62, "offload_gib": 41.5,
    "bf16_matmul_tflops": 790.0,
}
"""What the first H200 run measured (issue #38)."""

BF16_PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "B200": 2250.0}


def outside_allocator_gib(dry_run: bool) -> float:
    """GPU memory in use that torch's caching allocator does not hold (context, kernels, NCCL buffers)."""
    if dry_run:
        return 0.0
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return (total - free - torch.cuda.memory_reserved()) / GIB


def plan_terms(arch, seq: int, micro_batch: int, fused: bool) -> dict[str, float]:
    from nemo_hacpo.planning import gpu_memory as gm

    stage = sum(gm.stage_tensors(arch, 1, 1))
    activations = gm.activation_gib(arch, seq, micro_batch, 1, False, 2, fused_attention=fused)
    logits = gm.logits_gib(arch, seq, micro_batch, 1)
    return {"state_gib": stage * 18 / GIB, "activations_gib": activations, "logits_gib": logits,
            "transient_gib": activations + logits}


def measure_shape(name: str, spec: TinyModelSpec, vocab: int, rows_n: int, seq: int, micro_batch: int, steps: int,
                  dry_run: bool, peak_tflops: float | None, attention: str) -> dict:
    from benchmarks.train_step_mfu import make_rows
    from nemo_hacpo.config import (
        AgentConfig,
        AlgoConfig,
        ModelSource,
        OptimizerConfig,
        ParallelConfig,
        PrecisionConfig,
    )
    from nemo_hacpo.models.architecture import model_arch
    from nemo_hacpo.training import MegatronTrainer
    from nemo_hacpo.training.flops import batch_flops
    from nemo_hacpo.training.memory import TrainStateOffload
    from nemo_hacpo.training.objective import Objective

    agent = AgentConfig(name=name, model=ModelSource(tiny=spec), parallel=ParallelConfig(micro_batch_size=micro_batch),
                        optimizer=OptimizerConfig(lr=1e-6, clip_grad=1.0, use_distributed_optimizer=True),
                        precision=PrecisionConfig(dtype="fp32" if dry_run else "bf16"))
    arch = model_arch(agent, tokenizer_vocab=vocab)
    out: dict = {"params_M": None, "outside_gib": {}}
    cuda = torch.cuda
    cuda.reset_peak_memory_stats()
    base = cuda.memory_allocated()
    trainer = MegatronTrainer(agent, arch, seed=0, use_te=attention == "te", attention="auto" if attention == "te"
                              else attention)
    try:
        out["attention"] = trainer.attention
        out["params_M"] = sum(p.numel() for p in trainer.module.parameters()) / 1e6
        out["outside_gib"]["trainer built"] = outside_allocator_gib(dry_run)
        rows = make_rows(rows_n, seq, seq // 8, vocab)
        objective = Objective.of(AlgoConfig(updates_per_step=2, kl_coef=0.0))
        times = []
        for step in range(steps + 1):
            start = time.perf_counter()
            mean = trainer.compute_mean_logprobs(rows.token_ids, rows.response_mask)
            if step == 0:
                out["outside_gib"]["first forward"] = outside_allocator_gib(dry_run)
                out["logprob_peak_gib"] = (cuda.max_memory_allocated() - base) / GIB
            rows = rows.replace(old_mean_logprob=mean.float())
            metrics = trainer.train_step(rows, objective, step)
            if step == 0:
                out["outside_gib"]["first optimizer step"] = outside_allocator_gib(dry_run)
                out["first_step_finite"] = math.isfinite(metrics.loss) and math.isfinite(metrics.grad_norm)
            else:
                times.append(time.perf_counter() - start)
        out["state_gib"] = (cuda.memory_allocated() - base) / GIB
        out["transient_gib"] = (cuda.max_memory_allocated() - base) / GIB - out["state_gib"]
        step_s = sum(times) / len(times)
        flops = batch_flops(arch, [seq] * rows_n, backward=True) + batch_flops(arch, [seq] * rows_n, backward=False)
        out.update(step_s=step_s, tflops=flops / step_s / 1e12)
        out["mfu"] = out["tflops"] / peak_tflops if peak_tflops else math.nan
        out["logits_bytes_per_element"] = out["logprob_peak_gib"] * GIB / (micro_batch * seq * arch.padded_vocab_size(1))
        offload = TrainStateOffload(trainer.optimizer, [trainer.model])
        for attempt in ("first", "second"):  # the second copies into the arena the first pinned
            start = time.perf_counter()
            moved = offload.offload()
            cuda.synchronize()
            out[f"{attempt}_offload_s"] = time.perf_counter() - start
            start = time.perf_counter()
            offload.restore()
            cuda.synchronize()
            out[f"{attempt}_restore_s"] = time.perf_counter() - start
            out["offload_gib"] = moved / GIB
        out["plan"] = plan_terms(arch, seq, micro_batch, fused=trainer.attention != "local")
    finally:
        trainer.close()
        del trainer
        gc.collect()
        if not dry_run:
            cuda.empty_cache()
    return out


def _fake_cuda() -> None:
    """The dry run's stand-ins for the CUDA memory calls (CPU torch has no allocator statistics)."""
    for name, value in {"reset_peak_memory_stats": None, "memory_allocated": 0, "max_memory_allocated": 0,
                        "synchronize": None, "empty_cache": None}.items():
        setattr(torch.cuda, name, lambda *a, _v=value, **k: _v)


def table(results: dict) -> str:
    lines = ["| shape, attention | params | kernel | state GiB (plan) | transient GiB (plan) | outside GiB after step | "
             "step s | TFLOP/s | MFU | logits B/elem | offload 1st / 2nd s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error'][:80]} |")
            continue
        plan = r["plan"]
        lines.append(
            f"| {name} | {r['params_M']:.0f}M | {r['attention']} | "
            f"{r['state_gib']:.2f} ({plan['state_gib']:.2f}) | {r['transient_gib']:.2f} ({plan['transient_gib']:.2f}) | "
            f"{r['outside_gib'].get('first optimizer step', math.nan):.2f} | {r['step_s']:.3f} | {r['tflops']:.0f} | "
            f"{r['mfu']:.1%} | {r['logits_bytes_per_element']:.2f} | {r['first_offload_s']:.2f} / "
            f"{r['second_offload_s']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {list(SHAPES)}")
    parser.add_argument("--steps", type=int, default=2, help="timed steps after the first")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak (default: by name)")
    parser.add_argument("--attention", default="local,sdpa,te",
                        help="comma-separated of local (Megatron's unfused), sdpa, te (skipped without Transformer "
                             "Engine)")
    parser.add_argument("--dry-run", action="store_true", help="CPU, gloo, a tiny shape: the script's own logic")
    parser.add_argument("--out", type=Path, default=Path("outputs/gpu_memory.json"))
    args = parser.parse_args(argv)
    from nemo_hacpo.training import destroy_distributed, init_distributed

    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU machine, or --dry-run for the script's own logic on CPU")
    shapes = {"tiny": (TINY, 300, 8, 64, 2)} if args.dry_run else {
        name: SHAPES[name] for name in args.shapes.split(",")}
    if args.dry_run:
        _fake_cuda()
        peak = None
    else:
        device = torch.cuda.get_device_name()
        peak = args.peak_tflops or next((v for k, v in BF16_PEAK_TFLOPS.items() if k in device), None)
    results: dict = {"outside_gib": {}}
    if not args.dry_run:
        torch.zeros(1, device="cuda")
        results["outside_gib"]["first tensor"] = outside_allocator_gib(False)
    init_distributed(0, 1, "127.0.0.1", 29517)
    per_shape: dict = {}
    try:
        from nemo_hacpo.models.architecture import transformer_engine_available

        kinds = [k for k in args.attention.split(",") if k != "te" or transformer_engine_available()]
        for name, (spec, vocab, rows, seq, micro_batch) in shapes.items():
            for kind in kinds:
                label = f"{name}, {kind}"
                print(f"[gpu_memory] {label}: {rows} rows × {seq} tokens, micro-batch {micro_batch}", flush=True)
                try:
                    per_shape[label] = measure_shape(name, spec, vocab, rows, seq, micro_batch, args.steps,
                                                     args.dry_run, peak, kind)
                except Exception as err:  # noqa: BLE001 — a shape out of memory must not hide the others
                    per_shape[label] = {"error": f"{type(err).__name__}: {err}"}
    finally:
        destroy_distributed()
    results["shapes"] = per_shape
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    print(table(per_shape))
    print(f"(H200 reference: {json.dumps(MEASURED)})")
    return 0 if all("error" not in r for r in per_shape.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())

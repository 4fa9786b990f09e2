"""Refit cost per transport: seconds, MB moved and peak extra host memory of one refit into a running vLLM engine.

    python benchmarks/refit_cost.py                  # the three tiny agents and a ≈1B-parameter random Llama (CPU)
    python benchmarks/refit_cost.py --quick          # the tiny agents only (≈ 2 min)

For each model: a random HF checkpoint of its architecture (the agent's tokenizer) is written, a vLLM engine starts
from it, then each transport refits the engine with a second set of random weights, streamed one tensor at a time
the way the trainer's export yields them (`rollout.refit`):

- `rpc 256 MiB` — the refit as it was before the strategy object (safetensors chunks cut after 256 MiB);
- `rpc` — the fallback transport with `--bucket-mb` chunks;
- `ipc` — staged buckets of ≤ `--bucket-mb` (shared memory on CPU, CUDA IPC on GPUs), over a gloo world of one;
- `(stream only)` — no engine: generating the random tensors alone, which every transport's time includes.

Peak memory: the resident set (RSS, shared pages included) of this process (the sender) and of the engine's
processes, sampled every 5 ms during the refit, minus its value just before. MB sent: serialized bytes for rpc
(tensors + safetensors headers), tensor bytes for ipc. Exactness: vLLM's log-probs of fixed
sequences after each refit; every transport must give the same numbers (max |Δ| is printed; the trainer-vs-engine
exactness of the refit is tests/integration/runtime/test_refit_equivalence.py and tests/integration/rollout/
test_staged_refit.py, ≈ 2e-7 in fp32). The table goes to stdout and, with --out, to a markdown file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TRANSPORTS = ("rpc 256 MiB", "rpc", "ipc")
STREAM_ONLY = "(stream only)"
"""A row without an engine: the time to generate the random tensors the transports send (the stand-in for the
trainer's export, included in every transport's time)."""
LLAMA_1B = {"num_layers": 22, "hidden_size": 2048, "num_attention_heads": 32, "num_query_groups": 8,
            "ffn_hidden_size": 5632, "max_position_embeddings": 512}
"""≈ 0.99B parameters in its layers (22 × 45.1M) plus the embedding and output matrices of the tokenizer's
vocabulary; head_dim 64 (vLLM's CPU attention kernels)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the tiny agents only")
    parser.add_argument("--bucket-mb", type=int, default=512, help="rollout.refit_bucket_mb of rpc and ipc")
    parser.add_argument("--repeats", type=int, default=2, help="refits per transport (the table shows the best)")
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    return parser.parse_args(argv)


def models(quick: bool) -> list[tuple[str, object]]:
    """(label, AgentConfig) of the models to measure."""
    from nemo_hacpo.config import load_config

    agents = {a.name: a for name in ("pair_tiny_gpt", "trio_tiny") for a in load_config(name).agents}
    chosen = [(name, agents[name]) for name in ("llama_tiny", "gpt_tiny", "qwen_tiny") if name in agents]
    if not quick:
        base = agents["llama_tiny"]
        spec = dataclasses.replace(base.model.tiny, **LLAMA_1B)
        big = dataclasses.replace(base, name="llama_1b", model=dataclasses.replace(base.model, tiny=spec),
                                  rollout=dataclasses.replace(base.rollout, cpu_kvcache_gib=1))
        chosen.append(("llama_1b", big))
    return chosen


def random_weights(arch, seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-layout random tensors in export order, one at a time (fp32, std 0.02; norms ≈ 1)."""
    from nemo_hacpo.models.hf_layouts import hf_tensor_shapes

    generator = torch.Generator().manual_seed(seed)
    for name, shape in hf_tensor_shapes(arch).items():
        tensor = torch.randn(shape, generator=generator) * 0.02
        if "norm" in name or name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            tensor += 1.0
        yield name, tensor


def write_checkpoint(arch, tokenizer, directory: Path, seed: int) -> Path:
    from safetensors.torch import save_file

    from nemo_hacpo.models.hf_layouts import hf_config

    directory.mkdir(parents=True, exist_ok=True)
    hf_config(arch, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
              pad_token_id=tokenizer.pad_token_id).save_pretrained(directory)
    shard, size, index, n = {}, 0, {}, 0
    for name, tensor in random_weights(arch, seed):
        shard[name] = tensor
        size += tensor.numel() * 4
        if size >= 1 << 30:
            n += 1
            save_file(shard, directory / f"model-{n:05d}.safetensors", metadata={"format": "pt"})
            index.update(dict.fromkeys(shard, f"model-{n:05d}.safetensors"))
            shard, size = {}, 0
    n += 1
    save_file(shard, directory / f"model-{n:05d}.safetensors", metadata={"format": "pt"})
    index.update(dict.fromkeys(shard, f"model-{n:05d}.safetensors"))
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    tokenizer.save_pretrained(directory)
    return directory


class PeakRss:
    """Peak RSS increase of this process and of its children (the engine), sampled in a thread."""

    def __init__(self, interval_s: float = 0.005):
        import psutil

        self.me, self.interval_s = psutil.Process(), interval_s
        self.base = self._sample()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> tuple[int, int]:
        import psutil

        children = 0
        for child in self.me.children(recursive=True):
            try:
                children += child.memory_info().rss
            except psutil.Error:
                pass
        return self.me.memory_info().rss, children

    def _run(self) -> None:
        while not self._stop.is_set():
            me, children = self._sample()
            self.peak = (max(self.peak[0], me), max(self.peak[1], children))
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def extra_mb(self) -> tuple[float, float]:
        return (self.peak[0] - self.base[0]) / 1e6, (self.peak[1] - self.base[1]) / 1e6


def refit_once(transport: str, engine, arch, bucket_mb: int, seed: int):
    from nemo_hacpo.rollout.refit import MIB, StagedRefit

    weights = random_weights(arch, seed)
    if transport == "ipc":
        return StagedRefit(rank=0, world=1, engine_tp=1, device="cpu", bound=bucket_mb * MIB,
                           tag="bench").refit(weights, engine)
    chunk = 256 * MIB if transport == "rpc 256 MiB" else bucket_mb * MIB
    return engine.refit(weights, chunk_bytes=chunk)


def measure(label: str, agent, args: argparse.Namespace, work: Path) -> list[dict]:
    from nemo_hacpo.models.architecture import model_arch
    from nemo_hacpo.models.tokenizers import load_tokenizer
    from nemo_hacpo.planning.plan import total_parameters
    from nemo_hacpo.rollout import RolloutEngine

    tokenizer = load_tokenizer(agent.tokenizer.source)
    arch = model_arch(agent, len(tokenizer))
    print(f"[{label}] writing a random checkpoint …", file=sys.stderr, flush=True)
    checkpoint = write_checkpoint(arch, tokenizer, work / label, seed=1)
    params = total_parameters(arch)
    engine = RolloutEngine.from_agent(agent, checkpoint, device="cpu", default_seed=0)
    sequences = [[tokenizer.bos_token_id or 1] + list(range(5, 45)), [tokenizer.bos_token_id or 1] + list(range(60, 90))]
    rows, scores = [], {}
    with PeakRss() as rss:
        start = time.perf_counter()
        size = sum(t.numel() * t.element_size() for _, t in random_weights(arch, seed=2))
        seconds = time.perf_counter() - start
    rows.append({"model": label, "params": params, "transport": STREAM_ONLY, "seconds": seconds, "mb": size / 1e6,
                 "sender_mb": rss.extra_mb[0], "engine_mb": rss.extra_mb[1]})
    try:
        for transport in TRANSPORTS:
            best = None
            for _ in range(args.repeats):
                refit_once(transport, engine, arch, args.bucket_mb, seed=1)  # back to the checkpoint's weights
                with PeakRss() as rss:
                    start = time.perf_counter()
                    stats = refit_once(transport, engine, arch, args.bucket_mb, seed=2)
                    seconds = time.perf_counter() - start
                sender, receiver = rss.extra_mb
                if best is None or seconds < best["seconds"]:
                    best = {"model": label, "params": params, "transport": transport, "seconds": seconds,
                            "mb": stats.bytes / 1e6, "sender_mb": sender, "engine_mb": receiver}
            scores[transport] = engine.score(sequences)
            rows.append(best)
            print(f"[{label}] {transport}: {best['seconds']:.2f} s", file=sys.stderr, flush=True)
    finally:
        engine.shutdown()
        shutil.rmtree(checkpoint, ignore_errors=True)
    reference = scores[TRANSPORTS[0]]
    for row in rows[1:]:
        row["max_abs_vs_first"] = max(abs(a - b) for ra, rb in zip(scores[row["transport"]], reference, strict=True)
                                      for a, b in zip(ra, rb, strict=True))
    return rows


def format_table(rows: list[dict], bucket_mb: int) -> str:
    lines = [f"| model | params | transport (bucket {bucket_mb} MiB) | refit s | MB sent | sender peak +MB | "
             "engine peak +MB | max abs log-prob vs first |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        size = f"{r['params'] / 1e9:.2f}B" if r["params"] >= 1e9 else f"{r['params'] / 1e6:.1f}M"
        exact = f"{r['max_abs_vs_first']:.1e}" if "max_abs_vs_first" in r else "—"
        lines.append(f"| {r['model']} | {size} | {r['transport']} | {r['seconds']:.2f} | {r['mb']:.1f} | "
                     f"{r['sender_mb']:.0f} | {r['engine_mb']:.0f} | {exact} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # keep the console to our lines and the table
    _init_gloo()  # the ipc strategy's process group (a world of one)
    work = Path(tempfile.mkdtemp(prefix="refit_cost_"))
    rows: list[dict] = []
    try:
        for label, agent in models(args.quick):
            rows += measure(label, agent, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        torch.distributed.destroy_process_group()
    table = format_table(rows, args.bucket_mb)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(f"`python benchmarks/refit_cost.py {' '.join(argv or sys.argv[1:])}`\n\n{table}\n")
    return 0


def _init_gloo() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


if __name__ == "__main__":
    sys.exit(main())

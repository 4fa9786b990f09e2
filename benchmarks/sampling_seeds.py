"""What per-request seeds cost vLLM's sampler: the same generation with every request seeded and without.

    python benchmarks/sampling_seeds.py                          # pair_tiny's llama_tiny, 64 prompts × 4, 3 repeats
    python benchmarks/sampling_seeds.py --prompts 128 --samples 8 --repeats 5 --json /tmp/seeds.json

vLLM draws the exponential noise of every request that carries its own generator in a Python loop, once per decode
step (`vllm/v1/sample/ops/topk_topp_sampler.py`: `for i, generator in generators.items(): q[i].exponential_(…)`);
unseeded requests share one batched draw. `rollout.seeded_requests` decides which an engine does (true: bit-exact
runs whatever the schedule, the CPU configs' choice; false: pair_large's). Both settings generate the same
B × G responses of up to `max_response_length` tokens at temperature 1 from the agent's warm start, alternating,
`--repeats` times, every sequence decoding exactly max_response_length tokens (EOS ignored, so both do the same
work); reported: seconds per call, tokens per second, and the difference per decode step and per seeded sequence —
the loop's cost. The GPU figure in issue #40 (~1–3 ms per decode step at 256 seeded sequences per
engine) is that loop on a GPU, where the model's own step is far shorter than here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def measure(config: str, agent_name: str, prompts: int, samples: int, repeats: int) -> dict:
    from nemo_hacpo.config import load_config
    from nemo_hacpo.data import problem_to_messages
    from nemo_hacpo.data.splits import load_split
    from nemo_hacpo.rollout import RolloutEngine
    from nemo_hacpo.runtime.warmstart import warm_start_dir

    cfg = load_config(config)
    agent = cfg.agent(agent_name)
    warm = warm_start_dir(agent, cfg)
    if not (warm / "config.json").is_file():
        raise SystemExit(f"no warm start of {agent_name} at {warm}: run `python recipes/warmstart.py --config-name "
                         f"{config}` first")
    messages = [problem_to_messages(p) for p in load_split(cfg.data.train, "train")[:prompts]]
    engines = {}
    results: dict = {"prompts": prompts, "samples": samples, "max_tokens": agent.max_response_length, "runs": {}}
    try:
        for seeded in (True, False):
            variant = dataclasses.replace(agent, rollout=dataclasses.replace(agent.rollout, seeded_requests=seeded))
            engines[seeded] = RolloutEngine.from_agent(variant, warm, default_seed=0)
            engines[seeded].generate(messages[:8], samples)  # warm-up
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        steps = agent.max_response_length
        for _ in range(repeats):
            for seeded, engine in engines.items():
                # every sequence decodes exactly `steps` tokens (EOS ignored): the two settings do the same work,
                # and the only difference left is how the sampler draws its noise
                params = [SamplingParams(n=samples, max_tokens=steps, min_tokens=steps, ignore_eos=True,
                                         temperature=1.0, seed=1000 + b * samples if seeded else None,
                                         detokenize=False) for b in range(len(messages))]
                batch = [TokensPrompt(prompt_token_ids=engine.render(m)) for m in messages]
                start = time.perf_counter()
                outputs = engine.llm.generate(batch, params, use_tqdm=False)
                seconds = time.perf_counter() - start
                tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
                results["runs"].setdefault("seeded" if seeded else "unseeded", []).append(
                    {"seconds": seconds, "tokens": tokens, "decode_steps": steps})
    finally:
        for engine in engines.values():
            engine.shutdown()
    return results


def summary(results: dict) -> list[dict]:
    rows = []
    for name, runs in results["runs"].items():
        rows.append({"requests": name, "seconds": statistics.median(r["seconds"] for r in runs),
                     "tokens_per_s": statistics.median(r["tokens"] / r["seconds"] for r in runs),
                     "decode_steps": statistics.median(r["decode_steps"] for r in runs)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-name", default="pair_tiny")
    parser.add_argument("--agent", default="llama_tiny")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = measure(args.config_name, args.agent, args.prompts, args.samples, args.repeats)
    rows = summary(results)
    sequences = args.prompts * args.samples
    print(f"{sequences} sequences ({args.prompts} prompts × {args.samples}), up to {results['max_tokens']} tokens, "
          f"median of {args.repeats}")
    print("| requests | seconds per call | tokens/s | decode steps |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['requests']} | {row['seconds']:.2f} | {row['tokens_per_s']:.0f} | {row['decode_steps']:.0f} |")
    seeded, unseeded = (next(r for r in rows if r["requests"] == k) for k in ("seeded", "unseeded"))
    per_step = (seeded["seconds"] - unseeded["seconds"]) / seeded["decode_steps"]
    print(f"seeded − unseeded: {per_step * 1e3:+.2f} ms per decode step, {per_step / sequences * 1e6:+.1f} µs per "
          "seeded sequence and step")
    if args.json:
        args.json.write_text(json.dumps({**results, "summary": rows, "per_step_s": per_step}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The rollout engine on CUDA vLLM: colocated sleep/wake, the staged refit over CUDA IPC (`rollout.refit`, the
`ipc` transport, in buckets smaller than the model so several are sent), then the `rpc` fallback. Skipped
without CUDA (tests/gpu/conftest.py marks every test here `gpu`). The same strategy runs on CPU, with shared
memory in place of CUDA IPC, in tests/integration/rollout/test_staged_refit.py. Prints generation tokens/s,
sleep/wake and refit times.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from nemo_hacpo.config import load_config
from nemo_hacpo.data.arithmetic import generate_problems
from nemo_hacpo.data.prompts import problem_to_messages
from nemo_hacpo.models.tokenizers import load_tokenizer
from tests.helpers import hf_models as tiny

pytestmark = [pytest.mark.gpu, pytest.mark.integration, pytest.mark.needs("vllm")]


MATCH_TOLERANCE = 1e-3


def _mean_abs(a: list[list[float]], b: list[list[float]]) -> float:
    flat = lambda rows: torch.tensor([v for row in rows for v in row], dtype=torch.float64)  # noqa: E731
    return float((flat(a) - flat(b)).abs().mean())


def _agent(colocated: bool):
    agent = load_config("pair_tiny_gpt").agent("llama_tiny")
    rollout = dataclasses.replace(agent.rollout, colocated=colocated, gpu_memory_utilization=0.3,
                                  enforce_eager=False,  # CUDA graphs: the production path the refit must keep valid
                                  refit_transport="ipc" if colocated else "rpc")
    return dataclasses.replace(agent, rollout=rollout)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    agent = _agent(colocated=True)
    tokenizer = load_tokenizer(agent.tokenizer.source)
    model = tiny.hf_model_from_spec(agent.model.tiny, tokenizer, seed=0)
    return tiny.save_checkpoint(model, tokenizer, tmp_path_factory.mktemp("llama_tiny")), model, tokenizer


def test_colocated_sleep_wake_and_ipc_refit(checkpoint):
    from nemo_hacpo.rollout import RolloutEngine

    directory, model, tokenizer = checkpoint
    model = model.cuda()
    agent = _agent(colocated=True)
    engine = RolloutEngine.from_agent(agent, directory, device="cuda")
    try:
        prompts = [problem_to_messages(p) for p in generate_problems("train", 16, seed=0)]
        engine.generate(prompts, n=8, max_tokens=agent.max_response_length)  # warm-up
        result = engine.generate(prompts, n=8, max_tokens=agent.max_response_length)
        print(f"\nGPU generate: {result.stats['num_generated_tokens']:.0f} tokens, "
              f"{result.stats['tokens_per_s']:.0f} tokens/s; engine start {engine.stats['startup_s']:.1f} s")

        answer = tokenizer("So the answer is \\boxed{12}.", add_special_tokens=False)["input_ids"]
        sequences = [engine.render(p) + answer + [tokenizer.eos_token_id] for p in prompts[:4]]
        before = engine.score(sequences)
        assert _mean_abs(before, tiny.hf_logprobs(model, sequences)) < MATCH_TOLERANCE

        free_awake = torch.cuda.mem_get_info()[0]
        start = time.perf_counter()
        engine.sleep(level=1)
        slept = time.perf_counter() - start
        assert torch.cuda.mem_get_info()[0] > free_awake, "sleep should release GPU memory"
        with pytest.raises(RuntimeError, match="asleep"):
            engine.generate(prompts[:1], n=1, max_tokens=4)

        tiny.sgd_step_on_nll(model, sequences, lr=1e-2)  # "training" while asleep
        from nemo_hacpo.rollout.refit import StagedRefit

        store = torch.distributed.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, wait_for_workers=False)
        torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:  # wakes the weights; buckets of ≤ 1 MiB through one reused CUDA IPC staging buffer
            strategy = StagedRefit(rank=0, world=1, engine_tp=1, device="cuda", bound=1 << 20, tag="gpu_test")
            stats = strategy.refit(tiny.hf_weights(model), engine)
        finally:
            torch.distributed.destroy_process_group()
        assert stats.transport == "ipc" and stats.tensors == len(tiny.hf_weights(model))
        assert engine.asleep == frozenset({"kv_cache"})
        start = time.perf_counter()
        engine.wake_up()
        woke = time.perf_counter() - start
        after = engine.score(sequences)
        assert _mean_abs(after, tiny.hf_logprobs(model, sequences)) < MATCH_TOLERANCE
        assert _mean_abs(after, before) > MATCH_TOLERANCE
        print(f"sleep {slept:.2f} s, IPC refit {stats.seconds:.3f} s ({stats.bytes / 1e6:.1f} MB), "
              f"wake {woke:.2f} s")

        # the RPC transport (the CPU path) gives the same weights on GPU, and level-2 sleep survives a refit
        engine.sleep(level=2)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.mul_(1.01)
        engine.refit(tiny.hf_weights(model))
        engine.wake_up()
        assert _mean_abs(engine.score(sequences), tiny.hf_logprobs(model, sequences)) < MATCH_TOLERANCE
        generated = engine.generate(prompts[:2], n=2, max_tokens=8)
        assert all(r.num_tokens >= 1 for r in generated.flat())
    finally:
        engine.shutdown()

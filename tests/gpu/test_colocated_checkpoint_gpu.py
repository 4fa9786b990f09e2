"""The checkpoint's collective sleep → restore → save → offload → release → wake, two processes on one GPU.

Rank 0 owns a real colocated vLLM engine (sleep mode) that reserves 90 % of the GPU; rank 1 is a trainer peer on
the same GPU whose optimizer state (20 % of the GPU) waits in pinned host memory (`TrainStateOffload`). Both run
the checkpoint's order over the engine's gloo group (`EngineGroup.transition`, what `AgentRank.save` runs):

    release → barrier → engine sleeps (level 1) → exchange → restore → save → offload → release → barrier →
    engine wakes → exchange

Checked: vLLM's sleep does not trip its "Memory usage increased after sleeping" assertion (rank 1 restores only
after the exchange); rank 1's state — which cannot fit next to the awake engine — is restored on the device while
the engine sleeps; the woken engine answers exactly as before (its level-1 weight backup came back). A trainer
world of two ranks on one GPU cannot use NCCL, so the Megatron trainer is left out; its CPU twin with real
Megatron ranks is tests/integration/runtime/test_engine_transitions.py. Skipped without CUDA.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.helpers.distributed import run_distributed

pytestmark = [pytest.mark.gpu, pytest.mark.integration, pytest.mark.needs("vllm")]

ENGINE_SHARE = 0.9
STATE_SHARE = 0.2
"""Rank 1's optimizer state, as a share of the GPU: more than is free beside the awake engine."""


def checkpoint_on_one_gpu(model_dir: str, out_dir: str) -> dict:
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist

    from nemo_hacpo.config import load_config
    from nemo_hacpo.data.arithmetic import generate_problems
    from nemo_hacpo.data.prompts import problem_to_messages
    from nemo_hacpo.rollout import RolloutEngine
    from nemo_hacpo.rollout.engine_group import EngineGroup
    from nemo_hacpo.rollout.sampling import SamplingSettings
    from nemo_hacpo.training.memory import TrainStateOffload

    rank = dist.get_rank()
    torch.cuda.set_device(0)
    total = torch.cuda.mem_get_info()[1]
    group = EngineGroup.create(rank, 2, engine_tp=2, device="cuda")  # [[0, 1]]: both ranks share the GPU

    def release() -> None:
        torch.cuda.empty_cache()

    # rank 1's "optimizer state": one Adam moment of STATE_SHARE of the GPU, offloaded to pinned host memory
    weight = torch.nn.Parameter(torch.zeros(16, device="cuda"))
    adam = torch.optim.Adam([weight])
    adam.state[weight] = {"exp_avg": torch.zeros(int(STATE_SHARE * total) // 4 if rank == 1 else 16,
                                                 device="cuda")}
    offload = TrainStateOffload(SimpleNamespace(optimizer=adam), [SimpleNamespace(parameters=lambda: [weight],
                                                                                    buffers=[])])
    offload.offload()
    release()
    dist.barrier()
    engine = None
    prompts = [problem_to_messages(p) for p in generate_problems("train", 4, seed=0)]
    if rank == 0:
        agent = load_config("pair_tiny_gpt").agent("llama_tiny")
        agent = dataclasses.replace(agent, rollout=dataclasses.replace(
            agent.rollout, colocated=True, gpu_memory_utilization=ENGINE_SHARE, enforce_eager=True))
        engine = RolloutEngine.from_agent(agent, model_dir, device="cuda")
        greedy = SamplingSettings(temperature=0.0)
        before = [r.token_ids for r in engine.generate(prompts, n=1, max_tokens=16, sampling=greedy).flat()]
    dist.barrier()
    free_awake = torch.cuda.mem_get_info()[0]

    # AgentRank.save's order
    group.transition(engine, lambda e: e.sleep(level=1), release, "the engine's sleep for the checkpoint")
    free_asleep = torch.cuda.mem_get_info()[0]
    offload.restore()
    restored = offload.device_bytes()
    torch.save({"exp_avg": adam.state[weight]["exp_avg"][:1024].cpu()}, f"{out_dir}/rank{rank}.pt")
    offload.offload()
    group.transition(engine, lambda e: e.wake_up(), release, "the engine's wake-up after the checkpoint")

    out = {"free_awake": free_awake, "free_asleep": free_asleep, "restored": restored, "total": total}
    if engine is not None:
        after = [r.token_ids for r in engine.generate(prompts, n=1, max_tokens=16, sampling=greedy).flat()]
        out.update(same_answers=after == before, asleep=sorted(engine.asleep))
        engine.shutdown()
    return out


def test_checkpoint_sleep_restore_and_wake_of_two_processes_on_one_gpu(tmp_path_factory):
    from nemo_hacpo.config import load_config
    from nemo_hacpo.models.tokenizers import load_tokenizer
    from tests.helpers import hf_models as tiny

    agent = load_config("pair_tiny_gpt").agent("llama_tiny")
    tokenizer = load_tokenizer(agent.tokenizer.source)
    model = tiny.hf_model_from_spec(agent.model.tiny, tokenizer, seed=0)
    model_dir = tiny.save_checkpoint(model, tokenizer, tmp_path_factory.mktemp("llama_tiny"))
    out_dir = tmp_path_factory.mktemp("checkpoint")
    engine_rank, peer = run_distributed(checkpoint_on_one_gpu, 2, str(model_dir), str(out_dir), timeout_s=900)
    state = int(STATE_SHARE * engine_rank["total"]) // 4 * 4
    assert peer["free_awake"] < state < peer["free_asleep"]  # it fits only while the engine sleeps
    assert peer["restored"] == state  # and it was restored then
    assert engine_rank["same_answers"] and engine_rank["asleep"] == []
    assert (out_dir / "rank0.pt").is_file() and (out_dir / "rank1.pt").is_file()

"""The warm start's SFT runs in chunks (so the driver can print progress); chunks must give exactly the
batches and updates of one long call, the NLL it reports is the batch's NLL before the update (checked against
an independent no-grad pass), and the NLL must fall."""

from __future__ import annotations

import pytest

from tests.helpers.distributed import free_port, run_distributed

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def sft_losses(chunks: list[int], run_dir: str, port: int) -> tuple[list[float], float]:
    import random

    import torch.distributed as dist

    from nemo_hacpo.config import load_config
    from nemo_hacpo.data import problem_to_messages
    from nemo_hacpo.data.arithmetic import generate_problems
    from nemo_hacpo.runtime.worker import AgentRank

    dist.destroy_process_group()  # the rank joins its agent's own world in setup()
    cfg = load_config("pair_tiny_gpt", ["warmstart.enabled=false", "agents.1.optimizer.lr=1e-3"])
    problems = generate_problems("train", 24, seed=0)
    prompts = [problem_to_messages(p) for p in problems]
    solutions = [p.solution for p in problems]
    rank = AgentRank(cfg.agents[1], 0, seed=5, run_dir=run_dir, total_updates=sum(chunks), keep_reference=False)
    rank.setup("127.0.0.1", port, start_engine=False)
    assert rank.sft(prompts, solutions, 0, 4, 11, 0) == []  # encodes only
    batch0 = [rank._sft_rows[i] for i in random.Random(11).sample(range(len(problems)), 4)]  # step 0's batch
    means = rank.trainer.compute_mean_logprobs([ids for ids, _ in batch0], [mask for _, mask in batch0])
    nll_before = -float(means.mean())
    losses: list[float] = []
    for i, n in enumerate(chunks):
        first = sum(chunks[:i])
        data = (prompts, solutions) if i == 0 else (None, None)
        losses += rank.sft(*data, n, 4, 11, first)
    rank.shutdown()
    return losses, nll_before


def test_chunked_sft_equals_one_call_and_lowers_nll(tmp_path):
    ((whole, nll_before),) = run_distributed(sft_losses, 1, [8], str(tmp_path / "a"), free_port(), timeout_s=300)
    ((chunked, _),) = run_distributed(sft_losses, 1, [3, 2, 3], str(tmp_path / "b"), free_port(), timeout_s=300)
    assert chunked == whole  # same batches, same updates, bit for bit
    assert whole[0] == pytest.approx(nll_before, rel=1e-5)  # the first update's loss = the NLL before it
    assert len(whole) == 8 and max(whole[-3:]) < whole[0]

"""Refit from the Megatron trainer into vLLM: after a real HACPO update, vLLM scores fixed sequences exactly as
the trainer does (both pair_tiny_gpt architectures), and the update moved them. Before it, too: a rank whose
trainer does not hold an HF checkpoint's weights (here a random init; a resume alike) starts its engine on
placeholder weights — a config.json, no weights written or read (issue #40) — and refits the trainer's into it."""

from __future__ import annotations

import math

import pytest

from tests.helpers.distributed import free_port, run_distributed
from tests.helpers.runs import small_kv_cache

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _response_logprobs(token_lp, prompt_lengths, lengths):
    """Trainer token log-probs (shifted layout: column t scores token t + 1) → per-row response lists."""
    return [token_lp[i, p - 1:n - 1].tolist() for i, (p, n) in enumerate(zip(prompt_lengths, lengths, strict=True))]


def _mean_abs(a, b):
    flat = [abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    return sum(flat) / len(flat)


def check_refit(agent_index: int, run_dir: str, port: int, from_hf: bool = False) -> dict:
    import dataclasses

    import torch
    import torch.distributed as dist

    from nemo_hacpo.algo.rows import TrainingRows
    from nemo_hacpo.config import load_config
    from nemo_hacpo.runtime.worker import AgentRank
    from nemo_hacpo.training.objective import Objective

    dist.destroy_process_group()  # the rank joins its agent's own world in setup()
    cfg = load_config("pair_tiny_gpt", ["warmstart.enabled=false", f"agents.{agent_index}.max_response_length=24",
                                    f"agents.{agent_index}.optimizer.lr=3e-3", *small_kv_cache(2)])
    agent = cfg.agents[agent_index]
    if from_hf:  # a fresh run from the agent's HF checkpoint (`model.source: hf`; a warm start alike)
        from pathlib import Path

        from nemo_hacpo.models.tokenizers import load_tokenizer
        from tests.helpers import hf_models

        tokenizer = load_tokenizer(agent.tokenizer.source)
        path = hf_models.save_checkpoint(hf_models.hf_model_from_spec(agent.model.tiny, tokenizer, seed=5), tokenizer,
                                         Path(run_dir) / "init")
        agent = dataclasses.replace(agent, model=dataclasses.replace(agent.model, source="hf", path=str(path)))
    rank = AgentRank(agent, 0, seed=3, run_dir=run_dir, total_updates=10, keep_reference=False)
    rank.setup("127.0.0.1", port)
    prompts = [[{"role": "user", "content": "Ann has 3 pens and buys 4 more. How many pens does she have?"}],
               [{"role": "user", "content": "Bob has 12 cups and gives away 5. How many are left?"}]]
    generated = rank.generate(prompts, 2)
    token_ids, masks = generated.training_rows()
    prompt_lengths = [start + 1 for start in generated.response_starts()]
    lengths = [len(t) for t in token_ids]

    def both():
        token_lp = rank.trainer.compute_token_logprobs(token_ids, masks)
        return _response_logprobs(token_lp, prompt_lengths, lengths), rank.engine.score(token_ids, prompt_lengths)

    trainer_before, vllm_before = both()
    old = rank.old_logprobs(generated)  # what the loop sends the broker: m_old per response, and the mismatch
    n = len(token_ids)
    rows = TrainingRows(token_ids=token_ids, response_mask=masks, advantages=torch.tensor([1.0, -1.0] * (n // 2)),
                        cross_objective=torch.zeros(n, dtype=torch.bool), omega=torch.ones(n),
                        old_mean_logprob=torch.tensor(old.mean), is_own=torch.ones(n, dtype=torch.bool),
                        source=torch.zeros(n, dtype=torch.long))
    metrics = rank.train(rows, Objective.of(dataclasses.replace(cfg.algo, updates_per_step=1, kl_coef=0.0)), 1)
    refit = rank.refit()
    trainer_after, vllm_after = both()
    engines = rank.run_dir / "engines" / agent.name
    engine_dir = sorted(p.name for p in engines.iterdir()) if engines.is_dir() else None
    rank.shutdown()
    sampler = [r.logprobs for r in generated.flat()]
    return {"before": _mean_abs(trainer_before, vllm_before), "after": _mean_abs(trainer_after, vllm_after),
            "moved": _mean_abs(vllm_before, vllm_after), "refit": refit, "old": old,
            "own_means": [sum(row) / len(row) for row in trainer_before], "sampler_gap": _mean_abs(trainer_before, sampler),
            "self_ratio_mean": metrics.objective["self_ratio_mean"], "engine_dir": engine_dir}


@pytest.mark.parametrize(("agent_index", "from_hf"), [(0, False), (1, False), (0, True)],
                         ids=["llama_tiny", "gpt_tiny", "llama_tiny-from-hf"])
def test_vllm_matches_trainer_after_update_and_refit(tmp_path, agent_index, from_hf):
    (result,) = run_distributed(check_refit, 1, agent_index, str(tmp_path), free_port(), from_hf, timeout_s=600)
    if from_hf:  # the engine read the checkpoint the trainer started from: nothing written for it
        assert result["engine_dir"] is None
    else:
        assert not [name for name in result["engine_dir"] if name.endswith((".safetensors", ".bin", ".pt"))]
        assert "config.json" in result["engine_dir"]  # what vLLM started from: the architecture, no weights
    assert result["before"] < 1e-3, result  # the placeholder engine, refit before it generated: the trainer's weights
    assert result["after"] < 1e-3, result  # mean |trainer − vLLM| log-prob over response tokens, fp32
    assert result["moved"] > 1e-3, result  # the update changed what vLLM computes
    # the rank's m_old is the mean of the trainer's response-token log-probs, response by response
    assert result["old"].mean == pytest.approx(result["own_means"], abs=1e-6)
    assert result["old"].token is None  # the sequence loss does not need them: they stay on the rank
    # mismatch = exp(mean |trainer − sampler|) over the response tokens, ≈ 1 in fp32
    assert result["old"].mismatch == pytest.approx(math.exp(result["sampler_gap"]), rel=1e-9)
    assert 1.0 <= result["old"].mismatch < 1.001
    # at the first update the own rows' ratio is exp(m − m_old) = 1 exactly (same weights, same trainer)
    assert result["self_ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert result["refit"].tensors > 0 and result["refit"].bytes > 0 and result["refit"].transport == "rpc"

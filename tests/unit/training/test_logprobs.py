"""Log-probs from vocab-parallel logits: Megatron's padded vocabulary rows are masked out (world of one)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests.helpers.megatron_setup import gloo_world_of_one, megatron_parallel_state

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU shim test")


@pytest.fixture(scope="module")
def megatron_tp1() -> Iterator[None]:
    with gloo_world_of_one(), megatron_parallel_state(tp=1, pp=1):
        yield


def test_padded_vocab_rows_are_masked_and_log_probs_match_the_true_vocabulary(megatron_tp1: None) -> None:
    from megatron.core import tensor_parallel

    from nemo_hacpo.training.trainer import mask_padded_vocab

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 8, generator=generator) * 3  # [B, S, V'] with V' = 8 padded rows, true V = 6
    labels = torch.randint(0, 6, (2, 3), generator=generator)
    masked = mask_padded_vocab(logits, vocab_size=6, tp_rank=0, tp_size=1)
    assert torch.equal(masked[..., :6], logits[..., :6])
    assert (masked[..., 6:] == torch.finfo(torch.float32).min).all()

    token_logprobs = -tensor_parallel.vocab_parallel_cross_entropy(masked.clone(), labels)  # [B, S]
    expected = torch.log_softmax(logits[..., :6].double(), dim=-1).gather(-1, labels[..., None])[..., 0]
    torch.testing.assert_close(token_logprobs.double(), expected, rtol=0, atol=1e-6)
    unmasked = -tensor_parallel.vocab_parallel_cross_entropy(logits.clone(), labels)
    assert (unmasked - expected).abs().max() > 1e-3  # without the mask the padding rows steal probability

    assert mask_padded_vocab(logits, vocab_size=8, tp_rank=0, tp_size=1) is logits  # no padding: untouched
    # TP = 2, V' = 16 of which 10 real: rank 0's slice [0, 8) has no padding, rank 1's [8, 16) is padded from 10
    wide = torch.zeros(1, 1, 8)
    assert mask_padded_vocab(wide, vocab_size=10, tp_rank=0, tp_size=2) is wide
    second = mask_padded_vocab(wide, vocab_size=10, tp_rank=1, tp_size=2)
    assert (second[..., :2] == 0).all() and (second[..., 2:] == torch.finfo(torch.float32).min).all()

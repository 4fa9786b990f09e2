"""Packed (THD) forward of a real Megatron `GPTModel` on the local spec equals the padded forward, row by row.

An in-process gloo world of one (TP = PP = 1). Two tiny architectures from `nemo_hacpo.models.architecture`:
Qwen3-like (RMSNorm, SwiGLU, RoPE, GQA 4 heads / 2 groups, QK-norm) — RoPE must restart per segment
from `cu_seqlens` — and GPT-2-like (LayerNorm, GELU, learned absolute positions, biases, tied embeddings)
— the restarting `position_ids` must reach the embedding. Rows of 5, 9, 3 and 7 tokens; logits at every
real position and the gradients of a log-prob loss agree within 1e-5 (fp32; measured logits: ≤ 4.2e-7).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch

from nemo_hacpo.config import ParallelConfig, PrecisionConfig, TinyModelSpec
from nemo_hacpo.models.architecture import arch_from_tiny, build_gpt_model, transformer_config
from nemo_hacpo.training.batching import pad_micro_batch
from nemo_hacpo.training.packing import pack_rows, unpack_index
from tests.helpers.megatron_setup import gloo_world_of_one, megatron_parallel_state

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU local-spec test (GPU: tests/gpu/)")

VOCAB_SIZE = 200
ATOL = 1e-5
SPECS = {
    "qwen3_like": TinyModelSpec(num_layers=2, hidden_size=128, num_attention_heads=4, num_query_groups=2,
                                ffn_hidden_size=256, qk_layernorm=True, max_position_embeddings=64),
    "gpt2_like": TinyModelSpec(num_layers=2, hidden_size=128, num_attention_heads=2, ffn_hidden_size=256,
                               normalization="LayerNorm", activation="gelu", position_embedding="learned_absolute",
                               tie_embeddings=True, max_position_embeddings=64),
}


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    with gloo_world_of_one(), megatron_parallel_state(tp=1, pp=1, seed=1234):
        yield


def _model(label: str, core_attention: type | None):
    torch.manual_seed(1234)
    from megatron.core import tensor_parallel

    tensor_parallel.get_cuda_rng_tracker().reset()
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    arch = arch_from_tiny(SPECS[label], VOCAB_SIZE)
    config = transformer_config(arch, ParallelConfig(), PrecisionConfig(), device="cpu")
    return build_gpt_model(arch, config, use_te=False, core_attention=core_attention)


def _rows() -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(1, VOCAB_SIZE, (length,), generator=generator).tolist() for length in (5, 9, 3, 7)]


def _padded_and_packed_logits(model, token_ids, pad_to_multiple: int = 1, restart_positions: bool = True):
    """Logits `[B, S, V]` of the padded forward, and of the packed forward unpacked to `[B, S, V]`."""
    rows = list(range(len(token_ids)))
    padded = pad_micro_batch(token_ids, [[0] * len(t) for t in token_ids], rows)
    packed = pack_rows(token_ids, rows, pad_to_multiple)
    positions = packed.position_ids if restart_positions else torch.arange(packed.num_positions).unsqueeze(0)
    padded_logits = model(padded.input_ids, padded.position_ids, None)  # [B, S, V]
    packed_logits = model(packed.input_ids, positions, None, packed_seq_params=packed.megatron_params())  # [1, T, V]
    index, valid = unpack_index(packed.cu_seqlens, packed.row_lengths, padded.input_ids.shape[1])
    unpacked = packed_logits[0][index]  # [B, S, V]
    return padded_logits, unpacked, valid, padded.labels


def test_megatron_local_attention_refuses_packed_sequences(world: None) -> None:
    """The fact that makes `PackedDotProductAttention` necessary (megatron-core 0.16.1)."""
    model = _model("qwen3_like", core_attention=None)
    packed = pack_rows(_rows(), [0, 1])
    with pytest.raises(AssertionError, match="Packed sequence is not supported by DotProductAttention"):
        model(packed.input_ids, packed.position_ids, None, packed_seq_params=packed.megatron_params())


@pytest.mark.parametrize("label", list(SPECS))
@pytest.mark.parametrize("pad_to_multiple", [1, 16])
def test_packed_logits_equal_padded_logits(world: None, label: str, pad_to_multiple: int) -> None:
    from nemo_hacpo.training.packed_attention import PackedDotProductAttention

    model = _model(label, PackedDotProductAttention).eval()
    with torch.no_grad():
        padded, unpacked, valid, _ = _padded_and_packed_logits(model, _rows(), pad_to_multiple)
    gap = (padded - unpacked).abs().amax(dim=-1)[valid]
    print(f"{label}, multiple {pad_to_multiple}: max |Δlogit| = {float(gap.max()):.1e}")  # shown with -s
    assert float(gap.max()) <= ATOL, f"max |Δlogit| = {float(gap.max()):.2e}"
    assert float(padded[valid].abs().max()) > 0.1  # not a degenerate all-zero output


def test_positions_must_restart_for_learned_position_embeddings(world: None) -> None:
    """With positions running on across rows the GPT-2-like model's later rows change: the restart matters."""
    from nemo_hacpo.training.packed_attention import PackedDotProductAttention

    model = _model("gpt2_like", PackedDotProductAttention).eval()
    with torch.no_grad():
        padded, unpacked, valid, _ = _padded_and_packed_logits(model, _rows(), restart_positions=False)
    first_row_gap = (padded[0] - unpacked[0]).abs()[valid[0]].max()
    later_rows_gap = (padded[1:] - unpacked[1:]).abs()[valid[1:]].max()
    assert float(first_row_gap) <= ATOL and float(later_rows_gap) > 1e-3


@pytest.mark.parametrize("label", list(SPECS))
def test_packed_gradients_equal_padded_gradients(world: None, label: str) -> None:
    """∇ of Σ log π(label) over the real positions, through the packed and the padded forward."""
    from nemo_hacpo.training.packed_attention import PackedDotProductAttention

    grads = []
    for packed_path in (False, True):
        model = _model(label, PackedDotProductAttention)
        padded, unpacked, valid, labels = _padded_and_packed_logits(model, _rows())
        logits = unpacked if packed_path else padded
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # [B, S]
        (logprobs * valid).sum().backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    padded_grads, packed_grads = grads
    assert padded_grads.keys() == packed_grads.keys()
    for name, expected in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], expected, rtol=0, atol=ATOL, msg=lambda m, n=name: f"{n}: {m}")
    assert max(float(g.abs().max()) for g in padded_grads.values()) > 1e-3


def test_packed_attention_rejects_mismatched_segments(world: None) -> None:
    from megatron.core.packed_seq_params import PackedSeqParams

    from nemo_hacpo.training.packed_attention import PackedDotProductAttention

    model = _model("gpt2_like", PackedDotProductAttention)  # no RoPE, which would split by cu_seqlens first
    packed = pack_rows(_rows(), [0, 1])
    wrong_end = dataclasses.replace(packed.megatron_params(), cu_seqlens_q=torch.tensor([0, 4, 10], dtype=torch.int32),
                                    cu_seqlens_kv=torch.tensor([0, 4, 10], dtype=torch.int32))
    with pytest.raises(ValueError, match="cu_seqlens end at 10"):
        model(packed.input_ids, packed.position_ids, None, packed_seq_params=wrong_end)
    assert isinstance(wrong_end, PackedSeqParams)

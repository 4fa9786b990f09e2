"""Shared pieces of the trainer integration tests: a tiny agent, seeded rows, and TP/PP (un)sharding.

The model: 2 layers, hidden 128, 2 heads (head_dim 64), SwiGLU FFN 256, RoPE, vocabulary 300 — so
Megatron pads the vocabulary to 384 rows at TP = 1 and 512 at TP = 2, and the padded-vocab masking of
the trainer's log-probs is exercised (the padding rows hold different values in different layouts).
Each layout's first optimizer update reveals the gradient (`tiny_agent`, `gradients`).

Sharding of a TP = 1 / PP = 1 tensor for TP rank r of T and pipeline stage p of P (Megatron's layouts):
  column-parallel (`linear_qkv`, `output_layer`) and the vocab-parallel embedding: chunk r of T on dim 0
  (vocabulary tensors first zero-padded to the layout's padded vocabulary);
  row-parallel (`linear_proj`, `linear_fc2`): chunk r on dim 1;
  SwiGLU `linear_fc1` = [gate; up] on dim 0: rank r holds [gate chunk r; up chunk r];
  norms: replicated; `decoder.layers.{i}` on stage p is global layer i + p·L/P.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from nemo_hacpo.config import AgentConfig, ModelSource, OptimizerConfig, ParallelConfig, TinyModelSpec

VOCAB_SIZE = 300
NUM_ROWS = 16
VOCAB_NAMES = ("embedding.word_embeddings.weight", "output_layer.weight")
GRAD_PROBE_EPS = 1000.0
TIMING_METRICS = ("step_time_s", "tokens_per_s", "tflops_per_gpu")


def tiny_agent(tp: int = 1, pp: int = 1, dp: int = 1, micro_batch_size: int = 2) -> AgentConfig:
    """The test agent, with an optimizer whose first update reveals the gradient in every layout.

    Megatron's distributed optimizer (DP = 2) only takes Adam, and Adam's first update is
    `lr·g / (|g| + ε)` (bias-corrected moments m̂ = g, v̂ = g²). With lr = ε = GRAD_PROBE_EPS it is
    `u = g / (1 + |g|/ε)` — smooth, invertible (`g = ε·u / (ε − |u|)`, see `gradients`) and unlike the
    usual ε it does not amplify float noise in tiny gradients. No clipping, no weight decay."""
    return AgentConfig(
        name="tiny",
        model=ModelSource(tiny=TinyModelSpec(num_layers=2, hidden_size=128, num_attention_heads=2,
                                             ffn_hidden_size=256, max_position_embeddings=64)),
        parallel=ParallelConfig(tp=tp, pp=pp, dp=dp, micro_batch_size=micro_batch_size),
        optimizer=OptimizerConfig(name="adam", lr=GRAD_PROBE_EPS, adam_eps=GRAD_PROBE_EPS, weight_decay=0.0,
                                  clip_grad=0.0, use_distributed_optimizer=dp > 1),
    )


def tiny_arch(agent: AgentConfig):
    from nemo_hacpo.models.architecture import model_arch

    return model_arch(agent, tokenizer_vocab=VOCAB_SIZE)


def token_rows(seed: int = 0, num_rows: int = NUM_ROWS) -> tuple[list[list[int]], list[list[int]]]:
    """Seeded rows: 10–48 tokens, a 4–8-token prompt, the rest (≥ 2 tokens) response."""
    generator = torch.Generator().manual_seed(seed)
    token_ids, response_mask = [], []
    for _ in range(num_rows):
        length = int(torch.randint(10, 49, (1,), generator=generator))
        prompt = int(torch.randint(4, 9, (1,), generator=generator))
        token_ids.append(torch.randint(1, VOCAB_SIZE, (length,), generator=generator).tolist())
        response_mask.append([0] * prompt + [1] * (length - prompt))
    return token_ids, response_mask


CROSS_LOG_RATIO_OFFSETS = (-0.3, 0.05, 0.1, 0.5, -0.05, 0.15, 0.3, 0.02)
"""m_old(cross) = m + offset → s = exp(−offset) = 1.35, 0.95, 0.90, 0.61, 1.05, 0.86, 0.74, 0.98: with lo_0 = 0.8,
four cross rows pass gradient and four are clipped (two above 1, two below lo_0), none near a boundary."""


def plain_rows(token_ids: list[list[int]], response_mask: list[list[int]]):
    """Rows with nothing but tokens (all own rows, no advantages): what log-prob passes need."""
    from nemo_hacpo.algo.rows import TrainingRows

    return TrainingRows.supervised(token_ids, response_mask)


def mean_logprobs(trainer, rows) -> torch.Tensor:
    """`[N]` m(y) of the rows under the trainer's current weights."""
    return trainer.compute_mean_logprobs(rows.token_ids, rows.response_mask)


def training_rows(mean_logprob: torch.Tensor, seed: int = 0):
    """8 own rows (m_old = m, s = 1) then 8 cross rows (m_old = m + offsets), seeded A and ω."""
    from nemo_hacpo.algo.rows import TrainingRows

    token_ids, response_mask = token_rows(seed)
    generator = torch.Generator().manual_seed(seed + 1)
    num_own = NUM_ROWS // 2
    is_cross = torch.arange(NUM_ROWS) >= num_own
    offsets = torch.cat([torch.zeros(num_own), torch.tensor(CROSS_LOG_RATIO_OFFSETS)])
    omega = torch.where(is_cross, torch.tensor([0.5, 2.0]).repeat(NUM_ROWS // 2), torch.ones(NUM_ROWS))
    return TrainingRows(token_ids=token_ids, response_mask=response_mask,
                        advantages=torch.randn(NUM_ROWS, generator=generator), cross_objective=is_cross,
                        omega=omega, old_mean_logprob=mean_logprob.float() + offsets, is_own=~is_cross,
                        source=is_cross.long())


def as_own_rows(rows):
    """The same rows, every one trained as the learner's own (no cross objective)."""
    return rows.replace(cross_objective=torch.zeros(len(rows), dtype=torch.bool),
                        is_own=torch.ones(len(rows), dtype=torch.bool), source=torch.zeros(len(rows), dtype=torch.long))


def train(trainer, rows, algo, step: int) -> dict[str, float]:
    """One `train_step` with the objective of config `algo`; its flat metrics."""
    from nemo_hacpo.training.objective import Objective

    return trainer.train_step(rows, Objective.of(algo), step).flat()


def _global_name(local_name: str, layer_offset: int) -> str:
    return re.sub(r"decoder\.layers\.(\d+)\.", lambda m: f"decoder.layers.{int(m.group(1)) + layer_offset}.",
                  local_name)


def _layer_offset(trainer) -> int:
    layers = trainer.arch.num_layers
    return trainer.pp_rank * (layers // trainer.agent.parallel.pp)


def shard_full_state(trainer, full_state: dict[str, Any], module=None) -> dict[str, Any]:
    """This rank's state dict of `module` (default: the trainer's policy) from a TP = 1 / PP = 1 one."""
    module = module if module is not None else trainer.module
    params = dict(module.named_parameters())
    tp_size, tp_rank = trainer.agent.parallel.tp, trainer.tp_rank
    offset = _layer_offset(trainer)
    sharded = {}
    for name, local in module.state_dict().items():
        full = full_state[_global_name(name, offset)]
        param = params.get(name)
        if not isinstance(local, torch.Tensor) or param is None or not getattr(param, "tensor_model_parallel", False):
            sharded[name] = full
            continue
        if name in VOCAB_NAMES:  # zero-pad to this layout's padded vocabulary
            full = torch.cat([full[:VOCAB_SIZE], full.new_zeros(local.shape[0] * tp_size - VOCAB_SIZE,
                                                                *full.shape[1:])])
        if name.endswith("mlp.linear_fc1.weight"):
            shard = torch.cat([half.chunk(tp_size, dim=0)[tp_rank] for half in full.chunk(2, dim=0)], dim=0)
        else:
            shard = full.chunk(tp_size, dim=param.partition_dim)[tp_rank]
        assert shard.shape == local.shape, (name, shard.shape, local.shape)
        sharded[name] = shard.clone()
    return sharded


def load_full_state(trainer, full_state: dict[str, Any], module=None) -> None:
    module = module if module is not None else trainer.module
    module.load_state_dict(shard_full_state(trainer, full_state, module), strict=True)


def local_parameters(trainer) -> dict[str, Any]:
    """This rank's parameter shards under their global names, with how to reassemble them."""
    offset = _layer_offset(trainer)
    pieces = {}
    for name, param in trainer.module.named_parameters():
        if not getattr(param, "tensor_model_parallel", False):
            kind = "replicated"
        elif name.endswith("mlp.linear_fc1.weight"):
            kind = "gated"
        else:
            kind = f"dim{param.partition_dim}"
        pieces[_global_name(name, offset)] = (param.detach().clone(), kind)
    return {"tp_rank": trainer.tp_rank, "dp_rank": trainer.dp_rank, "pieces": pieces}


def assemble_full(rank_results: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """TP = 1 / PP = 1 tensors from every rank's `local_parameters` (DP replica 0); vocab rows cut to 300."""
    by_name: dict[str, dict[int, tuple[torch.Tensor, str]]] = {}
    for result in rank_results:
        if result["dp_rank"] != 0:
            continue
        for name, (tensor, kind) in result["pieces"].items():
            by_name.setdefault(name, {})[result["tp_rank"]] = (tensor, kind)
    full = {}
    for name, shards in by_name.items():
        ordered = [shards[r][0] for r in sorted(shards)]
        kind = shards[0][1]
        if kind == "replicated":
            tensor = ordered[0]
        elif kind == "gated":
            gates, ups = zip(*(shard.chunk(2, dim=0) for shard in ordered), strict=True)
            tensor = torch.cat([*gates, *ups], dim=0)
        else:
            tensor = torch.cat(ordered, dim=int(kind.removeprefix("dim")))
        full[name] = tensor[:VOCAB_SIZE] if name in VOCAB_NAMES else tensor
    return full


def gradients(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Invert the first update of `tiny_agent`'s Adam: u = w_before − w_after, g = ε·u / (ε − |u|)."""
    eps = GRAD_PROBE_EPS
    grads = {}
    for name in before:
        update = (before[name] - after[name]).double()
        grads[name] = (eps * update / (eps - update.abs())).float()
    return grads


def comparable_metrics(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k not in TIMING_METRICS}

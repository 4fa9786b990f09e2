"""`MegatronTrainer`: one rank of one agent's Megatron-core trainer (model shard, optimizer, HACPO updates).

Construct it in a process whose torch.distributed world is exactly this agent's (`init_distributed`); it
initialises Megatron's `parallel_state` for the agent's TP/PP/DP layout, builds this rank's pipeline stage
of the GPT, wraps it in Megatron DDP, and builds the Megatron optimizer and LR schedule. Per RL step the
runtime calls, on **every rank of the agent, with the same arguments**:

    m_old = trainer.compute_mean_logprobs(ids, mask)        # [N] m_k,old of the agent's own samples (algorithm.md §4)
    ...the broker builds the learner's TrainingRows...
    metrics = trainer.train_step(rows, objective, step)     # M optimizer updates → TrainMetrics on every rank
    trainer.save_checkpoint(dir, step)                      # when the driver decides (collective)

Every rank receives the whole row list; each data-parallel replica takes its contiguous shard of every
mini-batch, so global normalisers are known locally and no rows travel between ranks.

Losses. Megatron's schedule runs with `calculate_per_token_loss=True`: it neither divides the loss by the
number of micro-batches nor averages gradients over data-parallel replicas (it sums them), and the
trainer's `finalize_model_grads` does not rescale. Each micro-batch returns its exact share of the
mini-batch loss (`objective.micro_batch_loss`, divided by the global `D`), so gradients equal those of
the whole mini-batch on one device, whatever the micro-batch size or DP size.

Log-probs. `−vocab_parallel_cross_entropy(logits / T, label)` = log π(label), computed on the last stage
from vocab-parallel logits in fp32; Megatron's padded vocabulary rows (≥ the tokenizer's vocabulary) are
masked out so the distribution is the HF/vLLM one. Results of no-grad passes are summed over DP replicas
(disjoint rows) and broadcast from the last pipeline stage, so every rank returns them.

Micro-batches are right-padded (to their own longest row, rounded up to `pad_to_multiple`), optionally
sized by a padded-token budget — or, with sequence packing, padding-free: the rows of a micro-batch run
as one THD sequence (`training.packing`: `PackedSeqParams` with `cu_seqlens`, positions restarting per
row; Transformer Engine's attention on GPU, `packed_attention.PackedDotProductAttention` on the local
spec) and the token budget counts real tokens; log-probs are unpacked to the row layout the loss reads.

Reference model (β > 0 only): a frozen copy of the initial weights; with `offload_reference` its weights
stay in (pinned) host memory and are copied to the device only for its no-grad forward (`offload`).
Megatron's global `parallel_state` is read once, at construction: afterwards the trainer passes its own
ranks and groups explicitly. Not supported: context parallelism (rejected at construction).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from nemo_hacpo.algo import sequence_mean_logprob
from nemo_hacpo.algo.rows import TrainingRows
from nemo_hacpo.training.batching import (
    MicroBatch,
    micro_batches,
    minibatch_ranges,
    pad_micro_batch,
    padded_length,
    scored_token_counts,
    split_evenly,
    training_micro_batch,
    validate_rows,
)
from nemo_hacpo.training.flops import batch_flops
from nemo_hacpo.training.loss_metrics import (
    REDUCTIONS,
    FP16Scaling,
    MetricAccumulator,
    RowOutcome,
    TrainMetrics,
    reduce_metrics,
)
from nemo_hacpo.training.objective import Objective, micro_batch_loss
from nemo_hacpo.training.offload import HostOffload
from nemo_hacpo.training.packing import pack_rows, unpack_token_values

if TYPE_CHECKING:
    from nemo_hacpo.config import AgentConfig, ParallelConfig
    from nemo_hacpo.models.architecture import ModelArch
    from nemo_hacpo.training.trainer_checkpoint import SavedCheckpoint

FP16_INITIAL_LOSS_SCALE = 2.0**16
"""fp16's first loss scale; the scaler halves it after overflows (hysteresis 2) and doubles it after 1000 clean
updates (Megatron's defaults)."""


def _finalize_grads_summed(model, num_tokens=None, **kwargs: Any) -> None:
    """Megatron's `finalize_model_grads` (DP reduce, TP/PP shared-weight reduces) without the per-token
    rescale: the loss is already divided by the global normaliser."""
    from megatron.core.distributed import finalize_model_grads

    finalize_model_grads(model, None, **kwargs)


def mask_padded_vocab(vocab_parallel_logits: torch.Tensor, vocab_size: int, tp_rank: int,
                      tp_size: int) -> torch.Tensor:
    """Set the logits of Megatron's padding rows (global vocab index ≥ `vocab_size`) to the most negative
    float, on TP rank `tp_rank`'s slice `[..., V/tp]` of `tp_size`; a no-op (same tensor) when the slice has no
    padding."""
    from megatron.core.tensor_parallel.utils import VocabUtility

    partition = vocab_parallel_logits.shape[-1]
    start, end = VocabUtility.vocab_range_from_per_partition_vocab_size(partition, tp_rank, tp_size)
    if end <= vocab_size:
        return vocab_parallel_logits
    is_padding = torch.arange(start, end, device=vocab_parallel_logits.device) >= vocab_size  # [V/tp]
    return vocab_parallel_logits.masked_fill(is_padding, torch.finfo(vocab_parallel_logits.dtype).min)


class MegatronTrainer:
    """One rank of an agent's trainer. See the module docstring for the call sequence.

    Args:
        agent: the agent's config (parallel layout, optimizer, precision).
        arch: its architecture (`nemo_hacpo.models.architecture.model_arch`).
        seed: initialisation seed (weights are normally loaded afterwards).
        total_updates: optimizer updates of the whole run (steps · M), the LR decay horizon.
        reference_model: keep a frozen copy of the initial weights for the KL term (needed iff β > 0).
        use_te: Transformer Engine layer spec (default: on CUDA when TE is importable).
        attention: the core attention without Transformer Engine (`ATTENTION_KINDS`: SDPA on CUDA by default).
        logit_temperature: divide logits by this before the softmax (the sampler's temperature).
        max_tokens_per_micro_batch: dynamic micro-batches by token budget — padded tokens (rows · longest),
            or real tokens with packing (None: fixed size `agent.parallel.micro_batch_size`, which still
            caps the rows per micro-batch).
        pad_to_multiple: round each micro-batch's padded length (packed: its total length) up to this
            multiple (default: 1, or with FP8 16 — Transformer Engine's FP8 GEMMs need token counts
            divisible by 16 — and 128 for the block-scaled recipes, a conservative choice for their
            128-element scaling blocks; times TP with sequence parallelism, which splits the sequence).
        sequence_packing: padding-free micro-batches (None: `agent.parallel.sequence_packing`, default off).
        offload_reference: keep the reference model's weights in host memory between its forwards (None:
            `agent.offload_reference`, default off); ignored without a reference model.
    """

    def __init__(self, agent: AgentConfig, arch: ModelArch, *, seed: int = 0, total_updates: int = 1000,
                 reference_model: bool = False, use_te: bool | None = None, logit_temperature: float = 1.0,
                 max_tokens_per_micro_batch: int | None = None, pad_to_multiple: int | None = None,
                 sequence_packing: bool | None = None, offload_reference: bool | None = None,
                 attention: str = "auto"):
        from megatron.core import parallel_state

        from nemo_hacpo.training.distributed import process_groups

        parallel = agent.parallel
        if not dist.is_initialized():
            raise RuntimeError("MegatronTrainer needs torch.distributed initialised for this agent "
                               "(call nemo_hacpo.training.init_distributed first)")
        if dist.get_world_size() != parallel.world_size:
            raise ValueError(f"agent {agent.name!r}: world size {dist.get_world_size()} ≠ tp·pp·cp·dp = "
                             f"{parallel.world_size}")
        if parallel.cp != 1:
            raise ValueError("context parallelism is not supported by the trainer (parallel.cp must be 1)")
        if logit_temperature <= 0:
            raise ValueError(f"logit_temperature must be > 0, got {logit_temperature}")
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {attention!r}")
        # Read with getattr: older configs have neither field.
        self.sequence_packing = bool(getattr(parallel, "sequence_packing", False) if sequence_packing is None
                                     else sequence_packing)
        offload_reference = bool(getattr(agent, "offload_reference", False) if offload_reference is None
                                 else offload_reference)
        if offload_reference and reference_model and agent.precision.fp8_param:
            raise ValueError("offload_reference with precision.fp8_param is not supported (FP8 parameters are "
                             "Transformer Engine tensor subclasses; their host copies are untested)")
        on_gpu = torch.cuda.is_available()
        if not on_gpu:
            from nemo_hacpo.models.megatron_cpu_shim import apply_cpu_shim

            apply_cpu_shim()
        if parallel_state.model_parallel_is_initialized():
            raise RuntimeError("Megatron parallel_state is already initialised in this process; close() the "
                               "previous trainer first")
        groups_before = process_groups()
        self._own_groups: set = set()
        try:
            self._build(agent, arch, parallel, seed=seed, total_updates=total_updates,
                        reference_model=reference_model, use_te=use_te, logit_temperature=logit_temperature,
                        max_tokens_per_micro_batch=max_tokens_per_micro_batch, pad_to_multiple=pad_to_multiple,
                        offload_reference=offload_reference, on_gpu=on_gpu, attention=attention)
        except BaseException:  # a trainer that failed to build leaves the process as it found it
            self._own_groups = process_groups() - groups_before
            self.close()
            raise
        self._own_groups = process_groups() - groups_before  # Megatron's groups and any its model or optimizer made

    def _build(self, agent: AgentConfig, arch: ModelArch, parallel: ParallelConfig, *, seed: int, total_updates: int,
               reference_model: bool, use_te: bool | None, logit_temperature: float,
               max_tokens_per_micro_batch: int | None, pad_to_multiple: int | None, offload_reference: bool,
               on_gpu: bool, attention: str) -> None:
        from megatron.core import parallel_state

        from nemo_hacpo.models.architecture import transformer_config, transformer_engine_available
        from nemo_hacpo.models.hf_conversion import ModelParallel
        from nemo_hacpo.training.distributed import seed_all

        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=parallel.tp, pipeline_model_parallel_size=parallel.pp,
            context_parallel_size=parallel.cp)
        seed_all(seed)

        self.agent, self.arch = agent, arch
        self.device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        self.micro_batch_size = parallel.micro_batch_size
        self.max_tokens_per_micro_batch = max_tokens_per_micro_batch
        self.pad_to_multiple = pad_to_multiple if pad_to_multiple is not None else default_pad_multiple(agent)
        self.logit_temperature = float(logit_temperature)
        self.use_te = use_te if use_te is not None else (on_gpu and transformer_engine_available())
        # the core attention of the local spec: torch SDPA on CUDA (no s² tensor), Megatron's own on CPU
        self.attention = "te" if self.use_te else (attention if attention != "auto" else "sdpa" if on_gpu else "local")
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.tp_size = parallel_state.get_tensor_model_parallel_world_size()
        self.pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.is_first_stage = parallel_state.is_pipeline_first_stage()
        self.is_last_stage = parallel_state.is_pipeline_last_stage()
        self.dp_group = parallel_state.get_data_parallel_group()
        self.pp_group = parallel_state.get_pipeline_model_parallel_group()
        self.model_parallel = ModelParallel.from_megatron()  # this rank's TP/PP place, for HF import/export
        self.pp_last_rank = parallel_state.get_pipeline_model_parallel_last_rank()

        self.config = transformer_config(
            arch, parallel, agent.precision, device="cuda" if on_gpu else "cpu",
            calculate_per_token_loss=True)
        # Micro-batches are padded to their own length, so pipeline stages exchange shapes first. Set after
        # construction: TransformerConfig refuses it with the (unused, dense model) MoE allgather dispatcher.
        self.config.variable_seq_lengths = parallel.pp > 1
        self.config.finalize_model_grads_func = _finalize_grads_summed
        self.model = self._build_ddp_model()
        self.config.no_sync_func = self.model.no_sync
        # The reference before the optimizer: with offloading its transient device copy is gone before the
        # optimizer's main weights are allocated. (The optimizer draws no random numbers: same init either way.)
        self.reference = self._build_module() if reference_model else None
        self.reference_offload: HostOffload | None = None
        if self.reference is not None:
            self.reference.requires_grad_(False).eval()
            if offload_reference:
                self.reference_offload = HostOffload(self.reference, self.device)
            self.sync_reference()
        self.optimizer = self._build_optimizer()
        if self.config.fp16:  # fp16 trains with a loss scale: the schedule multiplies the loss by it before backward
            self.config.grad_scale_func = self.optimizer.scale_loss  # (the optimizer divides the grads by it)
        self.scheduler = self._build_scheduler(total_updates)
        self.updates_done = 0
        self.last_step: int | None = None

    # ------------------------------------------------------------------------------------------ building
    def _build_module(self):
        from nemo_hacpo.models.architecture import build_gpt_model

        core_attention = None
        if self.attention == "sdpa":
            from nemo_hacpo.training.sdpa_attention import SdpaDotProductAttention

            core_attention = SdpaDotProductAttention
        elif self.sequence_packing and self.attention == "local":  # the local spec's attention refuses THD input
            from nemo_hacpo.training.packed_attention import PackedDotProductAttention

            core_attention = PackedDotProductAttention
        module = build_gpt_model(self.arch, self.config, use_te=self.use_te, pre_process=self.is_first_stage,
                                 post_process=self.is_last_stage, core_attention=core_attention)
        return module.to(self.device)

    def _build_ddp_model(self):
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False,
            use_distributed_optimizer=self.agent.optimizer.use_distributed_optimizer)
        return DistributedDataParallel(config=self.config, ddp_config=ddp_config, module=self._build_module())

    def _build_optimizer(self):
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        opt = self.agent.optimizer
        dtype = self.config.params_dtype
        config = OptimizerConfig(
            optimizer=opt.name, lr=opt.lr, min_lr=opt.min_lr, weight_decay=opt.weight_decay,
            adam_beta1=opt.adam_beta1, adam_beta2=opt.adam_beta2, adam_eps=opt.adam_eps, sgd_momentum=0.0,
            # clip_grad = 0 means "off"; +inf keeps Megatron computing (and returning) the grad norm.
            clip_grad=opt.clip_grad if opt.clip_grad > 0 else math.inf,
            bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16, params_dtype=dtype,
            use_distributed_optimizer=opt.use_distributed_optimizer,
            # fp16: dynamic loss scaling from 2^16 (torch's GradScaler default), not Megatron's pre-training 2^32,
            # which would skip the first ~30 updates of a fine-tuning run while the scale comes down
            initial_loss_scale=FP16_INITIAL_LOSS_SCALE)
        return get_megatron_optimizer(config, [self.model])

    def _build_scheduler(self, total_updates: int):
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        opt = self.agent.optimizer
        decay_steps = max(total_updates, opt.lr_warmup_steps + 1)
        # Warm-up starts at lr/W rather than Megatron's default 0, so the first update is not a no-op:
        # lr_k = lr/W + (lr − lr/W)·k/W for update k ≤ W, then the decay style down to min_lr at total_updates.
        init_lr = opt.lr / opt.lr_warmup_steps if opt.lr_warmup_steps > 0 else opt.lr
        return OptimizerParamScheduler(
            self.optimizer, init_lr=init_lr, max_lr=opt.lr,
            min_lr=opt.min_lr, lr_warmup_steps=opt.lr_warmup_steps, lr_decay_steps=decay_steps,
            lr_decay_style=opt.lr_decay_style, start_wd=opt.weight_decay, end_wd=opt.weight_decay,
            wd_incr_steps=decay_steps, wd_incr_style="constant")

    def sync_reference(self) -> None:
        """Copy the policy's current weights into the reference model (after loading initial weights; with
        offloading, into its host copies)."""
        if self.reference is None:
            raise RuntimeError("this trainer keeps no reference model (reference_model=False)")
        self.reference.load_state_dict(self.model.module.state_dict(), strict=True)

    @property
    def module(self):
        """This rank's unwrapped `GPTModel` stage (for weight import/export)."""
        return self.model.module

    @property
    def current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # ------------------------------------------------------------------------------------- forward parts
    def _token_logprobs(self, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """`[B, S]` log π(label) from this stage's vocab-parallel logits `[B, S, V/tp]` (last stage only)."""
        from megatron.core import tensor_parallel

        logits = output.float()
        if self.logit_temperature != 1.0:
            logits = logits / self.logit_temperature
        logits = mask_padded_vocab(logits, self.arch.vocab_size, self.tp_rank, self.tp_size)
        return -tensor_parallel.vocab_parallel_cross_entropy(logits, labels)

    def _row_token_logprobs(self, batch: MicroBatch, output: torch.Tensor) -> torch.Tensor:
        """`[B, S]` token log-probs in the padded row layout, from padded logits `[B, S, V/tp]` or packed
        logits `[1, T, V/tp]` (scored against the packed labels, then unpacked)."""
        if batch.packed is None:
            return self._token_logprobs(output, batch.labels)
        packed_logprobs = self._token_logprobs(output, batch.packed.labels)  # [1, T]
        return unpack_token_values(packed_logprobs, batch.packed, batch.input_ids.shape[1])

    def _micro_batch(self, batch: MicroBatch, token_ids: Sequence[Sequence[int]]) -> MicroBatch:
        """Attach the packed model inputs when packing (the loss keeps the padded row layout `[B, S]`)."""
        if self.sequence_packing:
            batch.packed = pack_rows(token_ids, batch.row_index.tolist(), self.pad_to_multiple)
        return batch

    def _run_schedule(self, model, batches: list[MicroBatch], loss_func, forward_only: bool) -> None:
        """Megatron's schedule (1F1B with PP) over `batches`; `loss_func(batch, output)` on the last stage."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def forward_step(data_iterator: Iterator[MicroBatch], chunk):
            batch = next(data_iterator).to(self.device)
            if batch.packed is None:
                output = chunk(batch.input_ids, batch.position_ids, None)  # last stage: logits [B, S, V/tp]
            else:  # one THD sequence: logits [1, T, V/tp]
                packed = batch.packed
                output = chunk(packed.input_ids, packed.position_ids, None,
                               packed_seq_params=packed.megatron_params())
            return output, functools.partial(loss_func, batch)

        shapes = [b.model_input_shape for b in batches]  # [B, S] padded, [1, T] packed
        get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(batches), model=[model],
            num_microbatches=len(batches), seq_length=max(s for _, s in shapes),
            micro_batch_size=max(b for b, _ in shapes), forward_only=forward_only)

    def _shard_micro_batches(self, rows: range, lengths: Sequence[int]) -> list[list[int]]:
        """This DP replica's contiguous share of `rows`, cut into micro-batches."""
        shard = split_evenly(len(rows), self.dp_size)[self.dp_rank]
        mine = [rows[i] for i in shard]
        if self.max_tokens_per_micro_batch is None:
            return micro_batches(mine, lengths, self.micro_batch_size)
        if self.sequence_packing:  # the budget counts real tokens
            return micro_batches(mine, lengths, self.micro_batch_size, self.max_tokens_per_micro_batch, packed=True)
        padded = {row: padded_length(lengths[row], self.pad_to_multiple) for row in mine}  # what padding costs
        return micro_batches(mine, padded, self.micro_batch_size, self.max_tokens_per_micro_batch)

    def _share_from_last_stage(self, values: torch.Tensor) -> torch.Tensor:
        """Sum a row-indexed buffer over DP replicas (disjoint rows), then copy the last stage's to all."""
        if self.dp_size > 1:
            dist.all_reduce(values, op=dist.ReduceOp.SUM, group=self.dp_group)
        if dist.get_world_size(self.pp_group) > 1:
            dist.broadcast(values, src=self.pp_last_rank, group=self.pp_group)
        return values

    @torch.no_grad()
    def _forward_logprobs(self, model, token_ids: Sequence[Sequence[int]], response_mask: Sequence[Sequence[int]],
                          per_token: bool) -> torch.Tensor:
        """No-grad log-probs of every row: `[N]` sequence means, or `[N, T]` token log-probs in the shifted
        layout (T = longest row − 1, zeros off the response), on every rank (CPU tensor)."""
        validate_rows(token_ids, response_mask)
        lengths = [len(row) - 1 for row in token_ids]
        num_rows = len(token_ids)
        if num_rows == 0:
            return torch.zeros((0, 0) if per_token else (0,), dtype=torch.float32)
        shape = (num_rows, max(lengths)) if per_token else (num_rows,)
        values = torch.zeros(shape, dtype=torch.float32, device=self.device)
        plan = self._shard_micro_batches(range(num_rows), lengths)
        row_multiple = 1 if self.sequence_packing else self.pad_to_multiple  # packed: the model sees [1, T]
        batches = [self._micro_batch(pad_micro_batch(token_ids, response_mask, indices, row_multiple), token_ids)
                   for indices in plan]
        zero_count = torch.zeros((), dtype=torch.int, device=self.device)

        def store(batch: MicroBatch, output: torch.Tensor):
            token_logprobs = self._row_token_logprobs(batch, output)  # [B, S]
            if per_token:
                seq_len = min(token_logprobs.shape[1], values.shape[1])  # beyond: padding to pad_to_multiple
                scored = torch.where(batch.loss_mask, token_logprobs, 0.0)
                values[batch.row_index, :seq_len] = scored[:, :seq_len]
            else:
                values[batch.row_index] = sequence_mean_logprob(token_logprobs, batch.loss_mask)
            return token_logprobs.new_zeros(()), zero_count, {}

        if batches:  # a replica without rows (N < dp) still joins the reduction below
            was_training = model.training
            model.eval()
            self._run_schedule(model, batches, store, forward_only=True)
            model.train(was_training)
        return self._share_from_last_stage(values).cpu()

    # ------------------------------------------------------------------------------------------ public API
    def compute_mean_logprobs(self, token_ids: Sequence[Sequence[int]],
                              response_mask: Sequence[Sequence[int]]) -> torch.Tensor:
        """`[N]` m(y) = mean log-prob of the response tokens of each row under the current weights (no grad).

        Called before any update of the step this is m_k,old of algorithm.md §4. Returned on every rank.
        """
        return self._forward_logprobs(self.model, token_ids, response_mask, per_token=False)

    def compute_token_logprobs(self, token_ids: Sequence[Sequence[int]], response_mask: Sequence[Sequence[int]], *,
                               reference: bool = False) -> torch.Tensor:
        """`[N, T]` per-token log-probs (shifted layout: `[n, t]` scores token t + 1; 0 off the response),
        from the policy or (reference=True) the reference model. Returned on every rank."""
        if reference and self.reference is None:
            raise RuntimeError("this trainer keeps no reference model (reference_model=False)")
        model = self.reference if reference else self.model
        on_device = self.reference_offload.on_device() if reference and self.reference_offload else nullcontext()
        with on_device:  # an offloaded reference visits the device for this forward only
            return self._forward_logprobs(model, token_ids, response_mask, per_token=True)

    def _own_old_logprobs(self, rows: TrainingRows) -> TrainingRows:
        """The rows with the learner's own m_old on every row it did not sample (computed now, at the weights the
        step starts from, on the learner's tokens: so the length scale is 1) — other agents' responses pooled into
        one on-policy batch (`naive_onpolicy`, algorithm.md §8)."""
        shared = (~rows.is_own).nonzero().flatten().tolist()
        m_learner = self.compute_mean_logprobs([rows.token_ids[i] for i in shared],
                                               [rows.response_mask[i] for i in shared])
        old, scale = rows.old_mean_logprob.clone(), rows.ratio_length_scale.clone()
        old[shared], scale[shared] = m_learner.to(old), 1.0
        return rows.replace(old_mean_logprob=old, ratio_length_scale=scale)

    def train_step(self, rows: TrainingRows, objective: Objective, step: int) -> TrainMetrics:
        """`M = objective.updates_per_step` optimizer updates over the rows, in order (algorithm.md §6).

        Rows are cut into M consecutive mini-batches; update u uses the stepwise cross clip bound lo_u. When the
        loss needs old token log-probs (token level) and the rows do not carry them, they are computed first, at
        the weights the step starts from (the sampling weights); with β > 0 the reference token log-probs too; and
        under `objective.learner_old_logprob` the learner's own m_old of the other agents' rows.

        Returns the same `TrainMetrics` on every rank (see its fields).
        """
        start = time.perf_counter()
        if objective.kl_coef > 0 and self.reference is None and rows.ref_token_logprobs is None:
            raise ValueError("kl_coef > 0 needs a reference model: build the trainer with reference_model=True")
        lengths = [len(row) - 1 for row in rows.token_ids]
        forward_passes = 0
        if objective.learner_old_logprob and not bool(rows.is_own.all()):
            rows = self._own_old_logprobs(rows)
            forward_passes += 1
        if objective.token_level and rows.old_token_logprobs is None:
            rows = rows.replace(old_token_logprobs=self.compute_token_logprobs(rows.token_ids, rows.response_mask))
            forward_passes += 1
        if objective.kl_coef > 0 and rows.ref_token_logprobs is None:
            rows = rows.replace(ref_token_logprobs=self.compute_token_logprobs(
                rows.token_ids, rows.response_mask, reference=True))
            forward_passes += 1

        scored = scored_token_counts(rows.response_mask)
        keys = [k for k in REDUCTIONS if objective.kl_coef > 0 or k not in ("kl_loss", "kl_mean")]
        step_metrics = MetricAccumulator(keys, token_level=objective.token_level, device=self.device)
        losses, grad_norms, lr, own_ratio_u0, skipped = [], [], math.nan, math.nan, 0
        # per-row outcome of the sequence loss: [ratio, in_window, gradient, seen] × N, rows of this replica only
        outcome = torch.zeros(4, len(rows), dtype=torch.float64, device=self.device) \
            if objective.loss == "sequence" else None
        for update_index, minibatch in enumerate(minibatch_ranges(len(rows), objective.updates_per_step,
                                                                  self.dp_size)):
            num_sequences = len(minibatch)
            normaliser = objective.normaliser(num_sequences, sum(scored[i] for i in minibatch))
            update_metrics = MetricAccumulator(keys, token_level=objective.token_level, device=self.device)
            row_multiple = 1 if self.sequence_packing else self.pad_to_multiple
            batches = [self._micro_batch(training_micro_batch(rows, indices, row_multiple), rows.token_ids)
                       for indices in self._shard_micro_batches(minibatch, lengths)]

            def loss_func(batch: MicroBatch, output: torch.Tensor, u=update_index, d=normaliser, n=num_sequences,
                          acc=update_metrics):
                token_logprobs = self._row_token_logprobs(batch, output)  # [B, S]
                rows_out: dict[str, torch.Tensor] = {}
                loss, metrics = micro_batch_loss(token_logprobs, batch, objective, u, normaliser=d,
                                                 num_sequences=float(n), rows_out=rows_out)
                if outcome is not None and rows_out:
                    index = batch.row_index.to(outcome.device)
                    outcome[:, index] = torch.stack([rows_out["ratio"].to(outcome), rows_out["in_window"].to(outcome),
                                                     rows_out["gradient"].to(outcome),
                                                     torch.ones_like(index, dtype=outcome.dtype)])
                acc.add(metrics)
                step_metrics.add(metrics)
                return loss, torch.tensor(batch.num_rows, dtype=torch.int, device=self.device), {}

            lr = self.current_lr
            self.model.zero_grad_buffer()
            self.optimizer.zero_grad()
            self._run_schedule(self.model, batches, loss_func, forward_only=False)
            update_successful, grad_norm, _ = self.optimizer.step()
            if update_successful:  # (updates_done counts applied updates: it says whether Adam has state to save)
                self.updates_done += 1
                self.scheduler.step(1)
                grad_norms.append(float(grad_norm) if grad_norm is not None else math.nan)
            elif self.config.fp16:  # the loss scaler found an overflow: this update is skipped, the scale lowered
                skipped += 1
            else:
                raise FloatingPointError(f"optimizer update {update_index} of step {step} found inf/NaN gradients")
            step_metrics.end_update()
            reduce_metrics(update_metrics, self.dp_group, self.pp_group, self.pp_last_rank)
            update_result = update_metrics.result()
            losses.append(update_result.get("loss", math.nan))
            if update_index == 0:
                own_ratio_u0 = update_result.get("ratio_mean" if objective.token_level else "own_ratio_mean", math.nan)

        reduce_metrics(step_metrics, self.dp_group, self.pp_group, self.pp_last_rank)
        row_outcome = None
        if outcome is not None:
            outcome = self._share_from_last_stage(outcome).cpu()  # replicas hold disjoint rows
            if not bool(outcome[3].all()):
                raise RuntimeError(f"step {step}: the loss saw {int(outcome[3].sum())} of {len(rows)} rows")
            row_outcome = RowOutcome(ratio=tuple(outcome[0].tolist()), in_window=tuple(bool(v) for v in outcome[1]),
                                     gradient=tuple(bool(v) for v in outcome[2]))
        elapsed = time.perf_counter() - start
        seq_lens = [len(row) for row in rows.token_ids]
        flops = batch_flops(self.arch, seq_lens, backward=True) + forward_passes * batch_flops(
            self.arch, seq_lens, backward=False)
        self.last_step = step
        objective_metrics = step_metrics.result()
        return TrainMetrics(
            loss=objective_metrics.get("loss", math.nan), loss_per_update=tuple(losses),
            grad_norm=sum(grad_norms) / len(grad_norms) if grad_norms else math.nan,
            grad_norm_max=max(grad_norms, default=math.nan), lr=lr,
            step_time_s=elapsed, tokens_per_s=sum(seq_lens) / elapsed,
            tflops_per_gpu=flops / elapsed / dist.get_world_size() / 1e12, own_ratio_u0=own_ratio_u0,
            objective=objective_metrics,
            fp16=FP16Scaling(float(self.optimizer.get_loss_scale()), skipped) if self.config.fp16 else None,
            rows=row_outcome)

    # ----------------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, directory: str, step: int | None = None, digest: str | None = None) -> SavedCheckpoint:
        """Collective: model + optimizer + scheduler + RNG to `directory` (atomic), each rank recording (and with
        `digest` hashing) the files it wrote. See `trainer_checkpoint.py`."""
        from nemo_hacpo.training.trainer_checkpoint import save_checkpoint

        return save_checkpoint(self, directory, step=step, digest=digest)

    def load_checkpoint(self, directory: str) -> dict[str, Any]:
        """Collective: restore what `save_checkpoint` wrote (any TP/PP/DP layout); returns its metadata."""
        from nemo_hacpo.training.trainer_checkpoint import load_checkpoint

        return load_checkpoint(self, directory)

    def close(self) -> None:
        """Release Megatron's model-parallel state and destroy the process groups this trainer created (with NCCL
        their communicators hold GPU memory: ~1.1 GiB per trainer built and closed in one process on an H200,
        issue #38). The agent's world stays: `destroy_distributed`. Safe to call twice."""
        from megatron.core import parallel_state

        from nemo_hacpo.training.distributed import destroy_groups

        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        destroy_groups(getattr(self, "_own_groups", ()))
        self._own_groups = set()


ATTENTION_KINDS = ("auto", "sdpa", "local")
"""The trainer's core attention without Transformer Engine: `auto` (SDPA on CUDA, Megatron's local attention on
CPU), `sdpa` (`training.sdpa_attention`), `local` (Megatron's unfused `DotProductAttention`: the s² scores kept).
With Transformer Engine (CUDA) its own fused attention runs whatever this says."""


def fp8_pad_multiple(agent: AgentConfig) -> int:
    """Micro-batch length multiple FP8 needs: 1 without FP8, 16 with per-tensor FP8, 128 with block scaling."""
    precision = agent.precision
    if precision.fp8 is None:
        return 1
    return 128 if precision.fp8_recipe in ("blockwise", "mxfp8") else 16


def default_pad_multiple(agent: AgentConfig) -> int:
    """Default micro-batch length multiple: FP8's (`fp8_pad_multiple`), times TP under sequence parallelism
    (which splits the sequence over the TP ranks): lcm(fp8 multiple, tp if sequence_parallel else 1)."""
    parallel = agent.parallel
    return math.lcm(fp8_pad_multiple(agent), parallel.tp if parallel.sequence_parallel else 1)

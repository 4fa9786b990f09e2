"""Megatron-core trainer worker: log-prob recompute, micro-batched HACPO/GSPO/GRPO updates, checkpoints.

- :mod:`~nemo_hacpo.training.distributed` — one agent's torch.distributed world (`init_distributed`).
- :mod:`~nemo_hacpo.training.batching` — rows → mini-batches → DP shards → padded, shifted micro-batches.
- :mod:`~nemo_hacpo.training.packing` — padding-free micro-batches: rows packed into one THD sequence and back.
- :mod:`~nemo_hacpo.training.packed_attention` — THD input for Megatron's local spec (CPU), imported lazily.
- :mod:`~nemo_hacpo.training.offload` — the reference model's weights in host memory between its forwards.
- :mod:`~nemo_hacpo.training.objective` — one micro-batch's loss from token log-probs (`nemo_hacpo.algo`).
- :mod:`~nemo_hacpo.training.loss_metrics` — combining loss metrics over micro-batches, replicas and updates.
- :mod:`~nemo_hacpo.training.flops` — model FLOPs for TFLOP/s and MFU.
- :mod:`~nemo_hacpo.training.trainer` — `MegatronTrainer`, one per rank.
- :mod:`~nemo_hacpo.training.trainer_checkpoint` — Megatron distributed checkpoints (atomic, reshardable).

Megatron is imported lazily (inside functions), so importing this package is cheap.
"""

from nemo_hacpo.training.batching import TrainingRows
from nemo_hacpo.training.distributed import destroy_distributed, init_distributed
from nemo_hacpo.training.trainer import MegatronTrainer

__all__ = ["MegatronTrainer", "TrainingRows", "destroy_distributed", "init_distributed"]

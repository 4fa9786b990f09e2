"""Where each agent's vLLM engines run, and how a batch of prompts is split among them (pure functions).

On CUDA with colocated engines (`rollout.colocated: true`), an agent with W trainer ranks and vLLM tensor
parallelism T runs W / T engines: rank r with r % T == 0 owns an engine over the GPUs of ranks r .. r+T−1,
which must sit on one node (vLLM's TP group is intra-node). pair_large: llama70b (W = 32, T = 8) → 4 engines on
ranks 0, 8, 16, 24; qwen8b (W = 8, T = 2) → 4 engines on ranks 0, 2, 4, 6. Engines sleep while their GPUs train.
Every rank receives the full HF weights at refit (`export_hf_weights` gathers on all ranks), so each engine rank
refits its own engine. On CPU one engine (rank 0) serves the agent: engines on CPU compete for the same cores.

A batch of B prompts is cut into contiguous, near-equal slices, one per engine; slice i starting at prompt b0
gets base seed S + b0·n, so every request has the seed it would have had in one call on one engine
(`rollout.sampling.request_seeds`): results do not depend on the number of engines.
"""

from __future__ import annotations

from collections.abc import Sequence


def engine_layout(hosts: Sequence[str], gpu_ids: Sequence[int | None], engine_tp: int,
                  device: str) -> dict[int, list[int]]:
    """`{engine rank: [GPU ids of its engine]}` for one agent (`[]` on CPU: rank 0 only).

    Args:
        hosts, gpu_ids: per trainer rank, its node and its GPU (index among the node's devices).
        engine_tp: vLLM tensor-parallel size.

    Raises:
        ValueError: when T does not divide W, or a TP group would span nodes.
    """
    if device != "cuda":
        return {0: []}
    world = len(hosts)
    if engine_tp < 1 or world % engine_tp:
        raise ValueError(f"rollout.tensor_parallel_size={engine_tp} must divide the agent's {world} trainer ranks "
                         "(colocated engines use the trainer's GPUs)")
    layout = {}
    for first in range(0, world, engine_tp):
        members = range(first, first + engine_tp)
        nodes = {hosts[m] for m in members}
        if len(nodes) != 1:
            raise ValueError(f"the vLLM TP group of ranks {first}..{first + engine_tp - 1} spans nodes {sorted(nodes)}; "
                             "use a rollout.tensor_parallel_size that divides the GPUs per node")
        layout[first] = [int(gpu_ids[m]) for m in members]  # type: ignore[arg-type]
    return layout


def split_batch(num_prompts: int, num_engines: int) -> list[tuple[int, int]]:
    """Contiguous `(start, stop)` slices of near-equal size (the first ones one longer), empty ones dropped.

    >>> split_batch(10, 4)
    [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    if num_engines < 1:
        raise ValueError(f"need at least one engine, got {num_engines}")
    size, extra = divmod(num_prompts, num_engines)
    slices, start = [], 0
    for i in range(num_engines):
        stop = start + size + (i < extra)
        if stop > start:
            slices.append((start, stop))
        start = stop
    return slices

"""Per-agent trainer checkpoints with Megatron's distributed checkpointing (`megatron.core.dist_checkpointing`).

One checkpoint directory holds, for one agent:

    model        `GPTModel.sharded_state_dict()` — global tensors, so a load at another TP/PP/DP layout
                 reassembles and re-slices them (resharding)
    optimizer    `optimizer.sharded_state_dict(model)` — Adam moments keyed by the model's sharded tensors
                 (distributed optimizer: `DISTRIBUTED_OPTIMIZER_FORMATS`, reshardable by default)
    reference    the frozen reference model (only when the trainer keeps one, β > 0)
    scheduler    `OptimizerParamScheduler.state_dict()` (common state, written by rank 0)
    rng          every rank's torch + Megatron-tracker (+ CUDA) RNG states as one `ShardedObject` over
                 (pp, tp, dp): restored only at the same layout (RNG streams do not reshard)
    trainer      update counter and last completed RL step (common state)
    nemo_hacpo_trainer.json   layout, arch and step, readable without torch (written last)

Atomicity: every rank writes into `<dir>.tmp` (cleared first); after a barrier rank 0 writes the JSON
and renames `<dir>.tmp` → `<dir>` (a previous `<dir>` is first moved to `<dir>.old` and deleted after).

File records: right after writing, before the barrier, every rank records the size — and with `digest` the
content digest — of the files it wrote (`training.checkpoint_files`: still in its node's page cache, all ranks
at once); rank 0 gathers them, adds its JSON's, and returns them all in `SavedCheckpoint.files`: what the run
checkpoint's manifest lists, without the driver reading a byte of the shards.
A crash leaves either the old checkpoint or a `.tmp` that the next save clears — never a half-written
`<dir>`. All paths must be on a filesystem every rank of the agent sees.

On CPU/gloo this is the same code path as on GPU: the torch_dist backend (torch.distributed.checkpoint)
works over gloo with CPU tensors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from nemo_hacpo.training.trainer import MegatronTrainer

META_FILE = "nemo_hacpo_trainer.json"
REFERENCE_PREFIX = "reference."  # keeps the reference model's global tensor keys apart from the policy's
DISTRIBUTED_OPTIMIZER_FORMATS = ("fully_reshardable", "dp_reshardable")
"""`agent.optimizer.checkpoint_format`. `fully_reshardable` (default): the distributed optimizer gathers its state
onto DP rank 0 at save time into one tensor per parameter, so any TP/PP/DP layout can load it — with Megatron's
memory-efficient gather (`distrib_optim_fully_reshardable_mem_efficient`: over the gloo DP group, onto DP rank 0
only; its default all-gathers over NCCL through GPU buffers and leaves a full host copy of the state on *every*
DP rank). `dp_reshardable`: every rank writes its own buffer shards, no gather (faster for large models, and no
host copy beyond what each rank writes), reloadable only at the same TP/PP (any DP). Megatron 0.16's third
format, `fully_sharded_model_space`, fails ("ShardedTensor.flattened_range is not supported")."""


def _layout(trainer: MegatronTrainer) -> dict[str, int]:
    parallel = trainer.agent.parallel
    return {"tp": parallel.tp, "pp": parallel.pp, "dp": parallel.dp, "cp": parallel.cp}


def _rng_state() -> dict[str, Any]:
    from megatron.core import tensor_parallel

    state = {"torch": torch.get_rng_state(), "tracker": tensor_parallel.get_cuda_rng_tracker().get_states()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    from megatron.core import tensor_parallel

    torch.set_rng_state(state["torch"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _allocate_distributed_optimizer_state(optimizer) -> None:
    """Give a never-stepped distributed optimizer its Adam state (zeros) without changing any weight.

    Megatron 0.16's `DistributedOptimizer.state_dict()` asserts on an empty state when it runs on
    torch's Adam (no Apex / Transformer Engine: the CPU machines); loading needs that state allocated.
    Megatron's own `_init_optimizer_states_with_dummy_values` steps on zero gradients, which with
    decoupled weight decay would shrink the weights, so it runs at lr 0. The loaded state replaces it.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        if isinstance(inner, DistributedOptimizer) and len(inner.optimizer.state) == 0:
            groups = inner.optimizer.param_groups
            learning_rates = [group["lr"] for group in groups]
            for group in groups:
                group["lr"] = 0.0
            inner._init_optimizer_states_with_dummy_values()
            for group, lr in zip(groups, learning_rates, strict=True):
                group["lr"] = lr


@contextlib.contextmanager
def _keep_restored_adam_step(optimizer) -> Iterator[None]:
    """Work around Megatron 0.16 bugs on torch's Adam (no Apex / Transformer Engine) around a load.

    torch's Adam keeps a per-parameter `step` in its state. `load_state_dict` restores it from the param
    groups, then the `fully_reshardable` loader hands `_set_main_param_and_optimizer_states` the saved
    tensors without `step` (it skips it on purpose) and that method copies *every* state key:
    `KeyError: 'step'`. The `dp_reshardable` loader does hand it a `step`, but not the saved one: the 0-dim
    per-parameter step is not restored from the shards, and the placeholder (the dummy state's 1) comes back
    (measured: 2 updates saved, 1 loaded — a wrong Adam bias correction after a resume). Here the step
    `load_state_dict` restored from the param groups is passed along in both cases (a copy onto itself);
    nothing else changes.

    The `dp_reshardable` loader (`load_parameter_state_from_dp_reshardable`) calls the same method outside
    `torch.no_grad()`, and its in-place copy into the fp32 main parameter — a view of a leaf that requires grad —
    raises "a view of a leaf Variable that requires grad is being used in an in-place operation" (found by
    tests/integration/training/test_trainer_checkpoint.py); the copy runs under `no_grad` here.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    patched = []
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        if not isinstance(inner, DistributedOptimizer):
            continue
        original = inner._set_main_param_and_optimizer_states

        def set_states(model_param, tensors, _inner=inner, _original=original):
            group_index, group_order = _inner.model_param_group_index_map[model_param]
            main_param = _inner.optimizer.param_groups[group_index]["params"][group_order]
            state = _inner.optimizer.state.get(main_param, {})
            if "step" in state:  # the param groups' step, restored by load_state_dict before this call
                tensors = {**tensors, "step": state["step"]}
            with torch.no_grad():
                return _original(model_param, tensors)

        inner._set_main_param_and_optimizer_states = set_states
        patched.append(inner)
    try:
        yield
    finally:
        for inner in patched:
            del inner._set_main_param_and_optimizer_states  # back to the class's method
        for inner in patched:
            _unshare_adam_steps(inner.optimizer)


def _unshare_adam_steps(torch_optimizer) -> None:
    """Second Megatron 0.16 bug on the same path: `DistributedOptimizer.load_state_dict` puts *one* `step`
    tensor into every parameter's state; torch's Adam increments each parameter's step in place, so the
    shared counter would advance once per parameter per update (wrong bias correction after a resume)."""
    for state in torch_optimizer.state.values():
        if isinstance(state.get("step"), torch.Tensor):
            state["step"] = state["step"].clone()


def sharded_trainer_state(trainer: MegatronTrainer, *, is_loading: bool, with_rng: bool = True,
                          with_optimizer: bool = True, optimizer_format: str = "fully_reshardable") -> dict[str, Any]:
    """The sharded state dict of a trainer rank (the module docstring lists the parts).

    `with_optimizer=False` leaves the optimizer out (a trainer that never updated has no optimizer state
    worth saving: a fresh optimizer is the same thing).
    """
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    if optimizer_format not in DISTRIBUTED_OPTIMIZER_FORMATS:
        raise ValueError(f"optimizer_format must be one of {DISTRIBUTED_OPTIMIZER_FORMATS}, got {optimizer_format!r}")

    model_state = trainer.module.sharded_state_dict()
    state: dict[str, Any] = {"model": model_state}
    if with_optimizer:
        if is_loading:
            _allocate_distributed_optimizer_state(trainer.optimizer)
        state["optimizer"] = trainer.optimizer.sharded_state_dict(
            model_state, is_loading=is_loading, metadata={"distrib_optim_sharding_type": optimizer_format,
                                                          "distrib_optim_fully_reshardable_mem_efficient": True})
    state |= {
        "scheduler": trainer.scheduler.state_dict(),
        "trainer": {"updates_done": trainer.updates_done, "last_step": trainer.last_step},
    }
    if trainer.reference is not None:
        state["reference"] = trainer.reference.sharded_state_dict(prefix=REFERENCE_PREFIX)
    if with_rng:
        layout = _layout(trainer)
        state["rng"] = ShardedObject(
            "rng_state", _rng_state(), (layout["pp"], layout["tp"], layout["dp"]),
            (trainer.pp_rank, trainer.tp_rank, trainer.dp_rank), replica_id=0)
    return state


def _barrier() -> None:
    dist.barrier()


def release_host_cache() -> bool:
    """Hand torch's cached pinned host blocks back to the OS (CUDA only; returns whether it did).

    torch's CachingHostAllocator keeps every freed pinned block for reuse and never returns it by itself
    (`torch/include/ATen/core/CachingHostAllocator.h`). A save meets two sets of them: the optimizer offload's
    buffers (`training.memory`), freed into the cache when the state came back to the GPU for the save, and the
    writer's own pinned copies (torch_dist moves each tensor it writes with `.to("cpu", non_blocking=True)`,
    which pins the destination). Emptying the cache before and after the write keeps the two from adding up.
    """
    if not torch.cuda.is_available():
        return False
    torch._C._host_emptyCache()
    return True


def checkpoint_format(trainer: MegatronTrainer) -> str:
    """The agent's `optimizer.checkpoint_format` (`fully_reshardable` for configs that predate it)."""
    return getattr(trainer.agent.optimizer, "checkpoint_format", "fully_reshardable")


@dataclasses.dataclass(frozen=True)
class SavedCheckpoint:
    """What `save_checkpoint` returns on each rank."""

    path: str
    own: dict[str, dict[str, Any]]
    """The files this rank wrote: relative name → `{"bytes"[, "digest"]}` (`training.checkpoint_files`)."""
    files: dict[str, dict[str, Any]]
    """Rank 0: every file of the checkpoint, as its writer recorded it; {} on the other ranks."""


def save_checkpoint(trainer: MegatronTrainer, directory: str | Path, *, step: int | None = None,
                    optimizer_format: str | None = None, digest: str | None = None) -> SavedCheckpoint:
    """Collective over the agent's ranks: write the trainer state to `directory` atomically.

    `optimizer_format` matters only with the distributed optimizer (`DISTRIBUTED_OPTIMIZER_FORMATS`; None: the
    agent's `optimizer.checkpoint_format`). `digest`: the algorithm (`blake3`, `sha256`) of the content digests
    each rank computes of its own files (None: sizes only). On CUDA the host cache is released before and after
    the write (`release_host_cache`). Returns the path and the file records (module docstring).
    """
    from megatron.core import dist_checkpointing

    from nemo_hacpo.training.checkpoint_files import bytes_record, digest_files, own_files

    optimizer_format = optimizer_format or checkpoint_format(trainer)
    final = Path(directory).resolve()
    staging = final.with_name(final.name + ".tmp")
    is_writer = dist.get_rank() == 0
    if is_writer:
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir(parents=True)
    _barrier()
    release_host_cache()
    state = sharded_trainer_state(trainer, is_loading=False, with_optimizer=trainer.updates_done > 0,
                                  optimizer_format=optimizer_format)
    dist_checkpointing.save(state, str(staging))
    del state  # the gathered host copies (fully_reshardable on DP rank 0) go before the cache is released
    release_host_cache()
    own = digest_files(staging, own_files(staging, dist.get_rank()), digest)  # this rank's files, just written
    _barrier()
    if is_writer:
        meta = {"layout": _layout(trainer), "step": step if step is not None else trainer.last_step,
                "updates_done": trainer.updates_done, "agent": trainer.agent.name,
                "arch": dataclasses.asdict(trainer.arch), "optimizer_format": optimizer_format,
                "distributed_optimizer": trainer.agent.optimizer.use_distributed_optimizer,
                "has_reference": trainer.reference is not None}
        meta_text = json.dumps(meta, indent=2, default=str).encode()
        (staging / META_FILE).write_bytes(meta_text)
        own[META_FILE] = bytes_record(meta_text, digest)
        previous = final.with_name(final.name + ".old")
        if final.exists():
            if previous.exists():
                shutil.rmtree(previous)
            final.rename(previous)
        staging.rename(final)
        if previous.exists():
            shutil.rmtree(previous)
    parts: list[Any] = [None] * dist.get_world_size() if is_writer else []
    dist.gather_object(own, parts if is_writer else None, dst=0)
    files = {name: record for part in parts for name, record in part.items()} if is_writer else {}
    _barrier()  # every rank returns once the checkpoint is in place
    return SavedCheckpoint(str(final), own, files)


def read_checkpoint_meta(directory: str | Path) -> dict[str, Any]:
    """The JSON written with a checkpoint (layout, step, arch); raises if `directory` is not a complete one."""
    path = Path(directory) / META_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory} is not a complete nemo_hacpo trainer checkpoint (no {META_FILE})")
    return json.loads(path.read_text())


def load_checkpoint(trainer: MegatronTrainer, directory: str | Path) -> dict[str, Any]:
    """Collective: restore model, optimizer, scheduler, reference model and (same layout only) RNG states.

    The trainer may use another TP/PP/DP layout than the one that saved (resharding by
    dist_checkpointing); the architecture and the optimizer kind (distributed or not: Megatron's two
    state formats do not convert) must be the same. The reference model is restored when both the
    checkpoint and the trainer have one; otherwise the trainer's is left as it is (`sync_reference()`
    makes it the loaded policy). Returns the checkpoint's metadata.
    """
    from megatron.core import dist_checkpointing

    meta = read_checkpoint_meta(directory)
    saved_arch = meta["arch"]
    current_arch = json.loads(json.dumps(dataclasses.asdict(trainer.arch), default=str))
    if saved_arch != current_arch:
        changed = sorted(k for k in set(saved_arch) | set(current_arch) if saved_arch.get(k) != current_arch.get(k))
        raise ValueError(f"checkpoint {directory} was saved for another architecture (differs in {changed})")
    with_optimizer = meta["updates_done"] > 0
    if with_optimizer and meta["distributed_optimizer"] != trainer.agent.optimizer.use_distributed_optimizer:
        raise ValueError(f"checkpoint {directory} holds {'distributed' if meta['distributed_optimizer'] else 'plain'}"
                         " optimizer state; set optimizer.use_distributed_optimizer to "
                         f"{meta['distributed_optimizer']} to resume from it")
    same_layout = meta["layout"] == _layout(trainer)
    with_reference = meta["has_reference"] and trainer.reference is not None
    state = sharded_trainer_state(trainer, is_loading=True, with_rng=same_layout, with_optimizer=with_optimizer,
                                  optimizer_format=meta["optimizer_format"])
    if not with_reference:
        state.pop("reference", None)
    loaded = dist_checkpointing.load(state, str(Path(directory).resolve()))
    trainer.module.load_state_dict(loaded["model"], strict=True)
    if with_optimizer:
        with _keep_restored_adam_step(trainer.optimizer):
            trainer.optimizer.load_state_dict(loaded["optimizer"])
    else:
        trainer.optimizer.reload_model_params()  # FP32 main copies (BF16 training) follow the loaded weights
    trainer.scheduler.load_state_dict(loaded["scheduler"])
    if with_reference:
        reference_state = {k.removeprefix(REFERENCE_PREFIX): v for k, v in loaded["reference"].items()}
        trainer.reference.load_state_dict(reference_state, strict=True)
    trainer.updates_done = loaded["trainer"]["updates_done"]
    trainer.last_step = loaded["trainer"]["last_step"]
    if same_layout:
        _set_rng_state(loaded["rng"])
    return meta

"""The trainer ranks that share one engine's devices, as a process group of their own, and the order in which the
engine's memory changes among them.

A colocated CUDA engine of tensor-parallel size T runs on the GPUs of trainer ranks r .. r+T−1
(`runtime.placement`): those T ranks — the engine's TP group, its first rank the one that owns the engine — share
every byte of those GPUs with it. A sleep, a wake or a start of the engine is therefore an event on T GPUs, not on
one rank: vLLM's `Worker.sleep` measures the GPU's free memory before and after and asserts that it did not
shrink, and a wake maps tens of GiB that the other ranks must have given back first. Every such transition runs
alone on the group's GPUs:

    every member: release cached memory → barrier → engine rank: sleep / wake → exchange (a barrier that also
    says whether the engine's call failed)

and the members allocate again (restore the optimizer state, export, run a forward pass) only after it.
`EngineGroup.transition` is that protocol; `hand_over` is its first half, for transitions whose closing barrier is
the driver's wait for every rank's call (generation, the engine's start: no rank waits in a collective while an
engine generates or loads for minutes).

`settle` is how a failure on one member reaches the others within one exchange instead of leaving them in a
barrier until the collective timeout (30 min): every member contributes its error (or none) to an all-gather over
the group; if any failed, each raises — the failed one its own error, the others `PeerFailure` naming the rank.

    group = EngineGroup.create(rank, world, engine_tp, device)     # collective over the agent (every group)
    group.transition(engine, lambda e: e.sleep(1), release, "sleep")
    group.hand_over(release)
    group.settle(error, "refit bucket 3")

The group is gloo (only metadata crosses it) and is the one the staged refit gathers its handles over
(`rollout.refit.StagedRefit`): one group per engine, created once per rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class PeerFailure(RuntimeError):
    """Raised on a rank whose own part of a collective call succeeded because another rank of its engine group
    failed; the message names that rank and its error (the driver blames the rank that failed, not this one)."""


def engine_groups(world: int, engine_tp: int, device: str) -> list[list[int]]:
    """The trainer ranks that share each engine's devices (the first is the engine rank).

    CUDA, colocated: W / T groups of T consecutive ranks (`runtime.placement.engine_layout`). CPU: one engine on
    rank 0, shared by ranks 0 .. min(T, W) − 1 (its T workers read the buffers of these ranks in turn).
    """
    if engine_tp < 1:
        raise ValueError(f"engine tensor parallelism must be ≥ 1, got {engine_tp}")
    if device == "cuda":
        if world % engine_tp:
            raise ValueError(f"engine TP {engine_tp} does not divide the agent's {world} trainer ranks")
        return [list(range(first, first + engine_tp)) for first in range(0, world, engine_tp)]
    return [list(range(min(engine_tp, world)))]


def describe_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


@dataclass(frozen=True)
class EngineGroup:
    """This rank's engine group: `members` (global ranks, the engine rank first; empty for a rank outside every
    group — CPU, W > T) and their gloo process group `pg`."""

    rank: int
    members: tuple[int, ...] = ()
    pg: Any = None

    @classmethod
    def create(cls, rank: int, world: int, engine_tp: int, device: str) -> EngineGroup:
        """Collective over the agent's world: every rank creates every engine's group, in the same order (torch's
        rule for `new_group`), and keeps its own."""
        import torch.distributed as dist

        mine = cls(rank)
        for members in engine_groups(world, engine_tp, device):
            pg = dist.new_group(members, backend="gloo")
            if rank in members:
                mine = cls(rank, tuple(members), pg)
        return mine

    @property
    def engine_rank(self) -> int | None:
        return self.members[0] if self.members else None

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.members:
            dist.barrier(group=self.pg)

    def settle(self, error: BaseException | None, what: str) -> None:
        """Collective over the group: raise on every member if any member failed `what` (`error` is this rank's
        failure or None). The failed rank raises its own error, the others `PeerFailure` naming it."""
        import torch.distributed as dist

        if self.members:
            reports: list[Any] = [None] * len(self.members)
            dist.all_gather_object(reports, None if error is None else describe_error(error), group=self.pg)
        else:
            reports = []
        if error is not None:
            raise error
        failed = [(rank, report) for rank, report in zip(self.members, reports, strict=True) if report is not None]
        if failed:
            rank, report = failed[0]
            raise PeerFailure(f"rank {self.rank}: stopped {what} because rank {rank} of its engine group "
                              f"{list(self.members)} failed: {report}")

    def hand_over(self, release: Callable[[], None]) -> None:
        """Every member gives back its cached memory (`release`), then waits for the others: what follows on the
        engine rank (a wake, a start) finds the group's GPUs released. The closing barrier is the caller's."""
        release()
        self.barrier()

    def transition(self, engine: Any, change: Callable[[Any], None] | None, release: Callable[[], None],
                   what: str) -> None:
        """Collective over the group: `change(engine)` on the engine rank (`engine` is None elsewhere; `change`
        None: no change this time, the group still synchronises), alone on the group's GPUs — every member has
        released before it begins and none allocates before it ended. A failure of the change reaches every
        member at the closing exchange (`settle`)."""
        self.hand_over(release)
        error = None
        if engine is not None and change is not None:
            try:
                change(engine)
            except Exception as err:  # noqa: BLE001 - every member must hear of it (settle re-raises it here)
                error = err
        self.settle(error, what)

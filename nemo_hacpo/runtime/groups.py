"""Ray side of the runtime: the cluster, and one worker group (one actor per rank) per agent.

Each agent's ranks are placed by a Ray placement group on that agent's own resources (one bundle per rank:
a GPU on CUDA, a CPU slot otherwise), form their own torch.distributed world (rendezvous at rank 0's node)
and hold their own Megatron `parallel_state`. A failure in any actor stops the job with the agent and the
rank named (`WorkerFailure`); nothing is retried silently.

Every call across the boundary is a typed method of `AgentGroup` that returns a `Pending[T]`; several agents'
calls are started before any is waited for, so agents work concurrently:

    pending = {name: group.generate(prompts, G) for name, group in groups.items()}
    results = {name: p.result() for name, p in pending.items()}       # GenerationResult per agent

Large arguments (a learner's rows, a generation) are put into Ray's object store once and every rank reads the
same object; results come back from one rank (rank 0, or the engine ranks for generation).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from nemo_hacpo.algo.rows import TrainingRows
from nemo_hacpo.config import AgentConfig, HacpoConfig
from nemo_hacpo.rollout.engine_group import PeerFailure
from nemo_hacpo.rollout.outputs import GenerationResult, RefitStats
from nemo_hacpo.runtime.rank_process import TRAINER_ENVIRONMENT, rank_log_file
from nemo_hacpo.runtime.worker import AgentRank, OldLogprobs, RankInfo
from nemo_hacpo.training.loss_metrics import TrainMetrics
from nemo_hacpo.training.objective import Objective

logger = logging.getLogger(__name__)
_RELEASE_WAIT_S = 5.0  # the longest a shutdown waits for Ray to confirm a placement group is released

T = TypeVar("T")


class WorkerFailure(RuntimeError):
    """An agent's worker failed; the message names the agent, the rank and the call."""


def ranks_by_node(bundle_nodes: dict[int, str]) -> list[int]:
    """The bundle of each rank: bundles grouped by node (nodes in the order of their first bundle), in bundle
    order within a node. `bundle_nodes`: Ray's `bundles_to_node_id` of a placement group."""
    first_bundle: dict[str, int] = {}
    for bundle in sorted(bundle_nodes):
        first_bundle.setdefault(bundle_nodes[bundle], bundle)
    return sorted(bundle_nodes, key=lambda bundle: (first_bundle[bundle_nodes[bundle]], bundle))


@dataclass(frozen=True)
class Placement:
    """An agent's reserved Ray placement group, and where each of its ranks goes."""

    group: Any
    bundle_of_rank: list[int]
    """Rank r runs in bundle `bundle_of_rank[r]` (`ranks_by_node`)."""
    node_of_rank: list[str]
    """The Ray node id of each rank's bundle."""


def reserve_placement(agent: AgentConfig, device: str, gpus_per_rank: float = 1.0,
                      timeout_s: float = 600.0) -> Placement:
    """Reserve one bundle per rank of `agent` (PACK), and decide which rank goes to which bundle: ranks node by
    node, so that a tensor-parallel group of consecutive ranks (and a vLLM TP group) never straddles two nodes."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    world = agent.parallel.world_size
    bundles = [{"CPU": 1, "GPU": gpus_per_rank} if device == "cuda" else {"CPU": 1} for _ in range(world)]
    group = placement_group(bundles, strategy="PACK", name=f"hacpo-{agent.name}")
    try:
        ray.get(group.ready(), timeout=timeout_s)
        nodes = placement_group_table(group)["bundles_to_node_id"]
    except BaseException as err:  # a timeout, or a stop signal while waiting: leave no half-reserved group behind
        remove_placement_group(group)
        if not isinstance(err, ray.exceptions.GetTimeoutError):
            raise
        have = ray.available_resources()
        raise WorkerFailure(
            f"agent {agent.name!r}: Ray could not reserve {world} bundle(s) of {bundles[0]} within "
            f"{timeout_s:.0f} s (free now: {have.get('GPU', 0):g} GPU, {have.get('CPU', 0):g} CPU); "
            "are enough nodes in the Ray cluster, and is another agent or job holding them?") from err
    order = ranks_by_node(nodes)
    return Placement(group, order, [nodes[bundle] for bundle in order])


def release_placements(placements: Sequence[Placement]) -> None:
    """Give back reserved placement groups that no `AgentGroup` owns (a start that failed half-way)."""
    from ray.util.placement_group import remove_placement_group

    for placement in placements:
        try:
            remove_placement_group(placement.group)
        except Exception:  # noqa: BLE001 - best effort: Ray frees them with the driver anyway
            logger.warning("could not release a placement group", exc_info=True)


def engine_cpu_slots(engine_nodes: list[str]) -> list[tuple[int, int]]:
    """CPU engines share their node's cores: `(slot, slots)` of each agent's engine among the engines on its node
    (`engine_nodes[i]`: the node of agent i's engine rank), in agent order.

    engine_cpu_slots(["a", "b", "a"]) == [(0, 2), (0, 1), (1, 2)]
    """
    per_node = {node: [i for i, n in enumerate(engine_nodes) if n == node] for node in engine_nodes}
    return [(per_node[node].index(i), len(per_node[node])) for i, node in enumerate(engine_nodes)]


def ray_environment(device: str) -> dict[str, str]:
    """Environment of every Ray worker: offline hubs, quiet tokenizers and vLLM, one OpenMP thread per CPU rank
    (oversubscribed OpenMP pools make a TP=2 CPU step ~10x slower)."""
    env = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONWARNINGS": "ignore"}
    if device == "cpu":
        env["OMP_NUM_THREADS"] = "1"
    return env


class _QuietTokenNotice(logging.Filter):
    """Drops Ray's start-up notice that token authentication is on (printed at every `ray.init`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Token authentication is enabled" not in record.getMessage()


def start_ray(cfg: HacpoConfig) -> None:
    """Join `runtime.cluster.ray_address`, or start a local Ray with enough logical CPUs for every rank.

    A local Ray installs its own SIGTERM handler, which kills Ray's processes at once — the actors' vLLM engine
    processes are then orphaned and live on for a minute or more. A handler the caller installed before (the
    training loop's, which shuts the engines down first) is put back; Ray's processes still go at exit.
    """
    import ray

    if ray.is_initialized():
        return
    for name in ("ray", "ray._private.authentication.authentication_token_setup"):
        logging.getLogger(name).addFilter(_QuietTokenNotice())
    in_main = threading.current_thread() is threading.main_thread()
    caller_handler = signal.getsignal(signal.SIGTERM) if in_main else None
    cluster = cfg.runtime.cluster
    env = {"env_vars": ray_environment(cluster.device)}
    if cluster.ray_address:
        ray.init(address=cluster.ray_address, runtime_env=env, logging_level="WARNING")
    else:
        ranks = sum(agent.parallel.world_size for agent in cfg.agents)
        ray.init(num_cpus=max(ranks, os.cpu_count() or 1),
                 num_gpus=cluster.gpus_per_node if cluster.device == "cuda" else 0,
                 include_dashboard=False, runtime_env=env, logging_level="WARNING")
    if callable(caller_handler):
        signal.signal(signal.SIGTERM, caller_handler)


class Pending(Generic[T]):
    """A started call on some of an agent's ranks; `result()` waits (naming a failed or hung rank) and combines
    the ranks' answers into one `T`."""

    def __init__(self, group: AgentGroup, futures: Sequence[Any], what: str, ranks: Sequence[int] | None,
                 combine: Callable[[list[Any]], T]):
        self.group, self.futures, self.what, self.ranks, self.combine = group, list(futures), what, ranks, combine

    def result(self) -> T:
        return self.combine(self.group.get(self.futures, self.what, self.ranks))


def _first(results: list[Any]) -> Any:
    """Rank 0's answer (collective calls return theirs on rank 0 only)."""
    return results[0]


def _nothing(results: list[Any]) -> None:
    return None


class AgentGroup:
    """The Ray actors of one agent, rank r in `actors[r]`, and the typed calls the driver makes on them."""

    def __init__(self, agent: AgentConfig, *, seed: int, run_dir: str, total_updates: int, device: str,
                 keep_reference: bool, init_weights: str | None = None, start_engine: bool = True,
                 resume_from: str | None = None, call_timeout_s: float = 3600.0, collective_timeout_s: float = 1800.0,
                 gpus_per_rank: float = 1.0, placement_timeout_s: float = 600.0, log_dir: str | None = None,
                 engine_cpu_slot: tuple[int, int] | None = None, placement: Placement | None = None):
        """`keep_reference`: the ranks keep the frozen reference model of a KL term (β > 0).
        `gpus_per_rank` < 1 lets several agents share a GPU (one-GPU benchmarks); clusters use 1.
        `placement_timeout_s`: how long to wait for Ray to reserve the agent's resources.
        `log_dir`: each rank's process output goes to `<log_dir>/<agent>_rank<r>.log` (None: to Ray's logs).
        `engine_cpu_slot` = (slot, slots) on CPU: the agent's engine takes share `slot` of its node's cores
        (`engine_cpu_slots`, `rollout.settings.engine_cpu_cores`); None leaves vLLM's binding.
        `placement`: the agent's placement group, reserved already (`reserve_placement`; None: reserved here)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.agent = agent
        self.keep_reference = keep_reference
        self.seed = seed
        self.call_timeout_s = call_timeout_s
        world = agent.parallel.world_size
        on_gpu = device == "cuda"
        # on GPU every actor sees its node's devices (it picks its own from ray.get_gpu_ids()), so a rank can
        # hand the GPUs of its vLLM TP group to its engine (runtime.placement); the trainer's own variables
        # (rank_process.TRAINER_ENVIRONMENT) are the ranks' alone: their engines are spawned without them
        env_vars = dict(TRAINER_ENVIRONMENT) | ({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"} if on_gpu else {})
        runtime_env = {"env_vars": env_vars}
        placed = placement or reserve_placement(agent, device, gpus_per_rank, placement_timeout_s)
        self.placement = placed.group
        bundle_of_rank = placed.bundle_of_rank
        actor_cls = ray.remote(AgentRank)
        self.actors = [
            actor_cls.options(
                num_cpus=1, num_gpus=gpus_per_rank if on_gpu else 0, name=f"hacpo-{agent.name}-rank{rank}",
                runtime_env=runtime_env,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.placement, placement_group_bundle_index=bundle_of_rank[rank]),
            ).remote(agent, rank, seed=seed, run_dir=run_dir, total_updates=total_updates,
                     keep_reference=keep_reference, collective_timeout_s=collective_timeout_s, log_dir=log_dir,
                     engine_cpu_slot=engine_cpu_slot)
            for rank in range(world)
        ]
        self.log_dir = log_dir
        self.info: list[RankInfo] = []
        try:
            master_addr, master_port = self.get([self.actors[0].address.remote()], "address")[0]
        except WorkerFailure:
            self.shutdown(timeout_s=5.0)  # release the actors and the placement group before reporting
            raise
        self._setup = [a.setup.remote(master_addr, master_port, init_weights, start_engine, resume_from)
                       for a in self.actors]

    def environment(self, names: list[str]) -> list[dict[str, Any]]:
        """Per rank, these environment variables as the rank and its engine's processes see them
        (`AgentRank.environment`)."""
        return self.get([a.environment.remote(names) for a in self.actors], "environment")

    def wait_ready(self) -> list[RankInfo]:
        """Wait for `setup` (started by the constructor, so several agents start their engines at once)."""
        if not self.info:
            self.info = self.get(self._setup, "setup")
        return self.info

    @property
    def engine_ranks(self) -> list[int]:
        """Ranks that own a vLLM engine (rank 0 on CPU; one per vLLM TP group on CUDA)."""
        ranks = [info.rank for info in self.wait_ready() if info.engine is not None]
        if not ranks:
            raise WorkerFailure(f"agent {self.agent.name!r} has no rollout engine (started without engines)")
        return ranks

    # -------------------------------------------------------------------------------------- typed calls
    def generate(self, prompts: list[list[dict]], n: int, *, greedy: bool = False, seed: int | None = None,
                 sleep_after: bool = False, what: str = "generate") -> Pending[GenerationResult]:
        """G = n responses per prompt: every engine takes a contiguous slice of the prompts with the seeds a single
        engine would use (`runtime.placement.split_batch`); the result is merged in prompt order. Every rank is
        called: the ranks that share an engine's GPUs hand them over before it wakes (`AgentRank.generate`)."""
        from nemo_hacpo.rollout.sampling import SEED_MODULUS
        from nemo_hacpo.runtime.placement import split_batch

        slices = dict(zip(self.engine_ranks, split_batch(len(prompts), len(self.engine_ranks)), strict=False))
        futures = []
        for rank, actor in enumerate(self.actors):
            if rank in slices:
                start, stop = slices[rank]
                slice_seed = None if seed is None else (seed + start * n) % SEED_MODULUS
                futures.append(actor.generate.remote(prompts[start:stop], n, greedy, slice_seed, sleep_after))
            else:  # no engine here, or no prompts left for it: the hand-over only
                futures.append(actor.generate.remote(None, n, greedy, None, sleep_after))
        used = sorted(slices)
        return Pending(self, futures, what, None, lambda results: GenerationResult.merge([results[r] for r in used]))

    def old_logprobs(self, generation: GenerationResult, with_tokens: bool = False) -> Pending[OldLogprobs]:
        """m_old of the agent's own responses (and the trainer↔sampler mismatch); see `AgentRank.old_logprobs`."""
        shared = _put(generation)
        return Pending(self, [a.old_logprobs.remote(shared, with_tokens) for a in self.actors], "old_logprobs",
                       None, _first)

    def train(self, rows: TrainingRows, objective: Objective, step: int) -> Pending[TrainMetrics]:
        """`objective.updates_per_step` optimizer updates over the learner's rows."""
        shared = _put(rows)
        return Pending(self, [a.train.remote(shared, objective, step) for a in self.actors], "train", None, _first)

    def refit(self) -> Pending[RefitStats]:
        """The trainer's weights into the agent's engines."""
        return Pending(self, [a.refit.remote() for a in self.actors], "refit", None, _first)

    def save_checkpoint(self, directory: str, step: int, digest: str | None = None
                        ) -> Pending[dict[str, dict[str, Any]]]:
        """Every rank's trainer state into `directory` (Megatron distributed checkpoint). The result: every file
        written, relative to `directory` → `{"bytes"[, "digest"]}`, recorded (and with `digest`, hashed) by the
        rank that wrote it (`training.checkpoint_files`)."""
        return Pending(self, [a.save.remote(directory, step, digest) for a in self.actors], "save", None, _first)

    def save_hf(self, directory: str, release_engine: bool = False) -> Pending[None]:
        """The current weights as an HF checkpoint (+ tokenizer) in `directory`; `release_engine`: a colocated
        engine sleeps for good first (the end of the run, `AgentRank.save_hf`)."""
        return Pending(self, [a.save_hf.remote(directory, release_engine) for a in self.actors], "save_hf", None,
                       _nothing)

    def sft(self, prompts: list[list[dict]] | None, solutions: list[str] | None, steps: int, batch_size: int,
            seed: int, first_step: int = 0) -> Pending[list[float]]:
        """Supervised warm-start steps (see `AgentRank.sft`); the NLL of each step."""
        data = (_put(prompts), _put(solutions)) if prompts is not None else (None, None)
        return Pending(self, [a.sft.remote(*data, steps, batch_size, seed, first_step) for a in self.actors], "sft",
                       None, _first)

    # ---------------------------------------------------------------------------------------------- calls
    def get(self, futures: Sequence[Any], what: str, ranks: Sequence[int] | None = None,
            timeout_s: float | None = None) -> list[Any]:
        """`ray.get` that names the agent and rank of a failure, and gives up on a hung rank.

        All futures share one deadline (`timeout_s`, default `runtime.call_timeout_s`): the ranks that have not
        answered by then are reported as hung. A failure is reported as soon as any rank's call fails, whichever
        rank it is (the others may be blocked in a collective with it); since one death makes its peers fail
        too, the report waits a few seconds for them and names a dead actor (killed process, lost node) first.
        """
        import ray

        ranks = list(range(len(futures))) if ranks is None else list(ranks)
        if len(ranks) != len(futures):
            raise ValueError(f"{len(futures)} futures but {len(ranks)} ranks")
        limit = self.call_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        pending = {future: (i, rank) for i, (rank, future) in enumerate(zip(ranks, futures, strict=True))}
        results: list[Any] = [None] * len(futures)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                hung = sorted(rank for _, rank in pending.values())
                label = f"rank {hung[0]}" if len(hung) == 1 else f"ranks {', '.join(map(str, hung))}"
                raise WorkerFailure(f"agent {self.agent.name!r} {label} did not finish {what} within {limit:.0f} s "
                                    f"(hung; see runtime.call_timeout_s){self._log_hint(hung[0])}")
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=remaining)
            for future in ready:
                index, rank = pending.pop(future)
                try:
                    results[index] = ray.get(future)
                except Exception as err:  # RayTaskError / RayActorError wrap the worker's exception
                    raise self._failure(what, rank, err, pending)  # noqa: B904 - its cause is the culprit's error
        return results

    def _log_hint(self, rank: int) -> str:
        if self.log_dir is None:
            return ""
        return f" [its output: {rank_log_file(self.log_dir, self.agent.name, rank)}]"

    def _failure(self, what: str, rank: int, err: Exception, pending: dict[Any, tuple[int, int]],
                 grace_s: float = 5.0) -> WorkerFailure:
        """The report of a failed call: the dead rank if any of the failures is a dead actor, else `rank` — unless
        `rank` only stopped because a peer of its engine group failed (`PeerFailure`): then that peer."""
        import ray

        failures = {rank: err}
        if pending:  # give the peers of a collective a moment to fail as well, then pick the culprit
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=grace_s)
            for future in ready:
                try:
                    ray.get(future)
                except Exception as other:  # noqa: BLE001 - collected for the report
                    failures[pending[future][1]] = other
        dead = [r for r, e in sorted(failures.items()) if isinstance(e, ray.exceptions.RayActorError)]
        # a rank that raised PeerFailure only stopped because another rank of its engine group had failed
        failed_itself = [r for r, e in sorted(failures.items()) if not isinstance(e, PeerFailure)]
        if dead:
            culprit = dead[0]
        elif isinstance(err, PeerFailure) and failed_itself:
            culprit = failed_itself[0]
        else:
            culprit = rank
        others = sorted(r for r in failures if r != culprit)
        also = f" (rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} failed too)" if others else ""
        cause = failures[culprit]
        failure = WorkerFailure(f"agent {self.agent.name!r} rank {culprit} failed in {what}: "
                                f"{type(cause).__name__}: {cause}{also}{self._log_hint(culprit)}")
        failure.__cause__, failure.__suppress_context__ = cause, True
        return failure

    def shutdown(self, timeout_s: float = 120.0) -> None:
        """Stop the engines and process groups cleanly (up to `timeout_s`), kill the actors, release the
        placement group. `HacpoRun.close` runs the same three phases for all its groups at once."""
        deadline = time.monotonic() + timeout_s
        self.finish_shutdown(self.start_shutdown(), deadline)
        wait_released([self.release_placement()], deadline)

    def start_shutdown(self) -> list[Any]:
        """Ask every rank to stop its engine and process groups; the pending calls, for `finish_shutdown`.
        Separate so that a run stops all its groups at once, within one deadline (a scheduler's stop leaves
        seconds, not minutes, before it kills the job)."""
        return [actor.shutdown.remote() for actor in self.actors]

    def finish_shutdown(self, pending: list[Any], deadline: float) -> None:
        """Wait for the clean shutdown until `deadline` (`time.monotonic()`), then kill the actors. A rank that
        fails or runs out of time is logged, not raised."""
        import ray

        for rank, future in enumerate(pending):  # each rank on its own: a dead one must not cut the others short
            try:
                ray.get(future, timeout=max(deadline - time.monotonic(), 0.0))
            except Exception as err:  # noqa: BLE001 - shutting down after a failure must not hide it
                logger.warning("agent %s rank %d: clean shutdown failed (%s: %s)", self.agent.name, rank,
                               type(err).__name__, err)
        for actor in self.actors:
            ray.kill(actor)

    def release_placement(self) -> tuple[str, threading.Event]:
        """Start releasing the placement group; the agent's name and an event set once Ray confirmed.

        On a live cluster this takes milliseconds. When the cluster itself is going away (a Slurm cancel stops
        the Ray head together with the driver) the call blocks on Ray's control store for minutes, so it runs
        in a daemon thread that `wait_released` may leave behind: Ray releases the group when the driver's job
        ends anyway."""
        from ray.util.placement_group import remove_placement_group

        done = threading.Event()

        def release() -> None:
            try:
                remove_placement_group(self.placement)
            except Exception as err:  # noqa: BLE001 - logged: the run is ending
                logger.warning("agent %s: releasing the placement group failed (%s: %s)", self.agent.name,
                               type(err).__name__, err)
            done.set()

        threading.Thread(target=release, name=f"release-{self.agent.name}", daemon=True).start()
        return self.agent.name, done


def wait_released(releases: list[tuple[str, threading.Event]], deadline: float) -> None:
    """Wait for `AgentGroup.release_placement`s until `deadline`, at least 1 s and at most `_RELEASE_WAIT_S`;
    one not confirmed by then is logged and left to Ray."""
    wait_until = time.monotonic() + min(max(deadline - time.monotonic(), 1.0), _RELEASE_WAIT_S)
    for name, done in releases:
        if not done.wait(max(wait_until - time.monotonic(), 0.0)):
            logger.warning("agent %s: Ray did not confirm releasing the placement group (is the Ray cluster going "
                           "down?); Ray releases it when the driver exits", name)


def _put(value: Any) -> Any:
    """`value` in Ray's object store once (an ObjectRef every actor of the call resolves), or None as is."""
    import ray

    return None if value is None else ray.put(value)

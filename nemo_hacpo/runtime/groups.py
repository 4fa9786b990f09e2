"""Ray side of the runtime: the cluster, and one worker group (one actor per rank) per agent.

Each agent's ranks are placed by a Ray placement group on that agent's own resources (one bundle per rank:
a GPU on CUDA, a CPU slot otherwise), form their own torch.distributed world (rendezvous at rank 0's node)
and hold their own Megatron `parallel_state`. A failure in any actor stops the job with the agent and the
rank named (`WorkerFailure`); nothing is retried silently.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from nemo_hacpo.config import AgentConfig, AlgoConfig, HacpoConfig
from nemo_hacpo.runtime.worker import AgentRank

logger = logging.getLogger(__name__)


class WorkerFailure(RuntimeError):
    """An agent's worker failed; the message names the agent, the rank and the call."""


def ranks_by_node(bundle_nodes: dict[int, str]) -> list[int]:
    """The bundle of each rank: bundles grouped by node (nodes in the order of their first bundle), in bundle
    order within a node. `bundle_nodes`: Ray's `bundles_to_node_id` of a placement group."""
    first_bundle: dict[str, int] = {}
    for bundle in sorted(bundle_nodes):
        first_bundle.setdefault(bundle_nodes[bundle], bundle)
    return sorted(bundle_nodes, key=lambda bundle: (first_bundle[bundle_nodes[bundle]], bundle))


def start_ray(cfg: HacpoConfig) -> None:
    """Join `runtime.cluster.ray_address`, or start a local Ray with enough logical CPUs for every rank."""
    import ray

    if ray.is_initialized():
        return
    cluster = cfg.runtime.cluster
    env_vars = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONWARNINGS": "ignore"}
    if cluster.device == "cpu":
        # one intra-op thread per rank: oversubscribed OpenMP pools make a TP=2 CPU step ~10x slower
        env_vars["OMP_NUM_THREADS"] = "1"
    env = {"env_vars": env_vars}
    if cluster.ray_address:
        ray.init(address=cluster.ray_address, runtime_env=env, logging_level="WARNING")
        return
    ranks = sum(agent.parallel.world_size for agent in cfg.agents)
    ray.init(num_cpus=max(ranks, os.cpu_count() or 1), num_gpus=cluster.gpus_per_node if cluster.device == "cuda" else 0,
             include_dashboard=False, runtime_env=env, logging_level="WARNING")


class AgentGroup:
    """The Ray actors of one agent, rank r in `actors[r]`."""

    def __init__(self, agent: AgentConfig, algo: AlgoConfig, *, seed: int, run_dir: str, total_updates: int,
                 device: str, init_weights: str | None = None, start_engine: bool = True,
                 resume_from: str | None = None, call_timeout_s: float = 3600.0, collective_timeout_s: float = 1800.0,
                 gpus_per_rank: float = 1.0, placement_timeout_s: float = 600.0):
        """`gpus_per_rank` < 1 lets several agents share a GPU (one-GPU benchmarks); clusters use 1.
        `placement_timeout_s`: how long to wait for Ray to reserve the agent's resources."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.agent = agent
        self.algo = algo  # what the workers were built for (e.g. whether they keep a reference model)
        self.seed = seed
        self.call_timeout_s = call_timeout_s
        world = agent.parallel.world_size
        on_gpu = device == "cuda"
        bundles = [{"CPU": 1, "GPU": gpus_per_rank} if on_gpu else {"CPU": 1} for _ in range(world)]
        # on GPU every actor sees its node's devices (it picks its own from ray.get_gpu_ids()), so a rank can
        # hand the GPUs of its vLLM TP group to its engine (runtime.placement)
        runtime_env = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}} if on_gpu else None
        self.placement = placement_group(bundles, strategy="PACK", name=f"hacpo-{agent.name}")
        try:
            ray.get(self.placement.ready(), timeout=placement_timeout_s)
        except ray.exceptions.GetTimeoutError as err:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.placement)  # do not leave a half-reserved group behind
            have = ray.available_resources()
            raise WorkerFailure(
                f"agent {agent.name!r}: Ray could not reserve {world} bundle(s) of {bundles[0]} within "
                f"{placement_timeout_s:.0f} s (free now: {have.get('GPU', 0):g} GPU, {have.get('CPU', 0):g} CPU); "
                "are enough nodes in the Ray cluster, and is another agent or job holding them?") from err
        from ray.util.placement_group import placement_group_table

        # rank r → bundle: PACK does not promise that bundles r..r+7 share a node; ranks go node by node so that
        # a tensor-parallel group of consecutive ranks (and a vLLM TP group) never straddles two nodes
        bundle_of_rank = ranks_by_node(placement_group_table(self.placement)["bundles_to_node_id"])
        actor_cls = ray.remote(AgentRank)
        self.actors = [
            actor_cls.options(
                num_cpus=1, num_gpus=gpus_per_rank if on_gpu else 0, name=f"hacpo-{agent.name}-rank{rank}",
                runtime_env=runtime_env,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.placement, placement_group_bundle_index=bundle_of_rank[rank]),
            ).remote(agent, algo, rank, seed=seed, run_dir=run_dir, total_updates=total_updates,
                     collective_timeout_s=collective_timeout_s)
            for rank in range(world)
        ]
        self.info: list[dict[str, Any]] = []
        try:
            master_addr, master_port = self.get([self.actors[0].address.remote()], "address")[0]
        except WorkerFailure:
            self.shutdown(timeout_s=5.0)  # release the actors and the placement group before reporting
            raise
        self._setup = [a.setup.remote(master_addr, master_port, init_weights, start_engine, resume_from)
                       for a in self.actors]

    def wait_ready(self) -> list[dict[str, Any]]:
        """Wait for `setup` (started by the constructor, so several agents start their engines at once)."""
        if not self.info:
            self.info = self.get(self._setup, "setup")
        return self.info

    @property
    def engine_ranks(self) -> list[int]:
        """Ranks that own a vLLM engine (rank 0 on CPU; one per vLLM TP group on CUDA)."""
        ranks = [info["rank"] for info in self.wait_ready() if info.get("engine") is not None]
        if not ranks:
            raise WorkerFailure(f"agent {self.agent.name!r} has no rollout engine (started without engines)")
        return ranks

    def submit_generate(self, prompts: list[list[dict]], n: int, greedy: bool = False, seed: int | None = None,
                        sleep_after: bool = False) -> list[tuple[int, Any]]:
        """Start generation on every engine, each on a contiguous slice of the prompts with the seeds a single
        engine would use (`runtime.placement.split_batch`); returns `(rank, future)` pairs for `collect_generate`."""
        from nemo_hacpo.rollout.sampling import SEED_MODULUS
        from nemo_hacpo.runtime.placement import split_batch

        ranks = self.engine_ranks
        futures = []
        for rank, (start, stop) in zip(ranks, split_batch(len(prompts), len(ranks)), strict=False):
            slice_seed = None if seed is None else (seed + start * n) % SEED_MODULUS
            futures.append((rank, self.actors[rank].generate.remote(prompts[start:stop], n, greedy, slice_seed,
                                                                   sleep_after)))
        return futures

    def collect_generate(self, futures: list[tuple[int, Any]], what: str = "generate") -> dict[str, Any]:
        """The engines' results, merged in prompt order."""
        from nemo_hacpo.runtime.placement import merge_generations

        return merge_generations(self.get([f for _, f in futures], what, ranks=[r for r, _ in futures]))

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
                                    "(hung; see runtime.call_timeout_s)")
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=remaining)
            for future in ready:
                index, rank = pending.pop(future)
                try:
                    results[index] = ray.get(future)
                except Exception as err:  # RayTaskError / RayActorError wrap the worker's exception
                    raise self._failure(what, rank, err, pending)  # noqa: B904 - its cause is the culprit's error
        return results

    def _failure(self, what: str, rank: int, err: Exception, pending: dict[Any, tuple[int, int]],
                 grace_s: float = 5.0) -> WorkerFailure:
        """The report of a failed call: the dead rank if any of the failures is a dead actor, else `rank`."""
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
        culprit = dead[0] if dead else rank
        others = sorted(r for r in failures if r != culprit)
        also = f" (rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} failed too)" if others else ""
        cause = failures[culprit]
        failure = WorkerFailure(f"agent {self.agent.name!r} rank {culprit} failed in {what}: "
                                f"{type(cause).__name__}: {cause}{also}")
        failure.__cause__, failure.__suppress_context__ = cause, True
        return failure

    def call_all(self, method: str, *args: Any) -> list[Any]:
        """Launch a collective call on every rank; returns the futures (rank order)."""
        return [getattr(actor, method).remote(*args) for actor in self.actors]

    def run(self, method: str, *args: Any) -> Any:
        """Collective call, waited for; returns rank 0's result."""
        return self.get(self.call_all(method, *args), method)[0]

    def shutdown(self, timeout_s: float = 120.0) -> None:
        """Stop the engines and process groups cleanly (up to `timeout_s`), then kill the actors."""
        import ray
        from ray.util.placement_group import remove_placement_group

        deadline = time.monotonic() + timeout_s
        futures = [actor.shutdown.remote() for actor in self.actors]
        for rank, future in enumerate(futures):  # each rank on its own: a dead one must not cut the others short
            try:
                ray.get(future, timeout=max(deadline - time.monotonic(), 0.0))
            except Exception as err:  # noqa: BLE001 - shutting down after a failure must not hide it
                logger.warning("agent %s rank %d: clean shutdown failed (%s: %s)", self.agent.name, rank,
                               type(err).__name__, err)
        for actor in self.actors:
            ray.kill(actor)
        remove_placement_group(self.placement)

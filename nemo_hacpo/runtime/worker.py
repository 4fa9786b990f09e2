"""One rank of one agent: its torch.distributed world, Megatron trainer shard and (on engine ranks) vLLM engine.

`AgentRank` is a plain class so it can run in-process for tests; the runtime hosts one per Ray actor
(`AgentGroup`), one actor per rank, so every agent owns its own processes, its own process group and its own
Megatron `parallel_state` — two agents with different layouts never share global state.

Collective methods (`old_logprobs`, `train`, `refit`, `save`, `load`, `save_hf`, `sft`, `generate`) must be called
on every rank of the agent with the same arguments; they return their (identical) result on rank 0 and None
elsewhere, so a result crosses Ray once. Generation runs on the engine ranks (the others take part in the
hand-over of their GPUs and return None). What crosses Ray is typed: `RankInfo`, `GenerationResult`,
`OldLogprobs`, `TrainMetrics`, `RefitStats`, and the checkpoint's file records.

Every sleep, wake and start of a colocated engine is collective over the ranks that share its GPUs — the engine's
TP group (`rollout.engine_group.EngineGroup`, the group the staged refit also uses):

    generate      every member releases → barrier → engine: wake (if asleep), generate, sleep (sleep_after)
    refit         release → barrier → wake weights → exchange → load (staged: per bucket) → release → barrier →
                  wake KV cache → exchange
    checkpoint    release → barrier → sleep (level 1) → exchange → restore … save … offload → release →
                  barrier → wake → exchange
    start-up      fresh from an HF checkpoint: release → barrier → the engine starts on it;
                  otherwise (a resume, a random init): config.json written → barrier → release → barrier → the
                  engine starts on placeholder weights → release → barrier → sleep (level 2) → exchange → a refit
    final export  release → barrier → sleep (level 2) → exchange → the HF export

so no rank allocates while an engine sleeps or wakes (vLLM asserts that free memory did not shrink while it
slept), and no engine wakes or starts before every rank of its GPUs has given back what it held. Where no
collective closes the transition (after generating, after the engine's start) the driver's wait for every
rank's call does: no rank is given work before the engine's call has ended.
"""

from __future__ import annotations

import collections
import datetime
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from nemo_hacpo.algo.rows import TrainingRows
from nemo_hacpo.config import AgentConfig
from nemo_hacpo.rollout.engine_group import EngineGroup
from nemo_hacpo.rollout.engine_processes import sweep_recorded
from nemo_hacpo.rollout.outputs import GenerationResult, RefitStats
from nemo_hacpo.rollout.refit import RpcRefit, StagedRefit, make_refit_strategy
from nemo_hacpo.rollout.settings import engine_cpu_cores
from nemo_hacpo.runtime.rank_process import (
    TRAINER_ENVIRONMENT,
    assigned_gpu,
    engine_records,
    node_ip_address,
    pin_gloo_interface,
    rank_log_file,
    redirect_output,
    set_environment,
    wait_visible,
)
from nemo_hacpo.training.loss_metrics import TrainMetrics
from nemo_hacpo.training.objective import Objective

if TYPE_CHECKING:
    from nemo_hacpo.models.architecture import ModelArch
    from nemo_hacpo.rollout.protocol import RolloutBackend
    from nemo_hacpo.training.memory import TrainStateOffload
    from nemo_hacpo.training.trainer import MegatronTrainer

logger = logging.getLogger(__name__)

def release_cached_memory() -> None:
    """Return the CUDA caching allocator's unused blocks to the device (a no-op without CUDA)."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class RankInfo:
    """What a rank reports once it is set up."""

    agent: str
    rank: int
    parameters: int
    """Parameters of this rank's model shard."""
    family: str | None
    """The architecture family (llama, qwen3, gpt2, …)."""
    engine: dict[str, float] | None
    """The engine's start-up stats when this rank owns one, else None."""
    host: str = ""
    """The node's host name."""
    address: str = ""
    """The node's address as other nodes reach it (Ray's node IP; what the rendezvous and vLLM advertise)."""
    rendezvous: str = ""
    """The agent's torch.distributed rendezvous (rank 0's TCP store), host:port."""
    engine_address: str = ""
    """The address this rank's vLLM engine advertises (VLLM_HOST_IP), when it owns one."""


@dataclass(frozen=True)
class OldLogprobs:
    """The trainer's log-probs of an agent's own responses at the sampling weights (algorithm.md §4).

    `mean[i]` = m_old of response i (flat order), the mean over its response tokens; `mismatch` is
    exp(token-mean |trainer − sampler|) over all response tokens (`rollout.mismatch`; 1 = identical); `token`,
    when asked for, holds each response row's per-token log-probs in the shifted layout (the token-level loss).
    """

    mean: list[float]
    mismatch: float
    token: list[torch.Tensor] | None = None


class AgentRank:
    """Rank `rank` of agent `agent.name`. Call `setup` (collective) before anything else.

    `keep_reference`: build the frozen reference model of the KL term (β > 0). `log_dir`: where this rank's
    process output goes (`<log_dir>/<agent>_rank<r>.log`); None keeps the inherited output.
    `engine_cpu_slot` = (slot, slots), CPU: this rank's engine is engine `slot` of the `slots` engines that share
    the node's cores, and binds its threads to its share of them (`rollout.settings.engine_cpu_cores`).
    """

    def __init__(self, agent: AgentConfig, rank: int, *, seed: int, run_dir: str, total_updates: int,
                 keep_reference: bool, collective_timeout_s: float = 1800.0, log_dir: str | None = None,
                 engine_cpu_slot: tuple[int, int] | None = None):
        self.agent, self.rank, self.keep_reference = agent, rank, keep_reference
        self.engine_cpu_slot = engine_cpu_slot
        self.collective_timeout_s = collective_timeout_s
        self.seed, self.run_dir, self.total_updates = seed, Path(run_dir), total_updates
        if log_dir is not None:
            redirect_output(rank_log_file(log_dir, agent.name, rank))
        self._store: Any = None  # rank 0: the agent's rendezvous store, listening from `address` on
        self.trainer: MegatronTrainer | None = None
        self.engine: RolloutBackend | None = None
        self.engine_gpus: list[int] | None = None
        self.tokenizer: Any = None
        self.arch: ModelArch | None = None
        self._sft_rows: list[tuple[list[int], list[int]]] = []
        self.refit_strategy: RpcRefit | StagedRefit | None = None
        self.engine_group: EngineGroup | None = None  # the ranks that share this rank's engine's GPUs
        self.train_state: TrainStateOffload | None = None  # agent.offload_train_state
        self.phases: collections.deque[str] = collections.deque(maxlen=64)  # recent memory phases, in order

    # ------------------------------------------------------------------------------------------- set-up
    def address(self) -> tuple[str, int]:
        """Rank 0: start the agent's rendezvous store on a port the OS picks, and return where it listens.

        The store listens from here on, so the port cannot be taken while the driver hands it to the other
        ranks. (Picking a free port, closing it and binding it again later left a window in which another
        agent's engine or gloo connections could claim it: EADDRINUSE at the rendezvous, seen in CI.)
        """
        from torch.distributed import TCPStore

        host = node_ip_address()
        # asking again replaces the store (the old one, and its port, go once the new one listens)
        self._store = TCPStore(host, 0, world_size=self.agent.parallel.world_size, is_master=True,
                               timeout=datetime.timedelta(seconds=self.collective_timeout_s),
                               wait_for_workers=False)
        return host, self._store.port

    def setup(self, master_addr: str, master_port: int, init_weights: str | None = None,
              start_engine: bool = True, resume_from: str | None = None) -> RankInfo:
        """Join the agent's world, build the trainer, load initial weights, start the engine (engine ranks).

        `init_weights`: an HF checkpoint directory or a trainer checkpoint to start from; None = the agent's own
        source (its HF path, or a seeded random init for tiny models). The reference model (β > 0) is a copy of
        these initial weights. `resume_from`: a trainer checkpoint loaded afterwards (model, optimizer,
        scheduler, RNG), so a resumed run keeps the original reference.
        """
        from nemo_hacpo.models.architecture import model_arch
        from nemo_hacpo.models.tokenizers import load_tokenizer
        from nemo_hacpo.planning.preflight import tokenizer_source
        from nemo_hacpo.training import MegatronTrainer, init_distributed

        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        world = self.agent.parallel.world_size
        gpu = assigned_gpu()
        pin_gloo_interface()
        init_distributed(self.rank, world, master_addr, master_port, timeout_s=self.collective_timeout_s,
                         local_rank=gpu, store=self._store if self.rank == 0 else None)
        self.engine_gpus = self._engine_gpus(gpu)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        engine_tp = self.agent.rollout.tensor_parallel_size
        self.engine_group = EngineGroup.create(self.rank, world, engine_tp, device)
        self.refit_strategy = make_refit_strategy(
            self.agent.rollout.refit_transport, rank=self.rank, world=world, engine_tp=engine_tp, device=device,
            bucket_mb=self.agent.rollout.refit_bucket_mb, tag=self.agent.name, group=self.engine_group)
        self.tokenizer = load_tokenizer(tokenizer_source(self.agent))
        self.arch = model_arch(self.agent, len(self.tokenizer))
        self.trainer = MegatronTrainer(self.agent, self.arch, seed=self.seed, total_updates=self.total_updates,
                                       reference_model=self.keep_reference)
        start = init_weights or (self.agent.model.path if self.agent.model.source == "hf" else None)
        if start is not None:
            self.load_weights(start)
        if self.trainer.reference is not None:
            self.trainer.sync_reference()
        if resume_from is not None:
            self.trainer.load_checkpoint(resume_from)
        if self.agent.offload_train_state:
            from nemo_hacpo.training.memory import TrainStateOffload

            self.train_state = TrainStateOffload(self.trainer.optimizer, [self.trainer.model])
            self._offload_train_state()
        # a fresh run from an HF checkpoint: the trainer holds exactly its weights, and the engine reads them there
        serve = start if resume_from is None and start is not None and (Path(start) / "config.json").is_file() \
            else None
        engine = self.start_engine(serve) if start_engine else None
        return RankInfo(agent=self.agent.name, rank=self.rank,
                        parameters=sum(p.numel() for p in self.trainer.model.parameters()), family=self.arch.family,
                        engine=engine, host=socket.gethostname(), address=self._node_address(),
                        rendezvous=f"{master_addr}:{master_port}",
                        engine_address=os.environ.get("VLLM_HOST_IP", "") if engine is not None else "")

    @staticmethod
    def _node_address() -> str:
        try:
            return node_ip_address()
        except Exception:  # noqa: BLE001 - outside Ray (tests that build a rank in-process)
            return ""

    def _engine_gpus(self, gpu: int | None) -> list[int] | None:
        """Collective: the GPUs of this rank's engine ([] on CPU), or None when this rank owns no engine."""
        import torch.distributed as dist

        from nemo_hacpo.runtime.placement import engine_layout

        device = "cuda" if torch.cuda.is_available() else "cpu"
        hosts: list[Any] = [None] * dist.get_world_size()
        gpus: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(hosts, socket.gethostname())
        dist.all_gather_object(gpus, gpu if gpu is not None else torch.cuda.current_device() if device == "cuda" else None)
        layout = engine_layout(hosts, gpus, self.agent.rollout.tensor_parallel_size, device)
        return layout.get(self.rank)

    def _trainer(self) -> MegatronTrainer:
        if self.trainer is None:
            raise RuntimeError(f"agent {self.agent.name!r} rank {self.rank}: call setup() first")
        return self.trainer

    def load_weights(self, path: str) -> None:
        """Initial weights from an HF checkpoint dir or a trainer checkpoint dir (model + optimizer state)."""
        from nemo_hacpo.models.hf_conversion import load_hf_into_megatron

        trainer, path_obj = self._trainer(), Path(path)
        if (path_obj / "config.json").is_file():
            load_hf_into_megatron([trainer.module], self.arch, str(path_obj), parallel=trainer.model_parallel)
            # the optimizer keeps its own (fp32 / sharded) copy of the parameters: refresh it
            trainer.optimizer.reload_model_params()
        elif path_obj.is_dir():
            trainer.load_checkpoint(str(path_obj))
        else:
            raise FileNotFoundError(f"agent {self.agent.name!r}: no initial weights at {path_obj.resolve()} "
                                    "(expected an HF checkpoint or a trainer checkpoint directory)")

    def start_engine(self, hf_dir: str | None = None) -> dict[str, float] | None:
        """Collective: engine ranks start vLLM (once per run) without a checkpoint written for it.

        `hf_dir`: an HF checkpoint whose weights the trainer holds exactly (a fresh run from the agent's HF
        weights or its warm start): the engine reads them there. None (a resume, a random init): the engine starts
        from the architecture alone — a config.json that rank 0 writes, vLLM's `load_format="dummy"` — and every
        rank then refits the trainer's weights into it, as after every step. Before, every start exported the whole
        model to disk and the engines read it back: 141 GB written and 4 × 141 GB read for llama70b at every start
        and requeue (issue #40; `benchmarks/engine_start.py`).

        On CUDA the engine of rank r runs on the GPUs of ranks r .. r+T−1 (`runtime.placement`): they are made
        the only visible devices of the engine's processes, and the engine sleeps while they train. Every rank of
        the engine's group gives back what it holds before the engine measures its GPUs' free memory (the
        hand-over; the driver's wait for every rank's set-up closes it)."""
        from nemo_hacpo.models.hf_conversion import write_hf_config

        model_dir = hf_dir
        if model_dir is None:
            model_dir = str(self.run_dir / "engines" / self.agent.name)
            if self.rank == 0:
                write_hf_config(self.arch, self.tokenizer, model_dir, dtype=self._trainer().config.params_dtype)
            import torch.distributed as dist

            dist.barrier()  # engine ranks on other nodes read it next
        self._group().hand_over(release_cached_memory)
        if self.engine_gpus is not None:
            wait_visible(Path(model_dir) / "config.json", self.agent.name, self.rank)
            self.engine = self._new_engine(model_dir, dummy_weights=hf_dir is None)
        if hf_dir is None:
            # a colocated engine drops its placeholders and KV cache first, so the refit meets its GPUs as after
            # a step's generation (weights woken, loaded, then the KV cache) and not next to a full KV cache
            engine = self.engine
            self._group().transition(engine, (lambda e: e.sleep(level=2)) if engine is not None and engine.can_sleep
                                     else None, release_cached_memory, "the placeholder engine's sleep")
            self.refit()
        return self.engine.stats if self.engine is not None else None

    def _new_engine(self, hf_dir: str, dummy_weights: bool = False) -> RolloutBackend:
        """vLLM on `hf_dir` (with `dummy_weights`: its config only, the weights to be refit), on this rank's
        engine GPUs (the seam a test replaces with an engine of its own)."""
        from nemo_hacpo.rollout import RolloutEngine

        records = engine_records(self.run_dir)
        try:  # what engines killed on this node in an earlier run left (the driver sweeps its own node's only)
            sweep_recorded(records)
        except Exception:
            logger.exception("agent %s rank %d: sweeping the shared memory recorded in %s failed", self.agent.name,
                             self.rank, records)
        # vLLM advertises this node's routable address, never a loopback one another node could not reach
        if "VLLM_HOST_IP" not in os.environ and (address := self._node_address()):
            os.environ["VLLM_HOST_IP"] = address
        engine_env: dict[str, str | None] = dict.fromkeys(TRAINER_ENVIRONMENT)  # the trainer's own: not the engine's
        if self.engine_gpus:  # CUDA: the engine's (spawned) processes see exactly its GPUs
            engine_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.engine_gpus)
        cpu_cores = None
        if self.engine_cpu_slot is not None and not torch.cuda.is_available():
            cpu_cores = engine_cpu_cores(sorted(os.sched_getaffinity(0)), *self.engine_cpu_slot)
        saved = {name: os.environ.get(name) for name in engine_env}
        try:
            set_environment(engine_env)  # what the engine's processes inherit when vLLM spawns them
            return RolloutEngine.from_agent(self.agent, hf_dir, default_seed=self.seed, cpu_cores=cpu_cores,
                                            dummy_weights=dummy_weights,
                                            shm_record=records / f"{self.agent.name}_rank{self.rank}_{os.getpid()}.json")
        finally:
            set_environment(saved)

    def environment(self, names: list[str]) -> dict[str, Any]:
        """These environment variables as this rank's process sees them (`rank`) and as each of its child
        processes does (`children`: the engine's — vLLM's engine core and workers, which it spawned), for tests."""
        import psutil

        children = []
        for child in psutil.Process().children(recursive=True):
            try:
                seen = child.environ()
            except (psutil.Error, OSError):  # gone meanwhile, or not ours to read
                continue
            children.append({name: seen.get(name) for name in names})
        return {"rank": {name: os.environ.get(name) for name in names}, "children": children}

    # --------------------------------------------------------------------------------------- generation
    def generate(self, prompts: list[list[dict]] | None, n: int, greedy: bool = False,
                 seed: int | None = None, sleep_after: bool = False) -> GenerationResult | None:
        """Collective over the engine's group: G = n responses per prompt on the engine rank.

        `prompts` None: this rank generates nothing (a rank without an engine, or an engine without a slice of
        the batch) and only takes part in the hand-over: every member releases its cached memory and waits for
        the others before the engine wakes. `seed`: the call's base seed (the loop derives it from the agent's
        seed and the step, so a resumed run samples exactly what an uninterrupted one does); None = the engine's
        own call counter. `sleep_after`: release the engine's GPU memory afterwards (colocated CUDA engines
        before training; the next refit brings the weights back). A no-op on CPU.
        """
        from nemo_hacpo.rollout.sampling import SamplingSettings

        self._group().hand_over(release_cached_memory)
        if prompts is None:
            return None
        if self.engine is None:
            raise RuntimeError(f"agent {self.agent.name!r} rank {self.rank} owns no rollout engine")
        sampling = SamplingSettings(temperature=0.0) if greedy else None
        self.engine.wake_up()
        result = self.engine.generate(prompts, n, sampling=sampling, seed=seed)
        if sleep_after and self.engine.can_sleep:
            self.engine.sleep(level=2)  # weights and KV cache dropped: the refit after training rewrites them
            self.phases.append("engine:asleep")
        return result

    # ----------------------------------------------------------------------------------------- training
    def old_logprobs(self, generation: GenerationResult, with_tokens: bool = False) -> OldLogprobs | None:
        """Collective: m_old of each of the agent's own responses under the current (= sampling) weights, the
        trainer↔sampler mismatch, and with `with_tokens` the per-token rows (see `OldLogprobs`). Rank 0 returns.

        The per-token log-probs stay on the ranks unless asked for: only the means cross Ray."""
        from nemo_hacpo.rollout.mismatch import ragged_token_mult_prob_error

        token_ids, masks = generation.training_rows()
        token_logprobs = self._trainer().compute_token_logprobs(token_ids, masks)  # [N, T], shifted layout
        if self.rank != 0:
            return None
        means, trainer_rows, sampler_rows = [], [], []
        for n, (start, response) in enumerate(zip(generation.response_starts(), generation.flat(), strict=True)):
            scored = token_logprobs[n, start:start + response.num_tokens]  # the response's own tokens
            means.append(float(scored.mean()) if response.num_tokens else 0.0)
            trainer_rows.append(scored.tolist())
            sampler_rows.append(response.logprobs)
        has_tokens = any(response.num_tokens for response in generation.flat())
        mismatch = ragged_token_mult_prob_error(trainer_rows, sampler_rows) if has_tokens else float("nan")
        tokens = [token_logprobs[n, :len(ids) - 1].clone() for n, ids in enumerate(token_ids)] if with_tokens else None
        return OldLogprobs(mean=means, mismatch=mismatch, token=tokens)

    def train(self, rows: TrainingRows, objective: Objective, step: int) -> TrainMetrics | None:
        """Collective: `objective.updates_per_step` optimizer updates over the learner's rows. Rank 0 returns.

        With `offload_train_state` the optimizer state comes back for the update and leaves again after it."""
        self._restore_train_state()
        metrics = self._trainer().train_step(rows, objective, step)
        self._offload_train_state()
        return metrics if self.rank == 0 else None

    # ------------------------------------------------------------------------------- memory between phases
    def _offload_train_state(self) -> None:
        if self.train_state is not None:
            self.train_state.offload()
            self.phases.append("train_state:host")
        release_cached_memory()

    def _restore_train_state(self) -> None:
        if self.train_state is not None:
            self.train_state.restore()
            self.phases.append("train_state:device")

    def refit(self) -> RefitStats | None:
        """Collective: stream the trainer's weights in HF layout, in bounded buckets, into the engines (the
        agent's `rollout.refit` strategy decides who copies what where); the first engine rank returns its stats.

        Colocated CUDA: what torch's caching allocator keeps of the training step's peak (activations, logits) is
        handed back on every GPU of the engine before it re-allocates its weights, and the export's gathered
        tensors and the staging buffers before its KV cache — on every rank of the group, not only the engine's
        (module docstring: each wake is a transition of the whole group)."""
        from nemo_hacpo.models.hf_conversion import export_hf_weights

        trainer, strategy, group = self._trainer(), self._refit_strategy(), self._group()
        weights = export_hf_weights([trainer.module], self.arch, to_cpu=strategy.export_to_cpu,
                                    parallel=trainer.model_parallel)
        group.transition(self.engine, lambda engine: engine.wake_up(["weights"]), release_cached_memory,
                         "the engine's wake-up of its weights")
        if self.engine is not None:
            self.phases.append("engine:weights")
        stats = strategy.refit(weights, self.engine)
        del weights  # the export's last tensor: released below with the rest of the export cache
        self.phases.append("refit")
        group.transition(self.engine, lambda engine: engine.wake_up(["kv_cache"]), release_cached_memory,
                         "the engine's wake-up of its KV cache")
        if self.engine is None:
            return None
        self.phases.append("engine:awake")
        return stats if self.rank == 0 else None

    def _refit_strategy(self) -> RpcRefit | StagedRefit:
        if self.refit_strategy is None:
            raise RuntimeError(f"agent {self.agent.name!r} rank {self.rank}: call setup() first")
        return self.refit_strategy

    def _group(self) -> EngineGroup:
        if self.engine_group is None:
            raise RuntimeError(f"agent {self.agent.name!r} rank {self.rank}: call setup() first")
        return self.engine_group

    def sft(self, prompts: list[list[dict]] | None, solutions: list[str] | None, steps: int, batch_size: int,
            seed: int, first_step: int = 0) -> list[float] | None:
        """Collective: supervised warm start on worked solutions, through the same trainer path as RL.

        One update per step on the `nll` objective (`Objective.sft()`: sequence-mean token NLL of the solutions,
        EOS included; the same micro-batching, schedule, optimizer and LR schedule as RL). Returns (rank 0) the
        NLL per step, at the weights before the step's update.

        Steps `first_step .. first_step + steps − 1` of the seeded schedule run, so the driver can call it in
        chunks (and show progress) and get exactly the batches of one long call; `prompts`/`solutions` may be
        None after the first chunk (the encoded set is kept).
        """
        import random

        from nemo_hacpo.runtime.warmstart import encode_solutions

        if prompts is not None:
            self._sft_rows = encode_solutions(prompts, solutions or [], self.tokenizer,
                                              self.agent.tokenizer.chat_template, self.agent.max_response_length)
        if not self._sft_rows:
            raise ValueError(f"agent {self.agent.name!r}: sft needs prompts and solutions on its first call")
        trainer, objective = self._trainer(), Objective.sft()
        rng = random.Random(seed)
        size = min(batch_size, len(self._sft_rows))
        for _ in range(first_step):  # replay the schedule up to this chunk (cheap: index draws only)
            rng.sample(range(len(self._sft_rows)), size)
        losses = []
        for step in range(first_step, first_step + steps):
            batch = [self._sft_rows[i] for i in rng.sample(range(len(self._sft_rows)), size)]
            rows = TrainingRows.supervised([ids for ids, _ in batch], [mask for _, mask in batch])
            losses.append(trainer.train_step(rows, objective, step).loss)  # NLL before this update
        return losses if self.rank == 0 else None

    # ---------------------------------------------------------------------------------------- checkpoints
    def save(self, directory: str, step: int, digest: str | None = None) -> dict[str, dict[str, Any]] | None:
        """Collective: a trainer checkpoint (model, optimizer, scheduler, RNG). A colocated engine sleeps
        meanwhile (level 1: its weights wait in host memory): the optimizer's save gathers fp32 state on the
        GPUs, which must not meet an awake engine's weights and KV cache. Sleep and wake are transitions of the
        engine's whole group (module docstring): no rank restores its optimizer state before every engine of
        its GPUs has gone to sleep, and no engine wakes before every rank has offloaded and released.

        Every rank records the files it wrote (with `digest`, their content digests: `training.checkpoint_files`);
        rank 0 returns them all (relative name → `{"bytes"[, "digest"]}`), the others None."""
        group, engine = self._group(), self.engine
        slept = engine is not None and engine.can_sleep and not engine.asleep
        group.transition(engine, (lambda e: e.sleep(level=1)) if slept else None, release_cached_memory,
                         "the engine's sleep for the checkpoint")
        if slept:
            self.phases.append("engine:asleep")
        self._restore_train_state()
        try:
            self.phases.append("checkpoint")
            saved = self._trainer().save_checkpoint(directory, step, digest=digest)
        finally:
            self._offload_train_state()
        group.transition(engine, (lambda e: e.wake_up()) if slept else None, release_cached_memory,
                         "the engine's wake-up after the checkpoint")
        if slept:
            self.phases.append("engine:awake")
        return saved.files if self.rank == 0 else None

    def load(self, directory: str) -> dict[str, Any]:
        return self._trainer().load_checkpoint(directory)

    def save_hf(self, directory: str, release_engine: bool = False) -> str:
        """Collective: the current weights as an HF checkpoint (+ tokenizer) in `directory`; every rank returns
        once it is complete on disk (a reader on another node finds it whole).

        `release_engine` (the end of the run: nothing generates after it): a colocated engine first sleeps for good
        (level 2, collectively as every transition), so the export's gathered tensors never meet its weights and KV
        cache on the GPU — awake, llama70b's GPUs would hold ~75 GiB during the export (issue #38, item 11)."""
        from nemo_hacpo.models.hf_conversion import save_hf_checkpoint

        engine = self.engine
        if release_engine and self.engine_group is not None:
            slept = engine is not None and engine.can_sleep and not engine.asleep
            self._group().transition(engine, (lambda e: e.sleep(level=2)) if slept else None, release_cached_memory,
                                     "the engine's sleep before the final export")
            if slept:
                self.phases.append("engine:asleep")
        trainer = self._trainer()
        save_hf_checkpoint([trainer.module], self.arch, self.tokenizer, directory, parallel=trainer.model_parallel,
                           sync=True)
        return directory

    def shutdown(self) -> None:
        """Release everything, each part even when an earlier one fails: the refit's staging buffers first (shared
        memory or CUDA-IPC blocks the engine's workers read: gone with them, not after them, and never left behind
        by an engine whose shutdown failed), then the engine, the trainer, the agent's world."""
        from nemo_hacpo.training import destroy_distributed

        strategy, self.refit_strategy = self.refit_strategy, None
        engine, self.engine = self.engine, None
        trainer, self.trainer = self.trainer, None
        try:
            if strategy is not None:
                strategy.close()
        finally:
            try:
                if engine is not None:
                    engine.shutdown()
            finally:
                try:
                    if trainer is not None:
                        trainer.close()
                finally:
                    destroy_distributed()

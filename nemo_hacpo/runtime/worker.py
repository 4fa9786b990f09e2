"""One rank of one agent: its torch.distributed world, Megatron trainer shard and (on rank 0) vLLM engine.

`AgentRank` is a plain class so it can run in-process for tests; the runtime hosts one per Ray actor
(`AgentGroup`), one actor per rank, so every agent owns its own processes, its own process group and its own
Megatron `parallel_state` — two agents with different layouts never share global state.

Collective methods (`mean_logprobs`, `train`, `refit`, `save`, `load`, `save_hf`) must be called on every
rank of the agent with the same arguments; generation runs on rank 0, which owns the engine.
"""

from __future__ import annotations

import datetime
import os
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from nemo_hacpo.config import AgentConfig, AlgoConfig


def _assigned_gpu() -> int | None:
    """The GPU Ray gave this actor (its index among the node's devices; actors see every GPU of their node,
    `RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`), or None outside Ray / on CPU."""
    if not torch.cuda.is_available():
        return None
    try:
        import ray

        ids = ray.get_gpu_ids() if ray.is_initialized() else []
    except Exception:  # noqa: BLE001 - not inside a Ray worker
        return None
    return int(ids[0]) if ids else None


def node_ip_address() -> str:
    """This node's address as the other nodes reach it (Ray's choice, the one its raylet registered with).

    Not `gethostbyname(gethostname())`: many hosts map their own name to 127.0.1.1 in /etc/hosts, which the
    ranks on other nodes of a multi-node agent cannot connect to.
    """
    import ray.util

    return ray.util.get_node_ip_address()


class AgentRank:
    """Rank `rank` of agent `agent.name`. Call `setup` (collective) before anything else."""

    def __init__(self, agent: AgentConfig, algo: AlgoConfig, rank: int, *, seed: int,
                 run_dir: str, total_updates: int, collective_timeout_s: float = 1800.0):
        self.agent, self.algo, self.rank = agent, algo, rank
        self.collective_timeout_s = collective_timeout_s
        self.seed, self.run_dir, self.total_updates = seed, Path(run_dir), total_updates
        self._store: Any = None  # rank 0: the agent's rendezvous store, listening from `address` on
        self.trainer: Any = None
        self.engine: Any = None
        self.engine_gpus: list[int] | None = None
        self.tokenizer: Any = None
        self.arch: Any = None

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
              start_engine: bool = True, resume_from: str | None = None) -> dict[str, Any]:
        """Join the agent's world, build the trainer, load initial weights, start the engine (rank 0).

        `init_weights`: an HF checkpoint directory or a trainer checkpoint to start from; None = the agent's own
        source (its HF path, or a seeded random init for tiny models). The reference model (β > 0) is a copy of
        these initial weights. `resume_from`: a trainer checkpoint loaded afterwards (model, optimizer,
        scheduler, RNG), so a resumed run keeps the original reference.
        """
        from nemo_hacpo.models.spec import model_arch
        from nemo_hacpo.models.tokenizers import load_tokenizer
        from nemo_hacpo.training import MegatronTrainer, init_distributed

        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        world = self.agent.parallel.world_size
        gpu = _assigned_gpu()
        init_distributed(self.rank, world, master_addr, master_port, timeout_s=self.collective_timeout_s,
                         local_rank=gpu, store=self._store if self.rank == 0 else None)
        self.engine_gpus = self._engine_gpus(gpu)
        source = self.agent.tokenizer.source
        self.tokenizer = load_tokenizer(self.agent.model.path if source == "model" else source)
        self.arch = model_arch(self.agent, len(self.tokenizer))
        self.trainer = MegatronTrainer(self.agent, self.arch, seed=self.seed, total_updates=self.total_updates,
                                       reference_model=self.algo.kl_coef > 0)
        start = init_weights or (self.agent.model.path if self.agent.model.source == "hf" else None)
        if start is not None:
            self.load_weights(start)
        if self.trainer.reference is not None:
            self.trainer.sync_reference()
        if resume_from is not None:
            self.trainer.load_checkpoint(resume_from)
        info = {"agent": self.agent.name, "rank": self.rank, "parameters": sum(
            p.numel() for p in self.trainer.model.parameters()), "family": self.arch.family}
        if start_engine:
            info["engine"] = self.start_engine()
        return info

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

    def load_weights(self, path: str) -> None:
        """Initial weights from an HF checkpoint dir or a trainer checkpoint dir (model + optimizer state)."""
        from nemo_hacpo.models.hf_conversion import load_hf_into_megatron

        path_obj = Path(path)
        if (path_obj / "config.json").is_file():
            load_hf_into_megatron([self.trainer.module], self.arch, str(path_obj))
            # the optimizer keeps its own (fp32 / sharded) copy of the parameters: refresh it
            self.trainer.optimizer.reload_model_params()
        elif path_obj.is_dir():
            self.trainer.load_checkpoint(str(path_obj))
        else:
            raise FileNotFoundError(f"agent {self.agent.name!r}: no initial weights at {path_obj.resolve()} "
                                    "(expected an HF checkpoint or a trainer checkpoint directory)")

    def start_engine(self) -> dict[str, float] | None:
        """Collective: save the current weights as an HF checkpoint; engine ranks start vLLM on it (once per run).

        On CUDA the engine of rank r runs on the GPUs of ranks r .. r+T−1 (`runtime.placement`): they are made
        the only visible devices of the engine's processes, and the engine sleeps while they train."""
        from nemo_hacpo.rollout import RolloutEngine

        hf_dir = self.save_hf(str(self.run_dir / "engines" / self.agent.name))
        if self.engine_gpus is None:
            return None
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        if self.engine_gpus:  # CUDA: the engine's (spawned) processes see exactly its GPUs
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.engine_gpus)
        try:
            self.engine = RolloutEngine.from_agent(self.agent, hf_dir, default_seed=self.seed)
        finally:
            if self.engine_gpus:
                if saved is None:
                    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = saved
        return self.engine.stats

    # --------------------------------------------------------------------------------------- generation
    def generate(self, prompts: list[list[dict]], n: int, greedy: bool = False,
                 seed: int | None = None, sleep_after: bool = False) -> dict[str, Any]:
        """Engine ranks: G = n responses per prompt. Returns plain data (Ray ships it to the driver).

        `seed`: the call's base seed (the loop derives it from the agent's seed and the step, so a resumed run
        samples exactly what an uninterrupted one does); None = the engine's own call counter.
        `sleep_after`: release the engine's GPU memory afterwards (colocated CUDA engines before training; the
        next refit brings the weights back). A no-op on CPU.
        """
        from nemo_hacpo.rollout.sampling import SamplingSettings

        if self.engine is None:
            raise RuntimeError(f"agent {self.agent.name!r} rank {self.rank} owns no rollout engine")
        sampling = SamplingSettings(temperature=0.0) if greedy else None
        self.engine.wake_up()
        result = self.engine.generate(prompts, n, sampling=sampling, seed=seed)
        if sleep_after and self.engine.settings.enable_sleep_mode:
            self.engine.sleep(level=2)  # weights and KV cache dropped: the refit after training rewrites them
        return {
            "prompt_token_ids": [list(ids) for ids in result.prompt_token_ids],
            "responses": [[{"token_ids": list(r.token_ids), "text": r.text, "finish_reason": r.finish_reason,
                            "logprobs": list(r.logprobs)} for r in group] for group in result.responses],
            "stats": dict(result.stats),
        }

    # ----------------------------------------------------------------------------------------- training
    def mean_logprobs(self, token_ids: list[list[int]], response_mask: list[list[int]],
                      per_token: bool = False) -> torch.Tensor:
        """Collective: m_old [N] (or token log-probs [N, T], shifted layout) under the current weights."""
        rows = SimpleNamespace(token_ids=token_ids, response_mask=response_mask)
        if per_token:
            return self.trainer.compute_token_logprobs(rows)
        return self.trainer.compute_mean_logprobs(rows)

    def train(self, view: Any, algo: AlgoConfig, step: int) -> dict[str, float]:
        """Collective: M optimizer updates over the learner's view."""
        return self.trainer.train_step(view, algo, step)

    def refit(self) -> dict[str, float]:
        """Collective: stream the trainer's weights in HF layout into the engine (rank 0)."""
        from nemo_hacpo.models.hf_conversion import export_hf_weights

        weights = export_hf_weights([self.trainer.module], self.arch, to_cpu=True)
        if self.engine is None:
            for _ in weights:  # every rank runs the gather in step; only rank 0 has an engine to feed
                pass
            return {}
        self.engine.wake_up(["weights"])  # colocated CUDA: re-allocate the weights only, then the KV cache
        self.engine.refit(weights)
        self.engine.wake_up(["kv_cache"])
        return {key: float(value) for key, value in self.engine.stats.items() if key.startswith("last_refit")}

    def sft(self, prompts: list[list[dict]] | None, solutions: list[str] | None, steps: int, batch_size: int,
            seed: int, first_step: int = 0) -> list[float]:
        """Collective: supervised warm start on worked solutions, through the same loss and optimizer path.

        One update per step on the sequence-mean token NLL of the solutions (EOS included; the trainer's `sft`
        objective: the same micro-batching, schedule, optimizer and LR schedule as RL, one forward-backward per
        micro-batch and no separate no-grad pass). Returns the NLL per step (sequence-mean of the token-mean
        NLL, at the weights before the step's update: the loss of that update's forward).

        Steps `first_step .. first_step + steps − 1` of the seeded schedule run, so the driver can call it in
        chunks (and show progress) and get exactly the batches of one long call; `prompts`/`solutions` may be
        None after the first chunk (the encoded set is kept).
        """
        import dataclasses
        import random

        from nemo_hacpo.broker.reencode import render_prompt_ids
        from nemo_hacpo.training.batching import TrainingRows

        if prompts is not None:
            template = self.agent.tokenizer.chat_template
            eos = self.tokenizer.eos_token_id
            self._sft_encoded = []
            for messages, solution in zip(prompts, solutions or [], strict=True):
                prompt = render_prompt_ids(messages, self.tokenizer, template)
                response = self.tokenizer(solution, add_special_tokens=False)["input_ids"] + [eos]
                response = response[: self.agent.max_response_length]
                self._sft_encoded.append((prompt + response, [0] * len(prompt) + [1] * len(response)))
        encoded = getattr(self, "_sft_encoded", None)
        if not encoded:
            raise ValueError(f"agent {self.agent.name!r}: sft needs prompts and solutions on its first call")
        from nemo_hacpo.training.objective import SFT

        sft_algo = dataclasses.replace(self.algo, name=SFT, updates_per_step=1, kl_coef=0.0)
        rng = random.Random(seed)
        size = min(batch_size, len(encoded))
        for _ in range(first_step):  # replay the schedule up to this chunk (cheap: index draws only)
            rng.sample(range(len(encoded)), size)
        losses = []
        for step in range(first_step, first_step + steps):
            batch = [encoded[i] for i in rng.sample(range(len(encoded)), size)]
            token_ids, masks = [b[0] for b in batch], [b[1] for b in batch]
            n = len(batch)
            rows = TrainingRows(token_ids=token_ids, response_mask=masks, advantages=torch.ones(n),
                                is_cross=torch.zeros(n, dtype=torch.bool), omega=torch.ones(n),
                                behaviour_mean_logprob=torch.zeros(n))  # unused by the sft objective
            losses.append(self.trainer.train_step(rows, sft_algo, step)["loss"])  # NLL before this update
        return losses

    # ---------------------------------------------------------------------------------------- checkpoints
    def save(self, directory: str, step: int) -> str:
        return self.trainer.save_checkpoint(directory, step)

    def load(self, directory: str) -> dict[str, Any]:
        return self.trainer.load_checkpoint(directory)

    def save_hf(self, directory: str) -> str:
        """Collective: the current weights as an HF checkpoint (+ tokenizer) in `directory`."""
        from nemo_hacpo.models.hf_conversion import save_hf_checkpoint

        save_hf_checkpoint([self.trainer.module], self.arch, self.tokenizer, directory)
        return directory

    def engine_stats(self) -> dict[str, float]:
        return dict(self.engine.stats) if self.engine is not None else {}

    def shutdown(self) -> None:
        from nemo_hacpo.training import destroy_distributed

        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        if self.trainer is not None:
            self.trainer.close()
            self.trainer = None
        destroy_distributed()


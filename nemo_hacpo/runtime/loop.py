"""The HACPO step loop, driven from one process (no model weights here):

    generate (all agents at once) → reward → old log-probs of own samples → broker → M updates per agent
    (all agents at once) → refit → metrics → checkpoint

Every algorithm of the baseline table runs through this loop. What distinguishes them is the algorithm's
registry entry (`AlgoConfig.algorithm`): the samples per prompt, what the broker builds, whether the old token
log-probs travel with the rows, and the trainer's `Objective` (algorithm.md §8).
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from nemo_hacpo.algo import CapabilityTracker
from nemo_hacpo.broker import AgentRollout, Broker, LearnerTokenizer, write_jsonl
from nemo_hacpo.config import AlgoConfig, ConfigError, HacpoConfig
from nemo_hacpo.data import MathProblem, PromptDataset
from nemo_hacpo.data.prompts import PromptFormat
from nemo_hacpo.data.splits import load_split
from nemo_hacpo.data.validation import apply_policy
from nemo_hacpo.eval.paired import mcnemar_exact
from nemo_hacpo.eval.targets import check_golds
from nemo_hacpo.models.chat import prompt_length_issues
from nemo_hacpo.planning.plan import startup_checks
from nemo_hacpo.planning.preflight import check_agents, tokenizer_source
from nemo_hacpo.reporting import markdown_table, read_metrics, write_curves
from nemo_hacpo.rollout.engine_processes import sweep_recorded
from nemo_hacpo.rollout.outputs import GenerationResult, agent_rollouts, rollout_metrics
from nemo_hacpo.rollout.sampling import call_base_seed
from nemo_hacpo.runtime.cross_path import (
    CrossPathMonitor,
    direction_metrics,
    direction_table,
    plot_directions,
)
from nemo_hacpo.runtime.evaluation import evaluate_agents
from nemo_hacpo.runtime.groups import (
    AgentGroup,
    WorkerFailure,
    engine_cpu_slots,
    release_placements,
    reserve_placement,
    start_ray,
    wait_released,
)
from nemo_hacpo.runtime.preemption import (
    EXIT_PREEMPTED,
    Deadline,
    Preemption,
    StopSignal,
    install_preempt_handler,
    restore_preempt_handler,
)
from nemo_hacpo.runtime.rank_process import engine_records
from nemo_hacpo.runtime.run_checkpoint import (
    archive_previous_run,
    checkpoints,
    latest_checkpoint,
    save_run_checkpoint,
)
from nemo_hacpo.runtime.run_lock import LockLost, RunLock
from nemo_hacpo.runtime.run_record import check_resume, write_record
from nemo_hacpo.runtime.step_log import MetricsLogger, drop_records_after
from nemo_hacpo.runtime.warmstart import ensure_warm_start
from nemo_hacpo.runtime.worker import OldLogprobs
from nemo_hacpo.training.objective import Objective

logger = logging.getLogger(__name__)
REWARD_SMOOTHING = 5
"""Steps in the moving average drawn over the training reward and response length per step."""
ENGINE_EXIT_WAIT_S = 5.0
"""At the run's close, how long the /dev/shm sweep waits for the processes of engines whose rank actors were just
killed to exit (vLLM's EngineCore and workers notice their parent's death within a second or two); inside the
~30 s Slurm leaves between SIGTERM and SIGKILL, with the engines' 15 s and the placements' 5 s."""


def batch_group_ids(problems: list[MathProblem]) -> list[str]:
    """One group id per prompt of a batch, unique within it: the problem id, plus `#k` for its k-th repeat.

    A batch can hold a problem twice (it runs on into the next epoch's order, or `B` exceeds the data set);
    each occurrence is its own prompt group, with its own G samples per agent and its own baseline.
    """
    seen: dict[str, int] = {}
    ids = []
    for problem in problems:
        k = seen.get(problem.id, 0)
        seen[problem.id] = k + 1
        ids.append(problem.id if k == 0 else f"{problem.id}#{k}")
    return ids


def own_rollouts(agent: str, problems: list[MathProblem], messages: list[list[dict]], generation: GenerationResult,
                 rewards: list[float], old: OldLogprobs, step: int) -> tuple[list[AgentRollout], dict[str, float]]:
    """One agent's generation + rewards + its trainer's old log-probs → the broker's rollouts, and the agent's
    generation metrics of the step (rewards, lengths, truncation, trainer↔sampler mismatch)."""
    group_size = len(generation.responses[0]) if generation.responses else 0
    per_prompt = [old.mean[b * group_size:(b + 1) * group_size] for b in range(len(problems))]
    rollouts = agent_rollouts(
        generation, messages, source=agent, prompt_ids=batch_group_ids(problems), golds=[p.answer for p in problems],
        rewards=[rewards[b * group_size:(b + 1) * group_size] for b in range(len(problems))],
        mean_logprobs=per_prompt, token_logprobs=old.token, step=step,
        metadata=[{"level": str(p.level)} if p.level is not None else {} for p in problems])
    return rollouts, {**rollout_metrics(generation, rewards), "mismatch_token_mult_prob_error": old.mismatch}


class HacpoRun:
    """One training run: data, verifier, worker groups, broker, the loop, checkpoints and the final report.

    `stop_signal`: the SIGUSR1 handler `train()` installed (`preemption.StopSignal`), which the loop asks after
    every step; the run's lock on its output directory is held from `start()` to `close()`."""

    def __init__(self, cfg: HacpoConfig, stop_signal: StopSignal | None = None):
        self.cfg = cfg
        self.out_dir = Path(cfg.runtime.output_dir)  # made by `start()`: a data error here leaves no directory
        self.agents = [a.name for a in cfg.agents]
        check_agents(cfg)  # tokenizers and checkpoints exist and fit each other
        self._learners: dict[str, LearnerTokenizer] | None = None
        # every record checked before anything starts: fields, and every prompt in every agent's tokenization
        on_invalid = cfg.data.on_invalid
        train = self._checked_prompts(load_split(cfg.data.train, "train", on_invalid), "data.train")
        self.train_set = PromptDataset(train, seed=cfg.data.shuffle_seed)
        self.eval_problems = self._checked_prompts(load_split(cfg.data.eval, "eval", on_invalid), "data.eval")
        algo = cfg.algo
        self.tracker = CapabilityTracker(self.agents, window=algo.capability_window,
                                         ratio_bounds=(algo.ratio_min, algo.ratio_max),
                                         warmup_steps=algo.capability_warmup_steps, floor=algo.capability_floor)
        self.step = 0
        self.totals = {a: {"rollouts_generated": 0, "sequences_trained": 0} for a in self.agents}
        self.eval_history: list[dict[str, Any]] = []
        self.groups: dict[str, AgentGroup] = {}
        self.preemption = Preemption(Deadline.of(cfg.runtime), stop_signal)  # SIGUSR1 and the time limit
        self._lock: RunLock | None = None
        self._saved_step = 0  # the step of the newest checkpoint this run wrote or resumed from

    @property
    def samples_per_prompt(self) -> int:
        """Responses each agent generates per prompt (G; 2G for gspo_x2)."""
        return self.cfg.algo.samples_per_prompt

    # ------------------------------------------------------------------------------------------ start-up
    def start(self) -> None:
        """Check, then start: the output directory's lock (`run_lock`: a live run there refuses this one), the
        resume checkpoint (verified) and the run record first, before Ray starts or anything is written; then the
        warm start, the worker groups and the broker."""
        cfg = self.cfg
        self.out_dir.mkdir(parents=True, exist_ok=True)  # the first thing the run writes, once the data has passed
        self._lock = RunLock(self.out_dir, cfg.runtime.lock_stale_s).acquire()  # one run per directory
        sweep_recorded(engine_records(self.out_dir))  # what the engines of a killed earlier run left in /dev/shm
        resume = latest_checkpoint(self.out_dir, hashes=cfg.runtime.checkpoint_hashes) if cfg.runtime.resume else None
        if resume is not None:
            changed = check_resume(self.out_dir, cfg)  # refuses a change of what the checkpoints hold
            if changed:
                logger.warning("resuming %s with changed settings: %s", self.out_dir,
                               ", ".join(f"{key} {old!r} → {new!r}" for key, (old, new) in changed.items()))
        else:  # starting over: an earlier run's checkpoints, metrics and record must not mix with this one's
            moved = archive_previous_run(self.out_dir)
            if moved is not None:
                logger.warning("%s held an earlier run (%s); its checkpoints, metrics and outputs were moved to %s",
                               self.out_dir, "runtime.resume=false" if not cfg.runtime.resume
                               else "no complete checkpoint to resume from", moved)
        write_record(self.out_dir, cfg)
        start_ray(cfg)
        init: dict[str, str | None] = {a.name: None for a in cfg.agents}
        if cfg.warmstart.enabled:  # also on resume: the reference model is the warm-started policy
            init.update(ensure_warm_start(cfg))
        resume_from: dict[str, str | None] = {a: None for a in self.agents}
        if resume is not None:
            state = resume.load_driver_state()
            self.step = state["step"]
            self.tracker.load_state_dict(state["tracker"])
            self.train_set.load_state_dict(state["data"])
            self.totals, self.eval_history = state["totals"], state["eval_history"]
            resume_from = {a: str(resume.agent_dir(a)) for a in self.agents}
            self._saved_step = self.step
            print(f"resuming from {resume.path} (step {self.step})", flush=True)  # on the console: a resubmitted job
        total_updates = cfg.runtime.steps * cfg.algo.updates_per_step
        device = cfg.runtime.cluster.device
        # every agent's resources first: on CPU the engines of one node share its cores (rank 0 hosts the engine)
        placements = []
        try:
            for agent in cfg.agents:  # one by one: a failure leaves the ones already reserved in the list
                placements.append(reserve_placement(agent, device))
            slots = engine_cpu_slots([p.node_of_rank[0] for p in placements]) if device == "cpu" \
                else [None] * len(placements)
            for i, agent in enumerate(cfg.agents):
                self.groups[agent.name] = AgentGroup(
                    agent, seed=cfg.runtime.seed + 1000 * i, run_dir=str(self.out_dir), total_updates=total_updates,
                    device=device, keep_reference=cfg.algo.kl_coef > 0, init_weights=init[agent.name],
                    resume_from=resume_from[agent.name], call_timeout_s=cfg.runtime.call_timeout_s,
                    collective_timeout_s=cfg.runtime.collective_timeout_s, log_dir=str(self.out_dir / "logs"),
                    engine_cpu_slot=slots[i], placement=placements[i])
        except BaseException:  # the reservations no group took over would outlive the run otherwise
            release_placements(placements[len(self.groups):])
            raise
        for group in self.groups.values():
            info = group.wait_ready()
            logger.info("agent %s ready: %s", group.agent.name, info[0])
            for rank in info:  # where each rank runs: the per-node picture of a multi-node job (on the console)
                print(f"placement: agent {rank.agent} rank {rank.rank} on {rank.host} ({rank.address}), rendezvous "
                      f"{rank.rendezvous}{f', engine on {rank.engine_address}' if rank.engine is not None else ''}", flush=True)
        self.broker = self._make_broker(cfg.algo)

    @property
    def train_format(self) -> PromptFormat:
        """How training prompts are written (`data.train.prompt_template`, its system prompt)."""
        return PromptFormat.of(self.cfg.data, "train")

    def _checked_prompts(self, problems: list[MathProblem], what: str) -> list[MathProblem]:
        """`problems` whose gold answer math-verify reads and whose prompt fits every agent's max_prompt_length
        (`data.on_invalid` decides the others; too many unreadable golds stop the start-up: `eval.targets.check_golds`)."""
        data = self.cfg.data
        problems = check_golds(problems, what, data.on_invalid, self.cfg.reward, data.max_invalid_gold_share)
        learners = self._learner_tokenizers()
        agents = [(a.name, learners[a.name].tokenizer, a.tokenizer.chat_template, a.max_prompt_length)
                  for a in self.cfg.agents]
        issues = prompt_length_issues(problems, agents, PromptFormat.of(self.cfg.data, what.split(".")[1]))
        return apply_policy(problems, issues, self.cfg.data.on_invalid, what)

    def _learner_tokenizers(self) -> dict[str, LearnerTokenizer]:
        """Every agent's tokenizer, chat template and response limit (what re-encoding needs), loaded once."""
        if self._learners is None:
            from nemo_hacpo.models.tokenizers import load_tokenizer

            self._learners = {a.name: LearnerTokenizer(load_tokenizer(tokenizer_source(a)), a.max_response_length,
                                                       a.tokenizer.chat_template) for a in self.cfg.agents}
        return self._learners

    def _make_broker(self, algo: AlgoConfig) -> Broker:
        spec = algo.algorithm  # the registry entry, ablations applied
        return Broker(self.agents, self._learner_tokenizers() if spec.shares_rollouts else {}, algorithm=spec,
                      tracker=self.tracker, adv_eps=algo.adv_eps, ratio_length=algo.ratio_length,
                      row_order=algo.row_order, seed=self.cfg.runtime.seed)

    def use_algorithm(self, algo: AlgoConfig) -> None:
        """Train the next steps of this (started) run with another algorithm of the baseline table: the broker's
        mode, the samples per prompt and the loss follow `algo`; workers, engines, weights, optimizer state,
        data position and capability tracker carry on. For A/B measurements on one set of live workers
        (`benchmarks/step_profile.py`, the algorithm tests); a training run keeps one algorithm.

        The workers were built for the run's first algorithm, so a KL term needs the reference model they keep
        (`algo.kl_coef > 0` only when the run started with it) and the capability window stays the tracker's.
        """
        if not self.groups:
            raise RuntimeError("use_algorithm() needs a started run (call start() first)")
        if algo.kl_coef > 0 and not self.groups[self.agents[0]].keep_reference:
            raise ValueError(f"algo {algo.name!r} has kl_coef={algo.kl_coef} but this run's workers keep no "
                             f"reference model (they were started for {self.cfg.algo.name!r} with kl_coef=0)")
        self.broker = self._make_broker(algo)
        self.cfg = dataclasses.replace(self.cfg, algo=algo)

    # ---------------------------------------------------------------------------------------------- step
    def run_step(self, scorer) -> dict[str, float]:
        cfg, step, algo = self.cfg, self.step + 1, self.cfg.algo
        samples = self.samples_per_prompt
        timings: dict[str, float] = {}
        tick = time.perf_counter()
        problems = self.train_set.next_batch(algo.batch_size)
        messages = [self.train_format.messages(p) for p in problems]

        # the step fixes the sampling seeds: a resumed run draws exactly what an uninterrupted one would
        # colocated GPU engines sleep after generating: their GPUs train next, and the refit wakes them
        pending = {a: g.generate(messages, samples, seed=call_base_seed(g.seed, step), sleep_after=True)
                   for a, g in self.groups.items()}
        generated = {a: call.result() for a, call in pending.items()}
        timings["generate_s"] = time.perf_counter() - tick

        tick = time.perf_counter()
        texts = [r.text for a in self.agents for r in generated[a].flat()]
        golds = [p.answer for _ in self.agents for p in problems for _ in range(samples)]
        scored = scorer.score(texts, golds)
        per_agent = len(problems) * samples
        rewards = {a: scored.rewards[i * per_agent:(i + 1) * per_agent] for i, a in enumerate(self.agents)}
        timings["reward_s"] = time.perf_counter() - tick
        metrics: dict[str, float] = dict(scored.metrics())

        tick = time.perf_counter()
        with_tokens = algo.algorithm.needs_old_token_logprobs
        old_pending = {a: g.old_logprobs(generated[a], with_tokens) for a, g in self.groups.items()}
        rollouts = {}
        for a, call in old_pending.items():
            rollouts[a], agent_metrics = own_rollouts(a, problems, messages, generated[a], rewards[a], call.result(),
                                                      step)
            metrics.update({f"{a}/{k}": v for k, v in agent_metrics.items()})
            metrics[f"{a}/generate_tokens_per_s"] = generated[a].stats["tokens_per_s"]
        timings["logprob_s"] = time.perf_counter() - tick

        tick = time.perf_counter()
        brokered = self.broker.step(rollouts, step)
        for failure in brokered.failures:
            logger.warning("re-encoding dropped a cross sample: %s", failure)
        metrics.update(brokered.metrics())
        timings["broker_s"] = time.perf_counter() - tick
        if cfg.runtime.save_rollouts:
            write_jsonl(self.out_dir / "rollouts" / f"step_{step:06d}.jsonl",
                        [r.trajectory for a in self.agents for r in rollouts[a]])

        tick = time.perf_counter()
        objective = Objective.of(algo)
        train_pending = {a: g.train(brokered.rows[a], objective, step) for a, g in self.groups.items()}
        for a, call in train_pending.items():
            trained = call.result()
            result = trained.flat()
            rows = brokered.rows[a]
            if trained.rows is not None and not bool(rows.is_own.all()):  # per direction: s, gradient shares
                metrics.update(direction_metrics(a, self.agents, rows.source, ~rows.is_own, trained.rows,
                                                 rows.advantages))
            if not result.get("num_cross"):  # isolated modes: cross statistics over no rows are undefined
                result = {k: v for k, v in result.items() if not k.startswith("cross_")}
            metrics.update({f"{a}/train/{k}": v for k, v in result.items()})
            self.totals[a]["rollouts_generated"] += brokered.generated[a]
            self.totals[a]["sequences_trained"] += len(brokered.rows[a])
            metrics[f"{a}/rollouts_generated_total"] = self.totals[a]["rollouts_generated"]
            metrics[f"{a}/sequences_trained_total"] = self.totals[a]["sequences_trained"]
        timings["train_s"] = time.perf_counter() - tick

        tick = time.perf_counter()
        refit_pending = {a: g.refit() for a, g in self.groups.items()}
        for a, call in refit_pending.items():
            refit = call.result()
            metrics[f"{a}/refit_mb"] = refit.bytes / 1e6
        timings["refit_s"] = time.perf_counter() - tick
        metrics.update({f"time/{k}": v for k, v in timings.items()})
        self.step = step
        return metrics

    # ----------------------------------------------------------------------------------------------- run
    def evaluate(self, scorer) -> dict[str, float]:
        """Held-out greedy accuracy (`<agent>/eval_accuracy`) and, with runtime.eval_samples, avg@n / pass@k; every
        problem's responses and rewards in `<output_dir>/eval/step_<n>/<agent>__heldout.jsonl`."""
        results = evaluate_agents(self.groups, self.eval_problems, self.cfg, scorer, self.step,
                                  answers_dir=self.out_dir / "eval" / f"step_{self.step:06d}")
        correct = {a: list(r.pop("correct")) for a, r in results.items()}
        record: dict[str, Any] = {"step": self.step, **{a: r["accuracy"] for a, r in results.items()},
                                  "correct": correct}
        n = self.cfg.runtime.eval_samples
        if n > 0:  # sampled accuracy (avg@n) and pass@n, for the final table
            record["sampled"] = {a: {k: r[k] for k in (f"avg@{n}", f"pass@{n}")} for a, r in results.items()}
        self.eval_history.append(record)
        metrics = {}
        for agent, result in results.items():
            metrics[f"{agent}/eval_accuracy"] = result["accuracy"]
            metrics.update({f"{agent}/eval/{k}": v for k, v in result.items() if k != "accuracy"})
        return metrics

    def fit(self) -> int:
        from nemo_hacpo.rewards import MathRewardScorer

        cfg = self.cfg
        self.start()
        sinks = cfg.runtime.logging
        # a resumed run repeats the steps after its checkpoint: drop what the interrupted run logged for them
        dropped = drop_records_after(self.out_dir / "metrics.jsonl", self.step)
        if dropped:
            logger.info("metrics.jsonl: dropped %d record(s) logged after step %d by the interrupted run", dropped, self.step)
        with MathRewardScorer.from_config(cfg.reward) as scorer, \
                MetricsLogger(self.out_dir, sinks, total_steps=cfg.runtime.steps, start_step=self.step,
                              agents=self.agents,
                              wandb_project=cfg.runtime.wandb_project, wandb_run_name=cfg.runtime.wandb_run_name,
                              run_config=dataclasses.asdict(cfg) if "wandb" in sinks else None) as log:
            if not self.eval_history:
                log.log(self.step, self.evaluate(scorer))
            cross_path = CrossPathMonitor(self.agents)
            self.preemption.signal.begin_training()  # from here SIGUSR1 lets the step in progress finish
            if (limit := self.preemption.deadline.describe()) is not None:
                print(limit, flush=True)
            while self.step < cfg.runtime.steps:
                self._check_lock()  # taken over between steps: the next step writes nothing into the directory
                if (why := self.preemption.reason()) is not None:  # SIGUSR1, or no time for a step and a save
                    return self.stop_early(why)
                tick = time.monotonic()
                metrics = self.run_step(scorer)
                for message in cross_path.update(metrics):
                    logger.warning(message)
                interval = cfg.runtime.eval_interval
                if interval and self.step % interval == 0 and self.step < cfg.runtime.steps:
                    metrics.update(self.evaluate(scorer))
                if self.step == cfg.runtime.steps:
                    metrics.update(self.evaluate(scorer))
                self._check_lock()  # nor its metrics
                log.log(self.step, metrics)
                self.preemption.step_took(time.monotonic() - tick)
                every = cfg.runtime.checkpoint_interval
                if (every and self.step % every == 0) or self.step == cfg.runtime.steps:
                    self.checkpoint()
            if (why := self.preemption.reason(deadline=False)) is not None:  # the export and report: on the rerun
                return self.stop_early(why)
        if cfg.runtime.save_hf:
            self.export_hf()
        self.report()
        return 0

    def _check_lock(self) -> None:
        """`LockLost` once another run has taken the output directory's lock over (`run_lock.RunLock.check`)."""
        if self._lock is not None:
            self._lock.check()

    def export_hf(self) -> dict[str, Path]:
        """Every agent's current weights (+ tokenizer) as an HF checkpoint under `<output_dir>/hf/<agent>`, the
        end of the run: colocated engines sleep for good first."""
        pending = {a: g.save_hf(str(self.out_dir / "hf" / a), release_engine=True) for a, g in self.groups.items()}
        for call in pending.values():
            call.result()
        return {a: self.out_dir / "hf" / a for a in self.agents}

    def checkpoint(self) -> Path:
        self._check_lock()  # another run has taken the directory over: write nothing into it
        state = {"step": self.step, "tracker": self.tracker.state_dict(), "data": self.train_set.state_dict(),
                 "totals": self.totals, "eval_history": self.eval_history}
        tick = time.monotonic()
        path = save_run_checkpoint(self.out_dir, self.step, state, self.groups, keep=self.cfg.runtime.keep_checkpoints,
                                   hashes=self.cfg.runtime.checkpoint_hashes)
        self.preemption.checkpoint_took(time.monotonic() - tick)
        self._saved_step = self.step
        return path

    def stop_early(self, why: str) -> int:
        """Stop before `runtime.steps` (SIGUSR1, the time limit): a checkpoint of the current step unless the run
        just saved or resumed from one, verified against its manifest (every file there with its size, the driver
        state readable; digests are checked when a run resumes); `EXIT_PREEMPTED`, or 1 if it does not verify."""
        print(why, file=sys.stderr, flush=True)
        if self.step != self._saved_step:
            self.checkpoint()
        saved = next((c for c in checkpoints(self.out_dir) if c.step == self.step), None)
        if saved is None:  # nothing trained yet and nothing to resume from
            print("preempted: no checkpoint yet (a rerun starts over)", file=sys.stderr, flush=True)
            return EXIT_PREEMPTED
        problems = saved.problems(hashes=False)
        if problems:
            print(f"checkpoint {saved.path} does not verify: {'; '.join(problems[:5])}", file=sys.stderr, flush=True)
            return 1
        print(f"preempted: checkpoint step {self.step} ({saved.path}); the same command continues from it",
              file=sys.stderr, flush=True)
        return EXIT_PREEMPTED

    def report(self) -> str:
        """Per-agent table (start vs end held-out accuracy, rollouts, sequences) + reward and accuracy plots."""
        first, last = self.eval_history[0], self.eval_history[-1]
        rows = []
        for a in self.agents:
            row = {"agent": a, "eval_accuracy_start": first[a], "eval_accuracy_end": last[a]}
            if "correct" in first and "correct" in last and last is not first:  # paired: the same problems
                test = mcnemar_exact(first["correct"][a], last["correct"][a])
                row.update(gained=test.gained, lost=test.lost, mcnemar_p=f"{test.p_value:.2g}")  # 3.1e-23, not 0.000
            if "sampled" in first and "sampled" in last:  # runtime.eval_samples: avg@n and pass@n, start → end
                for key in first["sampled"][a]:
                    row[f"{key}_start"], row[f"{key}_end"] = first["sampled"][a][key], last["sampled"][a][key]
            row.update(rollouts_generated=self.totals[a]["rollouts_generated"],
                       sequences_trained=self.totals[a]["sequences_trained"])
            rows.append(row)
        table = markdown_table(rows, list(rows[0]))
        metrics_file = self.out_dir / "metrics.jsonl"
        records = read_metrics(metrics_file) if metrics_file.is_file() else []
        directions = direction_table(records, self.agents)
        if directions:  # sharing modes: what each learner took from each partner's rollouts
            table += "\n\ncross path (s: the ratio of each cross row when trained; grad_frac: share with gradient)\n\n"
            table += markdown_table(directions, list(directions[0]))
            plot_directions(records, self.agents, self.out_dir / "cross_path.png",
                            title=f"{self.cfg.algo.name}: cross path per direction", clip_lower=1 - self.cfg.algo.delta)
        (self.out_dir / "summary.md").write_text(f"# {self.cfg.algo.name}: {self.step} steps\n\n{table}\n")
        if metrics_file.is_file():
            name = self.cfg.algo.name
            write_curves(metrics_file, self.out_dir / "reward_curve.png", ["*/reward_mean"], smooth=REWARD_SMOOTHING,
                         title=f"{name}: training reward", ylabel="mean reward")
            write_curves(metrics_file, self.out_dir / "eval_accuracy.png", ["*/eval_accuracy", "*/eval/avg@*"],
                         dashed=["*/eval/avg@*"], ylabel="accuracy",
                         title=f"{name}: held-out accuracy (solid: greedy; dashed: avg@n, sampled)")
            write_curves(metrics_file, self.out_dir / "response_length.png", ["*/response_length_mean"],
                         smooth=REWARD_SMOOTHING, title=f"{name}: mean response length (training samples)",
                         ylabel="tokens")
        print(table)
        print(f"outputs: {self.out_dir} (summary.md, metrics.jsonl, reward_curve.png, eval_accuracy.png, "
              "response_length.png, eval/step_<n>/<agent>__heldout.jsonl"
              + (", cross_path.png" if directions else "")
              + (", hf/<agent>)" if self.cfg.runtime.save_hf else ")"))
        return table

    def close(self, timeout_s: float = 120.0) -> None:
        """Shut every agent's group down, engines first: all groups are asked at once and share one deadline
        (the placement groups' release too, see `groups.wait_released`)."""
        try:
            deadline = time.monotonic() + timeout_s
            pending = {name: group.start_shutdown() for name, group in self.groups.items()}
            for name, group in self.groups.items():
                group.finish_shutdown(pending[name], deadline)
            wait_released([group.release_placement() for group in self.groups.values()], deadline)
        finally:  # the directory is free once nothing of this run writes there any more
            if self._lock is not None:
                try:
                    if self._lock.lost is None:  # another run's directory is not this one's to sweep
                        # the queues of engines whose actors were killed just now: their processes exit a moment later
                        sweep_recorded(engine_records(self.out_dir), wait_s=ENGINE_EXIT_WAIT_S)
                except Exception:
                    logger.exception("sweeping the engines' shared memory recorded in %s failed",
                                     engine_records(self.out_dir))
                finally:
                    self._lock.release()
                    self._lock = None


class Terminated(KeyboardInterrupt):
    """A stop signal (SIGTERM: a `kill`, a scheduler's stop) arrived: the run stops and shuts its engines down.

    A KeyboardInterrupt, not an Exception: Ray's blocking calls (`ray.get`, `ray.wait`) hand an interrupt raised
    by a signal handler back to the caller as a plain KeyboardInterrupt, while any other exception comes out as
    a SystemError. `_StopSignal.received` says which signal it was."""


class _StopSignal:
    """The SIGTERM handler: records the signal, then interrupts whatever the main thread is doing."""

    def __init__(self) -> None:
        self.received: str | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        if self.received is not None:  # one stop at a time: a second SIGTERM (srun passes on the job's own and
            return  # the trap's) must not cut short the stop message or the shutdown
        self.received = signal.Signals(signum).name
        raise Terminated(self.received)


def train(cfg: HacpoConfig) -> int:
    """Entry point of `recipes/train.py`: run the configured training to the end; the exit status (0 done,
    1 a worker failed, 2 a start-up check failed — the output directory held by another run among them —,
    75 stopped early with a checkpoint to continue from: SIGUSR1 or the time limit, see `preemption`,
    143 stopped by SIGTERM).

    On any stop the worker groups are shut down — engines first — before the process exits, so no vLLM process
    outlives the run; the message names the last complete checkpoint a rerun resumes from."""
    in_main = threading.current_thread() is threading.main_thread()
    preempt = StopSignal()  # SIGUSR1: installed first, so that no moment of the start-up dies of it
    previous_usr1 = install_preempt_handler(preempt) if in_main else None
    try:
        return _train(cfg, preempt, in_main)
    finally:
        if in_main:
            restore_preempt_handler(previous_usr1)


def _train(cfg: HacpoConfig, preempt: StopSignal, in_main: bool) -> int:
    from nemo_hacpo.rewards import RewardPoolError

    try:
        cfg = startup_checks(cfg)
        run = HacpoRun(cfg, preempt)  # loads and checks the data
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if not preempt.raised:
            raise
        print("preempted: before the run started (nothing written)", file=sys.stderr, flush=True)
        return EXIT_PREEMPTED
    stop_signal = _StopSignal()
    previous = signal.signal(signal.SIGTERM, stop_signal) if in_main else None
    shutdown_s = 120.0  # a normal end: the engines' own shutdown may take a while
    try:
        return run.fit()
    except ConfigError as err:  # a start-up check: the run record, the data, the output directory's lock
        print(err, file=sys.stderr)
        return 2
    except (WorkerFailure, LockLost, RewardPoolError, KeyboardInterrupt) as stop:
        signalled = isinstance(stop, KeyboardInterrupt) and (stop_signal.received is not None or preempt.raised)
        if isinstance(stop, KeyboardInterrupt) and not signalled:
            raise  # Ctrl-C: Python's own behaviour (the groups still shut down below)
        # A worker failure: the failed ranks will not answer. A signal: Slurm's KillWait (30 s by default)
        # counts from the SIGTERM, so the shutdown gets seconds, not minutes.
        shutdown_s = 15.0 if isinstance(stop, KeyboardInterrupt) else 30.0
        last = latest_checkpoint(run.out_dir, hashes=False, quarantine=False)  # sizes and driver state: quick
        if signalled and stop_signal.received is None:  # SIGUSR1 while starting: nothing trained since `last`
            print(f"{preempt.received} while the run was starting: stopping at once\npreempted: "
                  + (f"checkpoint step {last.step} ({last.path}); the same command continues from it" if last
                     else "no checkpoint yet (a rerun starts over)"), file=sys.stderr, flush=True)
            return EXIT_PREEMPTED
        what = f"stopped by {stop_signal.received}" if isinstance(stop, KeyboardInterrupt) else str(stop)
        print(f"job stopped: {what}\nlast complete checkpoint: "
              f"{last.path if last else 'none'} (a rerun with the same output_dir resumes from it)", file=sys.stderr)
        return 143 if isinstance(stop, KeyboardInterrupt) else 1
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the shutdown short
        preempt.begin_shutdown()  # nor a SIGUSR1 (after a start-up failure it would still raise)
        run.close(timeout_s=shutdown_s)
        if in_main:  # None: the handler was not installed from Python; restore the default then
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)

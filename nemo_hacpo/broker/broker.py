"""The per-step broker: every agent's rollouts in, one `TrainingRows` per learner out (algorithm.md §1–3, §6–7).

    rollouts[agent] ──► accuracy per agent ──► CapabilityTracker.update
                    ──► rewards [B, n, G] ──► per learner k: advantages (its baseline, its ω)
                    ──► own rows (the generated ids) + other agents' rows (re-encoded for k), built own
                        first, then put in `algo.row_order` (by prompt by default)

What the rows look like is decided by the algorithm's registry entry (`nemo_hacpo.algo.registry`), not by its
name: `shares_rollouts` (are other agents' rows added), `capability_baseline` (ω in the baseline, else the
plain mean), `omega_on_rows` (ω as the rows' gradient weight, else 1) and `cross_objective` (do other agents'
rows get the cross objective, else the own-row one). The ablation switches arrive already applied
(`AlgoConfig.algorithm`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from nemo_hacpo.algo import CapabilityTracker, group_advantages, hacpo_advantages
from nemo_hacpo.algo.registry import Algorithm
from nemo_hacpo.algo.rows import TrainingRows
from nemo_hacpo.broker.reencode import ReencodeError
from nemo_hacpo.broker.reencode_pool import ReencodePool
from nemo_hacpo.broker.trajectory import Trajectory

COUNTS = ("self_rows", "cross_rows", "reencode_truncated", "reencode_separate", "reencode_failed", "trained_rows")
"""Per-learner row counts of a step (logged as `<learner>/broker/<count>`)."""

RATIO_LENGTHS = ("per_tokenizer", "single_exponent")
"""Length conventions of the cross ratio (`AlgoConfig.ratio_length`, algorithm.md §4)."""


@dataclass(frozen=True)
class AgentRollout:
    """An agent's own response: the neutral `Trajectory` plus the exact ids it generated.

    `token_ids` = prompt ids + generated response ids (with the agent's EOS when it finished); `response_mask`
    is 1 exactly on the generated part. `old_token_logprobs` (`[len(token_ids) − 1]`, the shifted layout: entry
    t scores token t + 1) are the agent's trainer's per-token log-probs at the sampling weights, carried only
    when the agent's loss needs them (token level; `Algorithm.needs_old_token_logprobs`).
    """

    trajectory: Trajectory
    token_ids: list[int]
    response_mask: list[int]
    old_token_logprobs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.response_mask):
            raise ValueError(f"token_ids ({len(self.token_ids)}) and response_mask ({len(self.response_mask)}) "
                             f"differ in length for {self.trajectory.source}/{self.trajectory.prompt_id}")
        if self.old_token_logprobs is not None and tuple(self.old_token_logprobs.shape) != (len(self.token_ids) - 1,):
            raise ValueError(f"old_token_logprobs must have shape [{len(self.token_ids) - 1}] (one per predicted "
                             f"token), got {tuple(self.old_token_logprobs.shape)}")


@dataclass(frozen=True)
class LearnerTokenizer:
    """What the broker needs to re-encode for one learner."""

    tokenizer: Any
    max_response_tokens: int
    chat_template: str | None = None


@dataclass
class BrokerStep:
    """What one broker step returns: the rows of every learner plus the step's capability numbers."""

    rows: dict[str, TrainingRows]
    accuracy: dict[str, float]
    capability: dict[str, float]
    omega: dict[str, dict[str, float]]
    """omega[learner][source] = ω(source→learner), the tracker's capability ratio (whether or not the algorithm
    uses it; the weight the rows carry is in `rows[learner].omega`)."""
    generated: dict[str, int]
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    """counts[learner][name] for every name of `COUNTS`."""
    failures: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for learner, rows in self.rows.items():
            out[f"{learner}/accuracy"] = self.accuracy[learner]
            out[f"{learner}/capability"] = self.capability[learner]
            out[f"{learner}/rollouts_generated"] = float(self.generated[learner])
            for key, value in self.counts[learner].items():
                out[f"{learner}/broker/{key}"] = float(value)
            for source, value in self.omega[learner].items():
                if source != learner:
                    out[f"{learner}/omega/{source}"] = value
            out.update({f"{learner}/{k}": v for k, v in advantage_stats(rows).items()})
        return out


def advantage_stats(rows: TrainingRows) -> dict[str, float]:
    """Mean / std / min / max of the advantages of the learner's own rows and of the other agents' rows
    (`adv/self_mean`, `adv/cross_mean`, ...), the fraction of rows with A = 0 (groups with equal rewards carry no
    signal) and the mean gradient weight ω of other agents' rows (`adv/cross_omega_mean`) — whatever objective
    the loss applies to them (naive sharing trains them like own rows)."""
    out: dict[str, float] = {}
    if len(rows) == 0:
        return out
    adv = rows.advantages.double()
    out["adv/zero_frac"] = float((adv == 0).double().mean())
    for kind, selected in (("self", rows.is_own), ("cross", ~rows.is_own)):
        values = adv[selected]
        if values.numel() == 0:
            continue
        out[f"adv/{kind}_mean"] = float(values.mean())
        out[f"adv/{kind}_std"] = float(values.std(unbiased=False))
        out[f"adv/{kind}_min"] = float(values.min())
        out[f"adv/{kind}_max"] = float(values.max())
    if bool((~rows.is_own).any()):
        out["adv/cross_omega_mean"] = float(rows.omega[~rows.is_own].double().mean())
    return out


def _group(rollouts: Mapping[str, Sequence[AgentRollout]], agents: Sequence[str]):
    """Check the batch is a full joint group and index it: returns prompt ids, G and [agent][prompt][i]."""
    missing = [a for a in agents if a not in rollouts]
    extra = [a for a in rollouts if a not in agents]
    if missing or extra:
        raise ValueError(f"rollouts must cover exactly the agents {list(agents)}; missing {missing}, unknown {extra}")
    prompt_ids: list[str] = []
    for r in rollouts[agents[0]]:
        if r.trajectory.prompt_id not in prompt_ids:
            prompt_ids.append(r.trajectory.prompt_id)
    table: dict[str, dict[str, dict[int, AgentRollout]]] = {}
    sizes = set()
    for agent in agents:
        per_prompt: dict[str, dict[int, AgentRollout]] = {p: {} for p in prompt_ids}
        for r in rollouts[agent]:
            t = r.trajectory
            if t.source != agent:
                raise ValueError(f"a rollout of {t.source!r} was passed under agent {agent!r}")
            if t.prompt_id not in per_prompt:
                raise ValueError(f"agent {agent!r} answered prompt {t.prompt_id!r} that {agents[0]!r} did not")
            if t.sample_index in per_prompt[t.prompt_id]:
                raise ValueError(f"agent {agent!r} has two responses with sample_index {t.sample_index} "
                                 f"for prompt {t.prompt_id!r}")
            per_prompt[t.prompt_id][t.sample_index] = r
        for p, samples in per_prompt.items():
            if sorted(samples) != list(range(len(samples))):
                raise ValueError(f"agent {agent!r}: prompt {p!r} has sample indices {sorted(samples)}, "
                                 "expected 0..G-1")
            sizes.add(len(samples))
        table[agent] = per_prompt
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"every agent must give the same number G ≥ 1 of responses per prompt, got {sorted(sizes)}")
    return prompt_ids, sizes.pop(), table


class Broker:
    """Builds every learner's training rows for one step; owns the capability tracker between steps.

    Args:
        agents: agent names, in the order of every per-agent tensor.
        tokenizers: each learner's tokenizer for re-encoding (needed only when the algorithm shares rollouts).
        algorithm: the registry entry, ablations applied (`AlgoConfig.algorithm`).
        tracker: the capability tracker (checkpointed by the runtime); a fresh one by default.
        adv_eps: ε added to the standard deviation of the advantage.
        pool: worker processes for re-encoding (in-process by default).
        ratio_length: the cross ratio's length convention (`AlgoConfig.ratio_length`): under `single_exponent`
            each cross row's `ratio_length_scale` is L_learner / L_source.
        row_order: `AlgoConfig.row_order`: `by_prompt` (the default), `own_first` or `shuffled` (`order_rows`).
        seed: the run's seed, which with the step and the learner draws a `shuffled` order.
    """

    def __init__(self, agents: Sequence[str], tokenizers: Mapping[str, LearnerTokenizer], *, algorithm: Algorithm,
                 tracker: CapabilityTracker | None = None, adv_eps: float = 1e-6, pool: ReencodePool | None = None,
                 ratio_length: str = "per_tokenizer", row_order: str = "by_prompt", seed: int = 0):
        if ratio_length not in RATIO_LENGTHS:
            raise ValueError(f"ratio_length must be one of {RATIO_LENGTHS}, got {ratio_length!r}")
        if row_order not in ROW_ORDERS:
            raise ValueError(f"row_order must be one of {ROW_ORDERS}, got {row_order!r}")
        self.row_order, self.seed = row_order, seed
        self.ratio_length = ratio_length
        self.agents = tuple(agents)
        if len(set(self.agents)) != len(self.agents):
            raise ValueError(f"agent names must be unique, got {self.agents}")
        if algorithm.shares_rollouts:
            if len(self.agents) < 2:
                raise ValueError(f"algorithm {algorithm.name!r} shares rollouts and needs ≥ 2 agents")
            missing = [a for a in self.agents if a not in tokenizers]
            if missing:
                raise ValueError(f"no tokenizer given for agents {missing}")
        self.tokenizers = dict(tokenizers)
        self.algorithm = algorithm
        self.tracker = tracker or CapabilityTracker(self.agents)
        if tuple(self.tracker.agents) != self.agents:
            raise ValueError(f"tracker agents {self.tracker.agents} differ from broker agents {self.agents}")
        self.adv_eps = adv_eps
        self.pool = pool or ReencodePool(0)

    def step(self, rollouts: Mapping[str, Sequence[AgentRollout]], step_number: int = 0) -> BrokerStep:
        """Every learner's rows of one step (`step_number` draws a `shuffled` row order; the loop passes its step)."""
        agents = self.agents
        prompt_ids, group_size, table = _group(rollouts, agents)
        batch = len(prompt_ids)
        # rewards[b, j, i]: reward of agent j's i-th response to prompt b
        rewards = torch.tensor([[[table[a][p][i].trajectory.reward for i in range(group_size)] for a in agents]
                                for p in prompt_ids], dtype=torch.float64)  # [B, n, G]
        accuracy = {a: float((rewards[:, j] > 0).double().mean()) for j, a in enumerate(agents)}
        self.tracker.update(accuracy)
        omega = {k: {j: self.tracker.ratio(j, k) for j in agents} for k in agents}

        step = BrokerStep(rows={}, accuracy=accuracy, capability={a: self.tracker.capability(a) for a in agents},
                          omega=omega, generated={a: batch * group_size for a in agents})
        for k, learner in enumerate(agents):
            rows, counts, failures, prompt_of = self._rows(learner, k, prompt_ids, group_size, table, rewards,
                                                           omega[learner])
            order = order_rows(rows, self.row_order, prompt_of=prompt_of, seed=(self.seed, step_number, k))
            step.rows[learner], step.counts[learner] = rows.select(order) if order is not None else rows, counts
            step.failures.extend(failures)
        return step

    def _advantages(self, k: int, rewards: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
        """`[B, n, G]` advantages of learner k (zeros on other agents' blocks when rollouts are not shared)."""
        if not self.algorithm.shares_rollouts:
            adv = torch.zeros_like(rewards)
            adv[:, k] = group_advantages(rewards[:, k], eps=self.adv_eps)
            return adv
        baseline_omega = omega if self.algorithm.capability_baseline else torch.ones_like(omega)
        return hacpo_advantages(rewards, k, baseline_omega, eps=self.adv_eps)

    def _rows(self, learner: str, k: int, prompt_ids: list[str], group_size: int, table, rewards: torch.Tensor,
              omega: dict[str, float]) -> tuple[TrainingRows, dict[str, int], list[str], list[int]]:
        """The learner's rows as built (own first), their counts, the re-encoding failures, each row's prompt."""
        agents, spec = self.agents, self.algorithm
        omega_vec = torch.tensor([omega[a] for a in agents], dtype=torch.float64)  # [n], ω(j→k)
        adv = self._advantages(k, rewards, omega_vec)  # [B, n, G]
        row_omega = omega_vec if spec.omega_on_rows else torch.ones_like(omega_vec)

        token_ids, masks, meta = [], [], []  # meta: (source j, prompt b, sample i)
        length_scale: list[float] = []  # ratio_length_scale of each row
        own_token_logprobs = []
        for b, p in enumerate(prompt_ids):
            for i in range(group_size):
                own = table[learner][p][i]
                token_ids.append(list(own.token_ids))
                masks.append(list(own.response_mask))
                meta.append((k, b, i))
                length_scale.append(1.0)
                own_token_logprobs.append(own.old_token_logprobs)
        counts = dict.fromkeys(COUNTS, 0)
        counts["self_rows"] = len(token_ids)
        failures: list[str] = []
        if spec.shares_rollouts:
            tok = self.tokenizers[learner]
            for j, source in enumerate(agents):
                if j == k:
                    continue
                refs = [(b, i, table[source][p][i].trajectory) for b, p in enumerate(prompt_ids)
                        for i in range(group_size)]
                results = self.pool.reencode([(t.messages, t.response_text, t.finished) for _, _, t in refs],
                                             tok.tokenizer, tok.max_response_tokens, chat_template=tok.chat_template)
                for (b, i, t), result in zip(refs, results, strict=True):
                    if isinstance(result, ReencodeError):
                        counts["reencode_failed"] += 1
                        failures.append(f"{source}→{learner} prompt {t.prompt_id} sample {i}: {result}")
                        continue
                    token_ids.append(result.token_ids)
                    masks.append(result.response_mask)
                    meta.append((j, b, i))
                    length_scale.append(self._length_scale(sum(result.response_mask), t.source_num_tokens))
                    counts["cross_rows"] += 1
                    counts["reencode_truncated"] += int(result.truncated)
                    counts["reencode_separate"] += int(result.method == "separate")
        counts["trained_rows"] = len(meta)

        source = torch.tensor([m[0] for m in meta], dtype=torch.long)
        prompt_index = torch.tensor([m[1] for m in meta], dtype=torch.long)
        sample = torch.tensor([m[2] for m in meta], dtype=torch.long)
        old_mean = torch.tensor([table[agents[j]][prompt_ids[b]][i].trajectory.source_mean_logprob
                                 for j, b, i in meta], dtype=torch.float32)
        old_tokens = _stack_token_logprobs(own_token_logprobs, learner) if spec.needs_old_token_logprobs else None
        rows = TrainingRows(
            token_ids=token_ids, response_mask=masks,
            advantages=adv[prompt_index, source, sample].float(),
            cross_objective=(source != k) & spec.cross_objective,
            omega=row_omega[source].float(),
            old_mean_logprob=old_mean,
            is_own=source == k,
            source=source,
            old_token_logprobs=old_tokens,
            ratio_length_scale=torch.tensor(length_scale, dtype=torch.float32),
        )
        return rows, counts, failures, prompt_index.tolist()

    def _length_scale(self, learner_tokens: int, source_tokens: int) -> float:
        """L_learner / L_source under the single-exponent convention (1 under per-tokenizer, or when either
        side has no response token: its mean log-prob is 0 either way)."""
        if self.ratio_length == "per_tokenizer" or learner_tokens == 0 or source_tokens == 0:
            return 1.0
        return learner_tokens / source_tokens


ROW_ORDERS = ("own_first", "by_prompt", "shuffled")


def order_rows(rows: TrainingRows, row_order: str, *, prompt_of: Sequence[int], seed: tuple[int, int, int]
               ) -> list[int] | None:
    """The training order of a learner's rows, built own rows first (docs/algorithm.md §6); None: as built.

    `by_prompt`: prompt by prompt (`prompt_of[r]`: row r's prompt), each prompt's own rows before the others' (a
    stable sort, so within a prompt the build order stays); `shuffled`: a permutation drawn from `seed` = (run seed,
    step, learner index) — the same on every rank and on a resumed run."""
    if row_order == "own_first":
        return None
    if row_order == "by_prompt":
        own = rows.is_own.tolist()
        return sorted(range(len(rows)), key=lambda r: (prompt_of[r], not own[r]))
    if row_order == "shuffled":
        generator = torch.Generator().manual_seed(hash_seed(*seed))
        return torch.randperm(len(rows), generator=generator).tolist()
    raise ValueError(f"row_order must be one of {ROW_ORDERS}, got {row_order!r}")


def hash_seed(*parts: int) -> int:
    """A 63-bit seed from integers, independent of Python's hash randomisation."""
    digest = hashlib.sha256(",".join(str(int(p)) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _stack_token_logprobs(per_row: list[torch.Tensor | None], learner: str) -> torch.Tensor:
    """`[N, T]` (T = longest row) from per-row shifted-layout log-probs, zero-padded on the right."""
    if any(values is None for values in per_row):
        raise ValueError(f"learner {learner!r}: its loss needs the old token log-probs of every own rollout "
                         "(AgentRollout.old_token_logprobs)")
    width = max((values.numel() for values in per_row), default=0)  # type: ignore[union-attr]
    out = torch.zeros((len(per_row), width), dtype=torch.float32)
    for n, values in enumerate(per_row):
        out[n, :values.numel()] = values.float()  # type: ignore[union-attr]
    return out

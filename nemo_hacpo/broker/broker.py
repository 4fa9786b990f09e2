"""The per-step broker: every agent's rollouts in, one training view per learner out (spec §1–2, §6–7).

    rollouts[agent] ──► accuracy per agent ──► CapabilityTracker.update
                    ──► rewards [B, n, G] ──► per learner k: advantages (its baseline, its ω)
                    ──► self rows (own generated ids) + cross rows (re-encoded for k), self first

The same code path serves every algorithm of the baseline table:

| mode      | rows                | advantage                              | per-row ω   | cross rows marked |
|-----------|---------------------|----------------------------------------|-------------|-------------------|
| hacpo     | self + (n−1)·G cross | `hacpo_advantages(rewards, k, ω)`      | ω(j→k)      | cross             |
| naive     | self + (n−1)·G cross | `hacpo_advantages(rewards, k, 1)`      | 1           | self (GSPO clip)  |
| isolated  | self only           | `group_advantages(rewards[:, k])`      | 1           | —                 |

Ablations (hacpo only): `capability_baseline=False` puts ω = 1 in the baseline; `gradient_modulation=False`
puts ω = 1 on the rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from nemo_hacpo.algo import CapabilityTracker, group_advantages, hacpo_advantages
from nemo_hacpo.broker.pool import ReencodePool
from nemo_hacpo.broker.reencode import ReencodeError
from nemo_hacpo.broker.trajectory import Trajectory

Mode = Literal["hacpo", "naive", "isolated"]
MODES = ("hacpo", "naive", "isolated")


def broker_mode(algo_name: str) -> Mode:
    """Map an algorithm name of the config onto a broker mode."""
    if algo_name in ("hacpo", "naive"):
        return algo_name  # type: ignore[return-value]
    if algo_name in ("gspo", "gspo_x2", "grpo"):
        return "isolated"
    raise ValueError(f"unknown algorithm {algo_name!r}")


@dataclass(frozen=True)
class AgentRollout:
    """An agent's own response: the neutral `Trajectory` plus the exact ids it generated.

    `token_ids` = prompt ids + generated response ids (with the agent's EOS when it finished);
    `response_mask` is 1 exactly on the generated part.
    """

    trajectory: Trajectory
    token_ids: list[int]
    response_mask: list[int]

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.response_mask):
            raise ValueError(f"token_ids ({len(self.token_ids)}) and response_mask ({len(self.response_mask)}) "
                             f"differ in length for {self.trajectory.source}/{self.trajectory.prompt_id}")


@dataclass(frozen=True)
class LearnerTokenizer:
    """What the broker needs to re-encode for one learner."""

    tokenizer: Any
    max_response_tokens: int
    chat_template: str | None = None


@dataclass
class LearnerView:
    """One learner's training rows for the step, ordered self first, cross last (not shuffled).

    Row-aligned fields, N rows: `token_ids`/`response_mask` (lists of length-varying lists), and tensors
    `advantages [N]`, `is_cross [N] bool` (as the loss must treat the row), `omega [N]` (gradient weight),
    `behaviour_mean_logprob [N]` (m_k,old for own rows, m_j,old for others'), `source [N]` (agent index),
    `prompt_index [N]`, `rewards [N]`, `truncated [N] bool` (re-encoding cut the response).
    """

    learner: str
    token_ids: list[list[int]]
    response_mask: list[list[int]]
    advantages: torch.Tensor
    is_cross: torch.Tensor
    omega: torch.Tensor
    behaviour_mean_logprob: torch.Tensor
    source: torch.Tensor
    prompt_index: torch.Tensor
    rewards: torch.Tensor
    truncated: torch.Tensor
    counts: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass
class BrokerStep:
    """What one broker step returns: a view per learner plus the step's capability numbers."""

    views: dict[str, LearnerView]
    accuracy: dict[str, float]
    capability: dict[str, float]
    omega: dict[str, dict[str, float]]  # omega[learner][source]
    generated: dict[str, int]
    failures: list[str]

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for learner, view in self.views.items():
            out[f"{learner}/accuracy"] = self.accuracy[learner]
            out[f"{learner}/capability"] = self.capability[learner]
            out[f"{learner}/rollouts_generated"] = float(self.generated[learner])
            for key, value in view.counts.items():
                out[f"{learner}/broker/{key}"] = float(value)
            for source, value in self.omega[learner].items():
                if source != learner:
                    out[f"{learner}/omega/{source}"] = value
            out.update({f"{learner}/{k}": v for k, v in advantage_stats(view).items()})
        return out


def advantage_stats(view: LearnerView) -> dict[str, float]:
    """Mean / std / min / max of the advantages of the view's own rows and other agents' rows (`adv/self_mean`,
    `adv/cross_mean`, ...), the fraction of rows with A = 0 (groups with equal rewards carry no signal) and the
    mean ω of other agents' rows (`adv/cross_omega_mean`)."""
    out: dict[str, float] = {}
    if len(view) == 0:
        return out
    adv = view.advantages.double()
    out["adv/zero_frac"] = float((adv == 0).double().mean())
    # own rows come first (`counts["self_rows"]` of them), other agents' after — whatever the loss makes of
    # them (naive sharing treats every row as its own)
    others = torch.arange(len(view)) >= view.counts.get("self_rows", len(view))
    for kind, rows in (("self", ~others), ("cross", others)):
        values = adv[rows]
        if values.numel() == 0:
            continue
        out[f"adv/{kind}_mean"] = float(values.mean())
        out[f"adv/{kind}_std"] = float(values.std(unbiased=False))
        out[f"adv/{kind}_min"] = float(values.min())
        out[f"adv/{kind}_max"] = float(values.max())
    if bool(others.any()):
        out["adv/cross_omega_mean"] = float(view.omega[others].double().mean())
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
    """Builds every learner's training view for one step; owns the capability tracker between steps."""

    def __init__(self, agents: Sequence[str], tokenizers: Mapping[str, LearnerTokenizer], *, mode: Mode = "hacpo",
                 tracker: CapabilityTracker | None = None, adv_eps: float = 1e-6,
                 capability_baseline: bool = True, gradient_modulation: bool = True,
                 pool: ReencodePool | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.agents = tuple(agents)
        if len(set(self.agents)) != len(self.agents):
            raise ValueError(f"agent names must be unique, got {self.agents}")
        if mode != "isolated":
            if len(self.agents) < 2:
                raise ValueError(f"mode {mode!r} shares rollouts and needs ≥ 2 agents")
            missing = [a for a in self.agents if a not in tokenizers]
            if missing:
                raise ValueError(f"no tokenizer given for agents {missing}")
        self.tokenizers = dict(tokenizers)
        self.mode: Mode = mode
        self.tracker = tracker or CapabilityTracker(self.agents)
        if tuple(self.tracker.agents) != self.agents:
            raise ValueError(f"tracker agents {self.tracker.agents} differ from broker agents {self.agents}")
        self.adv_eps = adv_eps
        self.capability_baseline = capability_baseline
        self.gradient_modulation = gradient_modulation
        self.pool = pool or ReencodePool(0)

    def step(self, rollouts: Mapping[str, Sequence[AgentRollout]]) -> BrokerStep:
        agents = self.agents
        prompt_ids, group_size, table = _group(rollouts, agents)
        batch = len(prompt_ids)
        # rewards[b, j, i]: reward of agent j's i-th response to prompt b
        rewards = torch.tensor([[[table[a][p][i].trajectory.reward for i in range(group_size)] for a in agents]
                                for p in prompt_ids], dtype=torch.float64)  # [B, n, G]
        accuracy = {a: float((rewards[:, j] > 0).double().mean()) for j, a in enumerate(agents)}
        self.tracker.update(accuracy)
        omega = {k: {j: (self.tracker.ratio(j, k) if self.mode == "hacpo" else 1.0) for j in agents} for k in agents}

        views, failures = {}, []
        for k_index, learner in enumerate(agents):
            view, failed = self._view(learner, k_index, prompt_ids, group_size, table, rewards, omega[learner])
            views[learner] = view
            failures.extend(failed)
        return BrokerStep(views=views, accuracy=accuracy,
                          capability={a: self.tracker.capability(a) for a in agents}, omega=omega,
                          generated={a: batch * group_size for a in agents}, failures=failures)

    def _view(self, learner: str, k: int, prompt_ids: list[str], group_size: int, table, rewards: torch.Tensor,
              omega: dict[str, float]) -> tuple[LearnerView, list[str]]:
        agents, n = self.agents, len(self.agents)
        omega_vec = torch.tensor([omega[a] for a in agents], dtype=torch.float64)  # [n], ω(j→k)
        if self.mode == "isolated":
            adv = torch.zeros_like(rewards)
            adv[:, k] = group_advantages(rewards[:, k], eps=self.adv_eps)
        else:
            baseline_omega = omega_vec if self.capability_baseline else torch.ones(n, dtype=torch.float64)
            adv = hacpo_advantages(rewards, k, baseline_omega, eps=self.adv_eps)  # [B, n, G]
        row_omega = omega_vec if (self.mode == "hacpo" and self.gradient_modulation) else torch.ones_like(omega_vec)

        token_ids, masks, meta = [], [], []  # meta: (source j, prompt b, i, truncated)
        for b, p in enumerate(prompt_ids):
            for i in range(group_size):
                own = table[learner][p][i]
                token_ids.append(list(own.token_ids))
                masks.append(list(own.response_mask))
                meta.append((k, b, i, False))
        counts = {"self_rows": len(token_ids), "cross_rows": 0, "reencode_truncated": 0, "reencode_separate": 0,
                  "reencode_failed": 0}
        failures: list[str] = []
        if self.mode != "isolated":
            spec = self.tokenizers[learner]
            for j, source in enumerate(agents):
                if j == k:
                    continue
                refs = [(b, i, table[source][p][i].trajectory) for b, p in enumerate(prompt_ids)
                        for i in range(group_size)]
                results = self.pool.reencode([(t.messages, t.response_text, t.finished) for _, _, t in refs],
                                             spec.tokenizer, spec.max_response_tokens,
                                             chat_template=spec.chat_template)
                for (b, i, t), result in zip(refs, results, strict=True):
                    if isinstance(result, ReencodeError):
                        counts["reencode_failed"] += 1
                        failures.append(f"{source}→{learner} prompt {t.prompt_id} sample {i}: {result}")
                        continue
                    token_ids.append(result.token_ids)
                    masks.append(result.response_mask)
                    meta.append((j, b, i, result.truncated))
                    counts["cross_rows"] += 1
                    counts["reencode_truncated"] += int(result.truncated)
                    counts["reencode_separate"] += int(result.method == "separate")

        source = torch.tensor([m[0] for m in meta], dtype=torch.long)
        prompt_index = torch.tensor([m[1] for m in meta], dtype=torch.long)
        sample = torch.tensor([m[2] for m in meta], dtype=torch.long)
        behaviour = torch.tensor([table[agents[j]][prompt_ids[b]][i].trajectory.source_mean_logprob
                                  for j, b, i, _ in meta], dtype=torch.float32)
        view = LearnerView(
            learner=learner,
            token_ids=token_ids,
            response_mask=masks,
            advantages=adv[prompt_index, source, sample].float(),
            is_cross=(source != k) & torch.tensor(self.mode == "hacpo"),
            omega=row_omega[source].float(),
            behaviour_mean_logprob=behaviour,
            source=source,
            prompt_index=prompt_index,
            rewards=rewards[prompt_index, source, sample].float(),
            truncated=torch.tensor([m[3] for m in meta], dtype=torch.bool),
            counts={**counts, "trained_rows": len(meta)},
        )
        return view, failures

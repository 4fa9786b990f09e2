"""What each algorithm is, in one place: one `Algorithm` entry per name (algorithm.md §8).

Config validation, the broker, the step loop, the trainer's objective and the benchmarks all ask this table;
nothing else in the code compares algorithm names. Adding a variant is one entry:

    ALGORITHMS["hacpo"].shares_rollouts          # True: every learner trains on the joint group
    ALGORITHMS["gspo_x2"].samples_per_prompt(8)  # 16
    algorithm("grpo").loss                       # "token"

| name      | shares | samples | other agents' rows get      | ω on rows | ω in baseline | loss     |
|-----------|--------|---------|-----------------------------|-----------|---------------|----------|
| `hacpo`   | yes    | G       | the cross objective         | yes       | yes           | sequence |
| `naive`   | yes    | G       | the own-row GSPO clip       | no        | no            | sequence |
| `naive_onpolicy` | yes | G     | the own-row GSPO clip, m_old the learner's own | no | no   | sequence |
| `gspo`    | no     | G       | —                           | —         | —             | sequence |
| `gspo_x2` | no     | 2G      | —                           | —         | —             | sequence |
| `grpo`    | no     | G       | —                           | —         | —             | token    |

The ablation switches of `algo.ablation` only ever turn a mechanism *off* (`Algorithm.with_ablations`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

__all__ = ["ALGORITHMS", "LOSS_KINDS", "Algorithm", "LossKind", "algorithm"]

LossKind = Literal["sequence", "token", "nll"]
"""`sequence`: `hacpo_loss` on per-sequence mean log-probs (HACPO, GSPO, naive); `token`: token-level PPO clip
(`grpo_token_loss`); `nll`: the sequence-mean token NLL of supervised fine-tuning (the warm start's objective,
not an RL algorithm). Each names one entry of `training.objective.LOSSES`."""

LOSS_KINDS: tuple[LossKind, ...] = ("sequence", "token", "nll")


@dataclass(frozen=True)
class Algorithm:
    """Everything the code needs to know about one RL algorithm of the baseline table."""

    name: str
    """The `algo.name` that selects it (conf/algo/<name>.yaml)."""
    summary: str
    """One line for `--describe`, the README and error messages."""
    shares_rollouts: bool
    """Every learner trains on the whole joint group (its own rows and the other agents' re-encoded rows);
    False: each agent trains on its own rollouts only, with the per-agent z-score advantage."""
    cross_objective: bool
    """Other agents' rows get the cross objective of algorithm.md §5 (exponential IS, stepwise clip); False: they
    are trained like the learner's own rows (GSPO clip). Meaningful only when `shares_rollouts`."""
    omega_on_rows: bool
    """Other agents' rows are weighted by ω(source→learner) (gradient modulation, algorithm.md §3)."""
    capability_baseline: bool
    """The learner's baseline rescales each source's rewards by ω (algorithm.md §2); False: the plain mean of
    the joint group (sharing) or of the agent's own group (isolated)."""
    loss: LossKind = "sequence"
    """Which policy loss the trainer runs."""
    samples_factor: int = 1
    """Responses per prompt per agent = samples_factor · G (gspo_x2: 2)."""
    cross_old_logprob: Literal["source", "learner"] = "source"
    """The behaviour log-prob m_old of other agents' rows: the source's, at its sampling weights on its own tokens
    (algorithm.md §4; the paper's Eq. 11 and the authors' code), or the learner's own at the weights the step starts
    from — the rows are then trained as if the learner had sampled them (ratio 1 at the first update): pooling the
    rollouts into one on-policy batch (algorithm.md §8)."""

    def __post_init__(self) -> None:
        if self.loss not in LOSS_KINDS:
            raise ValueError(f"algorithm {self.name!r}: unknown loss {self.loss!r}; choose from {LOSS_KINDS}")
        if self.samples_factor < 1:
            raise ValueError(f"algorithm {self.name!r}: samples_factor must be ≥ 1")
        if not self.shares_rollouts and (self.cross_objective or self.omega_on_rows):
            raise ValueError(f"algorithm {self.name!r}: cross objective and ω on rows need shared rollouts")
        if self.cross_old_logprob not in ("source", "learner"):
            raise ValueError(f"algorithm {self.name!r}: cross_old_logprob must be 'source' or 'learner'")
        if self.cross_old_logprob == "learner" and (not self.shares_rollouts or self.cross_objective):
            # §5's cross objective is the source's old policy against the learner's: its clip means nothing else
            raise ValueError(f"algorithm {self.name!r}: the learner's own m_old on other agents' rows needs shared "
                             "rows trained with the own-row objective")
        if self.shares_rollouts and self.loss == "token":
            # the token loss needs old per-token log-probs of every row in the learner's tokenization; another
            # agent's trainer can only give them in its own tokenization
            raise ValueError(f"algorithm {self.name!r}: a token-level loss cannot train on shared rollouts")

    @property
    def needs_old_token_logprobs(self) -> bool:
        """The loss reads per-token log-probs at the sampling weights (token-level PPO), not only m_old."""
        return self.loss == "token"

    def samples_per_prompt(self, group_size: int) -> int:
        """Responses each agent generates per prompt."""
        return self.samples_factor * group_size

    def rows_per_learner(self, num_agents: int, batch_size: int, group_size: int) -> int:
        """Training rows of one learner per step: n·B·G when sharing, B·G (B·2G for gspo_x2) alone."""
        groups = num_agents if self.shares_rollouts else 1
        return groups * batch_size * self.samples_per_prompt(group_size)

    def with_ablations(self, *, capability_baseline: bool = True, gradient_modulation: bool = True) -> Algorithm:
        """This algorithm with mechanisms switched off (`algo.ablation`): a switch can remove a mechanism the
        algorithm has, never add one it lacks."""
        return dataclasses.replace(self, capability_baseline=self.capability_baseline and capability_baseline,
                                   omega_on_rows=self.omega_on_rows and gradient_modulation)


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("hacpo", "shared rollouts, capability-aware baseline, ω modulation, exponential IS, stepwise clip",
              shares_rollouts=True, cross_objective=True, omega_on_rows=True, capability_baseline=True),
    Algorithm("naive", "shared rollouts, plain joint baseline, GSPO clip on every row",
              shares_rollouts=True, cross_objective=False, omega_on_rows=False, capability_baseline=False),
    Algorithm("naive_onpolicy", "shared rollouts pooled as on-policy: the learner's own m_old, GSPO clip, plain "
              "joint baseline", shares_rollouts=True, cross_objective=False, omega_on_rows=False,
              capability_baseline=False, cross_old_logprob="learner"),
    Algorithm("gspo", "each agent alone, GSPO",
              shares_rollouts=False, cross_objective=False, omega_on_rows=False, capability_baseline=False),
    Algorithm("gspo_x2", "each agent alone, GSPO, twice the rollouts",
              shares_rollouts=False, cross_objective=False, omega_on_rows=False, capability_baseline=False,
              samples_factor=2),
    Algorithm("grpo", "each agent alone, token-level PPO clip",
              shares_rollouts=False, cross_objective=False, omega_on_rows=False, capability_baseline=False,
              loss="token"),
)}
"""Every algorithm a config can name, by `algo.name`."""


def algorithm(name: str) -> Algorithm:
    """The registry entry of `name`; a clear error listing the known names otherwise."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; choose from {sorted(ALGORITHMS)}") from None

"""Capability tracking: the rolling accuracy of every agent and the ratios ω derived from it (algorithm.md §1).

    P̂_k,t  = max(floor, mean(P_k,τ for the last `window` steps τ ≤ t))     # current step included
    ω(j→k) = clip(P̂_j / P̂_k, lo, hi)        ω(k→k) = 1        ω = 1 during warm-up

`P_k,τ` is agent k's accuracy over all its responses of step τ (fraction with reward > 0); the caller
computes it and hands it to :meth:`CapabilityTracker.update` once per step, *before* asking for ratios
of that step (the window includes the current step).

The tracker is plain Python (no tensors in its state) so that its :meth:`~CapabilityTracker.state_dict`
is JSON-serialisable and can travel inside every checkpoint.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import torch

STATE_VERSION = 1


def step_accuracy(rewards: torch.Tensor) -> float:
    """`P_k,τ`: the fraction of agent k's responses of one step with reward > 0 (algorithm.md §1).

        P = (1 / numel) · Σ [r > 0]          rewards: any shape, e.g. `[B, G]` for one agent

    Example: rewards `[[1, 0], [0.5, 0]]` → 2 of 4 positive → 0.5.
    """
    if not isinstance(rewards, torch.Tensor) or rewards.numel() == 0:
        raise ValueError("step_accuracy needs a non-empty reward tensor")
    if rewards.is_floating_point() and not bool(torch.isfinite(rewards).all()):
        raise ValueError("step_accuracy: rewards must all be finite")
    return float((rewards > 0).float().mean())


class CapabilityTracker:
    """Rolling capability estimate `P̂` per agent and the clipped ratios `ω(source→learner)`.

    Args:
        agents: agent names, in the order used everywhere else (``omega_vector`` follows it). Unique,
            at least one.
        window: `K`, number of most recent steps averaged (current step included). ≥ 1.
        ratio_bounds: `(lo, hi)` the ratio is clipped to; `0 < lo ≤ 1 ≤ hi`. Spec: `(0.1, 10)`.
        warmup_steps: `W`; after the first `W` calls to :meth:`update` (and before any) every ratio is 1.
        floor: lower bound on `P̂` so that an agent with zero accuracy gives a finite ratio. > 0.

    Example (window 2)::

        t = CapabilityTracker(["a", "b"], window=2)
        t.update({"a": 0.2, "b": 0.4}); t.update({"a": 0.4, "b": 0.4})
        t.capability("a")   # (0.2 + 0.4) / 2 = 0.3
        t.ratio("b", "a")   # clip(0.4 / 0.3, 0.1, 10) = 1.333…
    """

    def __init__(
        self,
        agents: Sequence[str],
        window: int = 5,
        ratio_bounds: tuple[float, float] = (0.1, 10.0),
        warmup_steps: int = 0,
        floor: float = 1e-8,
    ) -> None:
        agents = tuple(agents)
        if not agents:
            raise ValueError("CapabilityTracker needs at least one agent name")
        if not all(isinstance(name, str) and name for name in agents):
            raise ValueError(f"agent names must be non-empty strings, got {agents!r}")
        if len(set(agents)) != len(agents):
            raise ValueError(f"agent names must be unique, got {agents!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an integer ≥ 1, got {window!r}")
        lo, hi = (float(bound) for bound in ratio_bounds)
        if not (math.isfinite(lo) and math.isfinite(hi) and 0.0 < lo <= 1.0 <= hi):
            raise ValueError(f"ratio_bounds must satisfy 0 < lo <= 1 <= hi (finite), got {ratio_bounds!r}")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer ≥ 0, got {warmup_steps!r}")
        floor = float(floor)
        if not (math.isfinite(floor) and 0.0 < floor <= 1.0):
            raise ValueError(f"floor must be in (0, 1], got {floor!r}")

        self.agents: tuple[str, ...] = agents
        self.window = window
        self.ratio_bounds: tuple[float, float] = (lo, hi)
        self.warmup_steps = warmup_steps
        self.floor = floor
        self._steps = 0
        self._history: dict[str, deque[float]] = {name: deque(maxlen=window) for name in agents}

    # ------------------------------------------------------------------ queries
    @property
    def steps(self) -> int:
        """Number of :meth:`update` calls so far."""
        return self._steps

    @property
    def in_warmup(self) -> bool:
        """True before the first update and during the first `warmup_steps` updates (ratios are 1)."""
        return self._steps <= self.warmup_steps

    def _check_agent(self, agent: str, role: str) -> None:
        if agent not in self._history:
            raise ValueError(f"unknown {role} agent {agent!r}; known agents: {list(self.agents)}")

    def capability(self, agent: str) -> float:
        """`P̂_agent` = max(floor, mean of the last `window` accuracies, current step included).

        Raises RuntimeError before the first :meth:`update` (there is nothing to average yet).
        """
        self._check_agent(agent, "queried")
        history = self._history[agent]
        if not history:
            raise RuntimeError("capability is undefined before the first CapabilityTracker.update()")
        return max(self.floor, sum(history) / len(history))

    def capabilities(self) -> dict[str, float]:
        """`{agent: P̂_agent}` for every agent (see :meth:`capability`)."""
        return {name: self.capability(name) for name in self.agents}

    def ratio(self, source: str, learner: str) -> float:
        """`ω(source→learner) = clip(P̂_source / P̂_learner, lo, hi)`; 1.0 if source == learner or in warm-up."""
        self._check_agent(source, "source")
        self._check_agent(learner, "learner")
        if source == learner or self.in_warmup:
            return 1.0
        lo, hi = self.ratio_bounds
        return min(hi, max(lo, self.capability(source) / self.capability(learner)))

    def omega_vector(
        self, learner: str, *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
    ) -> torch.Tensor:
        """`[n]` tensor with entry `j` = `ω(agents[j]→learner)`, in `self.agents` order (learner's entry is 1).

        This is the `omega` argument of :func:`nemo_hacpo.algo.hacpo_advantages`.
        """
        self._check_agent(learner, "learner")
        values = [self.ratio(source, learner) for source in self.agents]
        return torch.tensor(values, dtype=dtype, device=device)

    # ------------------------------------------------------------------ updates
    def update(self, accuracy: Mapping[str, float]) -> dict[str, float]:
        """Record one step: `accuracy[agent]` = `P_agent,t` ∈ [0, 1] for **every** agent. Returns `P̂`.

        Raises ValueError (and records nothing) on a missing or unknown agent or a value outside [0, 1].
        """
        missing = [name for name in self.agents if name not in accuracy]
        unknown = [name for name in accuracy if name not in self._history]
        if missing or unknown:
            raise ValueError(
                f"accuracy must name exactly the tracked agents {list(self.agents)}; "
                f"missing {missing}, unknown {unknown}"
            )
        values: dict[str, float] = {}
        for name in self.agents:
            raw = accuracy[name]
            value = float(raw.item() if isinstance(raw, torch.Tensor) else raw)
            if not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise ValueError(f"accuracy of agent {name!r} must be in [0, 1], got {raw!r}")
            values[name] = value
        for name, value in values.items():
            self._history[name].append(value)
        self._steps += 1
        return self.capabilities()

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Plain-Python (JSON-serialisable) state: configuration, step count and accuracy windows."""
        return {
            "version": STATE_VERSION,
            "agents": list(self.agents),
            "window": self.window,
            "ratio_bounds": list(self.ratio_bounds),
            "warmup_steps": self.warmup_steps,
            "floor": self.floor,
            "steps": self._steps,
            "history": {name: list(self._history[name]) for name in self.agents},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`. The configuration stored in it must equal this tracker's.

        A mismatch (other agents or order, window, bounds, warm-up, floor) raises ValueError naming the
        field: resuming with a different tracker configuration would silently change every ratio.
        """
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported CapabilityTracker state version {state.get('version')!r}")
        expected = {
            "agents": list(self.agents),
            "window": self.window,
            "ratio_bounds": list(self.ratio_bounds),
            "warmup_steps": self.warmup_steps,
            "floor": self.floor,
        }
        for key, value in expected.items():
            stored = state.get(key)
            if key in ("agents", "ratio_bounds") and isinstance(stored, (list, tuple)):
                stored = list(stored)
            if stored != value:
                raise ValueError(
                    f"CapabilityTracker state has {key}={stored!r} but this tracker has {value!r}"
                )
        steps = state.get("steps")
        history = state.get("history")
        if not isinstance(history, Mapping):
            raise ValueError("CapabilityTracker state has no 'history' mapping")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"CapabilityTracker state has an invalid step count {steps!r}")
        if sorted(history) != sorted(self.agents):
            raise ValueError(
                f"CapabilityTracker state history names {sorted(history)}, expected {list(self.agents)}"
            )
        lengths = {len(history[name]) for name in self.agents}
        if len(lengths) != 1 or lengths.pop() != min(steps, self.window):
            raise ValueError("CapabilityTracker state history lengths do not match its step count and window")
        restored: dict[str, deque[float]] = {}
        for name in self.agents:
            values = [float(value) for value in history[name]]
            if not all(math.isfinite(value) and 0.0 <= value <= 1.0 for value in values):
                raise ValueError(f"CapabilityTracker state history of {name!r} has values outside [0, 1]")
            restored[name] = deque(values, maxlen=self.window)
        self._history = restored
        self._steps = steps

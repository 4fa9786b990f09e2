"""Group-relative advantages: GRPO/GSPO's per-group z-score and HACPO's capability-aware baseline (algorithm.md §2).

Advantages are functions of rewards only (data, no autograd graph is intended). All statistics are per
prompt: `B` prompts, `G` responses per agent, `n` agents; the *joint group* of a prompt is its `n·G`
responses.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nemo_hacpo.algo._validation import require_finite_number, require_shape, require_tensor

__all__ = ["group_advantages", "hacpo_advantages", "hacpo_baseline"]


def _as_float_rewards(name: str, rewards: torch.Tensor) -> torch.Tensor:
    require_tensor(name, rewards)
    dtype = (
        torch.promote_types(rewards.dtype, torch.float32) if rewards.is_floating_point() else torch.float32
    )
    rewards = rewards.to(dtype)
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError(f"{name} must all be finite")
    return rewards


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO/GSPO advantage of every response against its own group.

        A[b, i] = (r[b, i] − mean_i r[b, :]) / (std_unbiased_i r[b, :] + eps)

    A group whose `G` rewards are all equal gets exactly 0 (not merely ≈ 0 from rounding).

    Args:
        rewards: `[B, G]` rewards, `G ≥ 2` (any real values; bool/int are converted to float32).
        eps: added to the standard deviation.

    Returns:
        `[B, G]` advantages, float32 (or float64 for float64 rewards).

    Example: `[[1, 0, 0, 1]]` → mean 0.5, std √(1/3) → `[[0.866, −0.866, −0.866, 0.866]]`.
    """
    rewards = _as_float_rewards("rewards", rewards)
    require_shape("rewards", rewards, (None, None), "[B, G]")
    if rewards.shape[1] < 2:
        raise ValueError(
            f"group_advantages needs G ≥ 2 responses per group (unbiased std), got G={rewards.shape[1]}"
        )
    eps = require_finite_number("eps", eps, low=0.0)
    mean = rewards.mean(dim=-1, keepdim=True)  # [B, 1]
    std = rewards.std(dim=-1, correction=1, keepdim=True)  # [B, 1]
    all_equal = (rewards == rewards[:, :1]).all(dim=-1, keepdim=True)  # [B, 1]
    advantages = (rewards - mean) / (std + eps)
    return torch.where(all_equal, torch.zeros_like(advantages), advantages)


def _check_joint(
    rewards: torch.Tensor, learner: int, omega: torch.Tensor | Sequence[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    rewards = _as_float_rewards("rewards", rewards)
    require_shape("rewards", rewards, (None, None, None), "[B, n, G]")
    _, num_agents, group_size = rewards.shape
    if num_agents * group_size < 2:
        raise ValueError(
            f"the joint group needs n·G ≥ 2 rewards (unbiased std), got n={num_agents}, G={group_size}"
        )
    if isinstance(learner, bool) or not isinstance(learner, int) or not 0 <= learner < num_agents:
        raise ValueError(f"learner must be an agent index in [0, {num_agents}), got {learner!r}")
    omega = torch.as_tensor(omega, dtype=rewards.dtype, device=rewards.device)
    require_shape("omega", omega, (num_agents,), "[n]")
    if not bool((torch.isfinite(omega) & (omega > 0)).all()):
        raise ValueError(f"omega must be finite and positive, got {omega.tolist()}")
    if float(omega[learner]) != 1.0:
        raise ValueError(
            f"omega[learner] = ω(k→k) must be 1, got {float(omega[learner])!r} for learner {learner}"
        )
    return rewards, omega


def _baseline(rewards: torch.Tensor, learner: int, omega: torch.Tensor, guards: bool) -> torch.Tensor:
    batch_size = rewards.shape[0]
    flat = rewards.reshape(batch_size, -1)  # [B, n·G]
    baseline = (rewards / omega[None, :, None]).reshape(batch_size, -1).mean(dim=-1)  # [B]
    if not guards:
        return baseline
    all_equal = (flat == flat[:, :1]).all(dim=-1)  # [B]
    own_mean = rewards[:, learner, :].mean(dim=-1)  # [B]
    baseline = torch.where(baseline > 1.0, own_mean, baseline)
    return torch.where(all_equal, flat.mean(dim=-1), baseline)


def hacpo_baseline(
    rewards: torch.Tensor,
    learner: int,
    omega: torch.Tensor | Sequence[float],
    *,
    guards: bool = True,
) -> torch.Tensor:
    """Learner `k`'s capability-aware baseline per prompt (algorithm.md §2).

        μ_k[b] = (1 / nG) · Σ_j Σ_i r[b, j, i] / ω(j→k)          with omega[j] = ω(j→k), omega[k] = 1

    Guards (reference code; `guards=False` gives the raw formula above):
      1. all `n·G` rewards of the prompt equal → μ_k = their plain mean (every advantage is then 0);
      2. otherwise, μ_k > 1 → μ_k = mean of the learner's own `G` rewards (meant for rewards in [0, 1],
         where a baseline above the best reward is meaningless; it applies to any reward values).

    With `ω` equal to the true ratio `P_j / P_k` the raw μ_k is an unbiased estimate of `P_k` (paper,
    Thm 4.1). The guards keep that when the learner is the weaker agent (ω ≥ 1 ⇒ raw μ_k ≤ 1 for 0/1
    rewards), but guard 2 biases μ_k downwards when a source is weaker than the learner (ω < 1).
    Ablation "−adv" (no capability in the baseline): pass `omega = torch.ones(n)`.

    Args:
        rewards: `[B, n, G]`; `rewards[b, j, i]` = reward of agent j's i-th response to prompt b.
        learner: index `k` of the learning agent along dim 1.
        omega: `[n]`, `omega[j] = ω(j→k)`, finite, > 0, `omega[k] == 1`.
        guards: apply the two guards (default) or return the raw formula.

    Returns:
        `[B]` baselines, in the rewards' float dtype (at least float32).
    """
    rewards, omega = _check_joint(rewards, learner, omega)
    return _baseline(rewards, learner, omega, guards)


def hacpo_advantages(
    rewards: torch.Tensor,
    learner: int,
    omega: torch.Tensor | Sequence[float],
    eps: float = 1e-6,
    *,
    guards: bool = True,
) -> torch.Tensor:
    """Learner `k`'s advantage of every response of the joint group (self and cross alike, algorithm.md §2).

        A[b, j, i] = (r[b, j, i] − μ_k[b]) / (σ[b] + eps)
        μ_k = :func:`hacpo_baseline` (capability-weighted, guarded);  σ[b] = std_unbiased(all n·G rewards)

    σ is unweighted and the same for every learner. With the guards on, a prompt whose `n·G` rewards
    are all equal gets exactly 0. With `omega = ones(n)` this equals :func:`group_advantages` on the
    joint group `rewards.reshape(B, n·G)` (for rewards ≤ 1, where guard 2 cannot fire).

    Args:
        rewards: `[B, n, G]` rewards of all agents' responses (agent j's block is `rewards[:, j]`).
        learner: index `k` of the learning agent.
        omega: `[n]`, `omega[j] = ω(j→k)` (e.g. ``CapabilityTracker.omega_vector(name_k)``).
        eps: added to σ.
        guards: see :func:`hacpo_baseline`.

    Returns:
        `[B, n, G]` advantages for learner k. Worked example (n = 2, G = 2, k = 0, omega = [1, 2]):
        rewards `[[[1, 0], [1, 1]]]` → μ = (1 + 0 + 1/2 + 1/2)/4 = 0.5, σ = 0.5 → `[[[1, −1], [1, 1]]]`.
    """
    rewards, omega = _check_joint(rewards, learner, omega)
    eps = require_finite_number("eps", eps, low=0.0)
    batch_size = rewards.shape[0]
    baseline = _baseline(rewards, learner, omega, guards)  # [B]
    std = rewards.reshape(batch_size, -1).std(dim=-1, correction=1)  # [B]
    advantages = (rewards - baseline[:, None, None]) / (std[:, None, None] + eps)  # [B, n, G]
    if guards:
        # (r − plain mean) of an all-equal group can be a rounding residue, not 0: make it exact.
        all_equal = (rewards.reshape(batch_size, -1) == rewards.reshape(batch_size, -1)[:, :1]).all(dim=-1)
        advantages = torch.where(all_equal[:, None, None], torch.zeros_like(advantages), advantages)
    return advantages

"""CapabilityTracker: rolling window (current step included), clipping, floor, warm-up, checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from nemo_hacpo.algo import CapabilityTracker, step_accuracy


def test_window_includes_current_step_and_slides_out_old_steps():
    tracker = CapabilityTracker(["a", "b"], window=3)
    # step 1: the window is just step 1 → P̂_a = 0.2, P̂_b = 0.5
    tracker.update({"a": 0.2, "b": 0.5})
    assert tracker.capability("a") == pytest.approx(0.2)
    assert tracker.capability("b") == pytest.approx(0.5)
    assert tracker.ratio("a", "b") == pytest.approx(0.2 / 0.5)  # 0.4
    assert tracker.ratio("b", "a") == pytest.approx(2.5)
    # step 2: P̂_a = (0.2 + 0.4)/2 = 0.3, P̂_b = (0.5 + 0.5)/2 = 0.5
    tracker.update({"a": 0.4, "b": 0.5})
    assert tracker.capability("a") == pytest.approx(0.3)
    assert tracker.ratio("a", "b") == pytest.approx(0.6)
    # step 3: P̂_a = (0.2+0.4+0.6)/3 = 0.4, P̂_b = (0.5+0.5+0.1)/3 = 11/30 → ω(a→b) = 0.4·30/11 = 12/11
    tracker.update({"a": 0.6, "b": 0.1})
    assert tracker.capability("b") == pytest.approx(11 / 30)
    assert tracker.ratio("a", "b") == pytest.approx(12 / 11)
    # step 4: step 1 slides out. P̂_a = (0.4+0.6+0.8)/3 = 0.6, P̂_b = (0.5+0.1+0.1)/3 = 0.7/3
    #         ω(a→b) = 0.6 / (0.7/3) = 18/7,  ω(b→a) = 7/18
    tracker.update({"a": 0.8, "b": 0.1})
    assert tracker.capability("a") == pytest.approx(0.6)
    assert tracker.capability("b") == pytest.approx(0.7 / 3)
    assert tracker.ratio("a", "b") == pytest.approx(18 / 7)
    assert tracker.ratio("b", "a") == pytest.approx(7 / 18)
    assert tracker.steps == 4


def test_default_window_is_five():
    tracker = CapabilityTracker(["a", "b"])
    for accuracy in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5):
        tracker.update({"a": accuracy, "b": 0.5})
    # last five steps: (0.1+0.2+0.3+0.4+0.5)/5 = 0.3
    assert tracker.capability("a") == pytest.approx(0.3)


def test_ratio_is_clipped_to_bounds():
    tracker = CapabilityTracker(["strong", "weak"])
    tracker.update({"strong": 0.9, "weak": 0.05})
    # raw 0.9/0.05 = 18 → 10;  raw 0.05/0.9 = 0.0556 → 0.1
    assert tracker.ratio("strong", "weak") == 10.0
    assert tracker.ratio("weak", "strong") == 0.1
    # a ratio inside the bounds is untouched: new tracker 0.6/0.3 = 2
    inside = CapabilityTracker(["strong", "weak"])
    inside.update({"strong": 0.6, "weak": 0.3})
    assert inside.ratio("strong", "weak") == pytest.approx(2.0)


def test_custom_ratio_bounds():
    tracker = CapabilityTracker(["a", "b"], ratio_bounds=(0.5, 2.0))
    tracker.update({"a": 0.9, "b": 0.3})  # raw 3 → 2, raw 1/3 → 0.5
    assert tracker.ratio("a", "b") == 2.0
    assert tracker.ratio("b", "a") == 0.5


def test_floor_keeps_zero_accuracy_finite():
    tracker = CapabilityTracker(["a", "b"])
    tracker.update({"a": 0.0, "b": 0.5})
    assert tracker.capability("a") == 1e-8  # floored
    assert tracker.ratio("b", "a") == 10.0  # 0.5/1e-8 = 5e7 → 10
    assert tracker.ratio("a", "b") == 0.1  # 1e-8/0.5 → 0.1
    both_zero = CapabilityTracker(["a", "b"])
    both_zero.update({"a": 0.0, "b": 0.0})
    assert both_zero.ratio("a", "b") == 1.0  # 1e-8 / 1e-8


def test_self_ratio_is_one():
    tracker = CapabilityTracker(["a", "b"])
    tracker.update({"a": 0.9, "b": 0.05})
    assert tracker.ratio("a", "a") == 1.0
    assert tracker.ratio("b", "b") == 1.0


def test_warmup_gives_unit_ratios_for_the_first_updates():
    tracker = CapabilityTracker(["a", "b"], window=5, warmup_steps=2)
    assert tracker.ratio("a", "b") == 1.0  # before any update
    tracker.update({"a": 0.8, "b": 0.2})
    assert tracker.in_warmup and tracker.ratio("a", "b") == 1.0
    tracker.update({"a": 0.8, "b": 0.2})
    assert tracker.in_warmup and tracker.ratio("a", "b") == 1.0
    # third update: warm-up over; the window still holds the warm-up steps:
    # P̂_a = (0.8+0.8+0.5)/3 = 0.7, P̂_b = (0.2+0.2+0.3)/3 = 0.7/3 → ω(a→b) = 3
    tracker.update({"a": 0.5, "b": 0.3})
    assert not tracker.in_warmup
    assert tracker.ratio("a", "b") == pytest.approx(3.0)
    # the capabilities themselves are tracked during warm-up
    assert tracker.capability("a") == pytest.approx(0.7)


def test_no_warmup_ratio_before_first_update_is_one_and_capability_raises():
    tracker = CapabilityTracker(["a", "b"])
    assert tracker.ratio("a", "b") == 1.0
    with pytest.raises(RuntimeError, match="before the first"):
        tracker.capability("a")


def test_three_agents_omega_vector_follows_agent_order():
    tracker = CapabilityTracker(["x", "y", "z"])
    tracker.update({"x": 0.2, "y": 0.4, "z": 0.8})
    # learner y (P̂ = 0.4): ω(x→y) = 0.5, ω(y→y) = 1, ω(z→y) = 2
    assert torch.allclose(tracker.omega_vector("y"), torch.tensor([0.5, 1.0, 2.0]))
    # learner x (P̂ = 0.2): [1, 2, 4]
    omega = tracker.omega_vector("x", dtype=torch.float64)
    assert omega.dtype == torch.float64
    assert omega.tolist() == pytest.approx([1.0, 2.0, 4.0])
    assert tracker.capabilities() == pytest.approx({"x": 0.2, "y": 0.4, "z": 0.8})


def test_update_accepts_zero_d_tensors_and_returns_capabilities():
    tracker = CapabilityTracker(["a", "b"])
    result = tracker.update({"a": torch.tensor(0.25), "b": 0.75})
    assert result == pytest.approx({"a": 0.25, "b": 0.75})


@pytest.mark.parametrize(
    ("accuracy", "message"),
    [
        ({"a": 0.5}, "missing \\['b'\\]"),
        ({"a": 0.5, "b": 0.5, "c": 0.1}, "unknown \\['c'\\]"),
        ({"a": 1.5, "b": 0.5}, "agent 'a' must be in \\[0, 1\\]"),
        ({"a": -0.1, "b": 0.5}, "agent 'a' must be in \\[0, 1\\]"),
        ({"a": float("nan"), "b": 0.5}, "agent 'a' must be in \\[0, 1\\]"),
    ],
)
def test_update_rejects_bad_input_and_records_nothing(accuracy, message):
    tracker = CapabilityTracker(["a", "b"])
    tracker.update({"a": 0.5, "b": 0.5})
    with pytest.raises(ValueError, match=message):
        tracker.update(accuracy)
    assert tracker.steps == 1
    assert tracker.capability("a") == 0.5


def test_unknown_agent_in_queries():
    tracker = CapabilityTracker(["a", "b"])
    tracker.update({"a": 0.5, "b": 0.5})
    with pytest.raises(ValueError, match="unknown source agent 'c'"):
        tracker.ratio("c", "a")
    with pytest.raises(ValueError, match="unknown learner agent 'c'"):
        tracker.ratio("a", "c")
    with pytest.raises(ValueError, match="unknown queried agent 'c'"):
        tracker.capability("c")
    with pytest.raises(ValueError, match="unknown learner agent"):
        tracker.omega_vector("c")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"agents": []},
        {"agents": ["a", "a"]},
        {"agents": ["a", "b"], "window": 0},
        {"agents": ["a", "b"], "ratio_bounds": (2.0, 10.0)},
        {"agents": ["a", "b"], "ratio_bounds": (0.1, 0.5)},
        {"agents": ["a", "b"], "ratio_bounds": (0.0, 10.0)},
        {"agents": ["a", "b"], "warmup_steps": -1},
        {"agents": ["a", "b"], "floor": 0.0},
    ],
)
def test_constructor_validation(kwargs):
    with pytest.raises(ValueError):
        CapabilityTracker(**kwargs)


def _drive(tracker: CapabilityTracker, accuracies: list[tuple[float, float, float]]) -> list[list[float]]:
    """Update with each triple and record every ordered ratio after each step."""
    recorded = []
    for a, b, c in accuracies:
        tracker.update({"a": a, "b": b, "c": c})
        recorded.append([tracker.ratio(s, t) for s in tracker.agents for t in tracker.agents])
    return recorded


def test_state_dict_round_trip_through_json_restores_and_continues_identically():
    history = [(0.1, 0.5, 0.9), (0.2, 0.4, 0.7), (0.3, 0.6, 0.05), (0.0, 0.2, 0.8)]
    future = [(0.5, 0.5, 0.5), (0.9, 0.1, 0.3), (0.25, 0.75, 0.6)]
    original = CapabilityTracker(["a", "b", "c"], window=3, warmup_steps=1)
    _drive(original, history)

    restored = CapabilityTracker(["a", "b", "c"], window=3, warmup_steps=1)
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))

    assert restored.steps == original.steps
    assert restored.capabilities() == original.capabilities()
    for source in original.agents:
        assert restored.omega_vector(source).tolist() == original.omega_vector(source).tolist()
    assert _drive(restored, future) == _drive(original, future)
    assert restored.state_dict() == original.state_dict()


def test_state_dict_round_trip_during_warmup():
    original = CapabilityTracker(["a", "b"], warmup_steps=3)
    original.update({"a": 0.9, "b": 0.1})
    restored = CapabilityTracker(["a", "b"], warmup_steps=3)
    restored.load_state_dict(original.state_dict())
    assert restored.in_warmup and restored.ratio("a", "b") == 1.0
    for tracker in (original, restored):
        tracker.update({"a": 0.9, "b": 0.1})
        tracker.update({"a": 0.9, "b": 0.1})
        assert tracker.in_warmup  # 3 updates ≤ warmup_steps = 3
        tracker.update({"a": 0.9, "b": 0.1})
    assert restored.ratio("a", "b") == original.ratio("a", "b") == pytest.approx(9.0)  # 0.9/0.1


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("agents", {"agents": ["b", "a"]}),
        ("window", {"agents": ["a", "b"], "window": 4}),
        ("ratio_bounds", {"agents": ["a", "b"], "ratio_bounds": (0.2, 5.0)}),
        ("warmup_steps", {"agents": ["a", "b"], "warmup_steps": 2}),
    ],
)
def test_load_state_dict_rejects_other_configuration(field, kwargs):
    original = CapabilityTracker(["a", "b"])
    original.update({"a": 0.5, "b": 0.5})
    other = CapabilityTracker(**kwargs)
    with pytest.raises(ValueError, match=field):
        other.load_state_dict(original.state_dict())


def test_load_state_dict_rejects_inconsistent_history():
    original = CapabilityTracker(["a", "b"])
    original.update({"a": 0.5, "b": 0.5})
    state = original.state_dict()
    state["history"]["a"].append(0.3)  # two entries after one step
    with pytest.raises(ValueError, match="history lengths"):
        CapabilityTracker(["a", "b"]).load_state_dict(state)


def test_step_accuracy_counts_positive_rewards():
    # [[1, 0], [0.5, 0]]: 2 of 4 rewards > 0 → 0.5; negative rewards count as failures
    assert step_accuracy(torch.tensor([[1.0, 0.0], [0.5, 0.0]])) == 0.5
    assert step_accuracy(torch.tensor([-1.0, 0.0, 1.0])) == pytest.approx(1 / 3)
    assert step_accuracy(torch.tensor([True, True, False, True])) == 0.75
    with pytest.raises(ValueError, match="non-empty"):
        step_accuracy(torch.zeros(0))

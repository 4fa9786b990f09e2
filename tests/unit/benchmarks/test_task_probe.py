"""benchmarks/task_probe.py: how responses are sorted into finishing, stopping early and answering directly, and
the forced openings, by hand (the model-driven part runs in the benchmark itself)."""

from __future__ import annotations

from benchmarks import task_probe as probe

WORKED = "Tom starts with 3 apples.\n3 + 4 = 7\n7 * 2 = 14\nThe answer is \\boxed{14}"
EARLY = "Tom starts with 3 apples.\n3 + 4 = 7\nThe answer is \\boxed{7}"


def test_style_of_a_response():
    assert probe.style_of(WORKED, level=2) == "worked"
    assert probe.style_of(EARLY, level=2) == "stop_early"
    assert probe.style_of(EARLY, level=1) == "worked"  # one operation: stopping after it is finishing
    assert probe.style_of("The answer is \\boxed{14}", level=2) == "direct"
    assert probe.style_of(" The answer is 14") == "direct"
    assert probe.style_of(EARLY) == "worked"  # no level given: only the direct opening is told apart


def test_worked_prefix_and_step_lines():
    assert probe.worked_prefix("Tom has 3 apples and buys 4 more. How many apples does Tom have now?") == \
        "Tom starts with"
    assert [m.groups() for m in probe.step_lines(WORKED)] == [("3", "+", "4", "7"), ("7", "*", "2", "14")]
    assert probe.step_lines("no steps here") == []

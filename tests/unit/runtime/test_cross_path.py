"""CrossPathMonitor: a learner whose cross rows all got zero gradient for `patience` steps is named once."""

from __future__ import annotations

import pytest

from nemo_hacpo.runtime.cross_path import CrossPathMonitor


def _step(zero_frac, num_cross=32.0, agent="llama_tiny"):
    return {f"{agent}/train/num_cross": num_cross, f"{agent}/train/cross_zero_grad_frac": zero_frac,
            f"{agent}/train/cross_ratio_mean": 0.08, f"{agent}/train/cross_clip_lower": 0.8375}


def test_cross_path_monitor_warns_once_after_patience_steps_of_no_cross_gradient():
    monitor = CrossPathMonitor(["llama_tiny", "gpt_tiny"], patience=3)
    assert monitor.update({**_step(1.0), **_step(0.97, agent="gpt_tiny")}) == []
    assert monitor.update({**_step(1.0), **_step(1.0, agent="gpt_tiny")}) == []
    messages = monitor.update({**_step(1.0), **_step(1.0, agent="gpt_tiny")})
    assert len(messages) == 1  # gpt_tiny's streak restarted after its 0.97 step
    assert messages[0].startswith("llama_tiny: every cross sample got zero gradient for 3 steps")
    assert "s = 0.08" in messages[0] and "[0.838, 1]" in messages[0]
    later = monitor.update({**_step(1.0), **_step(1.0, agent="gpt_tiny")})
    assert len(later) == 1 and later[0].startswith("gpt_tiny: ")  # llama_tiny is not named twice


def test_cross_path_monitor_resets_on_any_cross_gradient_and_ignores_isolated_modes():
    monitor = CrossPathMonitor(["a"], patience=2)
    for metrics in (_step(1.0, agent="a"), _step(0.99, agent="a"), _step(1.0, agent="a")):
        assert monitor.update(metrics) == []
    assert monitor.update(_step(1.0, num_cross=0.0, agent="a")) == []  # a step without cross rows resets
    assert monitor.update(_step(1.0, agent="a")) == []
    assert monitor.update({"a/train/num_self": 32.0}) == []  # gspo/grpo: no cross statistics at all
    assert monitor.update(_step(1.0, agent="a")) == []
    assert len(monitor.update(_step(1.0, agent="a"))) == 1
    with pytest.raises(ValueError, match="patience"):
        CrossPathMonitor(["a"], patience=0)

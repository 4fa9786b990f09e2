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


def test_direction_metrics_hand_computed():
    """Learner b of three agents: 2 own rows, then 5 rows from a, then 4 from c (source-major, as the broker)."""
    import torch

    from nemo_hacpo.runtime.cross_path import direction_metrics
    from nemo_hacpo.training.loss_metrics import RowOutcome

    source = torch.tensor([1, 1, 0, 0, 0, 0, 0, 2, 2, 2, 2])
    is_cross = source != 1
    ratio = (1.0, 1.0, 0.5, 0.9, 0.1, 0.95, 1.2, 0.85, 0.85, 0.3, 0.99)
    in_window = (True, True, False, True, False, True, False, True, True, False, True)
    gradient = (True, False, False, True, False, False, False, True, True, False, True)  # a's 0.95 row: A = 0
    advantages = torch.tensor([1.0, -1.0, 0.5, 0.5, -0.5, 0.0, 1.0, -2.0, 1.0, 1.0, 0.3])
    out = direction_metrics("b", ["a", "b", "c"], source, is_cross, RowOutcome(ratio, in_window, gradient),
                            advantages)
    # from a: s sorted [0.1, 0.5, 0.9, 0.95, 1.2]; p10 at position 0.4 → 0.1 + 0.4·0.4 = 0.26; p50 = 0.9;
    #   p90 at position 3.6 → 0.95 + 0.6·0.25 = 1.1; in window 2/5, with gradient 1/5
    assert out["b/from/a/rows"] == 5.0
    assert (out["b/from/a/s_p10"], out["b/from/a/s_p50"], out["b/from/a/s_p90"]) == pytest.approx((0.26, 0.9, 1.1))
    assert out["b/from/a/in_window_frac"] == pytest.approx(0.4) and out["b/from/a/grad_frac"] == pytest.approx(0.2)
    # from c: sorted [0.3, 0.85, 0.85, 0.99]; p10 at 0.3 → 0.3 + 0.3·0.55 = 0.465; p50 = 0.85; p90 at 2.7 → 0.85 +
    #   0.7·0.14 = 0.948; 3 of 4 in the window and with gradient
    assert (out["b/from/c/s_p10"], out["b/from/c/s_p50"], out["b/from/c/s_p90"]) == pytest.approx((0.465, 0.85, 0.948))
    assert out["b/from/c/grad_frac"] == pytest.approx(0.75) and out["b/from/c/rows"] == 4.0
    # the rows with gradient by the sign of A: from a the 0.9 row (A = 0.5); from c 0.85 (A = −2), 0.85 and 0.99
    assert (out["b/from/a/grad_pos_frac"], out["b/from/a/grad_neg_frac"]) == pytest.approx((0.2, 0.0))
    assert (out["b/from/c/grad_pos_frac"], out["b/from/c/grad_neg_frac"]) == pytest.approx((0.5, 0.25))
    assert not any(k.startswith("b/from/b/") for k in out)  # own rows are no direction
    with pytest.raises(ValueError, match="row outcomes"):
        direction_metrics("b", ["a", "b", "c"], source[:3], is_cross[:3], RowOutcome(ratio, in_window, gradient),
                          advantages[:3])


def test_direction_table_and_plot(tmp_path):
    from nemo_hacpo.runtime.cross_path import direction_table, plot_directions

    def record(step, p50, grad):
        return {"step": step, "x/from/y/rows": 8.0, "x/from/y/s_p10": p50 / 2, "x/from/y/s_p50": p50,
                "x/from/y/s_p90": p50 * 1.5, "x/from/y/in_window_frac": grad, "x/from/y/grad_frac": grad}

    records = [{"step": 0, "x/eval_accuracy": 0.1}, record(1, 0.5, 0.25), record(2, 0.6, 0.5), record(3, 0.8, 0.75)]
    (row,) = direction_table(records, ["x", "y"])
    assert row["direction"] == "y → x" and row["cross_rows"] == 24
    assert row["s p10/p50/p90 (step 1)"] == "0.25 / 0.5 / 0.75" and row["s p10/p50/p90 (step 3)"] == "0.4 / 0.8 / 1.2"
    assert (row["grad_frac_first"], row["grad_frac_mean"], row["grad_frac_last"]) == (0.25, 0.5, 0.75)
    assert plot_directions(records, ["x", "y"], tmp_path / "cross.png").stat().st_size > 1000
    assert direction_table(records[:1], ["x", "y"]) == [] and plot_directions(records[:1], ["x", "y"], tmp_path / "n.png") is None

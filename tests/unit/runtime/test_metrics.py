"""Metric sinks: JSONL is the record, the console line shows rate and ETA, curves become a PNG and a table."""

from __future__ import annotations

import io
import json

import pytest
import torch

from nemo_hacpo.runtime.metrics import (
    CrossPathMonitor,
    MetricsLogger,
    format_duration,
    markdown_table,
    read_metrics,
    select_series,
    write_curves,
)


def test_jsonl_console_and_tensorboard(tmp_path):
    stream = io.StringIO()
    with MetricsLogger(tmp_path, ("console", "jsonl", "tensorboard"), total_steps=4, stream=stream) as logger:
        for step in (1, 2):
            logger.log(step, {"a/reward_mean": torch.tensor(0.25 * step), "a/loss": 1.0 / step, "b/accuracy": 0.5})
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert records[1]["a/reward_mean"] == 0.5 and records[1]["a/loss"] == 0.5
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("step 1/4 | ") and "ETA" in lines[0] and "s/step" in lines[0]
    assert "a/reward_mean=0.500" in lines[1] and "b/accuracy=0.500" in lines[1] and "a/loss" not in lines[1]
    assert any((tmp_path / "tensorboard").iterdir())


def test_appends_across_restarts(tmp_path):
    with MetricsLogger(tmp_path, ("jsonl",)) as logger:
        logger.log(1, {"x": 1.0})
    with MetricsLogger(tmp_path, ("jsonl",), start_step=1) as logger:
        logger.log(2, {"x": 2.0})
    assert [r["x"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1.0, 2.0]


def test_unknown_sink_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="unknown metric sinks \\['mlflow'\\]"):
        MetricsLogger(tmp_path, ("mlflow",))
    with pytest.raises(FileNotFoundError, match="no metrics file at"):
        read_metrics(tmp_path / "nope.jsonl")


def test_curves_table_and_series(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps({"step": s, "time": 0, "a/reward_mean": s / 10, "b/reward_mean": s / 20,
                                          "a/loss": 1.0}) for s in range(1, 6)))
    series = select_series(read_metrics(path), ["*/reward_mean"])
    assert sorted(series) == ["a/reward_mean", "b/reward_mean"] and series["b/reward_mean"][-1] == (5, 0.25)
    png = write_curves(path, tmp_path / "plots" / "reward.png", ["*/reward_mean"], title="reward")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="matches"):
        write_curves(path, tmp_path / "x.png", ["*/nothing"])
    table = markdown_table([{"agent": "a", "start": 0.1, "end": 0.5}], ["agent", "start", "end"])
    assert table.splitlines() == ["| agent | start | end |", "|---|---|---|", "| a | 0.100 | 0.500 |"]


def test_format_duration():
    assert format_duration(59.6) == "1:00" and format_duration(3725) == "1:02:05" and format_duration(float("nan")) == "?"


def test_rich_progress_bar_shows_steps_and_eta(tmp_path):
    import io

    stream = io.StringIO()
    with MetricsLogger(tmp_path, sinks=("console",), total_steps=4, stream=stream, progress_bar=True) as log:
        log.log(1, {"a/reward_mean": 0.25})
        log.log(2, {"a/reward_mean": 0.5})
    text = stream.getvalue()
    assert "step 2/4" in text and "a/reward_mean=0.500" in text  # the step lines, printed above the bar
    assert "2/4" in text and "ETA" in text  # the bar's final render: completed/total and the ETA column


def test_no_progress_bar_when_not_a_terminal(tmp_path):
    import io

    stream = io.StringIO()
    with MetricsLogger(tmp_path, sinks=("console",), total_steps=4, stream=stream) as log:
        log.log(1, {"a/reward_mean": 0.25})
    assert log._progress is None and stream.getvalue().startswith("step 1/4")


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

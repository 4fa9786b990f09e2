"""Metric sinks: JSONL is the record, the console line shows rate and ETA, TensorBoard gets every scalar."""

from __future__ import annotations

import io

import pytest
import torch

from nemo_hacpo.reporting import read_metrics
from nemo_hacpo.runtime.step_log import MetricsLogger


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


def test_the_runs_step_line_is_short_one_part_per_agent(tmp_path):
    """Issue #41: the step line was ~400 characters of full metric keys and wrapped on a terminal. Now one short part
    per agent — reward, response length, the partners' rows with gradient, the evaluation when there is one — in
    the same order at every step, so the agents read column by column; every metric stays in metrics.jsonl."""
    from nemo_hacpo.runtime.step_log import agent_line

    step = {"llama_tiny/reward_mean": 0.53125, "llama_tiny/response_length_mean": 24.4,
            "llama_tiny/from/qwen_tiny/grad_frac": 0.375, "llama_tiny/omega/qwen_tiny": 0.529,
            "qwen_tiny/reward_mean": 0.609, "qwen_tiny/response_length_mean": 22.0,
            "qwen_tiny/from/llama_tiny/grad_frac": 0.34375, "qwen_tiny/eval_accuracy": 0.7025,
            "llama_tiny/train/loss": 0.1, "llama_tiny/from/qwen_tiny/s_p50": 0.99}
    assert agent_line("llama_tiny", step) == "llama_tiny r=0.53 len=24 x=0.38"
    assert agent_line("qwen_tiny", step) == "qwen_tiny r=0.61 len=22 x=0.34 eval=0.703"
    alone = {"llama_tiny/reward_mean": 0.5, "llama_tiny/response_length_mean": 20.0}  # gspo: no shared rows
    assert agent_line("llama_tiny", alone) == "llama_tiny r=0.50 len=20"
    stream = io.StringIO()
    with MetricsLogger(tmp_path, ("console", "jsonl"), total_steps=30, stream=stream, start_step=11,
                       agents=["llama_tiny", "qwen_tiny"]) as log:
        log.log(12, step)
    (line,) = stream.getvalue().splitlines()
    assert line.startswith("step 12/30 ") and "s ETA " in line
    assert line.endswith(" | llama_tiny r=0.53 len=24 x=0.38 | qwen_tiny r=0.61 len=22 x=0.34 eval=0.703")
    assert len(line) <= 105  # two agents, at an evaluation; ~90 at the other steps
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["llama_tiny/omega/qwen_tiny"] == 0.529  # in full there

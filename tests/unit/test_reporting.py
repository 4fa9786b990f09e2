"""Reporting helpers: metric series from the JSONL record, curves as PNG, markdown tables, durations."""

from __future__ import annotations

import json

import pytest

from nemo_hacpo.reporting import (
    format_duration,
    markdown_table,
    moving_average,
    read_metrics,
    select_series,
    write_curves,
)


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


def test_moving_average_is_the_trailing_mean():
    assert moving_average([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert moving_average([0.0, 1.0, 0.0, 1.0, 1.0], 3) == pytest.approx([0.0, 0.5, 1 / 3, 2 / 3, 2 / 3])
    assert moving_average([5.0, 7.0], 1) == [5.0, 7.0] and moving_average([], 4) == []
    with pytest.raises(ValueError, match="window"):
        moving_average([1.0], 0)


def test_smoothed_curves_draw_points_and_their_mean(tmp_path):
    from PIL import Image

    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps({"step": s, "time": 0, "a/reward_mean": s % 2}) for s in range(1, 11)))
    plain = write_curves(path, tmp_path / "plain.png", ["*/reward_mean"])
    smooth = write_curves(path, tmp_path / "smooth.png", ["*/reward_mean"], smooth=4)
    assert Image.open(plain).size == Image.open(smooth).size and plain.read_bytes() != smooth.read_bytes()

"""benchmarks/step_profile.py: the ABBA schedule, the phase table and the mode switch on a real HacpoRun."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks import step_profile as sp

ROOT = Path(__file__).resolve().parents[3]


def test_abba_schedule():
    assert sp.abba_schedule(1) == ["hacpo", "gspo"]
    assert sp.abba_schedule(3) == ["hacpo", "gspo", "gspo", "hacpo", "hacpo", "gspo"]
    schedule = sp.abba_schedule(4)
    assert schedule.count("hacpo") == schedule.count("gspo") == 4
    # ABBA: every position index sums equally over both modes (a linear drift cancels)
    positions = {mode: sum(i for i, m in enumerate(schedule) if m == mode) for mode in sp.MODES}
    assert positions["hacpo"] == positions["gspo"] == 14  # 0+3+4+7 = 1+2+5+6
    with pytest.raises(ValueError):
        sp.abba_schedule(0)


def _timings(generate, reward, logprob, broker, train, refit, step):
    return {"generate_s": generate, "reward_s": reward, "logprob_s": logprob, "broker_s": broker, "train_s": train,
            "refit_s": refit, "step_s": step}


def test_phase_rows_means_and_ratios():
    samples = {"hacpo": [_timings(1.0, 0.2, 0.3, 0.10, 2.0, 0.4, 4.2), _timings(3.0, 0.2, 0.5, 0.30, 4.0, 0.4, 8.6)],
               "gspo": [_timings(2.0, 0.1, 0.4, 0.01, 1.0, 0.4, 4.0), _timings(2.0, 0.3, 0.4, 0.03, 2.0, 0.4, 5.2)]}
    rows = {r["phase"]: r for r in sp.phase_rows(samples)}
    assert list(rows) == [*sp.PHASES, "phases", "step"]
    assert rows["generate"]["hacpo s"] == pytest.approx(2.0) and rows["generate"]["ratio"] == pytest.approx(1.0)
    assert rows["broker"]["hacpo s"] == pytest.approx(0.2) and rows["broker"]["gspo s"] == pytest.approx(0.02)
    assert rows["broker"]["ratio"] == pytest.approx(10.0)
    assert rows["train"]["ratio"] == pytest.approx(3.0 / 1.5)
    # phases: hacpo 2 + 0.2 + 0.4 + 0.2 + 3 + 0.4 = 6.2; gspo 2 + 0.2 + 0.4 + 0.02 + 1.5 + 0.4 = 4.52
    assert rows["phases"]["hacpo s"] == pytest.approx(6.2) and rows["phases"]["gspo s"] == pytest.approx(4.52)
    assert rows["step"]["hacpo s"] == pytest.approx(6.4) and rows["step"]["ratio"] == pytest.approx(6.4 / 4.6)


def test_phase_rows_missing_mode_gives_nan():
    rows = sp.phase_rows({"hacpo": [_timings(1, 1, 1, 1, 1, 1, 6)], "gspo": []})
    assert math.isnan(rows[0]["gspo s"]) and math.isnan(rows[0]["ratio"])


def test_format_table():
    text = sp.format_table([{"phase": "train", "hacpo s": 2.5, "gspo s": math.nan, "ratio": 1.23456},
                            {"phase": "reward", "hacpo s": 0.000123, "gspo s": 12.0, "ratio": 1e-05}])
    assert text.splitlines() == [" phase   hacpo s  gspo s  ratio",
                                 " train       2.5       -   1.23",
                                 "reward  0.000123      12  1e-05"]


def test_step_timings_reads_the_loop_timers():
    metrics = {"time/generate_s": 1.5, "time/train_s": 2.0, "a/reward_mean": 0.3}
    assert sp.step_timings(metrics, 4.0) == {"generate_s": 1.5, "train_s": 2.0, "step_s": 4.0}


def test_parse_args():
    args, extra = sp.parse_args(["--warmstart", "--pairs", "2", "algo.batch_size=2"])
    assert args.warmstart and args.pairs == 2 and args.warmup == 1 and extra == ["algo.batch_size=2"]
    assert not sp.parse_args([])[0].warmstart
    for bad in (["--pairs", "0"], ["--warmup", "-1"], ["--nope"]):
        with pytest.raises(SystemExit):
            sp.parse_args(bad)

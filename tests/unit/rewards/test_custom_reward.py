"""`reward.function`: a reward of the user's, resolved at start-up, run in the real reward worker processes.

Slow and hung answers are slow by construction (the scorer's `_debug_markers`, as in test_scorer.py): a `sleep`
inside the worker's time limit, a `hang` with SIGALRM blocked that the driver must kill.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from nemo_hacpo.config import ConfigError, load_config
from nemo_hacpo.rewards.custom import CustomAnswer, custom_answer, resolve_reward_function, score_custom
from nemo_hacpo.rewards.math import RewardReason
from nemo_hacpo.rewards.scorer import MathRewardScorer
from tests.helpers import custom_rewards

HELPERS = "tests.helpers.custom_rewards"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "own_task" / "reward.py"


@pytest.mark.parametrize(("spec", "message"), [
    ("last_number_matches", "is not `module:function`"),
    ("tests.helpers.no_such_module:f", "cannot load 'tests.helpers.no_such_module': ModuleNotFoundError"),
    (f"{HELPERS}:missing", f"module '{HELPERS}' has no attribute 'missing'"),
    (f"{HELPERS}:NOT_A_FUNCTION", "is not a function (its type: int)"),
    (f"{HELPERS}:one_argument", "cannot be called as f(response: str, gold: str)"),
    ("/nonexistent/reward.py:score", "cannot load '/nonexistent/reward.py': FileNotFoundError: no file at"),
])
def test_a_bad_function_name_says_what_is_wrong(spec, message):
    with pytest.raises(ValueError) as caught:
        resolve_reward_function(spec)
    assert message in str(caught.value)


def test_a_module_name_and_a_file_path_give_the_function():
    assert resolve_reward_function(f"{HELPERS}:raises") is custom_rewards.raises
    from_file = resolve_reward_function(f"{EXAMPLE}:last_number_matches")
    assert from_file("so 3 + 4 = 7. The answer is 7.", "7") is True
    assert from_file("The answer is 1,018", "1018") is True
    assert from_file("12 apples, then 5", "12") is False
    assert from_file("no number at all", "7") is False


def test_the_start_up_check_names_the_key_and_accepts_a_good_function(tmp_path):
    from nemo_hacpo.planning.plan import startup_checks

    out = f"runtime.output_dir={tmp_path / 'run'}"
    with pytest.raises(ConfigError) as caught:
        startup_checks(load_config("pair_tiny_gpt", [f"reward.function={HELPERS}:one_argument", out]))
    assert "reward.function" in str(caught.value) and "f(response: str, gold: str)" in str(caught.value)
    cfg = startup_checks(load_config("pair_tiny_gpt", [f"reward.function={EXAMPLE}:last_number_matches", out]))
    assert cfg.reward.function.endswith("reward.py:last_number_matches")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("function", "response", "reward", "reason", "detail"), [
    (custom_rewards.last_number_matches, "The answer is 7", 1.0, RewardReason.CORRECT, ""),
    (custom_rewards.last_number_matches, "The answer is 8", 0.0, RewardReason.WRONG, ""),
    (lambda response, gold: 1, "x", 1.0, RewardReason.CORRECT, ""),
    (lambda response, gold: 0.0, "x", 0.0, RewardReason.WRONG, ""),
    (custom_rewards.raises, "x", 0.0, RewardReason.ERROR, "reward function raised KeyError: 'x'"),
    (custom_rewards.returns_half, "x", 0.0, RewardReason.ERROR, "returned 0.5; it must return True/False (or 1/0)"),
    (custom_rewards.returns_text, "x", 0.0, RewardReason.ERROR, "returned 'yes'"),
])
def test_a_verdict_per_return_value(function, response, reward, reason, detail):
    scored = score_custom(function, CustomAnswer(response, "7"), timeout_s=5.0)
    assert (scored.reward, scored.reason) == (reward, reason) and detail in scored.detail


def test_the_response_is_cut_as_for_math_verify_and_empty_inputs_need_no_call():
    answer = custom_answer("x" * 50 + "The answer is 7", "7", max_response_chars=20)
    assert answer == CustomAnswer("xxxxxThe answer is 7", "7", truncated=True)
    assert custom_answer("", "7", 20).reason is RewardReason.EMPTY
    assert custom_answer("7", "  ", 20).reason is RewardReason.INVALID_GOLD
    assert custom_answer(b"The answer is 7", "7", 20) == CustomAnswer("The answer is 7", "7")
    assert custom_answer(7, "7", 20).reason is RewardReason.ERROR


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_scorer_runs_it_with_the_time_limits_and_logs_each_kind_of_failure(num_workers, caplog):
    batch_in = [("The answer is 7", "7"), ("The answer is 8", "7"), ("x", "only"), ("y", "7"),
                ("SLOW_MARKER", "7"), ("", "7"), ("The answer is 7", "seven")]
    markers = {"SLOW_MARKER": "sleep"} if num_workers == 0 else {"SLOW_MARKER": "sleep", "HANG_MARKER": "hang"}
    if num_workers:
        batch_in.append(("HANG_MARKER", "7"))
    caplog.set_level(logging.WARNING, logger="nemo_hacpo.rewards.scorer")
    with MathRewardScorer(num_workers=num_workers, timeout_s=1.0, kill_grace_s=0.5, function=f"{HELPERS}:raises",
                          _debug_markers=markers) as raising, \
            MathRewardScorer(num_workers=num_workers, timeout_s=1.0, kill_grace_s=0.5,
                             function=f"{EXAMPLE}:last_number_matches", _debug_markers=markers) as scorer:
        batch = scorer.score(*zip(*batch_in, strict=True))
        failed = raising.score(["x", "only", "y"], ["7", "7", "7"])
        totals = scorer.metrics()
    expected = [RewardReason.CORRECT, RewardReason.WRONG, RewardReason.ERROR, RewardReason.WRONG,
                RewardReason.TIMEOUT, RewardReason.EMPTY, RewardReason.ERROR]
    if num_workers:
        expected.append(RewardReason.TIMEOUT)
        assert totals["worker_kills"] == 1  # the hung answer: killed and replaced, the rest scored
    assert batch.reasons == expected
    assert batch.rewards == [1.0] + [0.0] * (len(expected) - 1)
    assert "ValueError" in batch.details[2] and "ValueError" in batch.details[6]  # float("only"), float("seven")
    assert failed.rewards == [0.0, 1.0, 0.0] and failed.reasons[0] is RewardReason.ERROR
    # the driver logs each kind of failure once per scorer: ValueError of the example, KeyError of `raises`
    warnings = [r.getMessage() for r in caplog.records if "scored an answer 0" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert any("last_number_matches scored an answer 0: reward function raised ValueError" in w for w in warnings)
    assert any(f"{HELPERS}:raises scored an answer 0: reward function raised KeyError" in w for w in warnings)


def test_the_workers_memory_limit_is_the_configs_and_a_function_over_it_scores_0_or_names_the_key():
    from nemo_hacpo.config import RewardConfig
    from nemo_hacpo.rewards.scorer import RewardPoolError

    unlimited = RewardConfig(num_workers=1, function=f"{HELPERS}:needs_3_gib", worker_memory_mb=None)
    with MathRewardScorer.from_config(unlimited) as free, \
            MathRewardScorer.from_config(dataclasses.replace(unlimited, worker_memory_mb=2048)) as limited:
        assert free.score(["7", "8"], ["7", "7"]).rewards == [1.0, 0.0]
        over = limited.score(["7"], ["7"])  # 3 GiB in a 2 GiB address space, at answer time: that answer's 0
        assert over.reasons == [RewardReason.ERROR] and over.details == ["reward function: out of memory"]
    # at import time, in every worker: the pool stops, naming the key; without a limit the same module loads
    with pytest.raises(RewardPoolError, match=r"loading tests.helpers.reward_over_memory:matches needed more than "
                                              r"the 2048 MB of address space a reward process may add to its start: "
                                              r"raise reward.worker_memory_mb, or set it to null"), \
            MathRewardScorer(num_workers=1, function="tests.helpers.reward_over_memory:matches",
                             worker_memory_limit_mb=2048, startup_timeout_s=60) as scorer:
        scorer.score(["7"], ["7"])
    with MathRewardScorer(num_workers=1, function="tests.helpers.reward_over_memory:matches",
                          worker_memory_limit_mb=None) as scorer:
        assert scorer.score(["7"], ["7"]).rewards == [1.0]


def test_reward_processes_that_cannot_start_stop_the_run_naming_the_key(tmp_path, monkeypatch, capfd):
    """Through `train()`: the run's scorer (the real pool, a function whose import is over the limit) fails, and the
    job stops with exit status 1 and the message, as a failed worker does — no traceback."""
    from nemo_hacpo.config import RewardConfig
    from nemo_hacpo.runtime import loop

    class Run:  # the loop's start-up stands aside; its scorer is the run's own
        def __init__(self, cfg, preempt):
            self.out_dir = tmp_path

        def fit(self):
            reward = RewardConfig(num_workers=1, function="tests.helpers.reward_over_memory:matches")
            with MathRewardScorer.from_config(reward) as scorer:
                scorer.score(["7"], ["7"])

        def close(self, timeout_s):
            pass

    monkeypatch.setattr(loop, "HacpoRun", Run)
    monkeypatch.setattr(loop, "startup_checks", lambda cfg: cfg)
    assert loop.train(load_config("pair_tiny_gpt")) == 1
    err = capfd.readouterr().err
    assert "job stopped: reward workers keep failing to start (loading tests.helpers.reward_over_memory:matches " \
           "needed more than the 2048 MB of address space a reward process may add to its start: raise " \
           "reward.worker_memory_mb" in err, err
    assert "last complete checkpoint: none" in err and "Traceback" not in err

"""MathRewardScorer: real worker processes, real timeouts, order and counters.

Inputs are slow or fatal by construction, never by today's library or machine speed: the scorer's
``_debug_markers`` make a worker sleep where its SIGALRM can interrupt it (the soft time limit), hang with
SIGALRM blocked like a hang inside C code (the driver must kill and replace it), or exit (a crash). No test
asserts a wall-clock time; the kill counters say whether a batch waited for more than one kill.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from nemo_hacpo.rewards.math import RewardReason, ScoredAnswer, VerifyLimits
from nemo_hacpo.rewards.scorer import MathRewardScorer, RewardBatch, count_reasons

TIMEOUT_S = 1.0
KILL_GRACE_S = 0.5
HANG = "HANG_MARKER"
SLOW = "SLOW_MARKER"
CRASH = "CRASH_MARKER"
MARKERS = {HANG: "hang", SLOW: "sleep", CRASH: "crash"}
SLOW_ANSWER = f"\\boxed{{{SLOW}}}"  # sleeps an hour inside the time limit
SLOW_REGEX = "$$" + "\\boxed{x}" * 400  # math-verify's lenient regexes backtrack on this (seconds, here)

MIXED = [  # (response, gold, reward, reason)
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0, RewardReason.CORRECT),
    ("I think 5", "5", 0.0, RewardReason.NO_ANSWER),
    ("\\boxed{0.333}", "1/3", 0.0, RewardReason.WRONG),
    ("", "5", 0.0, RewardReason.EMPTY),
    ("\\boxed{10^{10^{10}}}", "5", 0.0, RewardReason.REJECTED),
    ("\\boxed{3}", "\\frac{", 0.0, RewardReason.INVALID_GOLD),
    ("\\boxed{@#&}", "5", 0.0, RewardReason.UNPARSABLE),
    ("\\boxed{x = 7}", "7", 1.0, RewardReason.CORRECT),
    (5, "5", 0.0, RewardReason.ERROR),
    ("\\boxed{42}", "42", 1.0, RewardReason.CORRECT),
]


@pytest.fixture(scope="module")
def scorer() -> Iterator[MathRewardScorer]:
    with MathRewardScorer(
        num_workers=2,
        timeout_s=TIMEOUT_S,
        kill_grace_s=KILL_GRACE_S,
        limits=VerifyLimits(max_bracket_depth=100),
        _debug_markers=MARKERS,
    ) as pool:
        assert pool.wait_until_ready(timeout_s=120)
        yield pool


def _score_mixed(pool: MathRewardScorer) -> RewardBatch:
    return pool.score([case[0] for case in MIXED], [case[1] for case in MIXED])


def test_order_rewards_and_counts(scorer: MathRewardScorer) -> None:
    batch = _score_mixed(scorer)
    assert batch.rewards == [case[2] for case in MIXED]
    assert batch.reasons == [case[3] for case in MIXED]
    assert batch.counts == {
        "correct": 3,
        "wrong": 1,
        "no_answer": 1,
        "unparsable": 1,
        "empty": 1,
        "rejected": 1,
        "timeout": 0,
        "invalid_gold": 1,
        "error": 1,
        "truncated_input": 0,
    }
    assert batch.accuracy == pytest.approx(0.3)
    metrics = batch.metrics()
    assert metrics["reward/accuracy"] == pytest.approx(0.3) and metrics["reward/correct"] == 3.0


def test_order_is_kept_over_many_answers(scorer: MathRewardScorer) -> None:
    golds = [str(value) for value in range(60)]
    responses = [
        f"\\boxed{{\\frac{{{2 * value}}}{{2}}}}" if value % 3 else "\\boxed{-1}" for value in range(60)
    ]
    batch = scorer.score(responses, golds)
    assert batch.rewards == [0.0 if value % 3 == 0 else 1.0 for value in range(60)]


def test_truncated_input_is_counted(scorer: MathRewardScorer) -> None:
    long_response = "x" * 20_000 + " \\boxed{5}"
    batch = scorer.score([long_response, "\\boxed{5}"], ["5", "5"])
    assert batch.rewards == [1.0, 1.0]
    assert batch.truncated == [True, False]
    assert batch.counts["truncated_input"] == 1


def test_slow_answer_soft_timeout_keeps_the_worker(scorer: MathRewardScorer) -> None:
    assert scorer.wait_until_ready(timeout_s=120)
    pids_before = scorer.worker_pids
    kills_before = scorer.metrics()["worker_kills"]
    batch = scorer.score([SLOW_ANSWER, "\\boxed{\\frac{4}{2}}", "\\boxed{1.5}"], ["1", "2", "3/2"])
    assert batch.reasons == [RewardReason.TIMEOUT, RewardReason.CORRECT, RewardReason.CORRECT]
    assert batch.details[0] == f"exceeded {TIMEOUT_S} s"  # the worker's own alarm, not a kill
    assert scorer.worker_pids == pids_before and scorer.metrics()["worker_kills"] == kills_before


def test_lenient_regex_blowup_cannot_hold_the_batch(scorer: MathRewardScorer) -> None:
    # However fast the regexes run on this machine, the answer gets a verdict (timeout or wrong, never correct)
    # and the batch goes on.
    batch = scorer.score([SLOW_REGEX, "The answer is 4."], ["5", "4"], strict=False)
    assert batch.reasons[0] in (RewardReason.TIMEOUT, RewardReason.WRONG, RewardReason.NO_ANSWER)
    assert batch.reasons[1] is RewardReason.CORRECT


def test_hung_worker_is_killed_and_replaced(scorer: MathRewardScorer) -> None:
    assert scorer.wait_until_ready(timeout_s=120)
    restarts_before = scorer.metrics()["worker_restarts"]
    pids_before = set(scorer.worker_pids)
    # Fractions, not integers: integer answers are settled in the driver without a worker.
    responses = ["\\boxed{\\frac{2}{2}}", f"\\boxed{{{HANG}}}"] + [
        f"\\boxed{{\\frac{{{2 * value}}}{{2}}}}" for value in range(2, 12)
    ]
    golds = ["1", "0"] + [str(value) for value in range(2, 12)]
    kills_before = scorer.metrics()["worker_kills"]
    batch = scorer.score(responses, golds)
    assert batch.reasons[1] is RewardReason.TIMEOUT and "killed" in batch.details[1]
    assert batch.rewards[:1] + batch.rewards[2:] == [1.0] * 11  # the other answers all came back
    assert scorer.metrics()["worker_kills"] == kills_before + 1  # one kill, the hang's
    assert scorer.metrics()["worker_restarts"] == restarts_before + 1
    assert len(pids_before & set(scorer.worker_pids)) == 1  # exactly one worker was replaced
    # The pool still scores afterwards, with both workers.
    assert _score_mixed(scorer).rewards == [case[2] for case in MIXED]


def test_workers_killed_from_outside_cost_no_answer() -> None:
    """Both workers SIGKILLed between batches (the OOM killer, an operator): the next batch is scored in full,
    however late the kernel reaps them — an answer handed to a worker that is already dying goes to another."""
    with MathRewardScorer(num_workers=2, timeout_s=30.0, kill_grace_s=KILL_GRACE_S) as scorer:
        assert scorer.wait_until_ready(timeout_s=120)
        pids = [pid for pid in scorer.worker_pids if pid is not None]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        recovered = scorer.score(["\\boxed{4/2}", "\\boxed{6/2}", "\\boxed{10/2}"], ["2", "3", "5"])
        assert recovered.rewards == [1.0, 1.0, 1.0], recovered.details
        assert not set(pids) & set(scorer.worker_pids)


def test_sigusr1_leaves_the_workers_alone(scorer: MathRewardScorer) -> None:
    """SIGUSR1 asks the driver to save and stop; Slurm forwarding it reaches the driver's children too, whose
    default action would be to die (a worker replaced, its answer late)."""
    pids = list(scorer.worker_pids)
    restarts = scorer.metrics()["worker_restarts"]
    for pid in pids:
        os.kill(pid, signal.SIGUSR1)
    assert _score_mixed(scorer).rewards == [case[2] for case in MIXED]
    assert scorer.worker_pids == pids and scorer.metrics()["worker_restarts"] == restarts


def test_sigusr1_while_the_workers_start_leaves_them_alone() -> None:
    """Slurm's SIGUSR1 can come while a worker is still starting (the pool's start, a worker just replaced),
    before it has set the signal to be ignored: it must wait, not kill the worker. Sent right after the start
    returns, the signal reaches each worker while it still imports the verifier (a fresh interpreter: seconds)."""
    with MathRewardScorer(num_workers=2, timeout_s=30.0, kill_grace_s=KILL_GRACE_S) as scorer:
        pids = list(scorer.worker_pids)
        for pid in pids:
            os.kill(pid, signal.SIGUSR1)
        assert scorer.wait_until_ready(timeout_s=120)
        assert _score_mixed(scorer).rewards == [case[2] for case in MIXED]
        assert scorer.worker_pids == pids and scorer.metrics()["worker_restarts"] == 0
        assert signal.SIGUSR1 not in signal.pthread_sigmask(signal.SIG_BLOCK, set())  # the driver's mask restored


def test_an_answer_that_kills_its_worker_is_retried_once_then_scores_error() -> None:
    with MathRewardScorer(num_workers=2, timeout_s=30.0, kill_grace_s=KILL_GRACE_S,
                          _debug_markers=MARKERS) as scorer:
        assert scorer.wait_until_ready(timeout_s=120)
        batch = scorer.score([f"\\boxed{{{CRASH}}}", "\\boxed{4/2}"], ["1", "2"])
        assert batch.reasons == [RewardReason.ERROR, RewardReason.CORRECT]
        assert batch.details[0] == "worker died (exit code 3) twice on this answer"
        assert scorer.metrics()["worker_deaths"] == 2  # the first death sent it to another worker
        assert scorer.score(["\\boxed{6/2}"], ["3"]).rewards == [1.0]  # the pool goes on
    with pytest.raises(ValueError, match="unknown debug actions"):
        MathRewardScorer(num_workers=0, _debug_markers={"X": "explode"})


def test_scoring_from_another_thread(scorer: MathRewardScorer) -> None:
    """Ray actors call from non-main threads: the workers own the alarms, so limits still apply."""
    results: list[RewardBatch] = []
    thread = threading.Thread(
        target=lambda: results.append(scorer.score([SLOW_ANSWER, "\\boxed{2}"], ["1", "2"]))
    )
    thread.start()
    thread.join(timeout=30)
    assert results and results[0].reasons == [RewardReason.TIMEOUT, RewardReason.CORRECT]


def test_cumulative_metrics(scorer: MathRewardScorer) -> None:
    before = scorer.metrics()
    scorer.score(["\\boxed{1}", "\\boxed{2}", "no"], ["1", "3", "1"])
    after = scorer.metrics()
    assert after["answers"] - before["answers"] == 3
    assert after["correct"] - before["correct"] == 1
    assert after["wrong"] - before["wrong"] == 1
    assert after["no_answer"] - before["no_answer"] == 1
    assert after["batches"] - before["batches"] == 1
    assert 0.0 <= after["accuracy"] <= 1.0


def test_invalid_gold_is_logged_once(scorer: MathRewardScorer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="nemo_hacpo.rewards.scorer"):
        scorer.score(["\\boxed{1}"] * 3, ["\\frac{{{"] * 3)
    assert caplog.text.count("invalid gold") == 1


def test_empty_batch_and_bad_arguments(scorer: MathRewardScorer) -> None:
    empty = scorer.score([], [])
    assert empty.rewards == [] and empty.accuracy == 0.0
    with pytest.raises(ValueError, match="golds"):
        scorer.score(["a"], [])


def test_in_process_path() -> None:
    with MathRewardScorer(
        num_workers=0, timeout_s=TIMEOUT_S, limits=VerifyLimits(max_bracket_depth=100), _debug_markers=MARKERS
    ) as pool:
        batch = _score_mixed(pool)
        assert batch.rewards == [case[2] for case in MIXED]
        expected = Counter(case[3].value for case in MIXED)
        assert batch.counts == {reason.value: expected[reason.value] for reason in RewardReason} | {
            "truncated_input": 0
        }
        slow = pool.score([SLOW_ANSWER, "\\boxed{2}"], ["1", "2"])
        assert slow.reasons == [RewardReason.TIMEOUT, RewardReason.CORRECT]  # the alarm cut the hour short
        assert pool.worker_pids == []


def test_closed_scorer_refuses_work() -> None:
    pool = MathRewardScorer(num_workers=0)
    pool.close()
    pool.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        pool.score(["\\boxed{1}"], ["1"])


def test_fork_start_method_is_refused() -> None:
    with pytest.raises(ValueError, match="fork"):
        MathRewardScorer(num_workers=1, start_method="fork")


def test_count_reasons_includes_zeros_and_truncation() -> None:
    scored = [
        ScoredAnswer.of(RewardReason.CORRECT, truncated=True),
        ScoredAnswer.of(RewardReason.TIMEOUT),
        ScoredAnswer.of(RewardReason.TIMEOUT, truncated=True),
    ]
    counts = count_reasons(scored)
    assert counts["correct"] == 1 and counts["timeout"] == 2 and counts["truncated_input"] == 2
    assert counts["wrong"] == 0 and len(counts) == len(RewardReason) + 1


def test_forkserver_start_method_scores() -> None:
    with MathRewardScorer(num_workers=1, start_method="forkserver", timeout_s=TIMEOUT_S) as pool:
        assert pool.wait_until_ready(timeout_s=120)
        assert pool.score(["\\boxed{\\frac{6}{4}}", "\\boxed{2}"], ["1.5", "3"]).rewards == [1.0, 0.0]


def test_from_config_carries_every_reward_setting() -> None:
    from nemo_hacpo.config import RewardConfig

    reward = RewardConfig(strict=False, timeout_s=3.0, num_workers=0, max_response_chars=12)
    with MathRewardScorer.from_config(reward) as pool:
        assert (pool.num_workers, pool.timeout_s, pool.strict, pool.limits.max_response_chars) == (0, 3.0, False, 12)
        # only the last 12 characters are read: the early box is cut away, the late one is kept
        batch = pool.score(["\\boxed{1} and some more text, then \\boxed{2}"], ["2"])
        assert batch.rewards == [1.0] and batch.truncated == [True]
    with MathRewardScorer.from_config(reward, strict=True) as pool:
        assert pool.strict is True

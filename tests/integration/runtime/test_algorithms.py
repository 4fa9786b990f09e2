"""Every algorithm of the baseline table (algorithm.md §8) and the ablation switches runs through the same loop:
2 steps of pair_tiny_gpt per algorithm, and trio_tiny with HACPO (n = 3). Checks the rollout accounting (HACPO
generates G per prompt per agent and trains on n·G; gspo_x2 generates and trains on 2G; isolated algorithms train
on their own G), how many rows the loss treats as cross rows (HACPO: the other agents' n−1 groups; naive: none),
that the own rows' ratio is 1 at the first update (m_old is the trainer's at the sampling weights), that the
trainer and vLLM agree after every refit, and that every metric is finite.

The baselines share one live pair_tiny_gpt run (Ray, trainers and engines start once, ~40 s on 2 cores):
each test resolves its algorithm from the config (`algo=<name>`), switches the run to it with
`HacpoRun.use_algorithm` and runs two steps and an evaluation through `run_step`/`evaluate`, the code
`train()` runs. trio_tiny goes through `train()` end to end (config → workers → summary)."""

from __future__ import annotations

import json
import math

import pytest

from nemo_hacpo.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TINY = ["runtime.steps=2", "runtime.checkpoint_interval=0", "runtime.eval_interval=0", "runtime.logging=[jsonl]",
        "runtime.save_hf=false", "warmstart.enabled=false", "algo.batch_size=2", "algo.group_size=2",
        "algo.updates_per_step=2", "data.eval.size=2", "runtime.eval_samples=2", "reward.num_workers=0"]
B, G = 2, 2


def _tiny(config: str, n_agents: int) -> list[str]:
    per_agent = [f"agents.{i}.{key}" for i in range(n_agents)
                 for key in ("max_response_length=12", "parallel.micro_batch_size=2")]
    return TINY + per_agent


def _run(tmp_path, config: str, n_agents: int, extra: list[str]) -> dict:
    from nemo_hacpo.runtime.loop import train

    out = tmp_path / "run"
    cfg = load_config(config, [*_tiny(config, n_agents), f"runtime.output_dir={out}", *extra])
    assert train(cfg) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    header = (out / "summary.md").read_text().splitlines()[2]  # the table's header row
    assert "eval_accuracy_start" in header and "avg@2_start" in header and "pass@2_end" in header
    assert "| gained | lost | mcnemar_p |" in header  # start vs end on the same held-out problems
    return records[-1]


def _check(last: dict, agents: list[str], *, shares: bool, samples: int, loss_keys: tuple[str, ...]):
    bad = {k: v for k, v in last.items() if k not in ("step", "time") and not math.isfinite(v)}
    assert not bad, f"non-finite metrics: {bad}"
    n = len(agents)
    for a in agents:
        assert last[f"{a}/rollouts_generated_total"] == 2 * B * samples  # 2 steps
        trained = B * samples * (n if shares else 1)
        assert last[f"{a}/sequences_trained_total"] == 2 * trained
        assert last[f"{a}/broker/self_rows"] == B * samples
        assert last.get(f"{a}/broker/cross_rows", 0) == (B * samples * (n - 1) if shares else 0)
        assert last[f"{a}/train/num_rows"] == trained  # the loss saw every row of the step once
        assert (f"{a}/adv/cross_mean" in last) == shares
        # own rows at the first update: the trainer's ratio against its own m_old, float noise only
        assert last[f"{a}/train/own_ratio_u0"] == pytest.approx(1.0, abs=1e-5)
        assert 1.0 <= last[f"{a}/mismatch_token_mult_prob_error"] < 1.01  # the refit kept vLLM = trainer
        for key in ("reward_mean", "accuracy", "capability", "response_length_mean", "truncation_rate",
                    "mismatch_token_mult_prob_error", "train/grad_norm", "train/lr", "train/loss",
                    "adv/self_mean", "generate_tokens_per_s", "train/tokens_per_s"):
            assert f"{a}/{key}" in last, key
        for key in loss_keys:
            assert f"{a}/train/{key}" in last, key
        for key in ("eval_accuracy", "eval/avg@2", "eval/pass@1", "eval/pass@2", "eval/response_length"):
            assert f"{a}/{key}" in last, key
        assert last[f"{a}/eval/pass@2"] >= last[f"{a}/eval/pass@1"] == pytest.approx(last[f"{a}/eval/avg@2"])


SEQUENCE = ("policy_loss", "kl_loss", "self_ratio_mean", "self_clip_active_frac")
SHARED = (*SEQUENCE, "cross_ratio_mean", "cross_zero_grad_frac", "cross_weight_mean", "cross_clip_lower")
BASELINES = [
    ("gspo", [], False, G, SEQUENCE),
    ("gspo_x2", [], False, 2 * G, SEQUENCE),
    ("grpo", [], False, G, ("policy_loss", "ratio_mean", "clip_active_frac", "approx_kl")),
    ("naive", [], True, G, SEQUENCE),  # naive: every row trained as the learner's own (no cross terms)
    ("hacpo", ["algo.ablation.capability_baseline=false", "algo.ablation.gradient_modulation=false",
               "algo.ablation.cross_clip=false"], True, G, SHARED),
]


@pytest.fixture(scope="class")
def live_pair(tmp_path_factory):
    """One started pair_tiny_gpt run (HACPO config, so the workers keep the reference model the KL term needs)."""
    import ray

    from nemo_hacpo.rewards import MathRewardScorer
    from nemo_hacpo.runtime.loop import HacpoRun

    out = tmp_path_factory.mktemp("live_pair") / "run"
    run = HacpoRun(load_config("pair_tiny_gpt", [*_tiny("pair_tiny_gpt", 2), f"runtime.output_dir={out}",
                                             "runtime.steps=10"]))
    try:
        run.start()
        with MathRewardScorer(num_workers=0) as scorer:
            yield run, scorer
    finally:
        run.close(timeout_s=30)
        ray.shutdown()


def _two_steps(run, scorer, algo) -> dict:
    """Two steps + an evaluation under `algo`; the cumulative counters become this test's own."""
    run.use_algorithm(algo)
    before = {a: dict(t) for a, t in run.totals.items()}
    last: dict = {}
    for _ in range(2):
        last = run.run_step(scorer)
    last.update(run.evaluate(scorer))
    for a, totals in run.totals.items():
        for key, value in totals.items():
            last[f"{a}/{key}_total"] = value - before[a][key]
    return last


class TestBaselinesOnOneLiveRun:
    """The class scope ends the shared run (and its Ray session) before the next test starts its own."""

    @pytest.mark.parametrize(("algo", "extra", "shares", "samples", "loss_keys"), BASELINES, ids=[
        "gspo", "gspo_x2", "grpo", "naive", "hacpo-ablations"])
    def test_baselines_and_ablations_run_through_the_loop(self, live_pair, algo, extra, shares, samples, loss_keys):
        run, scorer = live_pair
        cfg = load_config("pair_tiny_gpt", [*_tiny("pair_tiny_gpt", 2), f"algo={algo}", *extra])
        last = _two_steps(run, scorer, cfg.algo)
        assert run.cfg.algo == cfg.algo and run.broker.algorithm == cfg.algo.algorithm
        _check(last, ["llama_tiny", "gpt_tiny"], shares=shares, samples=samples, loss_keys=loss_keys)
        for a in ("llama_tiny", "gpt_tiny"):  # rows the loss gives the cross objective: HACPO's other-agent rows only
            assert last.get(f"{a}/train/num_cross", 0) == (B * G if algo == "hacpo" else 0)
        if algo == "hacpo":  # ω left out of the gradient: every cross row's weight is 1
            assert last["llama_tiny/adv/cross_omega_mean"] == 1.0


def test_trio_tiny_hacpo(tmp_path):
    import ray

    try:
        last = _run(tmp_path, "trio_tiny", 3, [])
    finally:
        ray.shutdown()
    agents = ["llama_tiny", "gpt_tiny", "qwen_tiny"]
    _check(last, agents, shares=True, samples=G, loss_keys=SHARED)
    for learner in agents:  # one ω per other agent, and both partners' groups as cross rows
        assert sum(k.startswith(f"{learner}/omega/") for k in last) == 2
        assert last[f"{learner}/train/num_cross"] == 2 * B * G

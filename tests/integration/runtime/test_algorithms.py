"""Every algorithm of the baseline table (algorithm.md §8) and the ablation switches runs through the same loop:
2 steps of pair_tiny_gpt per algorithm (trio_tiny with HACPO, n = 3, runs end to end through `train()` on three
Slurm nodes with the same checks: tests/integration/slurm/test_multinode.py). Checks the rollout accounting (HACPO
generates G per prompt per agent and trains on n·G; gspo_x2 generates and trains on 2G; isolated algorithms train
on their own G), how many rows the loss treats as cross rows (HACPO: the other agents' n−1 groups; naive: none),
that the own rows' ratio is 1 at the first update (m_old is the trainer's at the sampling weights), that the
trainer and vLLM agree after every refit, and that every metric is finite.

The baselines share one live pair_tiny_gpt run (Ray, trainers and engines start once, ~40 s on 2 cores):
each test resolves its algorithm from the config (`algo=<name>`), switches the run to it with
`HacpoRun.use_algorithm` and runs two steps and an evaluation through `run_step`/`evaluate`, the code
`train()` runs."""

from __future__ import annotations

import pytest

from nemo_hacpo.config import load_config
from tests.helpers.loop_checks import (
    SEQUENCE,
    SHARED,
    B,
    G,
    check_last_record,
    tiny_algo_overrides,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

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
    run = HacpoRun(load_config("pair_tiny_gpt", [*tiny_algo_overrides(2), f"runtime.output_dir={out}",
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

    def test_the_trainers_environment_reaches_the_ranks_and_not_their_engines(self, live_pair):
        """Issue #40: CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron's TP overlap wants it) is in the rank actors'
        environment and kept out of the vLLM processes each engine rank spawns."""
        from nemo_hacpo.runtime.rank_process import TRAINER_ENVIRONMENT

        run, _ = live_pair
        names = [*TRAINER_ENVIRONMENT, "OMP_NUM_THREADS"]
        for agent, group in run.groups.items():
            (seen,) = group.environment(names)  # pair_tiny_gpt: one rank per agent, which owns the engine
            assert seen["rank"] == {**TRAINER_ENVIRONMENT, "OMP_NUM_THREADS": "1"}, agent
            engine = [child for child in seen["children"] if child["OMP_NUM_THREADS"] is not None]
            assert engine, f"{agent}: no engine process found under the rank"  # they inherit the rest
            assert all(child["CUDA_DEVICE_MAX_CONNECTIONS"] is None for child in seen["children"]), (agent, seen)

    @pytest.mark.parametrize(("algo", "extra", "shares", "samples", "loss_keys"), BASELINES, ids=[
        "gspo", "gspo_x2", "grpo", "naive", "hacpo-ablations"])
    def test_baselines_and_ablations_run_through_the_loop(self, live_pair, algo, extra, shares, samples, loss_keys):
        run, scorer = live_pair
        cfg = load_config("pair_tiny_gpt", [*tiny_algo_overrides(2), f"algo={algo}", *extra])
        last = _two_steps(run, scorer, cfg.algo)
        assert run.cfg.algo == cfg.algo and run.broker.algorithm == cfg.algo.algorithm
        check_last_record(last, ["llama_tiny", "gpt_tiny"], shares=shares, samples=samples, loss_keys=loss_keys)
        for a in ("llama_tiny", "gpt_tiny"):  # rows the loss gives the cross objective: HACPO's other-agent rows only
            assert last.get(f"{a}/train/num_cross", 0) == (B * G if algo == "hacpo" else 0)
        if algo == "hacpo":  # ω left out of the gradient: every cross row's weight is 1
            assert last["llama_tiny/adv/cross_omega_mean"] == 1.0

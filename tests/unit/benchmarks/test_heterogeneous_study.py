"""benchmarks/heterogeneous_study.py's report: paired rows, the per-direction means and the trio's learning test,
by hand on small made-up studies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import heterogeneous_study as hs

ROOT = Path(__file__).resolve().parents[3]


def _run(algo: str, seed: int, finals: dict[str, float], last: int = 30) -> dict:
    return {"algo": algo, "seed": seed, "steps": last, "updates_per_step": 4, "wall_s": 1.0,
            "agents": {agent: {"start_accuracy": 0.25, "final_accuracy": value,
                               "curve": [[0, 0.0, 0.25], [last, 960.0, value]]} for agent, value in finals.items()}}


def _write_results(out: Path, name: str, runs: list[dict]) -> None:
    (out / name).mkdir(parents=True, exist_ok=True)
    (out / name / "results.json").write_text(json.dumps({"runs": runs, "summary": []}))


def _write_eval(run_dir: Path, step: int, agent: str, rewards: list[int]) -> None:
    folder = run_dir / "eval" / f"step_{step:06d}"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": f"p{i}", "responses": [{"mode": "greedy", "reward": float(r)}]})
             for i, r in enumerate(rewards)]
    (folder / f"{agent}__heldout.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture
def out(tmp_path, monkeypatch):
    monkeypatch.setattr(hs, "OUT", tmp_path)
    return tmp_path


def test_paired_lines_by_hand(out):
    # hacpo − naive per seed: 0.1, 0.1, 0.0 → mean 1/15, sample std 0.0577, t = (1/15) / (0.0577 / √3) = 2.0;
    # 95 % interval with 2 d.f.: ± 4.303 × 0.0333 = ± 0.1434 → [−0.077, +0.210]
    runs = [_run("hacpo", 0, {"a": 0.6}), _run("hacpo", 1, {"a": 0.7}), _run("hacpo", 2, {"a": 0.5}),
            _run("naive", 0, {"a": 0.5}), _run("naive", 1, {"a": 0.6}), _run("naive", 2, {"a": 0.5})]
    rows = hs.paired_lines({"runs": runs}, "habit", [("hacpo", "naive"), ("hacpo", "gspo")], "")
    assert len(rows) == 1  # no gspo run: no row
    row = rows[0]
    assert row["comparison"] == "hacpo − naive" and row["seeds"] == 3 and row["for / against"] == "2 / 0"
    assert row["t"] == "2.00" and row["95 % interval"] == "[-0.077, +0.210]"
    assert row["reading"] == "not distinguishable"


def test_reading_thresholds():
    assert hs._reading(2.0) == "not distinguishable"
    assert hs._reading(-2.5) == "5 % level only"
    assert hs._reading(4.5) == "holds (Bonferroni)"
    assert hs._reading(float("nan")) == "one seed"


def test_ablation_rows_pair_against_full_hacpo(out):
    full = {"runs": [_run("hacpo", s, {"a": v}) for s, v in enumerate([0.6, 0.7, 0.8])]}
    ablated = {"runs": [_run("hacpo", s, {"a": v}) for s, v in enumerate([0.5, 0.7, 0.6])]}
    (row,) = hs.paired_lines(ablated, "habit", [("hacpo", "hacpo")], " −ω", other=full)
    # −ω − hacpo per seed: −0.1, 0.0, −0.2 → mean −0.1, std 0.1, t = −0.1 / (0.1 / √3) = −1.73
    assert row["comparison"] == "hacpo −ω − hacpo" and row["for / against"] == "0 / 2" and row["t"] == "-1.73"


def test_direction_rows_average_over_steps_and_seeds(out):
    for seed, records in ((0, [{"step": 1, "llama/from/qwen/s_p50": 0.9, "llama/from/qwen/grad_frac": 0.5,
                                "llama/from/qwen/grad_pos_frac": 0.3, "llama/from/qwen/grad_neg_frac": 0.2,
                                "llama/reward_mean": 0.4}]),
                          (1, [{"step": 1, "llama/from/qwen/s_p50": 0.7, "llama/from/qwen/grad_frac": 0.1,
                                "llama/from/qwen/grad_pos_frac": 0.1, "llama/from/qwen/grad_neg_frac": 0.0}])):
        run_dir = out / "habit" / "runs" / f"naive_seed{seed}"
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    (row,) = hs.direction_rows("habit")
    assert row["algo"] == "naive" and row["direction"] == "qwen → llama" and row["steps × seeds"] == 2
    assert row["s p50"] == "0.8" and row["with gradient"] == "0.300"
    assert row["A > 0 with gradient"] == "0.200" and row["A < 0 with gradient"] == "0.100"
    assert hs.direction_rows("style") == []  # no runs


def test_learning_rows_test_start_against_last_evaluation(out):
    _write_results(out, "trio", [_run("hacpo", 0, {"gpt": 0.75})])
    run_dir = out / "trio" / "runs" / "hacpo_seed0"
    _write_eval(run_dir, 0, "gpt", [1, 0, 0, 0])
    _write_eval(run_dir, 30, "gpt", [1, 1, 1, 0])
    (row,) = hs.learning_rows("trio")
    # gained 2, lost 0: p = 2 × C(2, 0) / 2² = 0.5
    assert row == {"agent": "gpt", "algo": "hacpo", "seed": 0, "start": "0.250", "step 30": "0.750",
                   "gained / lost": "2 / 0", "McNemar p": "0.5"}
    assert hs.learning_rows("missing") == []


def test_report_writes_every_section(out):
    runs = [_run(algo, s, {"llama_tiny": v, "qwen_tiny": 0.8}) for s in range(3)
            for algo, v in (("hacpo", 0.6 + 0.01 * s), ("naive", 0.55), ("gspo", 0.5), ("gspo_x2", 0.52),
                            ("naive_onpolicy", 0.58))]
    _write_results(out, "habit", runs)
    _write_results(out, "habit_no_omega", [_run("hacpo", s, {"llama_tiny": 0.55, "qwen_tiny": 0.8}) for s in range(3)])
    _write_results(out, "trio", [_run("gspo", 0, {"gpt_tiny": 0.5})])
    _write_eval(out / "trio" / "runs" / "gspo_seed0", 0, "gpt_tiny", [0, 0])
    _write_eval(out / "trio" / "runs" / "gspo_seed0", 30, "gpt_tiny", [1, 0])
    text = hs.report()
    assert (out / "results.md").read_text() == text + "\n"
    assert "| habit | llama_tiny | hacpo − naive | 3 |" in text  # primary
    assert "| habit | llama_tiny | naive_onpolicy − gspo | 3 |" in text  # secondary
    assert "| habit | llama_tiny | hacpo −ω − hacpo | 3 | -0.060 ± 0.010 |" in text  # 0.55 − (0.60, 0.61, 0.62)
    assert "| gpt_tiny | gspo | 0 | 0.000 | 0.500 | 1 / 0 | 1 |" in text


def test_equation_lines_narrated_and_arithmetic():
    narrated = "Mia starts with 5 beads.\nShe gives away 3.\n5 - 3 = 2\nShe doubles them.\n2 * 2 = 5\nThe answer is \\boxed{5}"
    assert hs.equation_lines(narrated) == [(True, True), (True, False)]
    bare = "Mia starts with 5 beads.\n5 - 3 = 2\n2 * 2 = 4\n7 / 0 = 1\nThe answer is \\boxed{4}"
    # the first equation follows the opening line, the second another equation: neither is narrated
    assert hs.equation_lines(bare) == [(False, True), (False, True), (False, False)]
    assert hs.equation_lines("no equation here") == []
    assert hs._arithmetic("2 + 3 * 4") == 14.0 and hs._arithmetic("__import__('os')") is None


def test_style_rows_pool_seeds_at_start_and_end(out):
    for seed, end_text, end_reward in ((0, "A has 2.\nHe finds 1.\n2 + 1 = 3\nThe answer is \\boxed{3}", 1),
                                       (1, "A has 2.\n2 + 1 = 4\nThe answer is \\boxed{4}", 0)):
        run_dir = out / "style" / "runs" / f"naive_seed{seed}"
        for step, text, reward in ((0, "A has 2.\nHe finds 1.\n2 + 1 = 3\nThe answer is \\boxed{3}", 1),
                                   (30, end_text, end_reward)):
            folder = run_dir / "eval" / f"step_{step:06d}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "qwen_tiny__heldout.jsonl").write_text(json.dumps(
                {"id": "p0", "responses": [{"mode": "greedy", "reward": float(reward), "text": text}]}) + "\n")
    start, end = hs.style_rows("style")
    assert start == {"pair": "style", "algo": "naive", "agent": "qwen_tiny", "when": "start", "answers": 2,
                     "accuracy": "1.000", "equations per answer": "1.00", "narrated": "1.000",
                     "arithmetic wrong": "0.000"}
    assert (end["when"], end["accuracy"], end["narrated"], end["arithmetic wrong"]) == ("end", "0.500", "0.500", "0.500")


def test_report_on_a_clone_without_runs_leaves_every_results_file_as_it_is(out, capsys):
    """The runs are not committed: `report` on a fresh clone must not rewrite a study's results from nothing (it
    once wrote results.json with 0 runs) nor drop the sections that read the runs from results.md."""
    runs = [_run(algo, s, {"llama_tiny": 0.6, "qwen_tiny": 0.8}) for s in range(2) for algo in ("hacpo", "gspo")]
    _write_results(out, "habit", runs)
    (out / "habit" / "command.txt").write_text("python benchmarks/sample_efficiency.py --out x\n")
    (out / "results.md").write_text("the committed report\n")
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    assert hs.main(["report"]) == 0
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == before
    captured = capsys.readouterr()
    assert "no runs/ nor raw/ for habit here" in captured.err and "| habit | llama_tiny | hacpo − gspo | 2 |" in captured.out


def test_row_order_rows_by_hand(out):
    """The pre-registered comparison (docs/algorithm.md §6): arms and by_prompt − own_first, paired by seed."""
    assert hs.row_order_rows() == ([], [])  # until both studies have results
    _write_results(out, "style_own_first", [_run("hacpo", s, {"a": v}) for s, v in enumerate([0.5, 0.6, 0.7, 0.6])])
    _write_results(out, "style_by_prompt", [_run("hacpo", s, {"a": v}) for s, v in enumerate([0.6, 0.6, 0.8, 0.6])])
    arms, paired = hs.row_order_rows()
    # own_first: changes from 0.25 are 0.25, 0.35, 0.45, 0.35 → mean 0.35, std √(0.02 / 3) = 0.0816
    assert arms[0] == {"algo": "hacpo", "row_order": "own_first", "agent": "a", "seeds": 4, "start": "0.250",
                       "final": "0.600", "change (mean ± std)": "0.350 ± 0.082"}
    assert arms[1]["row_order"] == "by_prompt" and arms[1]["final"] == "0.650"
    # by_prompt − own_first per seed: 0.1, 0, 0.1, 0 → mean 0.05, std 0.0577, t = 0.05 / (0.0577 / 2) = 1.73
    (row,) = paired
    assert row["comparison"] == "hacpo: by_prompt − own_first" and row["seeds"] == 4
    assert row["for / against"] == "2 / 0" and row["t"] == "1.73"
    assert row["reading"] == "not distinguishable (critical t 3.182, 3 d.f.)"  # 4 seeds: not the 8-seed study's bounds
    assert "## Row order (pre-registered: docs/algorithm.md §6)" in hs.report(write=False)
    assert hs.main(["report"]) == 0 and (out / "row_order.md").read_text().startswith("# Row order: results\n\n")


def test_the_row_order_studys_own_first_arm_reproduced_the_style_studys_runs():
    """The row-order study's `own_first` arm (16 runs on c5573b7, archived run by run in style_own_first/raw/) ran
    the style pair's naive and HACPO seeds 0–3 again on a later commit than the style study (whose runs were not
    kept): every agent's curve and every held-out answer at the end are equal, so those 8 of the style study's 40
    runs can be recomputed from committed archives (docs/results.md)."""
    base = ROOT / "benchmarks" / "results" / "heterogeneous_pairs"
    style = {(r["algo"], r["seed"]): r for r in json.loads((base / "style" / "results.json").read_text())["runs"]}
    again = {(r["algo"], r["seed"]): r for r in
             json.loads((base / "style_own_first" / "results.json").read_text())["runs"]}
    assert sorted(again) == [(algo, seed) for algo in ("hacpo", "naive") for seed in range(4)]
    for key, run in again.items():
        assert run["agents"] == style[key]["agents"], key
        assert (base / "style_own_first" / "raw" / f"{key[0]}_seed{key[1]}.json.xz").is_file(), key
    assert again[("naive", 2)]["agents"]["qwen_tiny"]["final_accuracy"] == 0.132  # the collapse, seed 2

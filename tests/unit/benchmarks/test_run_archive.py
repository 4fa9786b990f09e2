"""benchmarks/run_archive.py: a finished run archived and read back gives the study the same numbers as its
directory did — on a fresh clone, where only the archives are."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import run_archive as ra
from benchmarks import sample_efficiency as se

RECORDS = [  # step 1 logged twice (a resumed step): its last record counts
    {"step": 0, "time": 0.0, "a/eval_accuracy": 0.25, "a/rollouts_generated": 0},
    {"step": 1, "time": 5.0, "a/train/loss": 9.0, "a/rollouts_generated": 8},
    {"step": 1, "time": 9.0, "a/train/loss": 1.5, "a/rollouts_generated": 8},
    {"step": 2, "time": 12.0, "a/eval_accuracy": 0.75, "a/rollouts_generated": 16, "a/from/b/s_p50": 0.5},
]


def _answer(pid: str, greedy: float) -> dict:
    return {"id": pid, "question": f"What is {pid}?", "gold": "4", "level": 1,
            "responses": [{"mode": "greedy", "index": 0, "text": "2 + 2 = 4\\nThe answer is \\boxed{4}",
                           "reward": greedy, "status": "correct" if greedy else "wrong"}]}


def _run(study: Path, algo: str = "hacpo", seed: int = 0) -> se.PlannedRun:
    run_dir = study / "runs" / f"{algo}_seed{seed}"
    for step, rewards in ((0, (1.0, 0.0, 0.0, 0.0)), (2, (1.0, 1.0, 1.0, 0.0))):
        folder = run_dir / "eval" / f"step_{step:06d}"
        folder.mkdir(parents=True)
        (folder / "a__heldout.jsonl").write_text(
            "".join(json.dumps(_answer(f"q{i}", r)) + "\n" for i, r in enumerate(rewards)))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    (run_dir / ra.RUN_RECORD).write_text(json.dumps({"status": "done", "wall_s": 90.0, "commits": ["abc1234"]}))
    return se.PlannedRun(algo, seed, str(run_dir), (), 2, 4, 4, 8)


def test_the_archive_reads_back_as_the_run_directory(tmp_path):
    planned = _run(tmp_path)
    here = ra.RunFiles(planned.run_dir)
    assert not here.archived and here.exists
    path = ra.write_archive(planned.run_dir)
    assert path == tmp_path / "raw" / "hacpo_seed0.json.xz" and path.stat().st_size < 2000
    expected = (here.record(), here.metrics(), here.evaluations(), here.answers(2, "a"), here.answers(0, "a"))
    shutil.rmtree(tmp_path / "runs")  # a fresh clone: runs/ is not committed
    archived = ra.RunFiles(planned.run_dir)
    assert archived.archived and archived.exists and archived.algo == "hacpo"
    assert (archived.record(), archived.metrics(), archived.evaluations(), archived.answers(2, "a"),
            archived.answers(0, "a")) == expected
    assert archived.evaluations() == {"a": [0, 2]} and archived.answers(5, "a") == []
    assert archived.answers(2, "a")[0]["question"] == "What is q0?"  # stored once per problem, given back per answer
    assert [r.name for r in ra.study_runs(tmp_path)] == ["hacpo_seed0"]


def test_the_study_computes_the_same_numbers_from_the_archives(tmp_path):
    runs = [_run(tmp_path, "hacpo", 0), _run(tmp_path, "naive", 0)]
    for run in runs:
        ra.write_archive(run.run_dir)
    se.aggregate(runs, ["hacpo", "naive"], tmp_path, "cmd")
    from_dirs = json.loads((tmp_path / "results.json").read_text())
    a = from_dirs["runs"][0]["agents"]["a"]
    # by hand: accuracies 0.25 → 0.75; greedy right on q0 only at step 0, on q0–q2 at step 2 (the last evaluation)
    assert (a["start_accuracy"], a["final_accuracy"]) == (0.25, 0.75)
    assert a["final_correct"] == [["q0", 1], ["q1", 1], ["q2", 1], ["q3", 0]]
    assert from_dirs["runs"][0]["commit"] == "abc1234" and from_dirs["runs"][0]["wall_s"] == 90.0
    shutil.rmtree(tmp_path / "runs")
    (tmp_path / "study.json").write_text(json.dumps([{**vars(r), "run_dir": f"/elsewhere/runs/{Path(r.run_dir).name}"}
                                                     for r in runs]))
    args, _ = se.parse_args(["--out", str(tmp_path), "--algos", "hacpo,naive", "--seeds", "0"])
    offline = se.plan_runs_offline(args)  # the machine's absolute paths, rebased on --out
    assert [r.run_dir for r in offline] == [str(tmp_path / "runs" / "hacpo_seed0"), str(tmp_path / "runs" / "naive_seed0")]
    se.aggregate(offline, ["hacpo", "naive"], tmp_path, "cmd")  # no StudyError: every run is archived
    assert json.loads((tmp_path / "results.json").read_text()) == from_dirs


def test_a_run_is_archived_when_it_finishes_and_on_request(tmp_path, monkeypatch):
    import subprocess

    planned = _run(tmp_path)  # the training subprocess stands aside: the run's files are already written
    real = subprocess.run  # git (the run's commit) runs for real
    monkeypatch.setattr(se.subprocess, "run", lambda cmd, **k: real(cmd, **k) if cmd[0] == "git"
                        else subprocess.CompletedProcess(cmd, 0))
    assert se.execute(planned, "pair_tiny")["status"] == "done"
    assert (tmp_path / "raw" / "hacpo_seed0.json.xz").is_file()
    (tmp_path / "raw" / "hacpo_seed0.json.xz").unlink()
    (tmp_path / "study.json").write_text(json.dumps([vars(planned)]))
    assert se.main(["--out", str(tmp_path), "--algos", "hacpo", "--seeds", "0", "--archive-only"]) == 0
    assert ra.RunFiles(planned.run_dir).metrics() == RECORDS and (tmp_path / "raw" / "hacpo_seed0.json.xz").is_file()


def test_an_archive_of_another_format_is_refused(tmp_path):
    import lzma

    (tmp_path / "raw").mkdir()
    with lzma.open(tmp_path / "raw" / "hacpo_seed0.json.xz", "wt") as out:
        json.dump({"format": 99}, out)
    with pytest.raises(ValueError, match="archive format 99, not 1"):
        ra.RunFiles(tmp_path / "runs" / "hacpo_seed0").metrics()

"""docs/configuration.md is the generated reference of the schema and its start-up checks, and is up to date."""

from __future__ import annotations

from pathlib import Path

from nemo_hacpo.config import describe
from nemo_hacpo.config.reference import keys, render, rules

PAGE = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def test_the_committed_reference_is_the_generated_one():
    assert PAGE.read_text() == render(), (
        "docs/configuration.md is stale: python -m nemo_hacpo.config.reference > docs/configuration.md")


def test_every_key_of_describe_is_in_the_reference_with_its_default():
    rows = {key: default for key, _, default, _ in keys()}
    for line in describe():
        key = line.split(" ", 1)[0].removesuffix("[]")  # describe() writes the list itself `agents[]`
        assert key in rows, key
        if " = " in line.split(" — ", 1)[0]:
            assert line.split(" = ", 1)[1].split(" — ", 1)[0] == rows[key], key


def test_checks_are_filed_under_the_key_they_name():
    by_key: dict[str, list[str]] = {}
    for key, problem, _ in rules():
        by_key.setdefault(key, []).append(problem)
    assert "context parallelism (…) is not supported yet" in by_key["agents[].parallel.cp"]
    # a loop over literal names, expanded: one check per key
    for name in ("collective_timeout_s", "call_timeout_s", "lock_stale_s"):
        assert "must be > 0 seconds" in by_key[f"runtime.{name}"]
    # a helper called with the key (`_check_warm_start_shares("warmstart", ...)` and per agent)
    assert "must lie in [0, 1], got …" in by_key["warmstart.narrated_fraction"]
    assert "must lie in [0, 1], got …" in by_key["agents[].warmstart.narrated_fraction"]
    # a key computed from a tuple assignment (`key, tp, world = f"agents[{i}].rollout", ...`)
    assert "must be ≥ 1 (got …)" in by_key["agents[].rollout.refit_bucket_mb"]
    page = render()
    row = next(line for line in page.splitlines() if line.startswith("| `agents[].parallel.cp` |"))
    assert "context parallelism" in row and "| `int` | `1` |" in row

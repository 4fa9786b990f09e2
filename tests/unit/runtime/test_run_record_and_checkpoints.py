"""Nothing lost, nothing silent: the run record and the checkpoint manifest.

- the record (`<run>/config.yaml`) is written atomically, never torn by a full disk; a resume that changes what
  the checkpoints hold is refused naming every key (unless allowed), other changes are reported;
- a checkpoint carries a manifest of sizes and digests; a truncated file, same-size flipped bytes, an empty driver
  record or a missing manifest fail verification with the file named, and the newest checkpoint that verifies is
  the one a run resumes from (the others moved aside, not deleted); only `step_<digits>` folders count.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from nemo_hacpo.config import ConfigError, load_config, load_run_config
from nemo_hacpo.runtime.run_checkpoint import (
    DRIVER_FILE,
    MANIFEST_FILE,
    archive_previous_run,
    checkpoints,
    latest_checkpoint,
    save_run_checkpoint,
    write_text_atomic,
)
from nemo_hacpo.runtime.run_record import (
    RECORD_FILE,
    check_resume,
    differences,
    identity_changes,
    write_record,
)
from nemo_hacpo.training.checkpoint_files import bytes_record


class _SavingGroup:
    """Stands in for an AgentGroup: `save_checkpoint` writes two shard files where a trainer would, and records
    them as the writing rank does (size and digest of the bytes it wrote)."""

    def save_checkpoint(self, path, step, digest=None):
        files = {"__0_0.distcp": bytes(range(256)) * 64, ".metadata": f"step {step}".encode()}
        Path(path).mkdir(parents=True)
        for name, data in files.items():
            (Path(path) / name).write_bytes(data)
        records = {name: bytes_record(data, digest) for name, data in files.items()}
        return SimpleNamespace(result=lambda: records)


def _saved(tmp_path, *steps, hashes=True):
    for step in steps:
        save_run_checkpoint(tmp_path, step, {"step": step}, {"a": _SavingGroup()}, keep=0, hashes=hashes)
    return {c.step: c for c in checkpoints(tmp_path)}


# ------------------------------------------------------------------------------------------ the record
def test_record_round_trips_and_survives_a_full_disk(tmp_path, monkeypatch):
    cfg = load_config("pair_tiny_gpt", [f"runtime.output_dir={tmp_path}"])
    write_record(tmp_path, cfg)
    assert load_run_config(tmp_path) == cfg
    before = (tmp_path / RECORD_FILE).read_bytes()

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    other = load_config("pair_tiny_gpt", [f"runtime.output_dir={tmp_path}", "runtime.steps=99"])
    with pytest.raises(OSError, match="No space left"):
        write_record(tmp_path, other)
    assert (tmp_path / RECORD_FILE).read_bytes() == before  # the old record, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == [RECORD_FILE]  # no temporary file left behind


def test_a_resume_that_changes_what_the_checkpoints_hold_is_refused_naming_each_key(tmp_path):
    base = [f"runtime.output_dir={tmp_path}"]
    write_record(tmp_path, load_config("pair_tiny_gpt", base))
    changed = load_config("pair_tiny_gpt", [*base, "agents.0.model.tiny.num_layers=2", "data.train.seed=5",
                                        "algo=gspo", "runtime.steps=20", "agents.1.optimizer.lr=3e-5"])
    with pytest.raises(ConfigError) as info:
        check_resume(tmp_path, changed)
    keys = [issue.key for issue in info.value.issues]
    assert keys == ["agents[0].model.tiny.num_layers", "algo.name", "data.train.seed"]
    assert "was made with 4, this start asks for 2" in str(info.value)
    assert "runtime.allow_config_change=true" in str(info.value)
    allowed = load_config("pair_tiny_gpt", [*base, "agents.0.model.tiny.num_layers=2", "runtime.allow_config_change=true"])
    assert set(check_resume(tmp_path, allowed)) == {"agents[0].model.tiny.num_layers", "runtime.allow_config_change"}
    # what may change on resume: steps, learning rates, intervals, layouts — reported, not refused
    benign = load_config("pair_tiny_gpt", [*base, "runtime.steps=20", "agents.1.optimizer.lr=3e-5",
                                       "agents.0.parallel.micro_batch_size=4", "data.on_invalid=skip"])
    assert check_resume(tmp_path, benign) == {"agents[0].parallel.micro_batch_size": (8, 4),
                                              "agents[1].optimizer.lr": (2e-5, 3e-5),
                                              "data.on_invalid": ("error", "skip"), "runtime.steps": (10, 20)}


def test_identity_covers_the_agents_list_and_the_seed():
    two = load_config("pair_tiny_gpt")
    three = load_config("trio_tiny")
    blocking = identity_changes(differences(two, three))
    assert "agents" in blocking and blocking["agents"] == (2, 3)
    seeded = load_config("pair_tiny_gpt", ["runtime.seed=3"])
    assert set(identity_changes(differences(two, seeded))) == {"runtime.seed"}


def test_a_moved_model_is_named_as_a_change_not_as_a_broken_record(tmp_path):
    """The record is read for what it says, not re-checked against today's files: a model folder that has moved
    since is the identity change `agents[0].model.path`, not "the run record is not a valid config"."""
    shape = {"num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2}
    old_dir, new_dir = tmp_path / "model_old", tmp_path / "model_new"
    new_dir.mkdir()
    (new_dir / "config.json").write_text(json.dumps(shape))
    out = tmp_path / "run"
    out.mkdir()
    model = ["agents.0.model.source=hf", "agents.0.tokenizer.source=hf"]
    recorded = load_config("pair_tiny_gpt", [f"runtime.output_dir={out}", *model, f"agents.0.model.path={new_dir}"])
    write_record(out, dataclasses.replace(recorded, agents=[
        dataclasses.replace(recorded.agents[0], model=dataclasses.replace(recorded.agents[0].model, path=str(old_dir))),
        recorded.agents[1]]))  # as if written before the folder moved
    with pytest.raises(ConfigError) as info:
        check_resume(out, recorded)
    assert [issue.key for issue in info.value.issues] == ["agents[0].model.path"]
    assert f"was made with {str(old_dir)!r}, this start asks for {str(new_dir)!r}" in str(info.value)


def test_an_unreadable_record_is_named(tmp_path):
    (tmp_path / RECORD_FILE).write_text("agents: [unterminated\n")
    with pytest.raises(ConfigError, match=f"runtime.resume: the run record {tmp_path / RECORD_FILE}"):
        check_resume(tmp_path, load_config("pair_tiny_gpt"))


def test_starting_over_moves_the_record_with_the_run(tmp_path):
    write_record(tmp_path, load_config("pair_tiny_gpt"))
    _saved(tmp_path, 1)
    moved = archive_previous_run(tmp_path)
    assert (moved / RECORD_FILE).is_file() and (moved / "checkpoints" / "step_000001").is_dir()
    assert not (tmp_path / RECORD_FILE).exists()


def test_write_text_atomic_replaces_whole_files(tmp_path):
    path = write_text_atomic(tmp_path / "a.json", "one")
    write_text_atomic(path, "two")
    assert path.read_text() == "two" and [p.name for p in tmp_path.iterdir()] == ["a.json"]


# ---------------------------------------------------------------------------------------- checkpoints
def test_a_saved_checkpoint_verifies_and_lists_every_file(tmp_path):
    found = _saved(tmp_path, 1)
    manifest = json.loads((found[1].path / MANIFEST_FILE).read_text())
    assert sorted(manifest["files"]) == ["agents/a/.metadata", "agents/a/__0_0.distcp", DRIVER_FILE]
    assert manifest["files"]["agents/a/__0_0.distcp"]["bytes"] == 256 * 64
    assert manifest["algorithm"] in ("blake3", "sha256") and all("digest" in f for f in manifest["files"].values())
    assert found[1].problems() == []
    assert latest_checkpoint(tmp_path).step == 1


@pytest.mark.parametrize(("damage", "expected"), [
    ("truncate", "agents/a/__0_0.distcp has 100 bytes, the manifest says 16384"),
    ("flip", "agents/a/__0_0.distcp: its content does not match the manifest's"),
    ("empty_driver", "driver.json has 0 bytes, the manifest says"),
    ("no_driver", "driver.json is missing"),
    ("bad_entry", "agents/a/.metadata cannot be checked (TypeError"),
    ("old_manifest", "manifest.json is unreadable (ValueError: version 0"),
    ("extra_file", "agents/a/stray.bin is not in the manifest"),
    ("missing_file", "agents/a/.metadata is missing"),
])
def test_a_damaged_newest_checkpoint_is_skipped_naming_the_file(tmp_path, caplog, damage, expected):
    found = _saved(tmp_path, 1, 2)
    newest = found[2].path
    shard = newest / "agents" / "a" / "__0_0.distcp"
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:100])
    elif damage == "flip":  # the same size, one byte different: only the digest can tell
        data = bytearray(shard.read_bytes())
        data[5000] ^= 0xFF
        shard.write_bytes(bytes(data))
    elif damage == "empty_driver":
        (newest / DRIVER_FILE).write_text("")
    elif damage == "no_driver":
        (newest / DRIVER_FILE).unlink()
    elif damage in ("bad_entry", "old_manifest"):
        manifest = json.loads((newest / MANIFEST_FILE).read_text())
        if damage == "bad_entry":
            manifest["files"]["agents/a/.metadata"] = [5]
        else:
            manifest["version"] = 0
        (newest / MANIFEST_FILE).write_text(json.dumps(manifest))
    elif damage == "extra_file":
        (newest / "agents" / "a" / "stray.bin").write_bytes(b"x")
    else:
        (newest / "agents" / "a" / ".metadata").unlink()
    assert any(expected in problem for problem in found[2].problems()), found[2].problems()
    with caplog.at_level("WARNING"):
        assert latest_checkpoint(tmp_path).step == 1  # the previous one, verified
    assert f"{newest} failed verification" in caplog.text and expected in caplog.text
    assert not newest.exists() and len(list(newest.parent.glob("step_000002.corrupt-*"))) == 1  # moved, kept
    assert [c.step for c in checkpoints(tmp_path)] == [1]


def test_the_driver_builds_the_manifest_from_the_writers_records_without_reading_a_shard(tmp_path, monkeypatch):
    """The writers (the ranks) hash what they write; the driver only lists the folder and compares sizes — no
    read of any file under agents/ (before, it hashed the whole checkpoint itself after each save: tens of minutes
    for pair_large's ~1.3 TB). A flipped byte is still caught on resume, where the digests are checked."""
    import builtins
    import pathlib

    agents = str(tmp_path / "checkpoints")
    real_open, real_path_open = builtins.open, pathlib.Path.open

    def no_reading(file, mode="r", *args, **kwargs):
        if "r" in mode and "+" not in mode and f"{agents}" in str(file) and "/agents/" in str(file):
            raise AssertionError(f"the driver read {file}")
        return real_open(file, mode, *args, **kwargs)

    def no_path_reading(self, mode="r", *args, **kwargs):
        if "r" in mode and "+" not in mode and "/agents/" in str(self):
            raise AssertionError(f"the driver read {self}")
        return real_path_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_reading)
    monkeypatch.setattr(pathlib.Path, "open", no_path_reading)
    found = _saved(tmp_path, 1, 2)
    monkeypatch.undo()
    manifest = json.loads((found[2].path / MANIFEST_FILE).read_text())
    assert manifest["files"]["agents/a/__0_0.distcp"] == bytes_record(bytes(range(256)) * 64, manifest["algorithm"])
    shard = found[2].path / "agents" / "a" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0x01
    shard.write_bytes(bytes(data))
    assert latest_checkpoint(tmp_path).step == 1


def test_a_file_its_writer_did_not_report_or_recorded_at_another_size(tmp_path, caplog):
    from nemo_hacpo.runtime.run_checkpoint import CheckpointError

    class _Writer(_SavingGroup):
        def __init__(self, change):
            self.change = change

        def save_checkpoint(self, path, step, digest=None):
            call = super().save_checkpoint(path, step, digest)
            records = call.result()
            if self.change == "unreported":
                (Path(path) / "extra.bin").write_bytes(b"abc")
            else:
                records["__0_0.distcp"] = {**records["__0_0.distcp"], "bytes": 1}
            return SimpleNamespace(result=lambda: records)

    with caplog.at_level("WARNING"):
        save_run_checkpoint(tmp_path, 1, {"step": 1}, {"a": _Writer("unreported")})
    assert "extra.bin was not reported by the rank that wrote it; the driver hashes it" in caplog.text
    assert latest_checkpoint(tmp_path).problems() == []
    with pytest.raises(CheckpointError, match=r"__0_0.distcp: 16384 bytes on disk, its writer recorded 1"):
        save_run_checkpoint(tmp_path, 2, {"step": 2}, {"a": _Writer("size")})
    assert [c.step for c in checkpoints(tmp_path)] == [1]  # nothing half-written took its place


def test_a_checkpoint_from_before_manifests_is_used_with_a_warning(tmp_path, caplog):
    """Written by a version without manifests (the folder was renamed into place, so the save had finished): used
    when its driver state reads, said to be unverified; one whose driver state does not read is skipped."""
    found = _saved(tmp_path, 1, 2, 3)
    for step in (2, 3):
        (found[step].path / MANIFEST_FILE).unlink()
    (found[3].path / DRIVER_FILE).write_text("")
    with caplog.at_level("WARNING"):
        assert latest_checkpoint(tmp_path).step == 2
    assert f"checkpoint {found[2].path} has no manifest.json" in caplog.text and "not verified" in caplog.text
    assert f"{found[3].path} failed verification" in caplog.text and "driver state is unreadable" in caplog.text


def test_sizes_only_mode_and_an_unreadable_driver_record(tmp_path):
    found = _saved(tmp_path, 1, hashes=False)
    assert "digest" not in json.loads((found[1].path / MANIFEST_FILE).read_text())["files"][DRIVER_FILE]
    assert found[1].problems(hashes=False) == [] and found[1].problems() == []
    driver = found[1].path / DRIVER_FILE
    driver.write_text("{not json" + " " * (driver.stat().st_size - 9))  # same size: only parsing can tell
    (problem,) = found[1].problems()
    assert problem.startswith(f"{driver}: the driver state is unreadable (JSONDecodeError")


def test_only_step_digits_folders_are_checkpoints(tmp_path):
    _saved(tmp_path, 2)
    root = tmp_path / "checkpoints"
    (root / "step_000002.bak").mkdir()
    (root / "step_000002.bak" / DRIVER_FILE).write_text('{"step": 2}')
    (root / "step_x").mkdir()
    assert [c.path.name for c in checkpoints(tmp_path)] == ["step_000002"]


def test_the_message_on_the_way_out_checks_without_moving_anything(tmp_path):
    found = _saved(tmp_path, 1, 2)
    (found[2].path / DRIVER_FILE).write_text("")
    assert latest_checkpoint(tmp_path, hashes=False, quarantine=False).step == 1
    assert found[2].path.exists()  # left where it is: the rerun will deal with it

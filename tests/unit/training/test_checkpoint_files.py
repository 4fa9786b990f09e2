"""Checkpoint file records (`training.checkpoint_files`): which rank wrote which file of a torch_dist checkpoint,
records of bytes a writer still holds equal to those of the file, and several files hashed at once."""

from __future__ import annotations

import hashlib
import threading

import pytest

from nemo_hacpo.training import checkpoint_files
from nemo_hacpo.training.checkpoint_files import (
    bytes_record,
    digest_files,
    file_digest,
    file_record,
    own_files,
    written_by,
)


def test_each_file_belongs_to_the_rank_that_wrote_it(tmp_path):
    for name in ("__0_0.distcp", "__0_1.distcp", "__1_0.distcp", "__12_3.distcp", ".metadata", "common.pt",
                 "metadata.json", "nemo_hacpo_trainer.json", "__x_0.distcp"):
        (tmp_path / name).write_bytes(b"x")
    assert [written_by(n) for n in ("__0_0.distcp", "__1_0.distcp", "__12_3.distcp", ".metadata", "__x_0.distcp")
            ] == [0, 1, 12, 0, 0]
    assert own_files(tmp_path, 1) == ["__1_0.distcp"]
    assert own_files(tmp_path, 12) == ["__12_3.distcp"]
    assert own_files(tmp_path, 0) == [".metadata", "__0_0.distcp", "__0_1.distcp", "__x_0.distcp", "common.pt",
                                      "metadata.json", "nemo_hacpo_trainer.json"]
    assert own_files(tmp_path, 2) == []


@pytest.mark.parametrize("algorithm", ["sha256", "blake3"])
def test_a_writers_record_of_its_bytes_equals_the_files(tmp_path, algorithm):
    data = bytes(range(256)) * 1000
    (tmp_path / "shard").write_bytes(data)
    assert bytes_record(data, algorithm) == file_record(tmp_path / "shard", algorithm)
    assert bytes_record(data, None) == {"bytes": 256_000}
    if algorithm == "sha256":
        assert file_digest(tmp_path / "shard", "sha256") == hashlib.sha256(data).hexdigest()
    with pytest.raises(ValueError, match="unknown digest algorithm 'md5'"):
        bytes_record(data, "md5")


def test_files_are_hashed_at_the_same_time(tmp_path, monkeypatch):
    """Two files, two threads: each hash waits for the other to have started (a barrier that only a parallel
    hashing passes; one thread after the other would break it after its timeout)."""
    for name in ("a", "b"):
        (tmp_path / name).write_bytes(name.encode() * 1000)
    together = threading.Barrier(2, timeout=30)
    serial = {name: file_record(tmp_path / name, "sha256") for name in ("a", "b")}
    record = checkpoint_files.file_record

    def waiting_record(path, algorithm):
        together.wait()
        return record(path, algorithm)

    monkeypatch.setattr(checkpoint_files, "file_record", waiting_record)
    assert digest_files(tmp_path, ["a", "b"], "sha256", workers=2) == serial
    assert digest_files(tmp_path, [], "sha256") == {}

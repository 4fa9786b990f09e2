"""Each trainer rank records and hashes the checkpoint files it wrote (Megatron dist_checkpointing over gloo).

Two ranks (TP 2) save after an update: rank 1's own records are exactly its `__1_*.distcp` files, rank 0 returns
every file of the checkpoint with its writer's record, and every digest equals one computed here from the files
on disk. Before this change a save returned only its path, and the driver hashed every file itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.distributed import run_distributed
from tests.integration.training.tiny_setup import (
    mean_logprobs,
    plain_rows,
    tiny_agent,
    tiny_arch,
    token_rows,
    train,
    training_rows,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,  # two gloo ranks saving a checkpoint: ~14 s
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU/gloo test (GPU: tests/gpu/)"),
]


def save_rank(directory: str) -> dict:
    from nemo_hacpo.config import AlgoConfig
    from nemo_hacpo.training import MegatronTrainer

    agent = tiny_agent(tp=2)
    trainer = MegatronTrainer(agent, tiny_arch(agent), seed=1, total_updates=2)
    token_ids, response_mask = token_rows(seed=3)
    rows = training_rows(mean_logprobs(trainer, plain_rows(token_ids, response_mask)), seed=3)
    train(trainer, rows, AlgoConfig(updates_per_step=1, kl_coef=0.0), step=0)
    saved = trainer.save_checkpoint(f"{directory}/ckpt", step=0, digest="sha256")
    trainer.close()
    return {"path": saved.path, "own": saved.own, "files": saved.files}


def test_every_rank_hashes_the_files_it_wrote(tmp_path: Path) -> None:
    from nemo_hacpo.training.checkpoint_files import file_record

    first, second = run_distributed(save_rank, 2, str(tmp_path), timeout_s=600)
    root = Path(first["path"])
    on_disk = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert sorted(second["own"]) == sorted(n for n in on_disk if n.startswith("__1_")) != []
    assert second["files"] == {}  # only rank 0 gathers
    assert sorted(first["files"]) == on_disk
    assert set(first["own"]) | set(second["own"]) == set(on_disk) and not set(first["own"]) & set(second["own"])
    for name, record in first["files"].items():
        assert record == file_record(root / name, "sha256"), name

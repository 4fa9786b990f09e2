"""Which format the distributed optimizer's state is saved in comes from the agent's config (issue #26 item 3:
`dp_reshardable` for llama70b, whose DP = 1 save would otherwise hold full host copies on every rank). The save
itself, in both formats, is tests/integration/training/test_trainer_checkpoint.py."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from nemo_hacpo.config import load_config
from nemo_hacpo.training.trainer_checkpoint import (
    DISTRIBUTED_OPTIMIZER_FORMATS,
    checkpoint_format,
    release_host_cache,
)


def test_the_format_is_the_agents_and_older_configs_keep_the_default():
    cfg = load_config("pair_tiny_gpt", ["agents.0.optimizer.checkpoint_format=dp_reshardable"])
    assert [checkpoint_format(SimpleNamespace(agent=a)) for a in cfg.agents] == ["dp_reshardable", "fully_reshardable"]
    assert checkpoint_format(SimpleNamespace(agent=SimpleNamespace(optimizer=SimpleNamespace()))) == "fully_reshardable"
    assert set(DISTRIBUTED_OPTIMIZER_FORMATS) == {"fully_reshardable", "dp_reshardable"}


def test_the_host_cache_is_released_only_where_there_is_one():
    assert release_host_cache() is torch.cuda.is_available()

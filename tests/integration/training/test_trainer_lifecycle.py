"""A trainer leaves the process as it found it (issue #38, items 2 and 3; found on the first H200 run): building
and closing one gives back every process group it created (with NCCL, ~1.1 GiB of GPU memory per trainer was
left behind), and a constructor that raises leaves Megatron's parallel state uninitialised, so the next trainer
builds. Here over gloo in a world of one; tests/gpu/test_trainer_cuda.py measures the GPU memory itself."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch

from tests.helpers.megatron_setup import gloo_world_of_one
from tests.integration.training.tiny_setup import tiny_agent, tiny_arch

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU/gloo test (GPU: tests/gpu/)"),
]


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    with gloo_world_of_one():
        yield


def test_closing_a_trainer_destroys_the_groups_it_created(world: None) -> None:
    from megatron.core import parallel_state

    from nemo_hacpo.training import MegatronTrainer
    from nemo_hacpo.training.distributed import process_groups

    before = process_groups()
    for _ in range(3):  # the same process builds and closes trainer after trainer (the H200 run built five)
        trainer = MegatronTrainer(tiny_agent(), tiny_arch(tiny_agent()), seed=1, reference_model=True)
        assert len(process_groups()) > len(before)  # Megatron's TP/PP/DP/… groups (gloo twins included)
        trainer.close()
        assert process_groups() == before and not parallel_state.model_parallel_is_initialized()
    trainer.close()  # twice is harmless


def test_a_trainer_that_fails_to_build_leaves_no_parallel_state(world: None) -> None:
    from megatron.core import parallel_state

    from nemo_hacpo.training import MegatronTrainer
    from nemo_hacpo.training.distributed import process_groups

    before = process_groups()
    agent = tiny_agent()
    bf16 = dataclasses.replace(agent, precision=dataclasses.replace(agent.precision, dtype="bf16"))
    with pytest.raises(ValueError, match="CPU training runs in fp32"):  # raised after the parallel state is set up
        MegatronTrainer(bf16, tiny_arch(agent), seed=1)
    assert not parallel_state.model_parallel_is_initialized() and process_groups() == before
    trainer = MegatronTrainer(agent, tiny_arch(agent), seed=1)  # before the fix: "parallel_state is already
    trainer.close()                                             # initialised … close() the previous trainer first"

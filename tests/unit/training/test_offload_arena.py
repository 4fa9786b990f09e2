"""The train state's host arena (issue #38, item 7): on an H200 host pinning ran at ~2.2 GB/s, so a first `offload()`
of 41.5 GiB took 21.9 s and the next 0.62 s. With `keep_host` the copies made by the first offload stay after
`restore()`, and every later offload copies into the same buffers — the values always the current ones."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from nemo_hacpo.training.memory import TrainStateOffload


def _adam():
    weight = torch.nn.Parameter(torch.arange(6, dtype=torch.float32))
    adam = torch.optim.Adam([weight], lr=0.1)
    model = SimpleNamespace(parameters=lambda: [weight], buffers=[])

    def step() -> None:
        adam.zero_grad()
        (weight**2).sum().backward()
        adam.step()

    step()  # Adam's state exists from the first step on
    return SimpleNamespace(optimizer=adam), model, step


@pytest.mark.parametrize("keep_host", [True, False])
def test_the_host_arena_is_kept_and_reused_only_with_keep_host(keep_host: bool) -> None:
    optimizer, model, step = _adam()
    memory = TrainStateOffload(optimizer, [model], keep_host=keep_host)
    state_bytes = sum(t.numel() * t.element_size() for t in memory.state_tensors())
    assert state_bytes == 2 * 6 * 4  # Adam's m and v of 6 fp32 weights (the scalar step stays)

    memory.offload()
    assert memory.host_bytes() == state_bytes and memory.device_bytes() == 0
    arena = {key: host.data_ptr() for key, host in memory._host.items()}
    memory.restore()
    assert memory.host_bytes() == (state_bytes if keep_host else 0)

    step()  # the state moves on; the next offload must carry the new values, not the arena's old ones
    expected = [t.clone() for t in memory.state_tensors()]
    memory.offload()
    if keep_host:  # the same buffers (without, new ones: the allocator may or may not hand back the same address)
        assert {key: host.data_ptr() for key, host in memory._host.items()} == arena
    memory.restore()
    assert all(torch.equal(a, b) for a, b in zip(expected, memory.state_tensors(), strict=True))


def test_keep_host_defaults_to_cuda_where_copies_are_pinned() -> None:
    optimizer, model, _ = _adam()
    assert TrainStateOffload(optimizer, [model]).keep_host is torch.cuda.is_available()


def test_a_state_recreated_after_the_first_offload_drops_the_old_buffers() -> None:
    """A checkpoint load rebuilds the optimizer's state tensors: the arena then holds the new state's buffers only,
    not those of tensors that no longer exist as well (which would pin twice the state on the host for good)."""
    optimizer, model, step = _adam()
    memory = TrainStateOffload(optimizer, [model], keep_host=True)
    state_bytes = sum(t.numel() * t.element_size() for t in memory.state_tensors())
    memory.offload()
    memory.restore()
    adam = optimizer.optimizer
    before = adam.state_dict()  # held, so that no new tensor can take an old one's id
    adam.load_state_dict(copy.deepcopy(before))  # new state tensors, as a checkpoint load makes
    assert not {id(t) for t in memory.state_tensors()} & {id(t) for t in before["state"][0].values()}
    step()
    memory.offload()
    assert memory.host_bytes() == state_bytes and len(memory._host) == 2
    memory.restore()
    assert memory.host_bytes() == state_bytes

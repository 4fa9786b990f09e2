"""Engine placement and batch splitting across an agent's vLLM engines (hand-computed layouts)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nemo_hacpo.rollout.sampling import request_seeds
from nemo_hacpo.runtime.placement import engine_layout, split_batch


def test_pair_large_layouts():
    # llama70b: 32 ranks on 4 nodes of 8 GPUs, vLLM TP 8 → 4 engines, one per node
    hosts = [f"n{r // 8}" for r in range(32)]
    gpus = [r % 8 for r in range(32)]
    layout = engine_layout(hosts, gpus, 8, "cuda")
    assert list(layout) == [0, 8, 16, 24] and layout[16] == list(range(8))
    # qwen8b: 8 ranks on one node, vLLM TP 2 → engines on ranks 0, 2, 4, 6 over GPU pairs
    assert engine_layout(["n4"] * 8, list(range(8)), 2, "cuda") == {0: [0, 1], 2: [2, 3], 4: [4, 5], 6: [6, 7]}
    # CPU: one engine on rank 0 whatever the layout
    assert engine_layout(["h"] * 4, [None] * 4, 2, "cpu") == {0: []}


def test_layout_errors_name_the_problem():
    with pytest.raises(ValueError, match="must divide the agent's 6 trainer ranks"):
        engine_layout(["n"] * 6, list(range(6)), 4, "cuda")
    with pytest.raises(ValueError, match=r"ranks 4..7 spans nodes \['a', 'b'\]"):
        engine_layout(["a"] * 6 + ["b"] * 2, [0, 1, 2, 3, 4, 5, 0, 1], 4, "cuda")


def test_split_batch_hand_cases():
    assert split_batch(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert split_batch(2, 4) == [(0, 1), (1, 2)]
    assert split_batch(8, 1) == [(0, 8)]
    with pytest.raises(ValueError):
        split_batch(3, 0)


@given(st.integers(0, 50), st.integers(1, 9), st.integers(1, 8), st.integers(0, 10_000))
def test_split_batch_covers_in_order_and_keeps_every_request_seed(num_prompts, engines, n, base):
    slices = split_batch(num_prompts, engines)
    assert [i for a, b in slices for i in range(a, b)] == list(range(num_prompts))
    assert all(b > a for a, b in slices) and len(slices) <= engines
    sizes = [b - a for a, b in slices]
    assert not sizes or max(sizes) - min(sizes) <= 1
    # slice (a, b) generated with base seed base + a·n gives each request the seed of one big call
    pieced = [s for a, b in slices for s in request_seeds(base + a * n, b - a, n)]
    assert pieced == request_seeds(base, num_prompts, n)


def test_cpu_engines_share_the_cores_of_their_own_node():
    """Issue #41: the engines' CPU shares were counted over the run's agents, not over the engines of a node: an
    agent alone on its node got a third of its cores in a three-agent run across three nodes."""
    from nemo_hacpo.runtime.groups import engine_cpu_slots

    assert engine_cpu_slots(["n1", "n1"]) == [(0, 2), (1, 2)]  # one node: as before
    assert engine_cpu_slots(["n1", "n2", "n3"]) == [(0, 1), (0, 1), (0, 1)]  # each alone: the node's every core
    assert engine_cpu_slots(["n1", "n2", "n1"]) == [(0, 2), (0, 1), (1, 2)]

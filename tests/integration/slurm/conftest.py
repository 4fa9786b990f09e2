"""The Slurm tests' one local cluster and their one uninterrupted job, started once for both modules.

Both modules are one unit of work (`UNITS` in tests/conftest.py: one pytest-xdist worker runs them), so the cluster
(`scripts/slurm_local.sh start <dir> 4`: four network-namespace nodes) starts once per session and every job of
test_multinode.py and test_sbatch_job.py runs on it, and the tiny pair's uninterrupted 2-node job is run once: the
2-node test checks it, and the node-failure and the requeue tests compare their resumed runs with it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.slurm.cluster import TINY_OVERRIDES, Job, local_cluster, sbatch

NODES = 4
"""The cluster's nodes: enough for trio_tiny with one agent at dp = 2, one rank per node."""


@pytest.fixture(scope="session")
def cluster() -> Iterator[dict[str, str]]:
    """The session's local Slurm cluster of `NODES` namespace nodes; jobs ask for as many of them as they need."""
    with local_cluster(NODES) as env:
        yield env


@pytest.fixture(scope="session")
def two_node_job(cluster, tmp_path_factory) -> Job:
    """The tiny pair's 2-step job on two nodes (`TINY_OVERRIDES`), uninterrupted, run once: checked by
    test_two_nodes_one_agent_each, the reference of the node-failure and the SIGUSR1-requeue tests (so neither
    needs another test to run before it)."""
    out = tmp_path_factory.mktemp("two_nodes") / "run"
    return sbatch(cluster, out, nodes=2, ray_cpus=1, overrides=TINY_OVERRIDES, wait=True, tag="two")

"""Suite-wide settings: offline hubs, quiet tokenizers, the `gpu` marker's skip without CUDA, and how the tests
are shared out and ordered.

Sharing. `make test` runs the suite on two pytest-xdist workers (`--dist loadgroup`; `TEST_WORKERS=0`: in one
process); the scheduler below (`pytest_xdist_make_scheduler`) makes a unit of work of each entry of `UNITS` — the
Slurm modules (one local cluster and one reference job for both), the modules whose tests read the session's
uninterrupted run (made once) — and of every other module (its module- and class-scoped fixtures, engines and live
runs, start once). A unit runs whole on one worker. (xdist's own `xdist_group` mark does not group under pytest 9, whose node ids
it can no longer rewrite.)

Order. Under xdist the units are handed out heaviest first (the `UNITS`, then the modules with tests marked
`slow`), so that the last one to finish is short; in one process the collection order is kept.
`--shuffle=<seed>` first shuffles the modules and the tests inside each module: the suite must pass in any order
(docs/testing.md).

/dev/shm. After the run, the summary lists the vLLM shared-memory files that tests left and no process maps
(`tests/helpers/shm_watch.py`): none, or each with the test it appeared in.
"""

from __future__ import annotations

import os

# Nothing may download at run time: make any accidental hub access fail at once.
for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import json  # noqa: E402

import pytest  # noqa: E402

SHM_AT_START = pytest.StashKey[set]()
SHM_LEFT = pytest.StashKey[list]()
SHM_REPORTED = pytest.StashKey[set]()


def pytest_addoption(parser):
    parser.addoption("--shuffle", type=int, default=None, metavar="SEED",
                     help="run the modules, and the tests inside each module, in an order shuffled with SEED")


UNITS = {
    "tests/integration/runtime/test_train_loop.py": "uninterrupted",
    "tests/integration/runtime/test_preemption_and_lock.py": "uninterrupted",
    "tests/integration/runtime/test_resume_and_failures.py": "uninterrupted",
    "tests/integration/slurm/": "slurm",
}
"""Path prefix → unit of work for the tests that must share one worker; in this order (the heaviest first), the
first handed out. The Slurm modules share one local cluster and one uninterrupted job
(tests/integration/slurm/conftest.py), so they are one unit."""
UNINTERRUPTED_FIXTURES = ("uninterrupted_tiny_dir", "uninterrupted_tiny_run")


def unit_of_work(nodeid: str) -> str:
    """The unit of work of a test: its `UNITS` entry, else its module."""
    for prefix, unit in UNITS.items():
        if nodeid.startswith(prefix):
            return unit
    return nodeid.split("::", 1)[0]


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

    return ByUnit(config, log) if config.getvalue("dist") == "loadgroup" else None


def pytest_collection_modifyitems(config, items):
    seed = config.getoption("--shuffle")
    if seed is not None:
        import random

        rng = random.Random(seed)
        modules: dict[str, list] = {}
        for item in items:
            modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
        order = list(modules)
        rng.shuffle(order)
        for name in order:
            rng.shuffle(modules[name])
        items[:] = [item for name in order for item in modules[name]]
    first = list(dict.fromkeys(UNITS.values()))
    rank: dict[str, int] = {}
    for item in items:
        unit = unit_of_work(item.nodeid)
        if unit != "uninterrupted" and set(UNINTERRUPTED_FIXTURES) & set(getattr(item, "fixturenames", ())):
            raise pytest.UsageError(f"{item.nodeid} reads the session's uninterrupted run: add its module to UNITS "
                                    f"(tests/conftest.py) as 'uninterrupted', or a second worker makes that run again")
        own = first.index(unit) if unit in first else len(first) + ("slow" not in item.keywords)
        rank[unit] = min(rank.get(unit, own), own)
    if hasattr(config, "workerinput") or config.getvalue("dist") not in (None, "no"):  # xdist; else kept as is
        items.sort(key=lambda item: rank[unit_of_work(item.nodeid)])  # stable: the order inside a rank is kept

    _skip_gpu_tests(items)


def _skip_gpu_tests(items) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (runs on the GPU machine: tests/gpu/)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# ------------------------------------------------------------------------------------------------ /dev/shm
def pytest_configure(config):
    from tests.helpers.shm_watch import engine_files

    config.stash[SHM_AT_START] = engine_files()
    config.stash[SHM_LEFT] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    from tests.helpers.shm_watch import engine_files, left_behind

    before = engine_files()
    yield  # the test, and the teardown of the fixtures it was the last to use
    left = left_behind(before)
    if left:
        item.config.stash[SHM_LEFT].append([item.nodeid, left])


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # an xdist worker: the controller reports
        session.config.workeroutput["shm_left"] = json.dumps(session.config.stash[SHM_LEFT])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    reported = node.config.stash.setdefault(SHM_REPORTED, set())
    worker = getattr(node, "workerinput", {}).get("workerid", id(node))
    if worker in reported:  # on an interrupt xdist reports a worker down twice
        return
    reported.add(worker)
    node.config.stash[SHM_LEFT] += json.loads(getattr(node, "workeroutput", {}).get("shm_left", "[]"))


def pytest_terminal_summary(terminalreporter, config):
    from tests.helpers.shm_watch import describe, left_behind

    left = left_behind(config.stash[SHM_AT_START])
    if not left:
        terminalreporter.write_line("/dev/shm: no vLLM shared-memory file left by the tests")
        return
    terminalreporter.write_line(f"/dev/shm: {len(left)} vLLM shared-memory file(s) left by the tests, mapped by no "
                                f"process: {describe(left)}")
    for nodeid, names in config.stash[SHM_LEFT]:
        if still := [name for name in names if name in left]:  # not those something removed later on
            terminalreporter.write_line(f"  appeared in {nodeid}: {', '.join(still)}")

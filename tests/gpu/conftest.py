"""Every test under tests/gpu/ needs CUDA; they are skipped on CPU machines and CI.

Two kinds (docs/testing.md): tests that need only torch with CUDA and megatron-core (test_trainer_cuda.py: what a
bare GPU machine runs once the megatron-core wheel is installed), and tests marked `needs("transformer_engine")`
or `needs("vllm")`, skipped on a machine without that package, the skip naming what is missing.
"""

import importlib.util

import pytest


def _missing(modules) -> list[str]:
    return [name for name in modules if importlib.util.find_spec(name) is None]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/gpu/" not in str(item.fspath):
            continue
        item.add_marker(pytest.mark.gpu)
        for marker in item.iter_markers("needs"):
            missing = _missing(marker.args)
            if missing:
                item.add_marker(pytest.mark.skip(reason=f"needs {' and '.join(missing)} (not installed here); the "
                                                        "CUDA-only tests are tests/gpu/test_trainer_cuda.py"))

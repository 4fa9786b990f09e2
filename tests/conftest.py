"""Suite-wide settings: offline hubs, quiet tokenizers, and the `gpu` marker's skip without CUDA."""

from __future__ import annotations

import os

# Nothing may download at run time: make any accidental hub access fail at once.
for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (runs on the GPU machine: tests/gpu/)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

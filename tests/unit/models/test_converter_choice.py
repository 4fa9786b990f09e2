"""Which HF↔Megatron converter runs is chosen, never found: Megatron-Bridge only when asked for by name."""

from __future__ import annotations

import inspect
import sys
import types
from types import SimpleNamespace

import pytest

from nemo_hacpo.models import hf_conversion
from nemo_hacpo.models.hf_conversion import _bridge_or_none

LLAMA = SimpleNamespace(family="llama")


class _NoCallBridge:
    """A stand-in `megatron.bridge.AutoBridge` that supports Llama; any conversion through it fails the test."""

    @staticmethod
    def list_supported_models() -> list[str]:
        return ["LlamaForCausalLM"]

    def __getattr__(self, name):  # pragma: no cover - reached only if the bridge were used
        raise AssertionError(f"AutoBridge.{name} used")


@pytest.fixture()
def bridge_installed(monkeypatch):
    """`megatron.bridge` importable, as in NeMo container images."""
    module = types.ModuleType("megatron.bridge")
    module.AutoBridge = _NoCallBridge
    monkeypatch.setitem(sys.modules, "megatron.bridge", module)
    return module


def test_the_builtin_converter_runs_even_where_megatron_bridge_imports(bridge_installed):
    assert _bridge_or_none("builtin", LLAMA) is None
    for function in (hf_conversion.load_hf_into_megatron, hf_conversion.export_hf_weights,
                     hf_conversion.save_hf_checkpoint):
        assert inspect.signature(function).parameters["converter"].default == "builtin", function.__name__


def test_bridge_by_name_or_a_clear_error(bridge_installed, monkeypatch):
    assert _bridge_or_none("bridge", LLAMA) is _NoCallBridge
    with pytest.raises(ValueError, match="no bridge for 'gpt2'"):
        _bridge_or_none("bridge", SimpleNamespace(family="gpt2"))
    with pytest.raises(ValueError, match="'builtin' or 'bridge', not 'auto'"):
        _bridge_or_none("auto", LLAMA)
    monkeypatch.setitem(sys.modules, "megatron.bridge", None)  # not installed: the import fails
    with pytest.raises(ImportError, match="needs Megatron-Bridge"):
        _bridge_or_none("bridge", LLAMA)

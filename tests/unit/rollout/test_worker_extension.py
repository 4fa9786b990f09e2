"""Tied parameters as the refit worker sees them: every later name of a shared `nn.Parameter` is an alias of
the first name `named_parameters()` keeps (vLLM's tied `lm_head.weight` → the input embedding)."""

from __future__ import annotations

import logging

import torch

from nemo_hacpo.rollout.worker_extension import BufferOnlyLayerWarnings, tied_parameter_aliases


class _TinyLM(torch.nn.Module):
    """embedding [V=5, H=3] → one linear block → output head [V, H] (optionally the embedding itself)."""

    def __init__(self, tied: bool):
        super().__init__()
        self.transformer = torch.nn.Module()
        self.transformer.wte = torch.nn.Embedding(5, 3)
        self.transformer.h = torch.nn.Linear(3, 3)
        self.lm_head = torch.nn.Linear(3, 5, bias=False)
        if tied:
            self.lm_head.weight = self.transformer.wte.weight


def test_a_tied_output_head_is_an_alias_of_the_embedding():
    assert tied_parameter_aliases(_TinyLM(tied=True)) == {"lm_head.weight": "transformer.wte.weight"}


def test_untied_parameters_have_no_aliases():
    assert tied_parameter_aliases(_TinyLM(tied=False)) == {}


def test_a_parameter_shared_three_ways_has_two_aliases_of_the_first_name():
    model = _TinyLM(tied=True)
    model.extra_head = torch.nn.Linear(3, 5, bias=False)
    model.extra_head.weight = model.transformer.wte.weight
    aliases = tied_parameter_aliases(model)
    assert aliases == {"lm_head.weight": "transformer.wte.weight", "extra_head.weight": "transformer.wte.weight"}
    # the canonical names are exactly what the deduplicated listing (the old completeness check) saw
    assert set(dict(model.named_parameters())) == {n for n, _ in model.named_parameters(remove_duplicate=False)
                                                   } - set(aliases)


class RotaryEmbedding(torch.nn.Module):
    """Like vLLM's: a cos/sin cache buffer and no parameters (an HF checkpoint never carries it)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cos_sin_cache", torch.ones(4, 2))


def _vllm_warning(layer: str) -> logging.LogRecord:
    """The record vLLM's finalize_layerwise_reload logs for a layer whose reloadable tensors got nothing."""
    return logging.LogRecord("vllm.model_executor.model_loader.reload.layerwise", logging.WARNING, __file__, 1,
                             "%s: Failed to load weights", (layer,), None)


def test_refit_warnings_are_dropped_only_for_layers_without_parameters(caplog):
    model = _TinyLM(tied=False)
    model.rotary = RotaryEmbedding()
    model.transformer.norm = torch.nn.BatchNorm1d(3)  # parameters *and* buffers: keeps its warning
    quiet = BufferOnlyLayerWarnings(model)
    assert quiet.buffer_only == {"RotaryEmbedding"}
    assert not quiet.filter(_vllm_warning("RotaryEmbedding"))
    for layer in ("ParallelLMHead", "Linear", "BatchNorm1d", "Embedding"):
        assert quiet.filter(_vllm_warning(layer)), layer
    other = logging.LogRecord("x", logging.WARNING, __file__, 1, "%s: something else", ("RotaryEmbedding",), None)
    assert quiet.filter(other)

    logger = logging.getLogger("test.refit.layerwise")
    logger.addFilter(quiet)
    with caplog.at_level(logging.WARNING, logger="test.refit.layerwise"):
        logger.warning("%s: Failed to load weights", "RotaryEmbedding")
        logger.warning("%s: Failed to load weights", "ParallelLMHead")
    assert [r.getMessage() for r in caplog.records] == ["ParallelLMHead: Failed to load weights"]

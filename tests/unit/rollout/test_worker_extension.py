"""Tied parameters as the refit worker sees them: every later name of a shared `nn.Parameter` is an alias of
the first name `named_parameters()` keeps (vLLM's tied `lm_head.weight` → the input embedding)."""

from __future__ import annotations

import torch

from nemo_hacpo.rollout.worker_extension import tied_parameter_aliases


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

"""McNemar's exact test, hand-computed."""

from __future__ import annotations

import pytest

from nemo_hacpo.eval.paired import mcnemar_exact


def test_hand_computed_p_values():
    # b = 10 gained, c = 2 lost (and 5 right / 3 wrong both times): 2·(1 + 12 + 66)/4096 = 0.0385742
    before = [0] * 10 + [1] * 2 + [1] * 5 + [0] * 3
    after = [1] * 10 + [0] * 2 + [1] * 5 + [0] * 3
    result = mcnemar_exact(before, after)
    assert (result.gained, result.lost) == (10, 2) and result.p_value == pytest.approx(158 / 4096, rel=1e-12)
    assert result.improved
    # b = 3, c = 1: 2·(1 + 4)/16 = 0.625: not significant; reversed it is a loss, same p
    small = mcnemar_exact([0, 0, 0, 1], [1, 1, 1, 0])
    assert small.p_value == pytest.approx(0.625) and not small.improved
    assert mcnemar_exact([1, 1, 1, 0], [0, 0, 0, 1]).p_value == pytest.approx(0.625)
    # balanced: b = c = 2 → 2·P[Bin(4) ≤ 2] = 2·11/16 > 1 → capped at 1
    assert mcnemar_exact([0, 0, 1, 1], [1, 1, 0, 0]).p_value == 1.0
    assert mcnemar_exact([1, 0], [1, 0]).p_value == 1.0  # no discordant problem


def test_a_loss_is_never_an_improvement_and_lengths_must_match():
    assert not mcnemar_exact([1] * 12 + [0] * 2, [0] * 12 + [1] * 2).improved
    with pytest.raises(ValueError, match="same problems"):
        mcnemar_exact([1, 0], [1])

"""A reward function of your own (docs/own-models-and-data.md, "A reward and prompt of your own").

    reward.function=examples/own_task/reward.py:last_number_matches

Correct when the last number in the response equals the gold number: a task whose prompt asks for a plain
"The answer is 42." instead of math-verify's `\\boxed{}`. A gold that is not a number raises ValueError, which
scores that answer 0 and is logged once (the run goes on).
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number_matches(response: str, gold: str) -> bool:
    """Whether the response's last number (thousands separators ignored) equals `gold`."""
    target = float(gold)  # first: a gold that is not a number is an error whatever the response
    numbers = _NUMBER.findall(response.replace(",", ""))
    return bool(numbers) and float(numbers[-1]) == target

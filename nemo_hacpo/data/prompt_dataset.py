"""An endless, seeded, resumable stream of training prompts.

Epoch ``e`` visits every problem once, in the order of a permutation drawn from
``random.Random(sha256("prompt-dataset", seed, e))``; batches run across epoch boundaries (the stream
never drops or repeats a problem within an epoch). The whole position is two integers, ``(epoch,
position)``, so a checkpoint resumes exactly where the run stopped.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any

from nemo_hacpo.data.arithmetic import derive_seed
from nemo_hacpo.data.problem import MathProblem


def _fingerprint(problems: Sequence[MathProblem]) -> str:
    """SHA-256 over the problem ids: detects resuming on a different data set."""
    digest = hashlib.sha256()
    for problem in problems:
        digest.update(problem.id.encode("utf-8") + b"\0")
    return digest.hexdigest()[:16]


class PromptDataset:
    """Batches of problems, shuffled per epoch, with ``state_dict``/``load_state_dict``.

    Args:
        problems: the data set (not copied; must not change while iterating).
        seed: shuffling seed.
        shuffle: ``False`` visits problems in their given order every epoch.
    """

    def __init__(self, problems: Sequence[MathProblem], *, seed: int = 0, shuffle: bool = True) -> None:
        if len(problems) == 0:
            raise ValueError("PromptDataset needs at least one problem")
        self.problems = problems
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0  # index into the current epoch's order of the next problem to serve
        self._fingerprint = _fingerprint(problems)
        self._order_epoch = -1
        self._order: list[int] = []

    def __len__(self) -> int:
        return len(self.problems)

    def epoch_order(self, epoch: int) -> list[int]:
        """The visiting order of ``epoch``: a permutation of ``range(len(self))``."""
        order = list(range(len(self.problems)))
        if self.shuffle:
            random.Random(derive_seed("prompt-dataset", self.seed, epoch)).shuffle(order)
        return order

    def _current_order(self) -> list[int]:
        if self._order_epoch != self.epoch:
            self._order, self._order_epoch = self.epoch_order(self.epoch), self.epoch
        return self._order

    def next_batch(self, batch_size: int) -> list[MathProblem]:
        """The next ``batch_size`` problems; continues into the next epoch when this one runs out."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        batch: list[MathProblem] = []
        while len(batch) < batch_size:
            order = self._current_order()
            take = min(batch_size - len(batch), len(order) - self.position)
            batch += [self.problems[index] for index in order[self.position : self.position + take]]
            self.position += take
            if self.position == len(order):
                self.epoch, self.position = self.epoch + 1, 0
        return batch

    def state_dict(self) -> dict[str, Any]:
        """``{"seed", "shuffle", "epoch", "position", "num_problems", "fingerprint"}`` (plain ints/strs)."""
        return {
            "seed": self.seed,
            "shuffle": self.shuffle,
            "epoch": self.epoch,
            "position": self.position,
            "num_problems": len(self.problems),
            "fingerprint": self._fingerprint,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; refuses a state taken on other data or another seed."""
        expected = {"seed": self.seed, "shuffle": self.shuffle, "num_problems": len(self.problems),
                    "fingerprint": self._fingerprint}
        mismatched = {key: (state.get(key), value) for key, value in expected.items() if state.get(key) != value}
        if mismatched:
            raise ValueError(f"PromptDataset state does not match this data set (saved, current): {mismatched}")
        if not 0 <= state["position"] < len(self.problems) or state["epoch"] < 0:
            raise ValueError(f"invalid PromptDataset position: epoch {state['epoch']}, position {state['position']}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

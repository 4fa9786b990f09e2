"""A reward worker's start (nemo_hacpo/rewards/worker.py): its memory limit counts from what it holds once started,
and a worker that cannot verify a known answer says why and the pool stops naming it, instead of scoring every
answer 0.

Found on the NeMo 26.06 versions (a CUDA build of torch): `nemo_hacpo.config`, which the driver's main module
imports and so every spawned worker too, imports torch, whose CUDA build maps ~3.2 GB; under the former absolute
2048 MB limit math-verify's lazy imports then failed inside it, silently — every LaTeX answer scored 0 ("math-verify
extracted nothing").
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from nemo_hacpo.rewards.math import VerifyLimits
from nemo_hacpo.rewards.scorer import MathRewardScorer, RewardPoolError
from nemo_hacpo.rewards.worker import WorkerSettings, start_up

BROKEN = VerifyLimits(max_expression_nodes=0)
"""Limits under which the known answer cannot be verified (its gold is refused as too large), by construction."""


def test_the_limit_is_what_the_process_holds_plus_the_setting():
    """In a fresh interpreter that maps 3 GiB first (calloc'd, untouched): a 2048 MB limit leaves it 2048 MB more,
    where an absolute limit would have left it nothing."""
    code = ("import resource; _big = bytes(3 << 30)\n"
            "from nemo_hacpo.rewards.worker import address_space_bytes, limit_address_space\n"
            "before = address_space_bytes(); limit = limit_address_space(2048)\n"
            "assert resource.getrlimit(resource.RLIMIT_AS)[0] == limit\n"
            "print(before >> 20, (limit - before) >> 20)\n"
            "extra = bytes(1 << 30)  # 1 GiB more fits\n"
            "try:\n    bytes(3 << 30)\nexcept MemoryError:\n    print('refused')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    before_mb, added_mb, refused = done.stdout.split()
    assert int(before_mb) > 3072 and 2047 <= int(added_mb) <= 2048 and refused == "refused"


def test_a_worker_that_cannot_verify_the_known_answer_says_why():
    assert start_up(WorkerSettings(VerifyLimits(), 5.0, 2048)) == (None, None)
    function, why = start_up(WorkerSettings(BROKEN, 5.0, None))
    assert function is None and why == ("math-verify scored the known answer \\frac{1}{2} = 0.5 as invalid_gold "
                                        "(gold too large: more than 0 expression nodes)")
    _, why = start_up(WorkerSettings(BROKEN, 5.0, 2048))  # with a limit, the likely cause is named too
    assert why.endswith("; it may have needed more than the 2048 MB of address space a reward process may add to "
                        "its start: raise reward.worker_memory_mb, or set it to null")


def test_the_pool_stops_naming_the_cause_instead_of_scoring_zeros():
    with pytest.raises(RewardPoolError, match=r"reward workers keep failing to start \(math-verify scored the known "
                                              r"answer .* as invalid_gold"), \
            MathRewardScorer(num_workers=1, limits=BROKEN, startup_timeout_s=60) as scorer:
        scorer.wait_until_ready(timeout_s=120)  # (`score` would refuse these golds in the driver first)

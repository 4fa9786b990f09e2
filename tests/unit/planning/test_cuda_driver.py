"""The start-up check of the NVIDIA driver the CUDA 13.0 container needs (issue #26 item 4): a pure decision on
hand-given versions, and the check that raises naming the key. Before it, a node with an older driver started
the job and failed in the first CUDA call of every worker, far from the cause."""

from __future__ import annotations

import pytest

from nemo_hacpo.config import ConfigError
from nemo_hacpo.planning.cuda_driver import check_cuda_driver, driver_verdict


@pytest.mark.parametrize(("kernel", "api", "ok", "warns"), [
    ("580.65.06", 13000, True, False),     # R580: CUDA 13.0 GA
    ("590.44.01", 13010, True, False),     # newer
    ("550.54.15", 13000, True, False),     # R550 + cuda-compat-13-0: libcuda says 13.0, that is what counts
    ("550.54.15", 12040, False, True),     # R550 alone: CUDA 12.4
    (None, 12080, False, True),            # libcuda readable, kernel version not
    ("580.82.07", None, True, False),      # no libcuda here (a driver node without GPUs visible): R580 is enough
    ("570.86.10", None, True, True),       # older kernel module, libcuda unreadable: compat may be there: warn
    (None, None, True, True),              # nothing readable: warn, do not refuse
])
def test_driver_verdict(kernel, api, ok, warns):
    verdict = driver_verdict(kernel, api)
    assert verdict.ok is ok and (verdict.message is not None) is warns


def test_a_refusal_says_what_the_driver_supports_and_what_is_needed():
    verdict = driver_verdict("550.54.15", 12040)
    assert "driver 550.54.15 supports CUDA up to 12.4" in verdict.message
    assert "R580" in verdict.message and "580.65.06" in verdict.message and "cuda-compat-13-0" in verdict.message


def test_check_raises_naming_the_key_and_returns_warnings():
    with pytest.raises(ConfigError) as err:
        check_cuda_driver(lambda: ("535.183.01", 12020))
    assert err.value.issues[0].key == "runtime.cluster.device" and "CUDA up to 12.2" in str(err.value)
    assert check_cuda_driver(lambda: ("580.65.06", 13000)) is None
    assert "cannot read" in check_cuda_driver(lambda: (None, None))


def test_the_kernel_module_line_is_read_for_both_driver_flavours():
    from nemo_hacpo.planning.cuda_driver import kernel_module_version

    proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    open_module = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16)\n"
    assert kernel_module_version(proprietary) == "550.54.15"
    assert kernel_module_version(open_module) == "580.65.06"
    assert kernel_module_version("GCC version: gcc 12") is None

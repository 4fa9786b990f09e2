"""The NVIDIA driver the container needs, checked at start-up on CUDA (skipped on CPU).

The `Dockerfile` builds on CUDA 13.0 (torch 2.13's PyPI wheel is a CUDA 13.0 build). A CUDA 13.0 runtime needs a
user-mode driver (`libcuda.so`) that supports CUDA 13.0: the R580 driver branch or newer (CUDA 13.0 GA release
notes: ≥ 580.65.06 on Linux), or, on a data-center GPU with an older driver, NVIDIA's forward-compatibility
package (`cuda-compat-13-0`, whose `libcuda.so` must come first on LD_LIBRARY_PATH). With anything older, torch
sees no GPU and vLLM and Megatron fail in their first CUDA call, far from the cause.

Two versions decide (`driver_verdict`, a pure function the tests call with hand-given versions):

- the CUDA version the loaded `libcuda.so` supports (`cuDriverGetVersion`, e.g. 12040 = 12.4, 13000 = 13.0) — what
  counts, since forward-compatibility libraries raise it: refused below 13000;
- the kernel module's version (`/proc/driver/nvidia/version`, else `nvidia-smi`), e.g. "550.54.15" — used when
  `libcuda.so` cannot be loaded here: below R580 it warns (the forward-compatibility package may still be there).
"""

from __future__ import annotations

import ctypes
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nemo_hacpo.config import ConfigError, ConfigIssue

REQUIRED_CUDA_API = 13000
"""cuDriverGetVersion's encoding of CUDA 13.0 (1000 · major + 10 · minor)."""
MIN_DRIVER_BRANCH = 580
"""The first driver branch with CUDA 13.0 (CUDA 13.0 GA: ≥ 580.65.06 on Linux)."""
REQUIREMENT = ("the container's CUDA 13.0 (torch 2.13, vLLM 0.32) needs NVIDIA driver R580 or newer (≥ 580.65.06), "
               "or on a data-center GPU the CUDA forward-compatibility package cuda-compat-13-0 with its libcuda.so "
               "first on LD_LIBRARY_PATH")


@dataclass(frozen=True)
class DriverVerdict:
    """`ok`: the run may start; `message`: why not, or a warning worth printing (None: nothing to say)."""

    ok: bool
    message: str | None


def _cuda(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def driver_verdict(kernel_version: str | None, cuda_api_version: int | None) -> DriverVerdict:
    """Decide from the kernel module's version ("550.54.15") and libcuda's CUDA version (12040); None = unknown.

    >>> driver_verdict("580.65.06", 13000).ok, driver_verdict("550.54.15", 12040).ok
    (True, False)
    """
    driver = f"driver {kernel_version}" if kernel_version else "the NVIDIA driver"
    if cuda_api_version is not None:
        if cuda_api_version >= REQUIRED_CUDA_API:
            return DriverVerdict(True, None)
        return DriverVerdict(False, f"{driver} supports CUDA up to {_cuda(cuda_api_version)}: {REQUIREMENT}")
    if kernel_version is not None:
        match = re.match(r"(\d+)\.", kernel_version)
        if match and int(match.group(1)) >= MIN_DRIVER_BRANCH:
            return DriverVerdict(True, None)
        return DriverVerdict(True, f"{driver} is older than R{MIN_DRIVER_BRANCH} and libcuda.so could not be asked "
                                   f"here; if CUDA calls fail with 'driver version is insufficient': {REQUIREMENT}")
    return DriverVerdict(True, f"cannot read the NVIDIA driver version on this node (no libcuda.so, no nvidia-smi): "
                               f"{REQUIREMENT}")


def kernel_module_version(proc_text: str) -> str | None:
    """The version in `/proc/driver/nvidia/version`'s first line (proprietary or open kernel module), else None."""
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", proc_text)
    return match.group(1) if match else None


def read_driver_versions() -> tuple[str | None, int | None]:
    """(kernel module version, libcuda's CUDA version) of this node; None for what cannot be read."""
    kernel = None
    proc = Path("/proc/driver/nvidia/version")
    if proc.is_file():
        kernel = kernel_module_version(proc.read_text())
    if kernel is None:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30, check=True).stdout.split()
            kernel = out[0] if out else None
        except (OSError, subprocess.SubprocessError):
            kernel = None
    api = None
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int()
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) == 0:
            api = version.value
    except OSError:
        api = None
    return kernel, api


def check_cuda_driver(read: Callable[[], tuple[str | None, int | None]] = read_driver_versions) -> str | None:
    """Start-up check on CUDA: raise `ConfigError` (key runtime.cluster.device) when the driver cannot run CUDA 13.0;
    return a warning to print when it cannot be told, else None."""
    verdict = driver_verdict(*read())
    if not verdict.ok:
        raise ConfigError([ConfigIssue("runtime.cluster.device", f"cuda: {verdict.message}",
                                       "update the NVIDIA driver to R580+, or install cuda-compat-13-0 in the "
                                       "container (data-center GPUs)")])
    return verdict.message

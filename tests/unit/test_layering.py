"""The package's shape: imports run strictly downward through the layers, and no module grows past ~600 lines.

Every `import nemo_hacpo.…` counts, also the ones inside functions (a lazy import is still a dependency).
The layers, bottom to top (a package may import any package of a lower layer, none of its own or a higher one):

    reporting                 numbers → tables and plots (no project imports)
    algo                      the maths, the algorithm registry, the row type
    config                    the typed config (asks algo.registry what an algorithm is)
    data, rewards             prompts; answer verification
    models                    architectures, tokenizers, chat rendering, HF ↔ Megatron conversion
    broker                    trajectories, re-encoding, every learner's rows
    training, rollout         the Megatron trainer; the vLLM engine
    eval                      evaluating a model through an engine
    planning                  the plan (memory per phase, host RAM), pre-flight checks: no Ray
    runtime                   Ray workers, the step loop, checkpoints, the warm start
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "nemo_hacpo"
LAYERS = (("reporting",), ("algo",), ("config",), ("data", "rewards"), ("models",), ("broker",),
          ("training", "rollout"), ("eval",), ("planning",), ("runtime",))
LAYER_OF = {name: level for level, names in enumerate(LAYERS) for name in names}
MAX_LINES = 600


def _unit(module: str) -> str:
    """`nemo_hacpo.runtime.loop` → `runtime`; the package itself → `nemo_hacpo`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import; use `from nemo_hacpo.… import …`")
    return {name for name in found if name == "nemo_hacpo" or name.startswith("nemo_hacpo.")}


def _edges() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        source = _unit(module)
        for imported in _imports(path):
            target = _unit(imported)
            if target != source:
                edges.setdefault((source, target), []).append(str(path.relative_to(ROOT)))
    return edges


def test_every_package_has_a_layer():
    units = {path.stem if path.is_file() else path.name for path in PACKAGE.iterdir()
             if (path.is_dir() and (path / "__init__.py").exists()) or (path.suffix == ".py" and path.stem != "__init__")}
    assert units == set(LAYER_OF), "a package or top-level module was added or removed: give it its layer here"


def test_imports_run_downward():
    upward = {f"{source} → {target}": files for (source, target), files in _edges().items()
              if target != "nemo_hacpo" and LAYER_OF[target] >= LAYER_OF[source]}
    assert not upward, f"imports that do not run to a lower layer: {upward}"


def test_planning_runs_without_ray():
    """`--plan` and the start-up checks are functions of the config and the architectures: nothing in planning/
    imports Ray (or the runtime, by the layers above), so a plan runs on a login node without a cluster."""
    for path in sorted((PACKAGE / "planning").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        assert not {n for n in names if n == "ray" or n.startswith("ray.")}, path


def test_reading_a_config_imports_no_torch():
    """`nemo_hacpo.config` (the CLI's start-up checks, and every spawned reward worker, whose parent's main module
    imports it) needs no torch: `nemo_hacpo.algo` loads its tensor modules on first use. Its exports still resolve
    to the functions of their modules."""
    import subprocess
    import sys

    code = ("import sys, nemo_hacpo.config, nemo_hacpo.rewards.scorer\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "import nemo_hacpo.algo as algo\n"
            "for name in algo.__all__:\n"
            "    value = getattr(algo, name)\n"
            "    home = sys.modules[algo._HOMES[name].join(('nemo_hacpo.algo.', ''))]\n"
            "    assert getattr(home, name) is value, name\n"
            "assert sorted(algo.__all__) == sorted(algo._HOMES) and set(algo._HOMES) <= set(dir(algo))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_check_sees_lazy_imports(tmp_path):
    module = tmp_path / "lazy.py"
    module.write_text("def f():\n    from nemo_hacpo.runtime.loop import train\n    import nemo_hacpo.eval\n")
    assert _imports(module) == {"nemo_hacpo.runtime.loop", "nemo_hacpo.eval"}


@pytest.mark.parametrize("folder", ["nemo_hacpo", "recipes", "benchmarks"])
def test_no_module_is_two_concerns(folder):
    long = {str(path.relative_to(ROOT)): n for path in (ROOT / folder).rglob("*.py")
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"

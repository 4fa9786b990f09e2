"""The configuration reference (docs/configuration.md), generated from the typed schema and the validation rules.

    python -m nemo_hacpo.config.reference > docs/configuration.md      # tests/unit/config/test_reference.py: in sync

Every key of `HacpoConfig` with its type, default and docstring (`schema.py`), and under it the start-up checks
that name the key (`ConfigIssue(key, problem, fix)` in `checks.py`, read from the source: an f-string's fields are
shown as `…`, a loop over a tuple of names is expanded). Checks whose key is computed elsewhere are listed at the end
with the function they are in.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from dataclasses import MISSING, Field, fields, is_dataclass
from typing import Any, get_type_hints

from nemo_hacpo.config import checks
from nemo_hacpo.config.schema import AgentConfig, HacpoConfig
from nemo_hacpo.config.typed import _type_name, field_docs

HEADER = """# Configuration reference

Generated from the typed schema (`nemo_hacpo/config/schema.py`) and the start-up checks
(`nemo_hacpo/config/checks.py`) by `python -m nemo_hacpo.config.reference > docs/configuration.md`; a test fails
when this page is stale. `recipes/train.py --describe` prints the same keys, `--cfg job` a config resolved with every
default. Overrides are Hydra's: `key=value`, list items by index (`agents.0.optimizer.lr=1e-5`), groups by name
(`algo=gspo`). An unknown key, a wrong type or a failed check stops the run at start-up, before anything is written,
naming the key and a fix (exit status 2).
"""


# ------------------------------------------------------------------------------------------------- keys
def _default(f: Field) -> Any:
    if f.default_factory is not MISSING:
        return f.default_factory()
    return f.default


def keys(cls: type = HacpoConfig, prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    """(key, type, default, doc) of every leaf and section, depth first in schema order; list items as `[]`."""
    docs, hints = field_docs(cls), get_type_hints(cls)
    for f in fields(cls):
        key, doc = f"{prefix}{f.name}", " ".join(docs.get(f.name, "").split())
        if cls is HacpoConfig and f.name == "agents":
            yield key, "list of agents", "required", doc
            yield from keys(AgentConfig, f"{key}[].")
            continue
        default = _default(f)
        if default is MISSING:
            yield key, _type_name(hints[f.name]), "required", doc
        elif is_dataclass(default):
            yield key, "section", "", doc
            yield from keys(type(default), f"{key}.")
        else:
            yield key, _type_name(hints[f.name]), repr(default), doc


# ----------------------------------------------------------------------------------------------- checks
def _text(node: ast.AST, names: dict[str, str]) -> str | None:
    """A string or f-string argument as text, its fields as `…` (or a loop variable's value); None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name):
                parts.append(names.get(value.value.id, "…"))
            else:
                parts.append("…")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left, names), _text(node.right, names)
        return None if left is None or right is None else left + right
    return None


def _loop_values(loop: ast.For) -> list[dict[str, str]] | None:
    """A loop over a literal tuple of strings (or of tuples of strings, unpacked): one binding of names per item."""
    if not isinstance(loop.iter, (ast.Tuple, ast.List)):
        return None
    bindings = []
    for item in loop.iter.elts:
        if isinstance(loop.target, ast.Name) and isinstance(item, ast.Constant) and isinstance(item.value, str):
            bindings.append({loop.target.id: item.value})
        elif isinstance(loop.target, ast.Tuple) and isinstance(item, ast.Tuple) and all(
                isinstance(t, ast.Name) for t in loop.target.elts) and len(item.elts) == len(loop.target.elts):
            bindings.append({t.id: v.value for t, v in zip(loop.target.elts, item.elts, strict=True)
                             if isinstance(v, ast.Constant) and isinstance(v.value, str)})
        else:
            return None
    return bindings


def _issues(node: ast.AST, names: dict[str, str], function: str) -> Iterator[tuple[str | None, str, str]]:
    """(key or None, problem, function) of every `ConfigIssue(...)` under `node`."""
    if isinstance(node, ast.For) and (bindings := _loop_values(node)) is not None:
        for bound in bindings:
            for child in node.body:
                yield from _issues(child, {**names, **bound}, function)
        return
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ConfigIssue" and len(node.args) >= 2:
        key, problem = _text(node.args[0], names), _text(node.args[1], names)
        yield key, " ".join((problem or "…").split()), function
    for child in ast.iter_child_nodes(node):
        yield from _issues(child, names, function)


def _key_prefixes(function: ast.FunctionDef) -> dict[str, str]:
    """`key = f"agents[{i}]"`-style assignments at the top of a check function (also one name of a tuple
    assignment): name → its text, `[…]` written `[]`."""
    prefixes = {}
    for statement in function.body:
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
            continue
        target, value = statement.targets[0], statement.value
        pairs = [(target, value)] if isinstance(target, ast.Name) else (
            list(zip(target.elts, value.elts, strict=False))
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) else [])
        for name, expr in pairs:
            text = _text(expr, {}) if isinstance(name, ast.Name) else None
            if text is not None and re.fullmatch(r"[a-z_.\[\]…]+", text):
                prefixes[name.id] = text.replace("[…]", "[]")
    return prefixes


def _key_arguments(tree: ast.Module) -> dict[str, list[str]]:
    """Functions whose first parameter is `key`: function name → the keys its callers pass there."""
    takes_key = {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.args.args
                 and f.args.args[0].arg == "key"}
    passed: dict[str, list[str]] = {}
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        name = getattr(call.func, "id", None)
        if name in takes_key and call.args and (text := _text(call.args[0], {})) is not None:
            passed.setdefault(name, []).append(text.replace("[…]", "[]"))
    return passed


def rules() -> list[tuple[str | None, str, str]]:
    """Every start-up check of `checks.py`: (key pattern or None, problem, function)."""
    tree = ast.parse(inspect.getsource(checks))
    key_arguments = _key_arguments(tree)
    found = []
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        prefixes = _key_prefixes(function)
        for binding in [{"key": key} for key in key_arguments.get(function.name, [])] or [{}]:
            for statement in function.body:
                for key, problem, name in _issues(statement, {**prefixes, **binding}, function.name):
                    found.append((None if key is None else key.replace("[…]", "[]"), problem, name))
    return list(dict.fromkeys(found))


# ---------------------------------------------------------------------------------------------- the page
def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    by_key: dict[str, list[str]] = {}
    loose: list[tuple[str, str]] = []
    all_keys = [key for key, *_ in keys()]
    for key, problem, function in rules():
        if key in all_keys:
            by_key.setdefault(key, []).append(problem)
        else:
            loose.append((f"`{key}`" if key else "(any key)", f"{problem} (`{function}`)"))
    lines = [HEADER]
    section = None
    for key, type_name, default, doc in keys():
        top = key.split(".", 1)[0].removesuffix("[]")
        if top != section:
            section = top
            lines += ["", f"## `{section}`", "", "| key | type | default | meaning | checked at start-up |",
                      "|---|---|---|---|---|"]
        checked = "<br>".join(_cell(p) for p in by_key.get(key, []))
        shown_type = "" if type_name == "section" else f"`{_cell(type_name)}`"
        shown_default = f"`{_cell(default)}`" if default not in ("", "required") else default
        lines.append(f"| `{key}` | {shown_type} | {shown_default} | {_cell(doc)} | {checked} |")
    if loose:
        lines += ["", "## Checks across keys", "",
                  "Checks that are not about one key of the schema:", "",
                  "| key | problem |", "|---|---|"]
        lines += [f"| {_cell(key)} | {_cell(problem)} |" for key, problem in loose]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")

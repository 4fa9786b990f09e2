"""Plain-data → frozen-dataclass conversion with errors that name the key.

`from_plain(cls, data, key="")` walks a (possibly nested) dataclass type and builds it from dicts and
lists, checking every value against the field's annotation. Unknown keys, wrong types and missing
required fields are collected as `ConfigIssue`s (key path + problem + fix) so that one start-up error can
list them all. Supported annotations: bool, int, float, str, `Literal[...]`, `X | None`, `tuple[X, ...]`,
`tuple[X, Y]`, `list[X]`/`tuple[Dataclass, ...]`, nested dataclasses.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, Union, get_args, get_origin


@dataclass(frozen=True)
class ConfigIssue:
    key: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.key}: {self.problem} — fix: {self.fix}"


class ConfigError(ValueError):
    """Raised at start-up for an invalid config; `issues` lists every problem found (key, problem, fix).

    `heading` names what is invalid (the config; `DataError`: the data); at most `shown` issues are printed, the
    count of the others after them."""

    heading = "invalid config"

    def __init__(self, issues: list[ConfigIssue], shown: int = 20):
        self.issues = list(issues)
        lines = "\n".join(f"  - {issue}" for issue in self.issues[:shown])
        more = f"\n  … and {len(self.issues) - shown} more" if len(self.issues) > shown else ""
        super().__init__(f"{self.heading} ({len(self.issues)} problem(s)):\n{lines}{more}")


_MISSING = object()


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def override_key(key: str) -> str:
    """How an override spells a key: `agents[0].model.path` → `agents.0.model.path` (Hydra's grammar rejects
    `agents[0].…=`). Issue keys keep the brackets; a fix that tells the user what to type uses this."""
    return re.sub(r"\[(\d+)\]", r".\1", key)


def _join(key: str, name: str | int) -> str:
    if isinstance(name, int):
        return f"{key}[{name}]"
    return f"{key}.{name}" if key else name


def from_plain(tp: Any, value: Any, key: str, issues: list[ConfigIssue]) -> Any:
    """Convert `value` to type `tp`; on a mismatch record an issue under `key` and return `_MISSING`."""
    origin = get_origin(tp)

    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            issues.append(ConfigIssue(key or "<root>", f"expected a mapping for {tp.__name__}, got {type(value).__name__}",
                                      "write it as a YAML mapping (key: value)"))
            return _MISSING
        return _dataclass_from_dict(tp, value, key, issues)

    if origin in (Union, types.UnionType):
        members = get_args(tp)
        if value is None:
            if type(None) in members:
                return None
            issues.append(ConfigIssue(key, "must not be null", f"set a value of type {_type_name(tp)}"))
            return _MISSING
        non_none = [m for m in members if m is not type(None)]
        for member in non_none:
            trial: list[ConfigIssue] = []
            out = from_plain(member, value, key, trial)
            if not trial:
                return out
        issues.append(ConfigIssue(key, f"got {value!r}, expected {_type_name(tp)}",
                                  f"use a value of type {_type_name(tp)}"))
        return _MISSING

    if origin is Literal:
        allowed = get_args(tp)
        if value in allowed and type(value) is type(allowed[0]):
            return value
        issues.append(ConfigIssue(key, f"got {value!r}, expected one of {list(allowed)}",
                                  f"choose one of {', '.join(repr(a) for a in allowed)}"))
        return _MISSING

    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            issues.append(ConfigIssue(key, f"expected a list, got {type(value).__name__} {value!r}",
                                      "write it as a YAML list"))
            return _MISSING
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                issues.append(ConfigIssue(key, f"expected {len(args)} items, got {len(value)}",
                                          f"give exactly {len(args)} values"))
                return _MISSING
            items = [from_plain(a, v, _join(key, i), issues) for i, (a, v) in enumerate(zip(args, value, strict=True))]
        else:
            item_tp = args[0] if args else Any
            items = [from_plain(item_tp, v, _join(key, i), issues) for i, v in enumerate(value)]
        return tuple(items)

    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:  # pragma: no cover - a programming error in the schema, not a user error
        raise TypeError(f"unsupported annotation {tp!r} at {key}")
    issues.append(ConfigIssue(key, f"got {value!r} ({type(value).__name__}), expected {tp.__name__}",
                              f"use a {tp.__name__} value"))
    return _MISSING


def _dataclass_from_dict(cls: type, data: dict, key: str, issues: list[ConfigIssue]) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for name in data:
        if name not in fields:
            close = [f for f in fields if f.startswith(str(name)[:3])]
            hint = f"did you mean {close[0]!r}? " if close else ""
            issues.append(ConfigIssue(_join(key, str(name)), f"unknown key for {cls.__name__}",
                                      f"{hint}valid keys: {', '.join(sorted(fields))}"))
    kwargs: dict[str, Any] = {}
    ok = True
    for name, field in fields.items():
        sub = _join(key, name)
        if name in data:
            out = from_plain(hints[name], data[name], sub, issues)
            if out is _MISSING:
                ok = False
            else:
                kwargs[name] = out
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            issues.append(ConfigIssue(sub, "required key is missing", f"pass {override_key(sub)}=..."))
            ok = False
    if not ok:
        return _MISSING
    return cls(**kwargs)


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string literal right after a field) of a dataclass, by field name."""
    source = textwrap.dedent(inspect.getsource(cls))
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for stmt, nxt in zip(body, body[1:], strict=False):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs

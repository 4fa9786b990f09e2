"""Composing a config with Hydra, loading a run's saved config, printing the schema.

    cfg = load_config("pair_tiny", ["algo=gspo", "agents.0.optimizer.lr=1e-4"])
"""

from __future__ import annotations

import os
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any

from nemo_hacpo.config.checks import validate
from nemo_hacpo.config.schema import AgentConfig, HacpoConfig
from nemo_hacpo.config.typed import ConfigError, ConfigIssue, field_docs, from_plain

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def dump_config(cfg: HacpoConfig) -> str:
    """The resolved config as YAML; `validate(yaml.safe_load(text))` gives `cfg` back."""
    import dataclasses

    import yaml

    def plain(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: plain(v) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return [plain(v) for v in node]
        return node

    return yaml.safe_dump(plain(dataclasses.asdict(cfg)), sort_keys=False, allow_unicode=True)


def load_run_config(path: str | Path, checks: bool = True) -> HacpoConfig:
    """The config a run saved (`<output_dir>/config.yaml`), validated again; `checks=False` reads its types only
    (no rule that looks at files or packages: what the run was made with, even if a model has moved since)."""
    import yaml

    path = Path(path)
    if path.is_dir():
        path = path / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no run config at {path.resolve()} (a training run writes <output_dir>/config.yaml)")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError([ConfigIssue(str(path), f"not readable YAML ({type(err).__name__})",
                                       "restore it, or start the run over")]) from err
    if not isinstance(raw, dict):
        raise ConfigError([ConfigIssue(str(path), "not a config mapping", "restore it, or start the run over")])
    if checks:
        return validate(raw)
    issues: list[ConfigIssue] = []
    cfg = from_plain(HacpoConfig, raw, "", issues)
    if issues:
        raise ConfigError(issues)
    return cfg


def compose(config_name: str = "pair_tiny", overrides: list[str] | tuple[str, ...] = (),
            conf_dir: str | os.PathLike | None = None):
    """Compose `conf/<config_name>.yaml` with Hydra overrides; returns the raw DictConfig.

    A `conf_dir` of one's own (`--config-dir`) is searched first and the shipped `conf/` after it, so that a config
    there can name the shipped groups (`algo: hacpo`, `task: arithmetic`) without copying them; a group or config
    of the same name in `conf_dir` takes precedence."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    conf_dir = Path(conf_dir or os.environ.get("NEMO_HACPO_CONF_DIR", CONF_DIR)).resolve()
    if not (conf_dir / f"{config_name}.yaml").is_file():
        available = sorted(p.stem for p in conf_dir.glob("*.yaml"))
        raise FileNotFoundError(f"no config {config_name!r} in {conf_dir}; available: {available}")
    overrides = _add_or_override(overrides, conf_dir)
    if conf_dir != CONF_DIR.resolve() and not any(o.split("=", 1)[0].lstrip("+") == "hydra.searchpath"
                                                  for o in overrides):
        overrides.append(f"hydra.searchpath=[{CONF_DIR.resolve().as_uri()}]")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=overrides)


def _add_or_override(overrides, conf_dir: Path) -> list[str]:
    """Let `key=value` set any schema key, also one the YAML leaves at its default.

    Hydra refuses to override a key that is absent from the composed YAML unless it is written `++key=value`.
    Our schema, not the YAML, decides which keys exist (`validate` rejects unknown ones by name), so plain
    value overrides are passed as `++`. Config-group choices (`algo=gspo`) and explicit `+`/`~` forms are kept.
    """
    groups = {p.name for directory in (conf_dir, CONF_DIR) for p in directory.iterdir() if p.is_dir()}
    out = []
    for item in overrides:
        key = item.split("=", 1)[0]
        if "=" not in item or key[:1] in "+~" or key.split("@", 1)[0] in groups or key.startswith("hydra."):
            out.append(item)
        else:
            out.append(f"++{item}")
    return out


def load_config(config_name: str = "pair_tiny", overrides: list[str] | tuple[str, ...] = (),
                conf_dir: str | os.PathLike | None = None) -> HacpoConfig:
    """Compose with Hydra and validate: the one way a run gets its config."""
    return validate(compose(config_name, overrides, conf_dir))


def describe(cls: type = HacpoConfig, prefix: str = "") -> list[str]:
    """One line per config key, `key = default — docstring`, for `recipes/train.py --describe`."""
    lines: list[str] = []
    docs = field_docs(cls)
    for f in fields(cls):
        key, doc = f"{prefix}{f.name}", docs.get(f.name, "")
        if f.name == "agents":
            lines.append(f"{key}[] — {doc}")
            lines.extend(describe(AgentConfig, f"{key}[]."))
            continue
        if f.default_factory is not MISSING:
            default = f.default_factory()
        elif f.default is not MISSING:
            default = f.default
        else:
            lines.append(f"{key} (required) — {doc}")
            continue
        if is_dataclass(default):
            lines.append(f"{key} — {doc}")
            lines.extend(describe(type(default), f"{key}."))
        else:
            lines.append(f"{key} = {default!r} — {doc}")
    return lines

"""The run record: `<output_dir>/config.yaml`, the config a run was made with.

`recipes/export_hf.py`, `recipes/evaluate.py --run` and a resumed run read it, so it must always describe the
checkpoints beside it:

- it is written once the start-up checks have passed, never before (a start that fails leaves it alone), and
  atomically (temporary file, fsync, rename: never a torn file, also on a full disk);
- a run that resumes compares the requested config with the record. A difference in what makes the checkpoints
  and the data position what they are (`IDENTITY`: the agents' names, models, tokenizers and lengths, the data,
  the warm start, the algorithm and its capability tracker, the seed) refuses the start, naming every key and
  both values; `runtime.allow_config_change=true` resumes anyway. Other differences (steps, learning rates,
  intervals, layouts, …) are logged and the record is rewritten with them;
- a run that starts over moves the record aside with the rest of the earlier run (`run_checkpoint`).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path
from typing import Any

from nemo_hacpo.config import ConfigError, ConfigIssue, HacpoConfig, dump_config, load_run_config
from nemo_hacpo.runtime.run_checkpoint import write_text_atomic

logger = logging.getLogger(__name__)

RECORD_FILE = "config.yaml"

IDENTITY = (
    r"agents\[\d+\]\.(name|model\..*|tokenizer\..*|max_prompt_length|max_response_length|warmstart\..*)",
    r"agents",  # the number of agents
    r"data\.(train|eval)\..*|data\.(system_prompt|shuffle_seed)",
    r"warmstart\.(enabled|steps|batch_size|lr|num_problems|seed|direct_answer_fraction|stop_early_fraction|"
    r"narrated_fraction)",
    r"algo\.(name|capability_window|ratio_min|ratio_max|capability_floor|capability_warmup_steps)",
    r"runtime\.seed",
)
"""Keys (as regular expressions over dotted names) a resumed run may not change without
`runtime.allow_config_change`: they decide what the checkpoints hold and which prompts come next."""

_IDENTITY = re.compile("|".join(f"(?:{pattern})" for pattern in IDENTITY))


def _flat(node: Any, key: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for name, value in node.items():
            out.update(_flat(value, f"{key}.{name}" if key else name))
        return out
    if isinstance(node, list | tuple) and key == "agents":
        out = {"agents": len(node)}
        for i, value in enumerate(node):
            out.update(_flat(value, f"agents[{i}]"))
        return out
    return {key: list(node) if isinstance(node, tuple) else node}


def differences(recorded: HacpoConfig, requested: HacpoConfig) -> dict[str, tuple[Any, Any]]:
    """`{dotted key: (recorded value, requested value)}` for every leaf that differs."""
    old, new = _flat(dataclasses.asdict(recorded)), _flat(dataclasses.asdict(requested))
    return {key: (old.get(key), new.get(key)) for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)}


def identity_changes(changed: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    """The differences a resumed run may not make (`IDENTITY`)."""
    return {key: values for key, values in changed.items() if _IDENTITY.fullmatch(key)}


def check_resume(out_dir: str | Path, cfg: HacpoConfig) -> dict[str, tuple[Any, Any]]:
    """Before resuming in `out_dir`: raise ConfigError naming every identity key the requested config changes
    (unless `runtime.allow_config_change`); return all the differences. A missing record is not an error (a run
    of an older version); an unreadable one is."""
    path = Path(out_dir) / RECORD_FILE
    if not path.is_file():
        logger.warning("%s has checkpoints but no run record (%s); resuming without comparing configs", out_dir,
                       RECORD_FILE)
        return {}
    try:
        recorded = load_run_config(path, checks=False)  # what it was made with, even if a model moved since
    except ConfigError as err:
        raise ConfigError([ConfigIssue("runtime.resume", f"the run record {path} is not a valid config: {err}",
                                       "fix or remove it, or start over with runtime.resume=false")]) from err
    changed = differences(recorded, cfg)
    blocking = identity_changes(changed)
    if blocking and not cfg.runtime.allow_config_change:
        raise ConfigError([ConfigIssue(key, f"the run in {out_dir} was made with {old!r}, this start asks for {new!r}",
                                       "resume with the recorded value, use another runtime.output_dir, start over "
                                       "with runtime.resume=false, or set runtime.allow_config_change=true")
                           for key, (old, new) in blocking.items()])
    return changed


def write_record(out_dir: str | Path, cfg: HacpoConfig) -> Path:
    """Write (or replace) the run record atomically."""
    return write_text_atomic(Path(out_dir) / RECORD_FILE, dump_config(cfg))

"""Run checkpoints: every agent's trainer state + the driver's (step, capability tracker, data position, totals).

    <output_dir>/checkpoints/step_000010/
        agents/<agent>/      trainer checkpoint (model, optimizer, scheduler, RNG; Megatron dist-checkpointing)
        driver.json          the driver's state
        manifest.json        every other file's size and content digest, written last

A checkpoint is written under `step_000010.tmp/` and renamed into place only when every agent, the driver state
and the manifest are on disk, so a crash mid-save leaves the previous checkpoint as the latest complete one.
Only folders named exactly `step_<digits>` are checkpoints. Before a run resumes, the newest checkpoint is
verified against its manifest (sizes, digests, a readable driver state); one that fails is moved aside as
`step_<digits>.corrupt-<time>` with the bad file named, and the previous one is tried — nothing is deleted.
A checkpoint written before checkpoints had a manifest is used when its driver state reads, with a warning.

Who hashes: the trainer rank that wrote a file, right after writing it, all ranks at once
(`training.checkpoint_files`); the records come back with the save's result and the driver writes them into the
manifest after checking, by listing the folder, that every file is accounted for and has the size its writer
recorded — it reads no shard. On resume the digests are checked by a pool of threads (`digest_files`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_hacpo.training.checkpoint_files import bytes_record, digest_algorithm, digest_files, file_record

logger = logging.getLogger(__name__)

DRIVER_FILE = "driver.json"
MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
STEP_DIR = re.compile(r"^step_(\d+)$")

RUN_ARTIFACTS = ("checkpoints", "metrics.jsonl", "tensorboard", "rollouts", "summary.md", "reward_curve.png",
                 "eval_accuracy.png", "cross_path.png", "hf", "eval", "engines", "config.yaml")
"""What a run writes into its output directory that belongs to that run (moved aside as a whole when a run
starts over). `logs/` is not among them: a launcher (the Slurm job) writes there before the run starts, and
the workers only ever append to their log files."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the checkpoint and the file."""


def _files(root: Path) -> Iterable[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)


def write_manifest(root: Path, algorithm: str | None, reported: dict[str, dict[str, Any]]) -> Path:
    """`root/manifest.json`: every file below `root` with the record its writer `reported` (relative name →
    `{"bytes"[, "digest"]}`, digests by `algorithm`; None: sizes only).

    The folder is listed, not read: a reported file that is missing, or whose size is not the one its writer
    recorded, is a CheckpointError; a file nobody reported is hashed here (and named in a warning) — the writers
    should have reported it."""
    present = {str(p.relative_to(root)): p for p in _files(root)}
    missing = sorted(set(reported) - set(present))
    if missing:
        raise CheckpointError(f"{root}: {', '.join(missing[:5])} reported by its writer but not on disk")
    files: dict[str, dict[str, Any]] = {}
    for name, path in present.items():
        size = path.stat().st_size
        if name in reported:
            if reported[name].get("bytes") != size:
                raise CheckpointError(f"{root / name}: {size} bytes on disk, its writer recorded "
                                      f"{reported[name].get('bytes')}")
            if algorithm and "digest" not in reported[name]:
                raise CheckpointError(f"{root / name}: its writer recorded no {algorithm} digest")
            files[name] = {"bytes": size, **({"digest": reported[name]["digest"]} if algorithm else {})}
        else:
            logger.warning("checkpoint file %s was not reported by the rank that wrote it; the driver hashes it",
                           root / name)
            files[name] = file_record(path, algorithm)
    manifest = {"version": MANIFEST_VERSION, "algorithm": algorithm, "files": files}
    return write_text_atomic(root / MANIFEST_FILE, json.dumps(manifest, indent=1))


def write_text_atomic(path: Path, text: str) -> Path:
    """Write `path` through a temporary file in the same folder, flushed to disk, then renamed over it: a reader
    sees the old file or the whole new one, never a torn one (also when the disk fills up mid-write)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


@dataclass(frozen=True)
class RunCheckpoint:
    path: Path

    @property
    def step(self) -> int:
        match = STEP_DIR.match(self.path.name)
        if match is None:
            raise ValueError(f"{self.path} is not a checkpoint folder (step_<digits>)")
        return int(match.group(1))

    def agent_dir(self, agent: str) -> Path:
        return self.path / "agents" / agent

    def load_driver_state(self) -> dict[str, Any]:
        """The driver's state; a CheckpointError naming the file when it is missing or unreadable."""
        path = self.path / DRIVER_FILE
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointError(f"{path}: the driver state is unreadable ({type(err).__name__}: {err})") from err
        if not isinstance(state, dict) or "step" not in state:
            raise CheckpointError(f"{path}: not a driver state (no 'step')")
        return state

    def problems(self, hashes: bool = True) -> list[str]:
        """What is wrong with this checkpoint ([] = it verifies): every file of the manifest present with its
        size (and with `hashes` its digest), no file the manifest does not list, a readable driver state."""
        manifest_path = self.path / MANIFEST_FILE
        if not manifest_path.is_file():
            # The folder is renamed into place after its manifest is written, so this is a checkpoint of a
            # version before manifests: usable when its driver state reads, but its shards cannot be checked.
            try:
                self.load_driver_state()
            except CheckpointError as err:
                return [str(err)]
            logger.warning("checkpoint %s has no %s (written before checkpoints had one): its files are not "
                           "verified", self.path, MANIFEST_FILE)
            return []
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            files, algorithm, version = manifest["files"], manifest["algorithm"], manifest["version"]
            if not isinstance(files, dict) or version != MANIFEST_VERSION:
                raise ValueError(f"version {version!r} with {type(files).__name__} files "
                                 f"(this version reads version {MANIFEST_VERSION})")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            return [f"{MANIFEST_FILE} is unreadable ({type(err).__name__}: {err})"]
        problems = []
        present = {str(p.relative_to(self.path)) for p in _files(self.path)}
        for name in sorted(set(files) - present):
            problems.append(f"{name} is missing")
        for name in sorted(present - set(files)):
            problems.append(f"{name} is not in the manifest")
        to_hash = []
        for name in sorted(set(files) & present):
            try:
                expected, path = files[name], self.path / name
                size = path.stat().st_size
                if size != expected["bytes"]:
                    problems.append(f"{name} has {size} bytes, the manifest says {expected['bytes']}")
                elif hashes and algorithm:
                    to_hash.append(name)
            except (OSError, KeyError, TypeError, AttributeError, ValueError) as err:
                problems.append(f"{name} cannot be checked ({type(err).__name__}: {err})")
        if to_hash:  # the digests, in parallel
            try:
                actual = digest_files(self.path, to_hash, algorithm)
            except (OSError, ValueError) as err:
                problems.append(f"the files cannot be hashed ({type(err).__name__}: {err})")
                actual = {}
            for name in sorted(actual):
                if actual[name].get("digest") != files[name].get("digest"):
                    problems.append(f"{name}: its content does not match the manifest's {algorithm} digest")
        if not problems:
            try:
                self.load_driver_state()
            except CheckpointError as err:
                problems.append(str(err))
        return problems


def checkpoints(out_dir: str | Path) -> list[RunCheckpoint]:
    """The `step_<digits>` folders (each renamed into place when its save finished), oldest first; not verified."""
    root = Path(out_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [RunCheckpoint(p) for p in root.iterdir() if p.is_dir() and STEP_DIR.match(p.name)]
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(out_dir: str | Path, *, hashes: bool = True, quarantine: bool = True) -> RunCheckpoint | None:
    """The newest checkpoint that verifies (`RunCheckpoint.problems`), or None.

    A newer one that fails is reported (the bad file named) and, with `quarantine`, renamed to
    `step_<digits>.corrupt-<time>` so it is neither tried again nor pruned as if it were a checkpoint.
    `hashes=False` checks sizes and the driver state only (fast, for messages on the way out of a failed run).
    """
    for candidate in reversed(checkpoints(out_dir)):
        problems = candidate.problems(hashes=hashes)
        if not problems:
            return candidate
        where = ""
        if quarantine:
            target = candidate.path.with_name(f"{candidate.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
            candidate.path.rename(target)
            where = f"; moved to {target.name}"
        logger.warning("checkpoint %s failed verification and is skipped: %s%s", candidate.path,
                       "; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""),
                       where)
    return None


def save_run_checkpoint(out_dir: str | Path, step: int, driver_state: dict[str, Any], groups, keep: int = 2,
                        hashes: bool = True) -> Path:
    """Collective over every agent's ranks; atomic; keeps the newest `keep` checkpoints (0: all of them), never
    pruning the one just written. `hashes`: content digests in the manifest (sizes only when False), computed by
    the ranks that write the files (module docstring)."""
    root = Path(out_dir) / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "agents").mkdir(parents=True)
    algorithm = digest_algorithm() if hashes else None
    pending = {name: group.save_checkpoint(str(tmp / "agents" / name), step, digest=algorithm)
               for name, group in groups.items()}
    reported: dict[str, dict[str, Any]] = {}
    for name, call in pending.items():  # every file as its writer recorded it
        reported.update({f"agents/{name}/{file}": record for file, record in (call.result() or {}).items()})
    driver_text = json.dumps(driver_state, indent=1)
    write_text_atomic(tmp / DRIVER_FILE, driver_text)
    reported[DRIVER_FILE] = bytes_record(driver_text.encode("utf-8"), algorithm)
    write_manifest(tmp, algorithm, reported)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    # keep-last-N among this run's steps: never the checkpoint just written, whatever else lies there
    earlier = [c for c in checkpoints(out_dir) if c.step < step]
    for old in earlier[:max(0, len(earlier) - (keep - 1))] if keep > 0 else []:
        shutil.rmtree(old.path, ignore_errors=True)
    return final


def archive_previous_run(out_dir: str | Path) -> Path | None:
    """Move an earlier run's artifacts (checkpoints, metrics, plots, rollouts, exports, its config record) aside.

    A run that starts over in an output directory that already holds one (`runtime.resume=false`, or a run that
    died before its first checkpoint) would otherwise append to its metrics and prune its checkpoints by step
    number. Nothing is deleted: they move to `<out_dir>/previous/<time>/`. Returns that folder, or None when
    there was nothing to move.
    """
    out = Path(out_dir)
    found = [out / name for name in RUN_ARTIFACTS if (out / name).exists()]
    if not found:
        return None
    target = out / "previous" / time.strftime("%Y%m%d-%H%M%S")
    suffix = 0
    while target.exists():
        suffix += 1
        target = target.with_name(f"{target.name.split('.')[0]}.{suffix}")
    target.mkdir(parents=True)
    for path in found:
        path.rename(target / path.name)
    return target

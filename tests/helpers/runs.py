"""Short training runs of the tiny pair (pair_tiny_gpt) for the resume, stop and lock tests: their overrides, a
driver started as a user starts it, and the comparison of a resumed run with an uninterrupted one.

    out = tmp_path / "run"
    proc = start_driver(out, 3, tmp_path / "run.log")        # python recipes/train.py … in its own session
    records_by_step(out)[2]["llama_tiny/reward_mean"]
    assert_same_metrics(records_by_step(out), uninterrupted, steps=(2, 3))
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from nemo_hacpo.runtime.run_checkpoint import checkpoints

REPO = Path(__file__).resolve().parents[2]
AGENTS = ("llama_tiny", "gpt_tiny")
COMPARED = ("reward_mean", "response_length_mean", "train/loss", "train/policy_loss", "train/grad_norm",
            "train/self_ratio_mean", "capability", "eval_accuracy")
"""Per agent, what a resumed run must reproduce of an uninterrupted one (eval_accuracy: where both evaluated)."""


SMALL_KV_GIB = 0.125
"""The tests' engines' KV cache (`rollout.cpu_kvcache_gib`): vLLM zero-fills the whole cache when an engine starts,
and the configs' 1 GiB (sized for their real batches) made that about 5 CPU-seconds per engine on the 2-core
machine, while a test's run holds a few hundred tokens at a time. Measured on a 3-step run of the tests' shape
(`tiny_overrides`, every process's CPU time): 79 CPU-seconds with 1 GiB, 68-70 with 0.125."""


def small_kv_cache(n_agents: int) -> list[str]:
    """`agents.<i>.rollout.cpu_kvcache_gib=SMALL_KV_GIB` for each of the first `n_agents` agents."""
    return [f"agents.{i}.rollout.cpu_kvcache_gib={SMALL_KV_GIB}" for i in range(n_agents)]


def tiny_overrides(out: Path, steps: int, *extra: str) -> list[str]:
    """B = 2, G = 2, 16-token responses, 2 updates, no warm start, a checkpoint every step, a small KV cache
    (`SMALL_KV_GIB`); an `extra` override replaces the default of its key (`runtime.checkpoint_interval=0`) or
    adds one."""
    defaults = [f"runtime.output_dir={out}", f"runtime.steps={steps}", "runtime.checkpoint_interval=1",
                "runtime.eval_interval=0", "runtime.logging=[jsonl]", "runtime.save_hf=false",
                "warmstart.enabled=false", "algo.batch_size=2", "algo.group_size=2", "algo.updates_per_step=2",
                "data.eval.size=2", "agents.0.max_response_length=16", "agents.1.max_response_length=16",
                "agents.0.parallel.micro_batch_size=2", "agents.1.parallel.micro_batch_size=2", "reward.num_workers=0",
                *small_kv_cache(2)]
    replaced = {item.split("=", 1)[0] for item in extra}
    return [item for item in defaults if item.split("=", 1)[0] not in replaced] + list(extra)


def start_driver(out: Path, steps: int, log: Path, *extra: str) -> subprocess.Popen:
    """`python recipes/train.py --config-name pair_tiny_gpt <tiny overrides>` in its own session (so that a test
    can kill it and everything it started), stderr to `log` (a file: nobody drains a pipe while it runs)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    with log.open("wb") as err:
        return subprocess.Popen([sys.executable, str(REPO / "recipes" / "train.py"), "--config-name", "pair_tiny_gpt",
                                 *tiny_overrides(out, steps, *extra)],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)


def records_by_step(out: Path) -> dict[int, dict]:
    """The last record of each step of `out/metrics.jsonl`."""
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines)}


def newest_step(out: Path) -> int:
    """The newest checkpoint's step, without verification (a run may be writing them right now); 0 for none."""
    found = checkpoints(out)
    return found[-1].step if found else 0


def assert_same_metrics(resumed: dict[int, dict], expected: dict[int, dict], steps: Iterable[int],
                        agents: Sequence[str] = AGENTS) -> None:
    """Every `COMPARED` metric of `steps` as in the uninterrupted run (rel 1e-5): present in one exactly when
    present in the other."""
    for step in steps:
        for agent in agents:
            for key in COMPARED:
                name = f"{agent}/{key}"
                assert (name in resumed[step]) == (name in expected[step]), (step, name)
                if name in expected[step]:
                    assert resumed[step][name] == pytest.approx(expected[step][name], rel=1e-5, abs=1e-6), (step, name)


def assert_prompts_as_drawn(out: Path, steps: Iterable[int], config: str = "pair_tiny_gpt") -> None:
    """Each step's rollouts (`out/rollouts/step_<n>.jsonl`) are of the prompts an uninterrupted run draws at that
    step (B = 2 per step, the data's shuffle seed): a resumed run picks the data order up where it stopped."""
    from nemo_hacpo.broker import read_jsonl
    from nemo_hacpo.config import load_config
    from nemo_hacpo.data import PromptDataset
    from nemo_hacpo.data.splits import load_split

    cfg = load_config(config, tiny_overrides(out, max(steps)))
    dataset = PromptDataset(load_split(cfg.data.train, "train"), seed=cfg.data.shuffle_seed)
    drawn = [[p.id for p in dataset.next_batch(cfg.algo.batch_size)] for _ in range(max(steps))]
    for step in steps:
        ids = {t.prompt_id for t in read_jsonl(out / "rollouts" / f"step_{step:06d}.jsonl")}
        assert ids == set(drawn[step - 1]), step

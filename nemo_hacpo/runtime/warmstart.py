"""Supervised warm start of tiny agents on generated worked solutions, cached on disk.

Random tiny models earn no reward, so RL would have nothing to learn from. Before the first RL step each
`model.source: tiny` agent is fine-tuned on worked solutions of generated training problems (the same
trainer, micro-batching and optimizer as RL, on the `nll` objective; see `AgentRank.sft`), then saved as an HF
checkpoint under
`warmstart.cache_dir/<agent>-<hash>`, where the hash covers everything that shapes the result (architecture,
tokenizer, chat template, lengths, warm-start settings, system prompt). Later runs reuse it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
import shutil
import time
from pathlib import Path
from typing import Any

from nemo_hacpo.config import AgentConfig, ArithmeticNumbers, HacpoConfig, WarmStartConfig
from nemo_hacpo.config.schema import DEFAULT_PROMPT_TEMPLATE
from nemo_hacpo.data.arithmetic import derive_seed, direct_answer, generate_problems, narrated, stopped_early
from nemo_hacpo.data.prompts import PromptFormat
from nemo_hacpo.models.chat import render_prompt_ids
from nemo_hacpo.reporting import format_duration

logger = logging.getLogger(__name__)
MARKER = "nemo_hacpo_warmstart.json"


def _tokenizer_fingerprint(agent: AgentConfig) -> str | None:
    """The cached directory name of a named tokenizer source: it carries the recipe fingerprint, so a
    retrained tiny tokenizer (another vocabulary) never reuses weights warm-started on the old one.
    Local directories and `model` are already named by their path in the key."""
    from nemo_hacpo.models.tokenizers import TOKENIZER_SOURCES, tokenizer_path

    source = agent.tokenizer.source
    return tokenizer_path(source).name if source in TOKENIZER_SOURCES else None


def encode_solutions(prompts: list[list[dict]], solutions: list[str], tokenizer: Any, chat_template: str | None,
                     max_response_length: int) -> list[tuple[list[int], list[int]]]:
    """`(token_ids, response_mask)` of each worked solution in one agent's format: the prompt rendered with its
    chat template, then the solution and its EOS (cut to `max_response_length` tokens), scored on the solution."""
    eos = tokenizer.eos_token_id
    rows = []
    for messages, solution in zip(prompts, solutions, strict=True):
        prompt = render_prompt_ids(messages, tokenizer, chat_template)
        response = (tokenizer(solution, add_special_tokens=False)["input_ids"] + [eos])[:max_response_length]
        rows.append((prompt + response, [0] * len(prompt) + [1] * len(response)))
    return rows


def warm_start_seed(agent: AgentConfig, cfg: HacpoConfig) -> int:
    """The seed of an agent's warm start (its random initialisation): fixed by its place in the config, not by
    which other agents happen to be cached already."""
    index = next(i for i, a in enumerate(cfg.agents) if a.name == agent.name)
    return cfg.warmstart.seed + 1000 * index


def agent_warm_start(agent: AgentConfig, cfg: HacpoConfig) -> WarmStartConfig:
    """The warm start of one agent: the run's `warmstart` with the agent's own overrides (`agents[i].warmstart`)."""
    overrides = {key: value for key, value in dataclasses.asdict(agent.warmstart).items() if value is not None}
    return dataclasses.replace(cfg.warmstart, **overrides)


def warm_start_key(agent: AgentConfig, cfg: HacpoConfig) -> str:
    optimizer = dataclasses.asdict(agent.optimizer)
    for unused in ("lr", "min_lr", "lr_warmup_steps", "lr_decay_style"):  # the warm start sets its own schedule
        optimizer.pop(unused)
    optimizer.pop("checkpoint_format")  # how a checkpoint is written does not shape the weights
    shaping = {"model": dataclasses.asdict(agent.model), "tokenizer": dataclasses.asdict(agent.tokenizer),
               "lengths": [agent.max_prompt_length, agent.max_response_length], "optimizer": optimizer,
               "warmstart": dataclasses.asdict(agent_warm_start(agent, cfg)),
               "system_prompt": PromptFormat.of(cfg.data, "train").system_prompt,
               "tokenizer_files": _tokenizer_fingerprint(agent), "init_seed": warm_start_seed(agent, cfg),
               "version": 2}  # 2: one-pass sft objective
    if (template := cfg.data.train.prompt_template) != DEFAULT_PROMPT_TEMPLATE:  # the default keeps its cached keys
        shaping["prompt_template"] = template
    levels, numbers = warm_start_task(cfg)
    if (tuple(levels), numbers) != ((1, 2, 3), ArithmeticNumbers()):  # the original task keeps its cached keys
        shaping["task"] = {"levels": list(levels), "numbers": dataclasses.asdict(numbers)}
    for unused in ("cache_dir", "progress_interval"):  # where it is kept and how it reports do not shape it
        shaping["warmstart"].pop(unused)
    for added in ("direct_answer_fraction", "stop_early_fraction", "narrated_fraction"):
        if not shaping["warmstart"][added]:  # added later: warm starts without them keep their cached keys
            shaping["warmstart"].pop(added)
    return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:12]


def warm_start_dir(agent: AgentConfig, cfg: HacpoConfig) -> Path:
    return Path(cfg.warmstart.cache_dir).expanduser() / f"{agent.name}-{warm_start_key(agent, cfg)}"


def ensure_warm_start(cfg: HacpoConfig) -> dict[str, str]:
    """`{agent: hf_dir}` of every tiny agent's warm-started checkpoint, training the missing ones (side by side,
    each with its own corpus and number of steps: `agent_warm_start`)."""
    todo, done = [], {}
    for agent in cfg.agents:
        if agent.model.source != "tiny":
            continue
        target = warm_start_dir(agent, cfg)
        if (target / MARKER).is_file():
            logger.info("warm start of %s: cached at %s", agent.name, target)
            done[agent.name] = str(target)
        else:
            todo.append((agent, target))
    if not todo:
        return done
    settings = [agent_warm_start(agent, cfg) for agent, _ in todo]
    corpora = [warm_start_corpus(cfg, agent) for agent, _ in todo]
    total = max(ws.steps for ws in settings)
    groups = []
    try:
        groups = _sft_groups(cfg, [agent for agent, _ in todo])
        start = time.perf_counter()
        steps = sorted({ws.steps for ws in settings})
        print(f"[warmstart] {len(groups)} agent(s), {' / '.join(map(str, steps))} steps × "
              f"{cfg.warmstart.batch_size} worked solutions each", flush=True)
        all_losses: list[list[float]] = [[] for _ in groups]
        chunk = max(1, min(cfg.warmstart.progress_interval, total))
        for first in range(0, total, chunk):
            pending = []
            for group, ws, corpus, losses in zip(groups, settings, corpora, all_losses, strict=True):
                n = min(chunk, ws.steps - first)
                if n > 0:
                    data = corpus if first == 0 else (None, None)
                    pending.append((group.sft(*data, n, ws.batch_size, ws.seed, first), losses))
            for call, losses in pending:
                losses.extend(call.result())
            done_steps = min(first + chunk, total)
            elapsed = time.perf_counter() - start
            rate = elapsed / done_steps
            nll = " | ".join(f"{agent.name} nll {_tail_mean(losses):.3f}"
                             for (agent, _), losses in zip(todo, all_losses, strict=True))
            print(f"[warmstart] step {done_steps}/{total} | {nll} | {rate:.2f} s/step | "
                  f"ETA {format_duration(rate * (total - done_steps))}", flush=True)
        for group, ws, losses, (agent, target) in zip(groups, settings, all_losses, todo, strict=True):
            tmp = target.with_name(target.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            group.save_hf(str(tmp)).result()
            (tmp / MARKER).write_text(json.dumps({"agent": agent.name, "steps": ws.steps, "losses": losses}))
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
            done[agent.name] = str(target)
            print(f"[warmstart] {agent.name}: loss {losses[0]:.3f} → {_tail_mean(losses):.3f} "
                  f"({time.perf_counter() - start:.0f} s) → {target}", flush=True)
    finally:
        for group in groups:
            group.shutdown()
    return done


def warm_start_task(cfg: HacpoConfig) -> tuple[tuple[int, ...], ArithmeticNumbers]:
    """The levels and number ranges the warm start's problems are drawn from: `data.train`'s when it is generated
    arithmetic (the agents learn the task they are trained on), else the generator's defaults."""
    train = cfg.data.train
    return (train.levels, train.numbers) if train.source == "arithmetic" else ((1, 2, 3), ArithmeticNumbers())


def warm_start_corpus(cfg: HacpoConfig, agent: AgentConfig | None = None) -> tuple[list, list[str]]:
    """`(prompts, solutions)` of an agent's warm start (`agent_warm_start`; None: the run's `warmstart`):
    `warmstart.num_problems` generated training problems, worked out except for two seeded shares of habits —
    `direct_answer_fraction` of all problems answered directly (`The answer is \\boxed{N}`), and
    `stop_early_fraction` of the problems with ≥ 2 operations stopped after the first one
    (`arithmetic.stopped_early`); a problem gets at most one of the two — and, independently of them, a seeded
    share `narrated_fraction` of the worked and stopped-early solutions written in the narrated style
    (`arithmetic.narrated`). The problems and the prompts are the same for every agent."""
    ws = cfg.warmstart if agent is None else agent_warm_start(agent, cfg)
    levels, numbers = warm_start_task(cfg)
    problems = generate_problems("train", ws.num_problems, seed=ws.seed, levels=levels, numbers=numbers)
    rng = random.Random(derive_seed("answer-styles", ws.seed))
    order = rng.sample(range(len(problems)), len(problems))  # a seeded order; each share is taken from its front
    direct = set(order[:round(ws.direct_answer_fraction * len(problems))])
    multi = [i for i in order if i not in direct and problems[i].level > 1]
    early = set(multi[:round(ws.stop_early_fraction * sum(p.level > 1 for p in problems))])
    # the narrated share has its own order, so adding it leaves the two habits' shares exactly as they were
    told = set(random.Random(derive_seed("narrated", ws.seed)).sample(
        range(len(problems)), round(ws.narrated_fraction * len(problems))))

    def styled(i: int, problem) -> str:
        if i in direct:
            return direct_answer(problem)
        if i in told:
            return narrated(problem, stop_early=i in early)
        return stopped_early(problem) if i in early else problem.solution

    prompt_format = PromptFormat.of(cfg.data, "train")  # the format RL trains with
    prompts = [prompt_format.messages(p) for p in problems]
    return prompts, [styled(i, p) for i, p in enumerate(problems)]


def _sft_groups(cfg: HacpoConfig, agents: list[AgentConfig]) -> list:
    """One trainer group per agent, set up for its warm start (its own seed, the warm start's lr schedule over
    its own steps), started and ready."""
    from nemo_hacpo.runtime.groups import AgentGroup, start_ray

    start_ray(cfg)
    groups = []
    try:
        for agent in agents:
            ws = agent_warm_start(agent, cfg)
            sft_agent = dataclasses.replace(agent, optimizer=dataclasses.replace(
                agent.optimizer, lr=ws.lr, min_lr=0.0, lr_warmup_steps=min(20, ws.steps // 10), lr_decay_style="cosine"))
            groups.append(AgentGroup(sft_agent, seed=warm_start_seed(agent, cfg), keep_reference=False,
                                     run_dir=str(Path(ws.cache_dir).expanduser()), total_updates=ws.steps,
                                     device=cfg.runtime.cluster.device, start_engine=False,
                                     log_dir=str(Path(cfg.runtime.output_dir) / "logs")))
        for group in groups:
            group.wait_ready()
    except BaseException:
        for group in groups:
            group.shutdown()
        raise
    return groups


def warm_start_probe(cfg: HacpoConfig, steps: int) -> dict[str, list[float]]:
    """The first `steps` losses of every tiny agent's warm start, computed exactly as `ensure_warm_start` computes
    them (same initial weights, worked solutions, batches and lr schedule over `warmstart.steps`); nothing is saved.
    A fingerprint of the environment: another torch, tokenizer or data generator changes them
    (`scripts/record_default_run.py`)."""
    agents = [agent for agent in cfg.agents if agent.model.source == "tiny"]
    if not agents:
        return {}
    settings = [agent_warm_start(agent, cfg) for agent in agents]
    groups = _sft_groups(cfg, agents)
    try:
        pending = [group.sft(*warm_start_corpus(cfg, agent), min(steps, ws.steps), ws.batch_size, ws.seed, 0)
                   for group, agent, ws in zip(groups, agents, settings, strict=True)]
        return {agent.name: list(call.result()) for agent, call in zip(agents, pending, strict=True)}
    finally:
        for group in groups:
            group.shutdown()


def _tail_mean(values: list[float], n: int = 10) -> float:
    tail = values[-n:]
    return sum(tail) / len(tail)

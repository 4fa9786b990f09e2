"""What can RL fix on a task? The reward gap between the two answer styles of the warm-started agents, and the
signal one step would carry, from the warm-start weights in about a minute per agent (HF `generate`, no Ray).

The warm start (`warmstart.direct_answer_fraction`) teaches two styles: worked (`Tom starts with 3 apples.` then
one `a <op> b = c` line per operation, then the boxed answer) and direct (`The answer is \\boxed{N}` at once). RL
can only select between what the policy already does, so a task is worth training on when one style earns much
more reward than the other (the gap) and a group of G samples often holds both a right and a wrong answer (the
signal: a group whose rewards are all equal has advantage 0). Per agent, on `--problems` held-out problems:

    greedy           greedy accuracy and its share of worked answers (what the held-out evaluation measures)
    forced worked    greedy accuracy with the response forced to start the worked way (`<Name> starts with`)
    forced direct    greedy accuracy with the response forced to start `The answer is`
    gap              forced worked − forced direct, overall and per level
    sampled          at the agent's temperature, G samples per problem: share of worked answers, accuracy of
                     each style, and the share of groups with mixed rewards (the groups that carry gradient)

    python benchmarks/task_probe.py                                # pair_tiny's agents, 200 problems, G = 4
    python benchmarks/task_probe.py --config-name pair_tiny warmstart.direct_answer_fraction=0.5 --json p.json

The warm start must be cached (`python recipes/train.py` makes it); a missing one is trained first (minutes).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cross_path import load_agents, sample  # noqa: E402

DIRECT_PREFIX = "The answer is"
STEP_LINE = re.compile(r"^\s*(\d+)\s*([-+*/])\s*(\d+)\s*=\s*(\d+)\s*$")
HABITS = ("direct", "stop_early")
"""The two bad habits a warm start can teach (`warmstart.direct_answer_fraction`, `warmstart.stop_early_fraction`),
each the 'other' option against finishing the worked solution."""


def worked_prefix(question: str) -> str:
    """The opening words of a worked solution to a generated problem: `<Name> starts with`."""
    return f"{question.split()[0]} starts with"


def step_lines(text: str) -> list[re.Match]:
    return [m for m in (STEP_LINE.match(line) for line in text.split("\n")) if m]


def style_of(text: str, level: int | None = None) -> str:
    """`direct` (opens with the answer), `stop_early` (one operation line for a problem of `level` ≥ 2), or
    `worked`."""
    if text.lstrip().startswith(DIRECT_PREFIX):
        return "direct"
    if level is not None and level > 1 and len(step_lines(text)) == 1:
        return "stop_early"
    return "worked"


@torch.no_grad()
def greedy(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, batch: int = 64) -> list[str]:
    """Greedy continuations of each prompt (left-padded batches), decoded without special tokens."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    texts = []
    for first in range(0, len(prompts), batch):
        part = prompts[first:first + batch]
        width = max(map(len, part))
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in part])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in part])
        out = model.generate(input_ids=input_ids, attention_mask=attention, do_sample=False, max_new_tokens=max_new_tokens,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=pad)[:, width:]
        texts += [tokenizer.decode(row, skip_special_tokens=True) for row in out.tolist()]
    return texts


def forced(model, tok, prompts: list[list[int]], prefixes: list[str], max_new_tokens: int) -> list[str]:
    """`prefix + greedy continuation` of each prompt with its response forced to start with `prefix`."""
    ids = [tok(prefix, add_special_tokens=False)["input_ids"] for prefix in prefixes]
    rest = greedy(model, tok, [p + i for p, i in zip(prompts, ids, strict=True)], max_new_tokens)
    return [prefix + text for prefix, text in zip(prefixes, rest, strict=True)]


def forced_options(model, tok, prompts, problems, habit: str, max_new_tokens: int) -> dict[str, list[str]]:
    """Greedy answers forced into `finish` (the worked solution to the end) and into the `habit`.

    direct: finish = `<Name> starts with` + greedy; habit = `The answer is` + greedy.
    stop_early: from the agent's own greedy worked start up to its first operation line `a op b = c`, finish =
    that + `\nc` + greedy (the next line starts from c); habit = that + `\nThe answer is \\boxed{c}`."""
    worked = forced(model, tok, prompts, [worked_prefix(p.question) for p in problems], max_new_tokens)
    if habit == "direct":
        return {"finish": worked, "habit": forced(model, tok, prompts, [DIRECT_PREFIX] * len(problems), max_new_tokens)}
    heads = []
    for text in worked:
        lines = text.split("\n")
        first = next((i for i, line in enumerate(lines) if STEP_LINE.match(line)), None)
        heads.append(None if first is None else ("\n".join(lines[:first + 1]), STEP_LINE.match(lines[first])[4]))
    cont = forced(model, tok, prompts, [f"{h}\n{c}" if h else w for (h, c), w in
                                        zip([x or (None, None) for x in heads], worked, strict=True)], max_new_tokens)
    stop = [f"{h[0]}\nThe answer is \\boxed{{{h[1]}}}" if h else w for h, w in zip(heads, worked, strict=True)]
    return {"finish": cont, "habit": stop}


def _rate(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def probe(cfg, problems: int, group: int, seed: int, habit: str) -> dict:
    from nemo_hacpo.data.prompts import PromptFormat
    from nemo_hacpo.data.splits import load_split
    from nemo_hacpo.models.chat import render_prompt_ids
    from nemo_hacpo.rewards.scorer import MathRewardScorer

    start = time.perf_counter()
    agents = load_agents(cfg)
    held_out = load_split(cfg.data.eval, "eval")[:problems]
    golds = [p.answer for p in held_out]
    levels = sorted({p.level for p in held_out})
    results: dict = {"problems": len(held_out), "group": group, "seed": seed, "habit": habit, "agents": {}}
    with MathRewardScorer(num_workers=0, strict=cfg.reward.strict) as scorer:
        def score(texts: list[str], gold: list[str]) -> list[float]:
            return list(scorer.score(texts, gold).rewards)

        def by_level(values: list[float]) -> dict[int, float | None]:
            return {lv: _rate([v for v, p in zip(values, held_out, strict=True) if p.level == lv]) for lv in levels}

        for name, (model, tok, agent) in agents.items():
            prompts = [render_prompt_ids(PromptFormat.of(cfg.data, "eval").messages(p), tok,
                                         agent.tokenizer.chat_template) for p in held_out]
            row: dict = {}
            texts = greedy(model, tok, prompts, agent.max_response_length)
            rewards = score(texts, golds)
            row["greedy"], row["greedy_by_level"] = _rate(rewards), by_level(rewards)
            row["greedy_habit_share"] = _rate([style_of(t, p.level) == habit for t, p in zip(texts, held_out,
                                                                                               strict=True)])
            for option, answers in forced_options(model, tok, prompts, held_out, habit,
                                                  agent.max_response_length).items():
                outcome = score(answers, golds)
                row[f"forced_{option}"], row[f"forced_{option}_by_level"] = _rate(outcome), by_level(outcome)
            row["gap"] = row["forced_finish"] - row["forced_habit"]
            responses = sample(model, tok, agent, prompts, group, seed)
            sampled_texts = [tok.decode(r, skip_special_tokens=True) for r, _ in responses]
            sampled = score(sampled_texts, [g for g in golds for _ in range(group)])
            styles = [style_of(t, held_out[n // group].level) for n, t in enumerate(sampled_texts)]
            row["sampled"] = _rate(sampled)
            row["sampled_habit_share"] = _rate([s == habit for s in styles])
            row["sampled_finish"] = _rate([r for r, s in zip(sampled, styles, strict=True) if s == "worked"])
            row["sampled_habit"] = _rate([r for r, s in zip(sampled, styles, strict=True) if s == habit])
            groups = [sampled[b * group:(b + 1) * group] for b in range(len(held_out))]
            row["mixed_groups"] = _rate([0 < sum(g) < group for g in groups])
            results["agents"][name] = row
    results["elapsed_s"] = time.perf_counter() - start
    return results


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def print_table(results: dict) -> None:
    habit = results["habit"]
    print(f"# finish vs {habit}, from the warm start: {results['problems']} held-out problems, G = {results['group']}, "
          f"seed {results['seed']}; {results['elapsed_s']:.0f} s")
    print(f"| agent | greedy ({habit} share) | forced finish | forced {habit} | gap | gap by level | sampled | "
          f"{habit} share | sampled finish / {habit} | mixed groups |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results["agents"].items():
        by_level = " / ".join(f"L{level} {_fmt(w - r['forced_habit_by_level'][level])}"
                              for level, w in r["forced_finish_by_level"].items())
        print(f"| {name} | {_fmt(r['greedy'])} ({_fmt(r['greedy_habit_share'])}) | {_fmt(r['forced_finish'])} | "
              f"{_fmt(r['forced_habit'])} | {_fmt(r['gap'])} | {by_level} | {_fmt(r['sampled'])} | "
              f"{_fmt(r['sampled_habit_share'])} | {_fmt(r['sampled_finish'])} / {_fmt(r['sampled_habit'])} | "
              f"{_fmt(r['mixed_groups'])} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-name", default="pair_tiny")
    parser.add_argument("--problems", type=int, default=200, help="held-out problems (the first of data.eval)")
    parser.add_argument("--group", type=int, default=4, help="G: samples per problem")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--habit", choices=HABITS, default="stop_early",
                        help="the option measured against finishing the worked solution")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_args(argv)
    from nemo_hacpo.config import load_config

    results = probe(load_config(args.config_name, args.overrides), args.problems, args.group, args.seed, args.habit)
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

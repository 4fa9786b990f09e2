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
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cross_path import load_agents, sample  # noqa: E402  (sibling module)

DIRECT_PREFIX = "The answer is"


def worked_prefix(question: str) -> str:
    """The opening words of a worked solution to a generated problem: `<Name> starts with`."""
    return f"{question.split()[0]} starts with"


def style_of(text: str) -> str:
    """`direct` for a response that opens with the direct answer, `worked` otherwise."""
    return "direct" if text.lstrip().startswith(DIRECT_PREFIX) else "worked"


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


def _rate(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def probe(cfg, problems: int, group: int, seed: int) -> dict:
    from nemo_hacpo.data import problem_to_messages
    from nemo_hacpo.data.splits import load_split
    from nemo_hacpo.models.chat import render_prompt_ids
    from nemo_hacpo.rewards.scorer import MathRewardScorer

    start = time.perf_counter()
    agents = load_agents(cfg)
    held_out = load_split(cfg.data.eval, "eval")[:problems]
    golds = [p.answer for p in held_out]
    levels = sorted({p.level for p in held_out})
    results: dict = {"problems": len(held_out), "group": group, "seed": seed, "agents": {}}
    with MathRewardScorer(num_workers=0, strict=cfg.reward.strict) as scorer:
        def score(texts: list[str], gold: list[str]) -> list[float]:
            return list(scorer.score(texts, gold).rewards)

        for name, (model, tok, agent) in agents.items():
            prompts = [render_prompt_ids(problem_to_messages(p, system_prompt=cfg.data.system_prompt), tok,
                                         agent.tokenizer.chat_template) for p in held_out]
            row: dict = {}
            texts = greedy(model, tok, prompts, agent.max_response_length)
            rewards = score(texts, golds)
            row["greedy"] = _rate(rewards)
            row["greedy_worked_share"] = _rate([style_of(t) == "worked" for t in texts])
            for style in ("worked", "direct"):
                prefixes = [worked_prefix(p.question) if style == "worked" else DIRECT_PREFIX for p in held_out]
                ids = [tok(prefix, add_special_tokens=False)["input_ids"] for prefix in prefixes]
                rest = greedy(model, tok, [p + i for p, i in zip(prompts, ids, strict=True)], agent.max_response_length)
                forced = score([prefix + text for prefix, text in zip(prefixes, rest, strict=True)], golds)
                row[f"forced_{style}"] = _rate(forced)
                row[f"forced_{style}_by_level"] = {
                    level: _rate([r for r, p in zip(forced, held_out, strict=True) if p.level == level]) for level in levels}
            row["gap"] = row["forced_worked"] - row["forced_direct"]
            responses = sample(model, tok, agent, prompts, group, seed)
            sampled_texts = [tok.decode(r, skip_special_tokens=True) for r, _ in responses]
            sampled = score(sampled_texts, [g for g in golds for _ in range(group)])
            styles = [style_of(t) for t in sampled_texts]
            row["sampled"] = _rate(sampled)
            row["sampled_worked_share"] = _rate([s == "worked" for s in styles])
            for style in ("worked", "direct"):
                row[f"sampled_{style}"] = _rate([r for r, s in zip(sampled, styles, strict=True) if s == style])
            groups = [sampled[b * group:(b + 1) * group] for b in range(len(held_out))]
            row["mixed_groups"] = _rate([0 < sum(g) < group for g in groups])
            results["agents"][name] = row
    results["elapsed_s"] = time.perf_counter() - start
    return results


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def print_table(results: dict) -> None:
    print(f"# answer styles from the warm start: {results['problems']} held-out problems, G = {results['group']}, "
          f"seed {results['seed']}; {results['elapsed_s']:.0f} s")
    print("| agent | greedy (worked share) | forced worked | forced direct | gap | gap by level | sampled | worked share "
          "| sampled worked / direct | mixed groups |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results["agents"].items():
        by_level = " / ".join(f"L{level} {_fmt(w - r['forced_direct_by_level'][level])}"
                              for level, w in r["forced_worked_by_level"].items())
        print(f"| {name} | {_fmt(r['greedy'])} ({_fmt(r['greedy_worked_share'])}) | {_fmt(r['forced_worked'])} | "
              f"{_fmt(r['forced_direct'])} | {_fmt(r['gap'])} | {by_level} | {_fmt(r['sampled'])} | "
              f"{_fmt(r['sampled_worked_share'])} | {_fmt(r['sampled_worked'])} / {_fmt(r['sampled_direct'])} | "
              f"{_fmt(r['mixed_groups'])} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-name", default="pair_tiny")
    parser.add_argument("--problems", type=int, default=200, help="held-out problems (the first of data.eval)")
    parser.add_argument("--group", type=int, default=4, help="G: samples per problem")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_args(argv)
    from nemo_hacpo.config import load_config

    results = probe(load_config(args.config_name, args.overrides), args.problems, args.group, args.seed)
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

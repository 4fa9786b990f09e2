"""Held-out evaluation during training: greedy avg@1 of every agent (the run's accuracy), and with
`runtime.eval_samples = n > 0` also n sampled responses per problem → avg@n and unbiased pass@k.

Scoring goes through `nemo_hacpo.eval` (the same code as `recipes/evaluate.py`); generation through each
agent's own rollout engine, all agents at once. Sampled evaluation uses seeds derived from the run seed and
the step, so it is reproducible and does not disturb the training samples' seeds.
"""

from __future__ import annotations

import time
from pathlib import Path

from nemo_hacpo.config import HacpoConfig
from nemo_hacpo.data import MathProblem
from nemo_hacpo.data.prompts import PromptFormat
from nemo_hacpo.eval.pass_at_k import default_pass_ks
from nemo_hacpo.eval.runner import EvalResult, evaluate_responses
from nemo_hacpo.eval.tables import write_answers
from nemo_hacpo.rollout.outputs import GenerationResult
from nemo_hacpo.rollout.sampling import call_base_seed

EVAL_SEED_OFFSET = 7919
"""Added to an agent's seed for sampled evaluation (keeps eval draws apart from training draws)."""
HELD_OUT = "heldout"
"""The dataset name of the run's held-out split in answer files (`<agent>__heldout.jsonl`)."""


def _scored(generated: GenerationResult, problems: list[MathProblem], ks: tuple[int, ...], scorer):
    groups = generated.responses
    return evaluate_responses([[r.text for r in group] for group in groups], problems, ks, scorer=scorer,
                              num_tokens=[[r.num_tokens for r in group] for group in groups],
                              finish_reasons=[[r.finish_reason for r in group] for group in groups])


def evaluate_agents(groups, problems: list[MathProblem], cfg: HacpoConfig, scorer, step: int = 0,
                    answers_dir: str | Path | None = None) -> dict[str, dict[str, float]]:
    """`{agent: {"accuracy": greedy avg@1, "response_length": …, "truncation_rate": …, ["avg@n", "pass@k", …],
    "correct": (0/1 per problem, greedy)}}` — `correct` pairs evaluations on the same problems (McNemar's test).

    `scorer` is the run's training scorer (`MathRewardScorer`), so held-out answers are verified under the same
    limits, in the same worker processes, as training answers. With `answers_dir`, every problem's outcome is kept
    there as `<agent>__heldout.jsonl` (`eval.tables.answer_records`: the greedy and sampled responses, each with
    its reward), so that studies can pair problems across evaluations and seeds."""
    start = time.perf_counter()
    prompt_format = PromptFormat.of(cfg.data, "eval")  # the held-out set's own template and system prompt
    messages = [prompt_format.messages(p) for p in problems]
    n = cfg.runtime.eval_samples
    greedy = {name: group.generate(messages, 1, greedy=True, what="evaluate") for name, group in groups.items()}
    sampled = {name: group.generate(messages, n, seed=call_base_seed(group.seed + EVAL_SEED_OFFSET, step),
                                    what="evaluate") for name, group in groups.items()} if n > 0 else {}
    out: dict[str, dict[str, float]] = {}
    kept: dict[str, list] = {}
    for name, call in greedy.items():
        scored = _scored(call.result(), problems, (), scorer)
        kept[name] = [scored, None]
        out[name] = {"accuracy": scored.avg(), "response_length": scored.response_tokens_mean(),
                     "truncation_rate": scored.truncation_rate(),
                     "correct": tuple(int(p.responses[0].reward > 0) for p in scored.problems)}
    for name, call in sampled.items():
        scored = _scored(call.result(), problems, default_pass_ks(n), scorer)
        kept[name][1] = scored
        out[name].update(scored.metrics())
    if answers_dir is not None:
        elapsed = time.perf_counter() - start
        for name, (greedy_scored, sampled_scored) in kept.items():
            write_answers(EvalResult(name, HELD_OUT, len(problems), greedy_scored, sampled_scored, elapsed), answers_dir)
    return out

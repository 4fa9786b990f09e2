"""A config's dataset section → `MathProblem`s (generated, local file, or a benchmark from the eval extra)."""

from __future__ import annotations

from nemo_hacpo.config import DatasetConfig
from nemo_hacpo.data.arithmetic import generate_problems
from nemo_hacpo.data.loaders import extract_gsm8k_answer, load_aime2025, load_gsm8k_test, load_problems
from nemo_hacpo.data.problem import MathProblem
from nemo_hacpo.data.validation import Policy


def load_split(ds: DatasetConfig, split: str, on_invalid: Policy = "error") -> list[MathProblem]:
    """Problems of one split (`data.<split>`), every record checked (`data.on_invalid`), cut to `limit`.

    `arithmetic` draws from its own disjoint split of the generator."""
    if ds.source == "arithmetic":
        problems = generate_problems("train" if split == "train" else "eval", ds.size, seed=ds.seed, levels=ds.levels,
                                     numbers=ds.numbers)
    elif ds.source in ("jsonl", "parquet"):
        problems = load_problems(ds.path, question_field=ds.question_field, answer_field=ds.answer_field,
                                 answer_extractor=extract_gsm8k_answer if ds.answer_format == "gsm8k" else None,
                                 file_format="json" if ds.source == "jsonl" else "parquet", on_invalid=on_invalid,
                                 what=f"data.{split}")
    elif ds.source == "gsm8k":
        problems = load_gsm8k_test(on_invalid)
    else:
        problems = load_aime2025(on_invalid)
    return problems[: ds.limit] if ds.limit is not None else problems

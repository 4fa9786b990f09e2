"""Math problems: the record type, the arithmetic generator, benchmark loaders, prompts, the training stream.

- `problem.MathProblem`: the one record every source produces.
- `arithmetic.generate_problems`: seeded word problems (levels 1-3) with disjoint train/eval splits.
- `loaders`: local JSONL/parquet (offline) and the packaged GSM8K test / AIME 2025 sets.
- `prompts`: problem -> chat messages asking for a `\\boxed{}` answer.
- `prompt_dataset.PromptDataset`: seeded per-epoch shuffling with exact resume.
"""

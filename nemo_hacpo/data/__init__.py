"""Math problems: the record type, the arithmetic generator, benchmark loaders, prompts, the training stream.

- `problem.MathProblem`: the one record every source produces.
- `arithmetic.generate_problems`: seeded word problems (levels 1-3) with disjoint train/eval splits.
- `loaders`: local JSONL/parquet (offline) and the packaged GSM8K test / AIME 2025 sets.
- `prompts`: problem -> chat messages asking for a `\\boxed{}` answer.
- `prompt_dataset.PromptDataset`: seeded per-epoch shuffling with exact resume.
"""

from nemo_hacpo.data.problem import MathProblem
from nemo_hacpo.data.prompt_dataset import PromptDataset
from nemo_hacpo.data.prompts import build_chat_messages, problem_to_messages, problem_to_sft_messages

__all__ = ["MathProblem", "PromptDataset", "build_chat_messages", "problem_to_messages", "problem_to_sft_messages"]

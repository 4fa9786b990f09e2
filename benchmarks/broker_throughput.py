"""Re-encoding throughput: responses/s and tokens/s of the broker vs the raw tokenizer on the same texts.

    python benchmarks/broker_throughput.py                       # 512 responses of ~1k tokens, Qwen3 + tiny-bpe
    python benchmarks/broker_throughput.py --responses 2048 --words 3000 --workers 1 2 4

"raw" is one batched `tokenizer(texts)` call over the response texts alone: the floor any re-encoding
costs. "reencode" is the full path (render each prompt with the chat template, joint tokenization with the
boundary check, decode to verify, EOS, mask) through `ReencodePool` with the given number of workers
(1 = in the calling process).
"""

from __future__ import annotations

import argparse
import random
import time

from nemo_hacpo.broker import ReencodePool
from nemo_hacpo.models.tokenizers import load_tokenizer

WORDS = ("so", "the", "answer", "is", "we", "add", "3", "and", "4", "to", "get", "7", "then", "multiply", "by",
         "2", "=", "14", "apples", "Tom", "has", "\\frac{1}{2}", "$x^2$", "\n", "therefore", "数学", "😀", ".")


def make_items(num_responses: int, words: int, group_size: int, seed: int = 0) -> list[tuple]:
    rng = random.Random(seed)
    items = []
    for i in range(num_responses):
        prompt = ({"role": "user", "content": f"Problem {i // group_size}: Tom has {i} apples. How many?"},)
        text = " ".join(rng.choice(WORDS) for _ in range(words)) + f" \\boxed{{{i}}}"
        items.append((prompt, text, rng.random() < 0.9))
    return items


def bench(tokenizer_name: str, items: list[tuple], workers: list[int], repeats: int) -> list[dict]:
    tok = load_tokenizer(tokenizer_name)
    texts = [text for _, text, _ in items]
    tokens = sum(len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"])
    rows = []

    def timed(fn) -> float:
        fn()  # warm-up (and pool start-up)
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - start) / repeats

    raw = timed(lambda: tok(texts, add_special_tokens=False))
    rows.append({"tokenizer": tokenizer_name, "path": "raw tokenizer(texts)", "workers": 1, "seconds": raw,
                 "responses/s": len(items) / raw, "tokens/s": tokens / raw})
    for n in workers:
        with ReencodePool(n if n > 1 else 0) as pool:
            sec = timed(lambda pool=pool: pool.reencode(items, tok, 1 << 20))
        rows.append({"tokenizer": tokenizer_name, "path": "reencode (full)", "workers": n, "seconds": sec,
                     "responses/s": len(items) / sec, "tokens/s": tokens / sec})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--responses", type=int, default=512)
    parser.add_argument("--words", type=int, default=700, help="words per response (~1.4 tokens each)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokenizers", nargs="+", default=["qwen3", "tiny-bpe"])
    args = parser.parse_args()

    items = make_items(args.responses, args.words, args.group_size)
    rows = [row for name in args.tokenizers for row in bench(name, items, args.workers, args.repeats)]
    header = f"| {'tokenizer':<10} | {'path':<22} | workers | seconds | responses/s | tokens/s  | vs raw |"
    print(header)
    print("|" + "|".join("-" * (len(col)) for col in header.split("|")[1:-1]) + "|")
    for row in rows:
        raw = next(r for r in rows if r["tokenizer"] == row["tokenizer"] and r["path"].startswith("raw"))
        print(f"| {row['tokenizer']:<10} | {row['path']:<22} | {row['workers']:>7} | {row['seconds']:>7.3f} | "
              f"{row['responses/s']:>11.0f} | {row['tokens/s']:>9.0f} | {row['seconds'] / raw['seconds']:>5.1f}x |")


if __name__ == "__main__":
    main()

"""scripts/record_default_run.py: what counts as a moved default run (the measurement itself runs in .ci/run)."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("record_default_run", ROOT / "scripts" / "record_default_run.py")
record = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = record
spec.loader.exec_module(record)

BASE = {"config": "pair_tiny", "environment": {"torch": "2.13.0+cpu", "tokenizers": "0.23.3"}, "cpu": "x (avx2)",
        "tokenizers": {"tiny-bpe": {"tokenizer_json_sha256": "aa", "sample_ids_sha256": "bb", "sample_tokens": 10}},
        "warmstart_first_losses": {"llama_tiny": [6.6666, 6.3960], "gpt_tiny": [6.5, 6.2]}}


def _moved(*path: str, value) -> dict:
    new = copy.deepcopy(BASE)
    node = new
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return new


def test_the_same_record_and_the_cpu_name_do_not_count():
    assert record.differences(BASE, copy.deepcopy(BASE)) == []
    assert record.differences(BASE, _moved("cpu", value="another CPU (avx512f)")) == []
    # within the relative tolerance (1e-5): float noise, not a change
    assert record.differences(BASE, _moved("warmstart_first_losses", "gpt_tiny", value=[6.5 * (1 + 4e-6), 6.2])) == []


def test_each_kind_of_change_is_named():
    (line,) = record.differences(BASE, _moved("environment", "tokenizers", value="0.23.4"))
    assert line.startswith("environment: tokenizers 0.23.3 → 0.23.4")
    (line,) = record.differences(BASE, _moved("tokenizers", "tiny-bpe", "tokenizer_json_sha256", value="ab"))
    assert line.startswith("tokenizer tiny-bpe")
    (line,) = record.differences(BASE, _moved("warmstart_first_losses", "llama_tiny", value=[6.6666, 6.3961]))
    assert line.startswith("warm start of llama_tiny")  # 1.6e-5 relative: a real change
    assert len(record.differences(BASE, _moved("warmstart_first_losses", "llama_tiny", value=[6.6666]))) == 1
    assert len(record.differences(BASE, _moved("config", value="trio_tiny"))) == 1

"""config.json of two public models (shapes only: planning needs no weights), for the --plan tests."""

from __future__ import annotations

import json
from pathlib import Path

LLAMA_33_70B = {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256, "hidden_act": "silu",
                "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                "tie_word_embeddings": False}
QWEN3_8B = {"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
            "hidden_act": "silu", "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "tie_word_embeddings": False}


def write_large_env(tmp_path: Path, monkeypatch) -> Path:
    """Point pair_large's four environment variables at directories holding only these config.json files."""
    for name, hf in (("HACPO_LLAMA70B_PATH", LLAMA_33_70B), ("HACPO_QWEN8B_PATH", QWEN3_8B)):
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps(hf))
        monkeypatch.setenv(name, str(path))
    (tmp_path / "math.jsonl").write_text('{"problem": "1 + 1?", "answer": "2"}\n')  # the driver checks it exists
    for name in ("HACPO_TRAIN_DATA", "HACPO_EVAL_DATA"):
        monkeypatch.setenv(name, str(tmp_path / "math.jsonl"))
    return tmp_path

"""Datasets by name or path (field-mapped local files), agents of a run or NAME=DIR, and their error messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_hacpo.config import AgentConfig, DatasetConfig, dump_config, load_config
from nemo_hacpo.data.loaders import AIME2025_SIZE
from nemo_hacpo.data.validation import DataError
from nemo_hacpo.eval.targets import (
    default_agent_config,
    load_dataset,
    model_targets,
    parse_field_mapping,
    run_targets,
    with_lengths,
)

ROWS = [{"problem": "What is 2 + 2?", "solution": "4", "meta": {"uid": "a1", "difficulty": 2}},
        {"problem": "What is 5 * 3?", "solution": "15", "meta": {"uid": "a2", "difficulty": 3}},
        {"problem": "What is 9 - 1?", "solution": "8", "meta": {"uid": "a3", "difficulty": 1}}]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_local_jsonl_with_a_field_mapping(tmp_path):
    path = _write_jsonl(tmp_path / "my_set.jsonl", ROWS)
    fields = parse_field_mapping(["question=problem", "answer=solution", "id=meta.uid", "level=meta.difficulty"])
    dataset = load_dataset(str(path), fields=fields, limit=2)
    assert dataset.name == "my_set" and dataset.origin == str(path.resolve())
    assert [(p.id, p.question, p.answer, p.level, p.source) for p in dataset.problems] == [
        ("a1", "What is 2 + 2?", "4", 2, "my_set"), ("a2", "What is 5 * 3?", "15", 3, "my_set")]


def test_local_parquet_with_default_ids(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "table.parquet"
    pq.write_table(pa.table({"q": [r["problem"] for r in ROWS], "a": [r["solution"] for r in ROWS]}), path)
    dataset = load_dataset(str(path), fields={"question": "q", "answer": "a"})
    assert [(p.id, p.answer) for p in dataset.problems] == [("table-0000", "4"), ("table-0001", "15"),
                                                             ("table-0002", "8")]


def test_heldout_and_benchmarks():
    heldout = load_dataset("heldout", heldout=DatasetConfig(size=5, seed=3, levels=(1,)))
    assert heldout.name == "heldout" and len(heldout.problems) == 5 and {p.level for p in heldout.problems} == {1}
    default = load_dataset("heldout", limit=3)  # DataConfig().eval: 200 generated problems, seed 1
    assert [p.id for p in default.problems] == ["arith-eval-000000", "arith-eval-000001", "arith-eval-000002"]
    aime = load_dataset("aime2025")
    assert aime.name == "aime2025" and len(aime.problems) == AIME2025_SIZE


def test_dataset_errors_name_what_was_looked_at(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=f"dataset '{missing}' is not one of \\['heldout', 'gsm8k', "
                                                f"'aime2025'\\] and no file exists at {missing}"):
        load_dataset(str(missing))
    path = _write_jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(DataError) as info:
        load_dataset(str(path))  # the file has `problem` / `solution`: a mapping is needed
    assert [issue.key for issue in info.value.issues] == ["dataset d"] * 3 + ["--field"]
    assert info.value.issues[0].problem == (f"{path}:1: field 'answer': no key 'answer' "
                                            "(available: ['meta', 'problem', 'solution'])")
    assert "map them with --field KEY=COLUMN" in info.value.issues[-1].fix
    with pytest.raises(ValueError, match="limit must be ≥ 1"):
        load_dataset("heldout", limit=0)
    with pytest.raises(ValueError, match="unknown key 'prompt'; use one of \\['question', 'answer', 'id'"):
        parse_field_mapping(["prompt=problem"])
    with pytest.raises(ValueError, match="expected KEY=FIELD"):
        parse_field_mapping(["question"])


# ------------------------------------------------------------------------------------------------ agents
def _checkpoint(directory: Path, with_tokenizer: bool = True) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    if with_tokenizer:
        (directory / "tokenizer.json").write_text("{}")
    return directory


@pytest.fixture(scope="module")
def pair_tiny():
    return load_config("pair_tiny_gpt")


def test_run_targets_use_the_run_config_and_hf_exports(tmp_path, pair_tiny):
    (tmp_path / "config.yaml").write_text(dump_config(pair_tiny))
    _checkpoint(tmp_path / "hf" / "llama_tiny")
    _checkpoint(tmp_path / "hf" / "gpt_tiny", with_tokenizer=False)
    cfg, targets = run_targets(tmp_path)
    assert cfg == pair_tiny
    assert [(t.name, t.model_dir, t.tokenizer_dir) for t in targets] == [
        ("llama_tiny", tmp_path / "hf" / "llama_tiny", tmp_path / "hf" / "llama_tiny"),
        ("gpt_tiny", tmp_path / "hf" / "gpt_tiny", None)]  # no tokenizer files: the agent's own (tiny-unigram)
    llama = targets[0].agent
    assert llama.model.source == "hf" and llama.model.path == str(tmp_path / "hf" / "llama_tiny")
    assert (llama.max_response_length, llama.tokenizer.source) == (96, "tiny-bpe")
    _, only = run_targets(tmp_path, ["gpt_tiny"])
    assert [t.name for t in only] == ["gpt_tiny"]


def test_run_errors_name_the_missing_path(tmp_path, pair_tiny):
    with pytest.raises(FileNotFoundError, match=f"no run config at {tmp_path / 'config.yaml'}"):
        run_targets(tmp_path)
    (tmp_path / "config.yaml").write_text(dump_config(pair_tiny))
    with pytest.raises(FileNotFoundError, match=f"agent 'llama_tiny' of run .*: no checkpoint directory at "
                                                f"{tmp_path / 'hf' / 'llama_tiny'}"):
        run_targets(tmp_path)
    (tmp_path / "hf" / "llama_tiny").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'hf' / 'llama_tiny'} has no config.json"):
        run_targets(tmp_path)
    with pytest.raises(KeyError, match="has no agent \\['qwen'\\]; its agents: \\['llama_tiny', 'gpt_tiny'\\]"):
        run_targets(tmp_path, ["qwen"])


def test_model_targets_from_a_config_agent_or_defaults(tmp_path, pair_tiny):
    first = _checkpoint(tmp_path / "first")
    bare = _checkpoint(tmp_path / "bare", with_tokenizer=False)
    by_flag = model_targets([f"mine={bare}"], cfg=pair_tiny, agent="gpt_tiny")
    assert by_flag[0].name == "mine" and by_flag[0].agent.max_response_length == 224
    assert by_flag[0].tokenizer_dir is None and by_flag[0].agent.tokenizer.source == "tiny-unigram"
    by_name = model_targets([f"llama_tiny={first}"], cfg=pair_tiny)
    assert by_name[0].agent.max_prompt_length == 128 and by_name[0].tokenizer_dir == first
    default = model_targets([str(first)])[0]  # no NAME=: named after the folder
    assert default.name == "first" and default.agent == default_agent_config("first", first, "cpu")
    assert default.agent.tokenizer.source == "model" and default.agent.rollout.enforce_eager
    assert default_agent_config("x", first, "cuda").precision.dtype == "bf16"


def test_model_target_errors(tmp_path, pair_tiny):
    missing = tmp_path / "missing"
    with pytest.raises(FileNotFoundError, match=f"model 'm': no checkpoint directory at {missing}"):
        model_targets([f"m={missing}"])
    bare = _checkpoint(tmp_path / "bare", with_tokenizer=False)
    with pytest.raises(FileNotFoundError, match=f"no tokenizer files \\(tokenizer.json, tokenizer_config.json\\) in "
                                                f"{bare}; add them, or pass --config-name/--agent"):
        model_targets([f"m={bare}"])
    first = _checkpoint(tmp_path / "first")
    with pytest.raises(ValueError, match="the name 'm' is used twice"):
        model_targets([f"m={first}", f"m={first}"])
    with pytest.raises(KeyError, match="no agent named 'm'; agents: \\['llama_tiny', 'gpt_tiny'\\]"):
        model_targets([f"m={first}"], cfg=pair_tiny)
    with pytest.raises(ValueError, match="--agent 'llama_tiny' needs --config-name"):
        model_targets([f"m={first}"], agent="llama_tiny")
    with pytest.raises(ValueError, match="expected NAME=DIR"):
        model_targets(["=x"])


def test_with_lengths_overrides_only_what_is_given(tmp_path):
    target = model_targets([str(_checkpoint(tmp_path / "c"))])[0]
    assert with_lengths(target) is target
    changed = with_lengths(target, max_response_length=32)
    assert (changed.agent.max_prompt_length, changed.agent.max_response_length) == (256, 32)
    assert isinstance(changed.agent, AgentConfig)
    with pytest.raises(ValueError, match="max_prompt_length must be ≥ 1"):
        with_lengths(target, max_prompt_length=0)


def test_an_auto_engine_memory_becomes_the_standalone_default(tmp_path, pair_tiny):
    """`auto` is sized next to a colocated trainer at training start-up; an evaluation engine is alone on its
    GPUs: it gets vLLM's own default (0.92), so `--model … --config-name pair_large` can start an engine."""
    import dataclasses

    from nemo_hacpo.eval.targets import STANDALONE_GPU_MEMORY_UTILIZATION

    agent = pair_tiny.agent("llama_tiny")
    auto = dataclasses.replace(pair_tiny, agents=(dataclasses.replace(
        agent, rollout=dataclasses.replace(agent.rollout, gpu_memory_utilization="auto")),))
    target = model_targets([f"llama_tiny={_checkpoint(tmp_path / 'ckpt')}"], cfg=auto)[0]
    assert target.agent.rollout.gpu_memory_utilization == STANDALONE_GPU_MEMORY_UTILIZATION == 0.92
    assert dataclasses.replace(target.agent.rollout, gpu_memory_utilization="auto") == auto.agents[0].rollout

"""Checks that read the agents' files before anything starts: tokenizer sources and vocabulary vs embedding."""

from __future__ import annotations

import json

import pytest

from nemo_hacpo.config import ConfigError, load_config
from nemo_hacpo.models.tokenizers import load_tokenizer
from nemo_hacpo.planning.preflight import check_agents


def _hf_dir(tmp_path, vocab_size: int):
    directory = tmp_path / "hf"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab_size, "hidden_size": 256,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 512}))
    return directory


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path):
    ids = len(load_tokenizer("tiny-bpe"))
    small = _hf_dir(tmp_path, ids - 146)
    cfg = load_config("pair_tiny_gpt", ["agents.0.model.source=hf", f"agents.0.model.path={small}"])
    with pytest.raises(ConfigError) as info:
        check_agents(cfg)
    (issue,) = info.value.issues
    assert issue.key == "agents[0].tokenizer.source"
    assert f"the tokenizer has {ids} ids but the model's embedding has {ids - 146} rows" in issue.problem
    json.loads((small / "config.json").read_text())  # untouched
    (small / "config.json").write_text((small / "config.json").read_text().replace(f'"vocab_size": {ids - 146}',
                                                                                   f'"vocab_size": {ids + 10}'))
    check_agents(cfg)  # padded embeddings (more rows than ids) are normal


def test_unknown_tokenizer_sources_and_model_without_a_checkpoint_are_named():
    cfg = load_config("pair_tiny_gpt", ["agents.0.tokenizer.source=nope", "agents.1.tokenizer.source=model"])
    with pytest.raises(ConfigError) as info:
        check_agents(cfg)
    assert [issue.key for issue in info.value.issues] == ["agents[0].tokenizer.source", "agents[1].tokenizer.source"]
    assert "'model' means the HF checkpoint's own tokenizer" in info.value.issues[1].problem


def test_a_tiny_model_without_an_hf_family_is_refused_before_the_warm_start():
    """GPT-2 with RoPE trains in Megatron but has no HF layout (vLLM could not serve it): named at start-up, not
    after minutes of warm start when its checkpoint is exported (measured: that is where it used to fail)."""
    with pytest.raises(ConfigError) as err:
        check_agents(load_config("pair_tiny_gpt", ["agents.1.model.tiny.position_embedding=rope"]))
    (issue,) = err.value.issues
    assert issue.key == "agents[1].model.tiny" and "no HF equivalent" in issue.problem
    check_agents(load_config("pair_tiny_gpt"))  # both shipped tiny agents convert


def test_a_checkpoint_without_tokenizer_files_is_named_and_the_plan_skips_only_its_vocabulary_check(tmp_path):
    """Issue #26 item 8: a directory holding only config.json (a cluster sized before the weights are copied).
    Before, loading its tokenizer died in a transformers traceback ("Couldn't instantiate the backend tokenizer")."""
    bare = _hf_dir(tmp_path, 32000)
    cfg = load_config("pair_tiny_gpt", ["agents.0.model.source=hf", f"agents.0.model.path={bare}",
                                        f"agents.0.tokenizer.source={bare}"])
    with pytest.raises(ConfigError) as info:  # a run needs the tokenizer: refused, naming the key and the directory
        check_agents(cfg)
    (issue,) = info.value.issues
    assert issue.key == "agents[0].tokenizer.source"
    assert issue.problem.startswith(f"{bare} has no tokenizer files (none of: tokenizer.json, tokenizer.model, "
                                    "vocab.json + merges.txt, vocab.txt")
    (note,) = check_agents(cfg, vocabulary_optional=True)  # the plan goes on without the vocabulary check
    assert note.startswith(f"agent 'llama_tiny': {bare} has no tokenizer files") and "was skipped" in note
    assert check_agents(load_config("pair_tiny_gpt"), vocabulary_optional=True) == []
    (bare / "vocab.json").write_text("{}")  # half of a BPE vocabulary is still none
    with pytest.raises(ConfigError):
        check_agents(cfg)

"""The driver's start-up checks (`planning.plan.startup_checks`): `auto` engine memory is resolved before anything
starts, and on CUDA the plan and the checkpoint directories are checked first (issue #26 items 2, 3, 6, 8)."""

from __future__ import annotations

import logging

import pytest

from nemo_hacpo.config import ConfigError, load_config
from nemo_hacpo.planning.plan import startup_checks


def test_auto_is_resolved_before_the_run_starts_on_cpu():
    cfg = load_config("pair_tiny_gpt", ["agents.1.rollout.gpu_memory_utilization=auto"])
    resolved = startup_checks(cfg)
    assert resolved.agents[1].rollout.gpu_memory_utilization == 0.5 and resolved.agents[0] == cfg.agents[0]
    plain = load_config("pair_tiny_gpt")
    assert startup_checks(plain) is plain  # CPU, nothing to resolve: untouched


def test_on_cuda_a_checkpoint_without_a_tokenizer_stops_the_run_naming_the_key(large_env, caplog):
    """`--plan` sizes a cluster from config.json alone; a run cannot: the driver names the directory and what it
    lacks before the plan, Ray or any engine starts (the driver check only warns on this GPU-less machine)."""
    cfg = load_config("pair_large")
    with caplog.at_level(logging.WARNING), pytest.raises(ConfigError) as err:
        startup_checks(cfg)
    assert [issue.key for issue in err.value.issues] == ["agents[0].tokenizer.source", "agents[1].tokenizer.source"]
    assert "has no tokenizer files" in str(err.value)
    assert any("R580" in record.getMessage() for record in caplog.records)  # no driver here: a warning, not a stop


def test_fp8_agents_get_their_expected_mismatch_logged(large_env, caplog):
    """pair_large_fp8: FP8 GEMMs in training, bf16 sampling — the start-up log says what
    mismatch_token_mult_prob_error will show, once per agent, before anything else can stop the run."""
    with caplog.at_level(logging.WARNING), pytest.raises(ConfigError):
        startup_checks(load_config("pair_large_fp8"))  # stops at the tokenizer-less directories, after the notes
    notes = [r.getMessage() for r in caplog.records if "mismatch_token_mult_prob_error" in r.getMessage()]
    assert [n.split("'")[1] for n in notes] == ["llama70b", "qwen8b"]
    assert "e4m3, blockwise scaling" in notes[0] and "above a bf16 run's" in notes[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        startup_checks(load_config("pair_tiny_gpt"))
    assert not any("mismatch_token_mult_prob_error" in r.getMessage() for r in caplog.records)


def test_a_cpu_kv_cache_too_small_for_one_sequence_is_refused_naming_the_key():
    """Issue #41: vLLM took such a config and failed inside its start. llama_tiny's longest sequence is 128 + 96 + 1
    = 225 tokens, two blocks of 128 = 256 tokens × K and V of 4 layers × 2 KV heads × 64 × 4 bytes (fp32) = 1 MiB."""
    from nemo_hacpo.config import ConfigError

    with pytest.raises(ConfigError) as err:
        startup_checks(load_config("pair_tiny", ["agents.0.rollout.cpu_kvcache_gib=0.0009"]))
    assert [issue.key for issue in err.value.issues] == ["agents[0].rollout.cpu_kvcache_gib"]
    assert "cannot hold one 256-token sequence of llama_tiny (1.0 MiB" in err.value.issues[0].problem
    assert err.value.issues[0].fix == "use at least 0.001"
    startup_checks(load_config("pair_tiny", ["agents.0.rollout.cpu_kvcache_gib=0.001"]))  # 1.07 MB ≥ 1 MiB: fits

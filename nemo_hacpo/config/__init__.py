"""The typed, validated configuration of a nemo_hacpo run.

Hydra composes the YAML files under `conf/`; `validate(cfg)` turns the composed result into the frozen
dataclasses of `schema` and checks every rule that can be checked before a process starts (`checks`). Any
problem — unknown key, wrong type, impossible combination — raises one `ConfigError` that lists each offending
key with the fix. Every field carries a docstring (`describe()` prints them).

    cfg = load_config("pair_tiny", ["algo=gspo", "agents.0.optimizer.lr=1e-4"])

- :mod:`~nemo_hacpo.config.schema` — the dataclasses (`HacpoConfig` and its parts).
- :mod:`~nemo_hacpo.config.typed` — YAML values → typed dataclasses, every type error reported at once.
- :mod:`~nemo_hacpo.config.checks` — the rules between fields (`validate`).
- :mod:`~nemo_hacpo.config.loading` — Hydra composition, a run's saved config, `describe`.
"""

from nemo_hacpo.config.checks import validate
from nemo_hacpo.config.loading import CONF_DIR, compose, describe, dump_config, load_config, load_run_config
from nemo_hacpo.config.schema import (
    AblationConfig,
    AgentConfig,
    AlgoConfig,
    ArithmeticNumbers,
    ClusterConfig,
    DataConfig,
    DatasetConfig,
    HacpoConfig,
    ModelSource,
    OptimizerConfig,
    ParallelConfig,
    PrecisionConfig,
    RewardConfig,
    RolloutConfig,
    RuntimeConfig,
    TinyModelSpec,
    TokenizerConfig,
    WarmStartConfig,
)
from nemo_hacpo.config.typed import ConfigError, ConfigIssue

__all__ = [
    "CONF_DIR", "AblationConfig", "AgentConfig", "AlgoConfig", "ArithmeticNumbers", "ClusterConfig", "ConfigError", "ConfigIssue",
    "DataConfig", "DatasetConfig", "HacpoConfig", "ModelSource", "OptimizerConfig", "ParallelConfig",
    "PrecisionConfig", "RewardConfig", "RolloutConfig", "RuntimeConfig", "TinyModelSpec", "TokenizerConfig",
    "WarmStartConfig", "compose", "describe", "dump_config", "load_config", "load_run_config", "validate",
]

"""Cross-model rollout broker: tokenizer-neutral trajectories and per-learner re-encoding (algorithm.md §4, §7).

- :mod:`~nemo_hacpo.broker.trajectory` — `Trajectory` (text + scalars), JSONL read/write.
- :mod:`~nemo_hacpo.broker.reencode` — `reencode_for_learner`, batched re-encoding.
- :mod:`~nemo_hacpo.broker.reencode_pool` — the same in worker processes.
- :mod:`~nemo_hacpo.broker.broker` — `Broker.step`: capability update, advantages, every learner's `TrainingRows`.
"""

from nemo_hacpo.broker.broker import AgentRollout, Broker, BrokerStep, LearnerTokenizer, advantage_stats
from nemo_hacpo.broker.reencode import ReencodedSample, ReencodeError, reencode_batch, reencode_for_learner
from nemo_hacpo.broker.reencode_pool import ReencodePool
from nemo_hacpo.broker.trajectory import Trajectory, read_jsonl, write_jsonl

__all__ = [
    "AgentRollout", "Broker", "BrokerStep", "LearnerTokenizer", "ReencodeError", "ReencodePool", "ReencodedSample",
    "Trajectory", "advantage_stats", "read_jsonl", "reencode_batch", "reencode_for_learner", "write_jsonl",
]

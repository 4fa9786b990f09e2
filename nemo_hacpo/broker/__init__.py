"""Cross-model rollout broker: tokenizer-neutral trajectories and per-learner re-encoding (spec §4, §7).

- :mod:`~nemo_hacpo.broker.trajectory` — `Trajectory` (text + scalars), JSONL read/write.
- :mod:`~nemo_hacpo.broker.reencode` — chat-template rendering, `reencode_for_learner`, batched re-encoding.
- :mod:`~nemo_hacpo.broker.pool` — the same in worker processes.
- :mod:`~nemo_hacpo.broker.broker` — `Broker.step`: capability update, advantages, per-learner views.
"""

from nemo_hacpo.broker.broker import (
    AgentRollout,
    Broker,
    BrokerStep,
    LearnerTokenizer,
    LearnerView,
    broker_mode,
)
from nemo_hacpo.broker.pool import ReencodePool
from nemo_hacpo.broker.reencode import (
    ReencodedSample,
    ReencodeError,
    reencode_batch,
    reencode_for_learner,
    render_prompt_ids,
    render_prompt_text,
)
from nemo_hacpo.broker.trajectory import Message, Trajectory, read_jsonl, write_jsonl

__all__ = [
    "AgentRollout", "Broker", "BrokerStep", "LearnerTokenizer", "LearnerView", "Message", "ReencodeError",
    "ReencodePool", "ReencodedSample", "Trajectory", "broker_mode", "read_jsonl", "reencode_batch",
    "reencode_for_learner", "render_prompt_ids", "render_prompt_text", "write_jsonl",
]

"""Ray runtime: per-agent worker groups, the HACPO step loop, warm start, checkpoints, metrics, the plan.

`train(cfg)` runs a whole configured training; see `loop.py` for the step and `groups.py` for the actors.
"""


def train(cfg):
    """Run the configured training to the end (imports Ray, Megatron and vLLM lazily)."""
    from nemo_hacpo.runtime.loop import train as _train

    return _train(cfg)


__all__ = ["train"]

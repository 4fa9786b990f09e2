"""nemo_hacpo: train several heterogeneous LLMs together with HACPO on Megatron-core and vLLM.

The algorithm, formula by formula with every choice the paper leaves open, is docs/algorithm.md; docstrings
cite it as `algorithm.md §N`. Packages, bottom layer first (each imports only from the layers below it):
`reporting` (tables, plots), `algo` (the maths, the algorithm registry, the row type), `config` (typed config),
`data` (prompts), `rewards` (math-verify), `models` (architectures, tokenizers, chat rendering, HF conversion),
`broker` (text trajectories, per-learner re-encoding and rows), `training` (Megatron trainer), `rollout`
(vLLM engine), `eval` (evaluation), `runtime` (Ray workers and the step loop).
"""

__version__ = "0.1.0"

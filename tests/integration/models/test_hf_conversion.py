"""HF ↔ Megatron weights on tiny random models of every supported family, at TP = 1, TP = 2 and PP = 2.

For each family (tests/helpers/hf_models.py: Llama with Llama-3.1 RoPE scaling, Mistral, Qwen2 with QKV bias
and tied embeddings, Qwen3 with QK-norm, GPT-2 with Conv1D weights and learned positions), the HF model is
saved as safetensors and imported into a Megatron `GPTModel` built from its config.json:
  * Megatron's logits (gathered over TP, on the last PP stage) match transformers' within 1e-4 in fp32
    (measured: ≤ 3e-6) and the padded vocabulary columns are exactly 0;
  * export(import(w)) == w: same names, `torch.equal` per tensor (every PP rank yields every tensor);
  * `save_hf_checkpoint` output reloads in transformers with identical weights and logits.
TP = 1 runs in this process; TP = 2 and PP = 2 run in one spawn of 2 gloo processes that checks all of it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.distributed import run_distributed
from tests.helpers.hf_models import FAMILIES, VOCAB_SIZE, random_token_ids, tiny_hf_causal_lm
from tests.helpers.megatron_setup import megatron_parallel_state

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU layout (local spec, gloo); GPU runs use tests/gpu"),
]

LOGIT_ATOL = 1e-4
BATCH, SEQ_LEN = 2, 24
PP2_FAMILIES = ("llama", "qwen2", "gpt2")  # untied; tied + QKV bias; tied + learned positions + biases


@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """family → directory with config.json + safetensors (Qwen2's split into shards with an index json)."""
    root = tmp_path_factory.mktemp("hf_checkpoints")
    paths = {}
    for family in FAMILIES:
        paths[family] = root / family
        shard_size = "200KB" if family == "qwen2" else "1GB"
        tiny_hf_causal_lm(family).save_pretrained(str(paths[family]), max_shard_size=shard_size)
    assert (paths["qwen2"] / "model.safetensors.index.json").is_file()
    return paths


@pytest.fixture(scope="module")
def hf_references(hf_checkpoints: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """family → {"logits": [B, S, V] of transformers, "weights": the checkpoint's tensors by name}."""
    import transformers
    from safetensors.torch import load_file

    input_ids = random_token_ids(BATCH, SEQ_LEN)
    references = {}
    for family, path in hf_checkpoints.items():
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
        with torch.no_grad():
            logits = model(input_ids).logits
        weights = {name: tensor for file in sorted(path.glob("*.safetensors")) for name, tensor in
                   load_file(str(file)).items()}
        # Logits of O(1): a 1e-4 tolerance is meaningful (a mis-mapped tensor moves them by ≫ 1e-2).
        assert logits.std() > 0.3
        references[family] = {"logits": logits, "weights": weights, "input_ids": input_ids}
    return references


def _megatron_model(arch, tp: int = 1, pp: int = 1):
    from megatron.core import parallel_state

    from nemo_hacpo.config import ParallelConfig, PrecisionConfig
    from nemo_hacpo.models.architecture import build_gpt_model, transformer_config

    config = transformer_config(arch, ParallelConfig(tp=tp, pp=pp), PrecisionConfig())
    return build_gpt_model(arch, config, pre_process=parallel_state.is_pipeline_first_stage(),
                           post_process=parallel_state.is_pipeline_last_stage())


@torch.no_grad()
def _megatron_logits(model, input_ids: torch.Tensor) -> torch.Tensor | None:
    """Full-vocabulary logits [B, S, V_padded] on the last PP stage (None elsewhere), gathered over TP.

    Under PP the first stage sends its hidden states [S, B, H] to the next one, as the schedules do.
    """
    from megatron.core import parallel_state, tensor_parallel

    position_ids = torch.arange(input_ids.shape[1]).expand_as(input_ids)
    if not parallel_state.is_pipeline_first_stage():
        hidden = torch.empty(input_ids.shape[1], input_ids.shape[0], model.config.hidden_size)
        torch.distributed.recv(hidden, src=parallel_state.get_pipeline_model_parallel_prev_rank())
        model.set_input_tensor(hidden)
    output = model(input_ids, position_ids, None)
    if not parallel_state.is_pipeline_last_stage():
        torch.distributed.send(output.contiguous(), dst=parallel_state.get_pipeline_model_parallel_next_rank())
        return None
    return tensor_parallel.gather_from_tensor_model_parallel_region(output)


def _exported(model, arch, parallel=None) -> dict[str, torch.Tensor]:
    from nemo_hacpo.models.hf_conversion import SINGLE_RANK, export_hf_weights

    return {name: tensor.clone() for name, tensor in export_hf_weights(model, arch, parallel=parallel or SINGLE_RANK)}


def _assert_same_weights(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(actual) == sorted(expected)
    different = [name for name in expected if not torch.equal(actual[name], expected[name])]
    assert not different, f"exported tensors differ from the checkpoint: {different}"


def _assert_logits_match(logits: torch.Tensor, reference: torch.Tensor) -> float:
    """Megatron's padded vocabulary columns are 0; the others match transformers within LOGIT_ATOL."""
    assert logits.shape[-1] > VOCAB_SIZE
    assert torch.equal(logits[..., VOCAB_SIZE:], torch.zeros_like(logits[..., VOCAB_SIZE:]))
    torch.testing.assert_close(logits[..., :VOCAB_SIZE], reference, rtol=0, atol=LOGIT_ATOL)
    return float((logits[..., :VOCAB_SIZE] - reference).abs().max())


def _reload_and_compare(directory: Path, reference: dict[str, Any]) -> None:
    """transformers reads the saved checkpoint back: same tensors, same logits (bit for bit)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(directory), attn_implementation="eager").eval()
    state = model.state_dict()
    for name, tensor in reference["weights"].items():
        assert torch.equal(state[name], tensor), name
    with torch.no_grad():
        logits = model(reference["input_ids"]).logits
    assert torch.equal(logits, reference["logits"])


# --------------------------------------------------------------------------------------------- TP = 1
@pytest.mark.parametrize("family", FAMILIES)
def test_tp1_import_logits_export_and_save(family: str, hf_checkpoints, hf_references, megatron_world_size_1,
                                           tmp_path: Path) -> None:
    from nemo_hacpo.models.architecture import arch_from_hf
    from nemo_hacpo.models.hf_conversion import load_hf_into_megatron, save_hf_checkpoint

    arch = arch_from_hf(hf_checkpoints[family])
    reference = hf_references[family]
    model = _megatron_model(arch)
    load_hf_into_megatron(model, arch, hf_checkpoints[family])

    _assert_logits_match(_megatron_logits(model, reference["input_ids"]), reference["logits"])
    _assert_same_weights(_exported(model, arch), reference["weights"])

    out_dir = save_hf_checkpoint(model, arch, None, tmp_path / "export")
    assert out_dir == tmp_path / "export" and (out_dir / "model.safetensors").is_file()
    _reload_and_compare(out_dir, reference)


def test_import_from_a_state_dict_equals_import_from_the_directory(hf_checkpoints, megatron_world_size_1) -> None:
    """A transformers `state_dict()` (tied: it repeats the embedding as lm_head.weight) loads the same."""
    import transformers

    from nemo_hacpo.models.architecture import arch_from_hf
    from nemo_hacpo.models.hf_conversion import load_hf_into_megatron

    arch = arch_from_hf(hf_checkpoints["qwen2"])
    from_directory, from_state_dict = _megatron_model(arch), _megatron_model(arch)
    load_hf_into_megatron(from_directory, arch, hf_checkpoints["qwen2"])
    state_dict = transformers.AutoModelForCausalLM.from_pretrained(str(hf_checkpoints["qwen2"])).state_dict()
    assert "lm_head.weight" in state_dict
    load_hf_into_megatron(from_state_dict, arch, state_dict)
    for (name, expected), (_, actual) in zip(from_directory.named_parameters(), from_state_dict.named_parameters(),
                                             strict=True):
        assert torch.equal(actual, expected), name


def test_import_rejects_a_checkpoint_that_does_not_fit(hf_checkpoints, megatron_world_size_1) -> None:
    from nemo_hacpo.models.architecture import arch_from_hf
    from nemo_hacpo.models.hf_conversion import LazySafetensors, load_hf_into_megatron

    arch = arch_from_hf(hf_checkpoints["llama"])
    model = _megatron_model(arch)
    with LazySafetensors(hf_checkpoints["llama"]) as checkpoint:
        weights = dict(checkpoint)
    with pytest.raises(ValueError, match="o_proj.bias"):  # a tensor the architecture has no place for
        load_hf_into_megatron(model, arch, weights | {"model.layers.0.self_attn.o_proj.bias": torch.zeros(256)})
    with pytest.raises(ValueError, match="shape"):
        load_hf_into_megatron(model, arch, weights | {"model.norm.weight": torch.ones(128)})
    del weights["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match="up_proj"):
        load_hf_into_megatron(model, arch, weights)


def test_save_a_tiny_agent_with_its_tokenizer(megatron_world_size_1, tmp_path: Path) -> None:
    """pair_tiny_gpt's two agents, randomly initialised in Megatron, save as HF Llama / GPT-2 checkpoints that
    transformers loads with the tokenizer and the same logits."""
    import transformers

    from nemo_hacpo.config import load_config
    from nemo_hacpo.models.architecture import model_arch
    from nemo_hacpo.models.hf_conversion import save_hf_checkpoint
    from nemo_hacpo.models.tokenizers import load_tokenizer

    for agent in load_config("pair_tiny_gpt").agents:
        tokenizer = load_tokenizer(agent.tokenizer.source, cache_dir=tmp_path / "tokenizers")
        arch = model_arch(agent, tokenizer_vocab=len(tokenizer))
        model = _megatron_model(arch)
        generator = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(0.05 * torch.randn(param.shape, generator=generator))
        input_ids = tokenizer("Question: what is 12 + 30? Answer: 42", return_tensors="pt").input_ids
        logits = _megatron_logits(model, input_ids)[..., : len(tokenizer)]

        out_dir = save_hf_checkpoint(model, arch, tokenizer, tmp_path / agent.name)
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(out_dir), attn_implementation="eager")
        reloaded_tokenizer = transformers.AutoTokenizer.from_pretrained(str(out_dir))
        assert type(hf_model).__name__ == {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel"}[arch.family]
        assert hf_model.config.eos_token_id == tokenizer.eos_token_id
        assert reloaded_tokenizer("Question: what is 12 + 30? Answer: 42").input_ids == input_ids[0].tolist()
        with torch.no_grad():
            hf_logits = hf_model.eval()(input_ids).logits
        assert logits.std() > 0.3
        torch.testing.assert_close(hf_logits, logits, rtol=0, atol=LOGIT_ATOL)


def test_a_save_replaces_an_earlier_export_whole_and_a_failed_save_keeps_it(hf_checkpoints, hf_references,
                                                                            megatron_world_size_1,
                                                                            tmp_path: Path) -> None:
    """An export in three shards, then one in a single file: no shard or index of the first is left beside the
    second (vLLM would read both). A save that fails half-way (after the shards) leaves the last export intact."""
    from nemo_hacpo.models.architecture import arch_from_hf
    from nemo_hacpo.models.hf_conversion import load_hf_into_megatron, save_hf_checkpoint

    arch = arch_from_hf(hf_checkpoints["llama"])
    model = _megatron_model(arch)
    load_hf_into_megatron(model, arch, hf_checkpoints["llama"])
    out = tmp_path / "engines" / "llama"
    save_hf_checkpoint(model, arch, None, out, max_shard_bytes=200_000)
    assert len(list(out.glob("model-*-of-*.safetensors"))) >= 2 and (out / "model.safetensors.index.json").is_file()

    save_hf_checkpoint(model, arch, None, out)
    files = sorted(p.name for p in out.iterdir())
    assert [f for f in files if "safetensors" in f] == ["model.safetensors"], files
    assert sorted(p.name for p in out.parent.iterdir()) == ["llama"]  # no staging or old copy left beside it
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    class TooLargeTokenizer:  # fails the save after every shard is written
        def __len__(self) -> int:
            return arch.vocab_size + 1

    with pytest.raises(ValueError, match="tokenizer has"):
        save_hf_checkpoint(model, arch, TooLargeTokenizer(), out, max_shard_bytes=200_000)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    _reload_and_compare(out, hf_references["llama"])


def _sync_worker(checkpoint: Path, out_dir: Path, sync: bool, checked: Path) -> bool:
    """Two DP ranks export; whether rank 1, on return, finds the export complete. Without `sync`, rank 0's first
    write waits (by construction) until rank 1 has looked, so the race is certain, not a matter of speed."""
    import safetensors.torch

    from nemo_hacpo.models.architecture import arch_from_hf
    from nemo_hacpo.models.hf_conversion import load_hf_into_megatron, save_hf_checkpoint

    arch = arch_from_hf(checkpoint)
    with megatron_parallel_state(tp=1, pp=1):
        model = _megatron_model(arch)
        load_hf_into_megatron(model, arch, checkpoint)
        if torch.distributed.get_rank() == 0 and not sync:
            save_file = safetensors.torch.save_file

            def save_file_after_rank_1_looked(*args, **kwargs):
                deadline = time.monotonic() + 120
                while not checked.exists():
                    assert time.monotonic() < deadline, "rank 1 never looked"
                    time.sleep(0.05)
                return save_file(*args, **kwargs)

            safetensors.torch.save_file = save_file_after_rank_1_looked
        save_hf_checkpoint(model, arch, None, out_dir, sync=sync)
        complete = (out_dir / "config.json").is_file() and (out_dir / "model.safetensors").is_file()
        if torch.distributed.get_rank() == 1:
            checked.touch()
        torch.distributed.barrier()
        return complete


@pytest.mark.slow
def test_sync_returns_on_every_rank_only_once_the_export_is_in_place(hf_checkpoints, tmp_path: Path) -> None:
    """What an engine rank on another node relies on before it starts vLLM on the directory (`AgentRank.save_hf`):
    with `sync=True` rank 1 finds the checkpoint complete on return; without it, not (rank 0 is still writing)."""
    synced = run_distributed(_sync_worker, 2, hf_checkpoints["llama"], tmp_path / "synced", True, tmp_path / "s")
    unsynced = run_distributed(_sync_worker, 2, hf_checkpoints["llama"], tmp_path / "unsynced", False,
                               tmp_path / "u")
    assert synced == [True, True] and unsynced == [True, False]


# --------------------------------------------------------------------------------------------- TP = 2, PP = 2
def _tp2_pp2_worker(checkpoints: dict[str, Path], references: dict[str, dict[str, Any]], out_dir: Path
                    ) -> dict[str, Any]:
    """One rank of the 2-process run: every family at TP = 2, then PP2_FAMILIES at PP = 2, plus one
    `save_hf_checkpoint` in each layout. Returns this rank's max logit errors and export mismatches."""
    from nemo_hacpo.models.architecture import arch_from_hf
    from nemo_hacpo.models.hf_conversion import ModelParallel, load_hf_into_megatron, save_hf_checkpoint

    result: dict[str, Any] = {"logit_error": {}, "export_mismatch": {}}
    for layout, families in (("tp2", FAMILIES), ("pp2", PP2_FAMILIES)):
        tp, pp = (2, 1) if layout == "tp2" else (1, 2)
        with megatron_parallel_state(tp=tp, pp=pp):
            for family in families:
                arch = arch_from_hf(checkpoints[family])
                model = _megatron_model(arch, tp=tp, pp=pp)
                parallel = ModelParallel.from_megatron()
                load_hf_into_megatron(model, arch, checkpoints[family], parallel=parallel)
                logits = _megatron_logits(model, references[family]["input_ids"])
                if logits is not None:
                    result["logit_error"][f"{layout}/{family}"] = _assert_logits_match(
                        logits, references[family]["logits"])
                exported = _exported(model, arch, parallel)
                expected = references[family]["weights"]
                result["export_mismatch"][f"{layout}/{family}"] = sorted(
                    set(exported) ^ set(expected)) + [n for n in expected if n in exported and not torch.equal(
                        exported[n], expected[n])]
                if family == ("llama" if layout == "tp2" else "gpt2"):
                    save_hf_checkpoint(model, arch, None, out_dir / f"{layout}_{family}", parallel=parallel)
    return result


@pytest.mark.slow
def test_tp2_and_pp2_import_export_and_save(hf_checkpoints, hf_references, tmp_path: Path) -> None:
    results = run_distributed(_tp2_pp2_worker, 2, hf_checkpoints, hf_references, tmp_path)

    # TP = 2: both ranks hold the gathered logits; PP = 2: only the last stage (rank 1) has them.
    expected_logits = {f"tp2/{f}" for f in FAMILIES}
    assert set(results[0]["logit_error"]) == expected_logits
    assert set(results[1]["logit_error"]) == expected_logits | {f"pp2/{f}" for f in PP2_FAMILIES}
    assert max(e for r in results for e in r["logit_error"].values()) <= LOGIT_ATOL
    for rank, result in enumerate(results):  # every rank receives every exported tensor, exactly
        assert len(result["export_mismatch"]) == len(FAMILIES) + len(PP2_FAMILIES)
        assert all(not bad for bad in result["export_mismatch"].values()), (rank, result["export_mismatch"])

    _reload_and_compare(tmp_path / "tp2_llama", hf_references["llama"])
    _reload_and_compare(tmp_path / "pp2_gpt2", hf_references["gpt2"])

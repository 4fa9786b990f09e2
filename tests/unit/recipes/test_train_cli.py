"""recipes/train.py as a user runs it: config errors name the key and exit 2; --describe and --cfg job work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "recipes" / "train.py"), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_invalid_config_fails_at_startup_naming_keys():
    proc = _run("agents.0.parallel.tp=3", "algo.delta=2")
    assert proc.returncode == 2
    assert "agents[0].parallel.tp" in proc.stderr and "algo.delta" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cfg_job_prints_resolved_config():
    proc = _run("--cfg", "job", "algo=gspo_x2")
    assert proc.returncode == 0, proc.stderr
    assert "name: gspo_x2" in proc.stdout and "llama_tiny" in proc.stdout


def test_describe_lists_documented_keys():
    proc = _run("--describe")
    assert proc.returncode == 0
    assert "algo.delta_step = 0.025 — " in proc.stdout


def test_compose_errors_are_one_message_not_a_traceback():
    for args, message in ((("--config-name", "nope"), "no config 'nope'"),
                          (("algo=nope",), "algo=nope: no option 'nope' in the config group algo"),
                          (("agents.0.optimizer.lr=[",), "cannot compose config 'pair_tiny'")):
        proc = _run(*args)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_plan_with_zero_sizes_names_the_keys_instead_of_dividing_by_zero():
    proc = _run("--plan", "agents.0.parallel.micro_batch_size=0", "agents.1.parallel.dp=0",
                "agents.0.model.tiny.num_attention_heads=0", "agents.1.model.tiny.num_layers=0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    for key in ("agents[0].parallel.micro_batch_size", "agents[1].parallel.dp",
                "agents[0].model.tiny.num_attention_heads", "agents[1].model.tiny.num_layers"):
        assert key in proc.stderr


def test_cfg_job_validates_before_printing_and_an_unknown_tokenizer_is_named():
    proc = _run("--cfg", "job", "algo.delta=2")
    assert proc.returncode == 2 and proc.stdout == "" and "algo.delta" in proc.stderr
    proc = _run("--plan", "agents.1.tokenizer.source=no-such-tokenizer")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "agents[1].tokenizer.source: tokenizer source 'no-such-tokenizer' is not one of" in proc.stderr


def test_plan_of_checkpoints_without_tokenizer_files(tmp_path):
    """`--plan` on directories that hold only config.json: the plan is printed, with a note naming each directory
    and what it lacks, and exit 0 (before: a transformers traceback). The shapes are Llama-3.3-70B's and Qwen3-8B's."""
    import json
    import os

    from tests.helpers.large_models import LLAMA_33_70B, QWEN3_8B

    env = dict(os.environ)
    for name, hf in (("HACPO_LLAMA70B_PATH", LLAMA_33_70B), ("HACPO_QWEN8B_PATH", QWEN3_8B)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(hf))
        env[name] = str(tmp_path / name)
    env["HACPO_TRAIN_DATA"] = env["HACPO_EVAL_DATA"] = str(tmp_path / "math.jsonl")
    proc = subprocess.run([sys.executable, str(ROOT / "recipes" / "train.py"), "--config-name", "pair_large", "--plan"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    for name in ("HACPO_LLAMA70B_PATH", "HACPO_QWEN8B_PATH"):
        assert f"{tmp_path / name} has no tokenizer files (none of: tokenizer.json" in proc.stdout
    assert proc.stdout.count("its vocabulary check (tokenizer ids ≤ embedding rows) was skipped") == 2
    assert "| llama70b | 61.2 | 71.5 | 41.0 | 50.3 | 71.5 | yes |" in proc.stdout


# ------------------------------------------------------------------- start-up mistakes, measured by a user
# Each: exit status 2, one message naming the key (or environment variable) and the fix, and nothing written.
# In-process `main` (a failure before the workers start takes no Ray); SIGUSR1 is put back after it.
def _train_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_recipe", ROOT / "recipes" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def train_main(capsys):
    """`recipes/train.py`'s main: `(exit status, stderr)` of one call."""
    import signal

    module, usr1 = _train_module(), signal.getsignal(signal.SIGUSR1)

    def run(*argv: str) -> tuple[int, str]:
        try:
            status = module.main(list(argv))
        finally:
            signal.signal(signal.SIGUSR1, usr1)
        err = capsys.readouterr().err
        assert "Traceback" not in err, err
        return status, err

    return run


@pytest.mark.parametrize("split", ["train", "eval"])
def test_a_missing_data_file_names_the_key_and_the_path_before_anything_is_made(train_main, tmp_path, split):
    """Case 1: before, a FileNotFoundError traceback (exit 1) from the data loader, after the output directory
    was made."""
    out = tmp_path / "run"
    status, err = train_main(f"data.{split}.source=jsonl", f"data.{split}.path=/nonexistent.jsonl",
                             f"runtime.output_dir={out}")
    assert status == 2
    assert f"data.{split}.path: no jsonl file at /nonexistent.jsonl (not found;" in err, err
    assert f"point data.{split}.path at a local jsonl file" in err
    assert not out.exists()


def test_an_output_dir_that_is_a_file_is_refused(train_main, tmp_path):
    """Case 2: before, a FileExistsError traceback from mkdir."""
    out = tmp_path / "run.txt"
    out.write_text("not a directory\n")
    status, err = train_main(f"runtime.output_dir={out}")
    assert status == 2
    assert f"runtime.output_dir: {out} is a file, not a directory — fix: choose a directory path" in err, err
    assert out.read_text() == "not a directory\n" and sorted(tmp_path.iterdir()) == [out]
    status, err = train_main(f"runtime.output_dir={out / 'sub'}")  # a file on the way to it
    assert status == 2 and f"{out} is a file, not a directory (the run would create {out / 'sub'} inside it)" in err


def _writable(directory: Path) -> bool:
    import tempfile

    try:
        Path(tempfile.mkdtemp(dir=directory)).rmdir()
    except OSError:
        return False
    return True


@pytest.mark.parametrize("where", ["sysfs", "chmod"])
def test_an_output_dir_that_cannot_be_written_is_refused(train_main, tmp_path, where):
    """Case 3: sysfs refuses a new directory even to root (the tests run as root here, where chmod 0o555 stops
    nothing: the check tries to make a directory, it does not trust the permission bits alone)."""
    import os

    if where == "sysfs":
        parent = Path("/sys")
        if not parent.is_dir() or _writable(parent):
            pytest.skip("no read-only /sys on this machine")
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes through chmod 0o555; the sysfs case covers root")
        parent = tmp_path / "read_only"
        parent.mkdir(mode=0o555)
    out = parent / f"hacpo_startup_test_{os.getpid()}" / "run"
    status, err = train_main(f"runtime.output_dir={out}")
    assert status == 2
    assert f"runtime.output_dir: {parent} is not writable by this process (the run would create {out} inside it)" \
        in err, err
    assert "choose a directory this process can write" in err
    assert not out.parent.exists()


def test_bad_data_leaves_no_output_directory_behind(train_main, tmp_path):
    """Case 4: the data is read and checked before the run makes its directory (before: an empty output_dir was
    left by every data error)."""
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1 + 1?", "answer": "2"}\n{"question": "2 + 2?", "answer": \n')
    out = tmp_path / "run"
    status, err = train_main("data.train.source=jsonl", f"data.train.path={data}", f"runtime.output_dir={out}")
    assert status == 2
    assert f"data.train: {data}:2: not a JSON object" in err and "data.on_invalid=skip" in err, err
    assert not out.exists()


def test_a_misspelt_group_option_lists_the_groups_files(train_main, tmp_path):
    """Case 5: before, Hydra's first line only ("Could not find 'algo/hacop'"), not what there is."""
    out = tmp_path / "run"
    status, err = train_main("algo=hacop", f"runtime.output_dir={out}")
    available = sorted(p.stem for p in (ROOT / "conf" / "algo").glob("*.yaml"))
    assert status == 2 and len(available) >= 6
    assert (f"error: algo=hacop: no option 'hacop' in the config group algo (conf/algo/*.yaml) — fix: choose one of "
            f"{', '.join(available)} (did you mean algo=hacpo?)") in err, err
    assert not out.exists()


def test_unset_environment_variables_are_named_all_at_once(train_main, tmp_path, monkeypatch):
    """Case 6: pair_large reads its checkpoints and data from four variables (`${oc.env:HACPO_…,???}`); before,
    six "mandatory value is not set" lines that never named one."""
    for name in ("HACPO_LLAMA70B_PATH", "HACPO_QWEN8B_PATH", "HACPO_TRAIN_DATA", "HACPO_EVAL_DATA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HACPO_OUTPUT_DIR", str(tmp_path / "run"))
    status, err = train_main("--config-name", "pair_large", "--plan")
    assert status == 2 and "invalid config (4 problem(s))" in err, err
    assert ("HACPO_LLAMA70B_PATH: environment variable not set; the config reads agents[0].model.path, "
            "agents[0].tokenizer.source from it — fix: export HACPO_LLAMA70B_PATH=... before the command, or pass "
            "agents.0.model.path=... agents.0.tokenizer.source=...") in err
    for name, key in (("HACPO_QWEN8B_PATH", "agents[1].model.path"), ("HACPO_TRAIN_DATA", "data.train.path"),
                      ("HACPO_EVAL_DATA", "data.eval.path")):
        assert f"{name}: environment variable not set; the config reads {key}" in err
    assert "mandatory value is not set" not in err
    monkeypatch.setenv("HACPO_TRAIN_DATA", str(tmp_path / "math.jsonl"))  # only the unset ones are named
    status, err = train_main("--config-name", "pair_large", "--plan")
    assert status == 2 and "invalid config (3 problem(s))" in err and "HACPO_TRAIN_DATA" not in err
    assert not (tmp_path / "run").exists()


def test_a_suggested_agent_override_is_one_hydra_accepts(train_main, tmp_path):
    """Case 7: a fix said `pass agents[0].model.path=...`, which Hydra's grammar rejects; pasted back, the dotted
    form composes."""
    import re

    from hydra.errors import HydraException

    from nemo_hacpo.config import compose

    out = tmp_path / "run"
    status, err = train_main("agents.0.model.path=???", f"runtime.output_dir={out}")
    assert status == 2 and "agents[0].model.path: mandatory value is not set — fix: pass agents.0.model.path=..." in err
    (suggested,) = re.findall(r"fix: pass (\S+=)\.\.\.", err)
    assert compose("pair_tiny", [f"{suggested}{tmp_path}"]).agents[0].model.path == str(tmp_path)
    with pytest.raises(HydraException):  # what the message used to suggest
        compose("pair_tiny", [f"agents[0].model.path={tmp_path}"])
    assert not out.exists()


def test_too_few_gpus_names_the_keys_that_decide_the_count(train_main, tmp_path):
    """Case 8: the need is each agent's tp·pp·cp·dp (plus a separate engine's tensor_parallel_size) against
    num_nodes × gpus_per_node; it blamed gpus_per_node, a property of the hardware."""
    out = tmp_path / "run"
    cuda = ["runtime.cluster.device=cuda", "runtime.cluster.gpus_per_node=2", "agents.0.parallel.tp=2",
            "agents.1.parallel.dp=2", f"runtime.output_dir={out}"]
    status, err = train_main(*cuda, "--plan")
    assert status == 2
    assert ("runtime.cluster.num_nodes: the agents' layouts need 4 GPUs (agents[0].parallel tp·pp·cp·dp = 2·1·1·1 = 2; "
            "agents[1].parallel tp·pp·cp·dp = 1·1·1·2 = 2) but runtime.cluster.num_nodes × gpus_per_node = 1 × 2 = 2 "
            "— fix: set runtime.cluster.num_nodes=2, or shrink an agent's layout") in err, err
    assert "runtime.cluster.gpus_per_node:" not in err
    status, _ = train_main(*cuda, "runtime.cluster.num_nodes=2", "--cfg", "job")  # the fix it names
    assert status == 0 and not out.exists()

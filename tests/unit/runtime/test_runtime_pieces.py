"""Pure parts of the runtime: own-rollout assembly (log-prob alignment, mismatch), checkpoint discovery,
warm-start cache keys, dataset sections."""

from __future__ import annotations

import dataclasses
import datetime
import errno
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nemo_hacpo.config import load_config
from nemo_hacpo.data import MathProblem
from nemo_hacpo.data.splits import load_split
from nemo_hacpo.rollout.outputs import GenerationResult, SampledResponse
from nemo_hacpo.runtime.loop import batch_group_ids, own_rollouts
from nemo_hacpo.runtime.run_checkpoint import (
    DRIVER_FILE,
    archive_previous_run,
    checkpoints,
    latest_checkpoint,
    save_run_checkpoint,
)
from nemo_hacpo.runtime.step_log import drop_records_after
from nemo_hacpo.runtime.warmstart import warm_start_key, warm_start_seed
from nemo_hacpo.runtime.worker import OldLogprobs
from nemo_hacpo.training.checkpoint_files import bytes_record


def _response(b, g, ids, text, reason, logprobs):
    return SampledResponse(prompt_index=b, sample_index=g, token_ids=ids, text=text, finish_reason=reason,
                           logprobs=logprobs)


def test_own_rollouts_carry_the_trainers_m_old_and_the_agents_metrics():
    problems = [MathProblem(id="p0", question="q", answer="7", level=1, solution="", source="t", expression=None)]
    messages = [[{"role": "user", "content": "q"}]]
    # prompt of 3 tokens, two responses of 2 and 3 tokens
    generation = GenerationResult(prompt_token_ids=[[10, 11, 12]], seeds=[0], responses=[[
        _response(0, 0, [5, 2], "7", "stop", [-1.0, -0.5]),
        _response(0, 1, [6, 7, 8], "x", "length", [-2.0, -2.0, -2.0])]])
    old = OldLogprobs(mean=[-0.8, -2.1], mismatch=1.25)
    rollouts, metrics = own_rollouts("a", problems, messages, generation, [1.0, 0.0], old, step=3)
    assert [r.trajectory.source_mean_logprob for r in rollouts] == [-0.8, -2.1]
    assert rollouts[0].token_ids == [10, 11, 12, 5, 2] and rollouts[0].response_mask == [0, 0, 0, 1, 1]
    assert rollouts[1].trajectory.finish_reason == "length" and rollouts[1].trajectory.source_num_tokens == 3
    assert rollouts[0].trajectory.metadata == {"level": "1"} and rollouts[0].old_token_logprobs is None
    assert metrics == {"reward_mean": 0.5, "truncation_rate": 0.5, "response_length_mean": 2.5,
                       "response_length_max": 3.0, "mismatch_token_mult_prob_error": 1.25}


def test_a_problem_twice_in_one_batch_forms_two_prompt_groups(tmp_path):
    """A batch that runs into the next epoch (or B > data set) can repeat a problem; the broker must see two
    groups, not one prompt with two responses per sample index (which it rejects)."""
    from nemo_hacpo.algo import ALGORITHMS
    from nemo_hacpo.broker import Broker, LearnerTokenizer
    from nemo_hacpo.models.tokenizers import load_tokenizer

    p0 = MathProblem(id="p0", question="Ann has 2 pens and buys 3 more. How many pens?", answer="5", level=1,
                     solution="", source="t", expression=None)
    p1 = dataclasses.replace(p0, id="p1", question="Bob has 9 cups and breaks 4. How many?", answer="5")
    problems = [p0, p1, p0]
    assert batch_group_ids(problems) == ["p0", "p1", "p0#1"]
    assert batch_group_ids([p0, p0, p0]) == ["p0", "p0#1", "p0#2"]

    tok = {"a": load_tokenizer("tiny-bpe", cache_dir=tmp_path), "b": load_tokenizer("tiny-unigram", cache_dir=tmp_path)}
    messages = [[{"role": "user", "content": p.question}] for p in problems]
    rollouts = {}
    for agent, tokenizer in tok.items():
        prompt_ids = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True) for m in messages]
        ids = tokenizer("\\boxed{5}", add_special_tokens=False)["input_ids"]
        generation = GenerationResult(prompt_token_ids=prompt_ids, seeds=[0] * 3, responses=[
            [_response(b, g, ids, "\\boxed{5}", "stop", [-0.5] * len(ids)) for g in range(2)] for b in range(3)])
        old = OldLogprobs(mean=[-0.5] * 6, mismatch=1.0)
        rollouts[agent], _ = own_rollouts(agent, problems, messages, generation, [1.0, 0.0] * 3, old, 1)
    assert [r.trajectory.prompt_id for r in rollouts["a"]] == ["p0", "p0", "p1", "p1", "p0#1", "p0#1"]
    broker = Broker(["a", "b"], {a: LearnerTokenizer(t, 64) for a, t in tok.items()}, algorithm=ALGORITHMS["hacpo"])
    step = broker.step(rollouts)
    # 3 prompt groups × 2 samples of its own, then 3 × 2 of b's: the repeat is a group of its own
    assert step.counts["a"]["self_rows"] == 6 and step.counts["a"]["cross_rows"] == 6
    # rewards [1, 0] in every group of both agents: each group has its own baseline, so the advantages repeat
    adv = step.rows["a"].advantages
    assert torch.allclose(adv[:2], adv[2:4]) and torch.allclose(adv[:2], adv[4:6]) and adv[0] > 0 > adv[1]


def test_checkpoint_discovery_ignores_partial_saves(tmp_path):
    root = tmp_path / "checkpoints"
    for name, complete in (("step_000005", True), ("step_000010", True), ("step_000015.tmp", True),
                           ("step_000020", False)):
        (root / name).mkdir(parents=True)
        if complete:
            (root / name / DRIVER_FILE).write_text(json.dumps({"step": int(name[5:11])}))
    assert [c.step for c in checkpoints(tmp_path)] == [5, 10, 20]  # a .tmp folder is not a checkpoint
    latest = latest_checkpoint(tmp_path)  # step 20 has no driver state: moved aside
    assert [c.step for c in checkpoints(tmp_path)] == [5, 10]
    assert latest.step == 10 and latest.load_driver_state() == {"step": 10}
    assert latest.agent_dir("a") == root / "step_000010" / "agents" / "a"
    assert latest_checkpoint(tmp_path / "nothing") is None


class _SavingGroup:
    """Stands in for an AgentGroup in save_run_checkpoint: `save_checkpoint` writes a file where the trainer
    would, and its pending call returns nothing."""

    def save_checkpoint(self, path, step, digest=None):
        Path(path).mkdir(parents=True)
        (Path(path) / "weights").write_text(str(step))
        return SimpleNamespace(result=lambda: {"weights": bytes_record(str(step).encode(), digest)})


def test_keep_last_n_never_prunes_the_checkpoint_just_written(tmp_path):
    groups = {"a": _SavingGroup()}
    for step in (1, 2, 3):
        save_run_checkpoint(tmp_path, step, {"step": step}, groups, keep=2)
    assert [c.step for c in checkpoints(tmp_path)] == [2, 3]
    # checkpoints of higher steps lying there (another run's) do not push out the one just written
    save_run_checkpoint(tmp_path, 9, {"step": 9}, groups, keep=0)
    save_run_checkpoint(tmp_path, 4, {"step": 4}, groups, keep=2)
    assert [c.step for c in checkpoints(tmp_path)] == [3, 4, 9]
    save_run_checkpoint(tmp_path, 5, {"step": 5}, groups, keep=3)  # keep 3: two earlier ones stay
    assert [c.step for c in checkpoints(tmp_path)] == [3, 4, 5, 9]


def test_starting_over_moves_the_earlier_run_aside(tmp_path):
    assert archive_previous_run(tmp_path) is None  # nothing there: nothing moved
    save_run_checkpoint(tmp_path, 5, {"step": 5}, {"a": _SavingGroup()})
    (tmp_path / "metrics.jsonl").write_text('{"step": 5}\n')
    (tmp_path / "config.yaml").write_text("x: 1\n")
    (tmp_path / "notes.txt").write_text("the user's own file\n")
    moved = archive_previous_run(tmp_path)
    assert moved.parent == tmp_path / "previous"
    assert sorted(p.name for p in moved.iterdir()) == ["checkpoints", "config.yaml", "metrics.jsonl"]
    assert latest_checkpoint(tmp_path) is None and latest_checkpoint(moved).step == 5  # intact, just elsewhere
    assert (tmp_path / "notes.txt").is_file() and not (tmp_path / "config.yaml").exists()
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    assert archive_previous_run(tmp_path) != moved  # a second start-over in the same second gets its own folder


def test_resume_drops_metrics_logged_after_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert drop_records_after(path, 3) == 0  # no file yet
    path.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in range(6)) + '{"step": 6, "x"')
    assert drop_records_after(path, 3) == 3  # steps 4, 5 and the torn last line
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2, 3]
    assert drop_records_after(path, 3) == 0 and not (tmp_path / "metrics.jsonl.tmp").exists()


def test_warm_start_seed_follows_the_agents_place_in_the_config_not_the_cache():
    pair = load_config("pair_tiny_gpt")
    assert [warm_start_seed(a, pair) for a in pair.agents] == [pair.warmstart.seed, pair.warmstart.seed + 1000]
    # the same agent at another place starts from another initialisation: another cache entry
    pair_gpt = pair.agents[1]
    moved = dataclasses.replace(pair, agents=[pair.agents[1], pair.agents[0]])
    assert warm_start_seed(pair_gpt, moved) == pair.warmstart.seed
    assert warm_start_key(pair_gpt, moved) != warm_start_key(pair_gpt, pair)


def test_warm_start_key_tracks_what_shapes_the_checkpoint():
    base = load_config("pair_tiny_gpt")
    key = warm_start_key(base.agents[0], base)
    assert key == warm_start_key(load_config("pair_tiny_gpt", ["agents.0.optimizer.lr=0.5"]).agents[0], base)  # RL lr
    assert key == warm_start_key(base.agents[0], load_config("pair_tiny_gpt", ["warmstart.cache_dir=/elsewhere"]))
    assert key == warm_start_key(  # how checkpoints are written does not shape the weights
        load_config("pair_tiny_gpt", ["agents.0.optimizer.checkpoint_format=dp_reshardable"]).agents[0], base)
    assert key != warm_start_key(load_config("pair_tiny_gpt", ["agents.0.model.tiny.num_layers=2"]).agents[0], base)
    assert key != warm_start_key(base.agents[0], load_config("pair_tiny_gpt", ["warmstart.steps=10"]))
    assert key != warm_start_key(base.agents[1], base)


def test_warm_start_key_follows_the_task_it_teaches():
    """The warm start learns `data.train`'s task and its answer-style mix: another mix, other number ranges or
    other levels are another checkpoint; the held-out split is not."""
    base = load_config("pair_tiny_gpt")
    key = warm_start_key(base.agents[0], base)
    for change in ("warmstart.direct_answer_fraction=0.5", "data.train.numbers.max_value=20", "data.train.levels=[1,2]"):
        assert warm_start_key(base.agents[0], load_config("pair_tiny_gpt", [change])) != key, change
    assert warm_start_key(base.agents[0], load_config("pair_tiny_gpt", ["data.eval.levels=[1,2,3,4]"])) == key


def test_warm_start_corpus_answers_a_seeded_fraction_directly():
    from nemo_hacpo.runtime.warmstart import warm_start_corpus

    overrides = ["warmstart.num_problems=200", "warmstart.direct_answer_fraction=0.25", "data.train.levels=[2,3]",
                 "data.train.numbers.max_value=20", "data.train.numbers.max_start=9"]
    prompts, solutions = warm_start_corpus(load_config("pair_tiny_gpt", overrides))
    direct = [s for s in solutions if "=" not in s]
    assert len(prompts) == len(solutions) == 200 and len(direct) == 50  # round(0.25 · 200), exactly
    assert all(re.fullmatch(r"The answer is \\boxed\{\d+\}", s) for s in direct)
    worked = [s for s in solutions if "=" in s]
    assert all(s.count(" = ") in (2, 3) for s in worked)  # data.train's levels
    assert all(int(n) <= 20 for s in worked for n in re.findall(r"= (\d+)", s))  # and its number ranges
    again = warm_start_corpus(load_config("pair_tiny_gpt", overrides))
    assert again == (prompts, solutions)  # seeded: every run and every agent gets the same corpus
    plain = warm_start_corpus(load_config("pair_tiny_gpt", ["warmstart.num_problems=200"]))[1]
    assert all("=" in s for s in plain)  # the default: every solution worked


def test_warm_start_corpus_stops_a_seeded_fraction_of_multi_step_problems_early():
    from nemo_hacpo.data.arithmetic import generate_problems
    from nemo_hacpo.runtime.warmstart import warm_start_corpus

    cfg = load_config("pair_tiny_gpt", ["warmstart.num_problems=300", "warmstart.stop_early_fraction=0.6",
                                        "warmstart.direct_answer_fraction=0.1"])
    problems = generate_problems("train", 300, seed=cfg.warmstart.seed)
    _, solutions = warm_start_corpus(cfg)
    multi = sum(p.level > 1 for p in problems)
    direct = [i for i, s in enumerate(solutions) if "=" not in s]
    early = [i for i, (p, s) in enumerate(zip(problems, solutions, strict=True))
             if "=" in s and s.count(" = ") < p.level]
    assert len(direct) == 30  # round(0.1 · 300) of all problems
    assert len(early) == round(0.6 * multi) and all(problems[i].level > 1 for i in early)
    assert all(solutions[i].count(" = ") == 1 for i in early)  # cut after the first operation
    assert not set(direct) & set(early)  # one style per solution
    finished = [i for i in range(300) if i not in direct and i not in early]
    assert all(solutions[i] == problems[i].solution for i in finished)


def test_warm_start_key_follows_the_tokenizer_recipe(monkeypatch, tmp_path):
    """A retrained tiny tokenizer (new recipe → new vocabulary) must not reuse weights warm-started on the old
    one: the key carries the tokenizer directory's recipe fingerprint."""
    import nemo_hacpo.models.tokenizers as tokenizers

    monkeypatch.setattr(tokenizers, "default_cache_dir", lambda: tmp_path)
    base = load_config("pair_tiny_gpt")
    key = warm_start_key(base.agents[0], base)
    assert key == warm_start_key(base.agents[0], base)
    monkeypatch.setattr(tokenizers, "RECIPE_VERSION", tokenizers.RECIPE_VERSION + 1)
    assert warm_start_key(base.agents[0], base) != key


def test_dataset_sections(tmp_path):
    cfg = load_config("pair_tiny_gpt", ["data.train.size=30", "data.eval.size=10", "data.eval.limit=4"])
    train, held_out = load_split(cfg.data.train, "train"), load_split(cfg.data.eval, "eval")
    assert len(train) == 30 and len(held_out) == 4
    assert not {p.question for p in train} & {p.question for p in held_out}
    path = tmp_path / "math.jsonl"
    path.write_text("\n".join(json.dumps({"problem": f"{i} + 1?", "solution_answer": str(i + 1)}) for i in range(3)))
    cfg = load_config("pair_tiny_gpt", ["data.train.source=jsonl", f"data.train.path={path}",
                                    "data.train.question_field=problem", "data.train.answer_field=solution_answer"])
    assert [p.answer for p in load_split(cfg.data.train, "train")] == ["1", "2", "3"]


def test_use_algorithm_guards(tmp_path):
    """Switching algorithms needs started workers, and a KL term needs the reference model they were built with."""
    import dataclasses
    from types import SimpleNamespace

    from nemo_hacpo.runtime.loop import HacpoRun

    cfg = load_config("pair_tiny_gpt", [f"runtime.output_dir={tmp_path}", "data.train.size=8", "data.eval.size=2"])
    run = HacpoRun(cfg)
    with pytest.raises(RuntimeError, match="needs a started run"):
        run.use_algorithm(cfg.algo)
    no_kl = dataclasses.replace(load_config("pair_tiny_gpt", ["algo=gspo"]).algo, kl_coef=0.0)
    run.groups = {a: SimpleNamespace(keep_reference=False) for a in run.agents}  # workers without a reference
    run.cfg = dataclasses.replace(cfg, algo=no_kl)  # ... as started for gspo without KL
    with pytest.raises(ValueError, match=r"kl_coef=0.001 .* no reference model .*'gspo'"):
        run.use_algorithm(cfg.algo)
    run.use_algorithm(no_kl)  # the algorithm they were built for
    assert (run.samples_per_prompt, run.cfg.algo) == (no_kl.samples_per_prompt, no_kl)
    assert not run.broker.algorithm.shares_rollouts and run.cfg.agents == cfg.agents

    run.groups = {a: SimpleNamespace(keep_reference=True) for a in run.agents}  # workers that keep a reference
    x2 = load_config("pair_tiny_gpt", ["algo=gspo_x2"]).algo
    run.use_algorithm(x2)
    assert (run.broker.algorithm.name, run.samples_per_prompt) == ("gspo_x2", 2 * cfg.algo.group_size)
    run.use_algorithm(cfg.algo)  # back to HACPO: a sharing broker over every agent's tokenizer, same tracker
    assert run.broker.algorithm == cfg.algo.algorithm and run.samples_per_prompt == cfg.algo.group_size
    assert run.broker.tracker is run.tracker and set(run.broker.tokenizers) == set(run.agents)


def _bind(port: int) -> None:
    import socket

    with socket.socket() as other:
        other.bind(("", port))


def test_rank_zero_listens_on_its_rendezvous_port_from_the_moment_it_names_it(tmp_path):
    from torch.distributed import TCPStore

    from nemo_hacpo.runtime.worker import AgentRank

    cfg = load_config("pair_tiny_gpt", ["warmstart.enabled=false"])
    rank = AgentRank(cfg.agents[0], 0, seed=0, run_dir=str(tmp_path), total_updates=1, keep_reference=False,
                     collective_timeout_s=10)
    host, port = rank.address()
    with pytest.raises(OSError) as taken:  # nobody else can bind it while the driver passes it to every rank
        _bind(port)
    assert taken.value.errno == errno.EADDRINUSE
    # it is the store itself: another rank connects and sees what rank 0 writes
    client = TCPStore(host, port, world_size=1, is_master=False, timeout=datetime.timedelta(seconds=10))
    rank._store.set("hello", "world")
    assert client.get("hello") == b"world"
    del client
    _, second = rank.address()  # asking again replaces the store and frees the first port
    assert second != port
    _bind(port)


def test_ranks_go_node_by_node_whatever_order_ray_placed_the_bundles():
    from nemo_hacpo.runtime.groups import ranks_by_node

    assert ranks_by_node({0: "a", 1: "a", 2: "a"}) == [0, 1, 2]  # one node: rank r on bundle r
    # PACK put bundles 0, 2, 4, 6 on node a and 1, 3, 5, 7 on node b: TP=4 groups of ranks 0-3 and 4-7 each
    # land on one node
    interleaved = {b: "ab"[b % 2] for b in range(8)}
    order = ranks_by_node(interleaved)
    assert order == [0, 2, 4, 6, 1, 3, 5, 7]
    assert {interleaved[b] for b in order[:4]} == {"a"} and {interleaved[b] for b in order[4:]} == {"b"}



def test_a_prompt_too_long_for_any_agent_stops_the_start_naming_file_and_line(tmp_path):
    from nemo_hacpo.data.validation import DataError
    from nemo_hacpo.runtime.loop import HacpoRun

    data = tmp_path / "train.jsonl"
    rows = [{"question": f"Ann has {i} pens and buys 2 more. How many pens?", "answer": str(i + 2)} for i in range(5)]
    rows[3]["question"] = "How many pens? " * 40  # ~200 tokens: over llama_tiny's 128
    data.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    overrides = [f"runtime.output_dir={tmp_path / 'run'}", "data.train.source=jsonl", f"data.train.path={data}",
                 "data.eval.size=2"]
    with pytest.raises(DataError) as info:
        HacpoRun(load_config("pair_tiny_gpt", overrides))
    (issue,) = info.value.issues
    assert issue.key == "data.train" and issue.problem.startswith(f"{data}:4: prompt too long in tokens (llama_tiny: ")
    assert "> 128" in issue.problem
    run = HacpoRun(load_config("pair_tiny_gpt", [*overrides, "data.on_invalid=skip"]))
    assert [p.origin for p in run.train_set.problems] == [f"{data}:{line}" for line in (1, 2, 3, 5)]


def test_the_sigterm_handler_interrupts_as_a_keyboard_interrupt_and_names_the_signal():
    """Ray's blocking calls pass a KeyboardInterrupt from a signal handler through unchanged (any other exception
    becomes a SystemError), so the stop must be one; the handler remembers which signal it was."""
    import signal

    from nemo_hacpo.runtime.loop import Terminated, _StopSignal

    handler = _StopSignal()
    assert handler.received is None
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            signal.raise_signal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert isinstance(caught.value, Terminated) and not isinstance(caught.value, Exception)
    assert handler.received == "SIGTERM"
    handler(signal.SIGTERM, None)  # a second SIGTERM during the stop (srun passes on the job's and the trap's):
    assert handler.received == "SIGTERM"  # ignored, so the stop message and the shutdown run to the end


def test_refit_hands_cached_memory_back_before_each_engine_wake(tmp_path, monkeypatch):
    """Colocated CUDA order: the allocator's cache is emptied before the engine re-allocates its weights, and
    again (the refit's gather buffers) before its KV cache. Recorded on CPU with the allocator call replaced."""
    import nemo_hacpo.models.hf_conversion as hf_conversion
    from nemo_hacpo.rollout.engine_group import EngineGroup
    from nemo_hacpo.rollout.refit import RpcRefit
    from nemo_hacpo.runtime import worker
    from nemo_hacpo.runtime.worker import AgentRank

    events: list[str] = []

    def weights(*args, **kwargs):
        events.append("export")
        yield "model.norm.weight", torch.ones(4)

    class Engine:
        def wake_up(self, tags):
            events.append(f"wake {tags[0]}")

        def refit(self, pairs, *, chunk_bytes):
            events.extend(f"load {name}" for name, _ in pairs)
            return "stats"

    monkeypatch.setattr(hf_conversion, "export_hf_weights", weights)
    monkeypatch.setattr(worker.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(worker.torch.cuda, "empty_cache", lambda: events.append("empty_cache"))
    cfg = load_config("pair_tiny_gpt", ["warmstart.enabled=false"])
    rank = AgentRank(cfg.agents[0], 0, seed=0, run_dir=str(tmp_path), total_updates=1, keep_reference=False)
    rank.trainer = SimpleNamespace(module=None, model_parallel=None)
    rank.arch, rank.engine = None, Engine()
    rank.refit_strategy = RpcRefit(0, [0], 1 << 20)  # what setup() picks for rollout.refit_transport: rpc
    rank.engine_group = EngineGroup(0)  # alone: no barrier to wait at (the group's order: test_engine_transitions)
    assert rank.refit() == "stats"
    assert events == ["empty_cache", "wake weights", "export", "load model.norm.weight", "empty_cache",
                      "wake kv_cache"]


def test_an_agents_own_warm_start_changes_only_its_key_and_leaves_the_default_keys_alone():
    """`agents[i].warmstart` overrides the run's warm start for that agent: its key (another checkpoint) and its
    settings change; the other agent's and every agent without overrides keep the keys they had — the pinned
    pair_tiny keys are those the default run's cache was written under."""
    from nemo_hacpo.runtime.warmstart import agent_warm_start

    base = load_config("pair_tiny")
    assert [warm_start_key(a, base) for a in base.agents] == ["b139c83431f9", "a7048e1c61cc"]
    for override, field, value in (("steps=100", "steps", 100), ("narrated_fraction=1.0", "narrated_fraction", 1.0),
                                   ("stop_early_fraction=0.1", "stop_early_fraction", 0.1)):
        cfg = load_config("pair_tiny", [f"agents.1.warmstart.{override}"])
        assert getattr(agent_warm_start(cfg.agents[1], cfg), field) == value
        assert agent_warm_start(cfg.agents[0], cfg) == cfg.warmstart == base.warmstart
        assert warm_start_key(cfg.agents[0], cfg) == "b139c83431f9"
        assert warm_start_key(cfg.agents[1], cfg) != "a7048e1c61cc", override
    # an override equal to the run's value is the same warm start
    same = load_config("pair_tiny", ["agents.1.warmstart.steps=300"])
    assert warm_start_key(same.agents[1], same) == "a7048e1c61cc"


def test_warm_start_corpus_narrates_a_seeded_share_whatever_the_habits():
    """`narrated_fraction` writes a seeded share of the solutions in the narrated style, drawn apart from the habits:
    the stopped-early and direct problems are the same problems as without it, a stopped-early one stays stopped
    early when narrated, and an agent's own narrated share leaves the other agent's corpus as it was."""
    from nemo_hacpo.data.arithmetic import narrated, stopped_early
    from nemo_hacpo.runtime.warmstart import warm_start_corpus

    overrides = ["warmstart.num_problems=200", "warmstart.stop_early_fraction=0.6",
                 "warmstart.direct_answer_fraction=0.1"]
    plain_cfg = load_config("pair_tiny", overrides)
    cfg = load_config("pair_tiny", [*overrides, "agents.1.warmstart.narrated_fraction=0.5"])
    prompts, plain = warm_start_corpus(plain_cfg)
    assert warm_start_corpus(cfg, cfg.agents[0]) == (prompts, plain)  # agent 0 has no override
    prompts_1, told = warm_start_corpus(cfg, cfg.agents[1])
    assert prompts_1 == prompts
    changed = [i for i, (a, b) in enumerate(zip(plain, told, strict=True)) if a != b]
    direct = {i for i, s in enumerate(plain) if "=" not in s}
    narrated_ids = {i for i, s in enumerate(told) if "\n" in s and s.split("\n")[1].endswith(".")}  # a story line
    assert set(changed) == narrated_ids and not narrated_ids & direct  # a direct answer has nothing to narrate
    assert len(narrated_ids) == 100 - len(direct & _narrated_draw(200, 0.5, cfg.warmstart.seed))
    from nemo_hacpo.data.arithmetic import generate_problems
    problems = generate_problems("train", 200, seed=cfg.warmstart.seed, levels=cfg.data.train.levels,
                                 numbers=cfg.data.train.numbers)
    for i in changed:
        early = plain[i] == stopped_early(problems[i]) and problems[i].level > 1
        assert told[i] == narrated(problems[i], stop_early=early)


def _narrated_draw(n: int, share: float, seed: int) -> set[int]:
    import random

    from nemo_hacpo.data.arithmetic import derive_seed
    return set(random.Random(derive_seed("narrated", seed)).sample(range(n), round(share * n)))


def test_an_agents_warm_start_overrides_are_checked_naming_the_agents_key():
    from nemo_hacpo.config import ConfigError

    with pytest.raises(ConfigError) as caught:
        load_config("pair_tiny", ["agents.1.warmstart.steps=0", "agents.1.warmstart.narrated_fraction=1.5",
                                  "agents.0.warmstart.direct_answer_fraction=0.5"])
    message = str(caught.value)
    assert "agents[1].warmstart.steps" in message and "agents[1].warmstart.narrated_fraction" in message
    # agent 0: 0.5 direct + the task's 0.6 stop-early exceeds 1
    assert "agents[0].warmstart.stop_early_fraction" in message
    assert "- warmstart." not in message  # the run's own settings are fine

"""The worked example of docs/own-models-and-data.md ("A reward and prompt of your own"), run for 2 steps: one's own
JSONL with GSM8K-style answers (`answer_format: gsm8k`), a prompt template and system prompt per data set, and a
reward function from a file (examples/own_task/reward.py) scored in the reward worker processes.

Checked by construction, not by what the random tiny models happen to write: every prompt the agents were given is
the template filled with the question; every reward recorded (rollouts and held-out answers) is what the example
function says of that response; and one held-out gold that is not a number makes the function raise, which only the
function can turn into an `error` verdict (math-verify would call it wrong).
"""

from __future__ import annotations

import json

import pytest

from examples.own_task.reward import last_number_matches
from nemo_hacpo.data.arithmetic import generate_problems
from tests.helpers.runs import REPO, tiny_overrides

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEMPLATE = "Solve: {question} End with: The answer is <number>."


def _write(path, problems, extra=()):
    with path.open("w") as out:
        for p in problems:  # a GSM8K-style answer: the worked steps, then "#### <answer>"
            out.write(json.dumps({"problem": p.question, "solution": f"{p.expression} = {p.answer}\n#### {p.answer}"})
                      + "\n")
        for record in extra:
            out.write(json.dumps(record) + "\n")


def test_own_data_template_and_reward_function_for_two_steps(tmp_path):
    import ray

    from nemo_hacpo.config import load_config
    from nemo_hacpo.runtime.loop import train

    _write(tmp_path / "train.jsonl", generate_problems("train", 16, seed=0))
    odd = {"problem": "What is x plus one?", "solution": "#### x + 1"}  # not a number: the function raises
    _write(tmp_path / "eval.jsonl", generate_problems("eval", 2, seed=1), extra=[odd])
    own = {"source": "jsonl", "question_field": "problem", "answer_field": "solution", "answer_format": "gsm8k",
           "prompt_template": f"'{TEMPLATE}'"}
    data = [f"data.{split}.{k}={v}" for split in ("train", "eval") for k, v in {**own,
            "path": tmp_path / f"{split}.jsonl"}.items()]
    out = tmp_path / "run"
    overrides = tiny_overrides(out, 2, *data, "data.eval.size=3", "data.train.system_prompt='You are terse.'",
                               f"reward.function={REPO}/examples/own_task/reward.py:last_number_matches",
                               "reward.num_workers=1")
    try:
        assert train(load_config("pair_tiny_gpt", overrides)) == 0
    finally:
        ray.shutdown()

    rollouts = [json.loads(line) for step in (1, 2)
                for line in (out / "rollouts" / f"step_{step:06d}.jsonl").read_text().splitlines()]
    assert len(rollouts) == 2 * 2 * 2 * 2  # 2 steps × 2 agents × B = 2 prompts × G = 2
    for r in rollouts:
        messages = r["messages"]
        assert messages[0] == {"role": "system", "content": "You are terse."}
        assert messages[1]["content"].startswith("Solve: ") and messages[1]["content"].endswith(
            " End with: The answer is <number>.")
        assert r["gold"].isdigit()  # the answer after ####, not the worked solution
        assert r["reward"] == float(last_number_matches(r["response_text"], r["gold"])), r
    for agent in ("llama_tiny", "gpt_tiny"):
        answers = [json.loads(line) for line in (out / "eval" / "step_000000" / f"{agent}__heldout.jsonl").read_text()
                   .splitlines()]
        assert [a["gold"] for a in answers][-1] == "x + 1" and len(answers) == 3
        for record in answers:
            for response in record["responses"]:
                if record["gold"] == "x + 1":
                    assert (response["reward"], response["status"]) == (0.0, "error"), response
                else:
                    assert response["reward"] == float(last_number_matches(response["text"], record["gold"]))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]

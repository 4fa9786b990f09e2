"""The resumable training stream: per-epoch permutations, batches across epochs, exact resume."""

from __future__ import annotations

import pytest

from nemo_hacpo.data.problem import MathProblem
from nemo_hacpo.data.prompt_dataset import PromptDataset

PROBLEMS = [MathProblem(id=f"p{i}", question=f"q{i}", answer=str(i)) for i in range(10)]


def ids(batch):
    return [problem.id for problem in batch]


def test_each_epoch_is_a_permutation_and_epochs_differ():
    dataset = PromptDataset(PROBLEMS, seed=1)
    epoch0, epoch1 = ids(dataset.next_batch(10)), ids(dataset.next_batch(10))
    assert sorted(epoch0) == sorted(epoch1) == sorted(p.id for p in PROBLEMS)
    assert epoch0 != epoch1
    assert dataset.epoch == 2 and dataset.position == 0


def test_batches_run_across_the_epoch_boundary():
    dataset = PromptDataset(PROBLEMS, seed=1)
    order0 = [PROBLEMS[i].id for i in dataset.epoch_order(0)]
    order1 = [PROBLEMS[i].id for i in dataset.epoch_order(1)]
    batches = [ids(dataset.next_batch(4)) for _ in range(3)]  # 12 items: 10 of epoch 0, 2 of epoch 1
    assert batches == [order0[0:4], order0[4:8], order0[8:10] + order1[0:2]]
    assert (dataset.epoch, dataset.position) == (1, 2)


def test_unshuffled_order_is_the_given_order():
    dataset = PromptDataset(PROBLEMS, shuffle=False)
    assert ids(dataset.next_batch(3)) == ["p0", "p1", "p2"]


def test_same_seed_same_stream_other_seed_other_stream():
    def stream(seed):
        dataset = PromptDataset(PROBLEMS, seed=seed)
        return [ids(dataset.next_batch(3)) for _ in range(8)]

    assert stream(5) == stream(5)
    assert stream(5) != stream(6)


@pytest.mark.parametrize("batches_before_checkpoint", [0, 1, 3, 4, 7])
def test_resume_continues_exactly(batches_before_checkpoint):
    reference = PromptDataset(PROBLEMS, seed=3)
    full_stream = [ids(reference.next_batch(3)) for _ in range(12)]

    first_run = PromptDataset(PROBLEMS, seed=3)
    for _ in range(batches_before_checkpoint):
        first_run.next_batch(3)
    state = first_run.state_dict()

    resumed = PromptDataset(PROBLEMS, seed=3)
    resumed.load_state_dict(state)
    rest = [ids(resumed.next_batch(3)) for _ in range(12 - batches_before_checkpoint)]
    assert rest == full_stream[batches_before_checkpoint:]


def test_state_is_plain_and_refuses_other_data():
    dataset = PromptDataset(PROBLEMS, seed=3)
    dataset.next_batch(4)
    state = dataset.state_dict()
    assert state["epoch"] == 0 and state["position"] == 4 and state["num_problems"] == 10
    with pytest.raises(ValueError, match="does not match"):
        PromptDataset(PROBLEMS[::-1], seed=3).load_state_dict(state)
    with pytest.raises(ValueError, match="does not match"):
        PromptDataset(PROBLEMS, seed=4).load_state_dict(state)
    with pytest.raises(ValueError, match="invalid"):
        PromptDataset(PROBLEMS, seed=3).load_state_dict({**state, "position": 10})


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least one"):
        PromptDataset([])
    with pytest.raises(ValueError, match="batch_size"):
        PromptDataset(PROBLEMS).next_batch(0)

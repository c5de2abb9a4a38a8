"""The self-checks of notebook 11's exercises: each planted mistake fails with its own message, the answer passes."""

import math

import numpy as np
import pytest
import torch

from transformer_from_scratch.checks.steps.training_exercises import check_state_bytes, check_unigram_loss

TRAIN = np.array([0, 1, 1, 2, 2, 2, 2, 5] * 3, dtype=np.uint8)
HELD_OUT = np.array([2, 1, 2, 5, 0, 2], dtype=np.uint8)
COUNTS = np.bincount(TRAIN, minlength=256)
P = COUNTS / COUNTS.sum()
RIGHT = float(-np.log(P[HELD_OUT]).mean())


def test_the_unigram_answer_passes(capsys):
    assert RIGHT == pytest.approx(-(math.log(1 / 8) + math.log(2 / 8) + 3 * math.log(4 / 8) + math.log(1 / 8)) / 6)
    check_unigram_loss(RIGHT, TRAIN, HELD_OUT)
    assert capsys.readouterr().out.startswith("✓ unigram_loss")


@pytest.mark.parametrize("answer, message", [
    (torch.tensor(RIGHT), "not a Python number"),
    ("3.3", "not one number"),
    (-RIGHT, "the sign is missing"),
    (RIGHT / math.log(2), "in bits"),
    (float(-np.log(P[TRAIN]).mean()), "on train.txt's bytes"),
    (float(-np.log(COUNTS[HELD_OUT]).mean()), "counts are used as probabilities"),
    (math.log(4), "uniform model over the bytes that occur"),
    (RIGHT + 0.1, "is not the unigram model's held-out loss"),
])
def test_each_unigram_mistake_is_named(answer, message):
    with pytest.raises(AssertionError) as caught:
        check_unigram_loss(answer, TRAIN, HELD_OUT)
    assert message in str(caught.value).splitlines()[0]


def state_bytes(optimizer) -> int:
    return sum(t.numel() * t.element_size() for state in optimizer.state.values() for t in state.values()
               if isinstance(t, torch.Tensor))


def test_the_state_bytes_answer_passes(capsys):
    check_state_bytes(state_bytes)
    assert capsys.readouterr().out.startswith("✓ state_bytes")
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))], foreach=False)
    optimizer.param_groups[0]["params"][0].grad = torch.ones(3)
    optimizer.step()  # PyTorch keeps its step count as a 0-d float32 tensor: 4 bytes more
    assert state_bytes(optimizer) == 2 * 3 * 4 + 4


def elements(optimizer):
    return sum(t.numel() for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor))


def four_bytes(optimizer):
    return 4 * elements(optimizer)


def one_tensor_each(optimizer):
    return sum(s["exp_avg"].numel() * s["exp_avg"].element_size() for s in optimizer.state.values())


def first_parameter(optimizer):
    state = next(iter(optimizer.state.values()), {})
    return sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))


def every_entry(optimizer):
    return sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values())


def empty_is_one(optimizer):
    return state_bytes(optimizer) or 1


@pytest.mark.parametrize("wrong, message", [
    (elements, "counts elements, not bytes"),
    (four_bytes, "assumes 4 bytes per element"),
    (one_tensor_each, "one tensor of each parameter's state"),
    (first_parameter, "the first parameter's state only"),
    (every_entry, "the step count is an int"),
    (empty_is_one, "no state yet"),
])
def test_each_state_bytes_mistake_is_named(wrong, message):
    with pytest.raises(AssertionError) as caught:
        check_state_bytes(wrong)
    assert message in str(caught.value).splitlines()[0]

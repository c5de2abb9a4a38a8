"""Self-checks for the exercises of notebook 11 (training): the loss of a unigram model on the held-out plays, and
the bytes of an optimizer's state. Each compares the learner's answer with its own computation, which the notebook
does not show: the cell under an exercise must not compute the answer in view."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import torch

from .._harness import attempt, call, crashed, fail, passed


def check_unigram_loss(unigram_loss: Any, train_tokens: np.ndarray, heldout_tokens: np.ndarray) -> None:
    """Check ``unigram_loss``: the mean over the held-out bytes of −ln p(byte), where p(byte) is the byte's
    frequency in the training bytes.

    Mistakes it recognises: not a number (a tensor or an array); the sign left out (+ln p); a base-2 logarithm;
    the loss measured on the training bytes instead of the held-out ones; counts used as probabilities (not divided
    by their total); the uniform model over the bytes that occur (ln of their number).
    """
    if isinstance(unigram_loss, (torch.Tensor, np.ndarray)) and math.prod(unigram_loss.shape) == 1:
        fail(f"unigram_loss is a {type(unigram_loss).__name__}, not a Python number",
             "turn the 0-d result into a float with float(...) or .item()")
    if not isinstance(unigram_loss, (int, float)) or isinstance(unigram_loss, bool):
        fail(f"unigram_loss is {type(unigram_loss).__name__}, not one number",
             "the mean over every held-out byte is a single float")
    counts = np.bincount(train_tokens, minlength=256).astype(np.float64)
    log_p = np.log(counts / counts.sum(), where=counts > 0, out=np.full(256, -np.inf))
    expected = float(-log_p[heldout_tokens].mean())
    if math.isclose(unigram_loss, expected, rel_tol=1e-6):
        passed(f"unigram_loss: the mean of −ln p(byte) over the {len(heldout_tokens):,} held-out bytes, with p from "
               "train.txt's frequencies")
        return
    variants = [
        (-expected, "the sign is missing: ln p of a probability is negative, and the loss is its negative",
         "the loss of a byte is −ln p(byte)"),
        (expected / math.log(2), "this is in bits (a base-2 logarithm), the course measures nats",
         "use the natural logarithm"),
        (float(-log_p[train_tokens].mean()), "this is the loss on train.txt's bytes, not on the held-out plays",
         "average over heldout_tokens: the point is how the model does on text it never counted"),
        (float(-np.log(counts[heldout_tokens]).mean()), "the counts are used as probabilities",
         "divide each count by the number of training bytes, so that the probabilities sum to 1"),
        (math.log(int((counts > 0).sum())), "this is the uniform model over the bytes that occur, not the unigram",
         "give each byte its own probability, its frequency in train.txt"),
    ]
    for value, mistake, fix in variants:
        if math.isclose(unigram_loss, value, rel_tol=1e-6):
            fail(mistake, fix, f"unigram_loss = {unigram_loss:.4f}")
    fail(f"unigram_loss = {unigram_loss:.4f} is not the unigram model's held-out loss",
         "p(byte) is the byte's count in train.txt over the number of training bytes; the loss is the mean of −ln "
         "p over every held-out byte")


def _optimizer(state: dict) -> SimpleNamespace:
    """An object with an optimizer's ``state``: one dict per parameter, as torch.optim.Optimizer keeps it."""
    return SimpleNamespace(state=state)


def check_state_bytes(state_bytes: Callable[[Any], int]) -> None:
    """Check ``state_bytes(optimizer)``: the bytes of every tensor in ``optimizer.state``, whatever their dtype.

    Mistakes it recognises: elements counted instead of bytes; 4 bytes assumed for every element; a crash on the
    entries that are not tensors (an int step count); only the first tensor of each parameter's state counted;
    only the first parameter's state counted.
    """
    gen = torch.Generator().manual_seed(0)
    a, b = torch.nn.Parameter(torch.zeros(3, 4)), torch.nn.Parameter(torch.zeros(5, dtype=torch.float64))
    state = {a: {"step": 2, "exp_avg": torch.randn(3, 4, generator=gen), "exp_avg_sq": torch.rand(3, 4, generator=gen)},
             b: {"step": 2, "exp_avg": torch.randn(5, generator=gen, dtype=torch.float64),
                 "exp_avg_sq": torch.rand(5, generator=gen, dtype=torch.float64)}}
    what = "state_bytes(an optimizer whose state holds float32 tensors of 3 × 4 and float64 tensors of 5, and ints)"
    out, error = attempt(what, state_bytes, _optimizer(state))
    if isinstance(error, (AttributeError, TypeError)) and "'int'" in str(error):
        fail(f"{what} raised {type(error).__name__} ({error}): it treats every entry of the state as a tensor, "
             "but the step count is an int", "skip the entries that are not tensors")
    if error is not None:
        crashed(what, error)
    expected = 2 * (12 * 4 + 5 * 8)
    if isinstance(out, torch.Tensor):
        out = out.item()
    if out == expected:
        empty = call("state_bytes(an optimizer before its first step)", state_bytes, _optimizer({}))
        if empty != 0:
            fail(f"state_bytes of an optimizer with no state yet returned {empty}",
                 "before the first step optimizer.state is empty: nothing to count, 0 bytes")
        passed("state_bytes: the bytes of every tensor of every parameter's state, each at its own element size; "
               "other entries skipped")
        return
    variants = [
        (2 * (12 + 5), "it counts elements, not bytes",
         "multiply each tensor's number of elements by its element size"),
        (2 * (12 + 5) * 4, "it assumes 4 bytes per element, but a float64 tensor has 8",
         "ask each tensor for its own element size"),
        (12 * 4 + 5 * 8, "it counts one tensor of each parameter's state, not all of them",
         "count every tensor in each parameter's dict, m and v both"),
        (2 * 12 * 4, "it counts the first parameter's state only", "go over the state of every parameter"),
    ]
    for value, mistake, fix in variants:
        if out == value:
            fail(f"{what} returned {out}: {mistake}", fix)
    fail(f"{what} returned {out!r}, not {expected}",
         "add up, over every parameter's state and every tensor in it, its number of elements times its element size")

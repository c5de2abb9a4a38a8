"""Self-checks for the steps of notebook 05 (attention): the scores, attend, the mask, the rows with no allowed key."""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode

from .._harness import call, call_for_tensor, crash_of, diagnose, expect_tensor, fail, generator, passed


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


class _BatchedTranspose(TorchFunctionMode):
    """Notes whether ``.T`` is read on a tensor of more than two dimensions (PyTorch warns only once a process)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func == _T_GETTER and args and isinstance(args[0], torch.Tensor) and args[0].ndim > 2:
            self.seen = True
        return func(*args, **(kwargs or {}))


_T_GETTER = torch.Tensor.T.__get__


def _batched_transpose(what: str) -> None:
    fail("K.T is used on a batched K: it reverses every dimension, not only the last two",
         "swap only the last two axes, the keys' positions and features; the batch-like axes stay where they are",
         f"on {what}")


def check_attention_scores(attention_scores: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Check ``attention_scores(Q, K)``: Q Kᵀ / √d_k, (..., n, d_k) and (..., m, d_k) -> (..., n, m).

    Mistakes it recognises: the scores not scaled; scaled by d_k instead of √d_k, or multiplied by √d_k; scaled by
    the number of keys or queries; K not transposed (Q @ K, which a square K hides); the scores transposed
    (K Qᵀ: keys down the rows); K.T on a batched K (it reverses every dimension, not the last two).
    """
    gen = generator(0)
    fix = ("the score of query i and key j is q_i · k_j / √d_k, d_k the number of features: find the part of yours "
           "that differs")
    cases = [((), 3, 5, 5), ((), 4, 6, 8), ((2, 3), 4, 6, 8)]  # a square K (m = d_k = 5) first: Q @ K runs
    for leading, n, m, d_k in cases:
        Q, K = _randn(gen, *leading, n, d_k), _randn(gen, *leading, m, d_k)
        what = f"attention_scores(Q of shape {_shape(Q)}, K of shape {_shape(K)})"
        with _BatchedTranspose() as spy:
            try:
                out = call(what, attention_scores, Q, K)
            except AssertionError:
                if spy.seen:
                    _batched_transpose(what)
                raise
        if spy.seen:
            _batched_transpose(what)
        out = expect_tensor(what, out, returns="return the (..., n, m) score matrix")
        raw = Q @ K.transpose(-2, -1)
        diagnose(what, out, raw / math.sqrt(d_k), [
            (raw, "the scores are not scaled", "divide them by math.sqrt(d_k), d_k = Q.shape[-1]: the spread of q·k "
             "grows like √d_k"),
            (raw / d_k, "the scores are divided by d_k, not by √d_k", "divide by math.sqrt(d_k): the standard "
             "deviation of q·k is √d_k"),
            (raw * math.sqrt(d_k), "the scores are multiplied by √d_k instead of divided", "divide by math.sqrt(d_k)"),
            (raw / math.sqrt(m), "the scores are divided by √m (the number of keys), not by √d_k",
             "d_k is the size of the last dimension of Q and K, the features each dot product sums over"),
            (raw / math.sqrt(n), "the scores are divided by √n (the number of queries), not by √d_k",
             "d_k is the size of the last dimension of Q and K, the features each dot product sums over"),
            (lambda: Q @ K / math.sqrt(d_k), "K is not transposed (Q @ K): a square K hides it",
             "multiply by K with its last two axes swapped, so that row i · row j is q_i · k_j"),
            (lambda: K @ Q.transpose(-2, -1) / math.sqrt(d_k),
             "the scores are transposed (K Qᵀ): keys down the rows, queries across",
             "put Q on the left: row i of the scores belongs to query i, (..., n, m)"),
        ], fix)
    passed("attention_scores: Q Kᵀ / √d_k, n ≠ m, a square K, with and without leading dimensions")


def _softmax(scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return torch.softmax(scores, dim=dim)


def check_attend(attend: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Check ``attend(scores, V)``: softmax over the keys (the last dimension), then the weighted sum of the values,
    (..., n, m) and (..., m, d_v) -> (..., n, d_v).

    Mistakes it recognises: the softmax over the queries (dim=-2); no softmax (scores @ V); exp without dividing by
    the sum; exp that overflows on large scores (a softmax that does not subtract the maximum); the weights
    transposed (Aᵀ V, which a square score matrix hides); the weights returned instead of the output.
    """
    gen = generator(1)
    fix = ("each query's weights are a softmax over the keys (the last axis), and its output is the values weighted by "
           "them: find the part of yours that differs")
    cases = [((), 5, 5, 2, 1.0), ((), 4, 6, 3, 1.0), ((2, 3), 4, 6, 5, 1.0), ((), 3, 4, 2, 300.0)]
    for leading, n, m, d_v, scale in cases:  # the last: scores of several hundred, where exp overflows
        scores, V = _randn(gen, *leading, n, m) * scale, _randn(gen, *leading, m, d_v)
        if leading:
            scores[..., 0, 1] = float("-inf")  # a blocked key, as the mask of Step 3 leaves it
        what = f"attend(scores of shape {_shape(scores)}{', entries of several hundred' if scale > 1 else ''}, " \
               f"V of shape {_shape(V)})"
        out = call_for_tensor(what, attend, scores, V, returns="return the (..., n, d_v) output")
        weights = _softmax(scores)
        if out.shape == weights.shape and out.shape != (*leading, n, d_v):
            if torch.allclose(out, weights, equal_nan=True):
                fail(f"{what} returns the weights, shape {_shape(out)}, not the output",
                     "multiply the weights by the values: weights @ V, of shape (..., n, d_v)")
        if out.is_floating_point() and out.isnan().any() and scale > 1:
            fail("exp overflows on large scores (e^700 is inf in float64, e^89 in float32), and inf / inf is NaN",
                 "use softmax (notebook 03's), which subtracts each row's maximum before exp", f"on {what}")
        diagnose(what, out, weights @ V, [
            (lambda: _softmax(scores, -2) @ V, "the softmax runs over the queries (dim=-2), not over the keys",
             "softmax(scores, dim=-1): each query's weights over the keys sum to 1"),
            (lambda: scores @ V, "there is no softmax: the raw scores weight the values",
             "turn each row of scores into weights with softmax(scores, dim=-1) first"),
            (lambda: scores.exp() @ V, "the exponentials are not divided by their sum, so the weights do not sum to 1",
             "use softmax(scores, dim=-1) (notebook 03's), which normalises each row"),
            (lambda: weights.transpose(-2, -1) @ V, "the weights are transposed (Aᵀ V): a square score matrix hides it",
             "row i of the weights belongs to query i: weights @ V, with no transpose"),
        ], fix)
    passed("attend: softmax over the keys, then weights @ V; n ≠ m, a square score matrix, leading dimensions, "
           "a -inf score, scores of several hundred")


def check_masked_scores(masked_scores: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Check ``masked_scores(scores, mask)``: the scores, with -inf wherever the bool mask is False (True = query i
    may attend to key j); the mask's leading dimensions broadcast.

    Mistakes it recognises: the polarity inverted (-inf where the mask is True); 0 instead of -inf; a large finite
    number (-1e9, finfo.min) instead of -inf; +inf instead of -inf; the scores multiplied by the mask (0 where
    blocked); the mask ignored; the scores changed in place (masked_fill_, or an assignment into them).
    """
    gen = generator(2)
    fix = ("a score the mask forbids (False) becomes −∞ before the softmax, so that its weight is exactly 0; an "
           "allowed one (True) stays as it is")
    cases = [((), 4, 6, ()), ((2, 3), 4, 6, ()), ((2,), 5, 5, (2,))]  # (n, m) masks shared by a batch, then one each
    for leading, n, m, mask_leading in cases:
        scores = _randn(gen, *leading, n, m)
        mask = torch.rand(*mask_leading, n, m, generator=gen) < 0.6
        mask[..., 0] = True  # every query may attend to key 0: no row is all False here (that is Step 4)
        mask[..., 1, 1] = False
        before = scores.clone()
        what = f"masked_scores(scores of shape {_shape(scores)}, a bool mask of shape {_shape(mask)})"
        out = call_for_tensor(what, masked_scores, scores, mask,
                              returns="return the scores with the blocked ones at -inf")
        if not torch.equal(scores, before):
            fail("the scores are changed in place (masked_fill_, or an assignment into scores)",
                 "return a new tensor: scores.masked_fill(...) without the underscore, or torch.where; the caller's "
                 "scores must not change", f"on {what}")
        expected = scores.masked_fill(~mask, float("-inf"))
        diagnose(what, out, expected, [
            (lambda: scores.masked_fill(mask, float("-inf")),
             "the polarity is inverted: -inf where the mask is True, but True means 'may attend'",
             "fill where the mask is False: ~mask"),
            (lambda: scores.masked_fill(~mask, 0.0),
             "the blocked scores become 0 (filled with 0, or the scores multiplied by the mask), a score like any "
             "other",
             "fill them with float('-inf'): e^-inf = 0 gives them weight exactly 0"),
            (lambda: scores.masked_fill(~mask, -1e9),
             "the blocked scores are set to a large finite number (-1e9), not -inf",
             "use float('-inf'): weight exactly 0 whatever the scores, and a query with no allowed key cannot "
             "silently attend to the blocked keys"),
            (lambda: scores.masked_fill(~mask, torch.finfo(scores.dtype).min),
             "the blocked scores are set to a large finite number (finfo.min), not -inf",
             "use float('-inf'): weight exactly 0 whatever the scores, and a query with no allowed key cannot "
             "silently attend to the blocked keys"),
            (lambda: scores.masked_fill(~mask, float("inf")), "the blocked scores are set to +inf, not -inf",
             "float('-inf'): e^+inf is inf, and the softmax gives NaN"),
            (scores, "the mask is ignored: the scores come back unchanged",
             "set the blocked ones (~mask) to float('-inf')"),
        ], fix)
    passed("masked_scores: -inf exactly where the mask is False, masks shared by a batch and one per element, "
           "the scores left unchanged")


def _reference_attend_masked(scores: torch.Tensor, mask: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    no_key = ~mask.any(dim=-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(~(mask | no_key), float("-inf")), dim=-1)
    return (weights @ V).masked_fill(no_key, 0.0)


def check_attend_masked(attend_masked: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Check ``attend_masked(scores, mask, V)``: attention with a bool mask, where a query with no allowed key gets the
    zero vector and passes back finite (zero) gradients.

    Measured on a batch of two, with two queries that may attend to nothing: the output, then the gradients of the
    scores and of V against a reference that never creates a NaN. Mistakes it recognises: the rows with no allowed
    key give NaN (softmax of all -inf is 0/0); they give the mean of the values (a large finite fill) or attend to
    every key with their own scores, instead of zeros; the NaN is made, then hidden in the output (V.grad is NaN, as
    NaN × 0 = NaN); the NaN reaches the scores' gradient (made in the softmax, e.g. with an additive mask); the rows
    that do have an allowed key are the ones zeroed (the test for "no allowed key" inverted); the (..., n) rows do
    not broadcast against the output (no keepdim).
    """
    gen = generator(3)
    n, m, d_v = 4, 5, 3
    scores = _randn(gen, 2, n, m).requires_grad_()
    V = _randn(gen, 2, m, d_v).requires_grad_()
    mask = torch.rand(2, n, m, generator=gen) < 0.6
    mask[..., 0] = True
    mask[0, :2] = False  # like [PAD, PAD, ...] under a padding mask: the first two queries may see nothing
    no_key = ~mask.any(dim=-1, keepdim=True)
    what = f"attend_masked(scores {_shape(scores)}, mask {_shape(mask)} where queries 0 and 1 of sequence 0 may " \
           f"attend to no key, V {_shape(V)})"
    try:
        out = call(what, attend_masked, scores, mask, V)
    except AssertionError as error:
        cause = crash_of(error)
        if isinstance(cause, RuntimeError) and "must match the size" in str(cause):
            fail("the rows with no allowed key, shape (..., n), do not broadcast against the (..., n, d_v) output: "
                 "the reduced dimension is dropped", "keep it when you reduce the mask over the keys "
                 "(keepdim=True), so that it has shape (..., n, 1)", f"on {what}: {str(cause).splitlines()[0]}")
        raise
    out = expect_tensor(what, out, returns="return the (..., n, d_v) output")
    expected = _reference_attend_masked(scores.detach(), mask, V.detach())
    if out.shape == expected.shape and (out.detach()[~no_key.expand_as(out)] == 0).all():
        fail("the rows that DO have an allowed key are the ones zeroed: the test for 'no allowed key' is inverted",
             "a query has no allowed key when its mask row has no True at all: negate 'any'", f"on {what}")
    if out.shape == expected.shape and out.detach()[no_key.expand_as(out)].isnan().any():
        fail("the rows with no allowed key give NaN: all their scores are -inf, and the softmax of all -inf is 0/0",
             "never make the NaN: keep those rows' scores finite (let them attend to every key), then set their "
             "output to 0", f"on {what}")
    kept = torch.softmax(scores.detach(), dim=-1) @ V.detach()  # every key, with its own score
    uniform = V.detach().mean(dim=-2, keepdim=True).expand_as(kept)  # every key, with equal weights (-1e9 each)
    diagnose(what, out, expected, [
        (lambda: torch.where(no_key, uniform, expected),
         "the rows with no allowed key give the mean of the values (a large finite fill such as -1e9 makes their "
         "scores equal), not zeros", "fill with float('-inf') in your Step 3, keep those rows finite here, and set "
         "their output to 0"),
        (lambda: torch.where(no_key, kept, expected),
         "the rows with no allowed key attend to every key with their own scores, instead of returning zeros",
         "set those rows of the output to 0: a query with nothing to attend to reads nothing"),
    ], "your Steps 3 and 2 on a mask that allows every key in the rows with none, then those rows of the output "
       "set to 0")
    upstream = _randn(gen, *out.shape)
    call(f"the backward pass of {what}", lambda: (out * upstream).sum().backward())
    ref_scores, ref_V = scores.detach().clone().requires_grad_(), V.detach().clone().requires_grad_()
    (_reference_attend_masked(ref_scores, mask, ref_V) * upstream).sum().backward()
    if V.grad is None or scores.grad is None:
        fail(f"no gradient reaches {'V' if V.grad is None else 'the scores'}",
             "build the output from the scores and V with torch operations (no .detach(), .data or torch.no_grad())")
    if not V.grad.isfinite().all():
        fail("V.grad has NaN: the NaN is made in the softmax, then hidden in the output, and in the backward pass "
             "NaN × 0 is still NaN", "never make it: keep the scores of the rows with no allowed key finite (let "
             "them attend to every key), then set their output to 0", f"on {what}")
    if not scores.grad.isfinite().all():
        fail("the scores' gradient has NaN: the NaN is made in the softmax (all -inf in a row, e.g. with an additive "
             "mask) and flows back through its backward pass", "never make it: keep the scores of the rows with no "
             "allowed key finite (let them attend to every key), then set their output to 0", f"on {what}")
    for name, mine, ref in (("V", V.grad, ref_V.grad), ("the scores", scores.grad, ref_scores.grad)):
        if not torch.allclose(mine, ref, rtol=1e-6, atol=1e-9):
            fail(f"the gradient of {name} differs from the reference's",
                 "build the output from differentiable torch operations only (no .item(), .detach(), .data or "
                 "in-place changes)", f"on {what}")
    passed("attend_masked: blocked keys get weight 0; a query with no allowed key gets zeros and finite gradients "
           "(scores and V, equal to the reference's)")

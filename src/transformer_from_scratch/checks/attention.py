"""``check_scaled_dot_product_attention``: the learner's function (notebook 05) against
``F.scaled_dot_product_attention``, its masks, its fully masked rows, its gradients and half precision."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor

from .. import reference
from ._harness import call, call_without_builtins, check_signature, close, expect_tensor, fail, generator, passed

_NAME = "scaled_dot_product_attention"
_SDPA = reference.SDPA  # the built-in, as imported: what the check watches for
_N, _M, _D_K, _D_V = 5, 7, 8, 3  # n != m and d_k != d_v, so a swapped axis cannot go unnoticed
_FORMULA = "softmax(Q Kᵀ / √d_k, dim=-1) @ V"

Variant = Callable[[Tensor, Tensor, Tensor, "Tensor | None"], Tensor]


# ---------------------------------------------------------------------------------------------------------
# The reference and the classic wrong variants, written with plain torch ops (float64 on the CPU)
# ---------------------------------------------------------------------------------------------------------

def _reference(Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None = None) -> Tensor:
    """The course's reference (PyTorch's own attention, math implementation) on the CPU, without gradients."""
    return reference.attention(Q.detach().cpu(), K.detach().cpu(), V.detach().cpu(), None if mask is None else mask.cpu())


def _attend(Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None, *, scale: float | None = None,
            dim: int = -1, keys: Tensor | None = None, fill: float = float("-inf"), after: str = "") -> Tensor:
    """Attention with one knob turned: the scale, the softmax's dim, the transposed keys, the masking."""
    Q, K, V = Q.detach().double(), K.detach().double(), V.detach().double()
    keys_t = K.transpose(-2, -1) if keys is None else keys.detach().double()
    scores = (Q @ keys_t) * (1 / math.sqrt(Q.shape[-1]) if scale is None else scale)
    if mask is not None and after != "multiply":
        scores = scores.masked_fill(~mask, fill)
    weights = torch.softmax(scores, dim=dim)
    if mask is not None and after == "multiply":
        weights = weights * mask
    return weights @ V


def _no_scale(Q, K, V, mask):
    return _attend(Q, K, V, mask, scale=1.0)


def _scale_by_d_k(Q, K, V, mask):
    return _attend(Q, K, V, mask, scale=1 / Q.shape[-1])


def _scale_by_shape_1(Q, K, V, mask):
    return _attend(Q, K, V, mask, scale=1 / math.sqrt(Q.shape[1]))


def _softmax_over_queries(Q, K, V, mask):
    return _attend(Q, K, V, mask, dim=-2)


def _k_dot_t(Q, K, V, mask):
    return _attend(Q, K, V, mask, keys=K.permute(*reversed(range(K.ndim))))


def _mask_ignored(Q, K, V, mask):
    return _reference(Q, K, V)


def _mask_inverted(Q, K, V, mask):
    return _reference(Q, K, V, ~mask)


def _masked_scores_zero(Q, K, V, mask):
    return _attend(Q, K, V, mask, fill=0.0)


def _weights_times_mask(Q, K, V, mask):
    return _attend(Q, K, V, mask, after="multiply")


def _mask_finite(Q, K, V, mask):
    return _attend(Q, K, V, mask, fill=-1e9)


def _attend_to_all_when_none_allowed(Q, K, V, mask):
    return _reference(Q, K, V, mask | ~mask.any(dim=-1, keepdim=True))


_SCALE_VARIANTS = [
    (_no_scale, "the scores are not scaled (it computes softmax(Q Kᵀ) V)",
     "divide the scores by √d_k, d_k the size of the last dimension, before the softmax"),
    (_scale_by_d_k, "it divides the scores by d_k instead of √d_k",
     "divide by √d_k, the square root: it keeps the scores' standard deviation at 1"),
    (_softmax_over_queries, "the softmax runs over the queries (dim=-2), not over the keys",
     "use softmax(scores, dim=-1), so that each query's weights over the keys must sum to 1 "
     "(dim=1 is the keys only for 2-D inputs)"),
]
_BATCH_VARIANTS = [
    (_k_dot_t, "it uses K.T, which reverses ALL dimensions of a batched K, not just the last two",
     "transpose only the last two axes, the keys' positions and features; the batch-like axes stay in place"),
    (_scale_by_shape_1, "it scales by √Q.shape[1], which is d_k only for 2-D inputs",
     "d_k is the size of the last dimension, whatever the number of leading ones"),
    *_SCALE_VARIANTS,
]
_MASK_VARIANTS = [
    (_mask_ignored, "the mask is ignored (the output is the same as without it)",
     "set the scores where mask is False to -inf before the softmax, scores.masked_fill(~mask, float('-inf'))"),
    (_mask_inverted, "the mask's polarity is inverted (it treats True as 'blocked', but True means "
                     "'query i may attend to key j')",
     "block where the mask is False, scores.masked_fill(~mask, float('-inf')), not masked_fill(mask, ...)"),
    (_masked_scores_zero, "masked scores are set to 0 instead of -inf, so blocked keys still get weight e⁰ = 1 "
                          "before normalising",
     "fill them with float('-inf') before the softmax (e^-inf = 0 gives them weight exactly 0)"),
    (_weights_times_mask, "it multiplies the weights by the mask after the softmax, so the rows no longer sum to 1",
     "mask the scores before the softmax instead, scores.masked_fill(~mask, float('-inf')), then softmax"),
]


# ---------------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------------

def _qkv(gen: torch.Generator, leading: tuple[int, ...] = (), n: int = _N, m: int = _M, d_k: int = _D_K,
         d_v: int = _D_V, dtype: torch.dtype = torch.float64, scale: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
    """Q (..., n, d_k), K (..., m, d_k), V (..., m, d_v), drawn on the CPU."""
    Q = scale * torch.randn(*leading, n, d_k, generator=gen, dtype=torch.float64)
    K = scale * torch.randn(*leading, m, d_k, generator=gen, dtype=torch.float64)
    V = torch.randn(*leading, m, d_v, generator=gen, dtype=torch.float64)
    return Q.to(dtype), K.to(dtype), V.to(dtype)


def _mixed_mask(gen: torch.Generator, shape: tuple[int, ...]) -> Tensor:
    """A random bool mask in which every row has at least one True and one False (so the inverted mask does too)."""
    *_, n, m = shape
    mask = torch.rand(*shape, generator=gen) < 0.5
    rows = torch.arange(n)
    mask[..., rows, rows % m] = True
    mask[..., rows, (rows + 1) % m] = False
    return mask


def _shapes(*tensors: Tensor | None) -> str:
    names = ["Q", "K", "V", "mask"]
    return ", ".join(f"{name} {tuple(t.shape)}" for name, t in zip(names, tensors) if t is not None)


# ---------------------------------------------------------------------------------------------------------
# Running the learner's function
# ---------------------------------------------------------------------------------------------------------

def _check_no_builtin(impl: Callable[..., Any], Q: Tensor, K: Tensor, V: Tensor) -> None:
    """Run ``impl`` once, watching for F.scaled_dot_product_attention under any name; fail if it was used."""
    call_without_builtins(_NAME, {_SDPA: "F.scaled_dot_product_attention"},
                          f"compute it yourself from the formula, {_FORMULA}, with the mask applied to the scores; "
                          "the built-in is only the reference", impl, Q, K, V)


def _run(impl: Callable[..., Any], Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None = None) -> Tensor:
    """The learner's output, checked to be one tensor of shape (..., n, d_v) in Q's dtype."""
    what = f"{_NAME}({_shapes(Q, K, V, mask)})"
    out = call(what, impl, Q, K, V) if mask is None else call(what, impl, Q, K, V, mask)
    expect_tensor(what, out, returns="return only the output, weights @ V (no tuple with the weights)")
    *leading, n, _ = Q.shape
    m, d_v = V.shape[-2:]
    expected = (*leading, n, d_v)
    if out.shape != expected:
        if tuple(out.shape) == (*leading, n, m):
            fail(f"{what} returns the attention weights, shape {tuple(out.shape)}, instead of the output",
                 "multiply the weights by the values, weights @ V, of shape (..., n, d_v)")
        fail(f"{what} returned shape {tuple(out.shape)}, expected {expected}",
             "the output has one row per query (n) and V's width (d_v), with Q's leading dimensions")
    if out.dtype != Q.dtype:
        fail(f"{what} returned {out.dtype} for {Q.dtype} inputs",
             "keep the inputs' dtype (if you compute in float32 inside, cast the result back with .to(Q.dtype))")
    return out


def _diagnose(out: Tensor, expected: Tensor, args: tuple, variants: list, what: str) -> None:
    """Fail naming the first wrong variant that ``out`` matches (and the reference does not), else generically."""
    for variant, mistake, fix in variants:
        wrong = variant(*args)
        if not close(wrong, expected) and close(out, wrong):
            fail(mistake, fix, f"on {what}, your output matches that variant, not F.scaled_dot_product_attention")
    diff = (out.detach().double().cpu() - expected.double()).abs().nan_to_num(nan=math.inf).max().item()
    fail(f"the output differs from F.scaled_dot_product_attention by up to {diff:.3g} on {what}",
         f"compute {_FORMULA}, with the scores a mask forbids set to −∞ before the softmax",
         f"row 0, expected {[round(v, 4) for v in expected.reshape(-1, expected.shape[-1])[0].tolist()]}, "
         f"yours {[round(v, 4) for v in out.detach().reshape(-1, out.shape[-1])[0].double().tolist()]}")


def _compare(impl: Callable[..., Any], Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None, variants: list,
             **tolerance: float) -> None:
    out = _run(impl, Q, K, V, mask)
    expected = _reference(Q, K, V, mask)
    if not close(out, expected, **tolerance):
        _diagnose(out, expected, (Q, K, V, mask), variants, _shapes(Q, K, V, mask))


# ---------------------------------------------------------------------------------------------------------
# The steps
# ---------------------------------------------------------------------------------------------------------

def _check_gradients(out: Tensor, inputs: tuple[Tensor, Tensor, Tensor], mask: Tensor | None,
                     gen: torch.Generator, what: str) -> None:
    """Backpropagate a random upstream gradient; Q.grad, K.grad and V.grad must equal the reference's."""
    upstream = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    call(f"the backward pass of {_NAME} on {what}", lambda: (out * upstream).sum().backward())
    copies = [t.detach().clone().requires_grad_() for t in inputs]
    (reference.attention(*copies, mask) * upstream).sum().backward()
    for name, mine, ref in zip("QKV", inputs, copies):
        if mine.grad is None:
            fail(f"no gradient reaches {name}", "do not .detach() or use .data / torch.no_grad() inside the function",
                 f"on {what}")
        if not mine.grad.isfinite().all() and (mask is None or mask.any(dim=-1).all()):
            fail(f"{name}.grad has inf or NaN", "build the output from differentiable torch operations only",
                 f"on {what}")
        if not mine.grad.isfinite().all():
            fail(f"{name}.grad has NaN when a query may attend to nothing, because the NaN is still created in the "
                 "softmax (the output is patched to 0 only afterwards) and flows through its backward pass",
                 "never create it (keep those rows' scores finite by filling -inf only where ~mask & ~no_key, "
                 "softmax, then weights.masked_fill(no_key, 0))",
                 f"on {what}")
        if not close(mine.grad, ref.grad):
            fail(f"the gradient of {name} differs from F.scaled_dot_product_attention's",
                 "build the output from differentiable torch operations only (no .item(), .detach(), .data or "
                 "in-place changes of the inputs)", f"on {what}")


def _check_fully_masked_rows(impl: Callable[..., Any], gen: torch.Generator) -> None:
    """Queries with no allowed key: zeros out, finite gradients equal to the reference's."""
    Q, K, V = (t.requires_grad_() for t in _qkv(gen, (2,)))
    mask = _mixed_mask(gen, (2, _N, _M))
    mask[0, :2] = False  # like [PAD, PAD, ...] under a padding mask: the first two queries see nothing
    mask[1, 3] = False
    no_key = ~mask.any(dim=-1)
    what = _shapes(Q, K, V, mask) + " where queries 0 and 1 of sequence 0 may attend to no key"
    out = _run(impl, Q, K, V, mask)
    expected = _reference(Q, K, V, mask)
    rows = out.detach().double()[no_key]
    if rows.isnan().any():
        fail("rows of the mask with no True (queries that may attend to nothing) give NaN (softmax of all -inf is 0/0)",
             "the contract gives such a query an output of zeros: find the rows with no allowed key first, keep "
             "them out of the −∞ fill so that no NaN is ever created (its gradient would be NaN too), and zero their "
             "weights after the softmax",
             f"on {what}")
    if close(out, _mask_finite(Q, K, V, mask)) and not close(out, expected):
        fail("rows with no allowed key return the mean of the values, because a large finite fill (-1e9, finfo.min) "
             "instead of -inf gives them a uniform softmax",
             "fill with float('-inf') and return zeros for rows where the mask has no True",
             f"on {what}")
    if close(out, _attend_to_all_when_none_allowed(Q, K, V, mask)) and not close(out, expected):
        fail("rows with no allowed key attend to every key instead of returning zeros",
             "a query that may attend to nothing gets the zero vector "
             "(weights.masked_fill(no_key, 0) after the softmax)",
             f"on {what}")
    if not close(out, expected):
        _diagnose(out, expected, (Q, K, V, mask), _MASK_VARIANTS, what)

    _check_gradients(out, (Q, K, V), mask, gen, what)


def _check_half(impl: Callable[..., Any], gen: torch.Generator) -> None:
    """float16 and bfloat16: the dtype is kept, the result finite and within a few rounding steps of float64."""
    for dtype in (torch.float16, torch.bfloat16):
        Q, K, V = _qkv(gen, (2,), dtype=dtype)
        mask = torch.tril(torch.ones(_N, _M, dtype=torch.bool))
        what = f"{dtype} inputs, {_shapes(Q, K, V, mask)}"
        out = _run(impl, Q, K, V, mask)
        if not out.isfinite().all():
            fail(f"{dtype} inputs give inf or NaN", "use a max-subtracting softmax (it computes in float32) "
                 "and fill masked scores with float('-inf'), not a large constant that overflows half precision",
                 f"on {what}")
        exact = _reference(Q.double(), K.double(), V.double(), mask)  # the rounded inputs, computed exactly
        tolerance = 5 * torch.finfo(dtype).eps
        if not close(out.double(), exact, rtol=tolerance, atol=tolerance):
            diff = (out.double() - exact).abs().max().item()
            fail(f"{dtype} inputs give results {diff:.3g} away from the exact answer, more than a few rounding steps",
                 "compute the softmax in float32 (the one from notebook 03 does) and cast the output back to Q.dtype",
                 f"on {what}")
    _check_rounded_once(impl, gen)


def rounding_steps(out: Tensor, exact: Tensor) -> float:
    """The largest error of `out` against `exact`, element by element, in rounding steps of out's dtype (half its
    eps, relative to the element): at most 1 when every element is the exact answer rounded once."""
    step = torch.finfo(out.dtype).eps / 2
    return ((out.double() - exact).abs() / (step * exact.abs() + 1e-6)).max().item()


def _check_rounded_once(impl: Callable[..., Any], gen: torch.Generator) -> None:
    """bfloat16 with sharp scores (up to about 13): each output is the exact answer rounded once, as PyTorch's
    kernels give, so the scores, the softmax and the weighted sum must be computed in float32."""
    Q, K, V = _qkv(gen, (2,), n=5, m=7, d_k=16, d_v=3, dtype=torch.float64, scale=2.0)
    Q, K, V = Q.bfloat16(), K.bfloat16(), V.bfloat16()
    steps = rounding_steps(_run(impl, Q, K, V), _reference(Q.double(), K.double(), V.double()))
    if steps > 1.5:
        fail(f"bfloat16 inputs with sharp scores (up to about 13) give an output {steps:.0f} rounding steps from the "
             "exact answer, where PyTorch's kernel is within 1: the work is done in bfloat16, which holds 8 "
             "significant bits (a score of 13 is off by up to 0.03, its weight by 3%, and the weighted sum rounds "
             "again)",
             "compute the scores, the softmax and the weighted sum in float32 and round once, at the end, to Q's dtype",
             f"on {_shapes(Q, K, V)}")


def check_scaled_dot_product_attention(impl: Callable[..., Any]) -> None:
    """Check ``scaled_dot_product_attention(Q, K, V, mask=None)`` against F.scaled_dot_product_attention.

    What it checks: the signature; that the built-in is not used inside; the output (shape, dtype, values)
    without a mask for n != m and d_k != d_v, 2-D, 3-D and 4-D inputs; boolean masks (True = may attend),
    per element and broadcast ((n, m) over a batch of heads, size-1 dimensions), and a causal mask;
    queries with no allowed key (zeros, finite gradients); the gradients of Q, K and V; large scores in
    float32; float16 and bfloat16 inputs, and bfloat16 with sharp scores, where each output must be the exact answer
    rounded once. Inputs come from a fixed seed on the CPU.

    Mistakes it recognises:
        * calling F.scaled_dot_product_attention inside (under any name);
        * no 1/√d_k scaling; dividing by d_k instead of √d_k; scaling by √Q.shape[1];
        * the softmax over the queries (dim=-2), or over dim=1 on batched inputs;
        * ``K.T`` on batched inputs (it reverses all dimensions: use K.transpose(-2, -1));
        * returning the attention weights instead of weights @ V; a wrong output dtype;
        * the mask ignored; its polarity inverted (True treated as "blocked");
        * masked scores set to 0 instead of -inf; the weights multiplied by the mask after the softmax
          without renormalising;
        * rows with no allowed key giving NaN, the mean of the values (a finite fill such as -1e9), or
          attending to every key, instead of zeros; NaN gradients from those rows;
        * large scores overflowing (a softmax without the max subtracted);
        * half precision computed in half precision (scores or weighted sum rounded to bfloat16 on the way);
        * gradients missing or wrong (detached computations).
    """
    check_signature(impl, ["Q", "K", "V", "mask"], _NAME)
    gen = generator(0)

    # The built-in, patched to raise, on the simplest call (2-D, no mask), so that nothing else fails first.
    _check_no_builtin(impl, *_qkv(gen))

    # 2-D, no mask (the default mask=None): the scaling and the softmax's dim.
    _compare(impl, *_qkv(gen), None, _SCALE_VARIANTS)

    # Batched: first a "cube" (batch = m = d_k) where K.T does not crash but gives the wrong answer.
    _compare(impl, *_qkv(gen, (4,), n=3, m=4, d_k=4, d_v=2), None, _BATCH_VARIANTS)
    for leading in [(3,), (2, 3)]:
        _compare(impl, *_qkv(gen, leading), None, _BATCH_VARIANTS)

    # Masks: one per element, broadcast over a batch of heads, size-1 dimensions, causal with n = m.
    _compare(impl, *_qkv(gen), _mixed_mask(gen, (_N, _M)), _MASK_VARIANTS)
    for leading, mask_shape in [((4,), (4, _N, _M)), ((2, 3), (_N, _M)), ((2, 3), (2, 1, _N, _M))]:
        _compare(impl, *_qkv(gen, leading), _mixed_mask(gen, mask_shape), _MASK_VARIANTS)
    _compare(impl, *_qkv(gen, (2,), n=6, m=6), torch.tril(torch.ones(6, 6, dtype=torch.bool)), _MASK_VARIANTS)

    _check_fully_masked_rows(impl, gen)
    Q, K, V = (t.requires_grad_() for t in _qkv(gen, (2, 3)))
    _check_gradients(_run(impl, Q, K, V), (Q, K, V), None, gen, _shapes(Q, K, V))

    # Large scores in float32 (|scores| in the hundreds: exp overflows without the max subtracted).
    Q, K, V = _qkv(gen, (2,), dtype=torch.float32, scale=12.0)
    out = _run(impl, Q, K, V)
    if not out.isfinite().all():
        fail("large scores (|Q Kᵀ/√d_k| in the hundreds) give inf or NaN, because exp overflows",
             "subtract each row's maximum before exp, or use your softmax from notebook 03",
             f"on float32 {_shapes(Q, K, V)}")
    if not close(out.double(), _reference(Q.double(), K.double(), V.double()), rtol=1e-4, atol=1e-4):
        fail("large scores (|Q Kᵀ/√d_k| in the hundreds) give wrong results though small ones are "
             "right, because exp overflows (inf/inf = NaN)",
             "subtract each row's maximum before exp, or use your softmax from notebook 03",
             f"on float32 {_shapes(Q, K, V)}")
    _compare(impl, *_qkv(gen, (2, 3), dtype=torch.float32), _mixed_mask(gen, (_N, _M)), _MASK_VARIANTS,
             rtol=1e-5, atol=1e-5)

    _check_half(impl, gen)
    passed(f"{_NAME} matches F.scaled_dot_product_attention: 2-D to 4-D inputs, n ≠ m, d_k ≠ d_v, masks "
           "(broadcast, causal, no allowed key → zeros), gradients, large scores, float16/bfloat16 rounded once")

"""``check_softmax``: the learner's ``softmax(x, dim)`` against ``torch.softmax``, with a diagnosis."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from ._harness import (call, call_without_builtins, check_signature, close, dtype_name, expect_tensor, fail, generator,
                       passed)

Softmax = Callable[[torch.Tensor, int], torch.Tensor]
NEG_INF = float("-inf")
HALF = (torch.float16, torch.bfloat16)
# The built-ins a softmax exercise must not call, patched to fail while the learner's code runs.
# nn.Softmax goes through F.softmax, and F.softmax through Tensor.softmax, so those are caught under any name;
# torch.softmax imported under another name is caught by the autograd graph instead (_check_gradients).
# The built-in softmaxes, under the names a learner reaches them by (an alias is the same function, so it is seen too).
_BUILTINS = {torch.softmax: "torch.softmax", torch.log_softmax: "torch.log_softmax", F.softmax: "F.softmax",
             F.log_softmax: "F.log_softmax", torch.special.softmax: "torch.special.softmax",
             torch.special.log_softmax: "torch.special.log_softmax", torch.Tensor.softmax: "x.softmax",
             torch.Tensor.log_softmax: "x.log_softmax"}
_BUILTIN_FIX = "compute it yourself from a max, torch.exp and a sum (the built-in is only the checks' reference)"


def check_softmax(impl: Softmax) -> None:
    """Check a learner's ``softmax(x, dim)`` against ``torch.softmax``; diagnose what is wrong.

    Checked: the signature ``(x, dim)``; shape, dtype and values on 1-, 2- and 3-D inputs (square and
    not) along every ``dim``, negative ones included, in float32 and float64 (float64 to float64
    precision); scores around +1000 and -1000 and slices with very different offsets; ``-inf`` entries
    (exactly 0) and an all ``-inf`` slice (NaN, like ``torch.softmax``); float16 and bfloat16 (dtype kept,
    correctly rounded, a 70,000-long float16 row); gradients against ``torch.softmax``'s; the input left
    unchanged; no call of the built-in.

    Mistakes it recognises: no max subtraction (NaN at large scores); the max of the whole tensor instead
    of the max along ``dim``; the wrong ``dim`` (a hard-coded ``-1`` or ``0``, or max and sum along
    different dims); a max or sum without ``keepdim=True`` (broadcast error or wrong rows); ``x.max(dim)``
    used as a tensor; not divided by the sum; the sum over every element; log-probabilities returned;
    float16/bfloat16 not computed in float32; the dtype not preserved (float16 in, float32 out); float64
    computed in float32; ``-inf`` entries not exactly 0 (an epsilon or a clamp); an all ``-inf`` slice
    made up instead of NaN; ``torch.softmax`` / ``F.softmax`` (or their ``log_softmax``) called inside;
    the output cut off from autograd; ``x`` modified in place; and, in a backward written by hand, the
    missing ``− p⟨g, p⟩`` term, the missing factor ``p``, or the sum of ``g`` in place of ``⟨g, p⟩``.
    """
    check_signature(impl, ["x", "dim"], "softmax")
    g = generator(0)
    _check_ordinary_inputs(impl, g)
    _check_float64_precision(impl, g)
    _check_extreme_scores(impl, g)
    _check_neg_inf(impl, g)
    _check_half_precision(impl, g)
    _check_gradients(impl, g)
    passed("check_softmax: every dim of 1-3-D inputs in float32/float64, scores of ±1000 and far-apart "
           "slices, -inf entries, float16/bfloat16 in float32, gradients, no built-in softmax")


# ---------------------------------------------------------------------------------------------- running it


KEEPDIM = ("a max or sum along dim drops that dimension (no keepdim=True), so it broadcasts against the wrong axis",
           "keep the reduced dimension with size 1 (keepdim), in the max and in the sum, so that each lines up with "
           "its own slice")


def diagnosing_crashes(impl: Softmax, what: str) -> Softmax:
    """``impl``, with the crashes that have a classic cause turned into that diagnosis (the steps' checks use it
    too)."""
    def run(x: torch.Tensor, dim: int) -> torch.Tensor:
        try:
            return impl(x, dim)
        except RuntimeError as error:
            if "must match the size of tensor" in str(error):
                fail(*KEEPDIM, f"{what}: PyTorch said: {str(error).splitlines()[0]}")
            raise
        except TypeError as error:
            if "return_types.max" in str(error) or "return_types.min" in str(error):
                fail("x.max(dim) returns a (values, indices) pair, not a tensor",
                     "take the values (the maximum itself), kept with size 1 along dim so that it lines up with x",
                     f"{what}: PyTorch said: {str(error).splitlines()[0]}")
            raise
    return run


def _name(x: torch.Tensor, dim: int) -> str:
    return f"softmax(x, dim={dim}) with x of shape {tuple(x.shape)} ({dtype_name(x.dtype)})"


def _run(impl: Softmax, x: torch.Tensor, dim: int) -> torch.Tensor:
    """The learner's ``softmax(x, dim)``: called safely, the built-ins forbidden, the input watched."""
    before = x.detach().clone()
    out = call_without_builtins(_name(x, dim), _BUILTINS, _BUILTIN_FIX, diagnosing_crashes(impl, _name(x, dim)), x, dim)
    if not torch.equal(x.detach(), before):
        fail("softmax modifies its input x in place (x -= ..., x.exp_(), x.sub_(...))",
             "write each step to a new tensor (shifted = x - m), so the caller's scores stay as they were")
    expect_tensor(_name(x, dim), out, returns="return the tensor of probabilities")
    if out.shape != x.shape:
        fail(f"{_name(x, dim)} returned shape {tuple(out.shape)}, expected x's shape {tuple(x.shape)}",
             "return one probability per score: the output has x's shape")
    if out.dtype != x.dtype:
        if x.dtype in HALF and out.dtype == torch.float32:
            fail(f"softmax returns float32 for a {dtype_name(x.dtype)} input",
                 "compute in float32, then cast the result back with .to(x.dtype) so the dtype is preserved")
        fail(f"softmax returns {out.dtype} for a {x.dtype} input",
             "return x's dtype (upcast only float16 and bfloat16, and cast those back with .to(x.dtype))")
    return out


# ---------------------------------------------------------------------------------------- the diagnosis


def _stable(x: torch.Tensor, dim: int, max_dim: int | None = None, sum_dim: int | None = None) -> torch.Tensor:
    m = x.amax(dim=dim if max_dim is None else max_dim, keepdim=True)
    exps = torch.exp(x - m)
    return exps / exps.sum(dim=dim if sum_dim is None else sum_dim, keepdim=True)


_NO_KEEPDIM = "no keepdim=True"  # reported as KEEPDIM, the same verdict as the broadcast error


def _without_keepdim(x: torch.Tensor, dim: int, max_keepdim: bool, sum_keepdim: bool) -> torch.Tensor:
    exps = torch.exp(x - x.amax(dim=dim, keepdim=max_keepdim))
    return exps / exps.sum(dim=dim, keepdim=sum_keepdim)


def _variants(x: torch.Tensor, dim: int) -> Iterator[tuple[str, str, Callable[[], torch.Tensor]]]:
    """The classic wrong softmaxes, most specific first: (mistake, fix, how to compute it)."""
    ndim = x.ndim
    d = dim % ndim
    for other in range(ndim):
        if other != d:
            shown = -1 if other == ndim - 1 else other
            yield (f"softmax normalises along dim={shown} when asked for dim={dim}",
                   "use the dim argument in both the max and the sum; a hard-coded -1 or 0 is right for one dim only",
                   lambda o=other: torch.softmax(x, dim=o))
    for other in range(ndim):
        if other != d:
            shown = -1 if other == ndim - 1 else other
            yield (f"the max is taken along dim={shown}, the sum along dim={dim}",
                   "the max and the sum belong to the same slices: take both along dim",
                   lambda o=other: _stable(x, dim, max_dim=o))
            yield (f"the sum is taken along dim={shown}, the max along dim={dim}",
                   "the max and the sum belong to the same slices: take both along dim",
                   lambda o=other: _stable(x, dim, sum_dim=o))
    for max_keepdim, sum_keepdim in [(False, True), (True, False), (False, False)]:
        yield (_NO_KEEPDIM, "", lambda m=max_keepdim, s=sum_keepdim: _without_keepdim(x, dim, m, s))
    yield ("softmax never divides by the sum, so the exps are not probabilities yet",
           "divide each slice's exps by their sum along dim", lambda: torch.exp(x - x.amax(dim=dim, keepdim=True)))
    yield ("softmax sums over every element of x, not along dim",
           "each slice is normalised by its own sum, along dim only",
           lambda: torch.exp(x - x.amax(dim=dim, keepdim=True)) / torch.exp(x - x.amax(dim=dim, keepdim=True)).sum())
    yield ("softmax returns log-probabilities (log_softmax), not probabilities",
           "return the probabilities themselves, without the log", lambda: torch.log_softmax(x, dim=dim))
    yield ("softmax does not subtract the max first, so exp overflows to inf at large scores (inf / inf = NaN) "
           "and underflows to 0 at very negative ones (0 / 0)",
           "softmax(x − m) = softmax(x) for any m, so shift by the max along dim before exp: every exponent is then "
           "≤ 0, and the largest is exactly 0",
           lambda: torch.exp(x) / torch.exp(x).sum(dim=dim, keepdim=True))
    yield ("softmax subtracts the max of the whole tensor (x.max()), not the max along dim, so a slice far below "
           "the overall max underflows to 0 / 0 = NaN",
           "each slice is shifted by its own max, so that its largest exponent is exactly 0",
           lambda: torch.exp(x - x.max()) / torch.exp(x - x.max()).sum(dim=dim, keepdim=True))


def _diagnose(x: torch.Tensor, dim: int, out: torch.Tensor, expected: torch.Tensor) -> None:
    """``out`` differs from ``expected``: name the wrong variant it matches, else say how far off it is."""
    finite = torch.isfinite(expected)
    bad = int((~torch.isfinite(out) & finite).sum())
    error = (out.detach().double() - expected.double())[finite & torch.isfinite(out)].abs()
    evidence = f"{_name(x, dim)}: "
    if bad:
        evidence += f"NaN or inf at {bad} of {int(finite.sum())} entries where torch.softmax is finite"
    if error.numel() and error.max() > 0:
        evidence += ("; elsewhere " if bad else "") + f"off by up to {error.max().item():.2e}"
    for mistake, fix, compute in _variants(x, dim):
        try:
            candidate = compute()
        except RuntimeError:  # that variant crashes on this input, so it is not what the learner wrote
            continue
        if close(out, candidate):
            if mistake == _NO_KEEPDIM:
                fail(*KEEPDIM, evidence)
            fail(mistake, fix, evidence)
    fail(f"{_name(x, dim)} differs from torch.softmax",
         "softmax(x) = exp(x − m) / Σ exp(x − m) along dim, m the max along dim: compare each of your steps with "
         "stable_softmax in 'Build it step by step'", evidence)


def _compare(impl: Softmax, x: torch.Tensor, dim: int) -> torch.Tensor:
    out = _run(impl, x, dim)
    expected = torch.softmax(x, dim=dim)
    if not close(out, expected):
        _diagnose(x, dim, out, expected)
    return out


# ------------------------------------------------------------------------------------------- the checks


def _check_ordinary_inputs(impl: Softmax, g: torch.Generator) -> None:
    for shape in [(5,), (3, 5), (4, 4), (2, 3, 4)]:
        for dtype in (torch.float32, torch.float64):
            x = 3 * torch.randn(shape, generator=g, dtype=dtype)
            for dim in range(-len(shape), len(shape)):
                _compare(impl, x, dim)


def _check_float64_precision(impl: Softmax, g: torch.Generator) -> None:
    x = 3 * torch.randn(6, 9, generator=g, dtype=torch.float64)
    out = _run(impl, x, -1)
    expected = torch.softmax(x, dim=-1)
    if not close(out, expected, rtol=1e-12, atol=1e-15):
        error = (out - expected).abs().max().item()
        fail("float64 inputs are computed in float32 (about 7 digits, not 16)",
             "upcast only float16 and bfloat16; float64 must stay float64 (x.float() turns it into float32)",
             f"{_name(x, -1)}: off by up to {error:.1e}, float64 rounding is about 1e-16")


def _check_extreme_scores(impl: Softmax, g: torch.Generator) -> None:
    base = 3 * torch.randn(3, 6, generator=g)
    for x in (base + 1000, base - 1000):  # one offset for every slice: overflow, then underflow
        _compare(impl, x, -1)
    # A very different offset for each slice: only the max along dim keeps every slice finite.
    offsets = torch.tensor([[0.0], [-500.0], [500.0]])
    _compare(impl, base + offsets, -1)
    _compare(impl, (base + offsets).T.contiguous(), 0)


def _check_neg_inf(impl: Softmax, g: torch.Generator) -> None:
    x = 3 * torch.randn(4, 6, generator=g)
    masked = torch.zeros(4, 6, dtype=torch.bool)
    masked[0, 1] = masked[1, 0] = masked[1, 5] = masked[2, 2:5] = masked[3, 3] = True  # never a whole row or column
    x = x.masked_fill(masked, NEG_INF)
    for dim in (-1, 0):
        out = _run(impl, x, dim)
        leaked = out.detach()[masked]
        if not (leaked == 0).all():
            fail(f"a -inf score gets probability {leaked.abs().max().item():.1e}, not exactly 0",
                 "no epsilon and no clamp (exp(-inf - m) is exactly 0 already, so masked entries vanish on their own)",
                 f"{_name(x, dim)}")
        expected = torch.softmax(x, dim=dim)
        if not close(out, expected):
            _diagnose(x, dim, out, expected)
    x = x.clone()
    x[2] = NEG_INF  # a slice with nothing allowed: 0 / 0
    out = _run(impl, x, -1)
    if not torch.isnan(out[2]).all():
        fail("an all -inf slice comes out as numbers, not NaN as with torch.softmax",
             "leave it NaN, as the docstring promises (exp(-inf - (-inf)) is NaN by itself; a made-up answer hides "
             "a masking bug, and attention handles fully masked rows itself)",
             f"{_name(x, -1)}: row 2 is all -inf, yours gave {[round(v, 4) for v in out[2].tolist()]}")
    if not close(out, torch.softmax(x, dim=-1)):
        _diagnose(x, -1, out, torch.softmax(x, dim=-1))


def _ulps(out: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> float:
    """Largest error of ``out`` against ``exact`` in units of ``dtype``'s spacing there (0.5 = correctly rounded)."""
    info = torch.finfo(dtype)
    spacing = info.eps * torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(info.tiny))))
    return ((out.double() - exact).abs() / spacing).max().item()


def _check_half_precision(impl: Softmax, g: torch.Generator) -> None:
    for dtype in HALF:
        x = (3 * torch.randn(3, 7, generator=g)).to(dtype)
        _run(impl, x, -1)  # the dtype is checked there
    # 70,000 nearly equal scores: their exps add up to about 70,000, more than float16 holds (65,504).
    x = (0.01 * torch.randn(2, 70_000, generator=g)).to(torch.float16)
    out = _run(impl, x, -1)
    if not close(out, torch.softmax(x, dim=-1)):
        sums = [round(s, 3) for s in out.double().sum(dim=-1).tolist()]
        fail("float16 inputs are computed in float16, not in float32, and a sum of 70,000 exps does not fit in "
             "float16 (max 65,504)",
             "upcast with x.float() when x.dtype is float16 or bfloat16, compute, then cast back with .to(x.dtype)",
             f"{_name(x, -1)}: your rows sum to {sums} instead of 1")
    for dtype in HALF:
        x = (2 * torch.randn(8, 257, generator=g)).to(dtype)
        out = _run(impl, x, -1)
        error = _ulps(out, torch.softmax(x.double(), dim=-1), dtype)
        if error > 1:
            name = dtype_name(dtype)
            fail(f"{name} inputs are computed in {name}, not in float32, so every step rounds and the errors add up",
                 "upcast with x.float() when x.dtype is float16 or bfloat16, compute, then cast back with .to(x.dtype)",
                 f"{_name(x, -1)}: off by up to {error:.1f} rounding steps of {name}; "
                 f"computed in float32 and rounded once it is within 0.5")


_BUILTIN_NODES = {"SoftmaxBackward0", "LogSoftmaxBackward0"}


def _graph(node: Any) -> set[str]:
    """The names of the autograd nodes that lead to ``node`` (the operations the output was computed with)."""
    names: set[str] = set()
    seen: set[int] = set()
    stack = [node]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        names.add(type(node).__name__)
        stack.extend(parent for parent, _ in node.next_functions)
    return names


def _check_gradients(impl: Softmax, g: torch.Generator) -> None:
    base = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    base[0, 1, 2] = base[2, 0, 0] = NEG_INF  # masked entries: their gradient is exactly 0
    upstream = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    for dim in (1, -1):
        ours = base.clone().requires_grad_(True)
        theirs = base.clone().requires_grad_(True)
        out = _run(impl, ours, dim)
        if out.grad_fn is not None and _BUILTIN_NODES & _graph(out.grad_fn):
            fail("softmax calls PyTorch's built-in softmax (through a route the check cannot see by name: its "
                 "backward is in the graph)", _BUILTIN_FIX)
        if out.grad_fn is None:
            fail("softmax's output is cut off from autograd (it has no grad_fn), so no gradient reaches the scores",
                 "build it from torch operations, without torch.no_grad(), .detach() on the result, .data, .item() "
                 "or .numpy()")
        call("backward() through your softmax", (out * upstream).sum().backward)
        (torch.softmax(theirs, dim=dim) * upstream).sum().backward()
        if ours.grad is not None and not close(ours.grad, theirs.grad):
            _diagnose_backward(ours.grad, torch.softmax(base, dim=dim), upstream, dim, _name(base, dim))
        if ours.grad is None or not close(ours.grad, theirs.grad):
            error = float("nan") if ours.grad is None else (ours.grad - theirs.grad).abs().max().item()
            fail(f"the gradient of {_name(base, dim)} differs from torch.softmax's",
                 "a backward written by hand must return p ⊙ (g − ⟨g, p⟩), the sum along dim, in g's dtype; "
                 "left to autograd, do not detach or replace any term that depends on x (only the max may be "
                 "detached)", f"largest difference {error:.2e}")


def _diagnose_backward(grad: torch.Tensor, p: torch.Tensor, g: torch.Tensor, dim: int, name: str) -> None:
    """Name the classic mistakes of a hand-written backward, p ⊙ (g − ⟨g, p⟩), when the gradient matches one."""
    dot = (g * p).sum(dim=dim, keepdim=True)
    variants = [
        (p * g, "the backward returns p ⊙ g: the term − p ⟨g, p⟩ is missing",
         "subtract p times the sum of g ⊙ p along dim: p ⊙ (g − ⟨g, p⟩)"),
        (g - dot, "the backward returns g − ⟨g, p⟩ without multiplying by p",
         "multiply by p: p ⊙ (g − ⟨g, p⟩) (the Jacobian is diag(p) − p pᵀ)"),
        (p * (g - g.sum(dim=dim, keepdim=True)), "the backward subtracts the sum of g instead of ⟨g, p⟩ = Σ g ⊙ p",
         "weight the sum by p: p ⊙ (g − ⟨g, p⟩), with ⟨g, p⟩ = Σ g ⊙ p along dim"),
    ]
    for wrong, mistake, fix in variants:
        if close(grad, wrong):
            fail(mistake, fix, f"the gradient of {name}")

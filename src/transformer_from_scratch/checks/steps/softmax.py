"""Self-checks for the steps of notebook 03 (softmax): the textbook formula, the stable softmax, the backward pass
by hand, and the autograd Function that puts them together."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from .._harness import call, call_without_builtins, close, crashed, diagnose, expect_tensor, fail, generator, passed
from ..softmax import KEEPDIM, diagnosing_crashes

Softmax = Callable[[torch.Tensor, int], torch.Tensor]

# The built-ins a softmax step must not call (the notebook compares with them; it does not build on them).
_NO_SOFTMAX = {torch.softmax: "torch.softmax", F.softmax: "F.softmax", torch.Tensor.softmax: "x.softmax",
               torch.special.softmax: "torch.special.softmax", torch.log_softmax: "torch.log_softmax",
               F.log_softmax: "F.log_softmax", torch.Tensor.log_softmax: "x.log_softmax",
               torch._softmax_backward_data: "torch._softmax_backward_data"}
_BUILTIN_FIX = "write it with torch.exp and sums; torch.softmax is the reference this notebook compares with"
_KEEPDIM, _KEEPDIM_FIX = KEEPDIM


def _what(name: str, x: torch.Tensor, dim: int) -> str:
    return f"{name}(x of shape {tuple(x.shape)}, dim={dim})"


def _call(name: str, fn: Softmax, x: torch.Tensor, dim: int) -> Any:
    """The learner's step on ``x`` (not changed by it), with its built-ins forbidden and the classic crashes named."""
    what = _what(name, x, dim)
    before = x.detach().clone()

    out = call_without_builtins(what, _NO_SOFTMAX, _BUILTIN_FIX, diagnosing_crashes(fn, what), x, dim)
    if not torch.equal(x.detach(), before):
        fail(f"{name} changes its input x in place (x -= ..., x.exp_())",
             "write each step to a new tensor (shifted = x - m), so the caller's scores stay as they were")
    return out


def _moderate_cases(gen: torch.Generator) -> list[tuple[torch.Tensor, int]]:
    """Scores of size about 1: the square case first (it hides a missing keepdim from the shapes)."""
    return [(torch.randn(4, 4, generator=gen, dtype=torch.float64), -1),
            (torch.randn(5, generator=gen, dtype=torch.float64), 0),
            (torch.randn(3, 5, generator=gen, dtype=torch.float64), 0),
            (torch.randn(2, 3, 4, generator=gen, dtype=torch.float64), 1),
            (torch.randn(2, 3, 4, generator=gen, dtype=torch.float64), -1)]


def _variants(name: str, x: torch.Tensor, dim: int, shift: bool) -> list[tuple[Callable[[], torch.Tensor], str, str]]:
    """The classic wrong softmaxes of a forward step, with the max subtracted first (``shift``) or not, as
    ``diagnose`` takes them."""
    def exps(keepdim: bool = True) -> torch.Tensor:
        return torch.exp(x - x.amax(dim=dim, keepdim=keepdim)) if shift else torch.exp(x)

    others = [o for o in range(x.ndim) if o != dim % x.ndim]
    return [
        *[(lambda o=o: torch.softmax(x, dim=o), f"{name} normalises along dim={o - x.ndim if o == x.ndim - 1 else o} "
           f"when asked for dim={dim}", "use the dim argument in the max and in the sum; a hard-coded -1 or 0 is "
           "right for one dim only") for o in others],
        (lambda: exps() / exps().sum(dim=dim), _KEEPDIM, _KEEPDIM_FIX),
        (lambda: exps(False) / exps(False).sum(dim=dim, keepdim=True), _KEEPDIM, _KEEPDIM_FIX),
        (lambda: exps(False) / exps(False).sum(dim=dim), _KEEPDIM, _KEEPDIM_FIX),
        (lambda: exps() / exps().sum(), f"{name} sums over every element of x, not along dim",
         "the normaliser of a slice is the sum along dim only, one per slice"),
        (exps, f"{name} never divides by the sum, so the exponentials are not probabilities yet",
         "divide them by their sum along dim"),
    ]


def check_naive_softmax(naive_softmax: Softmax) -> None:
    """Check ``naive_softmax(x, dim)``: the textbook exp(x) / sum(exp(x)) along ``dim``, with no shift.

    On scores of size about 1 (float64, 1-3 dimensions, several dims), against torch.softmax. Mistakes it recognises:
    the sum without keepdim=True (a square input hides it from the shapes); the sum over every element; the wrong dim
    (a hard-coded -1 or 0); the max already subtracted (that is the next step: this one is the formula as written, so
    that the notebook can show how it breaks); torch.softmax called (the built-in this notebook builds).
    """
    gen = generator(0)
    for x, dim in _moderate_cases(gen):
        what = _what("naive_softmax", x, dim)
        out = expect_tensor(what, _call("naive_softmax", naive_softmax, x, dim), x.shape,
                            "one probability per score: the output has x's shape",
                            dtype=x.dtype)
        diagnose(what, out, torch.softmax(x, dim=dim), _variants("naive_softmax", x, dim, shift=False),
                 "exponentiate every score, then divide by the sum of the exponentials along dim")
    big = torch.tensor([1000.0, 999.0])
    out = _call("naive_softmax", naive_softmax, big, 0)
    if isinstance(out, torch.Tensor) and torch.isfinite(out).all():
        fail("naive_softmax already subtracts the max (it gives the right answer for scores of 1000): that is "
             "Step 2", "write the formula exactly as the textbook does here, exp(x) divided by its sum, so that the "
             "next cells can show what goes wrong without the shift",
             f"naive_softmax([1000., 999.], 0) = {out.tolist()}")
    passed("naive_softmax: exp(x) / sum(exp(x)) along dim, for 1-3-D inputs and several dims (and NaN at scores of "
           "1000, as the formula gives)")


def check_stable_softmax(stable_softmax: Softmax) -> None:
    """Check ``stable_softmax(x, dim)``: softmax with the max along ``dim`` subtracted first.

    Against torch.softmax on scores of size about 1, on scores near +1000 and -1000 (float32: the textbook formula
    overflows and underflows there), on slices 2000 apart, and with -inf entries and an all -inf slice (NaN, as
    torch.softmax gives). Mistakes it recognises: no shift at all (NaN at scores of 1000); the max of the whole tensor
    (x.max()) instead of each slice's, which leaves a slice far below the top at 0 / 0; the max without keepdim=True;
    x.max(dim), which returns a (values, indices) pair; x changed in place; torch.softmax called.
    """
    gen = generator(1)
    hard = torch.randn(3, 6, generator=gen)
    cases = _moderate_cases(gen) + [
        (hard + 1000, -1), (hard - 1000, -1),
        (torch.stack([hard[0] + 1000, hard[1] - 1000, hard[2]]), -1),  # slices 2000 apart
        (torch.stack([hard[0] + 1000, hard[1] - 1000, hard[2]]).T.contiguous(), 0),
        (torch.tensor([[0.0, float("-inf"), 1.5], [float("-inf")] * 3]), -1),
    ]
    for x, dim in cases:
        what = _what("stable_softmax", x, dim)
        out = expect_tensor(what, _call("stable_softmax", stable_softmax, x, dim), x.shape,
                            "one probability per score: same shape as x", dtype=x.dtype)
        shifted_by_all = lambda: (torch.exp(x - x.max())  # noqa: E731
                                  / torch.exp(x - x.max()).sum(dim=dim, keepdim=True))
        diagnose(what, out, torch.softmax(x, dim=dim), [
            (lambda: torch.exp(x) / torch.exp(x).sum(dim=dim, keepdim=True),
             "stable_softmax does not subtract the max, so exp overflows to inf at large scores (inf / inf = NaN)",
             "softmax(x − m) = softmax(x) for any m: shift by the max along dim, so that every exponent is ≤ 0"),
            (shifted_by_all, "stable_softmax subtracts the max of the whole tensor (x.max()), not the max along dim, "
             "so a slice far below the top underflows to 0 / 0 = NaN", "each slice is shifted by its own max, so "
             "that its largest exponent is exactly 0"),
            *_variants("stable_softmax", x, dim, shift=True),
        ], "softmax(x) = exp(x − m) / Σ exp(x − m) along dim, m the max along dim: find the part of yours that "
           "differs")
    passed("stable_softmax: equals torch.softmax for 1-3-D inputs, scores of ±1000 and slices 2000 apart, exactly 0 "
           "at -inf, NaN for an all -inf slice; x left unchanged")


def check_softmax_backward(softmax_backward: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]) -> None:
    """Check ``softmax_backward(p, g, dim)``: dL/dx = p ⊙ (g − ⟨g, p⟩) with ⟨g, p⟩ summed along ``dim``.

    p = softmax(x) and an upstream gradient g, float64, against autograd through torch.softmax. Mistakes it
    recognises: the term ⟨g, p⟩ left out (p ⊙ g); the factor p left out (g − ⟨g, p⟩); the sum of g instead of g ⊙ p;
    the sum without keepdim=True (a square input hides it from the shapes); the sum over every element.
    """
    gen = generator(2)
    for shape, dim in [((4, 4), -1), ((6,), 0), ((3, 5), 0), ((2, 3, 4), 1)]:
        x = torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)
        g = torch.randn(*shape, generator=gen, dtype=torch.float64)
        p = torch.softmax(x, dim=dim)
        expected = torch.autograd.grad(p, x, g)[0]
        p = p.detach()
        what = f"softmax_backward(p, g of shape {shape}, dim={dim})"
        before = (p.clone(), g.clone())
        out = call_without_builtins(what, _NO_SOFTMAX, "write the formula yourself; autograd through torch.softmax "
                                    "is the reference this step is checked against", softmax_backward, p, g, dim)
        if not (torch.equal(p, before[0]) and torch.equal(g, before[1])):
            fail("softmax_backward changes p or g in place", "compute the result into a new tensor (g * p is one)")
        out = expect_tensor(what, out, p.shape, "the gradient has the shape of the scores", dtype=p.dtype)
        dot = (g * p).sum(dim=dim, keepdim=True)
        diagnose(what, out, expected, [
            (lambda: p * g, "the term ⟨g, p⟩ is missing: p ⊙ g is only the diagonal of the Jacobian",
             "subtract p times the sum of g ⊙ p along dim: p ⊙ (g − ⟨g, p⟩)"),
            (lambda: g - dot, "the factor p is missing: g − ⟨g, p⟩ must be multiplied by p, entry by entry",
             "multiply by p: p ⊙ (g − ⟨g, p⟩)"),
            (lambda: p * (g - g.sum(dim=dim, keepdim=True)), "softmax_backward sums g, not g ⊙ p: ⟨g, p⟩ = Σ_j g_j p_j",
             "multiply g by p before summing along dim"),
            (lambda: p * (g - (g * p).sum(dim=dim)), _KEEPDIM, _KEEPDIM_FIX),
            (lambda: p * (g - (g * p).sum()),
             "softmax_backward sums g ⊙ p over every element, not along dim: each slice has its own ⟨g, p⟩",
             "sum along dim only, with keepdim=True"),
        ], "compute p ⊙ (g − ⟨g, p⟩), with ⟨g, p⟩ the sum of g ⊙ p along dim, kept with keepdim=True")
    passed("softmax_backward: p ⊙ (g − ⟨g, p⟩) equals autograd's gradient through torch.softmax along every dim tried")


def check_softmax_by_hand(SoftmaxByHand: type[torch.autograd.Function]) -> None:  # noqa: N803 - the class itself
    """Check ``SoftmaxByHand``, a torch.autograd.Function: ``SoftmaxByHand.apply(x, dim)`` is the softmax, its
    backward pass the hand-written formula, and it saves one tensor, the output p.

    float64 inputs, dims -1 and 0, values and gradients against torch.softmax. Mistakes it recognises: backward
    returning one gradient where forward took two inputs (x and dim: dim's gradient is None); the input x saved
    instead of the output p; dim not kept for backward (ctx.dim); ctx.saved_tensors, a tuple, used as p without
    unpacking it; more than one tensor saved; torch.softmax called.
    """
    gen = generator(3)
    for shape, dim in [((3, 5), -1), ((4, 3), 0)]:
        x = torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)
        g = torch.randn(*shape, generator=gen, dtype=torch.float64)
        what = f"SoftmaxByHand.apply(x of shape {shape}, {dim})"
        saved: list[torch.Tensor] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = call_without_builtins(what, _NO_SOFTMAX, "compute p in forward with your stable_softmax",
                                        SoftmaxByHand.apply, x, dim)
        expected = torch.softmax(x.detach(), dim=dim)
        out = expect_tensor(what, out, x.shape, "forward returns p, one probability per score", dtype=x.dtype)
        if not close(out, expected):
            fail(f"{what} differs from torch.softmax", "forward computes p with your stable_softmax",
                 f"off by up to {(out.detach() - expected).abs().max().item():.3g}")
        if not out.requires_grad:
            fail("SoftmaxByHand's output carries no gradient", "call it as SoftmaxByHand.apply(x, dim), and return p "
                 "from forward (not a tensor made under torch.no_grad() outside it)")
        if len(saved) != 1:
            fail(f"forward saves {len(saved)} tensors for the backward pass, expected one, p",
                 "save p alone with ctx.save_for_backward; keep dim, an int, as an attribute of ctx")
        if saved[0] is x or (saved[0].shape == x.shape and torch.equal(saved[0], x.detach())):
            fail("forward saves the input x, not the output p", "save p, the result: backward's formula needs only "
                 "p, and p is what autograd would otherwise have to recompute")
        grad = _backward(what, out, x, g)
        reference = torch.autograd.grad(torch.softmax(x, dim=dim), x, g)[0]
        if not close(grad, reference):
            fail(f"the gradient of {what} differs from autograd's through torch.softmax",
                 "backward returns your softmax_backward(p, g, ctx.dim) for x, and None for dim",
                 f"off by up to {(grad - reference).abs().max().item():.3g}")
    passed("SoftmaxByHand: the softmax forward, one tensor saved (p), the hand-written gradient along dims -1 and 0")


def _backward(what: str, out: torch.Tensor, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """x's gradient through the learner's backward, with the classic crashes named."""
    try:
        return torch.autograd.grad(out, x, g)[0]
    except NotImplementedError:
        return call(f"the backward pass of {what}", torch.autograd.grad, out, x, g)[0]
    except RuntimeError as error:
        if "incorrect number of gradients" in str(error):
            fail("backward returns one gradient, but forward took two inputs, x and dim",
                 "return a pair: the gradient for x, and None for dim (an int has no gradient)",
                 f"PyTorch said: {str(error).splitlines()[0]}")
        crashed(f"the backward pass of {what}", error)
    except AttributeError as error:
        if "dim" in str(error):
            fail("backward reads ctx.dim, which forward never set", "keep dim for backward in forward: ctx.dim = dim",
                 f"{type(error).__name__}: {str(error).splitlines()[0]}")
        crashed(f"the backward pass of {what}", error)
    except TypeError as error:
        if "tuple" in str(error) or "converted to an index" in str(error):  # tensor * tuple: a sequence repeat
            fail("backward uses ctx.saved_tensors, a tuple, as if it were p", "unpack the one tensor it holds first",
                 f"{type(error).__name__}: {str(error).splitlines()[0]}")
        crashed(f"the backward pass of {what}", error)
    except Exception as error:  # noqa: BLE001 - any crash of the learner's backward becomes a verdict
        crashed(f"the backward pass of {what}", error)

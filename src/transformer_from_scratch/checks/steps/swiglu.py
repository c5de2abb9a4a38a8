"""Self-checks for the steps of notebook 07 (SwiGLU): SiLU from the sigmoid's definition, the gated product, the
feed-forward network from three weight matrices, and its hidden width rounded up to a multiple of 64."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ... import reference
from .._harness import (BuiltinSpy, call, call_without_builtins, crash_of, diagnose, expect_tensor, fail, first_line,
                        generator, passed)

_NO_SIGMOID = {torch.sigmoid: "torch.sigmoid", Tensor.sigmoid: "torch.sigmoid", torch.special.expit: "torch.sigmoid",
               F.silu: "F.silu", torch._C._nn.silu: "F.silu"}  # nn.Sigmoid, F.sigmoid and nn.SiLU go through these
_NO_SILU = {F.silu: "F.silu", torch._C._nn.silu: "F.silu"}


def _silu(t: Tensor) -> Tensor:
    return t * torch.sigmoid(t)


def check_silu_draft(silu_draft: Callable[[Tensor], Tensor]) -> None:
    """Check ``silu_draft(z)``: z · σ(z) element by element, σ written from its definition (no torch.sigmoid or
    F.silu).

    Checked in float64 on a grid from -8 to 8, random inputs of two shapes, and inputs out to ±1000, against F.silu.
    Mistakes it recognises: the sigmoid alone (the factor z missing); the sign in the exponent flipped (z · σ(-z));
    the sigmoid written as exp(z) / (1 + exp(z)), which gives NaN for large z; ReLU; z + σ(z) (added, not
    multiplied); math.exp used on a tensor; z changed in place; torch.sigmoid or F.silu used (the step writes the
    sigmoid itself).
    """
    gen = generator(0)
    cases = [torch.linspace(-8, 8, 33, dtype=torch.float64), 4 * torch.randn(3, 5, generator=gen, dtype=torch.float64),
             torch.tensor([-1000.0, -100.0, -30.0, 30.0, 100.0, 1000.0], dtype=torch.float64),
             4 * torch.randn(2, 3, 4, generator=gen, dtype=torch.float64)]
    fix = "silu(z) = z · σ(z) with σ(z) = 1 / (1 + exp(-z)), element by element"
    for z in cases:
        what = f"silu_draft(z) with z of shape {tuple(z.shape)}" + (" (up to ±1000)" if z.abs().max() > 100 else "")
        before = z.clone()
        with BuiltinSpy(_NO_SIGMOID) as spy:
            try:
                out = call(what, silu_draft, z)
            except AssertionError as error:
                if isinstance(error.__cause__, (TypeError, ValueError)) and any(
                        words in str(error.__cause__) for words in ("one element tensors", "must be real number")):
                    fail("silu_draft uses math.exp (or another function of one Python number) on a tensor",
                         "use torch.exp, which acts on every element of the tensor at once",
                         str(error.__cause__).splitlines()[0])
                raise
        if spy.used:
            fail(f"silu_draft calls {spy.used[0]}: this step writes the sigmoid from its definition",
                 "σ(z) = 1 / (1 + exp(-z)) with torch.exp; the final class may use torch.sigmoid, never F.silu")
        if not torch.equal(z, before):
            fail("silu_draft changes its input z in place (z.mul_, z *= ..., torch.exp_)",
                 "return a new tensor: the caller still needs z")
        out = expect_tensor(what, out, z.shape, "SiLU acts element by element: the result has z's shape", dtype=z.dtype)
        diagnose(what, out, F.silu(z), [
            (lambda: torch.sigmoid(z), "silu_draft returns the sigmoid alone: the factor z is missing",
             "multiply by z: silu(z) = z · σ(z)"),
            (lambda: z * torch.sigmoid(-z),
             "the sign in the exponent is flipped: 1 / (1 + exp(z)) is σ(-z), not σ(z)",
             "σ(z) = 1 / (1 + exp(-z)): near 1 for large z, near 0 for very negative z"),
            (lambda: z * torch.exp(z) / (1 + torch.exp(z)), "the sigmoid is written as exp(z) / (1 + exp(z)), which "
             "overflows: exp(z) is inf for large z, and inf / inf is NaN",
             "use the form 1 / (1 + exp(-z)): for very negative z, exp(-z) = inf only gives 1 / inf = 0"),
            (lambda: torch.relu(z), "silu_draft returns ReLU(z) = max(z, 0), which is SiLU only far from 0",
             "multiply z by its sigmoid: smooth near 0 and slightly negative for z < 0"),
            (lambda: z + torch.sigmoid(z), "silu_draft adds z and σ(z) instead of multiplying them",
             "silu(z) = z · σ(z), a product"),
        ], fix, evidence="F.silu(z) is the reference")
    passed("silu_draft: z · σ(z) on a grid from -8 to 8, random inputs of 2 shapes, and ±30 to ±1000 (no NaN), "
           "with the sigmoid written by hand")


def check_gated(gated: Callable[[Tensor, Tensor, Callable[[Tensor], Tensor]], Tensor]) -> None:
    """Check ``gated(a, b, activation)``: activation(a) ⊙ b, element by element (GLU with torch.sigmoid, SwiGLU's
    hidden vector with a SiLU).

    Checked in float64 with a sigmoid and a SiLU activation, on shapes (3, 5) and (2, 3, 4). Mistakes it recognises:
    the activation applied to the values b instead of the gate input a (roles swapped); the activation applied after
    the product; the activation on both; a and b added, not multiplied; no activation; the values b missing (the
    gate alone); the activation argument ignored (a sigmoid or a SiLU always); a matrix product instead of ⊙.
    """
    gen = generator(1)
    fix = "apply the activation to the gate input a only, then multiply by the values b element by element (⊙)"
    for shape in [(3, 5), (2, 3, 4)]:
        a = 3 * torch.randn(shape, generator=gen, dtype=torch.float64)
        b = torch.randn(shape, generator=gen, dtype=torch.float64)
        for act, name, other, other_name in [(torch.sigmoid, "torch.sigmoid", _silu, "a SiLU"),
                                             (_silu, "a SiLU", torch.sigmoid, "a sigmoid")]:
            what = f"gated(a, b, {name}) on shape {shape}"
            try:
                out = call(what, gated, a.clone(), b.clone(), act)
            except AssertionError as error:
                if isinstance(error.__cause__, RuntimeError) and "mat1 and mat2" in str(error.__cause__):
                    fail("gated uses a matrix product (@ or torch.matmul), not the element-wise product",
                         "⊙ multiplies matching elements: * between two tensors of the same shape",
                         str(error.__cause__).splitlines()[0])
                raise
            out = expect_tensor(what, out, a.shape, "⊙ is element by element: the result has the shape of a and b "
                                "(not a matrix product, no sum)")
            diagnose(what, out, act(a) * b, [
                (lambda: act(b) * a, "the activation is applied to the values b instead of the gate input a "
                 "(the roles of a and b are swapped)", "the gate input a goes through the activation, the values b "
                 "do not"),
                (lambda: act(a * b), "the activation is applied after the product, to a ⊙ b",
                 "apply it to a alone, then multiply by b"),
                (lambda: act(a) * act(b), "the activation is applied to both a and b", "only the gate input a goes "
                 "through it; the values b pass unchanged"),
                (lambda: act(a) + b, "a and b are added, not multiplied", "the gate scales each value: a product, "
                 "element by element"),
                (lambda: a * b, "there is no activation: a ⊙ b", "pass a through the activation first"),
                (lambda: act(a), "the values b are missing: it returns the gate alone", "multiply the gate by b"),
                (lambda: other(a) * b, f"gated ignores its activation argument: given {name}, it applied {other_name}",
                 "call the function it is given, activation(...), rather than a fixed one"),
            ], fix)
    passed("gated: activation(a) ⊙ b with a sigmoid (GLU) and a SiLU (SwiGLU), on 2-D and 3-D shapes")


def check_swiglu_draft(swiglu_draft: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]) -> None:
    """Check ``swiglu_draft(x, W1, W2, W3)``: W2 (silu(W1 x) ⊙ W3 x) for every row of x, weights stored (d_out, d_in).

    Checked in float64 against the course's reference (F.linear and F.silu), on a square case first (d_ff = d_model,
    where a missing transpose raises no error), then d_ff > d_model and d_ff < d_model with several leading shapes.
    Mistakes it recognises: W1 and W3 swapped in roles (silu on the W3 path); silu after the product; silu on the
    output; W2 applied before the product (to each path, or to the gate alone); a sigmoid gate (GLU); no activation;
    the value path missing (W3 unused); silu on both paths; the weights applied without their transpose (all three,
    or W2); a shape crash; F.silu used (the step uses your silu_draft).
    """
    gen = generator(2)
    fix = "SwiGLU is W2 (silu(W1 x) ⊙ W3 x), each weight applied to the rows of x as Linear applies its own: find " \
          "the part of yours that differs"
    crash = "a product fails on the shapes: apply each weight to the rows of x as x @ W.T (W @ x suits one column " \
            "vector, not rows), check which weight each path uses, and apply W2 last, to the (..., d_ff) product"
    for d_model, d_ff, leading in [(4, 4, (5,)), (8, 12, (2, 5)), (6, 4, ()), (6, 10, (2, 3))]:
        x = torch.randn(*leading, d_model, generator=gen, dtype=torch.float64)
        W1, W3 = (torch.randn(d_ff, d_model, generator=gen, dtype=torch.float64) / math.sqrt(d_model) for _ in "13")
        W2 = torch.randn(d_model, d_ff, generator=gen, dtype=torch.float64) / math.sqrt(d_ff)
        what = (f"swiglu_draft(x of shape {tuple(x.shape)}, W1 {tuple(W1.shape)}, W2 {tuple(W2.shape)}, "
                f"W3 {tuple(W3.shape)})")
        try:
            out = call_without_builtins(what, _NO_SILU, "use your silu_draft from Step 1 (or your gated from Step 2 "
                                        "with it); F.silu is what this notebook builds", swiglu_draft, x, W1, W2, W3)
        except AssertionError as error:
            cause = crash_of(error)
            if isinstance(cause, RuntimeError) and any(word in str(cause) for word in ("shape", "size")):
                fail(f"{what} crashes on a shape mismatch", crash, first_line(cause))
            raise
        out = expect_tensor(what, out, x.shape, "the output has x's shape: W2 maps the hidden (..., d_ff) back to "
                            "d_model")
        a, b = F.linear(x, W1), F.linear(x, W3)
        down = lambda h: F.linear(h, W2)  # noqa: E731
        variants = [
            (lambda: down(F.silu(b) * a), "W1 and W3 are swapped in roles: silu is applied to the W3 path",
             "the gate is silu(W1 x), the values W3 x; with trained weights the roles are not interchangeable"),
            (lambda: down(F.silu(a * b)), "silu is applied after the product, to W1 x ⊙ W3 x",
             "apply silu to W1 x alone, then multiply by W3 x"),
            (lambda: F.silu(down(a * b)), "silu is applied to the output, after W2", "silu belongs to the gate, "
             "before the product: W2 (silu(W1 x) ⊙ W3 x)"),
            (lambda: down(F.silu(a)) * down(b), "W2 is applied to each path before the product",
             "multiply the two (..., d_ff) paths first, then apply W2 once, to the product"),
            (lambda: down(F.silu(a)) * b, "W2 is applied to the gate alone, before the product",
             "multiply the two (..., d_ff) paths first, then apply W2 once, to the product"),
            (lambda: down(torch.sigmoid(a) * b), "the gate is sigmoid(W1 x): that is GLU, not SwiGLU",
             "SwiGLU's gate is silu(W1 x) = W1 x · σ(W1 x)"),
            (lambda: down(a * b), "there is no activation: W2 (W1 x ⊙ W3 x) is a bilinear layer, not SwiGLU",
             "pass the gate's input W1 x through silu"),
            (lambda: down(F.silu(a)), "the value path is missing: W3 is never used (a plain FFN W2 silu(W1 x))",
             "multiply the gate silu(W1 x) by the values W3 x"),
            (lambda: down(F.silu(a) * F.silu(b)), "silu is applied to both paths",
             "only the gate goes through silu; the values W3 x pass as they are"),
            (lambda: (F.silu(x @ W1) * (x @ W3)) @ W2, "the weights are applied without their transpose (x @ W): "
             "they are stored (d_out, d_in), like Linear's", "apply each as x @ W.T; a square weight hides this "
             "mistake, the next case would crash"),
            (lambda: (F.silu(a) * b) @ W2, "W2 is applied without its transpose (hidden @ W2)",
             "W2 is stored (d_model, d_ff): apply it as hidden @ W2.T"),
        ]
        diagnose(what, out, reference.swiglu(x, W1, W2, W3), variants, fix)
    passed("swiglu_draft: W2 (silu(W1 x) ⊙ W3 x) for d_ff equal to, above and below d_model, with leading dimensions")


def _widths(d_model: int, m: int) -> list[tuple[Any, str, str]]:
    """The classic wrong widths for (d_model, multiple_of): (value, mistake, fix)."""
    exact = 8 * d_model / 3
    up = "round 8/3 · d_model UP to a multiple of multiple_of: multiple_of · ⌈8 · d_model / (3 · multiple_of)⌉"
    return [
        (round(exact / m) * m, "hidden_width rounds to the nearest multiple, which sometimes rounds down (512 -> 1344)",
         "round up, so that the three matrices never hold fewer weights than the budget: " + up),
        (math.floor(exact / m) * m, "hidden_width rounds down (floor), so the layer can fall short of the budget",
         up),
        (exact, "hidden_width returns 8/3 · d_model without rounding it to a multiple of multiple_of", up),
        (math.ceil(exact), "hidden_width rounds 8/3 · d_model up to a whole number, not to a multiple of multiple_of",
         up),
        (math.ceil(exact / m),
         "hidden_width returns the number of multiples, ⌈8/3 · d_model / multiple_of⌉, not the width",
         "multiply by multiple_of"),
        (math.ceil(exact / 64) * 64, "hidden_width ignores multiple_of and always rounds to a multiple of 64",
         "use the multiple_of argument (64 is only its default)"),
        (math.ceil(4 * d_model / m) * m,
         "hidden_width starts from 4 · d_model, the width of the classic two-matrix FFN",
         "SwiGLU's third matrix shrinks the width to 2/3 of that: start from 8/3 · d_model"),
        (math.floor(exact / m) * m + m, "hidden_width adds a whole multiple even when 8/3 · d_model is one already "
         "(768 -> 2112, not 2048)",
         "round up only what is not a multiple yet: ⌈n / m⌉ · m, not (⌊n / m⌋ + 1) · m"),
    ]


def check_hidden_width(hidden_width: Callable[..., int]) -> None:
    """Check ``hidden_width(d_model, multiple_of=64)``: 8/3 · d_model rounded up to a multiple of multiple_of, an int.

    Checked on widths whose 8/3 · d_model is a multiple of 64 (768, 96), rounds up (512, 1024, 1) and with
    multiple_of 256 (Llama 2's 4096 -> 11008 and 5120 -> 13824). Mistakes it recognises: rounded to the nearest
    multiple; rounded down; not rounded; rounded to a whole number only; the number of multiples returned; multiple_of
    ignored (always 64); 4 · d_model as the start; a whole multiple added to an exact one; a float returned (1408.0).
    """
    cases = [(768, 64), (512, 64), (1024, 64), (96, 64), (1, 64), (4096, 256), (5120, 256), (2560, 128)]
    results = []
    for d_model, m in cases:
        what = f"hidden_width({d_model}, multiple_of={m})"
        out = call(what, hidden_width, d_model, multiple_of=m)
        results.append((what, out, d_model, m))
    for what, out, _, _ in results:
        if isinstance(out, bool) or not hasattr(type(out), "__float__") or not _same(out, out):
            fail(f"{what} returned {type(out).__name__}, not a number", "return the width as a Python int")
    rights = [_right_width(d_model, m) for _, _, d_model, m in results]
    if all(_same(out, right) for (_, out, _, _), right in zip(results, rights)):
        for what, out, _, _ in results:
            if not hasattr(type(out), "__index__"):
                fail(f"{what} returned {out!r}, a {type(out).__name__}: a width must be an int "
                     f"(Linear(512, {out!r}) fails)", "convert with int(...), or use math.ceil, which returns an int")
    else:
        variants = [_widths(d_model, m) for _, _, d_model, m in results]
        for k, (_, mistake, fix) in enumerate(variants[0]):
            wrongs = [v[k][0] for v in variants]
            # a mistake is named when it explains every case, and at least one case tells it from the right width
            if all(_same(out, w) or _same(out, r) for (_, out, _, _), w, r in zip(results, wrongs, rights)) and \
                    any(not _same(w, r) for w, r in zip(wrongs, rights)):
                what, out, right = next((what, out, r) for (what, out, _, _), r in zip(results, rights)
                                        if not _same(out, r))
                fail(mistake, fix, f"{what} returned {out}, expected {right}")
        what, out, right = next((what, out, r) for (what, out, _, _), r in zip(results, rights) if not _same(out, r))
        fail(f"{what} returned {out}, expected {right}", "8/3 · d_model rounded up to a multiple of multiple_of")
    passed("hidden_width: 8/3 · d_model rounded up to a multiple of 64 (768 -> 2048, 512 -> 1408, 1 -> 64) and of 256 "
           "(4096 -> 11008), an int")


def _right_width(d_model: int, m: int) -> int:
    return -(-8 * d_model // (3 * m)) * m


def _same(out: Any, value: Any) -> bool:
    """Whether ``out`` is a number equal to ``value`` (False when it is not a number, or NaN)."""
    try:
        return math.isclose(float(out), float(value), rel_tol=1e-9)
    except (TypeError, ValueError):
        return False

"""Self-checks for the steps of notebook 01 (Linear): applying a weight to rows, the recipe's σ, drawing a weight."""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from .._harness import (TRUNCATED_STD as _TRUNCATED_STD, call, call_without_builtins, close, diagnose, expect_tensor,
                        fail, generator, passed, unfilled_is_nan)

_NO_LINEAR = {F.linear: "F.linear", torch._C._nn.linear: "F.linear"}


def check_apply_weight(apply_weight: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Check ``apply_weight(x, W)``: W stored (d_out, d_in) applied to every row of x, (..., d_in) -> (..., d_out).

    Mistakes it recognises: the weight applied without its transpose (x @ W, which a square W hides); the weight
    reshaped instead of transposed; the leading dimensions lost; F.linear used (the built-in this notebook builds).
    """
    gen = generator(0)
    fix = "row i of the result is W @ x[i]; with the rows of x on the left, multiply by the transpose of W"
    cases = [(4, 4, (5,)), (3, 2, (4,)), (3, 5, (2, 3)), (3, 2, ())]  # square first: it hides a missing transpose
    for d_in, d_out, leading in cases:
        x = torch.randn(*leading, d_in, generator=gen, dtype=torch.float64)
        W = torch.randn(d_out, d_in, generator=gen, dtype=torch.float64)
        what = f"apply_weight(x of shape {tuple(x.shape)}, W of shape {tuple(W.shape)})"
        out = call_without_builtins(what, _NO_LINEAR, "write the product yourself; F.linear is the reference the "
                                    "notebook compares with", apply_weight, x, W)
        expected = x @ W.T
        if isinstance(out, torch.Tensor) and out.shape != expected.shape and out.numel() == expected.numel():
            fail(f"{what} returned shape {tuple(out.shape)}, expected {tuple(expected.shape)}: the leading "
                 "dimensions are lost", "keep them: a matrix product with x on the left keeps every leading dimension")
        out = expect_tensor(what, out, expected.shape, "the result has x's leading dimensions and d_out as its last")
        if d_in == d_out and close(out, x @ W) and _reshapes(apply_weight):
            fail("W is reshaped to (d_in, d_out) instead of transposed",
                 "reshape keeps the memory order and scrambles the matrix; W.T swaps the axes",
                 f"on a square W the reshape does nothing, so {what} computes x @ W")
        diagnose(what, out, expected, [
            (lambda: x @ W, "the weight is applied without its transpose (x @ W): W is stored (d_out, d_in)",
             "multiply by W.T, whose shape (d_in, d_out) fits rows of size d_in; a square W hides this mistake"),
            (lambda: x @ W.reshape(d_in, d_out), "W is reshaped to (d_in, d_out) instead of transposed",
             "reshape keeps the memory order and scrambles the matrix; W.T swaps the axes"),
        ], fix)
    passed("apply_weight: W (d_out, d_in) applied to every row, square and not, with and without leading dimensions")


def _reshapes(apply_weight: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> bool:
    """Whether apply_weight computes x @ W.reshape(d_in, d_out) on a non-square W (a square one cannot tell)."""
    gen = generator(1)
    x, W = torch.randn(4, 3, generator=gen, dtype=torch.float64), torch.randn(2, 3, generator=gen, dtype=torch.float64)
    try:
        return close(apply_weight(x, W), x @ W.reshape(3, 2))
    except Exception:  # noqa: BLE001 - a probe: any crash means "not this mistake"
        return False


def check_recipe_std(recipe_std: Callable[[int, int], float]) -> None:
    """Check ``recipe_std(d_in, d_out)``: σ = sqrt(2 / (d_in + d_out)), a number.

    Mistakes it recognises: the variance returned instead of the standard deviation; 1 / (d_in + d_out) under the
    root; only d_in (LeCun's or He's σ) or only d_out used.
    """
    for d_in, d_out in [(1024, 256), (64, 4096), (768, 768)]:
        what = f"recipe_std({d_in}, {d_out})"
        out = call(what, recipe_std, d_in, d_out)
        try:
            value = float(out)
        except (TypeError, ValueError):
            fail(f"{what} returned {type(out).__name__}, not a number", "return σ as a float")
        right = math.sqrt(2 / (d_in + d_out))
        if math.isclose(value, right, rel_tol=1e-6):
            continue
        variants = [
            (2 / (d_in + d_out), "it returns the variance σ² = 2 / (d_in + d_out), not σ",
             "take the square root: the std is what torch.nn.init draws with"),
            (math.sqrt(1 / (d_in + d_out)), "it uses 1 / (d_in + d_out) under the root",
             "the recipe's variance is 2 / (d_in + d_out), the harmonic mean of 1/d_in and 1/d_out"),
            (math.sqrt(1 / d_in), "it uses only d_in (LeCun's σ² = 1/d_in)",
             "the recipe treats both directions alike: σ² = 2 / (d_in + d_out)"),
            (math.sqrt(2 / d_in), "it uses only d_in (He's σ² = 2/d_in, made for ReLU)",
             "the recipe treats both directions alike: σ² = 2 / (d_in + d_out)"),
            (math.sqrt(1 / d_out), "it uses only d_out (σ² = 1/d_out keeps the gradients' scale, not the activations')",
             "the recipe treats both directions alike: σ² = 2 / (d_in + d_out)"),
        ]
        for wrong, mistake, fix in variants:
            if not math.isclose(wrong, right, rel_tol=1e-6) and math.isclose(value, wrong, rel_tol=1e-6):
                fail(mistake, fix, f"{what} returned {value:.6g}")
        fail(f"{what} returned {value:.6g}, which is not the recipe's σ", "σ = sqrt(2 / (d_in + d_out))")
    passed("recipe_std: the recipe's σ, from d_in and d_out, for square and non-square layers")


def _draw(init_weight: Callable[..., torch.Tensor], d_out: int, d_in: int, std: float, seed: int,
          global_seed: int = 1) -> torch.Tensor:
    """The learner's weight drawn with a generator seeded ``seed``, while torch's global generator is seeded
    ``global_seed`` (so a draw that ignores the generator changes with it); the global state is put back after."""
    what = f"init_weight({d_out}, {d_in}, std={std:g}, generator=...)"
    with torch.random.fork_rng(devices=[]), unfilled_is_nan():
        torch.manual_seed(global_seed)
        out = call(what, init_weight, d_out, d_in, std, generator=generator(seed))
    if isinstance(out, torch.Tensor) and tuple(out.shape) == (d_in, d_out) and d_in != d_out:
        fail(f"{what} returned shape {(d_in, d_out)}, the transpose of the layer's weight",
             "a weight that maps d_in -> d_out is stored (d_out, d_in): one row per output feature")
    return expect_tensor(what, out, (d_out, d_in), "a weight of shape (d_out, d_in), filled in place")


def check_init_weight(init_weight: Callable[..., torch.Tensor]) -> None:
    """Check ``init_weight(d_out, d_in, std, generator=None)``: a (d_out, d_in) draw of N(0, std²) cut at ±3·std.

    Measured on a 1024 × 256 draw: the shape, the mean, the standard deviation (0.987·std after the cut), that every
    weight lies within ±3·std, that the generator decides the draw. Mistakes it recognises: the shape transposed; the
    tensor left as torch.empty made it (never filled); not centred at 0; std ignored or scaled; no cut at ±3·std
    (trunc_normal_'s default a=-2, b=2 is in weight units, so it cuts nothing at a small std); a cut at ±2·std; the
    generator ignored.
    """
    d_out, d_in, std = 1024, 256, 0.05
    what = f"init_weight({d_out}, {d_in}, std={std})"
    w = _draw(init_weight, d_out, d_in, std, seed=0).detach().double()
    if not torch.isfinite(w).all() or w.abs().max() > 1e3 * std or w.std() < 1e-3 * std:
        fail(f"{what} returns the tensor as torch.empty made it: its values are whatever was in memory (here "
             f"{'not finite' if not torch.isfinite(w).all() else f'std {w.std():.3g}'})",
             "fill it in place with torch.nn.init.trunc_normal_ before returning it")
    if abs(w.mean().item()) > 0.05 * w.std().item():  # the mean of 262,144 draws lies within 0.01 std of 0
        fail(f"{what} has mean {w.mean():.3g}, not 0", "draw with mean=0.0")
    ratio = w.std().item() / std
    if w.abs().max() <= 2 * std * (1 + 1e-6) and abs(ratio - 0.880) < 0.02:
        fail(f"{what} cuts at ±2·std (std / σ = {ratio:.3f}), not ±3·std",
             "the recipe cuts at ±3 standard deviations: a=-3 * std, b=3 * std")
    if abs(ratio - _TRUNCATED_STD) > 0.05:
        if abs(w.std().item() - _TRUNCATED_STD) < 0.05:
            fail(f"{what} ignores std: its weights have a standard deviation of {w.std():.3f}, about 1",
                 "draw with std=std (and cut at a=-3 * std, b=3 * std)")
        fail(f"{what} has a standard deviation of {w.std():.4g} = {ratio:.3f}·std, expected 0.987·std "
             "(a normal with that std, cut at ±3·std)", "draw with mean=0.0 and std=std, cut at a=-3 * std, b=3 * std")
    beyond = int((w.abs() > 3 * std * (1 + 1e-6)).sum())
    if beyond:
        fail(f"{what}: {beyond} weights lie beyond ±3·std, so nothing was cut there",
             "pass the cut in weight units: trunc_normal_(w, mean=0.0, std=std, a=-3 * std, b=3 * std) "
             "(its default a=-2, b=2 cuts nothing when std is small)", f"largest |w| / std = {w.abs().max() / std:.2f}")
    if abs(ratio - _TRUNCATED_STD) > 0.01:
        fail(f"{what} has a standard deviation of {ratio:.3f}·std, expected 0.987·std (a normal cut at ±3·std)",
             "draw with mean=0.0 and std=std, cut at a=-3 * std, b=3 * std")
    again = _draw(init_weight, d_out, d_in, std, seed=0, global_seed=2)
    if not torch.equal(again.detach().double(), w):
        fail(f"{what} gives a different weight for the same generator: the generator is ignored",
             "pass generator=generator on to trunc_normal_, so that a seeded generator decides the draw")
    passed("init_weight: a (d_out, d_in) weight, N(0, std²) cut at ±3·std (measured std 0.987·std), "
           "drawn from the generator given")

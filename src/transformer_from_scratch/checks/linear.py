"""``check_linear``: the learner's ``Linear`` (notebook 01) against ``F.linear`` and the recipe's initialisation."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ._harness import (TRUNCATED_STD, call_for_tensor, call_without_builtins, check_device_and_dtype, check_gradients,
                       check_initialised, check_parameters, check_signature, close, construct, crash_of, expect_tensor,
                       fail, generator, passed, truncated_std)

_NAME = "Linear"
_RECIPE = "N(0, σ²) with σ² = 2 / (d_in + d_out), truncated at ±3σ (trunc_normal_'s cut a, b is in weight units)"
_LEADING = [(2, 5), (), (3,), (2, 3, 4)]  # (2, 5) first: a crash there is a plain bug, elsewhere a shape habit
_INIT_SIZES = (1024, 256)  # non-square, so that 1/sqrt(d_in), 1/sqrt(d_out) and the recipe's σ all differ
_BEYOND_2 = (math.erf(3 / math.sqrt(2)) - math.erf(2 / math.sqrt(2))) / math.erf(3 / math.sqrt(2))  # 4.28 %


def _no_builtin(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``call(what, fn, *args)``, failing if it used F.linear (under any name, or through nn.Linear)."""
    return call_without_builtins(
        what, {F.linear: "F.linear", torch._C._nn.linear: "F.linear"},
        "compute y = W x yourself, for every row of x: F.linear is only the reference", fn, *args)


def _check_structure(impl: type) -> None:
    """Signature, no nn.Linear inside, one parameter `weight` of shape (out, in), no bias."""
    check_signature(impl, ["in_features", "out_features", "device", "dtype"], _NAME)
    layer = _no_builtin("Linear(5, 3)", impl, 5, 3)
    if isinstance(layer, nn.Linear) or any(isinstance(m, nn.Linear) for m in layer.modules()):
        fail("Linear is (or contains) torch.nn.Linear, the built-in this notebook builds",
             "subclass nn.Module and register the weight yourself, an nn.Parameter of shape (out_features, "
             "in_features)")
    found = {key: tuple(p.shape) for key, p in layer.named_parameters()}
    has_bias = any(key == "bias" or key.endswith(".bias") for key in found)
    if not has_bias and found.get("weight") == (5, 3):
        fail("Linear.weight is stored as (in_features, out_features) = (5, 3)",
             "store it as (out_features, in_features) = (3, 5), like torch.nn.Linear and the course's checkpoints, "
             "and apply it through its transpose")
    check_parameters(layer, {"weight": (3, 5)}, _NAME)


def _reshapes(impl: type) -> bool:
    """Whether a non-square layer computes x @ W.reshape(d_in, d_out) (told apart from x @ W on a square one)."""
    gen = generator(3)
    try:
        layer = impl(5, 3)
        weight = torch.randn(3, 5, generator=gen)
        with torch.no_grad():
            layer.weight.copy_(weight)
        x = torch.randn(4, 5, generator=gen)
        return close(layer(x), x @ weight.reshape(5, 3))
    except Exception:  # noqa: BLE001 - a probe: any crash means "not this mistake"
        return False


def _check_output(y: Any, x: torch.Tensor, weight: torch.Tensor, what: str, impl: type | None = None) -> None:
    """``y`` is F.linear(x, weight); if not, name the classic wrong variant it matches."""
    d_out, d_in = weight.shape
    expected = F.linear(x, weight)
    shapes = f"input {tuple(x.shape)}, weight {tuple(weight.shape)}"
    expect_tensor(what, y, returns="return the result of the einsum")
    if y.shape != expected.shape:
        if y.shape[-1:] == expected.shape[-1:] and y.numel() == expected.numel():
            fail(f"{what} loses the leading dimensions: it returned shape {tuple(y.shape)}, expected "
                 f"{tuple(expected.shape)}",
                 "keep every leading dimension: the product runs over the last one only")
        fail(f"{what} returned shape {tuple(y.shape)}, expected {tuple(expected.shape)} ({shapes})",
             "the output keeps x's leading dimensions and has out_features as its last one")
    if y.dtype != expected.dtype:
        fail(f"{what} returned {y.dtype} for a {x.dtype} input and weight",
             "compute in the input's dtype: no .float() / .to(...) inside forward")
    # Half precision: rounding to bfloat16 depends on the order of the sums; allow a couple of its steps.
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if x.dtype in (torch.bfloat16, torch.float16) else {}
    if close(y, expected, **tolerance):
        return
    y = y.detach()
    if d_in == d_out and close(y, x @ weight):
        if impl is not None and _reshapes(impl):
            fail(f"{what} reshapes (or views) the weight to (d_in, d_out) instead of transposing it",
                 "reshape keeps the memory order and scrambles the matrix; a transpose swaps the axes",
                 "On a square layer the reshape does nothing, so this computes x @ W; "
                 "on Linear(5, 3) it matches x @ W.reshape(5, 3).")
        fail(f"{what} applies the weight without the transpose (it computes x @ W)",
             "the weight is (d_out, d_in), so a row of x meets it transposed: y = x Wᵀ",
             "A square layer hides this: the shapes fit, but every output is wrong.")
    if d_in != d_out and close(y, x @ weight.reshape(d_in, d_out)):
        fail(f"{what} reshapes (or views) the weight to (d_in, d_out) instead of transposing it",
             "reshape keeps the memory order and scrambles the matrix; a transpose swaps the axes")
    if x.dtype == torch.float64 and close(y, expected, rtol=1e-5, atol=1e-5):
        fail(f"{what} matches F.linear only to float32 precision: it computes in float32 and casts back",
             "compute in the input's dtype: no .float() inside forward")
    rows = (y - expected).reshape(-1, d_out)
    if rows.shape[0] > 1 and rows.abs().max() > 1e-3 and close(rows, rows[:1].expand_as(rows)):
        fail(f"{what} adds the same vector to every output (a bias, even if not registered as a parameter)",
             "remove it: the recipe has no biases anywhere, y = W x")
    difference = (y.to(expected.dtype) - expected).abs().max().item()
    fail(f"{what} differs from F.linear(x, weight) by up to {difference:.3g}",
         "y = x Wᵀ over the last dimension: find the part of yours that differs", shapes)


def _check_forward(impl: type) -> None:
    """Outputs against F.linear: square and non-square, several leading shapes, float32/float64/bfloat16."""
    gen = generator(1)
    cases = [(6, 6, torch.float32), (5, 3, torch.float32), (6, 6, torch.float64), (5, 3, torch.float64)]
    for d_in, d_out, dtype in cases:
        layer = construct(_NAME, impl, d_in, d_out, dtype=dtype)
        weight = torch.randn(d_out, d_in, generator=gen, dtype=dtype)
        with torch.no_grad():
            layer.weight.copy_(weight)
        for leading in _LEADING:
            x = torch.randn(*leading, d_in, generator=gen, dtype=dtype)
            what = f"Linear({d_in}, {d_out})(x of shape {tuple(x.shape)}, {dtype})"
            try:
                y = _no_builtin(what, layer, x)
            except AssertionError as error:
                cause = crash_of(error)
                if leading != _LEADING[0] and cause is not None:
                    raise AssertionError(
                        f"{what} crashes ({type(cause).__name__}), though inputs of shape {(*_LEADING[0], d_in)} work: "
                        "accept any number of leading dimensions: the product runs over the last one only, whatever "
                        "comes before it."
                    ) from cause
                raise
            _check_output(y, x, weight, what, impl)
    # Half precision: the layer computes in its own dtype and returns it.
    layer = construct(_NAME, impl, 5, 3, dtype=torch.bfloat16)
    weight = torch.randn(3, 5, generator=gen).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(weight)
    x = torch.randn(2, 5, 5, generator=gen).to(torch.bfloat16)
    _check_output(_no_builtin("Linear(5, 3)(x, torch.bfloat16)", layer, x), x, weight, "Linear(5, 3)(x, "
                                                                                       "torch.bfloat16)")


def _check_gradients(impl: type) -> None:
    """weight.grad and x.grad equal F.linear's, in float64."""
    gen = generator(2)
    layer = construct(_NAME, impl, 5, 3, dtype=torch.float64)
    weight = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        layer.weight.copy_(weight)
    x = torch.randn(2, 4, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(2, 4, 3, generator=gen, dtype=torch.float64)
    y = call_for_tensor("Linear(5, 3)(x)", layer, x)
    check_gradients(_NAME, "Linear(5, 3)(x of shape (2, 4, 5))", y, x, upstream, lambda x, w: F.linear(x, w["weight"]),
                    {"weight": weight}, {"weight": ("Linear.weight", layer.weight)}, source="self.weight and x",
                    unit="weight")


def _check_init(impl: type) -> None:
    """N(0, σ²) with σ² = 2/(d_in + d_out), cut at ±3σ, drawn afresh from torch's generator."""
    check_initialised(_NAME, lambda: impl(5, 3), f"fill it in place with the recipe's draw, {_RECIPE}")
    torch.manual_seed(1)
    first = construct(_NAME, impl, 5, 3).weight.detach()
    if not torch.isfinite(first).all():
        fail("Linear's initial weight contains NaN or inf, so it is not initialised (torch.empty holds whatever was in "
             "memory)",
             f"fill it in place with the recipe's draw, {_RECIPE}")
    if (first == 0).all():
        fail("Linear's initial weight is all zeros (every output feature would then learn the same thing)",
             f"fill it in place with the recipe's draw, {_RECIPE}")
    torch.manual_seed(2)
    second = construct(_NAME, impl, 5, 3).weight.detach()
    if torch.equal(first, second):
        fail("two Linear layers built after different torch.manual_seed(...) start with identical weights",
             "draw the weight from torch's random generator with nn.init.trunc_normal_ (no fixed values, no private "
             "generator)")

    d_in, d_out = _INIT_SIZES
    torch.manual_seed(0)
    w = construct(_NAME, impl, d_in, d_out).weight.detach().double().flatten()
    if not torch.isfinite(w).all():
        fail("Linear's initial weight contains NaN or inf, so it is not initialised (torch.empty holds whatever was in "
             "memory)",
             f"fill it in place with the recipe's draw, {_RECIPE}")
    sigma = math.sqrt(2 / (d_in + d_out))
    size = f"Linear({d_in}, {d_out})"
    std, mean, top = w.std().item(), w.mean().item(), w.abs().max().item()
    evidence = (f"{size}: σ = sqrt(2 / ({d_in} + {d_out})) = {sigma:.5f}; "
                f"measured std {std:.5f} = {std / sigma:.3f} σ, max |w| = {top / sigma:.2f} σ")
    recipe = _RECIPE
    if std == 0:
        fail(f"every initial weight of {size} has the same value ({w[0].item():.3g})", f"draw them: {recipe}")
    if abs(mean) > 5 * std / math.sqrt(w.numel()):
        fail(f"the initial weights are not centred at 0 (mean = {mean / sigma:+.3f} σ; torch.rand, for one, draws from "
             "[0, 1))",
             f"draw them from a normal with mean 0: {recipe}", evidence)
    z = (w - mean) / std
    kurtosis = z.pow(4).mean().item()
    if kurtosis < 2.0:
        uniform = "nn.Linear's default, kaiming_uniform_, " if abs(top * math.sqrt(d_in) - 1) < 0.02 else ""
        fail(f"the initial weights are spread evenly (uniform: {uniform}torch.rand …), not bell-shaped",
             f"draw them from a truncated normal: {recipe}",
             f"{evidence}; kurtosis {kurtosis:.2f}, a normal cut at ±3σ has 2.83 and a uniform 1.8")
    ratio = std / sigma
    if top < 2.9 * sigma and abs(ratio / truncated_std(top / sigma) - 1) < 0.02:
        fail(f"the cut is too tight (the initial weights stop at ±{top / sigma:.2f} σ)",
             "truncate at a=-3 * σ, b=3 * σ", evidence)
    if not 0.95 <= ratio <= 1.03:
        wrong_sigmas = [
            ("1 / sqrt(d_in)", "LeCun's, right for the forward pass only", 1 / math.sqrt(d_in)),
            ("1 / sqrt(d_out)", "right for the backward pass only", 1 / math.sqrt(d_out)),
            ("2 / sqrt(d_in + d_out)", "the square root must cover the whole fraction", 2 / math.sqrt(d_in + d_out)),
            ("sqrt(2 / d_in)", "He/Kaiming's, for ReLU networks", math.sqrt(2 / d_in)),
            ("sqrt(1 / (d_in + d_out))", "the 2 is missing", math.sqrt(1 / (d_in + d_out))),
            ("2 / (d_in + d_out)", "the variance passed as std", 2 / (d_in + d_out)),
            ("1", "trunc_normal_'s default std", 1.0),
        ]
        for formula, remark, candidate in wrong_sigmas:
            low = 0.85 if candidate == 1.0 else 0.93  # std 1 with the default cut ±2 measures 0.88
            if low <= std / candidate <= 1.03:
                fail(f"the initial weights' std is {formula} ({remark}), not the recipe's σ = sqrt(2 / (d_in + d_out))",
                     f"use {recipe}", evidence)
        fail(f"the initial weights' std is {ratio:.3f} σ, expected 0.987 σ (σ² = 2 / (d_in + d_out), cut at ±3σ)",
             f"use {recipe}", evidence)
    beyond = int((w.abs() > 3 * sigma * (1 + 1e-3)).sum())
    if beyond:
        fail(f"{beyond:,} of {w.numel():,} initial weights lie beyond ±3σ, so nothing was truncated "
             f"(trunc_normal_'s default cut a=-2, b=2 is in weight units, ±{2 / sigma:.0f}σ here, not multiples of "
             "std)",
             "pass the cut explicitly: a=-3 * σ, b=3 * σ", evidence)
    if abs(ratio - TRUNCATED_STD) > 0.006:
        fail(f"the initial weights' std is {ratio:.3f} σ, expected 0.987 σ (N(0, σ²) cut at ±3σ)",
             f"use {recipe}", evidence)
    share = (w.abs() > 2 * sigma).double().mean().item()
    if abs(share - _BEYOND_2) > 0.005:
        fail(f"{share:.1%} of the initial weights lie beyond 2σ where a normal cut at ±3σ has {_BEYOND_2:.1%}, "
             "so they are not a truncated normal",
             f"use {recipe}", evidence)


def check_linear(impl: type) -> None:
    """Check the learner's ``Linear`` class; print one line if it is right, else raise ``AssertionError``.

    Checked: the signature ``(in_features, out_features, device=None, dtype=None)``; one parameter
    ``weight`` of shape (out_features, in_features) and nothing else; the initialisation on a
    1024 → 256 layer (mean 0, std 0.987 σ with σ² = 2/(d_in + d_out), nothing beyond ±3σ, the normal's
    shape); ``device`` and ``dtype`` honoured; outputs equal ``F.linear`` for a square and a non-square
    layer, leading shapes (), (3,), (2, 5), (2, 3, 4), in float32, float64 and bfloat16; gradients for
    the weight and the input equal ``F.linear``'s. Inputs come from a fixed seed; the caller's random
    state is left as it was.

    Mistakes it recognises (by name, in the first line of the error):
    no transpose (x @ W on a square layer); the weight stored as (in, out); reshape/view instead of
    transpose; ``trunc_normal_``'s default absolute cut (a=-2, b=2: no truncation); a cut too tight;
    the wrong σ (1/sqrt(d_in), 1/sqrt(d_out), sqrt(2/d_in), 2/sqrt(d_in + d_out), sqrt(1/(d_in + d_out)),
    the variance passed as std, std 1); a uniform init (nn.Linear's default); weights never filled (in whole
    or in part, from torch.empty or torch.Tensor(...)), all zero, or the same in every layer; a bias (registered or
    not); ``device``/``dtype`` ignored;
    F.linear or nn.Linear used inside; leading dimensions lost or a fixed number of them; the output cast
    to another dtype, or float64 computed in float32; no gradient reaching the weight (.detach(), .data, no_grad).
    """
    with torch.random.fork_rng(devices=[]):
        _check_structure(impl)
        _check_init(impl)
        check_device_and_dtype(lambda **kwargs: impl(5, 3, **kwargs), _NAME)
        _check_forward(impl)
        _check_gradients(impl)
    passed("check_linear: weight (out, in) and no bias; init N(0, σ²) cut at ±3σ; device/dtype; "
           "matches F.linear (square and not, 4 leading shapes, float32/64, bfloat16); gradients")

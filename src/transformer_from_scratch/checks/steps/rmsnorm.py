"""Self-checks for the steps of notebook 04 (RMSNorm): the RMS of every vector, normalise and scale, the upcast."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .._harness import (call_for_tensor, call_without_builtins, close, describe, diagnose, dtype_name, expect_tensor,
                        fail, generator, passed)

_NO_RMS_NORM = {F.rms_norm: "F.rms_norm", torch.rms_norm: "torch.rms_norm"}
_NO_RMS_NORM_FIX = "write it from your {}; F.rms_norm is the reference the notebook compares with"
_EPS = 1e-5


def _ms(x: torch.Tensor) -> torch.Tensor:
    """The mean square over the last dimension, kept: (..., 1)."""
    return x.pow(2).mean(dim=-1, keepdim=True)


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.sqrt(_ms(x) + eps)


def check_rms(rms: Callable[[torch.Tensor, float], torch.Tensor]) -> None:
    """Check ``rms(x, eps)``: sqrt(mean(x², over the last dimension) + eps), shape (..., 1).

    Mistakes it recognises: the mean over the wrong dimension (dim=0, the batch, or over every dimension); the
    reduced dimension dropped (no keepdim=True); eps added outside the root, or ignored; the standard deviation (the
    centred variance, biased or not) instead of the root mean square; the sum instead of the mean (the L2 norm);
    the reciprocal 1 / RMS returned (rsqrt); the square root missing.
    """
    gen = generator(0)
    fix = ("RMS is the root of the mean of the squares plus ε, the mean over each vector's features (one per vector, "
           "shape (..., 1)): find the part of yours that differs")
    cases = [((4,), 6, _EPS, 2.0), ((2, 3), 5, _EPS, 1e-3), ((), 8, _EPS, 1.0), ((3,), 4, 0.1, 0.5)]
    for leading, d, eps, scale in cases:  # inputs of RMS 1e-3 (below √eps ≈ 3e-3) show where eps goes
        x = (torch.randn(*leading, d, generator=gen, dtype=torch.float64) + 0.7) * scale  # a mean ≠ 0: std ≠ RMS
        what = f"rms(x of shape {tuple(x.shape)}, eps={eps:g})"
        out = call_for_tensor(what, rms, x, eps, returns="return one RMS per vector, as a tensor")
        expected = _rms(x, eps)
        if leading and tuple(out.shape) == tuple(leading):
            fail(f"{what} returned shape {tuple(out.shape)}: the reduced dimension is dropped (no keepdim=True)",
                 "keep it with size 1, so that the RMS has shape (..., 1) and broadcasts against x")
        centred = x - x.mean(dim=-1, keepdim=True)
        diagnose(what, out, expected, [
            (lambda: torch.sqrt(x.pow(2).mean(dim=0, keepdim=True) + eps),
             "the mean is taken over dim=0 (the batch), not over each vector's features",
             "reduce over the last dimension only: dim=-1"),
            (lambda: torch.sqrt(x.pow(2).mean(dim=0) + eps),
             "the mean is taken over dim=0 (the batch), not over each vector's features",
             "reduce over the last dimension only: dim=-1"),
            (lambda: torch.sqrt(x.pow(2).mean() + eps),
             "the mean is taken over every dimension, not over each vector's features",
             "reduce over the last dimension only: dim=-1, keepdim=True"),
            (lambda: torch.sqrt(x.pow(2).mean() + eps).reshape(1),
             "the mean is taken over every dimension, not over each vector's features",
             "reduce over the last dimension only: dim=-1, keepdim=True"),
            (lambda: torch.sqrt(_ms(x)) + eps, "eps is added outside the square root",
             "add it to the mean square, under the root: sqrt(mean square + eps)"),
            (lambda: torch.sqrt(_ms(x)), "eps is ignored",
             "add it to the mean square, under the root: sqrt(mean square + eps)"),
            (lambda: torch.sqrt(_ms(centred) + eps),
             "it is the standard deviation (the root of the centred variance), not the root mean square",
             "square x itself, not x minus its mean: RMSNorm does not centre"),
            (lambda: torch.sqrt(centred.pow(2).sum(dim=-1, keepdim=True) / (d - 1) + eps),
             "it is the standard deviation (x.var or x.std), not the root mean square",
             "square x itself, not x minus its mean: RMSNorm does not centre"),
            (lambda: x.std(dim=-1, keepdim=True) + eps,
             "it is the standard deviation (x.var or x.std), not the root mean square",
             "square x itself, not x minus its mean: RMSNorm does not centre"),
            (lambda: torch.sqrt(x.pow(2).sum(dim=-1, keepdim=True) + eps), "the squares are summed, not averaged",
             "take their mean (sum / d): the RMS does not grow with d"),
            (lambda: torch.sqrt(x.pow(2).sum(dim=-1, keepdim=True)) + eps,
             "the squares are summed, not averaged (the L2 norm)", "take their mean (sum / d): the RMS does not grow "
             "with d; and add eps under the root"),
            (lambda: torch.sqrt(x.pow(2).sum(dim=-1, keepdim=True)),
             "the squares are summed, not averaged (the L2 norm)",
             "take their mean (sum / d): the RMS does not grow with d; and add eps under the root"),
            (lambda: 1 / expected, "it returns 1 / RMS (the reciprocal square root), not the RMS",
             "return the root itself: torch.sqrt, not torch.rsqrt"),
            (lambda: _ms(x) + eps, "the square root is missing: it returns the mean square + eps",
             "take the square root of it"),
        ], fix)
    passed("rms: sqrt(mean of the squares over the last dimension + eps), shape (..., 1), small and large inputs")


def check_rms_norm(rms_norm: Callable[..., torch.Tensor]) -> None:
    """Check ``rms_norm(x, gain, eps)``: x / rms(x, eps) * gain, over the last dimension.

    Mistakes it recognises: the gain not applied; the gain added instead of multiplied, or applied with @ (a dot
    product); the RMS taken of x · gain
    (scaled before normalising); x multiplied by its RMS instead of divided; the eps argument not passed on (a fixed
    eps used); PyTorch's own F.rms_norm used.
    """
    gen = generator(1)
    fix = ("RMSNorm is x divided by its RMS, then scaled feature by feature by the gain: find the part of yours that "
           "differs")
    cases = [((3, 4), 8, _EPS, 3.0), ((), 5, _EPS, 1.0), ((2,), 16, 0.1, 0.3)]
    for leading, d, eps, scale in cases:  # eps = 0.1 on inputs of RMS 0.3: the eps used shows
        x = torch.randn(*leading, d, generator=gen, dtype=torch.float64) * scale
        gain = torch.rand(d, generator=gen, dtype=torch.float64) + 0.5  # far from ones: a dropped gain shows
        what = f"rms_norm(x of shape {tuple(x.shape)}, a random gain, eps={eps:g})"
        out = expect_tensor(what, call_without_builtins(what, _NO_RMS_NORM, _NO_RMS_NORM_FIX.format("rms"), rms_norm,
                                                        x, gain, eps), returns=fix)
        expected = x / _rms(x, eps) * gain
        variants = [
            (lambda: x / _rms(x, eps), "the gain is not applied",
             "multiply the normalised x by gain, feature by feature"),
            (lambda: x / _rms(x, eps) + gain, "the gain is added, not multiplied",
             "RMSNorm has no bias: multiply by gain"),
            (lambda: x * gain / _rms(x * gain, eps),
             "the RMS is taken of x · gain: x is scaled before it is normalised",
             "normalise x first (divide by rms(x, eps)), then multiply by gain"),
            (lambda: x * _rms(x, eps) * gain, "x is multiplied by its RMS instead of divided by it",
             "divide: x / rms(x, eps)"),
            (lambda: (x / _rms(x, eps)) @ gain, "the gain is applied with @, a dot product that sums the features",
             "multiply elementwise with *: feature i times gain[i]"),
        ]
        variants += [(lambda other=other: x / _rms(x, other) * gain,
                      f"the eps argument is not passed on (a fixed eps = {other:g} is used)",
                      "pass eps on to your rms: rms(x, eps)") for other in (1e-5, 1e-6, 1e-8, 0.0) if other != eps]
        diagnose(what, out, expected, variants, f"{fix} (and check that your rms passes its check)")
    passed("rms_norm: each vector divided by its RMS, times the gain, with and without leading dimensions, the eps "
           "given")


def _ulps(out: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> float:
    """The largest error of ``out`` against ``reference`` (float64), in units in the last place of ``dtype``."""
    ulp = torch.finfo(dtype).eps * torch.exp2(torch.floor(torch.log2(reference.abs().clamp_min(1e-3))))
    return ((out.detach().double() - reference).abs() / ulp).max().item()


def _call_step3(fn: Callable[..., torch.Tensor], x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    what = (f"rms_norm_upcast(a {dtype_name(x.dtype)} x of shape {tuple(x.shape)}, a {dtype_name(gain.dtype)} gain, "
            f"eps={eps:g})")
    out = call_without_builtins(what, _NO_RMS_NORM, _NO_RMS_NORM_FIX.format("rms_norm"), fn, x, gain, eps)
    expect_tensor(what, out, returns="return your rms_norm's result, cast back to x's dtype")
    if out.shape != x.shape:
        fail(f"{what} returned {describe(out)}, expected a tensor of x's shape {tuple(x.shape)}",
             "return your rms_norm's result, cast back to x's dtype")
    return out


def check_rms_norm_upcast(rms_norm_upcast: Callable[..., torch.Tensor]) -> None:
    """Check ``rms_norm_upcast(x, gain, eps)``: rms_norm computed in float32 (float64 stays float64), returned in
    x's dtype, rounded once.

    Measured on float16 activations of about 300 (their squares overflow float16), on bfloat16 and float16 inputs
    (the error against float64, in units of the last place), and on float64 inputs (float64's precision). Mistakes it
    recognises: no upcast (float16 squares overflow to inf, the output is 0); bfloat16 or float16 computed in their
    own precision (only some half types upcast); the result not cast back (float32 returned); the result cast to a
    fixed dtype instead of x's; a float64 input computed in float32; the eps argument not passed on; F.rms_norm used.
    """
    gen = generator(2)
    d = 64
    gain = torch.rand(d, generator=gen) + 0.5
    fix_cast = "end with .to(x.dtype): the next layer expects the dtype it gave"
    x = (torch.randn(4, d, generator=gen) * 300).half()  # about 300: the squares overflow float16
    out = _call_step3(rms_norm_upcast, x, gain, _EPS)
    if not out.isfinite().all() or (out == 0).all():
        fail("no upcast: computed in float16, the squares of activations above 256 overflow to inf and the output "
             "becomes 0 (or NaN)", "compute in float32, where they fit, and round the result to x's dtype once, "
             "at the end", f"float16 activations of about 300: {(out == 0).sum().item()} zeros, "
             f"{(~out.isfinite()).sum().item()} inf/NaN of {out.numel()}")
    for in_dtype in (torch.float16, torch.bfloat16):
        x = (torch.randn(16, d, generator=gen) * 3).to(in_dtype)
        gain_in = gain.to(in_dtype)
        for g in (gain, gain_in):  # a float32 gain (a mixed-precision model), then one in x's dtype
            out = _call_step3(rms_norm_upcast, x, g, _EPS)
            name, got = dtype_name(in_dtype), dtype_name(out.dtype)
            if out.dtype == torch.float32:
                fail(f"the result is not cast back ({name} in, float32 out)", fix_cast)
            if out.dtype != in_dtype:
                fail(f"the result is cast to {got}, not back to x's dtype ({name} in, {got} out)",
                     "cast back with .to(x.dtype) (not .half() or a fixed dtype): bfloat16 stays bfloat16")
            reference = x.double() / _rms(x.double(), _EPS) * g.double()
            ulps = _ulps(out, reference, in_dtype)
            if ulps > 1.0:
                fail(f"a {name} input is computed in {name}: its error is {ulps:.1f} units in the last place, where "
                     "one rounding at the end gives at most 0.5",
                     "upcast every half type, bfloat16 as well as float16, to float32 before computing",
                     f"rms_norm_upcast on a {name} x of shape {tuple(x.shape)}")
    x = torch.randn(5, 16, generator=gen, dtype=torch.float64) * 3
    for g in (gain[:16], gain[:16].double()):
        out = _call_step3(rms_norm_upcast, x, g, _EPS)
        if out.dtype != torch.float64:
            fail(f"a float64 input comes back as {dtype_name(out.dtype)}",
                 "upcast only what is narrower than float32, and cast the result back to x's dtype")
        expected = x / _rms(x, _EPS) * g.double()
        if not close(out, expected, rtol=1e-10, atol=1e-10):
            if close(out, expected, rtol=1e-5, atol=1e-5):
                fail("a float64 input is computed in float32, so it keeps only float32's 7 digits",
                     "upcast only what is narrower than float32: float64 keeps its own precision",
                     f"largest difference {(out - expected).abs().max().item():.3g}")
            diagnose("rms_norm_upcast on a float64 input", out, expected, [],
                     "compute your rms_norm on x and gain in the compute dtype, then cast back to x.dtype")
    x = torch.randn(3, 16, generator=gen) * 0.3  # eps = 0.1 on inputs of RMS 0.3: the eps used shows
    out = _call_step3(rms_norm_upcast, x, gain[:16], 0.1)
    expected = x / _rms(x, 0.1) * gain[:16]
    diagnose("rms_norm_upcast(float32 x, gain, eps=0.1)", out, expected, [
        (lambda: x / _rms(x, _EPS) * gain[:16], "the eps argument is not passed on to your rms_norm (its default "
         "1e-5 is used)", "call rms_norm(..., eps) with the eps you were given"),
    ], "run your rms_norm on x and gain in the compute dtype, with eps, and cast the result back to x.dtype")
    passed("rms_norm_upcast: float16 activations of 300 stay finite; float16/bfloat16 rounded once (at most 0.5 ulp) "
           "and returned in their dtype; float64 stays float64")

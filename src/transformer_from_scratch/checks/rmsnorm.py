"""check_rmsnorm: the learner's RMSNorm against F.rms_norm and nn.RMSNorm, with a diagnosis when it differs."""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import reference
from ._harness import (BuiltinSpy, call, call_for_tensor, check_device_and_dtype, check_initialised, check_parameters,
                       check_signature, close, construct, crash_of, describe, dtype_name, fail, generator, passed,
                       refuse_builtins, refuse_instance)

NAME = "RMSNorm"
EPS = 1e-5
# (leading shape, d_model): none, one and two leading dimensions, rows != d_model and rows == d_model.
CASES = [((), 8), ((3,), 8), ((2, 5), 8), ((8,), 8), ((4,), 5), ((2, 1, 3), 16)]
FIX_DIM = "each vector is normalised by its own RMS: average the squares over the last dimension only"

_Variant = Callable[[Tensor, Tensor, float], Tensor]


def _ms(x: Tensor) -> Tensor:
    """The mean square over the last dimension, kept: (..., 1)."""
    return x.pow(2).mean(dim=-1, keepdim=True)


# The classic wrong formulas as (mistake, fix, formula), in the order a mismatch is tested against them
# (most specific first). Each formula maps (x, gain, eps) to what that mistake computes, in x's dtype.
WRONG_FORMULAS: list[tuple[str, str, _Variant]] = [
    ("forward does not multiply by the gain self.weight",
     "RMSNorm(x) = x / RMS(x) · g: the gain is learned, feature by feature, so it must be applied",
     lambda x, g, eps: x / torch.sqrt(_ms(x) + eps)),
    ("the mean of the squares is taken over dim=0 (the batch), not over the features",
     FIX_DIM,
     lambda x, g, eps: x / torch.sqrt(x.pow(2).mean(dim=0, keepdim=True) + eps) * g),
    ("the mean of the squares is taken over all dimensions, not over each vector's features",
     FIX_DIM,
     lambda x, g, eps: x / torch.sqrt(x.pow(2).mean() + eps) * g),
    ("the mean of the squares is taken without keepdim=True, so the RMS broadcasts along the wrong axis",
     "keep the reduced dimension with size 1, so that the RMS, shape (..., 1), broadcasts against x (..., d_model)",
     lambda x, g, eps: x / torch.sqrt(x.pow(2).mean(dim=-1) + eps) * g),
    ("the squares are summed, not averaged",
     "RMS is the root of the MEAN square: it does not grow with the number of features",
     lambda x, g, eps: x / torch.sqrt(x.pow(2).sum(dim=-1, keepdim=True) + eps) * g),
    ("forward subtracts the mean, which makes it LayerNorm, not RMSNorm",
     "do not centre x; divide x itself by sqrt(mean(x²) + eps)",
     lambda x, g, eps: F.layer_norm(x, x.shape[-1:], eps=eps) * g),
    ("forward subtracts the mean, which makes it LayerNorm, not RMSNorm",
     "do not centre x; divide x itself by sqrt(mean(x²) + eps)",
     lambda x, g, eps: (x - x.mean(dim=-1, keepdim=True)) / torch.sqrt(_ms(x) + eps) * g),
    ("forward divides by the standard deviation (x.std / x.var), not by the root mean square",
     "RMS(x) = √(mean(x²) + ε) squares x itself: RMSNorm does not centre",
     lambda x, g, eps: x / torch.sqrt(x.var(dim=-1, keepdim=True) + eps) * g),
    ("forward divides by the standard deviation (the root of the centred variance, x.var(unbiased=False)), not by "
     "the root mean square",
     "RMS(x) = √(mean(x²) + ε) squares x itself, not x minus its mean: RMSNorm does not centre",
     lambda x, g, eps: x / torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + eps) * g),
    ("the square root is missing, forward divides by mean(x²) + eps instead of its root",
     "RMS is the ROOT of the mean square: mean(x²) has the units of x², so x / mean(x²) still depends on x's scale",
     lambda x, g, eps: x / (_ms(x) + eps) * g),
    ("eps is added outside the square root, x / (sqrt(mean(x²)) + eps)",
     "ε goes under the root, RMS = √(mean(x²) + ε): it keeps the denominator away from 0 for a vector near 0",
     lambda x, g, eps: x / (torch.sqrt(_ms(x)) + eps) * g),
    ("eps is ignored, forward divides by sqrt(mean(x²)) alone",
     "ε goes under the root, RMS = √(mean(x²) + ε): it keeps the denominator away from 0 for a vector near 0",
     lambda x, g, eps: x / torch.sqrt(_ms(x)) * g),
]


def _reference(x: Tensor, gain: Tensor, eps: float) -> Tensor:
    return reference.rms_norm(x, gain, eps)


def _max_error(actual: Tensor, expected: Tensor) -> str:
    return f"largest difference {(actual.detach().double() - expected.double()).abs().max().item():.3g}"


_BUILTINS = {F.rms_norm: "F.rms_norm", torch.rms_norm: "torch.rms_norm",
             F.layer_norm: "F.layer_norm", torch.layer_norm: "torch.layer_norm"}


def _make(impl: Any, d_model: int, **kwargs: Any) -> nn.Module:
    return construct(NAME, impl, d_model, **kwargs)


def _forward(module: nn.Module, x: Tensor) -> Tensor:
    """module(x) as a tensor on x's device, naming a broadcasting crash (the mean taken without keepdim) as such."""
    what = f"{NAME}.forward on an input of shape {tuple(x.shape)}"
    try:
        return call_for_tensor(what, module, x, returns="return the normalised tensor")
    except AssertionError as error:
        cause = crash_of(error)
        if isinstance(cause, RuntimeError) and "must match the size of tensor" in str(cause):
            fail("the mean of the squares is taken without keepdim=True, so x (..., d_model) and the RMS (...) "
                 "do not broadcast",
                 "keep the reduced dimension with size 1, so that the RMS, shape (..., 1), broadcasts against x (..., "
                 "d_model)",
                 f"input {tuple(x.shape)}: {str(cause).splitlines()[0]}")
        raise


def _set_gain(module: nn.Module, gain: Tensor) -> None:
    with torch.no_grad():
        module.weight.copy_(gain)


def _random_gain(d_model: int, seed: int) -> Tensor:
    """A gain far from the initial ones, so that a dropped or misapplied gain shows."""
    return torch.rand(d_model, generator=generator(seed)) + 0.5


def _compare(actual: Any, x: Tensor, gain: Tensor, eps: float, where: str,
             formulas: list[tuple[str, str, _Variant]] = WRONG_FORMULAS) -> None:
    """Fail with the name of the wrong formula ``actual`` matches, if it is not RMSNorm(x)."""
    expected = _reference(x, gain, eps)
    if close(actual, expected):
        return
    if actual.shape != expected.shape:
        fail(f"{NAME}.forward returned shape {tuple(actual.shape)} for an input of shape {tuple(x.shape)}",
             "the output has the input's shape: reduce with keepdim=True and let (..., 1) broadcast", where)
    for mistake, fix, wrong in formulas:
        try:
            candidate = wrong(x, gain, eps)
        except RuntimeError:  # this mistake cannot produce this shape
            continue
        if close(actual, candidate):
            fail(mistake, fix, f"{where}: the output matches that formula")
    fail(f"{NAME}'s output differs from F.rms_norm",
         "RMSNorm(x) = x / √(mean(x²) + ε) · g, the mean over each vector's features: compare each part of yours",
         f"{where}: {_max_error(actual, expected)}")


def _check_construction(impl: Any) -> None:
    refuse_instance(impl, "check_rmsnorm")
    check_signature(impl, ["d_model", "eps", "device", "dtype"], NAME)
    default = inspect.signature(impl.__init__ if inspect.isclass(impl) else impl).parameters["eps"].default
    if default != EPS:
        shown = "missing" if default is inspect.Parameter.empty else f"{default}"
        fail(f"{NAME}'s default eps is {shown}, not 1e-5",
             "write the signature as (d_model, eps=1e-5, device=None, dtype=None)")
    module = _make(impl, 8)
    if not list(module.parameters()):
        fail(f"{NAME} has no learnable gain (no nn.Parameter)",
             "register the gain, one learnable number per feature (d_model of them, ones at the start), as an "
             "nn.Parameter called weight")
    check_parameters(module, {"weight": (8,)}, NAME)
    check_initialised(NAME, lambda: impl(8), "initialise the gain to ones, so a new layer only normalises")
    weight = module.weight.detach().double()
    if not torch.equal(weight, torch.ones(8, dtype=torch.float64)):
        values = ", ".join(f"{v:.3g}" for v in weight.tolist())
        if torch.equal(weight, torch.zeros(8, dtype=torch.float64)):
            mistake = f"{NAME}.weight is initialised to zeros, so every output would be 0"
        elif weight.unique().numel() == 1:
            mistake = f"{NAME}.weight is initialised to {weight[0].item():g}, not to ones"
        else:
            mistake = f"{NAME}.weight is initialised to random values, not to ones"
        fail(mistake, "initialise the gain to ones (torch.ones or nn.init.ones_), so a new layer only normalises",
             f"weight = ({values})")
    if callable(getattr(module, "reset_parameters", None)):  # optional in the course, but if it is there, it works
        with torch.no_grad():
            module.weight.fill_(3.0)
        call(f"{NAME}.reset_parameters()", module.reset_parameters)
        if not torch.equal(module.weight.detach().double(), torch.ones(8, dtype=torch.float64)):
            fail(f"{NAME}.reset_parameters() does not set the gain back to ones",
                 "fill it with ones in place (a new nn.Parameter would detach it from optimisers)",
                 "after weight.fill_(3.0) and reset_parameters(), weight is not all ones")
    check_device_and_dtype(lambda **kwargs: impl(8, **kwargs), NAME)


def _check_no_builtin(impl: Any) -> None:
    module = _make(impl, 8)
    x = torch.randn(3, 8, generator=generator(1))
    with BuiltinSpy(_BUILTINS) as spy:
        _forward(module, x)
    refuse_builtins(f"{NAME}.forward", spy, "write the formula yourself (square, mean over dim=-1, add eps, root, "
                    "divide, times the gain); F.rms_norm is the reference the check compares with")


def _check_float32(impl: Any) -> None:
    for seed, (leading, d_model) in enumerate(CASES):
        module = _make(impl, d_model)
        gain = _random_gain(d_model, seed)
        _set_gain(module, gain)
        x = torch.randn(*leading, d_model, generator=generator(seed)) * 3
        before = x.clone()
        actual = _forward(module, x)
        if not torch.equal(x, before):
            fail(f"{NAME}.forward changes its input in place",
                 "use out-of-place operations (x * inv_rms, not x *= inv_rms or x.mul_): the caller still needs x")
        _compare(actual, x, gain, EPS, f"RMSNorm({d_model}), float32 input {tuple(x.shape)}, random gain")


def _check_eps(impl: Any) -> None:
    d_model = 16
    module = _make(impl, d_model)
    zeros = torch.zeros(2, d_model)
    out = _forward(module, zeros)
    if not out.isfinite().all():
        fail("eps is ignored, so an all-zero vector gives 0/0 = NaN",
             "ε goes under the root, RMS = √(mean(x²) + ε): it keeps the denominator away from 0 for a vector near 0",
             f"RMSNorm({d_model})(zeros) contains {out.isnan().sum().item()} NaN")
    _compare(out, zeros, torch.ones(d_model), EPS, f"RMSNorm({d_model}) on an all-zero input")

    # Inputs of RMS ~1e-3 (below sqrt(eps) = 3.2e-3): where eps is added now matters.
    gain = _random_gain(d_model, 10)
    _set_gain(module, gain)
    x = torch.randn(3, d_model, generator=generator(10)) * 1e-3
    _compare(_forward(module, x), x, gain, EPS, f"RMSNorm({d_model}) on inputs of RMS about 1e-3")

    # A non-default eps must be the one used.
    eps = 0.1
    module = _make(impl, d_model, eps=eps)
    _set_gain(module, gain)
    x = torch.randn(3, d_model, generator=generator(11)) * 0.3
    fixed = [(f"forward ignores the eps argument and uses a fixed eps = {other:g}",
              "store it in __init__ (self.eps = eps) and add self.eps under the root",
              lambda x, g, _eps, other=other: x / torch.sqrt(_ms(x) + other) * g)
             for other in (1e-5, 1e-6, 1e-8, 0.0)]
    _compare(_forward(module, x), x, gain, eps, f"RMSNorm({d_model}, eps={eps:g}) on inputs of RMS about 0.3",
             fixed + WRONG_FORMULAS)

    # The same state dict as torch.nn.RMSNorm, and the same output.
    reference = nn.RMSNorm(d_model, eps=eps)
    _set_gain(reference, gain * 2)
    call(f"{NAME}.load_state_dict(nn.RMSNorm's state dict, strict=True)", module.load_state_dict,
         reference.state_dict(), strict=True)
    with torch.no_grad():
        expected = reference(x)
    actual = _forward(module, x)
    if not close(actual, expected):
        fail(f"{NAME}'s output differs from torch.nn.RMSNorm's with the same state dict",
             "use self.weight and self.eps in forward, nothing stored elsewhere", _max_error(actual, expected))


def _check_half(impl: Any) -> None:
    d_model = 64
    x = (torch.randn(4, d_model, generator=generator(20)) * 300).half()  # squares of ~300 overflow float16
    gain = _random_gain(d_model, 20).half()
    module = _make(impl, d_model, dtype=torch.float16)
    _set_gain(module, gain)
    out = _forward(module, x)
    if out.shape != x.shape:
        fail(f"{NAME}.forward returned {describe(out)} for a float16 input of shape {tuple(x.shape)}",
             "return a tensor of the input's shape")
    expected = F.rms_norm(x.double(), (d_model,), gain.double(), eps=EPS)
    where = f"RMSNorm({d_model}, dtype=float16) on float16 activations of about 300"
    if not close(out.double(), expected, rtol=2e-3, atol=1e-3):
        naive = x / torch.sqrt(_ms(x) + EPS) * gain
        if not out.isfinite().all() or (out == 0).all() or close(out, naive):
            fail("no float32 upcast, so in float16 the squares of activations above 256 overflow to inf "
                 "and the output becomes 0 (or NaN)",
                 "compute in float32, where the squares fit, and cast the result back to the input's dtype",
                 f"{where}: {(out == 0).sum().item()} zeros, {(~out.isfinite()).sum().item()} inf/NaN in the output")
        fail(f"{NAME}'s float16 output differs from F.rms_norm computed in float64",
             "upcast x to float32, compute, multiply by the gain, then cast back to x.dtype",
             f"{where}: {_max_error(out, expected)}")
    for module_dtype, in_dtype in [(torch.float16, torch.float16), (torch.float32, torch.float16),
                                   (torch.float32, torch.bfloat16)]:
        module = _make(impl, d_model, dtype=module_dtype)
        out = _forward(module, x.to(in_dtype))
        if out.dtype != in_dtype:
            fail(f"the result is not cast back to the input's dtype ({dtype_name(in_dtype)} in, "
                 f"{dtype_name(out.dtype)} out)",
                 "cast the result back to the dtype x came in (remember it before the upcast)",
                 f"RMSNorm({d_model}, dtype={dtype_name(module_dtype)}) on a {dtype_name(in_dtype)} input")
        expected = F.rms_norm(x.to(in_dtype).double(), (d_model,), eps=EPS)
        rtol = 2e-3 if in_dtype == torch.float16 else 1.6e-2
        if not close(out.double(), expected, rtol=rtol, atol=rtol):
            fail(f"{NAME}'s {dtype_name(in_dtype)} output differs from F.rms_norm computed in float64",
                 "upcast x to float32, compute, multiply by the gain, then cast back to x.dtype",
                 f"RMSNorm({d_model}, dtype={dtype_name(module_dtype)}): {_max_error(out, expected)}")


def _check_float64(impl: Any) -> None:
    d_model = 16
    x = torch.randn(5, d_model, generator=generator(30), dtype=torch.float64) * 3
    for module_dtype in (torch.float32, torch.float64):  # a float32 gain, as in a mixed-precision model, first
        module = _make(impl, d_model, dtype=module_dtype)
        _set_gain(module, _random_gain(d_model, 30))
        gain = module.weight.detach().double()
        out = _forward(module, x)
        where = f"RMSNorm({d_model}, dtype={dtype_name(module_dtype)}) on a float64 input"
        if out.dtype != torch.float64:
            fail(f"a float64 input is downcast and comes back as {out.dtype}",
                 "upcast only what is narrower than float32, and cast the result back to x's dtype", where)
        expected = _reference(x, gain, EPS)
        if close(out, expected, rtol=1e-10, atol=1e-10):
            continue
        if close(out, expected, rtol=1e-5, atol=1e-5):
            fail("a float64 input is computed in float32 (x.float()), so it keeps only float32's 7 digits",
                 "upcast only what is narrower than float32: float64 keeps its own precision",
                 f"{where}: {_max_error(out, expected)}")
        _compare(out, x, gain, EPS, where)


def _check_gradients(impl: Any) -> None:
    d_model = 6
    module = _make(impl, d_model, dtype=torch.float64)
    gain = _random_gain(d_model, 40).double()
    _set_gain(module, gain)
    x = torch.randn(4, d_model, generator=generator(40), dtype=torch.float64).requires_grad_(True)
    upstream = torch.randn(4, d_model, generator=generator(41), dtype=torch.float64)
    out = _forward(module, x)
    if not out.requires_grad:
        fail(f"{NAME}'s output is not connected to the autograd graph",
             "do not compute under torch.no_grad() and do not use .detach(), .item() or .data in forward")
    grad_x, grad_w = torch.autograd.grad((out * upstream).sum(), (x, module.weight), allow_unused=True)
    g = gain.clone().requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    ref_x, ref_w = torch.autograd.grad((_reference(x_ref, g, EPS) * upstream).sum(), (x_ref, g))
    if grad_w is None or not close(grad_w, ref_w):
        fail("the gradient does not reach the gain (forward uses self.weight.data or a detached copy)",
             "multiply by self.weight itself, so training can learn it",
             "weight.grad is None" if grad_w is None else _max_error(grad_w, ref_w))
    if grad_x is None or not close(grad_x, ref_x):
        detached = x.detach().clone().requires_grad_(True)
        rms = torch.sqrt(_ms(detached) + EPS).detach()
        (variant,) = torch.autograd.grad((detached / rms * gain * upstream).sum(), (detached,))
        if grad_x is not None and close(grad_x, variant):
            fail("the RMS is detached from the graph (.detach(), .item() or no_grad), so the input gradient is wrong",
                 "compute rms from x with ordinary tensor operations: the gradient flows through it too")
        fail(f"{NAME}'s input gradient differs from F.rms_norm's",
             "build forward from differentiable tensor operations only (no .data, .numpy(), in-place tricks)",
             "x.grad is None" if grad_x is None else _max_error(grad_x, ref_x))


def check_rmsnorm(impl: Any) -> None:
    """Check a learner's ``RMSNorm(d_model, eps=1e-5, device=None, dtype=None)`` class.

    Checks the signature and the default eps; one parameter ``weight`` of shape (d_model,), initialised
    (and reset by ``reset_parameters``, where there is one) to ones, and nothing else; device/dtype
    honoured; outputs against ``F.rms_norm`` with a random gain for leading shapes (), (3,), (2, 5), (8,),
    (4,), (2, 1, 3) and d_model 5, 8, 16; an all-zero input; inputs of RMS 1e-3; a non-default eps;
    ``nn.RMSNorm``'s state dict; float16 activations of ~300 (float16 and float32 gains) and bfloat16
    inputs; float64 precision (float64 and float32 gains); the gradients of input and gain against
    ``F.rms_norm``'s.

    Mistakes it recognises:

    * the gain: missing, named other than ``weight``, initialised to zeros or to random values, not
      reset to ones by ``reset_parameters``, not applied in forward, detached from autograd (``.data``);
    * the mean over the wrong dimension (dim=0, all dimensions) or without keepdim; the sum instead of
      the mean; subtracting the mean (LayerNorm); the standard deviation instead of the RMS; the square
      root missing; the RMS detached from autograd;
    * eps outside the square root; eps ignored (an all-zero vector gives NaN); a fixed eps instead of
      the eps argument; a default eps other than 1e-5;
    * no float32 upcast for float16 inputs (squares of ~300 overflow); the result not cast back to the
      input's dtype; float64 inputs computed in, or returned as, float32;
    * device/dtype ignored; the input changed in place; PyTorch's own F.rms_norm used inside.
    """
    _check_construction(impl)
    _check_no_builtin(impl)
    _check_float32(impl)
    _check_eps(impl)
    _check_half(impl)
    _check_float64(impl)
    _check_gradients(impl)
    passed("check_rmsnorm: weight (d_model,) = ones, device/dtype, outputs = F.rms_norm and nn.RMSNorm "
           "(6 shapes, eps, all-zero input), float16/bfloat16 upcast and cast back, float64, gradients")

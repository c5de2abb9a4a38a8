"""``check_silu`` and ``check_swiglu``: the learner's SiLU (notebook 07) against ``F.silu``, and their SwiGLU against
the same formula written with ``F.linear`` and ``F.silu``, with weights the check chooses and loads."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import reference
from ._harness import (call, call_without_builtins, check_device_and_dtype, check_initialised, check_parameters,
                       check_signature, close, construct, crash_of, dtype_name, expect_tensor, fail, generator, passed,
                       refuse_instance)

# What a composite says of a weight never filled: its parts initialise themselves, as their own checks demand.
_INIT_FIX = ("build each part from the course's Linear (Embedding, RMSNorm), which fills its own weight, and do not "
             "replace a weight with a new, unfilled one afterwards")

# ---------------------------------------------------------------------------------------------------- silu

_SILU_BUILTINS = {F.silu: "F.silu", torch._C._nn.silu: "F.silu"}  # nn.SiLU goes through F.silu
_SILU_FIX = ("compute it yourself from its definition, x · sigmoid(x): F.silu is only the reference the check "
             "compares with")
_SHAPES = [(7,), (), (3, 5), (2, 3, 4)]
_HALF = (torch.float16, torch.bfloat16)


def _silu_name(x: Tensor) -> str:
    return f"silu(x) with x of shape {tuple(x.shape)} ({dtype_name(x.dtype)})"


def _run_silu(impl: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """The learner's ``silu(x)``: called safely, without F.silu, the input watched; shape and dtype checked."""
    before = x.detach().clone()
    out = call_without_builtins(_silu_name(x), _SILU_BUILTINS, _SILU_FIX, impl, x)
    if not torch.equal(x.detach(), before):
        fail("silu modifies its input x in place (x.mul_, x *= ..., torch.sigmoid_)",
             "return a new tensor and leave x as it was: the caller (w1's output, in SwiGLU) still needs x")
    expect_tensor(_silu_name(x), out, returns="return the tensor of x · sigmoid(x)")
    if out.shape != x.shape:
        fail(f"{_silu_name(x)} returned shape {tuple(out.shape)}, expected x's shape {tuple(x.shape)}",
             "silu acts element by element: no sum, mean or reshape")
    if out.dtype != x.dtype:
        fail(f"silu returns {dtype_name(out.dtype)} for a {dtype_name(x.dtype)} input: the dtype is not kept",
             "compute in x's dtype, with no .float() / .double() / .to(...); if you upcast, cast the result back "
             "to x's dtype")
    return out


def _silu_variants(x: Tensor) -> list[tuple[str, str, Callable[[], Tensor]]]:
    """The classic wrong SiLUs, most specific first: (mistake, fix, how to compute it)."""
    right = "silu(x) = x · sigmoid(x)"
    return [
        ("silu returns sigmoid(x) alone, without the factor x",
         f"multiply by x: {right}", lambda: torch.sigmoid(x)),
        ("silu computes x · sigmoid(-x): the sign in the exponent is flipped (1 / (1 + exp(x)) is sigmoid(-x))",
         f"sigmoid(x) = 1 / (1 + exp(-x)); or simply {right}", lambda: x * torch.sigmoid(-x)),
        ("silu returns ReLU(x) = max(x, 0), which is SiLU only far from 0",
         f"{right}: near 0 SiLU is smooth and slightly negative for x < 0", lambda: torch.relu(x)),
        ("silu computes GELU, x · Φ(x) with the normal CDF Φ (F.gelu), not SiLU",
         f"SiLU uses the sigmoid: {right}", lambda: F.gelu(x)),
        ("silu computes GELU's tanh approximation, 0.5 x (1 + tanh(√(2/π)(x + 0.044715 x³)))",
         f"SiLU uses the sigmoid: {right}", lambda: F.gelu(x, approximate="tanh")),
        ("silu computes x · sigmoid(1.702 x), GELU's sigmoid approximation",
         f"SiLU (Swish with β = 1) does not scale the sigmoid's input: {right}", lambda: x * torch.sigmoid(1.702 * x)),
        ("silu computes x · tanh(x), not x · sigmoid(x)",
         f"tanh goes from -1 to 1, the sigmoid from 0 to 1: {right}", lambda: x * torch.tanh(x)),
        ("silu computes Mish, x · tanh(softplus(x)), not SiLU",
         f"{right}", lambda: F.mish(x)),
        ("silu returns softplus(x) = log(1 + exp(x)), not x · sigmoid(x)",
         f"{right}", lambda: F.softplus(x)),
        ("silu adds x and sigmoid(x) instead of multiplying them",
         f"{right}", lambda: x + torch.sigmoid(x)),
        ("silu writes the sigmoid as exp(x) / (1 + exp(x)), which overflows: exp(x) is inf for large x "
         "(x > 88 in float32) and inf / inf = NaN",
         f"use torch.sigmoid, which is safe for every input: {right}",
         lambda: x * torch.exp(x) / (1 + torch.exp(x))),
    ]


def _compare_silu(impl: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    out = _run_silu(impl, x)
    expected = F.silu(x)
    if close(out, expected):
        return out
    finite = torch.isfinite(expected)
    error = (out.detach().double() - expected.double())[finite & torch.isfinite(out.detach())].abs()
    evidence = f"{_silu_name(x)}: off by up to {error.max().item() if error.numel() else float('nan'):.3g}"
    bad = int((~torch.isfinite(out.detach()) & finite).sum())
    if bad:
        evidence += f"; NaN or inf at {bad} entries where F.silu is finite"
    for mistake, fix, compute in _silu_variants(x):
        if close(out, compute()):
            fail(mistake, fix, evidence)
    if x.dtype == torch.float64 and close(out, expected, rtol=1e-5, atol=1e-6):
        fail("silu computes a float64 input in float32 and casts back, so it keeps only float32's 7 digits",
             "compute in x's dtype: no .float()", evidence)
    fail(f"{_silu_name(x)} differs from F.silu(x)", "silu(x) = x · sigmoid(x), element by element: find the part of "
         "yours that differs", evidence)


def _check_silu_values(impl: Callable[[Tensor], Tensor], g: torch.Generator) -> None:
    """Shapes (), (7,), (3, 5), (2, 3, 4) in float32 and float64; then inputs out to ±1000."""
    for dtype in (torch.float32, torch.float64):
        for shape in _SHAPES:
            _compare_silu(impl, 4 * torch.randn(shape, generator=g, dtype=dtype))
    grid = torch.linspace(-8, 8, 33, dtype=torch.float64)
    _compare_silu(impl, grid)  # exact multiples of 0.5: readable evidence
    for dtype in (torch.float32, torch.float64):
        extreme = torch.tensor([-1000.0, -100.0, -30.0, -12.0, 12.0, 30.0, 100.0, 1000.0], dtype=dtype)
        _compare_silu(impl, extreme)


def _check_silu_half(impl: Callable[[Tensor], Tensor], g: torch.Generator) -> None:
    """float16 and bfloat16: the dtype kept, and within two of the dtype's rounding steps of the exact result."""
    for dtype in _HALF:
        x = (4 * torch.randn(4, 257, generator=g)).to(dtype)
        out = _run_silu(impl, x)
        exact = F.silu(x.double())
        eps = torch.finfo(dtype).eps
        # atol 2e-4: x / (1 + exp(-x)) is right, but in float16 exp(-x) overflows below x = -11.1 and gives 0 for
        # silu(x) ≈ -1.7e-4 or less; nothing else is lost, and the wrong formulas were caught in float32 already.
        if not close(out.double(), exact, rtol=2 * eps, atol=2e-4):
            relative = ((out.double() - exact).abs() / exact.abs().clamp_min(1e-2)).max().item()
            fail(f"{_silu_name(x)} is off by up to {relative / eps:.1f} rounding steps of {dtype_name(dtype)}",
                 "compute x · sigmoid(x) in x's dtype, or in float32 and cast the result back to x's dtype")


def _check_silu_gradients(impl: Callable[[Tensor], Tensor], g: torch.Generator) -> None:
    """x.grad against F.silu's, in float64."""
    base = 4 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    upstream = torch.randn(3, 5, generator=g, dtype=torch.float64)
    ours = base.clone().requires_grad_(True)
    out = _run_silu(impl, ours)
    if out.grad_fn is None:
        fail("silu's output is cut off from autograd (it has no grad_fn), so no gradient reaches w1 in SwiGLU",
             "build it from torch operations on x: no torch.no_grad(), .detach(), .data, "
             ".item(), .numpy() or math.exp")
    call("backward() through your silu", (out * upstream).sum().backward)
    theirs = base.clone().requires_grad_(True)
    (F.silu(theirs) * upstream).sum().backward()
    if ours.grad is None or not close(ours.grad, theirs.grad):
        sigma = torch.sigmoid(base)
        if ours.grad is not None and close(ours.grad, upstream * sigma):
            fail("the sigmoid factor is detached (.detach(), .data or no_grad), so the gradient misses x · σ'(x)",
                 "let autograd follow both factors of x · sigmoid(x): d/dx = σ(x) + x · σ'(x)")
        difference = float("nan") if ours.grad is None else (ours.grad - theirs.grad).abs().max().item()
        fail("the gradient of silu differs from F.silu's",
             "build silu from differentiable torch operations and let autograd do the rest",
             f"largest difference {difference:.3g}")


def check_silu(impl: Callable[[Tensor], Tensor]) -> None:
    """Check a learner's ``silu(x)`` against ``F.silu``; diagnose what is wrong.

    Checked: the signature ``(x)``; shape, dtype and values for shapes (), (7,), (3, 5), (2, 3, 4) in float32 and
    float64 (float64 to float64 precision), a grid from -8 to 8, inputs of ±12, ±30, ±100, ±1000; float16 and
    bfloat16 (dtype kept, within two rounding steps of the exact result); the gradient against ``F.silu``'s; the
    input left unchanged; no call of ``F.silu`` (or ``nn.SiLU``).

    Mistakes it recognises: the sigmoid alone (no factor x); x · sigmoid(-x) (the sign in the exponent flipped);
    ReLU; GELU (exact, tanh approximation, or x · sigmoid(1.702 x)); x · tanh(x); Mish; softplus; x + sigmoid(x);
    the sigmoid written as exp(x) / (1 + exp(x)) (NaN at large x); ``F.silu`` / ``nn.SiLU`` used inside; the dtype
    not kept (float16 in, float32 out); float64 computed in float32; the output cut off from autograd, or the
    sigmoid factor detached; ``x`` changed in place; a wrong shape.
    """
    check_signature(impl, ["x"], "silu")
    g = generator(0)
    _check_silu_values(impl, g)
    _check_silu_half(impl, g)
    _check_silu_gradients(impl, g)
    passed("check_silu: matches F.silu for 0-3-D inputs in float32/float64, inputs up to ±1000, "
           "float16/bfloat16 kept, gradients, no F.silu")


# -------------------------------------------------------------------------------------------------- SwiGLU

_NAME = "SwiGLU"
_D_MODEL, _D_FF = 8, 12  # never equal: a swapped in/out shows in the shapes
_FORMULA = "SwiGLU(x) = W2 (silu(W1 x) ⊙ W3 x)"
_LEADING = [(2, 5), (), (3,), (2, 3, 4)]
_WEIGHTS = ("w1", "w2", "w3")
_SWIGLU_FIX = "use the silu you wrote for the gate, not F.silu or nn.SiLU: they are what this notebook builds"


def _expected_shapes(d_model: int, d_ff: int) -> dict[str, tuple[int, int]]:
    return {"w1.weight": (d_ff, d_model), "w2.weight": (d_model, d_ff), "w3.weight": (d_ff, d_model)}


def _make(impl: Any, d_model: int, d_ff: int, **kwargs: Any) -> nn.Module:
    return construct(_NAME, impl, d_model, d_ff, **kwargs)


def _check_structure(impl: Any) -> None:
    """Signature; three Linear submodules w1, w2, w3 (the course's, not nn.Linear) with the right shapes; no bias."""
    refuse_instance(impl, "check_swiglu")
    check_signature(impl, ["d_model", "d_ff", "device", "dtype"], _NAME)
    module = _make(impl, _D_MODEL, _D_FF)
    found = {key: tuple(p.shape) for key, p in module.named_parameters()}
    expected = _expected_shapes(_D_MODEL, _D_FF)
    if not found:
        fail(f"{_NAME} has no parameters",
             "in __init__ create self.w1, self.w2, self.w3 as Linear layers (Linear(d_model, d_ff, device=device, "
             "dtype=dtype) for w1 and w3, Linear(d_ff, d_model, ...) for w2)")
    biases = [key for key in found if key == "bias" or key.endswith(".bias")]
    if biases:
        fail(f"{_NAME} has biases ({', '.join(biases)}), but the Llama recipe has no biases anywhere",
             "build w1, w2, w3 with the course's Linear, which has none (torch.nn.Linear adds one unless bias=False)")
    if any(isinstance(m, nn.Linear) for m in module.modules()):
        fail(f"{_NAME} builds its layers with torch.nn.Linear, which initialises itself Kaiming-uniform, "
             "not with the recipe's truncated normal",
             "use the course's Linear from notebook 01 (the export cell imports it for you): "
             "self.w1 = Linear(d_model, d_ff, device=device, dtype=dtype)")
    if any(key.split(".")[0] in ("gate_proj", "up_proj", "down_proj") for key in found):
        fail(f"{_NAME} uses Hugging Face's names (gate_proj, up_proj, down_proj), not the course's w1, w2, w3",
             "rename them: w1 = gate_proj (the one that goes through silu), w3 = up_proj (the value path), "
             "w2 = down_proj (back to d_model); the course's checkpoints load by these names")
    bare = [key for key in _WEIGHTS if key in found]
    if bare:
        fail(f"{', '.join(bare)} are bare nn.Parameters, so the state dict says '{bare[0]}' where the course's "
             f"checkpoints say '{bare[0]}.weight'",
             "make each one a Linear submodule: self.w1 = Linear(d_model, d_ff, device=device, dtype=dtype)")
    layers = [getattr(module, name, None) for name in _WEIGHTS]
    if layers[0] is not None and layers[0] is layers[2]:
        fail("w3 is the same layer as w1 (self.w3 = self.w1), so the gate and the value share their weights",
             "create a separate Linear for each: self.w3 = Linear(d_model, d_ff, device=device, dtype=dtype)")
    if set(found) != set(expected):
        check_parameters(module, expected, _NAME)  # names the missing and unexpected ones
    rows = found["w1.weight"][0]
    if rows != _D_FF and found["w3.weight"][0] == rows and found["w2.weight"][1] == rows \
            and found["w1.weight"][1] == _D_MODEL:
        fail(f"{_NAME} ignores its d_ff argument: {_NAME}({_D_MODEL}, {_D_FF}) has a hidden width of {rows}",
             "use d_ff as given, Linear(d_model, d_ff, ...): the caller chooses it (swiglu_hidden_size(d_model) is "
             "the usual choice, computed outside the class)")
    roles = {"w1": ("d_model", "d_ff", "the gate's input"), "w3": ("d_model", "d_ff", "the value path"),
             "w2": ("d_ff", "d_model", "back to the model's width")}
    sizes = {"d_model": _D_MODEL, "d_ff": _D_FF}
    for name, (d_in, d_out, role) in roles.items():
        shape, want = found[f"{name}.weight"], expected[f"{name}.weight"]
        if shape != want:
            fail(f"{name}.weight has shape {shape}, expected {want} = ({d_out}, {d_in}) for {_NAME}({_D_MODEL}, "
                 f"{_D_FF})",
                 f"{name} maps {d_in} -> {d_out} ({role}), so build it as Linear({d_in}, {d_out}): "
                 "Linear(in_features, out_features) stores its weight as (out, in)",
                 f"{d_in} = {sizes[d_in]}, {d_out} = {sizes[d_out]}")
    check_parameters(module, expected, _NAME)  # and no persistent buffers


def _check_init(impl: Any) -> None:
    """Each weight as Linear's recipe makes it: std 0.987 σ for its own shape, cut at ±3σ; w1 and w3 different."""
    d_model, d_ff = 64, 160
    torch.manual_seed(0)
    module = check_initialised(_NAME, lambda: impl(d_model, d_ff), _INIT_FIX)
    weights = {name: getattr(module, name).weight.detach().double() for name in _WEIGHTS}
    for name, w in weights.items():
        sigma = math.sqrt(2 / sum(w.shape))
        ratio, top = w.std().item() / sigma, w.abs().max().item() / sigma
        if not (math.isfinite(ratio) and 0.95 <= ratio <= 1.02 and top <= 3 * (1 + 1e-3)):
            fail(f"{_NAME}.{name}.weight does not start as Linear's recipe says",
                 "build w1, w2, w3 with the course's Linear, which initialises itself (its check_linear passes), "
                 "and do not overwrite the weights afterwards",
                 f"{_NAME}({d_model}, {d_ff}).{name}.weight {tuple(w.shape)}: std {ratio:.3f} σ, max |w| {top:.2f} σ; "
                 f"expected 0.987 σ and at most 3 σ, σ = sqrt(2 / (d_in + d_out)) = {sigma:.4f}")
    if torch.equal(weights["w1"], weights["w3"]):
        fail("w1 and w3 start with identical weights, so the gate and the value path compute the same thing",
             "create two separate Linear layers; each draws its own weights")


def _check_device_and_dtype(impl: Any) -> None:
    """``SwiGLU(..., device=..., dtype=...)`` creates all three weights there (the meta device: no GPU needed)."""
    check_device_and_dtype(lambda **kwargs: impl(_D_MODEL, _D_FF, **kwargs), _NAME, "pass both on to each layer: "
                           "Linear(d_model, d_ff, device=device, dtype=dtype), and the same for w2 and w3")


def _known_weights(d_model: int, d_ff: int, dtype: torch.dtype, seed: int) -> dict[str, Tensor]:
    """Weights the check chooses (scaled so that activations stay around 1): w1 and w3 clearly different."""
    g = generator(seed)
    return {f"{name}.weight": torch.randn(shape, generator=g, dtype=dtype) / math.sqrt(shape[1])
            for name, shape in zip(_WEIGHTS, [(d_ff, d_model), (d_model, d_ff), (d_ff, d_model)])}


def _load(module: nn.Module, weights: dict[str, Tensor], what: str) -> None:
    call(f"{what}.load_state_dict(a state dict with w1.weight, w2.weight, w3.weight, strict=True)",
         module.load_state_dict, weights, strict=True)


def _reference(x: Tensor, w: dict[str, Tensor]) -> Tensor:
    return reference.swiglu(x, w["w1.weight"], w["w2.weight"], w["w3.weight"])


def _swiglu_variants(x: Tensor, w: dict[str, Tensor]) -> list[tuple[str, str, Callable[[], Tensor]]]:
    """The classic wrong SwiGLUs, computed with the same known weights: (mistake, fix, how to compute it)."""
    a, b = F.linear(x, w["w1.weight"]), F.linear(x, w["w3.weight"])
    down = lambda h: F.linear(h, w["w2.weight"])  # noqa: E731
    return [
        ("w1 and w3 are swapped in roles: silu is applied to the w3 path (w2(w1 x ⊙ silu(w3 x)))",
         f"the gate is silu(w1 x), the value w3 x: {_FORMULA}. Freshly initialised the two are equally good, "
         "but a checkpoint's trained w1 is the gate", lambda: down(a * F.silu(b))),
        ("silu is applied after the product, to w1 x ⊙ w3 x, instead of to w1 x alone",
         f"apply silu to the gate only: {_FORMULA}", lambda: down(F.silu(a * b))),
        ("silu is applied to the output, after w2, instead of to w1 x",
         f"silu belongs to the gate, before the product: {_FORMULA}", lambda: F.silu(down(a * b))),
        ("w2 is applied to each path before the product (w2(silu(w1 x)) ⊙ w2(w3 x))",
         f"multiply the two d_ff-wide paths first, then apply w2 once: {_FORMULA}",
         lambda: down(F.silu(a)) * down(b)),
        ("the gate is missing: w3 is never used, so this is a plain two-matrix FFN w2(silu(w1 x))",
         f"multiply by the value path: {_FORMULA}", lambda: down(F.silu(a))),
        ("only the value path reaches w2: w2(w3 x), with no gate (w1 and silu unused)",
         f"multiply the value by the gate silu(w1 x): {_FORMULA}", lambda: down(b)),
        ("there is no activation: w2(w1 x ⊙ w3 x) is a bilinear layer, not SwiGLU",
         f"pass the gate through silu: {_FORMULA}", lambda: down(a * b)),
        ("silu is applied to both paths (w2(silu(w1 x) ⊙ silu(w3 x))); the value path has no activation",
         f"only the gate goes through silu: {_FORMULA}", lambda: down(F.silu(a) * F.silu(b))),
        ("the gate is sigmoid(w1 x): that is GLU, not SwiGLU",
         f"SwiGLU's gate is silu(w1 x) = w1 x · sigmoid(w1 x): {_FORMULA}", lambda: down(torch.sigmoid(a) * b)),
        ("the gate is ReLU(w1 x): that is ReGLU, not SwiGLU",
         f"use silu: {_FORMULA}", lambda: down(torch.relu(a) * b)),
        ("the gate is GELU(w1 x): that is GEGLU, not SwiGLU",
         f"use silu: {_FORMULA}", lambda: down(F.gelu(a) * b)),
        ("the gate is GELU(w1 x) (tanh approximation): that is GEGLU, not SwiGLU",
         f"use silu: {_FORMULA}", lambda: down(F.gelu(a, approximate="tanh") * b)),
        ("the two paths are added (silu(w1 x) + w3 x), not multiplied",
         f"the gate multiplies the value element by element: {_FORMULA}", lambda: down(F.silu(a) + b)),
    ]


def _forward(module: nn.Module, x: Tensor, what: str) -> Tensor:
    """module(x) without F.silu, turning the classic shape crash (w2 before the product) into its diagnosis."""
    try:
        return call_without_builtins(what, _SILU_BUILTINS, _SWIGLU_FIX, module, x)
    except AssertionError as error:
        cause = crash_of(error)
        if isinstance(cause, RuntimeError) and "must match the size of tensor" in str(cause):
            fail("forward multiplies a (..., d_model) tensor by a (..., d_ff) one: w2 is applied before the product",
                 f"the product silu(w1 x) ⊙ w3 x is (..., d_ff); apply w2 last, to the product: {_FORMULA}",
                 f"{what}: {str(cause).splitlines()[0]}")
        raise


def _compare(y: Any, x: Tensor, w: dict[str, Tensor], what: str) -> None:
    expected = _reference(x, w)
    expect_tensor(what, y, returns=f"return the output tensor, {_FORMULA}")
    if y.shape != expected.shape:
        fail(f"{what} returned shape {tuple(y.shape)}, expected {tuple(expected.shape)}",
             f"the output keeps x's leading dimensions and has d_model as its last one: {_FORMULA}")
    if y.dtype != expected.dtype:
        fail(f"{what} returned {dtype_name(y.dtype)} for a {dtype_name(x.dtype)} input and weights",
             "compute in the input's dtype: no .float() / .to(...) inside forward")
    if close(y, expected):
        return
    evidence = f"{what}: off by up to {(y.detach().double() - expected.double()).abs().max().item():.3g}"
    for mistake, fix, compute in _swiglu_variants(x, w):
        if close(y, compute()):
            fail(mistake, fix, evidence + "; the output matches that formula")
    if x.dtype == torch.float64 and close(y, expected, rtol=1e-5, atol=1e-6):
        fail(f"{what} matches only to float32 precision: it computes in float32 and casts back",
             "compute in the input's dtype: no .float() inside forward", evidence)
    fail(f"{_NAME}'s output differs from w2(silu(w1 x) ⊙ w3 x) written with F.linear and F.silu",
         f"compare your forward with {_FORMULA}; if check_silu fails, fix silu first", evidence)


def _check_forward(impl: Any) -> None:
    """Known weights, loaded by name; outputs against F.linear/F.silu for 4 leading shapes, float32 and float64."""
    seed = 10
    for d_model, d_ff in [(_D_MODEL, _D_FF), (16, 6)]:
        for dtype in (torch.float32, torch.float64):
            seed += 1
            what = f"{_NAME}({d_model}, {d_ff}, dtype={dtype_name(dtype)})"
            module = _make(impl, d_model, d_ff, dtype=dtype)
            weights = _known_weights(d_model, d_ff, dtype, seed)
            _load(module, weights, what)
            g = generator(seed)
            for leading in _LEADING:
                x = torch.randn(*leading, d_model, generator=g, dtype=dtype)
                call_what = f"{what}(x of shape {tuple(x.shape)})"
                _compare(_forward(module, x, call_what), x, weights, call_what)


def _check_gradients(impl: Any) -> None:
    """The gradients of x, w1, w2 and w3 against the F.linear/F.silu formula's, in float64."""
    d_model, d_ff = 6, 10
    module = _make(impl, d_model, d_ff, dtype=torch.float64)
    weights = _known_weights(d_model, d_ff, torch.float64, 40)
    _load(module, weights, f"{_NAME}({d_model}, {d_ff})")
    g = generator(40)
    x = torch.randn(2, 3, d_model, generator=g, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(2, 3, d_model, generator=g, dtype=torch.float64)
    y = _forward(module, x, f"{_NAME}({d_model}, {d_ff})(x)")
    if not y.requires_grad:
        fail(f"{_NAME}'s output carries no gradient (computed under torch.no_grad(), or from .detach() / .data)",
             f"compute it from the layers directly: {_FORMULA}")
    call(f"backward through {_NAME}", (y * upstream).sum().backward)
    reference_w = {key: t.clone().requires_grad_(True) for key, t in weights.items()}
    reference_x = x.detach().clone().requires_grad_(True)
    (_reference(reference_x, reference_w) * upstream).sum().backward()
    for name in _WEIGHTS:
        grad = getattr(module, name).weight.grad
        if grad is None or not close(grad, reference_w[f"{name}.weight"].grad):
            fail(f"{name}.weight's gradient differs from the formula's" + (" (it gets none)" if grad is None else ""),
                 f"call the layers themselves, {_FORMULA}, without .detach() or .data, and let autograd do the rest")
    if x.grad is None or not close(x.grad, reference_x.grad):
        fail(f"the gradient with respect to {_NAME}'s input differs from the formula's",
             f"build forward from differentiable operations only: {_FORMULA}")


def check_swiglu(impl: Any) -> None:
    """Check a learner's ``SwiGLU(d_model, d_ff, device=None, dtype=None)`` class; diagnose what is wrong.

    Checked: the signature; exactly three parameters ``w1.weight`` (d_ff, d_model), ``w2.weight`` (d_model, d_ff),
    ``w3.weight`` (d_ff, d_model), in submodules built with the course's ``Linear`` (so checkpoints load by name),
    no bias and no persistent buffer; each weight initialised as ``Linear``'s recipe says for its shape;
    device/dtype honoured; with **known** weights loaded through ``load_state_dict(strict=True)``, outputs against
    ``F.linear(F.silu(F.linear(x, W1)) * F.linear(x, W3), W2)`` for d_ff > d_model and d_ff < d_model, leading shapes
    (), (3,), (2, 5), (2, 3, 4), float32 and float64; the gradients of x, w1, w2, w3 against the formula's.
    Known weights matter: with random ones, w1 and w3 are interchangeable and a swap could not be seen.

    Mistakes it recognises: w1 and w3 swapped in roles (silu on the w3 path); silu applied after the product, or to
    the output; w2 applied before the product (to each path, or to the gate alone: a shape crash); the gate missing
    (w3 unused), or the value alone; no activation (bilinear); silu on both paths; a sigmoid (GLU), ReLU (ReGLU) or
    GELU (GEGLU) gate; the paths added instead of multiplied; a weight stored the wrong way round (w2 as
    (d_ff, d_model), or w1/w3 as (d_model, d_ff)); the d_ff argument ignored; Hugging Face's names (gate_proj,
    up_proj, down_proj), bare nn.Parameters (w1 instead of w1.weight), other names; w3 the same layer as w1;
    biases; torch.nn.Linear instead of the course's Linear (the decision: refused, its init is Kaiming-uniform);
    weights not initialised as the recipe says, or never filled (torch.empty); device/dtype ignored; F.silu / nn.SiLU
    used inside; float64 computed in float32, the dtype not kept; no gradient reaching a weight.
    """
    with torch.random.fork_rng(devices=[]):
        _check_structure(impl)
        _check_init(impl)
        _check_device_and_dtype(impl)
        _check_forward(impl)
        _check_gradients(impl)
    passed("check_swiglu: w1 (d_ff, d_model), w2 (d_model, d_ff), w3 (d_ff, d_model) from the course's Linear, "
           "no bias; init; device/dtype; known weights: matches w2(silu(w1 x) ⊙ w3 x) from F.linear/F.silu "
           "(4 leading shapes, float32/64); gradients")

"""The checks of notebook 15 (LoRA fine-tuning): ``check_lora_linear`` (a frozen Linear plus a trainable low-rank
update) and ``check_apply_lora`` (the adapters put into a small ``TransformerLM``).

Each compares the learner's code with an answer computed here independently: a LoRALinear's output with
x Wᵀ + (alpha / rank) · (x Aᵀ) Bᵀ from its own base weight, A and B; a model with adapters with the same model whose
targets' weights have (alpha / rank) · B A added (the merged form, computed here). When they differ, it names the
first classic mistake the learner's result matches.

The base Linear the checks build is the one the learner's code sees (in the student edition, the learner's own from
notebook 01, which ``my_transformer`` exports), so that a class that only adapts that Linear is checked on it.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

import torch
from torch import nn

from ..linear import Linear as CourseLinear
from ._fixtures import LM_V, learners_linear, small_lm
from ._harness import (TRUNCATED_STD, attempt, call, check_gradients, check_initialised, check_signature, close,
                       construct, describe, diagnose, expect_tensor, fail, first_line, generator, passed,
                       refuse_instance, refuses, truncated_std)

_NAME = "LoRALinear"
_RECIPE = "N(0, σ²) with σ = 1 / sqrt(d_in), truncated at ±3σ (trunc_normal_'s cut a, b is in weight units)"
_A_INIT = (2048, 64, 64)  # d_in, d_out, rank of the layer whose lora_A is measured: 131,072 draws
_LEADING = [(2, 3), (), (1, 4, 2)]


def _base(linear: type[nn.Module], d_in: int, d_out: int, dtype: torch.dtype = torch.float32,
          gen: torch.Generator | None = None) -> nn.Module:
    """A base Linear(d_in, d_out) of that dtype, its weight drawn from ``gen`` when given."""
    base = construct("Linear", linear, d_in, d_out, dtype=dtype)
    if gen is not None:
        with torch.no_grad():
            base.weight.copy_(torch.randn(d_out, d_in, generator=gen, dtype=torch.float64).to(dtype))
    return base


def _set_factors(layer: nn.Module, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random lora_A and lora_B (B away from zero, so that the update shows), copied into the layer; returned."""
    A = torch.randn(*layer.lora_A.shape, generator=gen, dtype=torch.float64).to(layer.lora_A.dtype)
    B = torch.randn(*layer.lora_B.shape, generator=gen, dtype=torch.float64).to(layer.lora_B.dtype)
    with torch.no_grad():
        layer.lora_A.copy_(A)
        layer.lora_B.copy_(B)
    return A, B


# ------------------------------------------------------------------------------------------------- LoRALinear

def _check_structure(impl: type, linear: type[nn.Module]) -> None:
    """Parameters (the base's weight itself, lora_A, lora_B), the base frozen and untouched, scaling, merged, the
    initialisation of B (zero) and A (not zero)."""
    base = _base(linear, 6, 4, gen=generator(0))
    weight = base.weight.detach().clone()
    layer = check_initialised(_NAME, lambda: impl(base, 2, 4.0), f"fill lora_A with {_RECIPE} and lora_B with zeros")
    what = f"{_NAME}(Linear(6, 4), rank=2, alpha=4.0)"
    params = dict(layer.named_parameters())
    if not any(p is base.weight for p in params.values()):
        copies = [name for name, p in params.items() if p.shape == weight.shape and torch.equal(p.detach(), weight)]
        if copies:
            fail(f"{_NAME} copies the base's weight ({copies[0]} is a new tensor with the same numbers)",
                 "keep the base Linear itself (self.base = base): a copy doubles the memory, and merge() would change "
                 "the copy, not the model's own weight")
        fail(f"{what} does not hold the base's weight among its parameters", "keep the base Linear itself as a "
             "submodule: self.base = base")
    others = sorted(name for name, p in params.items() if p is not base.weight and name not in ("lora_A", "lora_B"))
    if "lora_A" not in params or "lora_B" not in params or others:
        fail(f"{_NAME}'s parameters are named {sorted(params)}, expected lora_A, lora_B and the base's weight",
             "register exactly two new nn.Parameters, lora_A and lora_B (adapters are saved and loaded by name)")
    shapes = tuple(params["lora_A"].shape), tuple(params["lora_B"].shape)
    if shapes == ((6, 2), (2, 4)):
        fail(f"{what}.lora_A and lora_B are stored transposed: {shapes[0]} and {shapes[1]}",
             "store them like a Linear's weight, (out, in): lora_A (rank, d_in) = (2, 6), lora_B (d_out, rank) = "
             "(4, 2)")
    if shapes != ((2, 6), (4, 2)):
        fail(f"{what}.lora_A has shape {shapes[0]} and lora_B {shapes[1]}, expected (2, 6) and (4, 2)",
             "lora_A maps d_in to the rank, (rank, d_in); lora_B maps the rank to d_out, (d_out, rank)")
    if not torch.equal(base.weight.detach(), weight):
        fail(f"{what} changes the base's weight", "leave the pretrained weight as it is: the update is added beside it")
    if base.weight.requires_grad:
        fail(f"{what} leaves the base weight trainable (requires_grad is True): it is not frozen",
             "freeze it with base.weight.requires_grad_(False): only lora_A and lora_B train, which is the point of "
             "LoRA (no gradient and no optimizer state for the big matrix)")
    frozen = [name for name in ("lora_A", "lora_B") if not params[name].requires_grad]
    if frozen:
        fail(f"{what}.{frozen[0]} does not require a gradient", "lora_A and lora_B are the parameters that train: "
             "leave them trainable (an nn.Parameter requires a gradient)")
    scaling = getattr(layer, "scaling", None)
    if not isinstance(scaling, (int, float)) or isinstance(scaling, bool):
        fail(f"{what}.scaling is {describe(scaling) if scaling is not None else 'missing'}, not a number",
             "store scaling = alpha / rank as a float, for forward and merge")
    _check_scaling(float(scaling), rank=2, alpha=4.0, what=what)
    if getattr(layer, "merged", None) is not False:
        fail(f"a new {_NAME}'s merged is {getattr(layer, 'merged', 'missing')!r}, not False",
             "set self.merged = False in __init__: the update starts outside the weight")
    A, B = params["lora_A"].detach(), params["lora_B"].detach()
    a_zero, b_zero = not A.any(), not B.any()
    if a_zero and not b_zero:
        fail("the initialisations of lora_A and lora_B are swapped: A starts at zero and B random",
             "A is drawn (so that A x carries the input) and B starts at zero (so that the layer starts as base)")
    if not b_zero:
        fail(f"{what}.lora_B does not start at zero, so the adapted model differs from the pretrained one before its "
             "first step", "start B at zero: B A is then zero and the layer is exactly base at step 0")
    if a_zero:
        fail(f"{what}.lora_A starts at zero as well as lora_B: then B's gradient (which goes through A x) is zero "
             "too, and nothing ever trains", f"draw A: {_RECIPE}")


def _check_scaling(scaling: float, rank: int, alpha: float, what: str) -> None:
    right = alpha / rank
    if math.isclose(scaling, right, rel_tol=1e-9):
        return
    if math.isclose(scaling, alpha, rel_tol=1e-9):
        fail("the update is scaled by alpha, not alpha / rank", "scaling = alpha / rank, so that a change of rank "
             "does not change the update's size at the same learning rate", f"{what}.scaling is {scaling:g}")
    if math.isclose(scaling, rank / alpha, rel_tol=1e-9):
        fail("the update is scaled by rank / alpha, not alpha / rank", "scaling = alpha / rank: a larger alpha makes "
             "a larger update", f"{what}.scaling is {scaling:g}")
    fail(f"{what}.scaling is {scaling:g}, expected alpha / rank = {right:g}", "scaling = alpha / rank")


def _check_init(impl: type, linear: type[nn.Module]) -> None:
    """lora_A on a 2048 -> 64 layer of rank 64: mean 0, std 0.987 σ with σ = 1/sqrt(d_in), nothing beyond ±3σ."""
    d_in, d_out, rank = _A_INIT
    base = _base(linear, d_in, d_out)
    torch.manual_seed(1)
    a = construct(_NAME, impl, base, rank, 16.0).lora_A.detach().double().flatten()
    sigma = 1 / math.sqrt(d_in)
    size = f"{_NAME}(Linear({d_in}, {d_out}), rank={rank})"
    std, mean, top = a.std().item(), a.mean().item(), a.abs().max().item()
    evidence = (f"{size}: σ = 1 / sqrt({d_in}) = {sigma:.5f}; measured std {std:.5f} = {std / sigma:.3f} σ, "
                f"max |a| = {top / sigma:.2f} σ")
    if std == 0:
        fail(f"every entry of {size}.lora_A has the same value ({a[0].item():.3g})", f"draw them: {_RECIPE}")
    if abs(mean) > 5 * std / math.sqrt(a.numel()):
        fail(f"lora_A's initial entries are not centred at 0 (mean = {mean / sigma:+.3f} σ)",
             f"draw them from a normal with mean 0: {_RECIPE}", evidence)
    kurtosis = ((a - mean) / std).pow(4).mean().item()
    if kurtosis < 2.0:
        fail("lora_A's initial entries are spread evenly (uniform: kaiming_uniform_, nn.Linear's and PEFT's default, "
             "or torch.rand), not bell-shaped", f"this course draws A from a truncated normal: {_RECIPE}",
             f"{evidence}; kurtosis {kurtosis:.2f}, a normal cut at ±3σ has 2.83 and a uniform 1.8")
    ratio = std / sigma
    if top < 2.9 * sigma and abs(ratio / truncated_std(top / sigma) - 1) < 0.02:
        fail(f"lora_A's cut is too tight (its entries stop at ±{top / sigma:.2f} σ)", "truncate at a=-3 * σ, b=3 * σ",
             evidence)
    if not 0.95 <= ratio <= 1.03:
        for formula, remark, candidate in [
                ("1", "trunc_normal_'s default std", 1.0),
                ("1 / sqrt(rank)", "the rank is A's output size, not its input's", 1 / math.sqrt(rank)),
                ("sqrt(2 / (d_in + rank))", "the Linear recipe's σ; A's is 1 / sqrt(d_in)",
                 math.sqrt(2 / (d_in + rank))),
                ("sqrt(2 / d_in)", "He/Kaiming's, for ReLU networks", math.sqrt(2 / d_in)),
                ("1 / d_in", "the variance passed as std", 1 / d_in)]:
            low = 0.85 if candidate == 1.0 else 0.93  # std 1 with the default cut ±2 measures 0.88
            if low <= std / candidate <= 1.03:
                fail(f"lora_A's initial std is {formula} ({remark}), not σ = 1 / sqrt(d_in)", f"use {_RECIPE}",
                     evidence)
        fail(f"lora_A's initial std is {ratio:.3f} σ, expected 0.987 σ (σ = 1 / sqrt(d_in), cut at ±3σ)",
             f"use {_RECIPE}", evidence)
    beyond = int((a.abs() > 3 * sigma * (1 + 1e-3)).sum())
    if beyond:
        fail(f"{beyond:,} of {a.numel():,} initial entries of lora_A lie beyond ±3σ, so nothing was truncated "
             "(normal_ cuts nothing, and trunc_normal_'s default cut a=-2, b=2 is in weight units: "
             f"±{2 / sigma:.0f}σ here)",
             "pass the cut explicitly: a=-3 * σ, b=3 * σ", evidence)
    if abs(ratio - TRUNCATED_STD) > 0.008:
        fail(f"lora_A's initial std is {ratio:.3f} σ, expected 0.987 σ (N(0, σ²) cut at ±3σ)", f"use {_RECIPE}",
             evidence)


def _check_device_and_dtype(impl: type, linear: type[nn.Module]) -> None:
    """lora_A and lora_B made where the base's weight is (checked on the meta device: no GPU needed) and in its
    dtype."""
    fix = "create lora_A and lora_B like the base's weight: device=base.weight.device, dtype=base.weight.dtype"
    for what, kwargs, wanted in [(f"{_NAME} on a float64 base", dict(dtype=torch.float64), "dtype"),
                                 (f"{_NAME} on a base on the meta device", dict(device="meta"), "device")]:
        base = construct("Linear", linear, 6, 4, **kwargs)
        layer = construct(_NAME, impl, base, 2, 4.0)
        for name in ("lora_A", "lora_B"):
            made = getattr(getattr(layer, name), wanted)
            if made != getattr(base.weight, wanted):
                fail(f"{what} makes {name} {'in' if wanted == 'dtype' else 'on'} {made}, not its base's "
                     f"{getattr(base.weight, wanted)}", fix)


def _forward_variants(x: torch.Tensor, W: torch.Tensor, A: torch.Tensor, B: torch.Tensor, rank: int, alpha: float
                      ) -> tuple[torch.Tensor, list[tuple[Any, str, str]]]:
    """The right output (in x's dtype, computed in float64) and the classic wrong ones."""
    xd, Wd, Ad, Bd = x.double(), W.double(), A.double(), B.double()
    base, update = xd @ Wd.T, (xd @ Ad.T) @ Bd.T
    out = lambda t: t.to(x.dtype)  # noqa: E731
    return out(base + alpha / rank * update), [
        (lambda: out(base + alpha * update), "the update is scaled by alpha, not alpha / rank",
         "scaling = alpha / rank, so that a change of rank does not change the update's size"),
        (lambda: out(base + rank / alpha * update), "the update is scaled by rank / alpha, not alpha / rank",
         "scaling = alpha / rank: a larger alpha makes a larger update"),
        (lambda: out(base + update), "the update is not scaled", "multiply B A x by scaling = alpha / rank"),
        (lambda: out(base), "the update is not added: forward returns base(x) alone",
         "add scaling · B A x (your lora_delta) to base(x): that update is all that trains"),
        (lambda: out(alpha / rank * update), "the base's output is left out: forward returns the update alone",
         "the update is added to base(x), the pretrained layer's output"),
    ]


def _check_forward(impl: type, linear: type[nn.Module]) -> None:
    """Outputs against x Wᵀ + (alpha / rank) (x Aᵀ) Bᵀ: three sizes, several leading shapes, float32 and float64."""
    gen = generator(1)
    for d_in, d_out, rank, alpha, dtype in [(6, 4, 2, 5.0, torch.float32), (5, 7, 3, 6.0, torch.float64),
                                            (4, 4, 4, 2.0, torch.float64)]:
        base = _base(linear, d_in, d_out, dtype, gen)
        W = base.weight.detach().clone()
        layer = construct(_NAME, impl, base, rank, alpha)
        A, B = _set_factors(layer, gen)
        for leading in _LEADING:
            x = torch.randn(*leading, d_in, generator=gen, dtype=torch.float64).to(dtype)
            what = (f"{_NAME}(Linear({d_in}, {d_out}), rank={rank}, alpha={alpha:g})(x of shape {tuple(x.shape)}, "
                    f"{dtype})")
            y = expect_tensor(what, call(what, layer, x), returns="return base(x) plus the scaled update, a tensor")
            expected, variants = _forward_variants(x, W, A, B, rank, alpha)
            tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
            diagnose(what, y, expected, variants, "y = base(x) + (alpha / rank) · B A x for every vector along the "
                     "last dimension", **tolerance)


def _check_gradients(impl: type, linear: type[nn.Module]) -> None:
    """lora_A.grad, lora_B.grad and x.grad against autograd through the formula (float64); none for the base."""
    gen = generator(2)
    base = _base(linear, 5, 3, torch.float64, gen)
    W = base.weight.detach().clone()
    layer = construct(_NAME, impl, base, 2, 3.0)
    A, B = _set_factors(layer, gen)
    x = torch.randn(2, 4, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(2, 4, 3, generator=gen, dtype=torch.float64)
    what = f"{_NAME}(Linear(5, 3), rank=2, alpha=3)(x of shape (2, 4, 5))"
    y = expect_tensor(what, call(what, layer, x), returns="return base(x) plus the scaled update, a tensor")
    check_gradients(_NAME, what, y, x, upstream, lambda x, w: x @ W.T + 1.5 * (x @ w["A"].T) @ w["B"].T,
                    {"A": A, "B": B},
                    {"A": ("LoRALinear.lora_A", layer.lora_A), "B": ("LoRALinear.lora_B", layer.lora_B)},
                    source="x, the base and lora_A, lora_B", unit="parameter")
    if base.weight.grad is not None:
        fail(f"a gradient reaches the base weight through {what}", "freeze it: base.weight.requires_grad_(False)")


def _check_merge(impl: type, linear: type[nn.Module]) -> None:
    """merge(): the weight W + (alpha / rank) B A, the same outputs, merged True, a second merge refused; unmerge():
    the weight back, merged False, a second unmerge refused."""
    gen = generator(3)
    rank, alpha = 2, 3.0
    base = _base(linear, 5, 4, torch.float64, gen)
    W = base.weight.detach().clone()
    layer = construct(_NAME, impl, base, rank, alpha)
    A, B = _set_factors(layer, gen)
    x = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    before = _output(layer, x, "before merge()")
    call(f"{_NAME}.merge()", layer.merge)
    if getattr(layer, "merged", None) is not True:
        fail(f"after merge(), {_NAME}.merged is {getattr(layer, 'merged', 'missing')!r}, not True",
             "set self.merged = True in merge(): forward and a second merge() read it")
    merged = base.weight.detach()
    update = B @ A
    if close(merged, W, rtol=1e-12, atol=1e-12):
        fail("merge() leaves the base weight as it was", "add (alpha / rank) · B A to base.weight in place (under "
             "torch.no_grad()), so that one matmul gives the adapted output")
    if close(merged, W + update, rtol=1e-10, atol=1e-10):
        fail("merge() adds B A to the weight without the scaling", "fold in exactly what forward adds: "
             "(alpha / rank) · B A")
    if not close(merged, W + alpha / rank * update, rtol=1e-10, atol=1e-10):
        fail("merge() does not give base.weight + (alpha / rank) · B A", "add scaling · (lora_B @ lora_A), a "
             "(d_out, d_in) matrix, to base.weight in place")
    after = _output(layer, x, "after merge()")
    if not close(after, before, rtol=1e-10, atol=1e-10):
        if close(after, before + alpha / rank * (x @ A.T) @ B.T, rtol=1e-10, atol=1e-10):
            fail("forward still adds the update after merge(), so it counts twice",
                 "when merged is True the weight already holds the update: return base(x) alone")
        fail("the output after merge() differs from the output before it", "merging changes how the layer computes, "
             "not what: when merged, forward is base(x) alone")
    refuses(f"{_NAME}.merge() on a merged layer", layer.merge, RuntimeError,
            "a second merge would add the update to the weight twice",
            "raise RuntimeError in merge() when merged is already True", shown=lambda _: "normally")
    call(f"{_NAME}.unmerge()", layer.unmerge)
    if not close(base.weight.detach(), W, rtol=1e-10, atol=1e-10):
        fail("unmerge() does not restore the base weight", "subtract exactly what merge() added, (alpha / rank) · B A")
    if getattr(layer, "merged", None) is not False:
        fail(f"after unmerge(), {_NAME}.merged is {getattr(layer, 'merged', 'missing')!r}, not False",
             "set self.merged = False in unmerge()")
    if not close(_output(layer, x, "after unmerge()"), before, rtol=1e-10, atol=1e-10):
        fail("the output after unmerge() differs from the output before merge()", "once unmerged, forward adds the "
             "update to base(x) again")
    refuses(f"{_NAME}.unmerge() on a layer that is not merged", layer.unmerge, RuntimeError,
            "it would take out an update that the weight does not hold",
            "raise RuntimeError in unmerge() when merged is False", shown=lambda _: "normally")


def _output(layer: nn.Module, x: torch.Tensor, when: str) -> torch.Tensor:
    what = f"{_NAME}(Linear(5, 4), rank=2, alpha=3)(x) {when}"
    with torch.no_grad():
        return expect_tensor(what, call(what, layer, x), returns="return base(x) plus the scaled update, a tensor")


def check_lora_linear(impl: type) -> None:
    """Check the learner's ``LoRALinear(base, rank, alpha)``; print one line if it is right, else raise
    ``AssertionError``.

    Checked: the signature; the parameters, the base's weight itself (not a copy), frozen and unchanged, and lora_A
    (rank, d_in), lora_B (d_out, rank); scaling = alpha / rank; merged False; lora_B zero and lora_A, measured on a
    2048 -> 64 layer of rank 64, N(0, 1/d_in) cut at ±3σ (std 0.987 σ); lora_A and lora_B made on the base's device
    and in its dtype; outputs equal x Wᵀ + (alpha / rank)(x Aᵀ)Bᵀ for three sizes, leading shapes (2, 3), (),
    (1, 4, 2), float32 and float64; the gradients of lora_A, lora_B and x (none for the base); merge() folds
    (alpha / rank) B A into the base weight, keeps the outputs and sets merged, a second merge raises RuntimeError;
    unmerge() restores the weight. The base it builds is the Linear the learner's code sees. The caller's random state
    is left as it was.

    Mistakes it recognises (by name, in the first line of the error): lora_B random at the start (the model moves
    before its first step); lora_A zero (nothing trains: B's gradient is zero too); the two initialisations swapped;
    lora_A's std or cut wrong (std 1, 1/sqrt(rank), the Linear recipe's, He's, no cut, a uniform draw); the scaling
    alpha or rank / alpha instead of alpha / rank, or missing; the base not frozen; the base's weight copied (a new
    tensor); lora_A, lora_B stored transposed; the update not added, or the base left out; merge() without the scaling;
    a second merge() allowed; forward still adding the update after merge() (counted twice); unmerge() not restoring
    the weight; no gradient reaching lora_A or lora_B; device or dtype not the base's.
    """
    refuse_instance(impl, "check_lora_linear")
    check_signature(impl, ["base", "rank", "alpha"], _NAME)
    linear = learners_linear(impl)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        _check_structure(impl, linear)
        _check_init(impl, linear)
        _check_device_and_dtype(impl, linear)
        _check_forward(impl, linear)
        _check_gradients(impl, linear)
        _check_merge(impl, linear)
    passed("check_lora_linear: the base frozen and shared, A N(0, 1/d_in) cut at ±3σ and B zero, scaling alpha / rank; "
           "x Wᵀ + scaling · B A x (3 sizes, 3 leading shapes, float32/64); gradients to A and B only; merge/unmerge")


# ------------------------------------------------------------------------------------------------- apply_lora

_TARGETS = ("q_proj", "v_proj")
_RANK, _ALPHA = 2, 4.0
_IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]]) % LM_V


def _lm(linear: type[nn.Module]) -> nn.Module:
    """The checks' small TransformerLM (float64), its Linears the learner's Linear class when that is another."""
    model = small_lm(torch.float64)
    if linear is CourseLinear:
        return model
    for path, module in list(model.named_modules()):
        if isinstance(module, CourseLinear):
            mine = construct("Linear", linear, module.in_features, module.out_features, dtype=torch.float64)
            with torch.no_grad():
                mine.weight.copy_(module.weight)
            parent, _, name = path.rpartition(".")
            setattr(model.get_submodule(parent), name, mine)
    return model


def _logits(model: nn.Module, what: str) -> torch.Tensor:
    with torch.no_grad():
        return expect_tensor(what, call(what, model, _IDS.clone()), returns="the model returns its logits")


def _adapters(model: nn.Module, originals: dict[str, nn.Module]) -> dict[str, nn.Module]:
    """The modules that the model now calls where its Linears were, when they are adapters (lora_A and lora_B)."""
    found = {}
    for path, original in originals.items():
        module = model.get_submodule(path)
        if module is not original and hasattr(module, "lora_A") and hasattr(module, "lora_B"):
            found[path] = module
    return found


def check_apply_lora(apply_lora: Callable[..., Any]) -> None:
    """Check the learner's ``apply_lora(model, targets, rank, alpha)`` on a small random TransformerLM (2 layers).

    Checked: with targets ("q_proj", "v_proj"), rank 2 and alpha 4, exactly those four Linears are replaced, in the
    model, by adapters of rank 2; every other parameter is frozen and every lora_A and lora_B trainable; it returns
    {path: adapter} in the model's order; the logits are unchanged at the start; with random B, they equal those of
    the same model whose targets' weights have (alpha / rank) · B A added; the targets ("proj",) and
    ("q_proj", "query") raise ValueError. The model's Linears are the Linear the learner's code sees.

    Mistakes it recognises: the adapters not put into the model in place (a new local name, or setattr with a dotted
    path: the model's forward is unchanged); Linears that are not targets wrapped (lm_head, every Linear); a target
    left unwrapped; targets matched as substrings or suffixes of the path ("proj" wrapping every projection); a
    parameter left trainable outside the adapters (the model not frozen); the adapters frozen too (frozen after
    wrapping); rank and alpha passed in the wrong order; nothing returned, or not the {path: adapter} dict; no error
    for an unknown target.
    """
    check_signature(apply_lora, ["model", "targets", "rank", "alpha"], "apply_lora")
    linear = learners_linear(apply_lora)
    with torch.random.fork_rng(devices=[]):
        _check_applied(apply_lora, linear)
        _check_unknown_targets(apply_lora, linear)
    passed("check_apply_lora: q_proj and v_proj wrapped in place (and nothing else), only the adapters trainable, "
           "{path: adapter} returned, logits as merged by hand; unknown and partial names refused")


def _check_applied(apply_lora: Callable[..., Any], linear: type[nn.Module]) -> None:
    model = _lm(linear)
    reference = copy.deepcopy(model)
    originals = {path: m for path, m in model.named_modules() if isinstance(m, linear)}
    before = _logits(model, "the small TransformerLM on two sequences")
    what = f"apply_lora(model, {_TARGETS}, rank={_RANK}, alpha={_ALPHA:g})"
    out = call(what, apply_lora, model, _TARGETS, rank=_RANK, alpha=_ALPHA)
    expected = [path for path in originals if path.rsplit(".", 1)[-1] in _TARGETS]
    adapters = _adapters(model, originals)
    if not adapters:
        fail(f"{what} does not replace the Linears in place: the model still calls its original "
             f"{' and '.join(_TARGETS)}", "set each adapter on the module that holds the Linear: "
             "setattr(parent, the last part of the path, adapter), with parent = model.get_submodule(the path "
             "before it); a new local name, or setattr(model, 'layers.0.attn.q_proj', …), leaves the model as it was")
    extra = [path for path in adapters if path not in expected]
    if extra:
        fail(f"{what} wraps Linears that are not in targets ({', '.join(extra[:3])}{', …' if len(extra) > 3 else ''})",
             "wrap only the Linears whose own name, the last part of the path, is in targets: the rest of the model "
             "stays as it was")
    missing = [path for path in expected if path not in adapters]
    if missing:
        fail(f"{what} leaves {missing[0]} as it was", "wrap every Linear whose name is in targets, in every block")
    for path, adapter in adapters.items():
        shape = tuple(getattr(adapter.lora_A, "shape", ()))
        if shape[:1] != (_RANK,):
            fail(f"{what}: the adapter of {path} has lora_A of shape {shape}, not rank {_RANK}",
                 "pass rank and alpha on in LoRALinear's order: LoRALinear(linear, rank, alpha)")
    lora = {f"{path}.{name}" for path in adapters for name in ("lora_A", "lora_B")}
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    frozen = sorted(lora - set(trainable))
    if frozen:
        fail(f"{what}: the adapters are frozen too ({frozen[0]} does not require a gradient), so nothing would train",
             "freeze the model's parameters first, then wrap: the new lora_A and lora_B are then the only trainable "
             "ones")
    others = [name for name in trainable if name not in lora]
    if others:
        fail(f"{what}: {others[0]} is still trainable ({len(others)} parameters outside the adapters are)",
             "freeze every parameter of the model (requires_grad_(False)) before wrapping: only the adapters may "
             "train, so the optimizer keeps no state for the rest")
    if out is None:
        fail(f"{what} returns None, not the adapters", "return {path: adapter} for the Linears it replaced, in the "
             "model's order: the training loop optimises their parameters")
    if not isinstance(out, dict):
        fail(f"{what} returned {describe(out)}, not a dict", "return {path: adapter} for the Linears it replaced")
    if list(out) != expected:
        fail(f"{what} returned a dict with the keys {list(out)[:4]}, expected the adapters' paths {expected}",
             "key each adapter by its path in the model (named_modules' name), in the model's order")
    if any(out[path] is not adapters[path] for path in expected):
        fail(f"{what} returned other modules than the adapters the model calls", "return the adapters that are now "
             "in the model, the very modules")
    after = _logits(model, f"the model after {what}")
    if not close(after, before, rtol=1e-10, atol=1e-10):
        fail(f"the model's logits change when {what} puts the adapters in", "an adapter starts as its base (lora_B "
             "zero): check_lora_linear(LoRALinear) says what is wrong with it")
    gen = generator(6)
    with torch.no_grad():
        for path in expected:
            A, B = _set_factors(adapters[path], gen)
            reference.get_submodule(path).weight.add_(_ALPHA / _RANK * (B @ A))
    want = _logits(reference, "the small TransformerLM with the update merged by hand")
    got = _logits(model, f"the model after {what}, with random lora_B")
    if not close(got, want, rtol=1e-9, atol=1e-9):
        fail(f"the model after {what} differs from the same model with (alpha / rank) · B A added to the targets' "
             "weights", "each target must be the adapter of the model's own Linear, built with rank and alpha: "
             "check_lora_linear(LoRALinear) says whether the adapter itself is right")


def _check_unknown_targets(apply_lora: Callable[..., Any], linear: type[nn.Module]) -> None:
    model = _lm(linear)
    originals = {path: m for path, m in model.named_modules() if isinstance(m, linear)}
    what = f"apply_lora(model, ('proj',), rank={_RANK}, alpha={_ALPHA:g})"
    out, error = attempt(what, apply_lora, model, ("proj",), rank=_RANK, alpha=_ALPHA)
    if error is None:
        wrapped = list(_adapters(model, originals))
        if wrapped:
            fail(f"apply_lora matches targets as substrings: {what} wrapped {wrapped[0]} and {len(wrapped) - 1} more",
                 "compare each Linear's own name, the last part of its path, with the targets exactly: no Linear is "
                 "called 'proj', so it must raise ValueError")
        fail(f"{what} returned normally: there is no error for an unknown target, so a misspelt name would fine-tune "
             "nothing", "raise ValueError naming each target that no Linear of the model is called")
    if not isinstance(error, ValueError):
        fail(f"{what} raised {type(error).__name__} ({first_line(error)}), not ValueError",
             "raise ValueError naming each target that no Linear of the model is called")
    model = _lm(linear)
    refuses(f"apply_lora(model, ('q_proj', 'query'), rank={_RANK}, alpha={_ALPHA:g})",
            lambda: apply_lora(model, ("q_proj", "query"), rank=_RANK, alpha=_ALPHA), ValueError,
            "there is no error for an unknown target, so a misspelt name would fine-tune nothing",
            "raise ValueError naming each target that no Linear of the model is called", shown=lambda _: "normally")

"""The checks of notebook 11 (training): ``check_cross_entropy``, ``check_adamw``, ``check_lr_cosine_schedule``,
``check_gradient_clipping``, ``check_get_batch`` and ``check_checkpoint``.

Each compares the learner's function or class with a reference built here from PyTorch's own (``F.cross_entropy``,
``torch.optim.AdamW``'s algorithm, ``torch.nn.utils.clip_grad_norm_``) or from the formula, and, when they differ,
computes the classic mistakes one by one and names the first the learner's result matches. The references that the
step checks of the notebook share (AdamW's update, the schedule's mistakes) live here too.
"""

from __future__ import annotations

import copy
import inspect
import io
import math
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ._harness import (call, call_without_builtins, check_signature, close, crash_of, describe, diagnose, expect_tensor,
                       fail, generator, passed)

HALF = (torch.float16, torch.bfloat16)

# ---------------------------------------------------------------------------------------------------- cross-entropy

# The built-ins a hand-written cross-entropy must not call (aliases are the same functions, so they are seen too).
CROSS_ENTROPY_BUILTINS = {
    F.cross_entropy: "F.cross_entropy", torch._C._nn.cross_entropy_loss: "F.cross_entropy", F.nll_loss: "F.nll_loss",
    F.log_softmax: "F.log_softmax", torch.log_softmax: "torch.log_softmax", torch.Tensor.log_softmax: "x.log_softmax",
    torch.special.log_softmax: "torch.special.log_softmax", torch.logsumexp: "torch.logsumexp",
    torch.Tensor.logsumexp: "x.logsumexp", torch.special.logsumexp: "torch.special.logsumexp",
}
CROSS_ENTROPY_BUILTIN_FIX = ("compute it yourself from the logits: a max, torch.exp, a sum and torch.log "
                             "(the built-in is only the checks' reference)")


def cross_entropy_variants(z: torch.Tensor, y: torch.Tensor,
                           leading: tuple[int, ...] = ()) -> list[tuple[Any, str, str]]:
    """The classic wrong cross-entropies of logits ``z`` (N, V) and targets ``y`` (N,), as ``diagnose`` variants;
    with ``leading`` (the shape the N examples came in, e.g. (batch, seq)), the means over one axis only too."""
    rows = torch.arange(len(y))
    lse = torch.logsumexp(z, dim=-1)
    largest = z.max(dim=-1).values
    losses = (lse - z[rows, y]).reshape(leading or y.shape)
    return [
        (lambda: (lse - z[rows, y]).sum(), "it returns the sum over the examples, not their mean",
         "divide by the number of examples (.mean() of the per-example losses)"),
        *([(lambda: losses.sum(-1).mean(), f"it averages over the batch axis only: the mean over the {leading[0]} "
            f"sequences of each one's sum over its {leading[-1]} positions",
            "the loss is the mean over every example of all leading axes: every position of every sequence counts "
            "once, so divide the total by batch × seq")] if len(leading) > 1 else []),
        (lambda: (z[rows, y] - lse).mean(), "its sign is flipped: it returns the mean log-probability, not the loss",
         "the loss is −log p = log Σ exp(z) − z[target], a positive number"),
        (lambda: lse.mean() - z[:, y].mean(), "it picks the wrong logits: z[:, targets] takes every row's logits at "
         "every target (an N × N block)", "each example needs one logit, its own row's at its own target: index the "
         "rows and the targets together (or gather along the last dimension)"),
        (lambda: (lse - largest - z[rows, y]).mean(), "it subtracts the max inside the exp but never adds it back",
         "log Σ exp(z) = m + log Σ exp(z − m): add m back (or subtract it from the target's logit too)"),
        (lambda: (lse - z[rows, y]).mean() / math.log(2), "it uses log base 2 (bits), not the natural log",
         "use torch.log: the loss is in nats, and ln V is the uniform baseline"),
        (lambda: (lse - z[rows, y]).mean() / z.shape[-1], "it divides by the vocabulary size as well",
         "average over the examples only"),
    ]


def _ce_reference(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """F.cross_entropy of the flattened logits, in at least float32."""
    z = z.detach().to(torch.promote_types(z.dtype, torch.float32))
    return F.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1))


def _ce_call(impl: Callable[..., Any], z: torch.Tensor, y: torch.Tensor, what: str) -> torch.Tensor:
    out = call_without_builtins(what, CROSS_ENTROPY_BUILTINS, CROSS_ENTROPY_BUILTIN_FIX, impl, z, y)
    if isinstance(out, (float, int)):
        fail(f"{what} returned a Python {type(out).__name__}, not a tensor (so no gradient can flow back)",
             "return the 0-d tensor itself: no .item() or float()")
    if isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(y.shape) and y.ndim > 0:
        fail(f"{what} returned one loss per example (shape {tuple(out.shape)}), not their mean",
             "average them: the loss is one number, a 0-d tensor")
    if isinstance(out, torch.Tensor) and y.ndim > 1 and tuple(out.shape) in (tuple(y.shape[1:]), tuple(y.shape[:-1])):
        fail(f"{what} returned shape {tuple(out.shape)}: the mean runs over one axis only of the targets' "
             f"{tuple(y.shape)}", "the loss is the mean over every example of all leading axes: one number, a 0-d "
             "tensor")
    return expect_tensor(what, out, (), "return the mean over every example: a 0-d tensor")


def _ce_ordinary(impl: Callable[..., Any]) -> None:
    """(N, V) and (batch, seq, V) logits in float64 and float32, against F.cross_entropy, with the mistakes named."""
    gen = generator(0)
    for shape, dtype in [((6, 5), torch.float64), ((4, 11), torch.float32), ((2, 3, 7), torch.float64)]:
        z = (2 * torch.randn(*shape, generator=gen, dtype=torch.float64)).to(dtype)
        y = torch.randint(shape[-1], shape[:-1], generator=gen)
        what = f"cross_entropy(logits of shape {shape}, {dtype})"
        try:
            out = _ce_call(impl, z, y, what)
        except AssertionError as error:
            cause = crash_of(error)
            if len(shape) == 3 and cause is not None:
                raise AssertionError(f"{what} crashes ({type(cause).__name__}), though (N, vocab) logits work: it "
                                     "does not handle leading dimensions: every position of every sequence is one "
                                     "example, so treat all the leading axes as one axis of examples.") from cause
            raise
        if out.dtype != dtype:
            fail(f"{what} returned {out.dtype}", "compute in the logits' dtype (float32 and float64 stay as they are)")
        flat_z, flat_y = z.reshape(-1, shape[-1]).double(), y.reshape(-1)
        diagnose(what, out.double(), _ce_reference(z, y).double(), cross_entropy_variants(flat_z, flat_y, shape[:-1]),
                 "the loss is the mean over the examples of log Σ_j exp(z_j) − z[target]",
                 rtol=1e-5 if dtype == torch.float32 else 1e-10, atol=1e-6 if dtype == torch.float32 else 1e-12)


def _ce_extreme(impl: Callable[..., Any]) -> None:
    """Logits near +1000 and -1000: the max must be subtracted, and the loss computed from the logits, not from p."""
    gen = generator(1)
    base = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    y = torch.tensor([0, 3, 5, 1])
    far = torch.full_like(base, 1000.0)
    far[torch.arange(4), y] = -1000.0  # every target 2000 below the rest: p = exp(-2000) underflows to 0
    cases = {"near +1000": base + 1000, "near -1000": base - 1000, "with targets 2000 below the rest": far}
    outs = {name: _ce_call(impl, z, y, f"cross_entropy(logits {name})") for name, z in cases.items()}
    for name in ("near +1000", "near -1000"):
        if not torch.isfinite(outs[name]):
            fail(f"cross_entropy(logits {name}) returned {outs[name].item()}: there is no max subtraction, so "
                 f"exp({name[-5:]}) {'overflows to inf' if '+' in name else 'underflows to 0'}",
                 "subtract each row's max before the exp: log Σ exp(z) = m + log Σ exp(z − m)")
    name = "with targets 2000 below the rest"
    if not torch.isfinite(outs[name]):
        fail(f"cross_entropy(logits {name}) returned {outs[name].item()}: it takes the log of the softmax's "
             "probabilities, and exp(−2000) underflows to 0, whose log is −inf",
             "compute log p from the logits: z[target] − (m + log Σ exp(z − m)), never log(softmax(z))")
    for name, z in cases.items():
        diagnose(f"cross_entropy(logits {name})", outs[name].double(), _ce_reference(z, y),
                 cross_entropy_variants(z, y), "compute the loss from the logits with the max subtracted",
                 rtol=1e-10, atol=1e-9)


def _ce_half(impl: Callable[..., Any]) -> None:
    """float16 and bfloat16 logits: computed in float32, and the loss returned in float32."""
    gen = generator(2)
    for dtype in HALF:
        z = (8 * torch.randn(16, 500, generator=gen) + 30).to(dtype)
        y = torch.randint(500, (16,), generator=gen)
        what = f"cross_entropy({dtype} logits)"
        out = _ce_call(impl, z, y, what)
        expected = _ce_reference(z, y)
        if not torch.isfinite(out):
            fail(f"{what} returned {out.item()}: {dtype} is not upcast, and its exp overflows (float16 stops at "
                 "65,504, e^11.1)", "upcast the logits to float32 first, inputs.float(), and return that float32 loss")
        if out.dtype in HALF:
            fail(f"{what} returned {out.dtype}: half-precision logits are not upcast, so the loss keeps only "
                 f"{'3' if out.dtype == torch.float16 else '2'} significant digits",
                 "compute in float32 (inputs.float() first) and return that float32 loss")
        if not close(out, expected, rtol=1e-4, atol=1e-4):
            fail(f"{what} is off by {abs(out.double().item() - expected.double().item()):.3g}: it is computed in "
                 f"{dtype} and converted only at the end", "upcast the logits to float32 first (inputs.float())")


def _ce_gradients(impl: Callable[..., Any]) -> None:
    """The gradient with respect to the logits equals F.cross_entropy's (softmax − one-hot, over N)."""
    gen = generator(3)
    z = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randint(5, (2, 3), generator=gen)
    out = _ce_call(impl, z, y, "cross_entropy(logits of shape (2, 3, 5))")
    if not out.requires_grad:
        fail("cross_entropy's loss carries no gradient (computed under torch.no_grad(), or from .detach()/.item())",
             "compute it from the logits with torch operations, so that autograd can follow")
    call("the backward pass of cross_entropy", out.backward)
    reference = z.detach().clone().requires_grad_()
    F.cross_entropy(reference.reshape(-1, 5), y.reshape(-1)).backward()
    if z.grad is None or not close(z.grad, reference.grad, rtol=1e-8, atol=1e-10):
        fail("the gradient of cross_entropy with respect to the logits differs from F.cross_entropy's",
             "build the loss from differentiable torch operations only (no .item(), .detach() or in-place changes)")


def check_cross_entropy(impl: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Check the learner's ``cross_entropy(inputs, targets)`` against ``F.cross_entropy``.

    Checked: the signature; (N, vocab) and (batch, seq, vocab) logits in float32 and float64; a 0-d tensor, the mean
    over every example; logits near +1000 and -1000 and targets 2000 below the rest (finite and exact); float16 and
    bfloat16 logits computed and returned in float32; the gradient; no built-in cross-entropy, log-softmax or
    logsumexp inside. Inputs from a fixed seed; torch's random state is left as it was.

    Mistakes it recognises (by name, in the first line of the error): no max subtraction (inf or NaN at ±1000); the
    log of the softmax's probabilities (−inf when one underflows); the sum instead of the mean; one loss per example
    returned; the sign flipped; z[:, targets] instead of one logit per row; the max subtracted and never added back;
    log base 2; divided by the vocabulary size too; leading dimensions not flattened; the mean over the batch axis
    only (of the sums over the positions), or over one axis (a loss per position or per sequence returned);
    float16/bfloat16 not upcast (returned in half precision, or computed in it); a Python float returned; no gradient;
    a built-in used.
    """
    check_signature(impl, ["inputs", "targets"], "cross_entropy")
    with torch.random.fork_rng(devices=[]):
        _ce_ordinary(impl)
        _ce_extreme(impl)
        _ce_half(impl)
        _ce_gradients(impl)
    passed("check_cross_entropy: matches F.cross_entropy on (N, vocab) and (batch, seq, vocab) logits in "
           "float32/64, at ±1000 and 2000 apart, float16/bfloat16 in float32; the mean; gradients; no built-in")


# ------------------------------------------------------------------------------------------------------------ AdamW

ADAMW_MISTAKES = {
    "adam_l2": ("weight decay is added to the gradient (Adam with L2 regularisation), so it goes through m and v",
                "decouple it: θ ← θ − α·λ·θ on its own, and leave the gradient as it is for m and v"),
    "no_bias_correction": ("there is no bias correction: the step uses α, not α_t = α·√(1 − β2^t) / (1 − β1^t)",
                           "scale the step by α_t, with t the step number counted from 1"),
    "no_v_hat": ("v is not bias-corrected: m is divided by 1 − β1^t, but v is used as it is, not v̂ = v / (1 − β2^t)",
                 "v starts at 0 too, so it needs its own correction: divide v by 1 − β2^t (in the handout's α_t, "
                 "the factor √(1 − β2^t))"),
    "t_from_0": ("the bias correction counts the steps from 0 (t − 1 in 1 − β^t), so the first step divides by zero",
                 "count from 1: increment the step number before using it"),
    "eps_inside_sqrt": ("ε is inside the square root (√(v + ε)), not added to it",
                        "divide by √v + ε: the root of v first, then add ε"),
    "decay_with_alpha_t": ("the weight decay uses the bias-corrected α_t instead of α",
                           "decay with the learning rate itself: θ ← θ − α·λ·θ"),
    "no_decay": ("weight_decay is ignored: the parameters do not decay",
                 "apply θ ← θ − α·λ·θ at every step (λ = the group's weight_decay)"),
    "betas_swapped": ("β1 and β2 are swapped: m uses β2 and v uses β1",
                      "m ← β1·m + (1 − β1)·g and v ← β2·v + (1 − β2)·g²"),
    "no_sqrt": ("the update divides by v + ε, not by √v + ε", "take the square root of v: v estimates g², not |g|"),
    "v_not_squared": ("v averages g, not g²", "v is the moving average of the squared gradient, elementwise"),
    "moments_not_kept": ("m and v are not kept from one step to the next: each step starts them from 0 again (new "
                         "tensors bound to a name, m = …, while self.state keeps the old ones)",
                         "the moments are running averages over all the steps: update the tensors held in "
                         "self.state[p] in place, or store the new ones back into it"),
}
# What a step that matches no named mistake is told: the parts of AdamW's maths to compare, in words.
ADAMW_UNNAMED_FIX = ("compare each part of your step with AdamW's maths: m and v, the moving averages of g and g²; "
                     "their bias correction by 1 − β^t, t counted from 1; the step α·m̂ / (√v̂ + ε); the decay "
                     "α·λ·θ, taken from θ on its own")


def name_adamw_mistake(follows: Callable[[str], bool], first_step: list[torch.Tensor], evidence: str) -> None:
    """Fail with the first ADAMW_MISTAKES entry whose trajectory the learner's ``follows`` (one rule for the step check
    and the optimizer's check); NaN or inf after the first step (``first_step``) is the step counted from 0."""
    for mistake, (text, fix) in ADAMW_MISTAKES.items():
        if follows(mistake):
            fail(text, fix, f"{evidence}: yours follows that mistake")
    if any(not torch.isfinite(t).all() for t in first_step):
        fail(*ADAMW_MISTAKES["t_from_0"], f"{evidence}: NaN or inf after the first step")


def first_divergence(mine: list[list[torch.Tensor]], forms: list[list[list[torch.Tensor]]], rtol: float,
                     atol: float) -> tuple[int, float]:
    """The step (from 1) where ``mine`` leaves the right form it follows longest, and by how much it differs there."""
    def first(reference: list[list[torch.Tensor]]) -> int:
        return next((k for k, (a, b) in enumerate(zip(mine, reference))
                     if not all(close(x, y, rtol=rtol, atol=atol) for x, y in zip(a, b))), len(mine))
    k, reference = max(((first(r), r) for r in forms), key=lambda pair: pair[0])
    k = min(k, len(mine) - 1)
    worst = max((a.detach().double() - b.double()).abs().max().item() for a, b in zip(mine[k], reference[k]))
    return k + 1, worst


def adamw_step(theta: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, t: int, lr: float,
               betas: tuple[float, float], eps: float, weight_decay: float, *, decay_first: bool = True,
               torch_eps: bool = False, mistake: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One AdamW step on one tensor (new tensors; the inputs are left alone), right or with a named ``mistake``.

    Four forms are right; they differ only in the last bits, or where a gradient is as small as ε: the decay applied
    to θ before the Adam step (PyTorch's order; ``decay_first``) or after it (the handout's), and the step
    α_t·m / (√v + ε) (the handout's) or α·m̂ / (√v̂ + ε) with m̂ = m / (1 − β1^t), v̂ = v / (1 − β2^t) (PyTorch's
    and Adam's paper's; ``torch_eps``).
    """
    beta1, beta2 = (betas[1], betas[0]) if mistake == "betas_swapped" else betas
    if mistake == "moments_not_kept":
        m, v = torch.zeros_like(m), torch.zeros_like(v)
    g = grad + weight_decay * theta if mistake == "adam_l2" else grad
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * (g if mistake == "v_not_squared" else g * g)
    step = t - 1 if mistake == "t_from_0" else t
    bc1 = 1.0 if mistake == "no_bias_correction" else 1 - beta1**step
    bc2 = 1.0 if mistake in ("no_bias_correction", "no_v_hat") else 1 - beta2**step
    if bc1 == 0 or bc2 == 0:
        nan = torch.full_like(theta, float("nan"))
        return nan, m, v
    alpha_t = lr * math.sqrt(bc2) / bc1
    if torch_eps:  # PyTorch's (and Adam's paper's): α·m̂ / (√v̂ + ε) with m̂ = m / bc1, v̂ = v / bc2
        scale, second = lr / bc1, v / bc2
    else:  # the handout's: α_t·m / (√v + ε)
        scale, second = alpha_t, v
    denominator = {"no_sqrt": second + eps, "eps_inside_sqrt": torch.sqrt(second + eps)}.get(mistake)
    if denominator is None:
        denominator = torch.sqrt(second) + eps
    decay = (0.0 if mistake in ("adam_l2", "no_decay")
             else (alpha_t if mistake == "decay_with_alpha_t" else lr) * weight_decay)
    if decay_first:
        theta = theta * (1 - decay) - scale * m / denominator
    else:
        theta = theta - scale * m / denominator
        theta = theta - decay * theta
    return theta, m, v


def adamw_forms() -> list[dict[str, bool]]:
    """The right forms of AdamW's step (see adamw_step): decay before or after, ε as in the handout or in PyTorch."""
    return [dict(decay_first=d, torch_eps=e) for d in (True, False) for e in (False, True)]


class _Probe(nn.Module):
    """Parameters to optimise: a matrix, a vector, and one that never gets a gradient."""

    def __init__(self, gen: torch.Generator) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 4, generator=gen, dtype=torch.float64))
        self.b = nn.Parameter(torch.randn(4, generator=gen, dtype=torch.float64))
        self.frozen = nn.Parameter(torch.randn(2, generator=gen, dtype=torch.float64))
        self._gen = gen

    def gradients(self, steps: int, scale: float = 1.0, frozen: bool = False) -> list[list[torch.Tensor | None]]:
        """Random gradients of w and b for each of `steps` steps (times `scale`), and None for `frozen` if asked."""
        return [[scale * torch.randn(3, 4, generator=self._gen, dtype=torch.float64),
                 scale * torch.randn(4, generator=self._gen, dtype=torch.float64)] + ([None] if frozen else [])
                for _ in range(steps)]


def _trajectory(opt: Any, params: list[nn.Parameter], grads: list[list[torch.Tensor | None]], what: str,
                lrs: list[float] | None = None) -> list[list[torch.Tensor]]:
    """Run ``opt`` through the gradients of each step (``lrs[k]`` written into every group first, as a schedule
    does); the parameters after each step."""
    states = []
    for k, step_grads in enumerate(grads):
        if lrs is not None:
            for group in opt.param_groups:
                group["lr"] = lrs[k]
        for p, g in zip(params, step_grads):
            p.grad = None if g is None else g.clone()
        try:
            call(f"{what}.step()", opt.step)
        except AssertionError as verdict:
            cause = verdict.__cause__
            if isinstance(cause, ZeroDivisionError):
                fail(*ADAMW_MISTAKES["t_from_0"], f"{what}: step {k + 1} raised ZeroDivisionError ({cause})")
            if isinstance(cause, RuntimeError) and "leaf Variable that requires grad" in str(cause):
                fail(f"{what}.step() changes a parameter in place while autograd records it",
                     "decorate step with @torch.no_grad() (the update itself must not be differentiated)")
            if cause is not None and "NoneType" in str(cause):
                fail(f"{what}.step() crashes on a parameter whose .grad is None",
                     "skip parameters without a gradient (a frozen or unused parameter has none)")
            raise
        states.append([p.detach().clone() for p in params])
    return states


def _reference_trajectory(start: list[torch.Tensor], grads: list[list[torch.Tensor | None]], hyper: list[dict],
                          lrs: list[float] | None = None, *, first_t: int = 1, moments: list | None = None,
                          **form: Any) -> list[list[torch.Tensor]]:
    """adamw_step through the same gradients; ``hyper[i]`` the hyperparameters of parameter i."""
    thetas = [s.clone() for s in start]
    mv = moments or [(torch.zeros_like(s), torch.zeros_like(s)) for s in start]
    counts = [first_t - 1] * len(start)
    states = []
    for k, step_grads in enumerate(grads):
        for i, g in enumerate(step_grads):
            if g is None:
                continue
            counts[i] += 1
            h = dict(hyper[i])
            if lrs is not None:
                h["lr"] = lrs[k]
            thetas[i], m, v = adamw_step(thetas[i], g, *mv[i], counts[i], **h, **form)
            mv[i] = (m, v)
        states.append([t.clone() for t in thetas])
    return states


def _same(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> bool:
    return all(close(x, y, rtol=1e-9, atol=1e-12) for sa, sb in zip(a, b) for x, y in zip(sa, sb))


def _matches(actual: list[list[torch.Tensor]], start: list[torch.Tensor], grads: list, hyper: list[dict],
             lrs: list[float] | None = None, mistake: str | None = None) -> bool:
    """Whether ``actual`` is one of the right forms' trajectories (with ``mistake``, if given)."""
    return any(_same(actual, _reference_trajectory(start, grads, hyper, lrs, mistake=mistake, **form))
               for form in adamw_forms())


def _adamw_algorithm(impl: type) -> None:
    """Four steps on three parameters (one never has a gradient): the trajectory of AdamW, or a named mistake."""
    probe = _Probe(generator(10))
    params, grads = [probe.w, probe.b, probe.frozen], probe.gradients(4, frozen=True)
    start = [p.detach().clone() for p in params]
    hp = dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.2)
    what = f"AdamW(params, lr={hp['lr']}, betas={hp['betas']}, eps={hp['eps']}, weight_decay={hp['weight_decay']})"
    opt = call(what, impl, params, **hp)
    if not isinstance(opt, torch.optim.Optimizer):
        fail(f"AdamW is not a torch.optim.Optimizer (it is a {type(opt).__name__})",
             "subclass torch.optim.Optimizer and call super().__init__(params, defaults): state_dict, "
             "load_state_dict, zero_grad and param_groups come with it")
    actual = _trajectory(opt, params, grads, what)
    if not torch.equal(actual[-1][2], start[2]):
        fail("a parameter whose .grad is None changes", "skip it entirely (no weight decay either), as PyTorch does")
    if _matches(actual, start, grads, [hp] * 3):
        return
    if all(torch.equal(a, s) for a, s in zip(actual[0], start)):
        fail(f"{what}.step() leaves the parameters as they were",
             "change the parameters themselves, in place and under torch.no_grad(): binding a new tensor to a name "
             "changes nothing")
    name_adamw_mistake(lambda mistake: _matches(actual, start, grads, [hp] * 3, mistake=mistake), actual[0],
                       f"{what}, 4 steps")
    forms = [_reference_trajectory(start, grads, [hp] * 3, **form) for form in adamw_forms()]
    step, worst = first_divergence(actual, forms, rtol=1e-9, atol=1e-12)
    fail(f"after step {step}, {what} differs from AdamW by up to {worst:.3g}", ADAMW_UNNAMED_FIX)


def _adamw_eps(impl: type) -> None:
    """Tiny gradients and a large ε, where ε's place decides the step."""
    probe = _Probe(generator(11))
    params, grads = [probe.w, probe.b], probe.gradients(3, scale=1e-3)
    start = [p.detach().clone() for p in params]
    hp = dict(lr=0.01, betas=(0.9, 0.99), eps=1e-4, weight_decay=0.0)
    what = f"AdamW(params, eps={hp['eps']}) on gradients of about 1e-3"
    actual = _trajectory(call(what, impl, params, **hp), params, grads, what)
    if _matches(actual, start, grads, [hp] * 2):
        return
    for mistake in ("eps_inside_sqrt", "no_sqrt"):
        if _matches(actual, start, grads, [hp] * 2, mistake=mistake):
            fail(*ADAMW_MISTAKES[mistake], what)
    fail(f"{what} differs from AdamW, though it matched with ε negligible",
         "ε is added to √v, after the root: it only keeps the denominator away from 0")


def _adamw_groups(impl: type) -> None:
    """Two parameter groups with their own lr and weight_decay."""
    probe = _Probe(generator(12))
    params, grads = [probe.w, probe.b], probe.gradients(2)
    start = [p.detach().clone() for p in params]
    defaults = dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.2)
    groups = [{"params": [probe.w]}, {"params": [probe.b], "lr": 0.3, "weight_decay": 0.0}]
    what = "AdamW([{'params': [w]}, {'params': [b], 'lr': 0.3, 'weight_decay': 0.0}], lr=0.05, weight_decay=0.2)"
    actual = _trajectory(call(what, impl, groups, **defaults), params, grads, what)
    hyper = [defaults, {**defaults, "lr": 0.3, "weight_decay": 0.0}]
    if _matches(actual, start, grads, hyper):
        return
    if _matches(actual, start, grads, [defaults, defaults]):
        fail("every parameter is updated with the defaults, not with its param group's lr and weight_decay",
             "loop over self.param_groups and read lr, betas, eps and weight_decay from each group", what)
    if _matches(actual, start, grads, [defaults, {**defaults, "weight_decay": 0.0}]):
        fail("the learning rate is read once, in __init__, not from each param group (nor from the group a schedule "
             "writes)", "read the learning rate from each group inside step(), at every step", what)
    fail(f"{what} differs from AdamW for a second param group with its own lr and weight_decay",
         "read every hyperparameter from the group the parameter belongs to")


def _adamw_schedule(impl: type) -> None:
    """A learning rate written into the param groups before each step, as a schedule does."""
    probe = _Probe(generator(13))
    params, grads = [probe.w, probe.b], probe.gradients(3)
    start = [p.detach().clone() for p in params]
    hp = dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.2)
    lrs = [0.01, 0.1, 0.03]
    what = "AdamW with group['lr'] set to 0.01, 0.1, 0.03 before steps 1, 2, 3 (as a schedule does)"
    actual = _trajectory(call(what, impl, params, **hp), params, grads, what, lrs)
    if _matches(actual, start, grads, [hp] * 2, lrs):
        return
    if _matches(actual, start, grads, [hp] * 2):
        fail("the learning rate is read once, in __init__, so a schedule that writes group['lr'] has no effect",
             "read the learning rate from the group inside step(), at every step", what)
    fail(f"{what} differs from AdamW with those learning rates", "read group['lr'] at every step")


def _adamw_state_dict(impl: type) -> None:
    """Three steps, state_dict() into a new optimizer on copies of the parameters, two more steps: as if never
    stopped."""
    probe = _Probe(generator(14))
    params, grads = [probe.w, probe.b], probe.gradients(5)
    hp = dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.2)
    what = "AdamW resumed from its state_dict() after 3 steps"
    opt = call("AdamW(params)", impl, params, **hp)
    _trajectory(opt, params, grads[:3], what)
    saved = call(f"{what}: optimizer.state_dict()", opt.state_dict)
    copies = [nn.Parameter(p.detach().clone()) for p in params]
    resumed = call("AdamW(copies of the params)", impl, copies, **hp)
    # A deep copy, as torch.save and torch.load make: state_dict() hands out the optimizer's own tensors.
    call(f"{what}: load_state_dict", resumed.load_state_dict, copy.deepcopy(saved))
    continued = _trajectory(resumed, copies, grads[3:], what)
    uninterrupted = _trajectory(opt, params, grads[3:], "AdamW")
    if _same(continued, uninterrupted):
        return
    if not saved.get("state"):
        fail("the optimizer's state_dict() holds no state: m, v and the step number live outside self.state",
             "keep them in self.state[p] (a dict per parameter), which state_dict() saves and load_state_dict() "
             "restores", what)
    fail("a resumed AdamW does not continue where it stopped: the step number or the moments are kept outside "
         "self.state (an attribute like self.t), so load_state_dict() restarts them",
         "keep the step number, m and v in self.state[p]", what)


def _adamw_signature(impl: type) -> None:
    if not inspect.isclass(impl):
        fail(f"check_adamw expects the class AdamW, got {describe(impl)}", "pass the class itself: check_adamw(AdamW)")
    check_signature(impl, ["params", "lr", "betas", "eps", "weight_decay"], "AdamW")
    defaults = {name: p.default for name, p in inspect.signature(impl.__init__).parameters.items()}
    wanted = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
    for name, value in wanted.items():
        if defaults.get(name) != value:
            fail(f"AdamW's default {name} is {defaults.get(name)!r}, not the course's {value!r}",
                 "write the signature as AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)")


def check_adamw(impl: type) -> None:
    """Check the learner's ``AdamW`` optimizer class against AdamW's algorithm (``torch.optim.AdamW``'s).

    Checked, in float64: the signature and its defaults ``(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
    weight_decay=0.01)``; a ``torch.optim.Optimizer`` subclass; four steps on a matrix and a vector, with a third
    parameter that never has a gradient (it must not change); ε's place, on tiny gradients; two param groups with
    their own lr and weight_decay; a learning rate written into the groups before each step, as a schedule does; the
    state dict: three steps, saved, loaded into a new optimizer, two more steps, as if never stopped. The decay may be
    applied before the Adam step (PyTorch's order) or after it (the handout's), and ε added to √v (the handout's
    α_t form) or to √v̂ (PyTorch's): all four agree to the last bits.

    Mistakes it recognises: weight decay coupled into the gradient (Adam + L2); no bias correction, or none for v;
    m and v not kept between steps (rebound to new tensors, the state left at 0); bias correction with t counted
    from 0; ε inside the square root; the decay applied with α_t instead of α; weight_decay ignored;
    β1 and β2 swapped; no square root of v; v averaging g instead of g²; parameters left unchanged; a parameter
    without a gradient changed or crashing the step; no @torch.no_grad(); one param group's hyperparameters used
    for all; lr read once in __init__; the step number or the moments kept outside self.state (a resumed optimizer
    restarts); not a torch.optim.Optimizer; wrong defaults.
    """
    _adamw_signature(impl)
    with torch.random.fork_rng(devices=[]):
        _adamw_algorithm(impl)
        _adamw_eps(impl)
        _adamw_groups(impl)
        _adamw_schedule(impl)
        _adamw_state_dict(impl)
    passed("check_adamw: a torch.optim.Optimizer; 4 steps of AdamW (decoupled decay, bias correction from t = 1), "
           "ε outside the root, param groups, a schedule's lr, a parameter without gradient skipped; the state dict "
           "resumes exactly")


# ----------------------------------------------------------------------------------------------- the LR schedule

def schedule_reference(it: int, max_lr: float, min_lr: float, warmup: int, cycle: int,
                       mistake: str | None = None) -> float:
    """The warm-up + cosine schedule, right or with a named ``mistake`` (see SCHEDULE_MISTAKES)."""
    if it < warmup:
        if mistake == "warmup_off_by_one":
            return max_lr * (it + 1) / warmup
        if mistake == "warmup_from_min":
            return min_lr + (max_lr - min_lr) * it / warmup
        return max_lr * it / warmup
    if it > cycle and mistake not in ("no_clamp", "zero_after"):
        return min_lr
    if it > cycle and mistake == "zero_after":
        return 0.0
    span = cycle - warmup
    progress = {"cosine_off_by_one": (it - warmup + 1) / span, "cosine_span_off_by_one": (it - warmup) / (span + 1),
                "cosine_over_cycle": (it - warmup) / cycle}.get(mistake, (it - warmup) / span)
    if mistake == "no_half":
        return min_lr + math.cos(math.pi * progress) * (max_lr - min_lr)
    if mistake == "swapped":
        return max_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (min_lr - max_lr)
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)


SCHEDULE_MISTAKES = {
    "warmup_off_by_one": ("off by one at the start of the warm-up: it returns α_max·(it + 1)/T_w, so step 0 is not 0",
                          "warm up as α_max·it/T_w, from 0 at it = 0 to α_max at it = T_w"),
    "warmup_from_min": ("the warm-up starts from min_learning_rate, not from 0",
                        "warm up linearly from 0: α_max·it/T_w"),
    "cosine_off_by_one": ("off by one at the start of the cosine: its progress is (it − T_w + 1)/(T_c − T_w), so "
                          "it = T_w is already past α_max", "use (it − T_w)/(T_c − T_w): 0 at it = T_w, 1 at it = T_c"),
    "cosine_span_off_by_one": ("off by one at the end of the cosine: its progress is (it − T_w)/(T_c − T_w + 1), so "
                               "it = T_c is not yet at α_min",
                               "use (it − T_w)/(T_c − T_w): 0 at it = T_w, 1 at it = T_c"),
    "cosine_over_cycle": ("the cosine's progress is (it − T_w)/T_c: cosine_cycle_iters is the iteration where the "
                          "cosine ends, not its length", "divide by T_c − T_w, so that progress reaches 1 at it = T_c"),
    "no_half": ("the cosine is not mapped to [0, 1]: it uses cos(π·progress), which reaches −1",
                "use ½(1 + cos(π·progress)), which goes from 1 to 0"),
    "swapped": ("α_max and α_min are swapped in the cosine: the rate rises from α_min to α_max",
                "α_min + ½(1 + cos(π·progress))·(α_max − α_min)"),
    "no_clamp": ("after cosine_cycle_iters the rate follows the cosine back up instead of staying at α_min",
                 "return α_min for it > T_c"),
    "zero_after": ("after cosine_cycle_iters the rate drops to 0 instead of staying at α_min",
                   "return α_min for it > T_c"),
}


def diagnose_schedule(name: str, impl: Callable[..., Any], configs: list[tuple[float, float, int, int]]) -> None:
    """The learner's schedule at every it from 0 to T_c + 5 for each config, or the first named mistake it follows."""
    for max_lr, min_lr, warmup, cycle in configs:
        its = range(cycle + 6)
        values = []
        for it in its:
            what = f"{name}(it={it}, max_learning_rate={max_lr}, min_learning_rate={min_lr}, warmup_iters={warmup}, " \
                   f"cosine_cycle_iters={cycle})"
            out = call(what, impl, it, max_lr, min_lr, warmup, cycle)
            try:
                values.append(float(out))
            except (TypeError, ValueError):
                fail(f"{what} returned {describe(out)}, not a number", "return the learning rate as a float")
        right = [schedule_reference(it, max_lr, min_lr, warmup, cycle) for it in its]
        if all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) for a, b in zip(values, right)):
            continue
        setting = f"max {max_lr}, min {min_lr}, T_w = {warmup}, T_c = {cycle}"
        for mistake, (text, fix) in SCHEDULE_MISTAKES.items():
            wrong = [schedule_reference(it, max_lr, min_lr, warmup, cycle, mistake) for it in its]
            if wrong != right and all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) for a, b in zip(values, wrong)):
                fail(text, fix, f"{setting}: yours matches that mistake at every it")
        first = next(it for it in its if not math.isclose(values[it], right[it], rel_tol=1e-9, abs_tol=1e-12))
        phase = "warm-up" if first < warmup else "cosine" if first <= cycle else "after the cosine"
        fail(f"{name} is wrong from it = {first} on (in the {phase}): {values[first]:.6g} where the schedule has "
             f"{right[first]:.6g}", "it < T_w: α_max·it/T_w; T_w ≤ it ≤ T_c: α_min + ½(1 + cos(π·(it − T_w)/(T_c − "
             "T_w)))·(α_max − α_min); it > T_c: α_min", setting)


def check_lr_cosine_schedule(impl: Callable[..., float]) -> None:
    """Check the learner's ``lr_cosine_schedule(it, max_learning_rate, min_learning_rate, warmup_iters,
    cosine_cycle_iters)`` at every iteration from 0 to T_c + 5, for three settings (T_w = 7, T_c = 21 as in CS336's
    tests; T_w = 0; T_w = 3, T_c = 4).

    Mistakes it recognises: off by one at the start of the warm-up ((it + 1)/T_w); a warm-up from α_min; off by
    one at the start of the cosine ((it − T_w + 1)/(T_c − T_w)) or at its end ((it − T_w)/(T_c − T_w + 1)); the
    cosine's progress over T_c instead of T_c − T_w; cos not mapped to [0, 1]; α_max and α_min swapped; after T_c,
    the cosine rising again or the rate 0; anything else, with the first iteration where it goes wrong.
    """
    check_signature(impl, ["it", "max_learning_rate", "min_learning_rate", "warmup_iters", "cosine_cycle_iters"],
                    "lr_cosine_schedule")
    diagnose_schedule("lr_cosine_schedule", impl, [(1.0, 0.1, 7, 21), (3e-4, 3e-5, 0, 10), (0.5, 0.05, 3, 4)])
    passed("check_lr_cosine_schedule: warm-up from 0, cosine from α_max at T_w to α_min at T_c, then α_min; every it "
           "from 0 to T_c + 5, three settings")


# ----------------------------------------------------------------------------------------------- gradient clipping

# What torch.nn.utils.clip_grad_norm_ (and get_total_norm, clip_grads_with_norm_) run inside, on CPU and CUDA.
CLIPPING_BUILTINS = {torch._foreach_norm: "torch.nn.utils.clip_grad_norm_ (or get_total_norm)",
                     torch._foreach_mul_: "torch.nn.utils.clip_grad_norm_ (or clip_grads_with_norm_)"}


def clip_expected(grads: list[torch.Tensor], max_norm: float, mistake: str | None = None) -> list[torch.Tensor]:
    """The gradients after clipping, right or with a named mistake."""
    norms = [g.norm() for g in grads]
    total = torch.stack(norms).pow(2).sum().sqrt()
    if mistake == "per_parameter":
        return [g * (max_norm / (n + 1e-6)) if n > max_norm else g.clone() for g, n in zip(grads, norms)]
    if mistake == "sum_of_norms":
        total = torch.stack(norms).sum()
    if mistake == "squared":
        total = total**2
    scale = max_norm / (total if mistake == "no_eps" else total + 1e-6)
    if total > max_norm or mistake == "always":
        return [g * scale for g in grads]
    return [g.clone() for g in grads]


CLIPPING_MISTAKES = {
    "per_parameter": ("each gradient is clipped by its own norm (per-parameter norms) instead of one global norm",
                      "compute one L2 norm over all the gradients together (the root of the sum of every squared "
                      "entry), then scale them all by the same factor"),
    "sum_of_norms": ("the global norm is the sum of the parameters' norms",
                     "add up the squares of every entry (or the squared norms), then take one square root"),
    "squared": ("the global norm is never square-rooted (it is the sum of squares)",
                "take the square root of the sum of squares"),
    "no_eps": ("the scale is max_l2_norm / norm, without the 1e-6",
               "scale by max_l2_norm / (norm + 1e-6), as PyTorch does"),
    "always": ("the gradients are scaled even when their norm is below the maximum (small gradients are scaled up)",
               "scale only when the norm is above max_l2_norm"),
    "float32_norm": ("the norm is accumulated in float32 while the gradients are float64, so it (and the scale) carry "
                     "float32's rounding, about 1e-7 relative",
                     "accumulate the norm in the gradients' own dtype: a sum started from a float32 tensor (or a "
                     "Python float turned into one) rounds every partial sum to float32"),
}


def float32_rounded(value: float, right: float) -> bool:
    """Whether ``value`` is ``right`` only to float32's precision: off by more than float64's rounding, by no more
    than a few of float32's rounding steps."""
    return not math.isclose(value, right, rel_tol=1e-12) and math.isclose(value, right, rel_tol=1e-6)


def name_clipping_mistake(out: list[torch.Tensor], grads: list[torch.Tensor], max_norm: float, what: str,
                          rtol: float) -> None:
    """Fail with the CLIPPING_MISTAKES entry whose gradients `out` matches (and the right ones do not), if any."""
    expected = clip_expected(grads, max_norm)
    for mistake, (text, fix) in CLIPPING_MISTAKES.items():
        wrong = clip_expected(grads, max_norm, mistake)
        differs = not all(close(a, b, rtol=rtol, atol=1e-15) for a, b in zip(wrong, expected))
        if differs and all(close(a, b, rtol=rtol, atol=1e-15) for a, b in zip(out, wrong)):
            fail(text, fix, what)
    scales = torch.cat([(a / g).flatten() for a, g in zip(out, grads)]).double()
    right = (expected[0] / grads[0]).flatten()[0].item()
    if grads[0].dtype == torch.float64 and (scales.max() - scales.min()).item() <= 1e-12 * abs(right) and \
            float32_rounded(scales.mean().item(), right):
        fail(*CLIPPING_MISTAKES["float32_norm"], f"{what}: the scale is {scales.mean().item():.10g}, where float64 "
             f"gives {right:.10g}")


def _run_clipping(impl: Callable[..., Any], grads: list[torch.Tensor | None], max_norm: float, what: str, *,
                  as_generator: bool = False) -> list[torch.Tensor | None]:
    params = [nn.Parameter(torch.zeros_like(g) if g is not None else torch.zeros(3, dtype=torch.float64))
              for g in grads]
    for p, g in zip(params, grads):
        p.grad = None if g is None else g.clone()
    try:
        call_without_builtins(what, CLIPPING_BUILTINS, "compute the global norm and scale the gradients yourself (the "
                              "built-in is only the checks' reference)", impl,
                              (p for p in params) if as_generator else params, max_norm)
    except AssertionError as verdict:
        if verdict.__cause__ is not None and "NoneType" in str(verdict.__cause__):
            fail(f"{what} crashes on a parameter whose .grad is None",
                 "skip parameters without a gradient (frozen or unused ones have none)")
        raise
    return [p.grad for p in params]


def check_gradient_clipping(impl: Callable[..., Any]) -> None:
    """Check the learner's ``gradient_clipping(parameters, max_l2_norm)`` against ``torch.nn.utils.clip_grad_norm_``.

    Checked, in float64: gradients of three parameters (and one without a gradient, skipped) whose global norm is above
    the maximum (all scaled in place by max_l2_norm / (norm + 1e-6)), below it (unchanged), and tiny (where the 1e-6
    shows); the parameters given as a generator (``model.parameters()``); no built-in clipping.

    Mistakes it recognises: per-parameter norms instead of one global norm; the sum of the norms; the sum of squares
    without the root; the eps missing; clipping (scaling up) when below the maximum; the gradients not changed in
    place; a crash on a parameter without a gradient; the parameters iterated twice (a generator is empty the second
    time); torch.nn.utils.clip_grad_norm_ used.
    """
    check_signature(impl, ["parameters", "max_l2_norm"], "gradient_clipping")
    gen = generator(20)
    with torch.random.fork_rng(devices=[]):
        shapes = [(3, 4), (4,), (2, 2, 2)]
        base = [torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes]
        total = math.sqrt(sum(g.pow(2).sum().item() for g in base))
        cases = [("above", base, 0.5 * total), ("below", base, 2.0 * total),
                 ("tiny", [1e-4 * g for g in base], 0.5e-4 * total)]
        for name, grads, max_norm in cases:
            what = ("gradient_clipping(3 parameters with gradients of global norm "
                    f"{math.sqrt(sum(g.pow(2).sum().item() for g in grads)):.3g} "
                    f"and 1 without, max_l2_norm={max_norm:.3g})")
            out = _run_clipping(impl, [*grads, None], max_norm, what)
            if out[-1] is not None:
                fail(f"{what} gives a gradient to a parameter that had none", "skip parameters whose .grad is None")
            expected = clip_expected(grads, max_norm)
            if all(close(a, b, rtol=1e-6, atol=1e-15) for a, b in zip(out, expected)):
                continue
            if name == "above" and all(torch.equal(a, g) for a, g in zip(out, grads)):
                fail(f"{what} leaves the gradients unchanged: they are not scaled in place",
                     "scale each p.grad in place, with its own in-place method; a new tensor bound to a name changes "
                     "nothing")
            name_clipping_mistake(out, grads, max_norm, what, rtol=1e-6)
            worst = max((a - b).abs().max().item() for a, b in zip(out, expected))
            fail(f"{what} differs from torch.nn.utils.clip_grad_norm_ by up to {worst:.3g}",
                 "norm = √(Σ over every gradient entry of g²); if norm > max_l2_norm, multiply every gradient in "
                 "place by max_l2_norm / (norm + 1e-6)")
        what = "gradient_clipping(model.parameters(), ...), a generator"
        out = _run_clipping(impl, list(base), 0.5 * total, what, as_generator=True)
        if not all(close(a, b, rtol=1e-6, atol=1e-15) for a, b in zip(out, clip_expected(base, 0.5 * total))):
            fail(f"{what} does not clip: the parameters are iterated twice, and a generator is empty the second time",
                 "make a list of the gradients first, then use it twice")
    passed("check_gradient_clipping: one global L2 norm, gradients scaled in place by max/(norm + 1e-6) above the "
           "maximum and left alone below it; parameters without a gradient skipped; a generator of parameters")


# --------------------------------------------------------------------------------------------------------- batches

def _memmap(values: np.ndarray, folder: str) -> np.memmap:
    """``values`` written to a file and memory-mapped read-only, as a token file is."""
    path = Path(folder) / "tokens.bin"
    values.tofile(path)
    return np.memmap(path, dtype=values.dtype, mode="r")


# What cutting or stacking windows says when one of them runs past the end of the data (numpy, torch).
_SHORT_WINDOW = ("same shape", "equal size", "inhomogeneous", "could not broadcast")


def name_start_past_the_end(verdict: AssertionError, what: str, data: str, length: int, context_length: int) -> None:
    """If ``verdict`` is a crash of a window cut past the end of ``data`` (IndexError, or stacking rows of unequal
    length), fail naming the last valid start; else return."""
    cause = verdict.__cause__
    if isinstance(cause, IndexError) or (isinstance(cause, (ValueError, RuntimeError)) and
                                         any(phrase in str(cause) for phrase in _SHORT_WINDOW)):
        last = length - context_length - 1
        raise AssertionError(
            f"{what} crashes with {type(cause).__name__}: it drew a start above {last}, the last valid start: starts "
            f"must be drawn from 0 … len({data}) − context_length − 1 = {last}, and a later start runs its window or "
            "its targets off the end.") from cause


def _batch(impl: Callable[..., Any], dataset: Any, batch_size: int, context_length: int, device: Any,
           what: str) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        out = call(what, impl, dataset, batch_size, context_length, device)
    except AssertionError as error:
        name_start_past_the_end(error, what, "dataset", len(dataset), context_length)
        raise
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        fail(f"{what} returned {describe(out)}, not a pair (inputs, targets)", "return both: inputs, targets")
    x, y = out
    for name, t in (("inputs", x), ("targets", y)):
        if not isinstance(t, torch.Tensor):
            fail(f"{what} returned its {name} as {describe(t)}, not a tensor",
                 "convert with torch.from_numpy(...), then .to(device)")
        if tuple(t.shape) == (context_length, batch_size) and batch_size != context_length:
            fail(f"{what} returned {name} of shape {tuple(t.shape)}: batch and context are swapped",
                 f"one row per sequence: shape (batch_size, context_length) = ({batch_size}, {context_length})")
        if tuple(t.shape) != (batch_size, context_length):
            fail(f"{what} returned {name} of shape {tuple(t.shape)}, expected (batch_size, context_length) = "
                 f"({batch_size}, {context_length})", "take context_length tokens per row, batch_size rows")
    return x, y


def check_get_batch(impl: Callable[..., Any]) -> None:
    """Check the learner's ``get_batch(dataset, batch_size, context_length, device)``.

    Checked: a pair of LongTensors (batch_size, context_length) from a 1-D numpy array and from a numpy.memmap of a
    uint8 token file; every row a window of consecutive tokens and the targets the same windows shifted by one; the
    start positions, over 4,000 rows, cover every valid start 0 … len − context_length − 1 about equally; the device
    argument honoured (checked with ``device="meta"``, so no GPU is needed). Uses torch's global generator inside
    ``torch.random.fork_rng``, so the caller's random state is left as it was.

    Mistakes it recognises: the targets not shifted (or shifted the wrong way, or by more than one); rows that are not
    consecutive tokens; batch and context swapped; the wrong dtype (the token file's uint8, or int32: embeddings and
    cross-entropy need int64); the device ignored; the last valid start never drawn (randint's high is exclusive);
    start 0 never drawn; starts past the last valid one (the targets run off the end); starts not uniform.
    """
    check_signature(impl, ["dataset", "batch_size", "context_length", "device"], "get_batch")
    with torch.random.fork_rng(devices=[]), tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        np.random.seed(0)  # noqa: NPY002 - a learner may draw with numpy's global generator
        for dataset, kind in [(np.arange(100, dtype=np.int64), "a numpy array of int64"),
                              (_memmap(np.arange(200, dtype=np.uint8), folder), "a numpy.memmap of uint8 tokens")]:
            what = f"get_batch({kind} [0, 1, 2, …], batch_size=8, context_length=5, device='cpu')"
            x, y = _batch(impl, dataset, 8, 5, "cpu", what)
            if x.dtype != torch.long or y.dtype != torch.long:
                wrong = x.dtype if x.dtype != torch.long else y.dtype
                fail(f"{what} returned {wrong}, not torch.long (int64)" +
                     (": the token file's uint8 was kept" if wrong == torch.uint8 else ""),
                     "convert to int64 (astype(np.int64), or .long()): embeddings and cross-entropy index with int64")
            if x.device.type != "cpu":
                fail(f"{what} returned tensors on {x.device}", "put them on the device given: .to(device)")
            steps = (x[:, 1:] - x[:, :-1]).unique().tolist()
            if steps != [1]:
                fail(f"{what}: the rows of inputs are not windows of consecutive tokens",
                     "each row is dataset[s : s + context_length] for one start s")
            shift = (y - x).unique().tolist()
            if shift == [0]:
                fail(f"{what}: the targets are not shifted: they equal the inputs",
                     "the targets are the next tokens: dataset[s + 1 : s + context_length + 1]")
            if shift == [-1]:
                fail(f"{what}: the targets are shifted the wrong way (the previous tokens)",
                     "the targets are the next tokens: dataset[s + 1 : s + context_length + 1]")
            if shift != [1]:
                fail(f"{what}: the targets are not the inputs shifted by one (they are shifted by {shift})",
                     "the targets are dataset[s + 1 : s + context_length + 1] for the same start s as the inputs")
        _check_starts(impl, folder)
        what = "get_batch(..., device='meta')"
        x, y = _batch(impl, np.arange(100, dtype=np.int64), 4, 5, "meta", what)
        if x.device.type != "meta" or y.device.type != "meta":
            fail(f"{what} returned tensors on {x.device if x.device.type != 'meta' else y.device}: the device "
                 "argument is ignored", "move both tensors to it: .to(device)")
        x, y = _batch(impl, np.arange(100, dtype=np.int64), 4, 5, torch.device("cpu"),
                      "get_batch(..., device=torch.device('cpu'))")
    passed("check_get_batch: (inputs, targets) int64 (batch, context) on the device, targets shifted by one, from an "
           "array and a uint8 memmap; every valid start drawn, uniformly")


def _check_starts(impl: Callable[..., Any], folder: str) -> None:
    """4,000 rows from 12 tokens with context 4: the starts are exactly 0 … 7, about 500 each."""
    n, context, rows = 12, 4, 4000
    what = f"get_batch(a dataset of {n} tokens, batch_size={rows}, context_length={context}, device='cpu')"
    x, _ = _batch(impl, _memmap(np.arange(n, dtype=np.uint8), folder), rows, context, "cpu", what)
    counts = torch.bincount(x[:, 0].long(), minlength=n).tolist()
    last = n - context - 1
    if max(i for i, c in enumerate(counts) if c) > last:
        fail(f"{what} draws starts past the last valid one ({last}): the windows or targets run off the end",
             "draw starts from [0, len(dataset) − context_length) (torch.randint's high is exclusive)")
    if counts[last] == 0:
        fail(f"the last valid start, len(dataset) − context_length − 1 = {last}, is never drawn (in {rows} rows)",
             "torch.randint's high is exclusive: the starts must cover [0, len(dataset) − context_length), the "
             "last valid start included", f"starts drawn: {counts[: last + 1]}")
    if counts[0] == 0:
        fail(f"start 0 is never drawn (in {rows} rows)", "draw starts from [0, len(dataset) − context_length)",
             f"starts drawn: {counts[: last + 1]}")
    expected = rows / (last + 1)
    if any(abs(c - expected) > 0.3 * expected for c in counts[: last + 1]):
        fail(f"{what}: the starts are not uniform over 0 … {last}", "draw each start uniformly: torch.randint",
             f"starts drawn: {counts[: last + 1]} (about {expected:.0f} each expected)")


# ------------------------------------------------------------------------------------------------------ checkpoints

class _Tiny(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        gen = generator(seed)
        self.a = nn.Parameter(torch.randn(3, 4, generator=gen))
        self.b = nn.Parameter(torch.randn(4, generator=gen))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.a + self.b).pow(2).sum()


def _trained(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A tiny model and torch's AdamW after two steps, so that the optimizer has state (m, v, step)."""
    model = _Tiny(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    x = torch.randn(5, 3, generator=generator(seed + 1))
    for _ in range(2):
        optimizer.zero_grad()
        model(x).backward()
        optimizer.step()
    return model, optimizer


def _values(obj: Any) -> list[Any]:
    return list(obj.values()) if isinstance(obj, dict) else list(obj) if isinstance(obj, (list, tuple)) else []


def _inspect_saved(raw: bytes, model: nn.Module, iteration: int, what: str) -> Any:
    """What the learner wrote holds the model's state dict, the optimizer's and the iteration; returns it."""
    try:
        saved = torch.load(io.BytesIO(raw), weights_only=False)
    except Exception as error:  # noqa: BLE001 - any failure to read it back is the verdict
        fail(f"what {what} wrote cannot be read back with torch.load ({type(error).__name__})",
             "write it with torch.save(checkpoint, out)")
    if isinstance(saved, nn.Module):
        fail(f"{what} saves the model object itself, not a dict of state dicts",
             "save a dict of the model's state_dict(), the optimizer's state_dict() and the iteration: "
             "tensors and numbers load anywhere (torch.load(weights_only=True)), a pickled object needs its class")
    values = _values(saved)
    if any(isinstance(v, (nn.Module, torch.optim.Optimizer)) for v in values):
        fail(f"{what} saves the model or optimizer object, not its state_dict()",
             "save model.state_dict() and optimizer.state_dict(): tensors and numbers, which torch.load(..., "
             "weights_only=True) reads anywhere")
    if not any(isinstance(v, (int, torch.Tensor)) and not isinstance(v, bool) and
               (v.numel() == 1 if isinstance(v, torch.Tensor) else True) and int(v) == iteration for v in values):
        fail(f"the iteration is not saved: {what} wrote no entry equal to iteration={iteration}",
             "save it beside the state dicts, and return it from load_checkpoint")
    names = set(model.state_dict())
    if not any(isinstance(v, dict) and set(v) == names for v in values):
        fail(f"the model's state_dict() is not saved by {what}", "save model.state_dict() in the checkpoint")
    if not any(isinstance(v, dict) and {"state", "param_groups"} <= set(v) for v in values):
        fail(f"the optimizer's state is not saved by {what} (without m, v and the step number a resumed run "
             "restarts AdamW)", "save optimizer.state_dict() in the checkpoint")
    return saved


def _round_trip(save: Callable[..., Any], load: Callable[..., Any], target: Any, kind: str, iteration: int) -> None:
    model, optimizer = _trained(1)
    what_save = f"save_checkpoint(model, optimizer, iteration={iteration}, {kind})"
    if isinstance(target, io.BytesIO):
        call(what_save, save, model, optimizer, iteration, target)
        raw = target.getvalue()
        target.seek(0)
        source = target
    else:
        call(what_save, save, model, optimizer, iteration, target)
        raw = Path(target).read_bytes()
        source = Path(target) if isinstance(target, str) else str(target)
    saved = _inspect_saved(raw, model, iteration, what_save)
    fresh = _Tiny(7)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.01)
    what_load = f"load_checkpoint({kind}, model, optimizer)"
    try:
        returned = call(what_load, load, source, fresh, fresh_optimizer)
    except AssertionError as verdict:
        key = verdict.__cause__.args[0] if isinstance(verdict.__cause__, KeyError) and verdict.__cause__.args else None
        if isinstance(saved, dict) and isinstance(key, str) and key not in saved:
            fail(f"load_checkpoint reads the key {key!r}, which save_checkpoint never writes (it writes "
                 f"{', '.join(repr(k) for k in saved)})", "the keys that save_checkpoint writes and load_checkpoint "
                 "reads must agree: read each entry under the name it was saved with", f"on {what_load}")
        raise
    if returned is None:
        fail(f"{what_load} returns None, not the iteration", "return the saved iteration (an int)")
    if isinstance(returned, torch.Tensor) and returned.numel() == 1:
        returned = returned.item()
    if not isinstance(returned, int) or isinstance(returned, bool) or returned != iteration:
        fail(f"{what_load} returns {returned!r}, not the saved iteration {iteration}", "return checkpoint's iteration")
    for (name, p), q in zip(model.named_parameters(), fresh.parameters()):
        if not torch.equal(p.detach(), q.detach()):
            fail(f"{what_load} does not load the model's weights ({name} differs)",
                 "model.load_state_dict(the saved model state dict), into the model given")
    mine, theirs = fresh_optimizer.state_dict(), optimizer.state_dict()
    if not mine["state"]:
        fail(f"{what_load} does not load the optimizer's state (it is still empty)",
             "optimizer.load_state_dict(the saved optimizer state dict), into the optimizer given")
    for key, state in theirs["state"].items():
        for name, value in state.items():
            if not torch.equal(torch.as_tensor(mine["state"][key][name]), torch.as_tensor(value)):
                fail(f"{what_load}: the optimizer's {name} differs from the saved one",
                     "optimizer.load_state_dict(the saved optimizer state dict)")
    x = torch.randn(5, 3, generator=generator(9))
    for m, o in ((model, optimizer), (fresh, fresh_optimizer)):
        o.zero_grad()
        m(x).backward()
        o.step()
    if not all(torch.equal(p.detach(), q.detach()) for p, q in zip(model.parameters(), fresh.parameters())):
        fail(f"after {what_load}, one more step differs from the run that never stopped",
             "load both state dicts, the model's and the optimizer's")


def _targets(folder: str, prefix: str = "") -> list[tuple[Any, str, int]]:
    """Where a checkpoint goes: a file object, a path as a str, a pathlib.Path (each with its own iteration)."""
    return [(io.BytesIO(), "an io.BytesIO", 7), (str(Path(folder) / f"{prefix}a.pt"), "a path (str)", 12),
            (Path(folder) / f"{prefix}b.pt", "a pathlib.Path", 3)]


def _crashed(verdict: AssertionError | None) -> bool:
    """Whether a round trip's verdict is a crash of the learner's code (not a stub, not a named mistake)."""
    return verdict is not None and crash_of(verdict) is not None and " raised " in str(verdict).splitlines()[0]


def _attempt(save: Callable[..., Any], load: Callable[..., Any], target: Any, kind: str,
             iteration: int) -> AssertionError | None:
    """The verdict of one round trip, or None when it passes."""
    try:
        _round_trip(save, load, target, kind, iteration)
    except AssertionError as verdict:
        return verdict
    return None


def check_checkpoint(save_checkpoint: Callable[..., Any], load_checkpoint: Callable[..., Any]) -> None:
    """Check the learner's ``save_checkpoint(model, optimizer, iteration, out)`` and ``load_checkpoint(src, model,
    optimizer) -> iteration`` together.

    A small model and torch's AdamW take two steps (so the optimizer has state), are saved, and loaded into a fresh
    model and optimizer: the weights, the optimizer's state and the iteration must come back exactly, and one more
    step must equal the run that never stopped. Through an ``io.BytesIO``, a path given as a string and a
    ``pathlib.Path``. What was written is read back with ``torch.load`` to see what it holds.

    Mistakes it recognises: the iteration not saved; the optimizer's state not saved; the model's state dict not
    saved; the model or optimizer object pickled instead of its state_dict(); load_checkpoint returning None or
    another number; load_checkpoint reading a key that save_checkpoint does not write; the model's weights or the
    optimizer's state not loaded; a crash with a path or with a file object, when the other kind works (each named).
    """
    check_signature(save_checkpoint, ["model", "optimizer", "iteration", "out"], "save_checkpoint")
    check_signature(load_checkpoint, ["src", "model", "optimizer"], "load_checkpoint")
    with torch.random.fork_rng(devices=[]), tempfile.TemporaryDirectory() as folder:
        for index, (target, kind, iteration) in enumerate(_targets(folder)):
            try:
                _round_trip(save_checkpoint, load_checkpoint, target, kind, iteration)
            except AssertionError as error:
                first = str(error).splitlines()[0]
                if _crashed(error) and any(not _crashed(_attempt(save_checkpoint, load_checkpoint, *other))
                                           for other in _targets(folder, "other") if other[1] != kind):
                    raise AssertionError(f"{first.split(' raised')[0]} crashes with {kind}, though not with another "
                                         "kind of target: torch.save and torch.load accept both a path and a binary "
                                         "file object, so hand them out and src as they came (no open(...) of your "
                                         f"own).\n{first}") from error.__cause__
                raise
    passed("check_checkpoint: the model's and the optimizer's state dicts and the iteration come back exactly, and "
           "training continues as if never stopped; through a BytesIO, a str path and a pathlib.Path")

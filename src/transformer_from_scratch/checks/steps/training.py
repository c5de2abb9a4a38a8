"""Self-checks for the steps of notebook 11 (training): a stable log-sum-exp, the mean cross-entropy from it, one
AdamW update of one tensor, the warm-up + cosine schedule, clipping a list of gradients by their global L2 norm, and
random windows of a token array with their next-token targets."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from .._harness import call, call_without_builtins, close, describe, diagnose, expect_tensor, fail, generator, passed
from ..training import (ADAMW_MISTAKES, ADAMW_UNNAMED_FIX, CLIPPING_BUILTINS, CLIPPING_MISTAKES,
                        CROSS_ENTROPY_BUILTIN_FIX, CROSS_ENTROPY_BUILTINS, adamw_forms, adamw_step, clip_expected,
                        cross_entropy_variants, diagnose_schedule, first_divergence, float32_rounded,
                        name_adamw_mistake, name_clipping_mistake, name_start_past_the_end)


def check_log_sum_exp(log_sum_exp: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Check ``log_sum_exp(z)``: log Σ_j exp(z_j) over the last dimension, (..., V) -> (...), stable at any scale.

    Mistakes it recognises: no max subtraction (inf at +1000, -inf at -1000); the max subtracted and never added
    back; the max of the whole tensor instead of each row's (rows far apart underflow); the last dimension kept with
    size 1 (keepdim); the wrong dimension; torch.logsumexp (or a log-softmax) used.
    """
    gen = generator(0)
    base = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    cases = [("ordinary logits of shape (3, 5)", base),
             ("logits of shape (2, 3, 4)", torch.randn(2, 3, 4, generator=gen, dtype=torch.float64)),
             ("logits near +1000", base + 1000), ("logits near -1000", base - 1000),
             ("rows near +500 and near -500", torch.cat([base[:2] + 500, base[2:] - 500]))]
    for name, z in cases:
        what = f"log_sum_exp({name})"
        out = call_without_builtins(what, CROSS_ENTROPY_BUILTINS, CROSS_ENTROPY_BUILTIN_FIX, log_sum_exp, z)
        expected = torch.logsumexp(z, dim=-1)
        if isinstance(out, torch.Tensor) and tuple(out.shape) == (*z.shape[:-1], 1):
            fail(f"{what} returned shape {tuple(out.shape)}: the last dimension is kept with size 1",
                 "return one number per row, shape (...,): squeeze it, or add the max back without keepdim")
        if isinstance(out, torch.Tensor) and tuple(out.shape) != tuple(expected.shape) and z.ndim == 2 and \
                tuple(out.shape) == (z.shape[-1],):
            fail(f"{what} returned shape {tuple(out.shape)}: it sums over the rows (dim 0), not over the last "
                 "dimension", "reduce over dim=-1, the vocabulary")
        out = expect_tensor(what, out, tuple(expected.shape), "one number per row: reduce over the last dimension")
        if not torch.isfinite(out).all():
            if "500" in name:
                fail(f"{what} returned {out.tolist()}: it subtracts the max of the whole tensor, not each row's, so a "
                     "row far below the largest underflows to exp(-1000) = 0", "take the max along the last "
                     "dimension (keepdim=True), one per row")
            fail(f"{what} returned {out.flatten().tolist()[:3]}…: there is no max subtraction, so exp("
                 f"{'+' if '+' in name else '-'}1000) {'overflows to inf' if '+' in name else 'underflows to 0'}",
                 "subtract each row's max m before the exp, and add it back: m + log Σ exp(z − m)")
        largest = z.max(dim=-1).values
        diagnose(what, out, expected, [
            (lambda: expected - largest, "the max is subtracted inside the exp but never added back",
             "log Σ exp(z) = m + log Σ exp(z − m): add m back after the log"),
        ], "log Σ_j exp(z_j) over the last dimension, computed as m + log Σ exp(z − m)", rtol=1e-10, atol=1e-10)
    passed("log_sum_exp: log Σ exp over the last dimension, exact at ±1000 and for rows 1000 apart, no built-in")


def check_mean_cross_entropy(mean_cross_entropy: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Check ``mean_cross_entropy(logits, targets)``: logits (N, V), targets (N,) -> the mean of log Σ exp(z) −
    z[target], a 0-d tensor.

    Mistakes it recognises: the sum instead of the mean; one loss per row returned; the sign flipped; z[:, targets]
    (an N × N block) instead of one logit per row; the max subtracted and never added back; log base 2; divided by
    the vocabulary size; the log of the softmax's probabilities (inf when one underflows); F.cross_entropy (or a
    log-softmax) used.
    """
    gen = generator(1)
    z = 2 * torch.randn(6, 5, generator=gen, dtype=torch.float64)
    y = torch.tensor([0, 4, 2, 2, 1, 3])
    far = torch.full((4, 6), 1000.0, dtype=torch.float64)
    targets_far = torch.tensor([0, 3, 5, 1])
    far[torch.arange(4), targets_far] = -1000.0
    for name, logits, targets in [("logits of shape (6, 5)", z, y), ("logits near +1000", z + 1000, y),
                                  ("target logits 2000 below the rest", far, targets_far)]:
        what = f"mean_cross_entropy({name})"
        out = call_without_builtins(what, CROSS_ENTROPY_BUILTINS, CROSS_ENTROPY_BUILTIN_FIX, mean_cross_entropy,
                                    logits, targets)
        if isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(targets.shape):
            fail(f"{what} returned one loss per row (shape {tuple(out.shape)}), not their mean",
                 "average them: the loss is one number, a 0-d tensor")
        out = expect_tensor(what, out, (), "return the mean over the rows: a 0-d tensor")
        if not torch.isfinite(out):
            fail(f"{what} returned {out.item()}: it takes the log of the softmax's probabilities (or skips the max), "
                 "and exp(-2000) underflows to 0, whose log is -inf",
                 "use your log_sum_exp: the loss of a row is log_sum_exp(z) − z[target], no probabilities needed")
        diagnose(what, out, F.cross_entropy(logits, targets), cross_entropy_variants(logits, targets),
                 "the loss is the mean over the rows of log_sum_exp(z) − z[target]", rtol=1e-10, atol=1e-9)
    passed("mean_cross_entropy: the mean of log Σ exp(z) − z[target] over the rows, equal to F.cross_entropy, "
           "also at +1000 and with targets 2000 below the rest")


def check_adamw_update(adamw_update: Callable[..., Any]) -> None:
    """Check ``adamw_update(theta, grad, m, v, t, lr, betas, eps, weight_decay)`` -> (theta, m, v): one AdamW step of
    one tensor, with t the step number counted from 1.

    Three steps in a row (the m and v it returns fed back), with a large weight decay so that its form shows, then
    tiny gradients with a large ε. The decay may come before or after the Adam step, and ε may be added to √v or to
    √v̂ (PyTorch's form): all are accepted. Mistakes it recognises: weight decay coupled into the gradient (Adam +
    L2); no bias correction, or none for v; bias correction with t counted from 0; ε inside the square root; the
    decay applied with α_t instead of α; weight_decay ignored; β1 and β2 swapped; no square root of v; v averaging g
    instead of g²; m or v not updated (returned as they came).
    """
    gen = generator(2)
    theta = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    grads = [torch.randn(3, 4, generator=gen, dtype=torch.float64) for _ in range(3)]
    hp = dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.2)
    _update_run(adamw_update, theta, grads, hp, "AdamW's update")
    tiny = [1e-3 * g for g in grads]
    _update_run(adamw_update, theta, tiny, dict(lr=0.01, betas=(0.9, 0.99), eps=1e-4, weight_decay=0.0),
                "AdamW's update on gradients of about 1e-3 with eps=1e-4")
    passed("adamw_update: m, v, the bias-corrected step α·m̂/(√v̂ + ε) and the decoupled decay α·λ·θ, three steps "
           "from t = 1, also where ε matters")


def _update_run(adamw_update: Callable[..., Any], theta: torch.Tensor, grads: list[torch.Tensor], hp: dict,
                label: str) -> None:
    """The learner's trajectory (θ, m, v after each step) against every right form, then against each mistake."""
    def trajectory(fn: Callable[..., Any], learner: bool) -> list[tuple[torch.Tensor, ...]]:
        th, m, v = theta.clone(), torch.zeros_like(theta), torch.zeros_like(theta)
        states = []
        for t, g in enumerate(grads, start=1):
            what = (f"adamw_update(theta, grad, m, v, t={t}, lr={hp['lr']}, betas={hp['betas']}, eps={hp['eps']}, "
                    f"weight_decay={hp['weight_decay']})")
            if learner:
                try:
                    out = call(what, fn, th.clone(), g.clone(), m.clone(), v.clone(), t, hp["lr"], hp["betas"],
                               hp["eps"], hp["weight_decay"])
                except AssertionError as verdict:
                    if isinstance(verdict.__cause__, ZeroDivisionError):
                        fail(*ADAMW_MISTAKES["t_from_0"], f"{what} raised ZeroDivisionError")
                    raise
                if not isinstance(out, (tuple, list)) or len(out) != 3:
                    fail(f"{what} returned {describe(out)}, not the three new tensors (theta, m, v)",
                         "return theta, m, v, in that order")
                for name, value in zip(("theta", "m", "v"), out):
                    expect_tensor(f"{what}: its {name}", value, tuple(theta.shape), f"{name} keeps theta's shape and "
                                  "dtype", dtype=theta.dtype)
            else:
                out = fn(th, g, m, v, t)
            th, m, v = (o.detach().clone() for o in out)
            states.append((th, m, v))
        return states

    def same(a: list, b: list) -> bool:
        return all(close(x, y, rtol=1e-9, atol=1e-13) for sa, sb in zip(a, b) for x, y in zip(sa, sb))

    def reference(mistake: str | None = None, **form: Any) -> list:
        return trajectory(lambda th, g, m, v, t: adamw_step(th, g, m, v, t, **hp, mistake=mistake, **form), False)

    mine = trajectory(adamw_update, True)
    forms = [reference(**form) for form in adamw_forms()]
    if any(same(mine, right) for right in forms):
        return
    if close(mine[0][1], torch.zeros_like(theta)) or close(mine[0][2], torch.zeros_like(theta)):
        fail(f"{label}: m or v comes back unchanged (zeros after the first step)",
             "return the updated moments, so that the next step starts from them")
    name_adamw_mistake(lambda mistake: any(same(mine, reference(mistake, **form)) for form in adamw_forms()),
                       list(mine[0]), f"{label}, 3 steps")
    for k, ((_, m, v), (_, m_r, v_r)) in enumerate(zip(mine, forms[0]), start=1):
        if not close(m, m_r, rtol=1e-9, atol=1e-13):
            fail(f"{label}: m after step t={k} is not the moving average of g",
                 "each step keeps the fraction β1 of the old m and adds (1 − β1) of the new gradient")
        if not close(v, v_r, rtol=1e-9, atol=1e-13):
            fail(f"{label}: v after step t={k} is not the moving average of g²",
                 "each step keeps the fraction β2 of the old v and adds (1 − β2) of the squared gradient")
    step, worst = first_divergence([[th] for th, _, _ in mine], [[[th] for th, _, _ in right] for right in forms],
                                   rtol=1e-9, atol=1e-13)
    fail(f"{label}: theta after step t={step} differs from AdamW's by up to {worst:.3g}", ADAMW_UNNAMED_FIX)


def check_warmup_cosine(warmup_cosine: Callable[..., float]) -> None:
    """Check ``warmup_cosine(it, max_lr, min_lr, warmup_iters, cosine_cycle_iters)``: the learning rate at iteration
    ``it``, at every it from 0 to T_c + 5, for three settings.

    Mistakes it recognises: off by one at the start of the warm-up ((it + 1)/T_w); a warm-up from min_lr; off by one
    at the start of the cosine or at its end; the cosine's progress over T_c instead of T_c − T_w; cos not mapped to
    [0, 1]; max and min swapped; after T_c, the cosine rising again or the rate 0.
    """
    diagnose_schedule("warmup_cosine", warmup_cosine, [(1.0, 0.1, 7, 21), (3e-4, 3e-5, 0, 10), (0.5, 0.05, 3, 4)])
    passed("warmup_cosine: 0 → max_lr linearly over T_w, a half cosine down to min_lr at T_c, then min_lr; every it "
           "to T_c + 5, three settings")


def check_clip_grads(clip_grads: Callable[[list[torch.Tensor], float], Any]) -> None:
    """Check ``clip_grads(grads, max_l2_norm)``: one global L2 norm over every entry of every tensor in ``grads``; when
    it is above max_l2_norm, every tensor is multiplied in place by max_l2_norm / (norm + 1e-6). Returns the norm.

    Checked on three tensors whose global norm is above the maximum, below it, and tiny (where the 1e-6 shows).
    Mistakes it recognises: each tensor clipped by its own norm (per-parameter norms); the norm as the sum of the
    tensors' norms, or without its square root; the norm accumulated in float32 for float64 tensors; the 1e-6
    missing; scaling when the norm is below the maximum (small gradients scaled up); the tensors not changed in place;
    the norm returned wrong; torch.nn.utils.clip_grad_norm_ used.
    """
    gen = generator(3)
    base = [torch.randn(3, 4, generator=gen, dtype=torch.float64), torch.randn(5, generator=gen, dtype=torch.float64),
            torch.randn(2, 2, 2, generator=gen, dtype=torch.float64)]
    total = math.sqrt(sum(t.pow(2).sum().item() for t in base))
    for name, grads, max_norm in [("above", base, 0.5 * total), ("below", base, 2.0 * total),
                                  ("tiny", [1e-4 * t for t in base], 0.5e-4 * total)]:
        norm = math.sqrt(sum(t.pow(2).sum().item() for t in grads))
        what = f"clip_grads(3 tensors of global norm {norm:.3g}, max_l2_norm={max_norm:.3g})"
        mine = [t.clone() for t in grads]
        out = call_without_builtins(what, CLIPPING_BUILTINS, "compute the norm and scale the tensors yourself (the "
                                    "built-in is only the checks' reference)", clip_grads, mine, max_norm)
        expected = clip_expected(grads, max_norm)
        if not all(close(a, b, rtol=1e-9, atol=1e-15) for a, b in zip(mine, expected)):
            if name == "above" and all(torch.equal(a, g) for a, g in zip(mine, grads)):
                fail(f"{what} leaves the tensors as they were: they are not scaled in place",
                     "multiply each tensor in place (its mul_ method); a new tensor bound to a name changes nothing")
            name_clipping_mistake(mine, grads, max_norm, what, rtol=1e-9)
            worst = max((a - b).abs().max().item() for a, b in zip(mine, expected))
            fail(f"{what} differs from torch.nn.utils.clip_grad_norm_ by up to {worst:.3g}",
                 "one norm over every entry of every tensor; above the maximum, scale all of them by "
                 "max_l2_norm / (norm + 1e-6)")
        try:
            returned = float(out)
        except (TypeError, ValueError):
            fail(f"{what} returned {describe(out)}, not the global norm", "return the norm before clipping (a number "
                 "or a 0-d tensor): the training loop logs it")
        if float32_rounded(returned, norm):
            fail(*CLIPPING_MISTAKES["float32_norm"],
                 f"{what} returned {returned:.10g}, where float64 gives {norm:.10g}")
        if not math.isclose(returned, norm, rel_tol=1e-9):
            fail(f"{what} returned {returned:.6g}, not the global norm before clipping, {norm:.6g}",
                 "return the norm you computed, before the tensors were scaled")
    passed("clip_grads: one global L2 norm; every tensor scaled in place by max/(norm + 1e-6) above the maximum, "
           "left alone below it; the norm returned")


def check_sample_windows(sample_windows: Callable[..., Any]) -> None:
    """Check ``sample_windows(tokens, batch_size, context_length, generator)`` -> (inputs, targets), each of shape
    (batch_size, context_length): each row a window of consecutive tokens from a start drawn uniformly (with the
    torch.Generator given) from every valid start, 0 … len(tokens) − context_length − 1, and the targets the same
    windows shifted by one token.

    Mistakes it recognises: the targets not shifted, or shifted the wrong way; rows one token too long; batch and
    context swapped; rows that are not consecutive tokens; the last valid start never drawn (torch.randint's high is
    exclusive); start 0 never drawn; a start past the last valid one; starts not uniform; the generator ignored.
    """
    tokens = np.arange(50, dtype=np.uint8) * 2  # even numbers: a shift by one token is a step of 2
    what = "sample_windows(tokens [0, 2, 4, …, 98], batch_size=6, context_length=5, generator)"
    x, y = _windows(sample_windows, tokens, 6, 5, generator(0), what)
    if not bool(((x[:, 1:] - x[:, :-1]) == 2).all()):
        fail(f"{what}: the rows of inputs are not windows of consecutive tokens",
             "each row holds the context_length tokens that follow one start")
    shift = torch.unique(y - x).tolist()
    if shift == [0]:
        fail(f"{what}: the targets are not shifted: they equal the inputs",
             "the targets are the next tokens: the window that starts one token later")
    if shift == [-2]:
        fail(f"{what}: the targets are shifted the wrong way (the previous tokens)",
             "the targets are the next tokens: the window that starts one token later")
    if shift != [2]:
        fail(f"{what}: the targets are not the inputs shifted by one token", "use the same start, one token later")
    again, _ = _windows(sample_windows, tokens, 6, 5, generator(0), what)
    other, _ = _windows(sample_windows, tokens, 6, 5, generator(1), what)
    if not torch.equal(x, again) or torch.equal(x, other):
        fail(f"{what}: the starts do not come from the generator given (the same seed gives other windows, or "
             "another seed the same)", "draw the starts from the generator given, so that its seed decides them")
    n, context, rows = 12, 4, 4000
    what = f"sample_windows(12 tokens, batch_size={rows}, context_length={context}, generator)"
    x, _ = _windows(sample_windows, np.arange(n, dtype=np.uint8) * 2, rows, context, generator(2), what)
    counts = torch.bincount((x[:, 0] // 2).long(), minlength=n).tolist()
    last = n - context - 1
    if any(counts[last + 1:]):
        fail(f"{what} draws starts past the last valid one ({last}): the targets run off the end",
             "draw the starts from [0, len(tokens) − context_length)")
    if counts[last] == 0:
        fail(f"the last valid start, len(tokens) − context_length − 1 = {last}, is never drawn (in {rows} rows)",
             "torch.randint's high is exclusive: it must be len(tokens) − context_length itself",
             f"starts drawn: {counts[: last + 1]}")
    if counts[0] == 0:
        fail(f"start 0 is never drawn (in {rows} rows)", "draw the starts from [0, len(tokens) − context_length)")
    expected = rows / (last + 1)
    if any(abs(c - expected) > 0.3 * expected for c in counts[: last + 1]):
        fail(f"{what}: the starts are not uniform over 0 … {last}", "draw each start with torch.randint",
             f"starts drawn: {counts[: last + 1]} (about {expected:.0f} each expected)")
    passed("sample_windows: windows of consecutive tokens from every valid start (the last one included), uniformly, "
           "from the generator given; targets shifted by one")


def _windows(sample_windows: Callable[..., Any], tokens: np.ndarray, batch_size: int, context_length: int,
             gen: torch.Generator, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The learner's (inputs, targets) as int64 tensors, with their shapes checked."""
    with torch.random.fork_rng(devices=[]):
        try:
            out = call(what, sample_windows, tokens, batch_size, context_length, gen)
        except AssertionError as error:
            name_start_past_the_end(error, what, "tokens", len(tokens), context_length)
            raise
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        fail(f"{what} returned {describe(out)}, not a pair (inputs, targets)", "return both: inputs, targets")
    for i, t in enumerate(out):
        if not isinstance(t, np.ndarray):  # a numpy array, cut from the tokens, will do
            expect_tensor(f"{what}[{i}]", t, returns="return the inputs and the targets as tensors")
    x, y = (torch.as_tensor(np.ascontiguousarray(t)).long() for t in out)
    for name, t in (("inputs", x), ("targets", y)):
        if tuple(t.shape) == (batch_size, context_length + 1):
            fail(f"{what} returned {name} of shape {tuple(t.shape)}: one token too many per row",
                 f"each row has context_length = {context_length} tokens")
        if tuple(t.shape) == (context_length, batch_size):
            fail(f"{what} returned {name} of shape {tuple(t.shape)}: batch and context are swapped",
                 "one row per window: shape (batch_size, context_length)")
        if tuple(t.shape) != (batch_size, context_length):
            fail(f"{what} returned {name} of shape {tuple(t.shape)}, expected ({batch_size}, {context_length})",
                 "batch_size rows of context_length tokens")
    return x, y

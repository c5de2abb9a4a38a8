"""The step checks of notebook 11 pass the right steps and name each planted mistake on their first line."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mutants import ADAMW_MISTAKES, Catalogue, assert_random_state_kept
from transformer_from_scratch.checks.steps.training import (check_adamw_update, check_clip_grads, check_log_sum_exp,
                                                            check_mean_cross_entropy, check_sample_windows,
                                                            check_warmup_cosine)


# ---- the right steps, as the notebook writes them ---------------------------------------------------------------

def log_sum_exp(z):
    largest = z.max(dim=-1, keepdim=True).values
    return largest.squeeze(-1) + torch.log(torch.exp(z - largest).sum(dim=-1))


def mean_cross_entropy(logits, targets):
    return (log_sum_exp(logits) - logits[torch.arange(len(targets)), targets]).mean()


def adamw_update(theta, grad, m, v, t, lr, betas, eps, weight_decay, mistake=None):
    beta1, beta2 = betas[::-1] if mistake == "swapped" else betas
    g = grad + weight_decay * theta if mistake == "l2" else grad
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * (g if mistake == "v_of_g" else g * g)
    step = t - 1 if mistake == "t0" else t
    m_hat, v_hat = (m, v) if mistake == "no_bias" else (m / (1 - beta1**step), v / (1 - beta2**step))
    v_hat = v if mistake == "no_v_hat" else v_hat
    denominator = {"inside": (v_hat + eps).sqrt(), "no_sqrt": v_hat + eps}.get(mistake, v_hat.sqrt() + eps)
    update = lr * m_hat / denominator
    decay = {"l2": 0.0, "no_decay": 0.0, "alpha_t": lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)}.get(mistake, lr)
    if mistake == "moments_unchanged":
        return theta - update - decay * weight_decay * theta, torch.zeros_like(m), torch.zeros_like(v)
    return theta - update - decay * weight_decay * theta, m, v


def handout_adamw_update(theta, grad, m, v, t, lr, betas, eps, weight_decay):
    """The handout's form: one step size α_t, ε added to √v, the decay after the Adam step."""
    beta1, beta2 = betas
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad**2
    alpha_t = lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)
    theta = theta - alpha_t * m / (v.sqrt() + eps)
    return theta - lr * weight_decay * theta, m, v


def warmup_cosine(it, max_lr, min_lr, warmup_iters, cosine_cycle_iters):
    if it < warmup_iters:
        return max_lr * it / warmup_iters
    if it <= cosine_cycle_iters:
        progress = (it - warmup_iters) / (cosine_cycle_iters - warmup_iters)
        return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)
    return min_lr


def clip_grads(grads, max_l2_norm):
    norm = torch.sqrt(sum((g * g).sum() for g in grads))
    if norm > max_l2_norm:
        for g in grads:
            g.mul_(max_l2_norm / (norm + 1e-6))
    return norm


def sample_windows(tokens, batch_size, context_length, generator):
    starts = torch.randint(len(tokens) - context_length, (batch_size, 1), generator=generator).numpy()
    windows = tokens[starts + np.arange(context_length + 1)]
    return windows[:, :-1], windows[:, 1:]


# ---- the mistakes -----------------------------------------------------------------------------------------------

def _adamw(mistake):
    return lambda *args: adamw_update(*args, mistake=mistake)


def _schedule(progress=None, warmup=None, after=None, cosine=None, clamp=True):
    def wrong(it, max_lr, min_lr, warmup_iters, cosine_cycle_iters):
        if it < warmup_iters:
            return warmup(it, max_lr, min_lr, warmup_iters) if warmup else max_lr * it / warmup_iters
        if it > cosine_cycle_iters and after is not None:
            return after(it, max_lr, min_lr)
        if it > cosine_cycle_iters and clamp:
            return min_lr
        p = (progress or (lambda i, w, c: (i - w) / (c - w)))(it, warmup_iters, cosine_cycle_iters)
        return (cosine or (lambda lo, hi, p: lo + 0.5 * (1 + math.cos(math.pi * p)) * (hi - lo)))(min_lr, max_lr, p)
    return wrong


def _clip(norm_of=None, scale_of=None, always=False, in_place=True, per_tensor=False):
    def wrong(grads, max_l2_norm):
        norms = [g.norm() for g in grads]
        norm = norm_of(norms) if norm_of else torch.sqrt(sum(n**2 for n in norms))
        if per_tensor:
            for g, n in zip(grads, norms):
                if n > max_l2_norm:
                    g.mul_(max_l2_norm / (n + 1e-6))
            return norm
        if norm > max_l2_norm or always:
            scale = scale_of(norm, max_l2_norm) if scale_of else max_l2_norm / (norm + 1e-6)
            for k, g in enumerate(grads):
                if in_place:
                    g.mul_(scale)
                else:
                    g = g * scale  # noqa: F841 - the mistake: a new tensor, the list's is unchanged
        return norm
    return wrong


def _holding(grads):
    """Parameters whose .grad are these very tensors (so that clipping them clips the tensors)."""
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g
    return params


def _float32_norm(grads, max_l2_norm):
    """The sum of squares started from a float32 zero, as torch.zeros(()) or torch.tensor(0.0) makes it."""
    total = torch.zeros(())
    for g in grads:
        total += (g * g).sum()
    norm = total.sqrt()
    if norm > max_l2_norm:
        for g in grads:
            g.mul_(max_l2_norm / (norm + 1e-6))
    return norm


def _windows(draw=None, shift=1, extra=0, transpose=False, reverse=False):
    def wrong(tokens, batch_size, context_length, generator):
        high = len(tokens) - context_length
        starts = (draw(high, batch_size, generator) if draw else
                  torch.randint(high, (batch_size,), generator=generator)).numpy()[:, None]
        length = context_length + extra
        x = tokens[starts + np.arange(length)]
        y = tokens[np.clip(starts + shift + np.arange(length), 0, len(tokens) - 1)]
        if reverse:
            x, y = x[:, ::-1].copy(), y[:, ::-1].copy()
        return (x.T, y.T) if transpose else (x, y)
    return wrong


def _stacked_windows(tokens, batch_size, context_length, generator):
    """Rows sliced and stacked with torch.stack, from starts up to len − context_length: the last start's targets
    are one short."""
    starts = torch.randint(len(tokens) - context_length + 1, (batch_size,), generator=generator).tolist()
    data = torch.from_numpy(tokens.astype(np.int64))
    return (torch.stack([data[s:s + context_length] for s in starts]),
            torch.stack([data[s + 1:s + 1 + context_length] for s in starts]))


LSE_MUTANTS = [
    (lambda z: torch.log(torch.exp(z).sum(dim=-1)), "there is no max subtraction"),
    (lambda z: torch.log(torch.exp(z - z.max(dim=-1, keepdim=True).values).sum(dim=-1)), "never added back"),
    (lambda z: z.max() + torch.log(torch.exp(z - z.max()).sum(dim=-1)), "the max of the whole tensor"),
    (lambda z: log_sum_exp(z)[..., None], "kept with size 1"),
    (lambda z: z.max(dim=0).values + torch.log(torch.exp(z - z.max(dim=0, keepdim=True).values).sum(dim=0)),
     "sums over the rows"),
    (lambda z: torch.logsumexp(z, dim=-1), "calls PyTorch's own torch.logsumexp"),
]
rows = lambda z, y: torch.arange(len(y))  # noqa: E731
CE_MUTANTS = [
    (lambda z, y: (log_sum_exp(z) - z[rows(z, y), y]).sum(), "sum over the examples"),
    (lambda z, y: log_sum_exp(z) - z[rows(z, y), y], "one loss per row"),
    (lambda z, y: (z[rows(z, y), y] - log_sum_exp(z)).mean(), "sign is flipped"),
    (lambda z, y: log_sum_exp(z).mean() - z[:, y].mean(), "picks the wrong logits"),
    (lambda z, y: (log_sum_exp(z) - z.max(-1).values - z[rows(z, y), y]).mean(), "never adds it back"),
    (lambda z, y: ((log_sum_exp(z) - z[rows(z, y), y]) / math.log(2)).mean(), "log base 2"),
    (lambda z, y: ((log_sum_exp(z) - z[rows(z, y), y]) / z.shape[-1]).mean(), "vocabulary size as well"),
    (lambda z, y: -torch.log(torch.softmax(z, dim=-1)[rows(z, y), y]).mean(), "log of the softmax's probabilities"),
    (lambda z, y: F.cross_entropy(z, y), "calls PyTorch's own F.cross_entropy"),
]
ADAMW_MUTANTS = [(_adamw(key), phrase) for key, phrase in ADAMW_MISTAKES] + [
    (_adamw("moments_unchanged"), "m or v comes back unchanged"),
    (lambda *args: adamw_update(*args)[0], "not the three new tensors"),
]
SCHEDULE_MUTANTS = [
    (_schedule(warmup=lambda it, hi, lo, w: hi * (it + 1) / w), "off by one at the start of the warm-up"),
    (_schedule(warmup=lambda it, hi, lo, w: lo + (hi - lo) * it / w), "warm-up starts from min_learning_rate"),
    (_schedule(progress=lambda i, w, c: (i - w + 1) / (c - w)), "off by one at the start of the cosine"),
    (_schedule(progress=lambda i, w, c: (i - w) / (c - w + 1)), "off by one at the end of the cosine"),
    (_schedule(progress=lambda i, w, c: (i - w) / c), "not its length"),
    (_schedule(cosine=lambda lo, hi, p: lo + math.cos(math.pi * p) * (hi - lo)), "not mapped to [0, 1]"),
    (_schedule(cosine=lambda lo, hi, p: hi + 0.5 * (1 + math.cos(math.pi * p)) * (lo - hi)), "are swapped in the cosine"),
    (_schedule(clamp=False), "follows the cosine back up"),
    (_schedule(after=lambda it, hi, lo: 0.0), "drops to 0"),
    (lambda *args: 0.5, "is wrong from it = 0 on"),
]
CLIP_MUTANTS = [
    (_clip(per_tensor=True), "clipped by its own norm"),
    (_clip(norm_of=lambda norms: sum(norms)), "sum of the parameters' norms"),
    (_clip(norm_of=lambda norms: sum(n**2 for n in norms)), "never square-rooted"),
    (_clip(scale_of=lambda norm, most: most / norm), "without the 1e-6"),
    (_clip(always=True), "even when their norm is below the maximum"),
    (_clip(in_place=False), "not scaled in place"),
    (_float32_norm, "the norm is accumulated in float32"),
    (lambda grads, m: torch.nn.utils.clip_grad_norm_(_holding(grads), m), "calls PyTorch's own"),
    (lambda grads, m: clip_grads(grads, m).item() + 1.0, "not the global norm before clipping"),
]
WINDOW_MUTANTS = [
    (_windows(shift=0), "the targets are not shifted"),
    (_windows(shift=-1), "shifted the wrong way"),
    (_windows(extra=1), "one token too many"),
    (_windows(transpose=True), "batch and context are swapped"),
    (_windows(reverse=True), "not windows of consecutive tokens"),
    (_windows(draw=lambda high, n, g: torch.randint(high - 1, (n,), generator=g)),
     "len(tokens) − context_length − 1 = 7, is never drawn"),
    (_windows(draw=lambda high, n, g: torch.randint(1, high, (n,), generator=g)), "start 0 is never drawn"),
    (_windows(draw=lambda high, n, g: torch.randint(high + 1, (n,), generator=g)), "past the last valid one"),
    (_stacked_windows, "crashes with RuntimeError: it drew a start above 7, the last valid start"),
    (_windows(draw=lambda high, n, g: torch.multinomial(torch.arange(1.0, high + 1), n, replacement=True,
                                                        generator=g)), "not uniform"),
    (_windows(draw=lambda high, n, g: torch.randint(high, (n,))), "do not come from the generator"),
]
ALL = [(check_log_sum_exp, LSE_MUTANTS), (check_mean_cross_entropy, CE_MUTANTS), (check_adamw_update, ADAMW_MUTANTS),
       (check_warmup_cosine, SCHEDULE_MUTANTS), (check_clip_grads, CLIP_MUTANTS), (check_sample_windows, WINDOW_MUTANTS)]


def test_the_right_steps_pass_with_one_line(capsys):
    check_log_sum_exp(log_sum_exp)
    check_mean_cross_entropy(mean_cross_entropy)
    check_adamw_update(adamw_update)
    check_adamw_update(handout_adamw_update)
    check_warmup_cosine(warmup_cosine)
    check_clip_grads(clip_grads)
    check_sample_windows(sample_windows)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * 7, lines


def test_the_checks_keep_the_random_state():
    assert_random_state_kept(check_sample_windows, sample_windows)
    assert_random_state_kept(check_adamw_update, adamw_update)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with pytest.raises(AssertionError):
        check_sample_windows(WINDOW_MUTANTS[-2][0])  # draws from the global generator: the check puts it back
    assert torch.equal(torch.rand(3), expected)


# The random state is tested below, with a check that moved the global generator and put it back.
CATALOGUES = [Catalogue(check_log_sum_exp, LSE_MUTANTS), Catalogue(check_mean_cross_entropy, CE_MUTANTS),
              Catalogue(check_adamw_update, ADAMW_MUTANTS), Catalogue(check_warmup_cosine, SCHEDULE_MUTANTS),
              Catalogue(check_clip_grads, CLIP_MUTANTS), Catalogue(check_sample_windows, WINDOW_MUTANTS)]

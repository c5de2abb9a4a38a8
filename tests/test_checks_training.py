"""The checks of notebook 11 pass the course's training module and name every planted mistake on their first line."""

import io
import math

import numpy as np
import torch
import torch.nn.functional as F

from mutants import ADAMW_MISTAKES, Catalogue
from transformer_from_scratch import (AdamW, cross_entropy, get_batch, gradient_clipping, load_checkpoint,
                                      lr_cosine_schedule, save_checkpoint)
from transformer_from_scratch.checks import (check_adamw, check_checkpoint, check_cross_entropy, check_get_batch,
                                             check_gradient_clipping, check_lr_cosine_schedule)


# ---- cross_entropy ----------------------------------------------------------------------------------------------

def _ce(upcast=True, max_shift=True, pick=None, reduce=None, end=None, via_probs=False, flatten=True):
    """A hand-written cross-entropy with one thing changed."""
    def wrong(inputs, targets):
        z = inputs.float() if upcast and inputs.dtype in (torch.float16, torch.bfloat16) else inputs
        if flatten:
            z, targets = z.reshape(-1, z.shape[-1]), targets.reshape(-1)
        rows = torch.arange(len(targets))
        if via_probs:
            shifted = z - z.max(dim=-1, keepdim=True).values
            probs = torch.exp(shifted) / torch.exp(shifted).sum(dim=-1, keepdim=True)
            losses = -torch.log(probs[rows, targets])
        else:
            m = z.max(dim=-1, keepdim=True).values if max_shift else torch.zeros_like(z[..., :1])
            lse = m.squeeze(-1) + torch.log(torch.exp(z - m).sum(dim=-1))
            losses = lse - (pick(z, targets) if pick else z[rows, targets])
        loss = reduce(losses) if reduce else losses.mean()
        return end(loss) if end else loss
    return wrong


CE_MUTANTS = [
    (_ce(max_shift=False), "there is no max subtraction"),
    (_ce(via_probs=True), "log of the softmax's probabilities"),
    (_ce(reduce=lambda l: l.sum()), "sum over the examples"),
    (_ce(reduce=lambda l: l), "one loss per example"),
    (_ce(end=lambda l: -l), "its sign is flipped"),
    (_ce(pick=lambda z, y: z[:, y].mean(dim=-1)), "picks the wrong logits"),
    (_ce(end=lambda l: l / math.log(2)), "log base 2"),
    (_ce(end=lambda l: l.item()), "returned a Python float"),
    (_ce(upcast=False), "not upcast"),
    (lambda inputs, targets: _ce(upcast=False)(inputs, targets).to(torch.promote_types(inputs.dtype, torch.float32)),
     "converted only at the end"),
    (_ce(flatten=False), "does not handle leading dimensions"),
    (lambda inputs, targets: _ce()(inputs.detach(), targets), "carries no gradient"),
    (lambda inputs, targets: F.cross_entropy(inputs.reshape(-1, inputs.shape[-1]), targets.reshape(-1)),
     "calls PyTorch's own F.cross_entropy"),
]


def _max_not_added_back(inputs, targets):
    z, targets = inputs.reshape(-1, inputs.shape[-1]), targets.reshape(-1)
    shifted = z - z.max(dim=-1, keepdim=True).values
    return (torch.log(torch.exp(shifted).sum(dim=-1)) - z[torch.arange(len(targets)), targets]).mean()


def _per_position(inputs, targets):
    """The loss of every example, in the targets' shape (leading axes kept)."""
    z = inputs.float() if inputs.dtype in (torch.float16, torch.bfloat16) else inputs
    m = z.max(dim=-1, keepdim=True).values
    return m.squeeze(-1) + torch.log(torch.exp(z - m).sum(dim=-1)) - z.gather(-1, targets[..., None]).squeeze(-1)


def _batch_axis_only(inputs, targets):
    losses = _per_position(inputs, targets)
    return losses.sum(dim=-1).mean() if losses.ndim > 1 else losses.mean()


CE_MUTANTS += [(_max_not_added_back, "never adds it back"),
               (_batch_axis_only, "averages over the batch axis only"),
               (lambda inputs, targets: _per_position(inputs, targets).mean(dim=0), "the mean runs over one axis only"),
               (lambda inputs, targets: _ce()(inputs, targets) / inputs.shape[-1], "divides by the vocabulary size")]


# ---- AdamW ------------------------------------------------------------------------------------------------------

class MutantAdamW(torch.optim.Optimizer):
    """AdamW written by hand, with `mistake` planted (None: right)."""

    mistake = None

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.lr, self.t = lr, 0

    @torch.no_grad()
    def step(self, closure=None):
        mk = self.mistake
        self.t += 1
        for group in self.param_groups:
            source = self.defaults if mk == "groups" else group
            lr = self.lr if mk == "lr_once" else source["lr"]
            (b1, b2), eps, wd = source["betas"], source["eps"], source["weight_decay"]
            if mk == "swapped":
                b1, b2 = b2, b1
            for p in group["params"]:
                if mk == "frozen_decays":
                    p.mul_(1 - lr * wd)
                if p.grad is None and mk != "none_crash":
                    continue
                state = self.state[p] if mk != "no_state" else self.__dict__.setdefault("moments", {}).setdefault(p, {})
                if not state:
                    state.update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                state["step"] += 1
                t = self.t if mk == "step_outside" else state["step"]
                g = p.grad + wd * p if mk == "l2" else p.grad
                m, v = state["m"], state["v"]
                if mk == "rebound":  # the mistake: new tensors bound to the names, the state keeps its zeros
                    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
                else:
                    m.mul_(b1).add_(g, alpha=1 - b1)
                    v.mul_(b2).add_(g if mk == "v_of_g" else g * g, alpha=1 - b2)
                tt = t - 1 if mk == "t0" else t
                alpha_t = lr if mk == "no_bias" else lr * math.sqrt(1 - b2**tt) / (1 - b1**tt)
                if mk == "no_v_hat":
                    alpha_t = lr / (1 - b1**tt)
                denominator = {"inside": lambda: (v + eps).sqrt(), "no_sqrt": lambda: v + eps}.get(mk, lambda: v.sqrt() + eps)()
                decay = 0.0 if mk in ("l2", "no_decay", "frozen_decays") else (alpha_t if mk == "alpha_t" else lr) * wd
                target = p.clone() if mk == "unchanged" else p
                target.mul_(1 - decay)
                target.addcdiv_(m, denominator, value=-alpha_t)
        return None


def _adamw(mistake, **overrides):
    return type(f"AdamW_{mistake}", (MutantAdamW,), {"mistake": mistake, **overrides})


class NoGradDecorator(MutantAdamW):
    def step(self, closure=None):  # the mistake: no @torch.no_grad()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.mul_(0.99)


class NotAnOptimizer:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        self.params = list(params)


class WrongDefault(MutantAdamW):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, lr, betas, eps, weight_decay)


ADAMW_MUTANTS = [(_adamw(key), phrase) for key, phrase in ADAMW_MISTAKES] + [
    (_adamw("rebound"), "m and v are not kept from one step to the next"),
    (_adamw("unchanged"), "leaves the parameters as they were"),
    (_adamw("none_crash"), "crashes on a parameter whose .grad is None"),
    (_adamw("frozen_decays"), "a parameter whose .grad is None changes"),
    (NoGradDecorator, "changes a parameter in place while autograd records it"),
    (_adamw("groups"), "updated with the defaults"),
    (_adamw("lr_once"), "read once, in __init__"),
    (_adamw("step_outside"), "kept outside self.state"),
    (_adamw("no_state"), "holds no state"),
    (NotAnOptimizer, "is not a torch.optim.Optimizer"),
    (WrongDefault, "default weight_decay"),
]


# ---- lr_cosine_schedule -----------------------------------------------------------------------------------------

def _schedule(warmup=None, progress=None, cosine=None, clamp=True, after=None):
    def wrong(it, max_learning_rate, min_learning_rate, warmup_iters, cosine_cycle_iters):
        hi, lo, w, c = max_learning_rate, min_learning_rate, warmup_iters, cosine_cycle_iters
        if it < w:
            return warmup(it, hi, lo, w) if warmup else hi * it / w
        if it > c and after is not None:
            return after
        if it > c and clamp:
            return lo
        p = progress(it, w, c) if progress else (it - w) / (c - w)
        return cosine(lo, hi, p) if cosine else lo + 0.5 * (1 + math.cos(math.pi * p)) * (hi - lo)
    return wrong


SCHEDULE_MUTANTS = [
    (_schedule(warmup=lambda it, hi, lo, w: hi * (it + 1) / w), "off by one at the start of the warm-up"),
    (_schedule(warmup=lambda it, hi, lo, w: lo + (hi - lo) * it / w), "warm-up starts from min_learning_rate"),
    (_schedule(progress=lambda i, w, c: (i - w + 1) / (c - w)), "off by one at the start of the cosine"),
    (_schedule(progress=lambda i, w, c: (i - w) / (c - w + 1)), "off by one at the end of the cosine"),
    (_schedule(progress=lambda i, w, c: (i - w) / c), "not its length"),
    (_schedule(cosine=lambda lo, hi, p: lo + math.cos(math.pi * p) * (hi - lo)), "not mapped to [0, 1]"),
    (_schedule(cosine=lambda lo, hi, p: hi + 0.5 * (1 + math.cos(math.pi * p)) * (lo - hi)), "are swapped in the cosine"),
    (_schedule(clamp=False), "follows the cosine back up"),
    (_schedule(after=0.0), "drops to 0"),
    (lambda it, max_learning_rate, min_learning_rate, warmup_iters, cosine_cycle_iters: torch.ones(2), "not a number"),
]


# ---- gradient_clipping ------------------------------------------------------------------------------------------

def _clip(norm_of=None, no_eps=False, always=False, in_place=True, per_parameter=False, twice=False, skip_none=True):
    def wrong(parameters, max_l2_norm):
        if twice:
            norm = torch.sqrt(sum((p.grad**2).sum() for p in parameters if p.grad is not None))
            grads = [p.grad for p in parameters if p.grad is not None]  # empty for a generator: it was used up
        else:
            grads = [p.grad for p in parameters if p.grad is not None or not skip_none]
            norms = [g.norm() for g in grads]
            norm = norm_of(norms) if norm_of else torch.sqrt(sum(n**2 for n in norms))
        if per_parameter:
            for g in grads:
                if g.norm() > max_l2_norm:
                    g.mul_(max_l2_norm / (g.norm() + 1e-6))
            return norm
        if norm > max_l2_norm or always:
            scale = max_l2_norm / (norm if no_eps else norm + 1e-6)
            for g in grads:
                if in_place:
                    g.mul_(scale)
                else:
                    g = g * scale  # noqa: F841 - the mistake: a new tensor, p.grad unchanged
        return norm
    return wrong


CLIP_MUTANTS = [
    (_clip(per_parameter=True), "clipped by its own norm"),
    (_clip(norm_of=sum), "sum of the parameters' norms"),
    (_clip(norm_of=lambda norms: sum(n**2 for n in norms)), "never square-rooted"),
    (_clip(no_eps=True), "without the 1e-6"),
    (_clip(always=True), "even when their norm is below the maximum"),
    (_clip(in_place=False), "not scaled in place"),
    (_clip(skip_none=False), "crashes on a parameter whose .grad is None"),
    (_clip(twice=True), "iterated twice"),
    (lambda parameters, max_l2_norm: torch.nn.utils.clip_grad_norm_(parameters, max_l2_norm), "calls PyTorch's own"),
]


# ---- get_batch --------------------------------------------------------------------------------------------------

def _batch(high=lambda n, c: n - c, low=0, shift=1, dtype=np.int64, move=True, transpose=False, reverse=False,
           weights=False):
    def wrong(dataset, batch_size, context_length, device):
        top = high(len(dataset), context_length)
        if weights:
            starts = torch.multinomial(torch.arange(1.0, top + 1), batch_size, replacement=True).numpy()
        else:
            starts = torch.randint(low, top, (batch_size,)).numpy()
        first = starts[:, None] + max(0, -shift)  # shifted the wrong way: the inputs start one token later
        x = dataset[first + np.arange(context_length)]
        y = dataset[np.clip(first + shift + np.arange(context_length), 0, len(dataset) - 1)]
        if reverse:
            x, y = x[:, ::-1].copy(), y[:, ::-1].copy()
        x, y = (torch.from_numpy(a.astype(dtype)) for a in (x, y))
        if move:
            x, y = x.to(device), y.to(device)
        return (x.T, y.T) if transpose else (x, y)
    return wrong


def _stacked_slices(dataset, batch_size, context_length, device):
    """Rows sliced and stacked, from starts up to len − context_length: the last start's targets are one short."""
    starts = torch.randint(len(dataset) - context_length + 1, (batch_size,)).tolist()
    x = np.stack([dataset[s:s + context_length] for s in starts]).astype(np.int64)
    y = np.stack([dataset[s + 1:s + 1 + context_length] for s in starts]).astype(np.int64)
    return torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)


BATCH_MUTANTS = [
    (_batch(shift=0), "the targets are not shifted"),
    (_batch(shift=-1), "shifted the wrong way"),
    (_batch(shift=2), "shifted by [2]"),
    (_batch(reverse=True), "not windows of consecutive tokens"),
    (_batch(transpose=True), "batch and context are swapped"),
    (_batch(dtype=np.uint8), "the token file's uint8 was kept"),
    (_batch(dtype=np.int32), "returned torch.int32"),
    (_batch(move=False), "the device argument is ignored"),
    (_batch(high=lambda n, c: n - c - 1), "len(dataset) − context_length − 1 = 7, is never drawn"),
    (_batch(low=1), "start 0 is never drawn"),
    (_batch(high=lambda n, c: n - c + 1), "past the last valid one"),
    (_stacked_slices, "crashes with ValueError: it drew a start above 7, the last valid start"),
    (_batch(weights=True), "not uniform"),
    (lambda dataset, batch_size, context_length, device: get_batch(dataset, batch_size, context_length, device)[0],
     "not a pair"),
]


# ---- checkpoints ------------------------------------------------------------------------------------------------

def _save(drop=None, whole_model=False, own_open=False, write_only=False, optimizer_key="optimizer"):
    def save(model, optimizer, iteration, out):
        checkpoint = {"model": model.state_dict(), optimizer_key: optimizer.state_dict(), "iteration": iteration}
        checkpoint.pop(drop, None)
        obj = model if whole_model else checkpoint
        if own_open:
            with open(out, "wb") as file:
                torch.save(obj, file)
        elif write_only:
            buffer = io.BytesIO()
            torch.save(obj, buffer)
            out.write(buffer.getvalue())
        else:
            torch.save(obj, out)
    return save


def _load(skip=None, returns=None):
    def load(src, model, optimizer):
        checkpoint = torch.load(src, weights_only=True)
        if skip != "model":
            model.load_state_dict(checkpoint["model"])
        if skip != "optimizer":
            optimizer.load_state_dict(checkpoint["optimizer"])
        return returns(checkpoint) if returns else checkpoint["iteration"]
    return load


CHECKPOINT_MUTANTS = [
    ((_save(drop="iteration"), _load(returns=lambda c: 0)), "the iteration is not saved"),
    ((_save(drop="optimizer"), _load(skip="optimizer")), "the optimizer's state is not saved"),
    ((_save(drop="model"), _load(skip="model")), "the model's state_dict() is not saved"),
    ((_save(whole_model=True), _load()), "saves the model object itself"),
    ((_save(), _load(returns=lambda c: None)), "returns None"),
    ((_save(), _load(returns=lambda c: c["iteration"] + 1)), "not the saved iteration"),
    ((_save(), _load(skip="model")), "does not load the model's weights"),
    ((_save(), _load(skip="optimizer")), "does not load the optimizer's state"),
    ((_save(own_open=True), _load()), "crashes with an io.BytesIO"),
    ((_save(write_only=True), _load()), "crashes with a path (str)"),
    ((_save(optimizer_key="opt"), _load()), "reads the key 'optimizer', which save_checkpoint never writes"),
]


def _check_checkpoint(pair):
    check_checkpoint(*pair)


ALL = [(check_cross_entropy, CE_MUTANTS), (check_adamw, ADAMW_MUTANTS), (check_lr_cosine_schedule, SCHEDULE_MUTANTS),
       (check_gradient_clipping, CLIP_MUTANTS), (check_get_batch, BATCH_MUTANTS), (_check_checkpoint, CHECKPOINT_MUTANTS)]


def test_the_course_module_passes_with_one_line_each(capsys):
    check_cross_entropy(cross_entropy)
    check_adamw(AdamW)
    check_adamw(MutantAdamW)  # the handout's form (α_t, ε added to √v, the step count in the state) passes too
    check_lr_cosine_schedule(lr_cosine_schedule)
    check_gradient_clipping(gradient_clipping)
    check_get_batch(get_batch)
    check_checkpoint(save_checkpoint, load_checkpoint)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * 7, lines


def test_pytorch_own_adamw_passes():
    class TorchAdamW(torch.optim.AdamW):
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
            super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=False)

    check_adamw(TorchAdamW)


CATALOGUES = [Catalogue(check_cross_entropy, CE_MUTANTS, right=cross_entropy),
              Catalogue(check_adamw, ADAMW_MUTANTS, right=AdamW),
              Catalogue(check_lr_cosine_schedule, SCHEDULE_MUTANTS), Catalogue(check_gradient_clipping, CLIP_MUTANTS),
              Catalogue(check_get_batch, BATCH_MUTANTS, right=get_batch),
              Catalogue(_check_checkpoint, CHECKPOINT_MUTANTS, right=(save_checkpoint, load_checkpoint))]

# Generated from notebooks/11_training.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: f51fc8252ab763a61137de04a47fda8dc9687d3bb356e395d266dbe4f8c50408

import math
import numbers
import os
import pickle
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, Integer
from torch import Tensor, nn

from transformer_from_scratch.shapes import is_integer_dtype, shape_checked


class GPT2StyleLM(nn.Module):
    """A GPT-2-style decoder-only LM from PyTorch's own modules: the baseline next to TransformerLM (notebook 11).

    token_embeddings + position_embeddings (a learned table, context_length × d_model) -> `layers`, each
    x + proj(causal attention(qkv(LayerNorm(x)))), then x + down(GELU(up(LayerNorm(x)))) -> ln_final, a LayerNorm ->
    lm_head, an nn.Linear without bias (not tied to the embeddings). Biases in every other Linear and LayerNorm,
    GELU with tanh, attention by F.scaled_dot_product_attention, as in GPT-2. GPT-2's initialisation: weights
    N(0, 0.02²), the two projections back into the stream N(0, (0.02/√(2·num_layers))²), biases 0.
    Arguments as TransformerLM's without rope_theta. Raises ValueError for a size < 1, num_heads not dividing
    d_model, a sequence longer than context_length or an id outside [0, vocab_size).
    """

    def __init__(self, vocab_size: int, context_length: int, d_model: int, num_layers: int, num_heads: int,
                 d_ff: int, device=None, dtype=None) -> None:
        super().__init__()
        sizes = dict(vocab_size=vocab_size, context_length=context_length, d_model=d_model, num_layers=num_layers,
                     num_heads=num_heads, d_ff=d_ff)
        if min(sizes.values()) < 1 or d_model % num_heads:
            raise ValueError("GPT2StyleLM needs sizes >= 1 and num_heads dividing d_model, got "
                             + ", ".join(f"{k}={v}" for k, v in sizes.items()))
        self.vocab_size, self.context_length, self.num_heads = vocab_size, context_length, num_heads
        kw = dict(device=device, dtype=dtype)
        self.token_embeddings = nn.Embedding(vocab_size, d_model, **kw)
        self.position_embeddings = nn.Embedding(context_length, d_model, **kw)
        self.layers = nn.ModuleList(nn.ModuleDict(dict(
            ln1=nn.LayerNorm(d_model, **kw), qkv=nn.Linear(d_model, 3 * d_model, **kw), proj=nn.Linear(d_model, d_model, **kw),
            ln2=nn.LayerNorm(d_model, **kw), up=nn.Linear(d_model, d_ff, **kw), down=nn.Linear(d_ff, d_model, **kw),
        )) for _ in range(num_layers))
        self.ln_final = nn.LayerNorm(d_model, **kw)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False, **kw)
        for name, p in self.named_parameters():
            if p.ndim == 1 and name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.ndim == 2:
                residual = name.endswith(("proj.weight", "down.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * num_layers) if residual else 0.02)

    @shape_checked
    def forward(self, token_ids: Integer[Tensor, "*batch seq"]) -> Float[Tensor, "*batch seq vocab"]:
        """(..., seq) ids -> (..., seq, vocab_size) logits, each position seeing itself and the positions before."""
        _check_ids("GPT2StyleLM", token_ids, self.vocab_size, self.context_length)
        seq = token_ids.shape[-1]
        x = self.token_embeddings(token_ids) + self.position_embeddings(torch.arange(seq, device=token_ids.device))
        lead, x = x.shape[:-2], x.reshape(-1, seq, x.shape[-1])
        for layer in self.layers:
            q, k, v = layer["qkv"](layer["ln1"](x)).unflatten(-1, (3, self.num_heads, -1)).permute(2, 0, 3, 1, 4)
            x = x + layer["proj"](F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(-2))
            x = x + layer["down"](F.gelu(layer["up"](layer["ln2"](x)), approximate="tanh"))
        return self.lm_head(self.ln_final(x)).reshape(*lead, seq, -1)


def _check_ids(name: str, token_ids: Tensor, vocab_size: int, context_length: int) -> None:
    """A model's checks of its token ids, each an error that names the numbers."""
    if token_ids.ndim < 1 or not is_integer_dtype(token_ids.dtype):
        raise (ValueError if token_ids.ndim < 1 else TypeError)(
            f"{name} expects integer token ids of shape (..., seq), got dtype {token_ids.dtype} and shape "
            f"{tuple(token_ids.shape)}")
    if token_ids.shape[-1] > context_length:
        raise ValueError(f"{name}: the sequence has {token_ids.shape[-1]} tokens, more than context_length="
                         f"{context_length} (token_ids of shape {tuple(token_ids.shape)})")
    if token_ids.numel() and not torch.compiler.is_compiling():
        low, high = torch.stack(torch.aminmax(token_ids)).tolist()
        if low < 0 or high >= vocab_size:
            raise ValueError(f"{name}: token ids must be in [0, {vocab_size - 1}] (vocab_size={vocab_size}), got ids "
                             f"from {low} to {high}")


def _check_cross_entropy(inputs: Tensor, targets: Tensor) -> None:
    """cross_entropy's checks of its arguments, each an error that names the argument and what it got."""
    if not inputs.is_floating_point():
        raise TypeError(f"cross_entropy expects floating-point logits as inputs, got dtype {inputs.dtype}")
    if inputs.ndim < 1 or inputs.shape[-1] < 1:
        raise ValueError(f"cross_entropy expects inputs of shape (..., vocab), got shape {tuple(inputs.shape)}")
    if not is_integer_dtype(targets.dtype):
        raise TypeError(f"cross_entropy expects integer class ids as targets, got dtype {targets.dtype}")
    if tuple(targets.shape) != tuple(inputs.shape[:-1]):
        raise ValueError(f"cross_entropy: targets must have the logits' leading shape {tuple(inputs.shape[:-1])}, got "
                         f"targets of shape {tuple(targets.shape)} for inputs of shape {tuple(inputs.shape)}")
    if targets.numel() == 0:
        raise ValueError(f"cross_entropy needs at least one example, got inputs of shape {tuple(inputs.shape)}")
    if not torch.compiler.is_compiling():  # one read-back from the device; skipped inside torch.compile
        low, high = torch.stack(torch.aminmax(targets)).tolist()
        if low < 0 or high >= inputs.shape[-1]:
            raise ValueError(f"cross_entropy: targets must be class ids in [0, {inputs.shape[-1] - 1}] "
                             f"(vocab={inputs.shape[-1]}), got ids from {low} to {high}")


@shape_checked
def cross_entropy(inputs: Float[Tensor, "*batch vocab"], targets: Integer[Tensor, "*batch"]) -> Float[Tensor, ""]:
    """The mean cross-entropy of logits `inputs` (..., vocab) against class ids `targets` (...): a 0-d tensor.

    Per example, log Σ_j exp(z_j) − z[target] = −log softmax(z)[target], computed from the logits with the row's max
    subtracted first (exact at logits of ±1000, where exp overflows) and never through probabilities (one that
    underflows to 0 would make the loss infinite); then the mean over every example of every leading dimension.
    float16 and bfloat16 logits are computed in float32, and the loss is float32; float32 and float64 stay as they
    are. Equals F.cross_entropy(inputs.reshape(-1, vocab), targets.reshape(-1)).

    Raises:
        TypeError: logits that are not floating point, targets that are not integers.
        ValueError: targets not shaped like the logits without their last dimension, no example, an id outside
            [0, vocab).
    """
    _check_cross_entropy(inputs, targets)
    targets = targets.long()
    logits = inputs.to(torch.promote_types(inputs.dtype, torch.float32)).reshape(-1, inputs.shape[-1])
    shifted = logits - logits.max(dim=-1, keepdim=True).values
    target_logits = shifted.gather(-1, targets.reshape(-1, 1)).squeeze(-1)
    return (torch.log(torch.exp(shifted).sum(dim=-1)) - target_logits).mean()


def _check_adamw_arguments(lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    """AdamW's checks of its hyperparameters, each a ValueError that names the value."""
    if not lr >= 0:
        raise ValueError(f"AdamW: lr must be >= 0, got {lr}")
    if len(betas) != 2 or not all(0 <= beta < 1 for beta in betas):
        raise ValueError(f"AdamW: betas must be two numbers in [0, 1), got {betas}")
    if not eps >= 0:
        raise ValueError(f"AdamW: eps must be >= 0, got {eps}")
    if not weight_decay >= 0:
        raise ValueError(f"AdamW: weight_decay must be >= 0, got {weight_decay}")


class AdamW(torch.optim.Optimizer):
    """AdamW (Loshchilov and Hutter, 2019): Adam's per-coordinate step sizes, with decoupled weight decay.

    Per parameter θ with gradient g, at its step t = 1, 2, …:
        m ← β1·m + (1 − β1)·g and v ← β2·v + (1 − β2)·g² (moving averages of g and g², from 0);
        m̂ = m / (1 − β1^t), v̂ = v / (1 − β2^t) (their bias correction);
        θ ← θ − α·λ·θ − α·m̂ / (√v̂ + ε), both terms from θ before the step (the decay is decoupled: it never
        goes through m and v).
    The hyperparameters are read from each param group at every step, so a schedule can set group["lr"]. The state
    of each parameter, self.state[p] = {"step": t, "exp_avg": m, "exp_avg_sq": v}, is saved by state_dict(). Equals
    torch.optim.AdamW(params, lr, betas, eps, weight_decay) step for step; parameters without a gradient are skipped.

    Raises ValueError for lr < 0, a beta outside [0, 1), eps < 0 or weight_decay < 0.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01) -> None:
        _check_adamw_arguments(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        """Update every parameter that has a gradient; return closure()'s loss when a closure is given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps, weight_decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                bias1, bias2 = 1 - beta1**t, 1 - beta2**t
                p.mul_(1 - lr * weight_decay)
                p.addcdiv_(m, (v.sqrt() / math.sqrt(bias2)).add_(eps), value=-lr / bias1)
        return loss


def _check_count(name: str, value: Any, low: int = 0) -> None:
    """A count argument: an int (not a bool) >= low, else a TypeError or ValueError that names it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


def lr_cosine_schedule(it: int, max_learning_rate: float, min_learning_rate: float, warmup_iters: int,
                       cosine_cycle_iters: int) -> float:
    """The learning rate at iteration `it`: a linear warm-up, a cosine decay, then the minimum.

    it < T_w: α_max·it/T_w (from 0). T_w <= it <= T_c: α_min + ½·(1 + cos(π·(it − T_w)/(T_c − T_w)))·(α_max − α_min),
    from α_max down to α_min. it > T_c: α_min. (T_w = warmup_iters; T_c = cosine_cycle_iters, the iteration where
    the cosine ends, not its length.) Set it into every param group before each optimizer step.

    Raises:
        TypeError: it, warmup_iters or cosine_cycle_iters not an int.
        ValueError: it or warmup_iters < 0, cosine_cycle_iters <= warmup_iters, or not 0 <= α_min <= α_max.
    """
    _check_count("it", it)
    _check_count("warmup_iters", warmup_iters)
    _check_count("cosine_cycle_iters", cosine_cycle_iters)
    if cosine_cycle_iters <= warmup_iters:
        raise ValueError(f"lr_cosine_schedule: the cosine must end after the warm-up, cosine_cycle_iters > warmup_iters, "
                         f"got warmup_iters={warmup_iters}, cosine_cycle_iters={cosine_cycle_iters}")
    if not 0 <= min_learning_rate <= max_learning_rate:
        raise ValueError(f"lr_cosine_schedule needs 0 <= min_learning_rate <= max_learning_rate, got "
                         f"min_learning_rate={min_learning_rate}, max_learning_rate={max_learning_rate}")
    if it < warmup_iters:
        return max_learning_rate * it / warmup_iters
    if it > cosine_cycle_iters:
        return min_learning_rate
    progress = (it - warmup_iters) / (cosine_cycle_iters - warmup_iters)
    return min_learning_rate + 0.5 * (1 + math.cos(math.pi * progress)) * (max_learning_rate - min_learning_rate)


def gradient_clipping(parameters: Iterable[nn.Parameter], max_l2_norm: float) -> Tensor:
    """Clip the gradients of `parameters` in place to a global L2 norm of at most max_l2_norm; return the norm before.

    One norm over every entry of every gradient, in float32 at least. Every gradient is multiplied by
    min(1, max_l2_norm / (norm + 1e-6)), without asking the device whether the norm is above the maximum: above it,
    the norm becomes max_l2_norm (just below it, by the 1e-6); below it, nothing changes. Parameters without a
    gradient are skipped. Equals torch.nn.utils.clip_grad_norm_(parameters, max_l2_norm).

    Returns the global norm before clipping, a 0-d tensor (0 when no parameter has a gradient): log it.
    Raises ValueError when max_l2_norm is not > 0.
    """
    if not max_l2_norm > 0:
        raise ValueError(f"gradient_clipping: max_l2_norm must be > 0, got {max_l2_norm}")
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    squares = [g.detach().to(torch.promote_types(g.dtype, torch.float32)).pow(2).sum() for g in grads]
    norm = torch.stack(squares).sum().sqrt()
    scale = (max_l2_norm / (norm + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale.to(g.dtype))
    return norm


def tokenize_file(text_path: str | os.PathLike, token_path: str | os.PathLike | None = None) -> np.memmap:
    """The tokens of a UTF-8 text file, its bytes (ids 0-255: a vocabulary of 256), memory-mapped read-only.

    The ids are written once as a NumPy .npy file of uint8, by default next to the text (train.txt -> train.npy),
    and written again only when that file is missing, older than the text or of another length. It is written to
    a temporary file and renamed, so that processes starting together (torchrun) never read half a file. Nothing is
    read into memory until the array is indexed (get_batch reads only the windows it draws).

    Raises FileNotFoundError for a missing text file, ValueError for an empty one.
    """
    text_path = Path(text_path)
    if not text_path.is_file():
        raise FileNotFoundError(f"tokenize_file: no text file at {text_path}")
    size = text_path.stat().st_size
    if size == 0:
        raise ValueError(f"tokenize_file: {text_path} is empty, there are no tokens to read")
    token_path = text_path.with_suffix(".npy") if token_path is None else Path(token_path)
    try:
        fresh = (token_path.stat().st_mtime >= text_path.stat().st_mtime
                 and np.load(token_path, mmap_mode="r").shape == (size,))
    except (OSError, ValueError):
        fresh = False
    if not fresh:
        partial = token_path.with_name(f"{token_path.name}.{os.getpid()}.partial")
        with open(partial, "wb") as file:
            np.save(file, np.frombuffer(text_path.read_bytes(), dtype=np.uint8))
        os.replace(partial, token_path)
    return np.load(token_path, mmap_mode="r")


def _check_batch(dataset: Any, batch_size: Any, context_length: Any) -> None:
    """get_batch's checks, each a TypeError or ValueError that names the argument and its value."""
    if not isinstance(dataset, np.ndarray) or not np.issubdtype(dataset.dtype, np.integer):
        raise TypeError(f"get_batch expects the dataset as a NumPy array of integer token ids (a memmap of a token "
                        f"file, say), got {type(dataset).__name__} of dtype {getattr(dataset, 'dtype', None)}")
    if dataset.ndim != 1:
        raise ValueError(f"get_batch expects a 1-D dataset of token ids, got shape {dataset.shape}")
    _check_count("batch_size", batch_size, 1)
    _check_count("context_length", context_length, 1)
    if len(dataset) < context_length + 1:
        raise ValueError(f"get_batch: a window and its targets need context_length + 1 = {context_length + 1} tokens, "
                         f"got a dataset of {len(dataset)}")


@shape_checked
def get_batch(dataset: Integer[np.ndarray, "tokens"], batch_size: int, context_length: int, device: str | torch.device,
              *, generator: torch.Generator | None = None) -> tuple[Integer[Tensor, "batch context"], Integer[Tensor, "batch context"]]:
    """batch_size random windows of context_length tokens from `dataset` (inputs) and the windows shifted by one
    (targets), as int64 tensors (batch_size, context_length) on `device`.

    dataset: a 1-D array of integer token ids; a numpy.memmap of a token file reads only the windows drawn. The
    starts are drawn uniformly from 0 … len(dataset) − context_length − 1 (every start whose targets fit) with
    torch.randint and `generator`, a CPU torch.Generator (None: torch's global one): seed it for the same batches,
    save its get_state() to resume a run exactly. targets[i, j] is the token after inputs[i, j].

    Raises:
        TypeError: a dataset that is not a NumPy array of integers; a size that is not an int.
        ValueError: a dataset that is not 1-D or shorter than context_length + 1; batch_size or context_length < 1.
    """
    _check_batch(dataset, batch_size, context_length)
    starts = torch.randint(len(dataset) - context_length, (batch_size, 1), generator=generator).numpy()
    windows = dataset[starts + np.arange(context_length + 1)].astype(np.int64)
    windows = torch.from_numpy(windows).to(device)
    return windows[:, :-1], windows[:, 1:]


def _unwrap(model: nn.Module) -> nn.Module:
    """The module inside DistributedDataParallel / DataParallel and torch.compile wrappers (plain state-dict names)."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model


def save_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, iteration: int,
                    out: str | os.PathLike | BinaryIO, *, extra: dict[str, Any] | None = None) -> None:
    """Save what a run needs to go on with torch.save: a dict of the model's state dict, the optimizer's state dict
    and the iteration, under "model", "optimizer" and "iteration", plus "extra": extra when given (anything else a
    run restores: a data generator's state, its config).

    out: a path, written to a temporary file beside it and renamed over it (a run killed while saving leaves the
    previous checkpoint whole), or a binary file object. A model wrapped by DistributedDataParallel or torch.compile
    is saved under its own names. Raises TypeError / ValueError for an iteration that is not an int >= 0.
    """
    _check_count("iteration", iteration)
    model = _unwrap(model)
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iteration": int(iteration)}
    if extra is not None:
        checkpoint["extra"] = extra
    if isinstance(out, (str, os.PathLike)):
        out = Path(out)
        partial = out.with_name(f"{out.name}.{os.getpid()}.partial")
        torch.save(checkpoint, partial)
        os.replace(partial, out)
    else:
        torch.save(checkpoint, out)


def _read_checkpoint(src: str | os.PathLike | BinaryIO) -> dict[str, Any]:
    """torch.load(src) onto the CPU, tensors and plain data only, or a ValueError that says what is wrong."""
    name = src if isinstance(src, (str, os.PathLike)) else "the file object"
    try:
        checkpoint = torch.load(src, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, ValueError) as error:
        first = (str(error).strip().splitlines() or [""])[0].split(". ")[0]
        raise ValueError(f"load_checkpoint: {name} is not a readable checkpoint (truncated, or not written by "
                         f"torch.save): {first}") from error
    missing = [key for key in ("model", "optimizer", "iteration") if not isinstance(checkpoint, dict) or key not in checkpoint]
    if missing:
        raise ValueError(f"load_checkpoint: {name} is not a checkpoint of save_checkpoint, it lacks {missing}")
    return checkpoint


def _check_fits(weights: dict[str, Tensor], model: nn.Module) -> None:
    """The checkpoint's weights have the model's names and shapes, or a ValueError that lists what differs."""
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
    shapes = [f"{k} {tuple(weights[k].shape)} (the model's: {tuple(own[k].shape)})" for k in own
              if k in weights and weights[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        raise ValueError(f"load_checkpoint: the checkpoint's weights do not fit this {type(model).__name__}: missing "
                         f"{missing[:3]}{' …' if len(missing) > 3 else ''}, unexpected {unexpected[:3]}"
                         f"{' …' if len(unexpected) > 3 else ''}, other shapes {shapes[:3]}")


def load_checkpoint(src: str | os.PathLike | BinaryIO, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None) -> int:
    """Load a save_checkpoint checkpoint into `model` and `optimizer` (None: the weights only, to sample from them);
    return its iteration.

    Tensors are read onto the CPU and copied into the model's and the optimizer's own, on their devices, so a
    checkpoint saved on a GPU loads anywhere; torch.load(weights_only=True) runs no code from the file. The "extra"
    entry, if any, is torch.load(src, weights_only=True)["extra"].
    Raises ValueError naming what does not fit: not a readable checkpoint (truncated, say), a dict without "model",
    "optimizer" and "iteration", or weights with other names or shapes than the model's.
    """
    checkpoint = _read_checkpoint(src)
    model = _unwrap(model)
    _check_fits(checkpoint["model"], model)
    model.load_state_dict(checkpoint["model"])
    if optimizer is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["iteration"]

# Generated from notebooks/03_softmax.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: e8a2bcdba7c7d659f7b51769ffc362bd2b5a1044b7b1ba1ea95ddb9b8f7ac535

import torch
from jaxtyping import Float
from torch import Tensor

from transformer_from_scratch.shapes import shape_checked


@shape_checked
def softmax(x: Float[Tensor, "..."], dim: int) -> Float[Tensor, "..."]:
    """Softmax along `dim`: exp(x) / sum(exp(x)), computed without overflow.

    The maximum along `dim` is subtracted first. That changes nothing mathematically
    (softmax(x + c) = softmax(x) for any constant c), but every exponent becomes <= 0, so
    exp() cannot overflow and the largest term is exactly 1, so the sum cannot underflow to 0.

    Args:
        x: floating-point tensor of any shape. A 0-d tensor is a single score, as in
            torch.softmax: its dim is 0 (or -1) and its probability is 1.
        dim: the dimension to normalise over; negative values count from the end.

    Returns:
        A tensor of x's shape and dtype whose slices along `dim` are non-negative and sum to 1.
        An entry of -inf gets probability exactly 0. A slice that is entirely -inf has no
        distribution (0/0) and comes out as NaN, exactly as with torch.softmax: a silent
        made-up answer would hide a masking bug (attention handles fully masked rows itself).
        float16 and bfloat16 inputs are computed in float32 and cast back, like PyTorch does.
        x itself is left unchanged. The gradient is computed by hand, p ⊙ (g − ⟨g, p⟩), from the output p
        alone, with differentiable operations, so second derivatives work too.

    Raises:
        TypeError: x is not a floating-point tensor.
        IndexError: `dim` is out of range for x.ndim (for a 0-d x: anything but 0 and -1).
    """
    if not x.is_floating_point():
        raise TypeError(f"softmax expects a floating-point tensor, got dtype {x.dtype}: convert it with .float()")
    ndim = max(x.ndim, 1)  # PyTorch's rule: a 0-d tensor takes dim 0 or -1, like a 1-d one
    if not -ndim <= dim < ndim:
        raise IndexError(
            f"softmax: dim={dim} is out of range for x with x.ndim={x.ndim} and shape {tuple(x.shape)} "
            f"(expected {-ndim} <= dim <= {ndim - 1})"
        )
    if x.numel() == 0:  # nothing to normalise: an empty tensor gives an empty result, like torch
        return x.clone()
    return _Softmax.apply(x, dim)


class _Softmax(torch.autograd.Function):
    """softmax's forward pass, and its backward pass written by hand: dL/dx = p ⊙ (g − ⟨g, p⟩)."""

    @staticmethod
    def forward(ctx, x: Tensor, dim: int) -> Tensor:
        z = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        p = (z - z.amax(dim=dim, keepdim=True)).exp_()  # a new tensor: exp and divide it in place
        p /= p.sum(dim=dim, keepdim=True)
        p = p.to(x.dtype)
        ctx.save_for_backward(p)  # the backward pass needs the output only
        ctx.dim = dim
        return p

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor, None]:
        (p,) = ctx.saved_tensors
        p = p.float() if p.dtype in (torch.float16, torch.bfloat16) else p
        gp = g.to(p.dtype) * p
        gp.addcmul_(p, gp.sum(dim=ctx.dim, keepdim=True), value=-1)  # p ⊙ g − p ⟨g, p⟩, in place: gp is new
        return gp.to(g.dtype), None  # no gradient for `dim`

# Generated from notebooks/03_softmax.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: 179aeb52d1b02f8d7864bce374952b81719b2d4896bd0d06971007c56b20080c

import torch
from beartype import beartype
from jaxtyping import Float, jaxtyped
from torch import Tensor


@jaxtyped(typechecker=beartype)
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
        x itself is left unchanged, and gradients flow back to it.

    Raises:
        IndexError: `dim` is out of range for x.ndim (for a 0-d x: anything but 0 and -1).
    """
    ndim = max(x.ndim, 1)  # PyTorch's rule: a 0-d tensor takes dim 0 or -1, like a 1-d one
    if not -ndim <= dim < ndim:
        raise IndexError(
            f"softmax: dim={dim} is out of range for x with x.ndim={x.ndim} and shape {tuple(x.shape)} "
            f"(expected {-ndim} <= dim <= {ndim - 1})"
        )
    if x.numel() == 0:  # nothing to normalise: an empty tensor gives an empty result, like torch
        return x.clone()
    z = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    # The shift is a constant for each slice: the result does not depend on it, so no gradient flows through it.
    shifted = z - z.amax(dim=dim, keepdim=True).detach()
    exps = torch.exp(shifted)
    return (exps / exps.sum(dim=dim, keepdim=True)).to(x.dtype)

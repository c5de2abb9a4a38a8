# Generated from notebooks/03_softmax.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: a06ab6c59944b658f62377d275858d3c10b7dce1ab60a18484b7584465e1a900

import torch
from beartype import beartype
from jaxtyping import Float, jaxtyped
from torch import Tensor


_HALF_DTYPES = (torch.float16, torch.bfloat16)


@jaxtyped(typechecker=beartype)
def softmax(x: Float[Tensor, "..."], dim: int) -> Float[Tensor, "..."]:
    """Softmax along `dim`: exp(x) / sum(exp(x)), computed without overflow.

    The maximum along `dim` is subtracted first. That changes nothing mathematically
    (softmax(x + c) = softmax(x) for any constant c), but every exponent becomes <= 0, so
    exp() cannot overflow and the largest term is exactly 1, so the sum cannot underflow to 0.

    Args:
        x: floating-point tensor of any shape (at least one dimension).
        dim: the dimension to normalise over; negative values count from the end.

    Returns:
        A tensor of x's shape and dtype whose slices along `dim` are non-negative and sum to 1.
        An entry of -inf gets probability exactly 0. A slice that is entirely -inf has no
        distribution (0/0) and comes out as NaN, exactly as with torch.softmax: a silent
        made-up answer would hide a masking bug (attention handles fully masked rows itself).
        float16 and bfloat16 inputs are computed in float32 and cast back, like PyTorch does.

    Raises:
        IndexError: `dim` is out of range for x.ndim.
    """
    if x.ndim == 0:
        raise IndexError(f"softmax: x is 0-d (shape ()), so dim={dim} is out of range: there is no dimension to normalise over")
    if not -x.ndim <= dim < x.ndim:
        raise IndexError(
            f"softmax: dim={dim} is out of range for x with x.ndim={x.ndim} and shape {tuple(x.shape)} "
            f"(expected {-x.ndim} <= dim <= {x.ndim - 1})"
        )
    if x.shape[dim] == 0:  # nothing to normalise: an empty slice gives an empty result, like torch
        return x.clone()
    z = x.float() if x.dtype in _HALF_DTYPES else x
    # The shift is a constant for each slice: the result does not depend on it, so no gradient flows through it.
    shifted = z - z.amax(dim=dim, keepdim=True).detach()
    exps = torch.exp(shifted)
    return (exps / exps.sum(dim=dim, keepdim=True)).to(x.dtype)

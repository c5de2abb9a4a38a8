# Generated from notebooks/07_swiglu.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: f048bd05a3cd9eb32b9d3f82df8c9d9722469bc742b88e8a767b8f8b2bd612b4

import torch
from jaxtyping import Float
from torch import Tensor, nn

from transformer_from_scratch.linear import Linear
from transformer_from_scratch.shapes import shape_checked


def swiglu_hidden_size(d_model: int, multiple_of: int = 64) -> int:
    """The canonical SwiGLU width: 8/3 · d_model, rounded UP to a multiple of `multiple_of`.

    Three d_model × d_ff matrices then hold at least the weights of a two-matrix FFN of width 4 · d_model
    (3 · d_model · d_ff >= 8 · d_model²), as Meta's Llama code rounds. Computed with integers, so it is exact
    for any size. Examples: 768 -> 2048 (8/3 · 768 exactly), 512 -> 1408 (1365.3 rounded up), and with
    multiple_of=256, 4096 -> 11008 (Llama 7B's width).

    Raises:
        TypeError: d_model or multiple_of is not an int (a width is a whole number: 768, not 768.0).
        ValueError: d_model or multiple_of is not positive.
    """
    for name, value in [("d_model", d_model), ("multiple_of", multiple_of)]:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"swiglu_hidden_size: {name} must be an int, got {value!r} ({type(value).__name__})")
    if d_model < 1 or multiple_of < 1:
        raise ValueError(f"swiglu_hidden_size needs positive sizes, got d_model={d_model}, multiple_of={multiple_of}")
    step = 3 * multiple_of  # d_ff = multiple_of · ceil(8 · d_model / (3 · multiple_of)), with ceil(a / b) = (a + b - 1) // b
    return (8 * d_model + step - 1) // step * multiple_of


@shape_checked
def silu(x: Float[Tensor, "..."]) -> Float[Tensor, "..."]:
    """SiLU (Swish with β = 1): silu(x) = x · sigmoid(x), element by element.

    Any shape and any floating dtype; the result has x's shape and dtype, and gradients flow through it.
    Integer and bool tensors are refused with a TypeError: convert with .float() first.
    """
    if not x.is_floating_point():
        raise TypeError(f"silu expects a floating-point tensor, got dtype {x.dtype}: convert it with .float()")
    return x * torch.sigmoid(x)


class SwiGLU(nn.Module):
    """The SwiGLU feed-forward network: FFN(x) = w2(silu(w1 x) ⊙ w3 x), over any leading dimensions.

    Three bias-free `Linear` layers (notebook 01), named as the course's checkpoints name them:
    `w1`: d_model -> d_ff, weight (d_ff, d_model), the gate's input;
    `w3`: d_model -> d_ff, weight (d_ff, d_model), the value path;
    `w2`: d_ff -> d_model, weight (d_model, d_ff), back to the model's width.
    ⊙ is the element-wise product.

    Args:
        d_model: size of the input's and the output's last dimension.
        d_ff: the hidden width; canonically swiglu_hidden_size(d_model), about 8/3 · d_model.
        device, dtype: where, and in which dtype, to create the weights.

    Raises:
        ValueError (from Linear): a size is not positive, or the input's last dimension is not d_model.
    """

    def __init__(self, d_model: int, d_ff: int, device=None, dtype=None) -> None:
        super().__init__()
        if d_model < 1 or d_ff < 1:
            raise ValueError(f"SwiGLU needs positive sizes, got d_model={d_model}, d_ff={d_ff}")
        self.d_model = d_model
        self.d_ff = d_ff
        self.w1 = Linear(d_model, d_ff, device=device, dtype=dtype)
        self.w2 = Linear(d_ff, d_model, device=device, dtype=dtype)
        self.w3 = Linear(d_model, d_ff, device=device, dtype=dtype)

    @shape_checked
    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """w2(silu(w1 x) ⊙ w3 x): (..., d_model) -> (..., d_model)."""
        return self.w2(silu(self.w1(x)) * self.w3(x))

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_ff={self.d_ff}"

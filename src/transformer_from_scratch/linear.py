# Generated from notebooks/01_linear.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: 4ab0b5d0df95ee3aef2212e22a69e32dc57e7ebb7b9a08a719fc8f8b1339417b

import math

import torch
from jaxtyping import Float
from torch import Tensor, nn

from transformer_from_scratch.shapes import shape_checked


class Linear(nn.Module):
    """A linear map y = W x with no bias, applied over any number of leading dimensions.

    Its one parameter, `weight`, has shape (out_features, in_features), like torch.nn.Linear, and
    starts as N(0, σ²) with σ² = 2 / (in_features + out_features), truncated at ±3σ.

    Args:
        in_features: size d_in of the input's last dimension.
        out_features: size d_out of the output's last dimension.
        device: where to create the weight (default: torch's default device).
        dtype: the weight's dtype (default: torch's default dtype).
    """

    def __init__(self, in_features: int, out_features: int, device=None, dtype=None) -> None:
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise ValueError(f"Linear needs positive sizes, got in_features={in_features}, out_features={out_features}")
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Fill `weight` in place with N(0, σ²), σ² = 2 / (in_features + out_features), cut at ±3σ."""
        std = math.sqrt(2.0 / (self.in_features + self.out_features))
        nn.init.trunc_normal_(self.weight, mean=0.0, std=std, a=-3.0 * std, b=3.0 * std)

    @shape_checked
    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        """y = W x for every vector along the last dimension: (..., d_in) -> (..., d_out)."""
        if not x.is_floating_point():
            raise TypeError(f"Linear expects a floating-point input, got dtype {x.dtype} (ids go through an Embedding)")
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(
                f"Linear expected an input of shape (..., {self.in_features}) (in_features={self.in_features}), "
                f"got shape {tuple(x.shape)}"
            )
        return x @ self.weight.T

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"

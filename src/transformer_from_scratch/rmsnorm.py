# Generated from notebooks/04_rmsnorm.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: 397075548d471b4a973d0c6b5f37443a8fde0978d63f973a527f35edef8aa558

import torch
from jaxtyping import Float
from torch import Tensor, nn

from transformer_from_scratch.shapes import shape_checked


class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the last dimension, with a learnable gain and no bias.

    RMSNorm(a)_i = a_i / RMS(a) * g_i  with  RMS(a) = sqrt(mean_i(a_i²) + eps). The gain g is the
    parameter `weight`, of shape (d_model,), set to ones by `reset_parameters`.

    Computed in float32 (float64 stays float64): float16/bfloat16 inputs are upcast, as the square of an activation
    above 256 overflows float16; the result has the input's dtype. A non-float input is a TypeError.

    Args:
        d_model: size of the last dimension, the one that is normalised.
        eps: added to the mean square under the root; keeps an all-zero vector finite. device, dtype: the gain's.
    """

    def __init__(self, d_model: int, eps: float = 1e-5, device=None, dtype=None) -> None:
        super().__init__()
        if d_model < 1 or not eps >= 0:
            raise ValueError(f"RMSNorm needs a positive d_model and eps >= 0, got d_model={d_model}, eps={eps}")
        self.d_model = d_model
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(d_model, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Set the gain to ones, so that a new layer only normalises."""
        nn.init.ones_(self.weight)

    @shape_checked
    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """Normalise each vector x[..., :] to RMS 1 and multiply it by the gain; same shape and dtype as x."""
        if not x.is_floating_point():
            raise TypeError(f"RMSNorm expects a floating-point input, got dtype {x.dtype}")
        if x.ndim == 0 or x.shape[-1] != self.d_model:
            raise ValueError(f"RMSNorm expected an input of shape (..., {self.d_model}) (d_model={self.d_model}), "
                             f"got shape {tuple(x.shape)}")
        in_dtype = x.dtype
        compute_dtype = torch.promote_types(in_dtype, torch.float32)  # float16/bfloat16 -> float32
        x = x.to(compute_dtype)
        inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return (x * inv_rms * self.weight.to(compute_dtype)).to(in_dtype)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"

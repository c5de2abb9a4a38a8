# Generated from notebooks/04_rmsnorm.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: 0c6cbaea88f6c1526eb4e2a910220db1acb27dfad87d03bf4a99853880633f70

import torch
from beartype import beartype
from jaxtyping import Float, jaxtyped
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the last dimension, with a learnable gain and no bias.

    RMSNorm(a)_i = a_i / RMS(a) * g_i  with  RMS(a) = sqrt(mean_i(a_i²) + eps).

    The computation runs in float32 (float64 inputs stay float64): float16 and bfloat16 inputs are
    upcast first, because the square of an activation above 256 overflows float16. The result is
    cast back to the input's dtype.

    Args:
        d_model: size of the last dimension, the one that is normalised.
        eps: added to the mean square under the root; keeps an all-zero vector finite.
        device: where to create the gain (default: torch's default device).
        dtype: the gain's dtype (default: torch's default dtype).
    """

    def __init__(self, d_model: int, eps: float = 1e-5, device=None, dtype=None) -> None:
        super().__init__()
        if d_model < 1:
            raise ValueError(f"RMSNorm needs a positive d_model, got d_model={d_model}")
        if not eps >= 0:
            raise ValueError(f"RMSNorm needs eps >= 0, got eps={eps}")
        self.d_model = d_model
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(d_model, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    @jaxtyped(typechecker=beartype)
    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        if x.shape[-1] != self.d_model:
            raise ValueError(
                f"RMSNorm expected an input of shape (..., {self.d_model}) (d_model={self.d_model}), "
                f"got shape {tuple(x.shape)} whose last dimension is {x.shape[-1]}"
            )
        in_dtype = x.dtype
        compute_dtype = torch.promote_types(in_dtype, torch.float32)  # float16/bfloat16 -> float32
        x = x.to(compute_dtype)
        inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return (x * inv_rms * self.weight.to(compute_dtype)).to(in_dtype)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"

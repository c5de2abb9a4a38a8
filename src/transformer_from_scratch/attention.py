# Generated from notebooks/05_attention.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: 481bd8f2bccb8bb2e94a159cf483a7c985c7b0136a0e9a7cd2a35ab484076f68

import math

import torch
from einops import einsum
from jaxtyping import Float, Shaped
from torch import Tensor

from transformer_from_scratch.shapes import shape_checked
from transformer_from_scratch.softmax import softmax


def _check_shapes(Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None) -> None:
    """Q (..., n, d_k), K (..., m, d_k), V (..., m, d_v), mask broadcastable to (..., n, m), or a ValueError.

    A few comparisons of shapes, no work on the data: it stays on when the run-time shape checks are off, so that
    nothing ever broadcasts silently (einsum would happily broadcast a K with a leading dimension of 1).
    Raises TypeError when Q, K or V is not floating point.
    """
    for name, t in (("Q", Q), ("K", K), ("V", V)):
        if not t.is_floating_point():
            raise TypeError(f"scaled_dot_product_attention: {name} must be a floating-point tensor, got dtype {t.dtype}")
    if (Q.ndim < 2 or K.ndim != Q.ndim or V.ndim != Q.ndim or K.shape[:-2] != Q.shape[:-2]
            or V.shape[:-1] != K.shape[:-1] or K.shape[-1] != Q.shape[-1]):
        raise ValueError(f"scaled_dot_product_attention expects Q (..., n, d_k), K (..., m, d_k) and V (..., m, d_v) "
                         f"with the same leading dimensions, got Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)}")
    if mask is None:
        return
    n, m = Q.shape[-2], K.shape[-2]
    leading = Q.shape[:-2]
    if (mask.ndim < 2 or mask.shape[-2:] != (n, m) or mask.ndim - 2 > len(leading)
            or any(a not in (1, b) for a, b in zip(reversed(mask.shape[:-2]), reversed(leading)))):
        raise ValueError(f"scaled_dot_product_attention: the mask must have shape (..., n, m) = (..., {n}, {m}) with "
                         f"leading dimensions that broadcast to Q's {tuple(leading)}, got mask {tuple(mask.shape)}")


@shape_checked
def scaled_dot_product_attention(
    Q: Float[Tensor, "*batch n d_k"],
    K: Float[Tensor, "*batch m d_k"],
    V: Float[Tensor, "*batch m d_v"],
    mask: Shaped[Tensor, "*#batch n m"] | None = None,
) -> Float[Tensor, "*batch n d_v"]:
    """softmax(Q Kᵀ / √d_k) V: each query's output is a weighted average of the values.

    Args:
        Q: queries (..., n, d_k).
        K: keys (..., m, d_k), with exactly Q's leading dimensions (nothing broadcasts between Q, K, V).
        V: values (..., m, d_v).
        mask: optional bool tensor (..., n, m), True where query i may attend to key j (the polarity of
            F.scaled_dot_product_attention's bool attn_mask). Its leading dimensions may broadcast
            against Q's: one (n, m) causal mask can serve a whole batch of heads.

    Returns:
        (..., n, d_v). A key the mask forbids gets weight exactly 0. A query with no allowed key at all
        gets the zero vector and passes back zero (finite) gradients instead of NaN, as
        F.scaled_dot_product_attention does: one fully padded row must not poison a batch.
        float16 and bfloat16 are computed in float32 and rounded once, at the end, to Q's dtype.

    Raises:
        TypeCheckError (a TypeError): the shapes disagree; the message names the argument and the sizes.
        TypeError: the mask is not bool (a float mask means "add me to the scores" in PyTorch).
    """
    _check_shapes(Q, K, V, mask)
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(
            f"scaled_dot_product_attention: mask must be a bool tensor (True = query i may attend to key j), "
            f"got dtype {mask.dtype}. A float mask is ambiguous: F.scaled_dot_product_attention *adds* a float "
            f"mask to the scores (0 = attend, -inf = blocked), the opposite meaning of a 1/0 'may attend' mask. "
            f"Convert it to say which you mean: `keep.bool()` for 1 = attend, `additive == 0` for 0 = attend."
        )
    dtype = Q.dtype  # half precision is computed in float32 and rounded once, at the end (Pitfall 3)
    Q, K, V = (t.to(torch.promote_types(dtype, torch.float32)) for t in (Q, K, V))  # float64 stays float64
    # Scale the (..., n, d_k) queries rather than the (..., n, m) scores: the same numbers, fewer to divide.
    scores = einsum(Q / math.sqrt(Q.shape[-1]), K, "... n d_k, ... m d_k -> ... n m")
    if mask is None:
        return einsum(softmax(scores, dim=-1), V, "... n m, ... m d_v -> ... n d_v").to(dtype)
    no_key = ~mask.any(dim=-1, keepdim=True)  # (..., n, 1): queries that may attend to nothing
    # Forbidden keys get -inf (weight exactly 0). A row with no allowed key keeps its finite scores:
    # all -inf would make its softmax 0/0 = NaN, and NaN * 0 is still NaN in the backward pass.
    scores = scores.masked_fill(~mask & ~no_key, float("-inf"))
    output = einsum(softmax(scores, dim=-1), V, "... n m, ... m d_v -> ... n d_v")
    return output.masked_fill(no_key, 0.0).to(dtype)  # zero those rows: (..., n, d_v) is smaller than the weights

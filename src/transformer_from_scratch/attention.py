# Generated from notebooks/05_attention.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: 851c72f16c031c6994f020cdefd0a6278c97653afa13181093126000ce97c693

import math

import torch
from beartype import beartype
from einops import einsum
from jaxtyping import Float, Shaped, jaxtyped
from torch import Tensor

from transformer_from_scratch.softmax import softmax


@jaxtyped(typechecker=beartype)
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

    Raises:
        TypeCheckError (a TypeError): the shapes disagree; the message names the argument and the sizes.
        TypeError: the mask is not bool (a float mask means "add me to the scores" in PyTorch).
    """
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(
            f"scaled_dot_product_attention: mask must be a bool tensor (True = query i may attend to key j), "
            f"got dtype {mask.dtype}. A float mask is ambiguous: F.scaled_dot_product_attention *adds* a float "
            f"mask to the scores (0 = attend, -inf = blocked), the opposite meaning of a 1/0 'may attend' mask. "
            f"Convert it to say which you mean: `keep.bool()` for 1 = attend, `additive == 0` for 0 = attend."
        )
    scores = einsum(Q, K, "... n d_k, ... m d_k -> ... n m") / math.sqrt(Q.shape[-1])
    if mask is None:
        weights = softmax(scores, dim=-1)
    else:
        no_key = ~mask.any(dim=-1, keepdim=True)  # (..., n, 1): queries that may attend to nothing
        # Forbidden keys get -inf (weight exactly 0). A row with no allowed key keeps its finite scores:
        # all -inf would make its softmax 0/0 = NaN, and NaN * 0 is still NaN in the backward pass.
        scores = scores.masked_fill(~mask & ~no_key, float("-inf"))
        weights = softmax(scores, dim=-1).masked_fill(no_key, 0.0)
    return einsum(weights, V, "... n m, ... m d_v -> ... n d_v")

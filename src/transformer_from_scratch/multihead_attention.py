# Generated from notebooks/08_multihead_attention.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: df5d8c35b455b06bc9ffbb43b28aa901d278955548ca7ff056f7b7adf482aa91

import torch
import torch.nn.functional as F
from einops import rearrange
from jaxtyping import Float, Int
from torch import Tensor, nn

from transformer_from_scratch.attention import scaled_dot_product_attention
from transformer_from_scratch.linear import Linear
from transformer_from_scratch.rope import RotaryPositionalEmbedding
from transformer_from_scratch.shapes import shape_checked


def _check_arguments(d_model: int, num_heads: int, max_seq_len: int | None, theta: float | None) -> None:
    """MultiHeadSelfAttention's checks of its arguments, each a ValueError that says what is wrong."""
    if num_heads < 1 or d_model % num_heads != 0:
        raise ValueError(f"MultiHeadSelfAttention: d_model must be divisible by num_heads (each head gets "
                         f"d_model / num_heads features), got d_model={d_model}, num_heads={num_heads}")
    if (max_seq_len is None) != (theta is None):
        raise ValueError(f"MultiHeadSelfAttention: give both max_seq_len and theta (for RoPE) or neither, "
                         f"got max_seq_len={max_seq_len}, theta={theta}")


def _check_input(module: "MultiHeadSelfAttention", x: Tensor, token_positions: Tensor | None) -> None:
    """MultiHeadSelfAttention.forward's checks of what only the module knows, each a ValueError."""
    if x.ndim < 2 or x.shape[-1] != module.d_model:
        raise ValueError(f"MultiHeadSelfAttention expected x of shape (..., seq, {module.d_model}) "
                         f"(d_model={module.d_model}), got shape {tuple(x.shape)}")
    if module.max_seq_len is not None and x.shape[-2] > module.max_seq_len:
        raise ValueError(f"MultiHeadSelfAttention: the sequence has {x.shape[-2]} tokens, more than "
                         f"max_seq_len={module.max_seq_len} (x of shape {tuple(x.shape)})")
    lead = x.shape[:-1]  # (..., seq): what token_positions must broadcast to, without growing it
    if token_positions is not None and (
            token_positions.ndim < 1 or token_positions.ndim > len(lead) or token_positions.shape[-1] != lead[-1]
            or any(a not in (1, b) for a, b in zip(reversed(token_positions.shape[:-1]), reversed(lead[:-1])))):
        raise ValueError(f"MultiHeadSelfAttention: token_positions must have shape (..., seq) = (..., {lead[-1]}) with "
                         f"leading dimensions that broadcast to x's {tuple(lead[:-1])}, got token_positions "
                         f"{tuple(token_positions.shape)} for x {tuple(x.shape)}")
    if module.max_seq_len is None and token_positions is not None:
        raise ValueError("MultiHeadSelfAttention: token_positions were given, but this module has no RoPE "
                         "(build it with max_seq_len and theta to use positions)")


def _split_heads(t: Float[Tensor, "*batch seq d_model"], num_heads: int) -> Float[Tensor, "*batch heads seq d_k"]:
    """(..., seq, d_model) -> (..., num_heads, seq, d_k): head h gets features h·d_k … (h+1)·d_k - 1."""
    return rearrange(t, "... seq (heads d_k) -> ... heads seq d_k", heads=num_heads)


def _merge_heads(t: Float[Tensor, "*batch heads seq d_k"]) -> Float[Tensor, "*batch seq d_model"]:
    """(..., heads, seq, d_k) -> (..., seq, heads·d_k): the inverse of _split_heads."""
    return rearrange(t, "... heads seq d_k -> ... seq (heads d_k)")


def _rotate_heads(
    rope: RotaryPositionalEmbedding,
    q: Float[Tensor, "*batch heads seq d_k"],
    k: Float[Tensor, "*batch heads seq d_k"],
    token_positions: Int[Tensor, "*#batch seq"] | None,
) -> tuple[Float[Tensor, "*batch heads seq d_k"], Float[Tensor, "*batch heads seq d_k"]]:
    """RoPE on the queries and keys of every head, the same rotation for every head of a sequence.

    The positions (..., seq) get a size-1 head axis, (..., 1, seq), so that they broadcast over the heads (and
    (batch, seq) positions are not lined up with the heads). None means 0, 1, …, seq - 1, passed as range(seq).
    """
    # None: 0 … seq-1 as a range, which RoPE checks without reading the device; given positions get the head axis
    positions = range(q.shape[-2]) if token_positions is None else token_positions.unsqueeze(-2)
    return rope(q, positions), rope(k, positions)


class MultiHeadSelfAttention(nn.Module):
    """Causal multi-head self-attention, with rotary position embeddings (RoPE) on the queries and keys.

    Four Linear(d_model, d_model) without bias, `q_proj`, `k_proj`, `v_proj` and `output_proj`: the state dict
    holds their weights and nothing else. Queries, keys and values are split into `num_heads` heads of
    d_k = d_model / num_heads features; the heads attend causally (query i sees keys j <= i) as one more batch
    dimension, then are merged back and mixed by `output_proj`. With max_seq_len and theta,
    `self.rope = RotaryPositionalEmbedding(theta, d_k, max_seq_len)` rotates the queries and keys, never the
    values, after the split: the same rotation for every head. Without them, `self.rope` is None.

    Args:
        d_model, num_heads: the sizes; num_heads must divide d_model.
        max_seq_len, theta: RoPE's longest sequence and base Θ (10,000 in Llama): both, or neither (no RoPE).
        device, dtype: where and in which dtype to create the weights (device: RoPE's tables too).
        fused: attend with F.scaled_dot_product_attention (PyTorch's fused kernel, as nanoGPT does) instead of
            this package's scaled_dot_product_attention: the same result, faster, no (seq, seq) scores stored.
    """

    def __init__(self, d_model: int, num_heads: int, max_seq_len: int | None = None, theta: float | None = None,
                 device=None, dtype=None, *, fused: bool = False) -> None:
        super().__init__()
        _check_arguments(d_model, num_heads, max_seq_len, theta)
        self.d_model, self.num_heads, self.d_k = d_model, num_heads, d_model // num_heads
        self.max_seq_len, self.theta, self.fused = max_seq_len, theta, fused
        self.q_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.k_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.v_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.output_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.rope = None if theta is None else RotaryPositionalEmbedding(theta, self.d_k, max_seq_len, device=device)

    @shape_checked
    def forward(self, x: Float[Tensor, "*batch seq d_model"],
                token_positions: Int[Tensor, "*#batch seq"] | None = None) -> Float[Tensor, "*batch seq d_model"]:
        """(..., seq, d_model) -> (..., seq, d_model); token_positions (..., seq) broadcasts, None = 0 … seq-1."""
        _check_input(self, x, token_positions)
        q, k, v = (_split_heads(proj(x), self.num_heads) for proj in (self.q_proj, self.k_proj, self.v_proj))
        if self.rope is not None:
            q, k = _rotate_heads(self.rope, q, k, token_positions)
        if self.fused:
            return self.output_proj(_merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=True)))
        causal = torch.tril(torch.ones(x.shape[-2], x.shape[-2], dtype=torch.bool, device=x.device))
        return self.output_proj(_merge_heads(scaled_dot_product_attention(q, k, v, causal)))

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, d_k={self.d_k}, fused={self.fused}"

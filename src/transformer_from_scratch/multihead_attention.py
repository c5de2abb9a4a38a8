# Generated from notebooks/08_multihead_attention.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: 5cd3f6dc38f0d894bb1744524dfee544f4c5676ac488744c82ffd673eb94a951

from functools import lru_cache

import torch
import torch.nn.functional as F
from einops import rearrange
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from transformer_from_scratch.attention import scaled_dot_product_attention
from transformer_from_scratch.linear import Linear
from transformer_from_scratch.rope import RotaryPositionalEmbedding
from transformer_from_scratch.shapes import check_positions, check_stream, checking, shape_checked


def _check_arguments(d_model: int, num_heads: int, num_kv_heads: int, max_seq_len: int | None,
                     theta: float | None) -> None:
    """MultiHeadSelfAttention's checks of its arguments, each a ValueError that says what is wrong."""
    if num_heads < 1 or d_model % num_heads != 0:
        raise ValueError(f"MultiHeadSelfAttention: d_model must be divisible by num_heads (each head gets "
                         f"d_model / num_heads features), got d_model={d_model}, num_heads={num_heads}")
    if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
        raise ValueError(f"MultiHeadSelfAttention: num_kv_heads must divide num_heads (each key/value head serves "
                         f"num_heads / num_kv_heads query heads), got num_heads={num_heads}, "
                         f"num_kv_heads={num_kv_heads}")
    if (max_seq_len is None) != (theta is None):
        raise ValueError(f"MultiHeadSelfAttention: give both max_seq_len and theta (for RoPE) or neither, "
                         f"got max_seq_len={max_seq_len}, theta={theta}")


def _check_input(module: "MultiHeadSelfAttention", x: Tensor, token_positions: Tensor | None, past: int) -> None:
    """MultiHeadSelfAttention.forward's checks of what only the module knows, each a ValueError. `past`: the
    positions a cache already holds. Skipped inside `trusted()`, where the model calling it has checked its input."""
    if not checking():
        return
    check_stream("MultiHeadSelfAttention", x, module.d_model, module.max_seq_len, past=past)
    check_positions("MultiHeadSelfAttention", token_positions, x.shape[:-1], x.shape)
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
    k: Float[Tensor, "*batch kv_heads seq d_k"],
    token_positions: Int[Tensor, "*#batch seq"] | range,
) -> tuple[Float[Tensor, "*batch heads seq d_k"], Float[Tensor, "*batch kv_heads seq d_k"]]:
    """RoPE on the queries and keys of every head, the same rotation for every head of a sequence.

    Given positions (..., seq) get a size-1 head axis, (..., 1, seq), so that they broadcast over the heads (and
    (batch, seq) positions are not lined up with the heads); a range (consecutive positions) serves every head as it is.
    """
    positions = token_positions if isinstance(token_positions, range) else token_positions.unsqueeze(-2)
    return rope(q, positions), rope(k, positions)


def _repeat_kv(t: Float[Tensor, "*batch kv_heads seq d_k"], group: int) -> Float[Tensor, "*batch heads seq d_k"]:
    """(..., kv_heads, seq, d_k) -> (..., kv_heads·group, seq, d_k): key/value head j serves query heads j·group …
    j·group + group - 1, each of those getting its own copy. group 1 returns t itself."""
    return t if group == 1 else t.repeat_interleave(group, dim=-3)


@lru_cache(maxsize=8)  # every block of a forward asks for the same mask: built once, then shared (read-only)
def _causal_mask(new: int, total: int, device=None) -> Bool[Tensor, "new total"]:
    """(new, total) bool, True where the query at position total-new+i may attend to key j (j <= total-new+i): the
    new tokens are the last of the total. new == total is the square causal mask of Step 3."""
    return torch.ones(new, total, dtype=torch.bool, device=device).tril(diagonal=total - new)


def _attend(q: Float[Tensor, "*batch heads new d_k"], k: Float[Tensor, "*batch kv_heads total d_k"],
            v: Float[Tensor, "*batch kv_heads total d_k"], fused: bool) -> Float[Tensor, "*batch heads new d_k"]:
    """Causal attention of the new queries over every key and value, the new tokens being the last of the total; key/
    value head j serves query heads j·g … j·g+g-1. fused: PyTorch's kernel, which groups the heads itself."""
    new, total = q.shape[-2], k.shape[-2]
    # One new query may see every key: no mask. PyTorch's kernel makes the square mask itself (is_causal).
    mask = None if new == 1 or (fused and new == total) else _causal_mask(new, total, q.device)
    if fused:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and new > 1,
                                              enable_gqa=k.shape[-3] != q.shape[-3])
    group = q.shape[-3] // k.shape[-3]
    return scaled_dot_product_attention(q, _repeat_kv(k, group), _repeat_kv(v, group), mask)


class MultiHeadSelfAttention(nn.Module):
    """Causal multi-head self-attention (d_model split into num_heads heads of d_k), RoPE on the queries and keys.

    Four Linear layers without bias, the state dict's only entries: `q_proj`, `output_proj` (d_model -> d_model) and
    `k_proj`, `v_proj` (d_model -> num_kv_heads·d_k; num_kv_heads divides num_heads, None = num_heads): key/value
    head j serves query heads j·g … j·g+g-1, g = num_heads / num_kv_heads (grouped-query attention). max_seq_len and
    theta (both or neither) build `self.rope`, RotaryPositionalEmbedding(theta, d_k, max_seq_len), else None; device
    and dtype, the weights (and RoPE's tables); fused=True attends with F.scaled_dot_product_attention, as nanoGPT.
    """

    def __init__(self, d_model: int, num_heads: int, max_seq_len: int | None = None, theta: float | None = None,
                 device=None, dtype=None, *, fused: bool = False, num_kv_heads: int | None = None) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        _check_arguments(d_model, num_heads, num_kv_heads, max_seq_len, theta)
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.d_k, self.max_seq_len, self.theta, self.fused = d_model // num_heads, max_seq_len, theta, fused
        self.q_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.k_proj = Linear(d_model, num_kv_heads * self.d_k, device=device, dtype=dtype)
        self.v_proj = Linear(d_model, num_kv_heads * self.d_k, device=device, dtype=dtype)
        self.output_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.rope = None if theta is None else RotaryPositionalEmbedding(theta, self.d_k, max_seq_len, device=device)

    @shape_checked
    def forward(self, x: Float[Tensor, "*batch seq d_model"], token_positions: Int[Tensor, "*#batch seq"] | None = None,
                *, cache=None) -> Float[Tensor, "*batch seq d_model"]:
        """(..., seq, d_model) -> (..., seq, d_model); token_positions (..., seq) broadcasts, None = 0 … seq-1.
        cache (notebook 12's, one layer's): `cache.length` positions held; `cache.update(k, v)` stores the new rotated
        keys and the values and returns all so far. x holds the tokens after the held ones, at cache.length …"""
        past = 0 if cache is None else cache.length
        _check_input(self, x, token_positions, past)
        q = _split_heads(self.q_proj(x), self.num_heads)
        k, v = (_split_heads(proj(x), self.num_kv_heads) for proj in (self.k_proj, self.v_proj))
        if self.rope is not None:
            positions = range(past, past + x.shape[-2]) if token_positions is None else token_positions
            q, k = _rotate_heads(self.rope, q, k, positions)
        if cache is not None:
            k, v = cache.update(k, v)  # every key and value so far: (batch, kv_heads, past + seq, d_k)
        return self.output_proj(_merge_heads(_attend(q, k, v, self.fused)))

    def extra_repr(self) -> str:
        kv = "" if self.num_kv_heads == self.num_heads else f", num_kv_heads={self.num_kv_heads}"
        return f"d_model={self.d_model}, num_heads={self.num_heads}{kv}, d_k={self.d_k}, fused={self.fused}"

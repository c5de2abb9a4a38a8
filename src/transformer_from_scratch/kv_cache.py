# Generated from notebooks/12_kv_cache.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: dc9fff70a08e5a3e126c6211f084956942dd046ef6623a45f3286eae97f05757

import torch
from jaxtyping import Float
from torch import Tensor, nn


def _check_positions_wanted(max_seq_len: int | None, context_length: int) -> None:
    """KVCache.for_model's check: max_seq_len is None (the whole context) or in [1, context_length]."""
    if max_seq_len is not None and not 1 <= max_seq_len <= context_length:
        raise ValueError(f"KVCache.for_model: max_seq_len must be in [1, context_length={context_length}], got "
                         f"{max_seq_len}")


def _check_update(keys: Tensor, length: int, k: Tensor, v: Tensor) -> None:
    """KVCache.update's checks: k and v (batch, heads, new, d_k) that fit after the `length` cached positions."""
    batch, heads, max_seq_len, d_k = keys.shape
    if k.shape != v.shape or k.ndim != 4 or (k.shape[0], k.shape[1], k.shape[3]) != (batch, heads, d_k):
        raise ValueError(f"KVCache.update expects k and v of shape (batch, heads, new, d_k) = ({batch}, {heads}, "
                         f"new, {d_k}), got k {tuple(k.shape)} and v {tuple(v.shape)}")
    new = k.shape[2]
    if length + new > max_seq_len:
        raise ValueError(f"KVCache: {new} new positions do not fit after the {length} cached ones "
                         f"(max_seq_len={max_seq_len}): past the context, the window slides and the cache starts again")


class KVCache:
    """One attention layer's cache: the keys (after RoPE) and the values of every position seen so far.

    `keys` and `values`: zeros (batch, num_kv_heads, max_seq_len, d_k), made once, max_seq_len at most the model's
    context_length (the window never passes it); `length` positions filled. update, which the attention's forward(x,
    cache=...) calls, writes new positions in place and returns views of all so far. reset() for a new text.
    """

    def __init__(self, batch: int, num_kv_heads: int, max_seq_len: int, d_k: int, *, device=None, dtype=None) -> None:
        if min(batch, num_kv_heads, max_seq_len, d_k) < 1:
            raise ValueError(f"KVCache: every size must be >= 1, got batch={batch}, num_kv_heads={num_kv_heads}, "
                             f"max_seq_len={max_seq_len}, d_k={d_k}")
        self.length = 0  # positions filled
        self.keys = torch.zeros(batch, num_kv_heads, max_seq_len, d_k, device=device, dtype=dtype)
        self.values = torch.zeros_like(self.keys)

    @classmethod
    def for_model(cls, model: nn.Module, batch: int = 1, max_seq_len: int | None = None) -> list["KVCache"]:
        """One empty cache per block, of its attention's key/value heads and max_seq_len positions (None: all)."""
        _check_positions_wanted(max_seq_len, model.context_length)
        weight, positions = model.token_embeddings.weight, max_seq_len or model.context_length
        return [cls(batch, block.attn.num_kv_heads, positions, block.attn.d_k, device=weight.device,
                    dtype=weight.dtype) for block in model.layers]

    def update(self, k: Float[Tensor, "batch heads new d_k"],
               v: Float[Tensor, "batch heads new d_k"]) -> tuple[Tensor, Tensor]:
        """Write n new keys and values after the cached ones; return views of every position so far.
        k, v: (batch, heads, n, d_k), at positions length … length+n-1; ValueError if they do not fit."""
        _check_update(self.keys, self.length, k, v)
        end = self.length + k.shape[2]
        self.keys[:, :, self.length:end] = k
        self.values[:, :, self.length:end] = v
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def reset(self) -> None:
        """Forget every position (the memory stays): for a new prompt, or a slid window."""
        self.length = 0

    @property
    def nbytes(self) -> int:
        """The bytes of the keys and values, filled or not."""
        return self.keys.nbytes + self.values.nbytes

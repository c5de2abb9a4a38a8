# Generated from notebooks/06_rope.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: 3a6191acc3fa35c34e212734e7611590a511898fa6c0e72780590dfc6d4a9190

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from torch.compiler import is_compiling

from transformer_from_scratch.shapes import check_positions, is_integer_dtype, shape_checked


def _checked_positions(token_positions: Tensor | range, x_shape: torch.Size, max_seq_len: int) -> Tensor | slice:
    """What indexes the tables: token_positions as int64, or, for a range of consecutive positions, the slice of them.

    Checks that its shape fits x's and that every position lies in [0, max_seq_len), raising ValueError with the shapes,
    or the smallest and largest position found. A tensor costs one read-back of its smallest and largest value from
    the device; a range costs none (its bounds are Python ints), which is why attention passes range(seq) for the
    default positions. Without the checks, a (1,) vector would broadcast one angle over every token, a negative
    position would silently read the tables from their end, and one past the end fails (asynchronously, on a GPU).
    """
    if isinstance(token_positions, range):
        if token_positions.step != 1 or len(token_positions) != x_shape[-2]:
            raise ValueError(f"RotaryPositionalEmbedding: a range of positions must be consecutive, one per token "
                             f"(range(start, start + {x_shape[-2]})), got {token_positions} for x {tuple(x_shape)}")
        if token_positions.start < 0 or token_positions.stop > max_seq_len:
            raise ValueError(f"RotaryPositionalEmbedding: token_positions must lie in [0, max_seq_len) = "
                             f"[0, {max_seq_len}), got {token_positions}")
        return slice(token_positions.start, token_positions.stop)  # the tables' rows, a view: nothing to gather
    if not is_integer_dtype(token_positions.dtype):
        raise TypeError(f"RotaryPositionalEmbedding: token_positions must be integers, "
                        f"got dtype {token_positions.dtype}")
    check_positions("RotaryPositionalEmbedding", token_positions, x_shape[:-1], x_shape)  # a few comparisons: always on
    if token_positions.numel() > 0 and not is_compiling():  # compiled: no branching on values
        low, high = torch.stack(torch.aminmax(token_positions)).tolist()  # one read-back from the device
        if low < 0 or high >= max_seq_len:
            raise ValueError(f"RotaryPositionalEmbedding: token_positions must lie in [0, max_seq_len) = "
                             f"[0, {max_seq_len}), got values from {low} to {high}")
    return token_positions.long()  # int8 and int16 tensors cannot index a table


class RotaryPositionalEmbedding(nn.Module):
    """Rotary position embedding: rotate each pair (x[2k], x[2k+1]) by an angle that grows with the position.

    The token at position i has pair k rotated by θ_{i,k} = i / theta^(2k/d_k), k = 0 … d_k/2 - 1. Applied to
    queries and keys (never values), it makes the score q_m · k_n depend on the positions only through m - n.
    No parameters: cos and sin of every angle are computed once, two (max_seq_len, d_k/2) tables kept as the
    non-persistent buffers cos_table and sin_table (they follow .to(device), stay out of the state dict).
    Args: theta, the base Θ of the frequencies (10,000 in RoFormer and Llama); d_k, the even size of the vectors
    to rotate (a head's query/key size); max_seq_len, for positions 0 … max_seq_len - 1; device, for the tables.
    """

    def __init__(self, theta: float, d_k: int, max_seq_len: int, device: torch.device | str | None = None):
        super().__init__()
        if d_k <= 0 or d_k % 2 != 0 or max_seq_len <= 0 or theta <= 0:
            raise ValueError(f"RotaryPositionalEmbedding needs an even d_k > 0 (RoPE rotates pairs), max_seq_len > 0 "
                             f"and theta > 0, got theta={theta}, d_k={d_k}, max_seq_len={max_seq_len}")
        self.theta, self.d_k, self.max_seq_len = theta, d_k, max_seq_len
        inverse_frequencies = theta ** (-torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)   # (d_k/2,)
        angles = torch.arange(max_seq_len, dtype=torch.float64)[:, None] * inverse_frequencies  # (max_seq_len, d_k/2)
        self.register_buffer("cos_table", angles.cos().to(device=device, dtype=torch.float32), persistent=False)
        self.register_buffer("sin_table", angles.sin().to(device=device, dtype=torch.float32), persistent=False)

    @shape_checked
    def forward(self, x: Float[Tensor, "*batch seq d_k"],
                token_positions: Int[Tensor, "*#batch seq"] | range) -> Float[Tensor, "*batch seq d_k"]:
        """Rotate each token's pairs by the angles of its position: same shape and dtype as x (..., seq, d_k).

        token_positions (..., seq): integers in [0, max_seq_len), leading dimensions broadcasting against x's ((seq,)
        serves a batch, (batch, 1, seq) every head), or range(start, start + seq). Bad ones raise ValueError."""
        if x.ndim < 2 or x.shape[-1] != self.d_k:
            raise ValueError(f"RotaryPositionalEmbedding: x's last dimension must be d_k={self.d_k}, "
                             f"got x of shape {tuple(x.shape)} (expected (..., seq, {self.d_k}))")
        token_positions = _checked_positions(token_positions, x.shape, self.max_seq_len)  # a tensor or a slice
        compute = torch.promote_types(x.dtype, torch.float32)  # half precision is rotated in float32
        cos = self.cos_table[token_positions].to(compute)  # (..., seq, d_k/2): one angle per token and pair
        sin = self.sin_table[token_positions].to(compute)
        if is_compiling():  # torch.compile's inductor generates no code for complex numbers: Step 4's rotation instead
            even, odd = x[..., 0::2].to(compute), x[..., 1::2].to(compute)
            return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2).to(x.dtype)
        # Pair k as the complex number x[2k] + i·x[2k+1]: the rotation by θ is one multiplication by cos θ + i·sin θ.
        pairs = x.to(compute).unflatten(-1, (-1, 2))  # (..., seq, d_k/2, 2): a view, no copy
        if pairs.stride(-1) != 1 or any(s % 2 for s in pairs.stride()[:-1]) or pairs.storage_offset() % 2:  # x.T, x[1:]
            pairs = pairs.clone(memory_format=torch.contiguous_format)  # view_as_complex: neighbours, even offset
        rotated = torch.view_as_complex(pairs) * torch.complex(cos, sin)
        return torch.view_as_real(rotated).flatten(-2).to(x.dtype)  # back to x[2k], x[2k+1], x's dtype

"""The benchmark's yardstick: the same language model written with PyTorch's built-in functions.

`ReferenceLM(model)` holds its own copy of a `TransformerLM`'s weights (same names, same values, so the two compute
the same function) and runs them through `F.embedding`, `F.rms_norm`, `F.linear`, `F.silu`, a complex-number RoPE
(as Meta's Llama code rotates) and `F.scaled_dot_product_attention(is_causal=True)`. Nothing in it comes from this
package's components, so it measures how close the from-scratch model gets to what PyTorch itself offers, and it
is an independent check that the two agree (tests/test_benchmark.py).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _rope_table(theta: float, d_k: int, max_seq_len: int, device) -> Tensor:
    """cos + i·sin of every angle θ_{i,k} = i / theta^(2k/d_k): a complex (max_seq_len, d_k/2) table."""
    inverse_frequencies = theta ** (-torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)
    angles = torch.arange(max_seq_len, dtype=torch.float64)[:, None] * inverse_frequencies
    return torch.polar(torch.ones_like(angles), angles).to(device=device, dtype=torch.complex64)


def _rotate(x: Tensor, table: Tensor) -> Tensor:
    """RoPE by complex multiplication: pairs (x[2k], x[2k+1]) are the numbers x[2k] + i·x[2k+1]."""
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * table).flatten(-2).to(x.dtype)


class ReferenceLM(nn.Module):
    """A TransformerLM's function, computed with PyTorch's built-ins, on a copy of the model's weights."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.weights = copy.deepcopy(model)  # the same parameter names: state dicts load both ways
        self.context_length = model.context_length
        attn = model.layers[0].attn
        self.num_heads, self.eps = attn.num_heads, model.ln_final.eps
        self.register_buffer("rope", _rope_table(attn.theta, attn.d_k, model.context_length,
                                                 model.lm_head.weight.device), persistent=False)

    def forward(self, token_ids: Tensor) -> Tensor:
        w, heads, eps = self.weights, self.num_heads, self.eps
        seq = token_ids.shape[-1]
        x = F.embedding(token_ids, w.token_embeddings.weight)
        d = x.shape[-1]
        table = self.rope[:seq]
        for layer in w.layers:
            h = F.rms_norm(x, (d,), layer.ln1.weight, eps)
            q, k, v = (F.linear(h, proj.weight).unflatten(-1, (heads, -1)).transpose(-3, -2)
                       for proj in (layer.attn.q_proj, layer.attn.k_proj, layer.attn.v_proj))
            attended = F.scaled_dot_product_attention(_rotate(q, table), _rotate(k, table), v, is_causal=True)
            x = x + F.linear(attended.transpose(-3, -2).flatten(-2), layer.attn.output_proj.weight)
            h = F.rms_norm(x, (d,), layer.ln2.weight, eps)
            x = x + F.linear(F.silu(F.linear(h, layer.ffn.w1.weight)) * F.linear(h, layer.ffn.w3.weight),
                             layer.ffn.w2.weight)
        return F.linear(F.rms_norm(x, (d,), w.ln_final.weight, eps), w.lm_head.weight)

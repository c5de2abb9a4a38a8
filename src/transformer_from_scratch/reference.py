"""The course's reference: the model written with PyTorch's built-in functions, independent of the components the
notebooks build.

Everything here comes from PyTorch itself (`F.embedding`, `F.rms_norm`, `F.linear`, `F.silu`,
`F.scaled_dot_product_attention`) except RoPE, which PyTorch does not have: it is written as a complex multiplication
(`torch.polar`), the way Meta's original Llama code rotates, not as the notebooks' real-valued pairs. So it is a
second, independent implementation of the contract (CONTRACT.md), and three parts of the project use this one copy:

* the learner checks (`transformer_from_scratch.checks`) compare a learner's component with it, in float64 on the CPU,
  and build their "classic mistake" variants from its pieces;
* the benchmark (`make bench`) times the from-scratch model against `ReferenceLM`, the same weights run through it;
* the tests compare the package's components with it.

The functions take weights by the course's state-dict names (`q_proj`, `ln1.weight`, `layers.0.ffn.w1.weight`, …), so
a module's `state_dict()` is all they need. They work in the dtype they are given.
"""

from __future__ import annotations

import copy
from typing import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

# Saved at import: a learner's code (or a check's spy) cannot change what the reference runs.
SDPA = F.scaled_dot_product_attention
RMS_NORM = F.rms_norm
EPS = 1e-5  # RMSNorm's default eps


# ---------------------------------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------------------------------

def rope_angles(positions: Tensor, d_k: int, theta: float) -> Tensor:
    """θ_{i,k} = i / theta^(2k/d_k) for every position i in ``positions`` (..., seq) and pair k: (..., seq, d_k/2),
    in float64 on the positions' device."""
    k = torch.arange(d_k // 2, dtype=torch.float64, device=positions.device)
    return positions.to(torch.float64)[..., None] * theta ** (-2 * k / d_k)


def rotate_by(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate pair k = (x[2k], x[2k+1]), read as the complex number x[2k] + i·x[2k+1], by ``angles`` (..., d/2).

    Computed in x's dtype promoted to at least float32 (complex64, or complex128 for float64), returned in x's dtype.
    """
    compute = torch.promote_types(x.dtype, torch.float32)
    pairs = torch.view_as_complex(x.to(compute).unflatten(-1, (-1, 2)).clone(memory_format=torch.contiguous_format))
    factors = torch.polar(torch.ones_like(angles), angles).to(pairs.dtype)
    return torch.view_as_real(pairs * factors).flatten(-2).to(x.dtype)


def rotate(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """RoPE: x (..., seq, d_k) with the token at ``positions[j]`` (..., seq, broadcasting) rotated by its angles."""
    return rotate_by(x, rope_angles(positions.to(x.device), x.shape[-1], theta))


# ---------------------------------------------------------------------------------------------------------
# The pieces of the model
# ---------------------------------------------------------------------------------------------------------

def rms_norm(x: Tensor, weight: Tensor, eps: float = EPS) -> Tensor:
    return RMS_NORM(x, (x.shape[-1],), weight, eps=eps)


def swiglu(x: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """w2 (silu(w1 x) ⊙ w3 x), weights stored (d_out, d_in)."""
    return F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)


def attention(Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None = None) -> Tensor:
    """softmax(Q Kᵀ / √d_k) V over any leading dimensions, with a boolean ``mask`` (True: may attend).

    PyTorch's math implementation of ``F.scaled_dot_product_attention``: a query row with no allowed key gets an
    output of zeros, as the course's attention gives it (the fused kernels give NaN there).
    """
    with sdpa_kernel([SDPBackend.MATH]):
        return SDPA(Q, K, V, attn_mask=mask)


def split_heads(t: Tensor, num_heads: int) -> Tensor:
    """(..., seq, d_model) -> (..., heads, seq, d_k): head h gets features h·d_k … (h+1)·d_k - 1."""
    return t.unflatten(-1, (num_heads, -1)).transpose(-3, -2)


def merge_heads(t: Tensor) -> Tensor:
    """(..., heads, seq, d_k) -> (..., seq, heads·d_k)."""
    return t.transpose(-3, -2).flatten(-2)


def multihead_self_attention(x: Tensor, weights: Mapping[str, Tensor], num_heads: int, theta: float | None = None,
                             positions: Tensor | None = None, *, causal: bool = True) -> Tensor:
    """Causal multi-head self-attention with RoPE on the queries and keys (when ``theta`` is given).

    ``weights`` holds ``q_proj.weight``, ``k_proj.weight``, ``v_proj.weight`` and ``output_proj.weight`` (an
    attention module's state dict); k_proj and v_proj with fewer rows than q_proj make it grouped-query attention. ``positions`` (..., seq) defaults to 0 … seq-1 and gets a head axis, so every
    head of a sequence has the same rotation. ``causal=False`` attends to every key (for the checks' variants).
    """
    q = split_heads(F.linear(x, weights["q_proj.weight"]), num_heads)
    kv_heads = kv_heads_of(weights, num_heads)
    k, v = (split_heads(F.linear(x, weights[f"{name}_proj.weight"]), kv_heads) for name in "kv")
    if theta is not None:
        where = (torch.arange(x.shape[-2]) if positions is None else positions).unsqueeze(-2)
        q, k = rotate(q, where, theta), rotate(k, where, theta)
    attended = SDPA(q, k, v, is_causal=causal, enable_gqa=kv_heads != num_heads)
    return F.linear(merge_heads(attended), weights["output_proj.weight"])


def kv_heads_of(weights: Mapping[str, Tensor], num_heads: int) -> int:
    """The key/value heads of an attention's weights: k_proj's rows over one head's size (q_proj's rows / num_heads).
    num_heads for multi-head attention; fewer for grouped-query attention, where PyTorch's enable_gqa lets key/value
    head j serve query heads j·g … j·g+g-1 (g = num_heads / kv_heads)."""
    d_k = weights["q_proj.weight"].shape[0] // num_heads
    return weights["k_proj.weight"].shape[0] // d_k


def _prefixed(weights: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {name[len(prefix):]: w for name, w in weights.items() if name.startswith(prefix)}


def transformer_block(x: Tensor, weights: Mapping[str, Tensor], num_heads: int, theta: float,
                      positions: Tensor | None = None, *, eps: float = EPS, causal: bool = True) -> Tensor:
    """The pre-norm block: y = x + attn(ln1(x)); out = y + ffn(ln2(y)). ``weights``: a block's state dict."""
    y = x + multihead_self_attention(rms_norm(x, weights["ln1.weight"], eps), _prefixed(weights, "attn."), num_heads,
                                     theta, positions, causal=causal)
    return y + swiglu(rms_norm(y, weights["ln2.weight"], eps), weights["ffn.w1.weight"], weights["ffn.w2.weight"],
                      weights["ffn.w3.weight"])


def num_layers(state_dict: Mapping[str, Tensor]) -> int:
    """How many blocks a TransformerLM state dict holds (its ``layers.{i}.`` entries)."""
    return len({name.split(".")[1] for name in state_dict if name.startswith("layers.")})


def transformer_lm(token_ids: Tensor, state_dict: Mapping[str, Tensor], num_heads: int, theta: float,
                   positions: Tensor | None = None, *, eps: float = EPS, causal: bool = True) -> Tensor:
    """The language model: embedding, the blocks, the final norm, the LM head → logits (..., seq, vocab_size).

    ``state_dict`` holds a TransformerLM's entries by the course's names (``token_embeddings.weight``,
    ``layers.{i}.…``, ``ln_final.weight``, ``lm_head.weight``).
    """
    x = F.embedding(token_ids, state_dict["token_embeddings.weight"])
    for i in range(num_layers(state_dict)):
        x = transformer_block(x, _prefixed(state_dict, f"layers.{i}."), num_heads, theta, positions, eps=eps,
                              causal=causal)
    return F.linear(rms_norm(x, state_dict["ln_final.weight"], eps), state_dict["lm_head.weight"])


def float64_copy(weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The weights as float64 CPU tensors, detached: what the checks compute their reference with."""
    return {name: w.detach().to("cpu", torch.float64) for name, w in weights.items()}


# ---------------------------------------------------------------------------------------------------------
# The benchmark's yardstick
# ---------------------------------------------------------------------------------------------------------

class ReferenceLM(nn.Module):
    """A TransformerLM's function, computed with PyTorch's built-ins, on a copy of the model's weights.

    ``ReferenceLM(model)`` holds its own copy of the weights (the same names and values, so state dicts load both
    ways and the two compute the same function). For speed, as a real implementation would, the RoPE factors
    e^{iθ} of every position are computed once (complex64) instead of per call.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.weights = copy.deepcopy(model)
        self.context_length = model.context_length
        attn = model.layers[0].attn
        self.num_heads, self.eps = attn.num_heads, model.ln_final.eps
        self.num_kv_heads = kv_heads_of(attn.state_dict(), attn.num_heads)
        angles = rope_angles(torch.arange(model.context_length), attn.d_k, attn.theta)
        factors = torch.polar(torch.ones_like(angles), angles).to(torch.complex64)
        self.register_buffer("rope", factors.to(model.lm_head.weight.device), persistent=False)

    def _rotate(self, x: Tensor, factors: Tensor) -> Tensor:
        pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
        return torch.view_as_real(pairs * factors).flatten(-2).to(x.dtype)

    def forward(self, token_ids: Tensor) -> Tensor:
        w, heads, eps = self.weights, self.num_heads, self.eps
        factors = self.rope[: token_ids.shape[-1]]
        x = F.embedding(token_ids, w.token_embeddings.weight)
        for layer in w.layers:
            h = rms_norm(x, layer.ln1.weight, eps)
            q = split_heads(F.linear(h, layer.attn.q_proj.weight), heads)
            k, v = (split_heads(F.linear(h, proj.weight), self.num_kv_heads)
                    for proj in (layer.attn.k_proj, layer.attn.v_proj))
            attended = SDPA(self._rotate(q, factors), self._rotate(k, factors), v, is_causal=True,
                            enable_gqa=self.num_kv_heads != heads)
            x = x + F.linear(merge_heads(attended), layer.attn.output_proj.weight)
            x = x + swiglu(rms_norm(x, layer.ln2.weight, eps), layer.ffn.w1.weight, layer.ffn.w2.weight,
                           layer.ffn.w3.weight)
        return F.linear(rms_norm(x, w.ln_final.weight, eps), w.lm_head.weight)


@torch.no_grad()
def greedy_decode_with_cache(model: ReferenceLM, prompt_ids: Tensor, max_new_tokens: int) -> Tensor:
    """Greedy decoding of one sequence with a KV cache, from built-ins: the ids ``generate(..., temperature=0)`` gives.

    The benchmark's yardstick for decoding with a cache. Each layer keeps preallocated keys (rotated) and values of
    shape (1, heads, context_length, d_k); the prompt runs once, then one token per step, and only the last position
    goes through lm_head. Past context_length the window slides: the model sees the last context_length ids at
    positions 0 … context_length-1, so the caches are refilled from the window, as the course's generate does.
    """
    w, heads, eps, context = model.weights, model.num_heads, model.eps, model.context_length
    d_k = w.layers[0].attn.q_proj.weight.shape[0] // heads
    like = w.lm_head.weight
    kv_heads = model.num_kv_heads  # the caches hold the key/value heads only
    keys = [like.new_zeros(1, kv_heads, context, d_k) for _ in w.layers]
    values = [like.new_zeros(1, kv_heads, context, d_k) for _ in w.layers]
    ids, origin, length = prompt_ids, 0, 0  # the caches hold ids[origin : origin + length]
    for _ in range(max_new_tokens):
        if max(0, len(ids) - context) != origin:
            origin, length = max(0, len(ids) - context), 0
        new = ids[origin + length:][None]
        end = length + new.shape[-1]
        factors = model.rope[length:end]
        mask = None if new.shape[-1] == 1 else torch.ones(new.shape[-1], end, dtype=torch.bool,
                                                          device=ids.device).tril(end - new.shape[-1])
        x = F.embedding(new, w.token_embeddings.weight)
        for layer, k_cache, v_cache in zip(w.layers, keys, values):
            h = rms_norm(x, layer.ln1.weight, eps)
            q = split_heads(F.linear(h, layer.attn.q_proj.weight), heads)
            k, v = (split_heads(F.linear(h, proj.weight), kv_heads) for proj in (layer.attn.k_proj, layer.attn.v_proj))
            k_cache[:, :, length:end] = model._rotate(k, factors)
            v_cache[:, :, length:end] = v
            attended = SDPA(model._rotate(q, factors), k_cache[:, :, :end], v_cache[:, :, :end], attn_mask=mask,
                            enable_gqa=kv_heads != heads)
            x = x + F.linear(merge_heads(attended), layer.attn.output_proj.weight)
            x = x + swiglu(rms_norm(x, layer.ln2.weight, eps), layer.ffn.w1.weight, layer.ffn.w2.weight,
                           layer.ffn.w3.weight)
        logits = F.linear(rms_norm(x[0, -1], w.ln_final.weight, eps), w.lm_head.weight)
        length = end
        ids = torch.cat([ids, logits.argmax().view(1).to(ids.dtype)])
    return ids[prompt_ids.numel():]

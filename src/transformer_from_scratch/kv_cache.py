# Generated from notebooks/12_kv_cache.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: df0613f5fe44a50b10ae8a921f7b8dc132a2943d24709a8c565b2f57347a3639

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int, Integer
from torch import Tensor, nn

from transformer_from_scratch.attention import scaled_dot_product_attention
from transformer_from_scratch.shapes import shape_checked
from transformer_from_scratch.transformer_lm import TransformerLM, _check_generate, next_token_distribution
from transformer_from_scratch.transformer_lm import generate as generate_uncached


def _check_append(keys: Tensor, length: int, k: Tensor, v: Tensor) -> None:
    """KVCache.append's checks: k and v (batch, heads, new, d_k) that fit after the `length` cached positions."""
    batch, heads, max_len, d_k = keys.shape
    if k.shape != v.shape or k.ndim != 4 or (k.shape[0], k.shape[1], k.shape[3]) != (batch, heads, d_k):
        raise ValueError(f"KVCache.append expects k and v of shape (batch, heads, new, d_k) = ({batch}, {heads}, "
                         f"new, {d_k}), got k {tuple(k.shape)} and v {tuple(v.shape)}")
    new = k.shape[2]
    if length + new > max_len:
        raise ValueError(f"KVCache: {new} new positions do not fit after the {length} cached ones "
                         f"(max_len={max_len}): past the context, the window slides and the cache starts again")


class KVCache:
    """One attention layer's cache: the keys (after RoPE) and the values of every position seen so far.

    Preallocated: `keys` and `values`, zeros (batch, num_heads, max_len, d_k) made once; `length` positions filled.
    append writes new positions in place (no copy of the old ones, no allocation per token) and returns views of all
    so far. max_len is the model's context_length, which the window never passes: the memory, 2 · batch · max_len ·
    d_model numbers per layer, is known and taken once. One cache per text: reset() it for the next prompt.
    """

    def __init__(self, batch: int, num_heads: int, max_len: int, d_k: int, *, device=None, dtype=None) -> None:
        if min(batch, num_heads, max_len, d_k) < 1:
            raise ValueError(f"KVCache: every size must be >= 1, got batch={batch}, num_heads={num_heads}, "
                             f"max_len={max_len}, d_k={d_k}")
        self.keys = torch.zeros(batch, num_heads, max_len, d_k, device=device, dtype=dtype)
        self.values = torch.zeros_like(self.keys)
        self.length = 0

    @classmethod
    def for_model(cls, model: TransformerLM, batch: int = 1) -> list["KVCache"]:
        """One empty cache per block of `model`: its context_length, device and dtype."""
        weight = model.lm_head.weight
        return [cls(batch, block.attn.num_heads, model.context_length, block.attn.d_k, device=weight.device,
                    dtype=weight.dtype) for block in model.layers]

    def append(self, k: Float[Tensor, "batch heads new d_k"],
               v: Float[Tensor, "batch heads new d_k"]) -> tuple[Tensor, Tensor]:
        """Write n new keys and values after the cached ones; return views of every position so far.
        k, v: (batch, heads, n, d_k), at positions length … length+n-1; ValueError if they do not fit."""
        _check_append(self.keys, self.length, k, v)
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


@shape_checked
def cached_attention(attn: nn.Module, x: Float[Tensor, "batch new d_model"],
                     cache: KVCache) -> Float[Tensor, "batch new d_model"]:
    """attn's causal self-attention for n new tokens x at absolute positions cache.length … cache.length+n-1.

    attn: a MultiHeadSelfAttention with RoPE (any module with its parts). The new tokens' queries, keys and values
    come from its projections; queries and keys are rotated by attn.rope at those positions; the rotated keys and the
    values go into the cache; each query attends to every cached key up to its own position (an (n, length+n) mask,
    none for one token); attn.fused selects F.scaled_dot_product_attention. The result equals attn on the whole
    sequence, rows of the new tokens.
    """
    if attn.rope is None:
        raise ValueError("cached_attention needs attention with RoPE (built with max_seq_len and theta)")
    batch, new, _ = x.shape
    start = cache.length
    q, k, v = (proj(x).view(batch, new, attn.num_heads, attn.d_k).transpose(1, 2)
               for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    positions = range(start, start + new)  # consecutive: RoPE checks a range without a read-back
    q, k = attn.rope(q, positions), attn.rope(k, positions)
    keys, values = cache.append(k, v)
    mask = None if new == 1 else torch.ones(new, start + new, dtype=torch.bool, device=x.device).tril(diagonal=start)
    if attn.fused:
        attended = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    else:
        attended = scaled_dot_product_attention(q, keys, values, mask)
    return attn.output_proj(attended.transpose(1, 2).reshape(batch, new, attn.d_model))


def _check_ids(model: TransformerLM, token_ids: Tensor, caches: list[KVCache]) -> None:
    """cached_forward's checks, each an error that names the numbers. The ids' range is the embedding's check (the
    step's one read-back from the device), made before any cache is written."""
    if token_ids.ndim != 2 or token_ids.dtype.is_floating_point or token_ids.dtype == torch.bool:
        raise (TypeError if token_ids.ndim == 2 else ValueError)(
            f"cached_forward expects integer token ids of shape (batch, new), got dtype {token_ids.dtype} and shape "
            f"{tuple(token_ids.shape)}")
    if len(caches) != len(model.layers):
        raise ValueError(f"cached_forward needs one KVCache per block: {len(model.layers)} blocks, "
                         f"{len(caches)} caches")
    lengths = sorted({cache.length for cache in caches})
    if len(lengths) != 1:
        raise ValueError(f"cached_forward: the caches hold different numbers of positions {lengths}: start again "
                         "from empty caches")
    if caches[0].keys.shape[0] != token_ids.shape[0]:
        raise ValueError(f"cached_forward: the caches hold a batch of {caches[0].keys.shape[0]}, the token ids "
                         f"{token_ids.shape[0]}")
    if lengths[0] + token_ids.shape[1] > model.context_length:
        raise ValueError(f"cached_forward: {token_ids.shape[1]} new tokens after {lengths[0]} cached positions pass "
                         f"context_length={model.context_length}: slide the window (reset the caches, run the last "
                         f"{model.context_length} tokens), as generate does")


@shape_checked
def cached_forward(model: nn.Module, token_ids: Integer[Tensor, "batch new"],
                   caches: list[KVCache]) -> Float[Tensor, "batch new vocab"]:
    """A TransformerLM's logits for n new tokens that continue the text the caches hold, which are updated.

    The tokens sit at positions caches[i].length … length+n-1. Each block runs its own ln1, attention
    (cached_attention with its cache), ln2 and ffn on the new tokens only; then ln_final and lm_head. From empty
    caches with the whole prompt it is the prefill; then one token per call. The logits equal model(every id so
    far)'s rows of the new tokens, to rounding.

    Raises ValueError (TypeError for ids that are not integers) when the ids are not (batch, new) in
    [0, vocab_size), the caches are not one per block, of one length and of the ids' batch, or the tokens would pass
    context_length.
    """
    _check_ids(model, token_ids, caches)
    x = model.token_embeddings(token_ids)
    for block, cache in zip(model.layers, caches):
        x = x + cached_attention(block.attn, block.ln1(x), cache)
        x = x + block.ffn(block.ln2(x))
    return model.lm_head(model.ln_final(x))


_PARTS = ("token_embeddings", "layers", "ln_final", "lm_head")


@torch.no_grad()
def generate_with_cache(model: nn.Module, prompt_ids: Int[Tensor, "prompt"], max_new_tokens: int, *,
                        use_cache: bool = True, temperature: float = 1.0, top_k: int | None = None,
                        top_p: float | None = None, generator: torch.Generator | None = None,
                        eos_id: int | None = None) -> Int[Tensor, "new"]:
    """transformer_lm.generate with a KV cache: the same arguments, sampling and ids (to the rounding of the logits).

    With use_cache (the default) and a model made of TransformerLM's parts (token_embeddings, layers, ln_final,
    lm_head), the prompt runs once through cached_forward (the prefill), then each step runs the newest id alone.
    Past context_length the window slides: the model sees the last context_length ids at positions 0 … and every
    cached key and value is stale (rotated at an old position, computed with the dropped token in view), so the caches
    are refilled from the window, a prefill per step. use_cache=False, or any other model (with .context_length,
    mapping ids (1, seq) to logits), runs transformer_lm.generate. Each call starts from new caches.

    Raises ValueError as transformer_lm.generate does: the prompt not one non-empty sequence, max_new_tokens < 0, a
    sampling argument out of range.
    """
    if not use_cache or not all(hasattr(model, part) for part in _PARTS):
        return generate_uncached(model, prompt_ids, max_new_tokens, temperature=temperature, top_k=top_k,
                                 top_p=top_p, generator=generator, eos_id=eos_id)
    _check_generate(prompt_ids, max_new_tokens, temperature, top_k, top_p)
    caches = KVCache.for_model(model)
    ids, origin = prompt_ids, 0                  # the caches hold ids[origin : origin + caches[0].length]
    for _ in range(max_new_tokens):
        if max(0, len(ids) - model.context_length) != origin:  # the window slid: every cached position is stale
            origin = max(0, len(ids) - model.context_length)
            for cache in caches:
                cache.reset()
        logits = cached_forward(model, ids[origin + caches[0].length:].unsqueeze(0), caches)[0, -1]
        if temperature == 0:
            next_id = logits.argmax().view(1)
        else:
            next_id = torch.multinomial(next_token_distribution(logits, temperature, top_k, top_p), 1,
                                        generator=generator)
        ids = torch.cat([ids, next_id.to(ids.dtype)])
        if eos_id is not None and next_id.item() == eos_id:
            break
    return ids[prompt_ids.numel():]

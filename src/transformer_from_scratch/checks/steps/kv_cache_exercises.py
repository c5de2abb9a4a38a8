"""Self-checks for the exercises of notebook 12 (KV cache): the memory of Llama 2 13B's cache, the length from which
a cached step of the course's model at GPT-2 XL's shape spends more on attention than on its weights, and
grouped-query attention over a cache with fewer key/value heads than query heads.

The contract is the step checks' (``transformer_from_scratch.checks.steps``): right, one line starting with ✓ that
says what was checked, never the answer; wrong, an ``AssertionError`` whose first line names the mistake and the
principle to fix it, never the code. The answers are computed here, out of the learner's view.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .._harness import call, close, describe, expect_tensor, fail, generator, passed

# ---------------------------------------------------------------------------------------------------------
# Exercise 1 · the KV cache of Llama 2 13B: 40 layers, d_model 5,120, 4,096 tokens, float16
# ---------------------------------------------------------------------------------------------------------

_LLAMA_13B = dict(layers=40, heads=40, tokens=4_096, d_k=128)  # d_model = 40 heads · 128 = 5,120


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9)


def check_kv_cache_gib(gib_13b: Any, gib_13b_batch8: Any) -> None:
    """Check exercise 1: ``gib_13b``, the GiB (2**30 bytes) of Llama 2 13B's KV cache for one sequence of 4,096
    tokens in float16, and ``gib_13b_batch8``, for a batch of 8. The answer is counted here from the bytes of real
    cache tensors made on the ``meta`` device (shapes, no memory).

    Mistakes it recognises: half the cache (keys or values only, or 1 byte a number); float32's 4 bytes; GB (1e9
    bytes) for GiB; one layer's cache; the batch counted in the per-sequence figure; the batch not multiplying it.
    """
    sizes = _LLAMA_13B
    one = torch.empty(1, sizes["heads"], sizes["tokens"], sizes["d_k"], dtype=torch.float16, device="meta").nbytes
    per_sequence = 2 * sizes["layers"] * one  # a key and a value tensor per layer
    right = per_sequence / 2**30
    for name, value in (("gib_13b", gib_13b), ("gib_13b_batch8", gib_13b_batch8)):
        if not _is_number(value):
            fail(f"{name} is {describe(value)}, not a number", "write the GiB as a Python number")
    if not _same(gib_13b, right):
        mistakes = [
            (right / 2, "gib_13b is half the cache: each layer keeps a key and a value per position, two tensors, "
                        "and each float16 number takes 2 bytes"),
            (right * 2, "gib_13b counts 4 bytes a number, float32's: float16 takes 2 bytes"),
            (per_sequence / 1e9, "gib_13b is in GB (1e9 bytes): a GiB is 2**30 bytes"),
            (right / sizes["layers"], "gib_13b is one layer's cache: each of the 40 layers keeps its own"),
            (8 * right, "gib_13b counts the batch of 8: it is the cache of one sequence, and the batch goes into "
                        "gib_13b_batch8"),
        ]
        for wrong, message in mistakes:
            if _same(gib_13b, wrong):
                fail(message, "count 2 · L · t · d_model numbers per sequence, their bytes, then GiB")
        fail(f"gib_13b is {gib_13b:.4g}, not the float16 cache of one sequence of 4,096 tokens",
             "count 2 · L · t · d_model numbers per sequence (a key and a value per layer and position), 2 bytes "
             "each, and divide the bytes by 2**30")
    if not _same(gib_13b_batch8, 8 * right):
        if _same(gib_13b_batch8, right):
            fail("gib_13b_batch8 is one sequence's cache: the batch does not share it",
                 "each of the 8 sequences keeps a cache of its own")
        fail(f"gib_13b_batch8 is {gib_13b_batch8 / gib_13b:.4g} × gib_13b, not the cache of 8 sequences",
             "each sequence of the batch keeps a cache of its own: the batch multiplies it")
    passed("gib_13b and gib_13b_batch8: a key and a value per layer and position, 2 bytes a number, in GiB; one "
           "cache per sequence of the batch (counted from cache tensors on the meta device)")


# ---------------------------------------------------------------------------------------------------------
# Exercise 2 · from which position does attention cost more than the rest of a cached step?
# ---------------------------------------------------------------------------------------------------------

_D, _D_FF = 1_600, 6_400  # the course's model at GPT-2 XL's shape: SwiGLU's three matrices of width d_ff


def check_t_attention(t_attention: Any) -> None:
    """Check exercise 2: ``t_attention``, the position t from which a cached step of the course's model at GPT-2
    XL's shape (d = 1,600, SwiGLU with d_ff = 6,400) spends more FLOPs per block on attention over t keys (4·t·d)
    than on the four projections and the FFN (8·d² + 6·d·d_ff).

    Mistakes it recognises: a two-matrix MLP (OpenAI's GPT-2 XL, 4·d·d_ff) or the FFN alone; the FFN left out;
    attention counted as 2·t·d (the scores only); d not cancelled.
    """
    if not _is_number(t_attention):
        fail(f"t_attention is {describe(t_attention)}, not a number", "write the position t as a Python number")
    rest = 8 * _D**2 + 6 * _D * _D_FF
    if _same(4 * t_attention * _D, rest):
        passed("t_attention: where attention over t keys (4·t·d per block) equals the four projections and "
               "SwiGLU's three matrices (8·d² + 6·d·d_ff), for d = 1,600 and d_ff = 6,400")
        return
    mistakes = [
        ((8 * _D**2 + 4 * _D * _D_FF) / (4 * _D),
         "t_attention counts two matrices in the FFN, or the FFN alone: the course's model has SwiGLU's three "
         "(6·d·d_ff), and the rest of the block is the four projections and the FFN together"),
        (8 * _D**2 / (4 * _D), "t_attention leaves the FFN out: the rest of the block is the four projections "
                               "and the FFN"),
        (rest / (2 * _D), "t_attention counts the attention as 2·t·d: the scores and the weighted sum of the "
                          "values cost 2·t·d each"),
        (rest / 4, "t_attention still carries a factor of d: both sides are FLOPs proportional to d, which "
                   "cancels"),
    ]
    for wrong, message in mistakes:
        if _same(t_attention, wrong):
            fail(message, "solve 4·t·d = 8·d² + 6·d·d_ff for t")
    side = "less" if 4 * t_attention * _D < rest else "more"
    fail(f"at t = {t_attention:,}, the attention over t keys costs {side} than the rest of the block, not the same",
         "solve 4·t·d = 8·d² + 6·d·d_ff for t, with d = 1,600 and d_ff = 6,400")


# ---------------------------------------------------------------------------------------------------------
# Exercise 3 · grouped-query attention over a cache of H_kv key/value heads
# ---------------------------------------------------------------------------------------------------------

# (batch, query heads, KV heads, new queries, keys, d_k): groups of 4, 2, 1 (ordinary) and 4 (one KV head)
_GQA_CASES = [(2, 8, 2, 3, 7, 16), (1, 6, 3, 2, 5, 8), (2, 4, 4, 3, 6, 8), (1, 4, 1, 1, 5, 8)]


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None = None) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _by_head(t: Tensor, index: Tensor) -> Tensor:
    return t.index_select(1, index)


def check_gqa_attention(gqa_attention: Callable[..., Tensor]) -> None:
    """Check exercise 3: ``gqa_attention(q, keys, values, mask)``, with ``q`` (batch, H, n, d_k), ``keys`` and
    ``values`` (batch, H_kv, m, d_k) and ``mask`` (n, m) bool or None, returns (batch, H, n, d_k): query head h
    attends with key and value head h // (H / H_kv). Float64, groups of 4, 2, 1 and 4 (a single KV head), with no
    mask and with the bottom-right causal mask of a cache.

    Mistakes it recognises: the groups interleaved (query head h with KV head h mod H_kv); one output per KV head
    instead of per query head; the mask not applied; a mask aligned to the first key (top left); keys and values
    swapped; scores not scaled by 1/√d_k.
    """
    with torch.random.fork_rng(devices=[]):
        gen = generator(6)
        for batch, heads, kv_heads, new, total, d_k in _GQA_CASES:
            group = heads // kv_heads
            q = torch.randn(batch, heads, new, d_k, generator=gen, dtype=torch.float64)
            keys = torch.randn(batch, kv_heads, total, d_k, generator=gen, dtype=torch.float64)
            values = torch.randn(batch, kv_heads, total, d_k, generator=gen, dtype=torch.float64)
            right_heads = torch.arange(heads) // group
            tiled_heads = torch.arange(heads) % kv_heads
            k, v = _by_head(keys, right_heads), _by_head(values, right_heads)
            bottom_right = torch.ones(new, total, dtype=torch.bool).tril(diagonal=total - new)
            top_left = torch.ones(new, total, dtype=torch.bool).tril()
            for mask in (None, bottom_right):
                what = (f"gqa_attention(q, keys, values, mask) with {heads} query heads, {kv_heads} KV head"
                        f"{'s' * (kv_heads > 1)}, {new} queries and {total} keys, "
                        + ("no mask" if mask is None else "the cache's causal mask"))
                out = call(what, gqa_attention, q.clone(), keys.clone(), values.clone(),
                           None if mask is None else mask.clone())
                if isinstance(out, Tensor) and tuple(out.shape) == (batch, kv_heads, new, d_k) and group > 1:
                    fail(f"{what} returns one output per KV head, {kv_heads}, not one per query head, {heads}",
                         "every query head attends and gets its own output: each KV head serves the "
                         f"{group} query heads of its group")
                expect_tensor(what, out, (batch, heads, new, d_k), "return one output per query head, (batch, H, "
                              "n, d_k), in q's dtype", dtype=q.dtype)
                expected = _attend(q, k, v, mask)
                if close(out, expected):
                    continue
                variants = [
                    (lambda: _attend(q, _by_head(keys, tiled_heads), _by_head(values, tiled_heads), mask),
                     "query head h attends with KV head h mod H_kv: the groups are interleaved",
                     f"each KV head serves H / H_kv consecutive query heads (here {group}): query head h uses KV head "
                     "h // (H / H_kv), so each KV head is repeated next to itself"),
                    (lambda: _attend(q, k, v, None), "the mask is not applied",
                     "with a cache, each new query sees the keys up to its own position only: pass the mask to the "
                     "attention"),
                    (lambda: _attend(q, k, v, top_left),
                     "the causal triangle sits at the top left, as if the first new query started the text",
                     "use the mask given: with a cache its triangle sits at the bottom right (Step 2)"),
                    (lambda: _attend(q, v, k, mask), "keys and values are swapped",
                     "the scores compare queries with keys; the values are what the weights average"),
                    (lambda: _attend(q, k, v, mask, scale=1.0), "the scores are not scaled by 1/√d_k",
                     "divide the scores by √d_k, as scaled_dot_product_attention does"),
                ]
                for wrong, mistake, fix in variants:
                    wrong = wrong()
                    if not close(wrong, expected) and close(out, wrong):
                        fail(mistake, fix, f"on {what}: yours matches that mistake")
                difference = (out.detach().cpu().to(torch.float64) - expected).abs().max().item()
                fail(f"{what} differs from grouped-query attention by up to {difference:.3g}",
                     "query head h attends, as in ordinary attention, with KV head h // (H / H_kv)")
    passed("gqa_attention: each group of H / H_kv consecutive query heads attends with its shared key and value "
           "head (groups of 4, 2, 1 and a single KV head; no mask and the cache's causal mask; float64)")

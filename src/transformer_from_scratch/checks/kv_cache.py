"""``check_kv_cache``: the learner's ``KVCache`` (notebook 12) on its own (preallocated, written in place, reset,
counted), then inside the course's ``TransformerLM``, whose attention (notebook 08's hook) calls its ``update``: the
logits of a prompt and then single tokens against the model on the whole sequence, with multi-head and grouped-query
attention. The decoding loop that makes and resets the caches is notebook 10's ``generate``, checked by
``check_generate``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._fixtures import LM_CTX, LM_D, LM_DFF, LM_DK, LM_H, LM_KV, LM_L, LM_THETA, LM_V, small_lm
from ._harness import call, close, describe, expect_tensor, fail, generator, passed

# The small model of checks/_fixtures.py, under this module's short names (checks/generate.py imports _CTX, _model).
_V, _CTX, _D, _L, _H, _KV, _DFF, _THETA, _DK = LM_V, LM_CTX, LM_D, LM_L, LM_H, LM_KV, LM_DFF, LM_THETA, LM_DK
_model = small_lm


def _check_cache_class(cache_class: Any) -> None:
    """Sizes, zeros, update returning views of every position so far, length, the overflow error, reset, nbytes."""
    what = "KVCache(2, 3, 7, 4, dtype=torch.float64)"
    cache = call(what, cache_class, 2, 3, 7, 4, dtype=torch.float64)
    for name in ("keys", "values"):
        buffer = getattr(cache, name, None)
        if not isinstance(buffer, Tensor) or tuple(buffer.shape) != (2, 3, 7, 4) or buffer.dtype != torch.float64:
            fail(f"{what}.{name} is {describe(buffer)}, expected a float64 tensor of shape (2, 3, 7, 4), made once",
                 "preallocate each buffer once in __init__, zeros of shape (batch, num_kv_heads, max_seq_len, d_k) "
                 "on the device and in the dtype given")
    if getattr(cache, "length", None) != 0:
        fail(f"a new KVCache has length {getattr(cache, 'length', None)!r}, not 0",
             "a new cache holds no position yet: its length starts at 0")
    gen = generator(5)
    written = []
    for n in (3, 1):
        k, v = (torch.randn(2, 3, n, 4, generator=gen, dtype=torch.float64) for _ in range(2))
        written.append((k, v))
        out = call(f"KVCache.update(k, v) with {n} new positions", cache.update, k, v)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            fail(f"KVCache.update returned {describe(out)}, not (keys so far, values so far)",
                 "return both: the keys and the values of every position so far")
        end = sum(t.shape[2] for t, _ in written)
        expected_k, expected_v = (torch.cat([w[i] for w in written], dim=2) for i in (0, 1))
        expect_tensor("KVCache.update", out[0], (2, 3, end, 4), "return the keys of every position so far")
        if not torch.equal(out[0], expected_k) or not torch.equal(out[1], expected_v):
            fail("KVCache.update does not return the keys and values written so far, in order",
                 "write the new ones at positions length … length + n − 1, then return positions 0 … length + n − 1 "
                 "of each buffer")
        if out[0].untyped_storage().data_ptr() != cache.keys.untyped_storage().data_ptr():
            fail("KVCache.update returns a copy, not a view of self.keys",
                 "write into self.keys in place and return a slice of it (no torch.cat)")
        if cache.length != end:
            fail(f"after writing {end} positions, KVCache.length is {cache.length}", "advance self.length by n")
    k = torch.zeros(2, 3, 4, 4, dtype=torch.float64)
    try:
        cache.update(k, k)
    except ValueError:
        pass
    except Exception as error:  # noqa: BLE001
        fail(f"KVCache.update past max_seq_len raised {type(error).__name__}, not ValueError",
             "check length + n <= max_seq_len first and raise ValueError naming the numbers")
    else:
        fail("KVCache.update accepts 4 positions after 4 cached ones with max_seq_len 7",
             "raise ValueError when length + n > max_seq_len: past the context the window slides")
    call("KVCache.reset()", cache.reset)
    if cache.length != 0:
        fail(f"KVCache.reset() leaves length at {cache.length}", "a reset cache holds no position: its length goes "
             "back to 0 (the memory stays allocated)")
    if getattr(cache, "nbytes", None) != 2 * 2 * 3 * 7 * 4 * 8:
        fail(f"KVCache.nbytes is {getattr(cache, 'nbytes', None)!r}, not 2 · 2·3·7·4 · 8 = {2 * 2 * 3 * 7 * 4 * 8} "
             "bytes", "count both buffers, the keys and the values, filled or not")


def _check_for_model(cache_class: Any) -> None:
    """One cache per block, of the attention's key/value heads, the context, the weights' device and dtype."""
    for kv in (_H, _KV):
        model = _model(num_kv_heads=kv)
        caches = call("KVCache.for_model(model, batch=2)", cache_class.for_model, model, 2)
        shapes = [tuple(c.keys.shape) for c in caches] if isinstance(caches, list) else None
        if shapes == [(2, _H, _CTX, _DK)] * _L and kv != _H:
            fail(f"KVCache.for_model makes caches of {_H} heads for a model whose attention has {kv} key/value heads: "
                 "the attention stores its key/value heads only", "size each cache with attn.num_kv_heads")
        if shapes != [(2, kv, _CTX, _DK)] * _L or any(c.keys.dtype != torch.float64 for c in caches):
            fail(f"KVCache.for_model(model, batch=2) does not return {_L} caches of shape (2, {kv}, {_CTX}, {_DK}) "
                 f"in the model's dtype (it returned {describe(caches)})", "one cache per block: (batch, "
                 "attn.num_kv_heads, model.context_length, attn.d_k), on the device and in the dtype of the model's "
                 "weights")
    model = _model(num_kv_heads=_KV)
    caches = call("KVCache.for_model(model, batch=1, max_seq_len=3)", cache_class.for_model, model, 1, max_seq_len=3)
    lengths = [c.keys.shape[2] for c in caches] if isinstance(caches, list) else None
    if lengths != [3] * _L:
        fail(f"KVCache.for_model(model, batch=1, max_seq_len=3) makes caches of {lengths} positions, not 3 each: "
             "max_seq_len is ignored", "size every cache with max_seq_len when it is given (generate asks for no "
             "more than its prompt and reply take), the whole context when it is None")


def _check_in_the_model(cache_class: Any) -> None:
    """The course's model with the learner's caches: every prompt length, then single tokens, and a chunk after
    cached positions, equal the model on the whole sequence; float64 to 1e-10, float32 to 1e-5; MHA and GQA."""
    gen = generator(1)
    for kv in (_H, _KV):
        for dtype, tolerance in [(torch.float64, 1e-10), (torch.float32, 1e-5)]:
            model = _model(dtype, num_kv_heads=kv)
            ids = torch.randint(0, _V, (2, _CTX), generator=gen)
            with torch.no_grad():
                expected = model(ids)
            schedules = [[p] + [1] * (_CTX - p) for p in range(1, _CTX + 1)] + [[2, 1, 3, 2]]
            for chunks in (schedules if dtype == torch.float64 else schedules[::3]):
                what = (f"the model ({kv} key/value heads of {_H}, {dtype}) with your caches: a prompt of "
                        f"{chunks[0]}, then {chunks[1:]}")
                caches = call("KVCache.for_model(model, batch=2)", cache_class.for_model, model, 2)
                rows, start = [], 0
                with torch.no_grad():
                    for n in chunks:
                        rows.append(call(what, model, ids[:, start:start + n], cache=caches))
                        start += n
                got = torch.cat(rows, dim=1)
                if not close(got, expected, rtol=0, atol=tolerance):
                    difference = (got.double() - expected.double()).abs().max().item()
                    fail(f"{what}: the logits differ from the model's on the whole sequence by up to {difference:.3g}",
                         "update must write the new keys and values at positions length … length + n − 1 of its "
                         "buffers and return positions 0 … length + n − 1, so that each new query meets every key "
                         "before it")


def check_kv_cache(cache_class: Any) -> None:
    """Check the learner's ``KVCache`` class; print one line if right, else raise ``AssertionError``.

    Checked: KVCache(batch, num_kv_heads, max_seq_len, d_k, device=, dtype=) preallocates zero keys and values, update
    returns views of every position so far and advances length, refuses to overflow (ValueError), reset, nbytes;
    for_model makes one cache per block of the attention's key/value heads; and the course's TransformerLM (2 blocks,
    11 ids, context 8; 4 heads, or 4 query heads over 2 key/value heads) with these caches, for every prompt length
    1 … 8 followed by single tokens and a chunk after cached positions, gives the logits of the whole sequence,
    float64 to 1e-10 and float32 to 1e-5.

    Mistakes it recognises (by name, in the first line of the error):
        * a cache that is not preallocated, update returning copies, or not the positions written so far, or not
          advancing length; no overflow error; a reset that keeps the length; nbytes not counting keys and values;
        * for_model sized with the query heads (num_heads) instead of the key/value heads.
    """
    with torch.random.fork_rng(devices=[]):
        _check_cache_class(cache_class)
        _check_for_model(cache_class)
        _check_in_the_model(cache_class)
    passed("check_kv_cache: KVCache preallocated, updated in place, reset, counted; one per block, of the key/value "
           "heads; in the model, prompts of 1 … 8 tokens then single ones = the whole sequence (float64 to 1e-10, "
           "float32 to 1e-5), multi-head and grouped-query")

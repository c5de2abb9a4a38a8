"""``check_kv_cache``: the learner's ``KVCache``, ``cached_forward`` and ``generate`` (notebook 12) against the course's
``TransformerLM`` run on the whole sequence (its uncached forward) and the course's ``generate`` without a cache.
The classic mistakes are the same cached computation with one knob turned (``_steps``), built from the reference's
pieces with the model's own RoPE tables (so that a right answer matches to 1e-10 in float64)."""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import reference
from ..transformer_lm import TransformerLM
from ..transformer_lm import generate as generate_uncached
from ._harness import call, close, describe, expect_tensor, fail, generator, passed

# 11 ids, context 8, d_model 12 in 3 heads of 4, 2 layers, SwiGLU width 16: every size differs.
_V, _CTX, _D, _L, _H, _DFF, _THETA = 11, 8, 12, 2, 3, 16, 10000.0
_DK = _D // _H


def _model(dtype: torch.dtype = torch.float64, seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    model = TransformerLM(_V, _CTX, _D, _L, _H, _DFF, _THETA, dtype=dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("ln1.weight", "ln2.weight", "ln_final.weight")):
                p.add_(0.3 * torch.randn_like(p))  # gains away from 1, so that each norm shows
    return model


def _mask(new: int, total: int, diagonal: int) -> Tensor:
    return torch.ones(new, total, dtype=torch.bool).tril(diagonal=diagonal)


def _steps(model: TransformerLM, ids: Tensor, chunks: list[int], *, restart: bool = False, rotate_again: bool = False,
           mask: str = "right") -> Tensor:
    """The cached forward over ``chunks`` of ids (batch, seq), from built-ins, right or with one classic mistake."""
    sd = {name: p.detach() for name, p in model.state_dict().items()}
    keys = [torch.zeros(ids.shape[0], _H, _CTX, _DK, dtype=sd["lm_head.weight"].dtype) for _ in range(_L)]
    values = [torch.zeros_like(k) for k in keys]
    outs, start = [], 0
    for n in chunks:
        x = F.embedding(ids[:, start:start + n], sd["token_embeddings.weight"])
        positions = torch.arange(n) if restart else torch.arange(start, start + n)
        for i in range(_L):
            j, p, rope = i, f"layers.{i}.", model.layers[i].attn.rope
            h = reference.rms_norm(x, sd[p + "ln1.weight"])
            q, k, v = (reference.split_heads(F.linear(h, sd[f"{p}attn.{c}_proj.weight"]), _H) for c in "qkv")
            q, k = rope(q, positions), rope(k, positions)
            keys[j][:, :, start:start + n], values[j][:, :, start:start + n] = k, v
            k_all = keys[j][:, :, :start + n]
            if rotate_again:
                k_all = rope(k_all, torch.arange(start + n))
            m = {"right": _mask(n, start + n, start), "none": None, "top-left": _mask(n, start + n, 0)}[mask]
            attended = reference.attention(q, k_all, values[j][:, :, :start + n], m)
            x = x + F.linear(reference.merge_heads(attended), sd[p + "attn.output_proj.weight"])
            x = x + reference.swiglu(reference.rms_norm(x, sd[p + "ln2.weight"]), sd[p + "ffn.w1.weight"],
                                     sd[p + "ffn.w2.weight"], sd[p + "ffn.w3.weight"])
        outs.append(F.linear(reference.rms_norm(x, sd["ln_final.weight"]), sd["lm_head.weight"]))
        start += n
    return torch.cat(outs, dim=1)


_VARIANTS = [
    (dict(restart=True), "the positions restart at 0 at every call: the new tokens are rotated as if they started "
     "the sequence", "rotate the new tokens at cache.length … cache.length + n - 1, then advance cache.length"),
    (dict(rotate_again=True), "the cached keys are rotated again at every call (they were rotated when cached)",
     "rotate only the new keys, then append them; attend to the cached keys as they are"),
    (dict(mask="none"), "no causal mask: in a prefill each new query also sees the new tokens after it",
     "with n > 1 new tokens, query i (at position start + i) may attend to keys 0 … start + i only"),
    (dict(mask="top-left"), "the causal mask is aligned to the first key: after cached positions, new query i "
     "sees only keys 0 … i", "the n new queries are the last of the start + n positions: align the (n, start + n) "
     "mask to the last key, so that query i sees keys 0 … start + i"),
]


# ---------------------------------------------------------------------------------------------------------
# The steps
# ---------------------------------------------------------------------------------------------------------

def _check_cache_class(cache_class: Any) -> None:
    """Sizes, zeros, append returning views of every position so far, length, the overflow error, reset, nbytes,
    for_model."""
    what = "KVCache(2, 3, 7, 4, dtype=torch.float64)"
    cache = call(what, cache_class, 2, 3, 7, 4, dtype=torch.float64)
    for name in ("keys", "values"):
        buffer = getattr(cache, name, None)
        if not isinstance(buffer, Tensor) or tuple(buffer.shape) != (2, 3, 7, 4) or buffer.dtype != torch.float64:
            fail(f"{what}.{name} is {describe(buffer)}, expected a float64 tensor of shape (2, 3, 7, 4), made once",
                 "preallocate each buffer once in __init__, zeros of shape (batch, num_heads, max_len, d_k) on the "
                 "device and in the dtype given")
    if getattr(cache, "length", None) != 0:
        fail(f"a new KVCache has length {getattr(cache, 'length', None)!r}, not 0",
             "a new cache holds no position yet: its length starts at 0")
    gen = generator(5)
    written = []
    for n in (3, 1):
        k, v = (torch.randn(2, 3, n, 4, generator=gen, dtype=torch.float64) for _ in range(2))
        written.append((k, v))
        out = call(f"KVCache.append(k, v) with {n} new positions", cache.append, k, v)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            fail(f"KVCache.append returned {describe(out)}, not (keys so far, values so far)",
                 "return both: the keys and the values of every position so far")
        end = sum(t.shape[2] for t, _ in written)
        expected_k, expected_v = (torch.cat([w[i] for w in written], dim=2) for i in (0, 1))
        expect_tensor("KVCache.append", out[0], (2, 3, end, 4), "return the keys of every position so far")
        if not torch.equal(out[0], expected_k) or not torch.equal(out[1], expected_v):
            fail("KVCache.append does not return the keys and values appended so far, in order",
                 "write the new ones at positions length … length + n − 1, then return positions 0 … length + n − 1 "
                 "of each buffer")
        if out[0].untyped_storage().data_ptr() != cache.keys.untyped_storage().data_ptr():
            fail("KVCache.append returns a copy, not a view of self.keys",
                 "write into self.keys in place and return a slice of it (no torch.cat)")
        if cache.length != end:
            fail(f"after appending {end} positions, KVCache.length is {cache.length}", "advance self.length by n")
    k = torch.zeros(2, 3, 4, 4, dtype=torch.float64)
    try:
        cache.append(k, k)
    except ValueError:
        pass
    except Exception as error:  # noqa: BLE001
        fail(f"KVCache.append past max_len raised {type(error).__name__}, not ValueError",
             "check length + n <= max_len first and raise ValueError naming the numbers")
    else:
        fail("KVCache.append accepts 4 positions after 4 cached ones with max_len 7",
             "raise ValueError when length + n > max_len: past the context the window slides")
    call("KVCache.reset()", cache.reset)
    if cache.length != 0:
        fail(f"KVCache.reset() leaves length at {cache.length}", "a reset cache holds no position: its length goes "
             "back to 0 (the memory stays allocated)")
    if getattr(cache, "nbytes", None) != 2 * 2 * 3 * 7 * 4 * 8:
        fail(f"KVCache.nbytes is {getattr(cache, 'nbytes', None)!r}, not 2 · 2·3·7·4 · 8 = {2 * 2 * 3 * 7 * 4 * 8} "
             "bytes", "count both buffers, the keys and the values, filled or not")
    caches = call("KVCache.for_model(model, batch=2)", cache_class.for_model, _model(), 2)
    if not isinstance(caches, list) or len(caches) != _L or any(
            tuple(c.keys.shape) != (2, _H, _CTX, _DK) or c.keys.dtype != torch.float64 for c in caches):
        fail(f"KVCache.for_model(model, batch=2) does not return {_L} caches of shape (2, {_H}, {_CTX}, {_DK}) in the "
             "model's dtype", "one cache per block: (batch, attn.num_heads, model.context_length, attn.d_k), on "
             "the device and in the dtype of the model's weights")


def _feed(cache_class: Any, cached_forward: Callable, model: TransformerLM, ids: Tensor, chunks: list[int],
          what: str) -> Tensor:
    caches = call("KVCache.for_model(model, batch)", cache_class.for_model, model, ids.shape[0])
    outs, start = [], 0
    for n in chunks:
        step = f"{what}: cached_forward on {n} new token{'s' * (n > 1)} after {start}"
        with torch.no_grad():
            out = call(step, cached_forward, model, ids[:, start:start + n], caches)
        expect_tensor(step, out, (ids.shape[0], n, _V), "return the logits of every new token, (batch, n, vocab)")
        outs.append(out)
        start += n
    return torch.cat(outs, dim=1)


def _check_forward(cache_class: Any, cached_forward: Callable) -> None:
    """Every prompt length 1 … context_length, then one token at a time to the end; a chunk after cached positions;
    float64 to 1e-10, float32 to 1e-5."""
    gen = generator(1)
    for dtype, tolerance in [(torch.float64, 1e-10), (torch.float32, 1e-5)]:
        model = _model(dtype)
        ids = torch.randint(0, _V, (2, _CTX), generator=gen)
        with torch.no_grad():
            expected = model(ids)
        schedules = [[p] + [1] * (_CTX - p) for p in range(1, _CTX + 1)] + [[2, 1, 3, 2]]
        for chunks in (schedules if dtype == torch.float64 else schedules[::3]):
            what = f"a prompt of {chunks[0]} then chunks {chunks[1:]} ({dtype})"
            got = _feed(cache_class, cached_forward, model, ids, chunks, what)
            if close(got, expected, rtol=0, atol=tolerance):
                continue
            for knobs, mistake, fix in _VARIANTS:
                wrong = _steps(model, ids, chunks, **knobs)
                if not close(wrong, expected, rtol=0, atol=tolerance) and close(got, wrong, rtol=0, atol=tolerance):
                    fail(mistake, fix, f"on {what}: your logits match that mistake")
            difference = (got.double() - expected.double()).abs().max().item()
            fail(f"cached_forward's logits differ from the model's on the whole sequence by up to {difference:.3g} "
                 f"(tolerance {tolerance:g})", "compare each part with the model's forward: each block's two branches "
                 "(attention through its own cache at the new positions, then the feed-forward network), ln_final "
                 "and lm_head", f"on {what}")


class _Counter:
    """Counts the whole model's forward calls and the sizes of the inputs token_embeddings gets."""

    def __init__(self, model: TransformerLM) -> None:
        self.forward_calls, self.embedded = 0, []
        self.handles = [model.register_forward_hook(self._forward),
                        model.token_embeddings.register_forward_hook(self._embed)]

    def _forward(self, module: Any, inputs: Any, output: Any) -> None:
        self.forward_calls += 1

    def _embed(self, module: Any, inputs: Any, output: Any) -> None:
        self.embedded.append(inputs[0].shape[-1])

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _check_generate(generate: Callable) -> None:
    """Greedy and seeded samples equal the uncached generate's, before and after the window slides; the prompt runs
    once, then one token per step; a second prompt starts from an empty cache; eos_id stops."""
    if "use_cache" not in inspect.signature(generate).parameters:
        fail("generate_with_cache has no use_cache argument", "add it as a keyword argument, use_cache: bool = True")
    model = _model(torch.float32, seed=2)
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([7, 0, 9, 4, 4])]
    for case in range(3):
        for prompt in prompts:  # the second prompt after the first: a cache kept across calls shows here
            n, kwargs = [(_CTX - len(prompt), dict(temperature=0)), (_CTX + 4, dict(temperature=0)),
                         (_CTX + 4, dict(temperature=1.0, top_k=5))][case]
            sampled = kwargs.get("temperature") != 0
            seeded = (lambda: dict(generator=torch.Generator().manual_seed(3))) if sampled else dict
            what = f"generate_with_cache(model, prompt_ids={prompt.tolist()}, max_new_tokens={n}, {kwargs})"
            expected = generate_uncached(model, prompt, n, **kwargs, **seeded())
            counter = _Counter(model)
            try:
                got = call(what, generate, model, prompt, n, **kwargs, **seeded())
            except AssertionError as error:
                if prompt is prompts[1]:
                    fail("generate_with_cache keeps a cache across calls: the second prompt continues the first one's",
                         "make new caches (KVCache.for_model) inside every call of generate_with_cache",
                         f"on {what}: {str(error).splitlines()[0]}")
                if n > _CTX - len(prompt) and "context_length" in str(error.__cause__ or ""):
                    fail("generate_with_cache does not slide the window: the caches overflow once the text passes "
                         "context_length", "once len(ids) > context_length, reset the caches and run the last "
                         "context_length ids", f"on {what}: {str(error.__cause__).splitlines()[0]}")
                raise
            finally:
                counter.remove()
            if counter.forward_calls:
                fail("generate_with_cache runs the whole model (model(ids)) at every step: the cache is not used",
                     "with use_cache, run the prompt once through cached_forward, then one new token per step",
                     f"on {what}")
            if counter.embedded and counter.embedded[0] != min(len(prompt), _CTX):
                fail(f"generate_with_cache's first cached_forward got {counter.embedded[0]} tokens, not the prompt's "
                     f"{len(prompt)}", "the prefill runs the whole prompt (its last context_length ids) once",
                     f"on {what}")
            within = _CTX - len(prompt)
            if any(size != 1 for size in counter.embedded[1:within + 1]):
                fail("after the prefill, generate_with_cache runs more than the newest token per step",
                     "give cached_forward only what the caches do not hold yet: the newest id", f"on {what}")
            if n > within + 1 and any(size != _CTX for size in counter.embedded[within + 1:]):
                fail("after the window slides, generate_with_cache keeps the stale cache: its keys were rotated at "
                     "their old positions and computed with the dropped token in view",
                     "once len(ids) > context_length, reset the caches and run the whole window at positions "
                     "0 … context_length - 1", f"on {what}")
            if not isinstance(got, Tensor) or got.tolist() != expected.tolist():
                if prompt is prompts[1] and not sampled:
                    fail("generate_with_cache keeps a cache across calls: the second prompt continues the first one's",
                         "make new caches (KVCache.for_model) inside every call of generate_with_cache", f"on {what}")
                fail(f"{what} returned {got.tolist() if isinstance(got, Tensor) else describe(got)}, not the "
                     f"uncached generate's {expected.tolist()}", "pick each id exactly as transformer_lm.generate "
                     "does (argmax at temperature 0, else torch.multinomial with generator)")
    eos = generate_uncached(model, prompts[0], 4, temperature=0)[1].item()
    got = call("generate_with_cache(..., eos_id=...)", generate, model, prompts[0], 10, temperature=0, eos_id=eos)
    if got.tolist() != generate_uncached(model, prompts[0], 10, temperature=0, eos_id=eos).tolist():
        fail("generate_with_cache does not stop right after emitting eos_id",
             "after appending an id equal to eos_id, stop")


def check_kv_cache(cache_class: Any, cached_forward: Callable[..., Tensor], generate: Callable[..., Tensor]) -> None:
    """Check the learner's ``KVCache`` class, ``cached_forward(model, token_ids, caches)`` and ``generate_with_cache(
    model, prompt_ids, max_new_tokens, *, use_cache=True, ...)`` (passed as ``generate``); print one line if right,
    else raise ``AssertionError``.

    Checked: KVCache(batch, num_heads, max_len, d_k, device=, dtype=) preallocates zero keys and values, append
    returns views of every position so far and advances length, refuses to overflow (ValueError), reset, nbytes,
    for_model; cached_forward's logits against the course's TransformerLM on the whole sequence (2 blocks, 11 ids,
    context 8) for every prompt length 1 … 8 followed by single tokens, and a chunk after cached positions, float64
    to 1e-10 and float32 to 1e-5; generate against the course's generate without a cache: greedy and a seeded
    top-k sample, within the context and past it (the window slides), two prompts in a row, eos_id.

    Mistakes it recognises (by name, in the first line of the error):
        * positions restarting at 0 at every call; the cached keys rotated again; no causal mask in a prefill;
          the mask aligned to the first key;
        * a cache that is not preallocated, append returning copies or not advancing length, no overflow error,
          nbytes not counting keys and values;
        * generate: no use_cache argument; the whole model run at every step; more than the newest token per step;
          the window never slid (the caches overflow); the stale cache kept after the slide; a cache kept across
          calls; no stop at eos_id.
    """
    with torch.random.fork_rng(devices=[]):
        _check_cache_class(cache_class)
        _check_forward(cache_class, cached_forward)
        _check_generate(generate)
    passed("check_kv_cache: KVCache preallocated, appended in place, reset, counted; cached_forward = the model on the "
           "whole sequence for prompts of 1 … 8 tokens then single tokens, and a chunk (float64 to 1e-10, float32 to "
           "1e-5); generate = the uncached generate, greedy and sampled, past the window, two prompts in a row")

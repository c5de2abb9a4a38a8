"""``check_generate``: the learner's ``generate`` (notebook 10), the one decoding loop, on the course's
``TransformerLM`` with the course's ``KVCache``: with the cache (the default) and without it, its ids equal the
course's ``generate`` without a cache, greedy and sampled, within the context and past it; and the calls it makes are
counted (a forward pre-hook sees how many ids each call gets, and whether it brings the caches), so that a loop that
gives the right ids the slow way is named too."""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
from torch import Tensor

from ..transformer_lm import TransformerLM
from ..transformer_lm import generate as course_generate
from ._harness import call, describe, expect_tensor, fail, passed
from ._fixtures import LM_CTX as _CTX, small_lm as _model


class _Calls:
    """Each forward call of the model: how many ids it got, and whether it brought caches."""

    def __init__(self, model: TransformerLM) -> None:
        self.sizes: list[int] = []
        self.cached: list[bool] = []
        self.handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module: Any, args: tuple, kwargs: dict) -> None:
        self.sizes.append(args[0].shape[-1])
        self.cached.append(kwargs.get("cache") is not None)

    def remove(self) -> None:
        self.handle.remove()


def _expected_sizes(prompt: int, n: int, *, cached: bool) -> list[int]:
    """What each step should give the model: the prefill then single ids (with the cache), re-prefilled with the whole
    window once it slides; the whole window at every step without the cache."""
    sizes, length = [], prompt
    for step in range(n):
        window = min(length, _CTX)
        if not cached:
            sizes.append(window)
        elif step == 0 or length > _CTX:
            sizes.append(window)
        else:
            sizes.append(1)
        length += 1
    return sizes


def check_generate(generate: Callable[..., Tensor]) -> None:
    """Check the learner's ``generate(model, prompt_ids, max_new_tokens, *, use_cache=True, temperature, top_k,
    top_p, generator, eos_id)``; print one line if right, else raise ``AssertionError``.

    Checked on the course's TransformerLM (2 blocks, 11 ids, context 8) with the course's KVCache: greedy and a
    seeded top-k sample, within the context and past it (the window slides), two prompts in a row, with and without
    the cache, against the course's generate without a cache; the model's calls (the prompt once, then one id per
    step; the whole window again after each slide; the whole window every step without the cache); eos_id.

    Mistakes it recognises (by name, in the first line of the error): no use_cache argument; the cache never used;
    more than the newest id per step; the window never slid (the caches overflow); the stale cache kept after the
    slide; a cache kept across calls; use_cache=False still caching; no stop at eos_id; ids picked otherwise than
    the argmax at temperature 0 and one torch.multinomial draw with the generator otherwise; on_token (when generate
    takes it) not called with each id as it is picked (only at the end), with something else than the ids returned
    (eos_id left out, tensors in place of ints), or not at all.
    """
    if "use_cache" not in inspect.signature(generate).parameters:
        fail("generate has no use_cache argument", "add it as a keyword argument, use_cache: bool = True")
    with torch.random.fork_rng(devices=[]):
        model = _model(torch.float32, seed=2)
        cache_ready = _cache_ready(generate, model)
        prompts = [torch.tensor([1, 2, 3]), torch.tensor([7, 0, 9, 4, 4])]
        cases = [(None, dict(temperature=0)), (_CTX + 4, dict(temperature=0)), (_CTX + 4, dict(temperature=1.0, top_k=5))]
        for use_cache in (True, False) if cache_ready else (False,):
            for count, kwargs in cases:
                for prompt in prompts:  # the second prompt after the first: a cache kept across calls shows here
                    _check_one(generate, model, prompt, count or _CTX - len(prompt), kwargs, use_cache,
                               second=prompt is prompts[1])
        eos = course_generate(model, prompts[0], 4, temperature=0, use_cache=False)[1].item()
        got = call("generate(..., eos_id=...)", generate, model, prompts[0], 10, temperature=0, eos_id=eos)
        if not isinstance(got, Tensor) or got.tolist() != course_generate(model, prompts[0], 10, temperature=0,
                                                                          eos_id=eos, use_cache=False).tolist():
            fail("generate does not stop right after emitting eos_id", "after appending an id equal to eos_id, stop")
        if "on_token" in inspect.signature(generate).parameters:
            _check_on_token(generate, model, prompts[0], eos)
    if not cache_ready:
        passed("check_generate: without a cache (use_cache=False), the ids of the course's generate, greedy and "
               "sampled, within the context and past it, the whole window every step; eos_id stops. The cache's part "
               "waits for your KVCache of notebook 12 (still a stub): run this check again once it is written")
        return
    passed("check_generate: the ids of generate without a cache, greedy and sampled, within the context and past it, "
           "two prompts in a row; with the cache, the prompt once, then one id per step, the window again after each "
           "slide; without it, the whole window every step; eos_id stops; on_token told of each id as it is picked")


def _cache_ready(generate: Callable[..., Tensor], model: TransformerLM) -> bool:
    """Whether the KVCache that generate's module uses is written: in the student edition, notebook 10 comes before
    notebook 12, whose KVCache is a stub until then, and _new_cache (given, beside generate) returns None for it."""
    new_cache = getattr(inspect.unwrap(generate), "__globals__", {}).get("_new_cache")
    return new_cache is None or new_cache(model, model.context_length) is not None


def _check_one(generate: Callable[..., Tensor], model: TransformerLM, prompt: Tensor, n: int, kwargs: dict,
               use_cache: bool, *, second: bool) -> None:
    sampled = kwargs.get("temperature") != 0
    seeded = (lambda: dict(generator=torch.Generator().manual_seed(3))) if sampled else dict
    what = f"generate(model, prompt_ids={prompt.tolist()}, max_new_tokens={n}, use_cache={use_cache}, {kwargs})"
    expected = course_generate(model, prompt, n, **kwargs, **seeded(), use_cache=False)
    calls = _Calls(model)
    try:
        got = call(what, generate, model, prompt, n, **kwargs, **seeded(), use_cache=use_cache)
    except AssertionError as error:
        cause = str(error.__cause__ or "")
        if second and use_cache:
            fail("generate keeps a cache across calls: the second prompt continues the first one's",
                 "make new caches (KVCache.for_model) inside every call of generate", f"on {what}: {cause}")
        if len(prompt) + n > _CTX and ("context_length" in cause or "do not fit" in cause):
            fail("generate does not slide the window: the caches overflow once the text passes context_length",
                 "once the text is longer than context_length, reset the caches and run the last context_length "
                 "ids", f"on {what}: {cause.splitlines()[0] if cause else ''}")
        raise
    finally:
        calls.remove()
    got = expect_tensor(what, got, returns="return the new ids as one tensor")
    right = _expected_sizes(len(prompt), len(expected), cached=use_cache)
    if use_cache and not any(calls.cached):
        fail("generate does not use the cache: every step runs the whole window through the model",
             "with use_cache, make one cache per block, run the prompt once with them, then only the newest id",
             f"on {what}")
    if not use_cache and any(calls.cached):
        fail("generate with use_cache=False still passes caches to the model",
             "use_cache=False decodes without a cache: the whole window at every step", f"on {what}")
    if use_cache and calls.sizes != right:
        within = [size for size, step in zip(calls.sizes[1:], right[1:]) if step == 1]
        if any(size != 1 for size in within):
            fail("after the prefill, generate runs more than the newest id per step",
                 "give the model only what the caches do not hold yet: the newest id", f"on {what}")
        if len(prompt) + n > _CTX:
            fail("after the window slides, generate keeps the stale cache: its keys were rotated at their old "
                 "positions and computed with the dropped token in view",
                 "once the text is longer than context_length, reset the caches and run the whole window at "
                 "positions 0 … context_length - 1", f"on {what}")
    if not isinstance(got, Tensor) or got.tolist() != expected.tolist():
        if second and use_cache and not sampled:
            fail("generate keeps a cache across calls: the second prompt continues the first one's",
                 "make new caches (KVCache.for_model) inside every call of generate", f"on {what}")
        fail(f"{what} returned {got.tolist() if isinstance(got, Tensor) else describe(got)}, not the ids "
             f"{expected.tolist()}", "pick each id from the last position's logits: the argmax at temperature 0, "
             "else one torch.multinomial draw from next_token_distribution with the generator")
    if not use_cache and calls.sizes != right:
        fail("generate with use_cache=False does not run the whole window (its last context_length ids) at every "
             "step", "without a cache, each step runs the model on the last context_length ids", f"on {what}")


def _check_on_token(generate: Callable[..., Tensor], model: TransformerLM, prompt: Tensor, eos: int) -> None:
    """on_token: each id, a Python int, reported as soon as it is picked (before the model's next call), eos_id too."""
    events: list[Any] = []
    handle = model.register_forward_pre_hook(lambda module, args: events.append("model"))
    what = "generate(model, prompt_ids, 10, temperature=0, eos_id=..., on_token=...)"
    try:
        got = call(what, generate, model, prompt, 10, temperature=0, eos_id=eos, on_token=events.append)
    finally:
        handle.remove()
    got = expect_tensor(what, got, returns="return the new ids as one tensor")
    seen = [event for event in events if not isinstance(event, str)]
    if not seen:
        fail("generate never calls on_token", "call on_token with each new id as soon as it is picked: a caller "
             "shows the text as it grows", f"on {what}")
    if not all(type(event) is int for event in seen):
        fail(f"on_token receives {describe(seen[0])}, not the id as a Python int", "hand on_token the id itself, a "
             "number a caller can look up in its vocabulary, not the tensor that holds it", f"on {what}")
    if seen == got.tolist()[:-1] and got.tolist()[-1] == eos:
        fail("on_token is not told of eos_id, though generate returns it", "report every id generate returns, the "
             "last one too: the caller decides what eos_id means to it", f"on {what}")
    if seen != got.tolist():
        fail(f"on_token receives {seen}, not the ids generate returns, {got.tolist()}", "report each new id once, "
             "in order, as it is picked", f"on {what}")
    steps = [event if isinstance(event, str) else "id" for event in events]
    if steps != ["model", "id"] * len(seen):
        fail("on_token is called late: the ids arrive after the model has run again (or all at the end), not as each "
             "is picked", "call on_token inside the loop, right after the id is picked: a reader waiting for the text "
             "should not wait for the rest of it", f"on {what}: the calls in order, {steps}")

"""check_kv_cache passes the package's KV cache and names each classic mistake, planted here as a small change of
the package's KVCache; check_generate does the same for notebook 10's generate, the loop that makes and resets the
caches."""

import torch

from transformer_from_scratch import next_token_distribution
from transformer_from_scratch.checks import check_generate, check_kv_cache
from transformer_from_scratch.kv_cache import KVCache
from transformer_from_scratch.transformer_lm import generate
from mutants import Catalogue


# --- KVCache ---------------------------------------------------------------------------------------------------

class Grown(KVCache):
    """Starts empty and grows with torch.cat: not preallocated."""

    def __init__(self, batch, num_kv_heads, max_seq_len, d_k, *, device=None, dtype=None):
        super().__init__(batch, num_kv_heads, max_seq_len, d_k, device=device, dtype=dtype)
        self.keys, self.values = self.keys[:, :, :0], self.values[:, :, :0]


class Copies(KVCache):
    def update(self, k, v):
        return tuple(t.clone() for t in super().update(k, v))


class OnlyTheNew(KVCache):
    def update(self, k, v):
        start = self.length
        keys, values = super().update(k, v)
        return keys[:, :, start:], values[:, :, start:]


class LengthStays(KVCache):
    def update(self, k, v):
        start = self.length
        out = super().update(k, v)
        self.length = start
        return out


class NoOverflowError(KVCache):
    def update(self, k, v):
        end = min(self.length + k.shape[2], self.keys.shape[2])
        n = end - self.length
        self.keys[:, :, self.length:end], self.values[:, :, self.length:end] = k[:, :, :n], v[:, :, :n]
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]


class KeysOnlyBytes(KVCache):
    @property
    def nbytes(self):
        return self.keys.nbytes


class NoReset(KVCache):
    def reset(self):
        pass


class QueryHeads(KVCache):
    """for_model sized with the query heads, as before grouped-query attention."""

    @classmethod
    def for_model(cls, model, batch=1):
        weight = model.lm_head.weight
        return [cls(batch, block.attn.num_heads, model.context_length, block.attn.d_k, device=weight.device,
                    dtype=weight.dtype) for block in model.layers]


class WholeContext(KVCache):
    """for_model that always takes the whole context, whatever max_seq_len asks."""

    @classmethod
    def for_model(cls, model, batch=1, max_seq_len=None):
        return super().for_model(model, batch)


CACHE_MUTANTS = [
    (Grown, "preallocate"),
    (Copies, "returns a copy"),
    (OnlyTheNew, "return the keys of every position so far"),
    (LengthStays, "KVCache.length is"),
    (NoOverflowError, "accepts 4 positions"),
    (KeysOnlyBytes, "nbytes"),
    (NoReset, "reset()"),
    (QueryHeads, "for a model whose attention has 2 key/value heads"),
    (WholeContext, "max_seq_len is ignored"),
]


def test_the_package_passes_with_one_line(capsys):
    check_kv_cache(KVCache)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("✓ check_kv_cache")


# --- generate: the loop with one mistake -------------------------------------------------------------------------

def generate_with(*, mode="right", eos=True, keep_window=False):
    kept = {}

    @torch.no_grad()
    def wrong(model, prompt_ids, max_new_tokens, *, use_cache=True, temperature=1.0, top_k=None, top_p=None,
              generator=None, eos_id=None):
        if mode == "kept" and use_cache:
            caches = kept.setdefault("caches", KVCache.for_model(model))
        elif use_cache and mode != "uncached" or mode == "always cached":
            caches = KVCache.for_model(model)
        else:
            caches = None
        ids, start = prompt_ids, 0
        for _ in range(max_new_tokens):
            window = max(0, len(ids) - model.context_length)
            if caches is not None and mode == "whole":
                for cache in caches:
                    cache.reset()
            if caches is not None and window != start and mode == "stale":
                for cache in caches:  # drop the oldest position, keep the rest as they are
                    cache.keys[:, :, :-1] = cache.keys[:, :, 1:].clone()
                    cache.values[:, :, :-1] = cache.values[:, :, 1:].clone()
                    cache.length -= 1
                start = window
            elif caches is not None and window != start and mode != "no window":
                for cache in caches:
                    cache.reset()
                start = window
            elif caches is None:
                start = 0 if mode == "no window" else window
            new = ids[start:] if caches is None else ids[start + caches[0].length:]
            logits = (model(new[None]) if caches is None else model(new[None], cache=caches))[0, -1]
            if temperature == 0 or mode == "always greedy":
                next_id = logits.argmax().view(1)
            else:
                next_id = torch.multinomial(next_token_distribution(logits, temperature, top_k, top_p), 1,
                                            generator=generator)
            ids = torch.cat([ids, next_id.to(ids.dtype)])
            if eos and eos_id is not None and next_id.item() == eos_id:
                break
        return ids[len(prompt_ids):]

    return wrong


def no_use_cache(model, prompt_ids, max_new_tokens, *, temperature=1.0, top_k=None, top_p=None, generator=None,
                 eos_id=None):
    return generate(model, prompt_ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                    generator=generator, eos_id=eos_id)


GENERATE_MUTANTS = [
    (no_use_cache, "no use_cache argument"),
    (generate_with(mode="uncached"), "does not use the cache"),
    (generate_with(mode="whole"), "more than the newest id"),
    (generate_with(mode="no window"), "does not slide the window"),
    (generate_with(mode="stale"), "keeps the stale cache"),
    (generate_with(mode="kept"), "keeps a cache across calls"),
    (generate_with(mode="always cached"), "use_cache=False still passes caches"),
    (generate_with(mode="always greedy"), "pick each id from the last position's logits"),
    (generate_with(eos=False), "eos_id"),
]


def test_the_package_generate_passes_with_one_line(capsys):
    check_generate(generate)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("✓ check_generate")


def test_the_right_mutant_passes():
    check_generate(generate_with())


def test_before_notebook_12_the_cache_part_waits(capsys):
    """The student edition's notebook 10: its _new_cache finds notebook 12's KVCache still a stub and returns None."""
    from transformer_from_scratch import transformer_lm

    def stub_new_cache(model, max_seq_len):
        return None

    original = transformer_lm._new_cache
    transformer_lm._new_cache = stub_new_cache
    try:
        check_generate(generate)
    finally:
        transformer_lm._new_cache = original
    assert "waits for your KVCache" in capsys.readouterr().out


CATALOGUES = [Catalogue(check_kv_cache, CACHE_MUTANTS, right=KVCache),
              Catalogue(check_generate, GENERATE_MUTANTS, right=generate)]

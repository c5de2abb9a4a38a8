"""check_kv_cache passes the package's KV cache and names each classic mistake, planted here as a small change of
the package's KVCache, cached_forward or generate."""

import pytest
import torch

from transformer_from_scratch import scaled_dot_product_attention
from transformer_from_scratch.checks import check_kv_cache
from transformer_from_scratch.kv_cache import KVCache, cached_forward
from transformer_from_scratch.kv_cache import generate_with_cache as generate
from transformer_from_scratch.transformer_lm import generate as generate_uncached
from mutants import assert_own_verdict, assert_phrases_distinct, assert_random_state_kept


def check(parts):
    check_kv_cache(*parts)


RIGHT = (KVCache, cached_forward, generate)


# --- KVCache ---------------------------------------------------------------------------------------------------

class Grown(KVCache):
    """Starts empty and grows with torch.cat: not preallocated."""

    def __init__(self, batch, num_heads, max_len, d_k, *, device=None, dtype=None):
        super().__init__(batch, num_heads, max_len, d_k, device=device, dtype=dtype)
        self.keys, self.values = self.keys[:, :, :0], self.values[:, :, :0]


class Copies(KVCache):
    def append(self, k, v):
        return tuple(t.clone() for t in super().append(k, v))


class NoOverflowError(KVCache):
    def append(self, k, v):
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


# --- cached_forward: the attention step with one mistake -------------------------------------------------------

def forward_with(*, restart=False, rotate_again=False, mask="right"):
    def attention(attn, x, cache):
        batch, new, _ = x.shape
        start = cache.length
        q, k, v = (proj(x).view(batch, new, attn.num_heads, attn.d_k).transpose(1, 2)
                   for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        positions = torch.arange(new) if restart else torch.arange(start, start + new)
        q, k = attn.rope(q, positions), attn.rope(k, positions)
        keys, values = cache.append(k, v)
        if rotate_again:
            keys = attn.rope(keys, torch.arange(start + new))
        m = {"right": torch.ones(new, start + new, dtype=torch.bool).tril(start), "none": None,
             "top-left": torch.ones(new, start + new, dtype=torch.bool).tril()}[mask]
        out = scaled_dot_product_attention(q, keys, values, m)
        return attn.output_proj(out.transpose(1, 2).reshape(batch, new, attn.d_model))

    def forward(model, token_ids, caches):
        x = model.token_embeddings(token_ids)
        for block, cache in zip(model.layers, caches):
            x = x + attention(block.attn, block.ln1(x), cache)
            x = x + block.ffn(block.ln2(x))
        return model.lm_head(model.ln_final(x))

    return forward


# --- generate with one mistake ---------------------------------------------------------------------------------

def generate_with(*, mode="right", eos=True):
    kept = {}

    @torch.no_grad()
    def wrong(model, prompt_ids, max_new_tokens, *, use_cache=True, temperature=1.0, top_k=None, top_p=None,
              generator=None, eos_id=None):
        if mode == "uncached":
            return generate_uncached(model, prompt_ids, max_new_tokens, temperature=temperature, top_k=top_k,
                                     top_p=top_p, generator=generator, eos_id=eos_id)
        if mode == "kept":
            caches = kept.setdefault("caches", KVCache.for_model(model))
        else:
            caches = KVCache.for_model(model)
        ids = prompt_ids
        for _ in range(max_new_tokens):
            if mode == "whole":
                for cache in caches:
                    cache.reset()
            if len(ids) > model.context_length and mode == "stale":
                for cache in caches:  # drop the oldest position, keep the rest as they are
                    cache.keys[:, :, :-1] = cache.keys[:, :, 1:].clone()
                    cache.values[:, :, :-1] = cache.values[:, :, 1:].clone()
                    cache.length -= 1
                new = ids[-1:]
            elif len(ids) > model.context_length and mode != "no window":
                for cache in caches:
                    cache.reset()
                new = ids[-model.context_length:]
            else:
                new = ids[caches[0].length:]
            logits = cached_forward(model, new[None], caches)[0, -1]
            if temperature == 0:
                next_id = logits.argmax().view(1)
            else:
                from transformer_from_scratch import next_token_distribution
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


class Stub(KVCache):
    def append(self, k, v):
        raise NotImplementedError()


MUTANTS = [
    ((Grown, cached_forward, generate), "preallocate"),
    ((Copies, cached_forward, generate), "returns a copy"),
    ((NoOverflowError, cached_forward, generate), "accepts 4 positions"),
    ((KeysOnlyBytes, cached_forward, generate), "nbytes"),
    ((NoReset, cached_forward, generate), "reset()"),
    ((KVCache, forward_with(restart=True), generate), "positions restart at 0"),
    ((KVCache, forward_with(rotate_again=True), generate), "rotated again"),
    ((KVCache, forward_with(mask="none"), generate), "no causal mask"),
    ((KVCache, forward_with(mask="top-left"), generate), "aligned to the first key"),
    ((KVCache, cached_forward, no_use_cache), "no use_cache argument"),
    ((KVCache, cached_forward, generate_with(mode="uncached")), "the cache is not used"),
    ((KVCache, cached_forward, generate_with(mode="whole")), "more than the newest token"),
    ((KVCache, cached_forward, generate_with(mode="no window")), "does not slide the window"),
    ((KVCache, cached_forward, generate_with(mode="stale")), "keeps the stale cache"),
    ((KVCache, cached_forward, generate_with(mode="kept")), "keeps a cache across calls"),
    ((KVCache, cached_forward, generate_with(eos=False)), "eos_id"),
    ((Stub, cached_forward, generate), "not written yet"),
]


def test_the_package_passes_with_one_line(capsys):
    check(RIGHT)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("✓ check_kv_cache")


@pytest.mark.parametrize("mutant, phrase", MUTANTS, ids=[p for _, p in MUTANTS])
def test_each_mistake_is_named(mutant, phrase):
    assert_own_verdict(check, mutant, phrase, MUTANTS)


def test_the_phrases_are_distinct():
    assert_phrases_distinct(MUTANTS)


def test_the_check_keeps_the_random_state():
    assert_random_state_kept(check, RIGHT)

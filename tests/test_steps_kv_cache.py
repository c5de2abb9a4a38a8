"""The step checks of notebook 12 pass the right steps and name each planted mistake on their first line."""

import torch

from transformer_from_scratch import scaled_dot_product_attention
from transformer_from_scratch.checks.steps.kv_cache import (check_append_to_cache, check_attention_step,
                                                             check_causal_mask_with_cache, check_greedy_with_cache,
                                                             check_lm_step)
from mutants import Catalogue, assert_own_verdict


# --- the right steps, as the notebook writes them ------------------------------------------------------------

def append_to_cache(keys, values, length, k, v):
    end = length + k.shape[-2]
    keys[..., length:end, :] = k
    values[..., length:end, :] = v
    return keys[..., :end, :], values[..., :end, :]


def causal_mask_with_cache(new, total):
    return torch.ones(new, total, dtype=torch.bool).tril(diagonal=total - new)


def _heads(t, attn):
    return t.unflatten(-1, (attn.num_heads, attn.d_k)).transpose(-3, -2)


def attention_step(attn, x, keys, values, start, *, positions=None, rotate_again=False, mask="right",
                   rotate_values=False, new_keys_only=False, before_rope=False, read_first=False):
    n = x.shape[-2]
    q, k, v = (_heads(proj(x), attn) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    where = torch.arange(start, start + n) if positions is None else positions(start, n)
    q = attn.rope(q, where)
    rotated = attn.rope(k, where)
    if rotate_values:
        v = attn.rope(v, where)
    if read_first:  # the mistake: the buffers read (and copied) before the new keys are written
        k_before, v_before = keys[..., :start + n, :].clone(), values[..., :start + n, :].clone()
    k_all, v_all = append_to_cache(keys, values, start, k if before_rope else rotated, v)
    if read_first:
        k_all, v_all = k_before, v_before
    if before_rope:
        k_all = attn.rope(k_all, torch.arange(start + n))
    if rotate_again:
        k_all = attn.rope(k_all, torch.arange(start + n))
    if new_keys_only:
        k_all, v_all = rotated, v
    total = k_all.shape[-2]
    m = {"right": causal_mask_with_cache(n, total), "none": None,
         "top-left": torch.ones(n, total, dtype=torch.bool).tril(),
         "top-left for several": torch.ones(n, total, dtype=torch.bool).tril() if n > 1 else None}[mask]
    out = scaled_dot_product_attention(q, k_all, v_all, m)
    return attn.output_proj(out.transpose(-3, -2).flatten(-2))


def lm_step(model, token_ids, keys, values, start, *, shared=False, ln_final=True, residual="stream",
            last_only=False, as_blocks=False):
    x = model.token_embeddings(token_ids)
    for i, (block, k_cache, v_cache) in enumerate(zip(model.layers, keys, values)):
        if as_blocks:
            x = block(x)
            continue
        j = 0 if shared else i
        h = block.ln1(x)
        x = {"stream": x, "none": 0, "normed": h}[residual] + attention_step(block.attn, h, keys[j], values[j], start)
        x = x + block.ffn(block.ln2(x))
    logits = model.lm_head(model.ln_final(x) if ln_final else x)
    return logits[:, -1] if last_only else logits


@torch.no_grad()
def greedy_with_cache(step, prompt_ids, max_new_tokens, context_length, *, restart=False, whole=False,
                      no_window=False, stale=False, with_prompt=False, first_window=False, count_kept=False):
    ids, cached = prompt_ids, 0
    for _ in range(max_new_tokens):
        window = ids if no_window else ids[:context_length] if first_window else ids[-context_length:]
        if len(ids) > context_length and not no_window and not stale and not count_kept:
            cached = 0
        if whole:
            cached = 0
        if stale and len(ids) > context_length:
            cached = context_length - 1
            window = ids[-context_length:]
        logits = step(window[cached:][None], 0 if restart else cached)[0, -1]
        cached = len(window)
        ids = torch.cat([ids, logits.argmax().view(1).to(ids.dtype)])
    return ids if with_prompt else ids[len(prompt_ids):]


def variant(fn, **knobs):
    return lambda *args: fn(*args, **knobs)


# --- Step 1 · append_to_cache ------------------------------------------------------------------------------

def _at_zero(keys, values, length, k, v):
    n = k.shape[-2]
    keys[..., :n, :], values[..., :n, :] = k, v
    return keys[..., :length + n, :], values[..., :length + n, :]


def _new_only(keys, values, length, k, v):
    append_to_cache(keys, values, length, k, v)
    return k, v


def _whole(keys, values, length, k, v):
    append_to_cache(keys, values, length, k, v)
    return keys, values


def _copy(keys, values, length, k, v):
    return (torch.cat([keys[..., :length, :], k], dim=-2), torch.cat([values[..., :length, :], v], dim=-2))


def _swapped(keys, values, length, k, v):
    return append_to_cache(keys, values, length, v, k)


def _clone(keys, values, length, k, v):
    return tuple(t.clone() for t in append_to_cache(keys, values, length, k, v))


def _values_twice(keys, values, length, k, v):
    _, values_so_far = append_to_cache(keys, values, length, k, v)
    return values_so_far, values_so_far


APPEND_MUTANTS = [
    (_at_zero, "at position 0"),
    (_new_only, "new positions only"),
    (_whole, "the whole buffer"),
    (_copy, "does not write into the preallocated buffers"),
    (_swapped, "swapped"),
    (_clone, "returns copies"),
    (_values_twice, "other numbers than the buffers"),
]

# --- Step 2 · causal_mask_with_cache ---------------------------------------------------------------------------

MASK_MUTANTS = [
    (lambda new, total: torch.ones(new, total, dtype=torch.bool).tril(), "aligned to the first key"),
    (lambda new, total: torch.ones(new, new, dtype=torch.bool).tril(), "square"),
    (lambda new, total: torch.ones(new, total, dtype=torch.bool), "no mask"),
    (lambda new, total: ~causal_mask_with_cache(new, total), "polarity"),
    (lambda new, total: torch.ones(new, total, dtype=torch.bool).tril(total - new - 1), "its own key"),
    (lambda new, total: causal_mask_with_cache(new, total).float(), "not bool"),
]

# --- Step 3 · attention_step ------------------------------------------------------------------------------------

ATTENTION_MUTANTS = [
    (variant(attention_step, positions=lambda start, n: torch.arange(n)), "restart at 0"),
    (variant(attention_step, rotate_again=True), "rotated again"),
    (variant(attention_step, mask="none"), "no causal mask"),
    (variant(attention_step, mask="top-left"), "aligned to the first key: a new query"),
    (variant(attention_step, mask="top-left for several"), "aligned to the first key for a chunk after cached"),
    (variant(attention_step, read_first=True), "the cache is read before the new keys"),
    (variant(attention_step, rotate_values=True), "values are rotated"),
    (variant(attention_step, new_keys_only=True), "new keys only"),
    (variant(attention_step, before_rope=True), "before RoPE"),
]

# --- Step 4 · lm_step -------------------------------------------------------------------------------------------

LM_MUTANTS = [
    (variant(lm_step, shared=True), "first block's cache"),
    (variant(lm_step, as_blocks=True), "run as they are"),
    (variant(lm_step, ln_final=False), "ln_final"),
    (variant(lm_step, residual="none"), "residual is missing"),
    (variant(lm_step, residual="normed"), "residual is taken from the normed input"),
    (variant(lm_step, last_only=True), "last new token only"),
]

# --- Step 5 · greedy_with_cache ----------------------------------------------------------------------------------

GREEDY_MUTANTS = [
    (variant(greedy_with_cache, restart=True), "restart at 0 after the prompt"),
    (variant(greedy_with_cache, whole=True), "the cache is never used"),
    (variant(greedy_with_cache, no_window=True), "does not slide the window"),
    (variant(greedy_with_cache, stale=True), "stale cache is kept"),
    (variant(greedy_with_cache, first_window=True), "the window stays at the start of the text"),
    (variant(greedy_with_cache, with_prompt=True), "returns the prompt too"),
]

ALL = [(check_append_to_cache, append_to_cache, APPEND_MUTANTS),
       (check_causal_mask_with_cache, causal_mask_with_cache, MASK_MUTANTS),
       (check_attention_step, attention_step, ATTENTION_MUTANTS),
       (check_lm_step, lm_step, LM_MUTANTS),
       (check_greedy_with_cache, greedy_with_cache, GREEDY_MUTANTS)]


def test_the_right_steps_pass_with_one_line(capsys):
    for check, step, _ in ALL:
        check(step)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * len(ALL), lines


def test_a_stale_count_of_cached_ids_is_the_stale_cache_too():
    """The window slid but the count of cached ids was kept: step gets no new ids (the same mistake as a stale start)."""
    assert_own_verdict(check_greedy_with_cache, variant(greedy_with_cache, count_kept=True), "stale cache is kept",
                       exclusive=False)


CATALOGUES = [Catalogue(check, mutants, right=step) for check, step, mutants in ALL]

"""Self-checks for the steps of notebook 12 (KV cache): writing into the preallocated cache, the causal mask with a
cache, the attention step for new tokens at absolute positions, the whole model's step, and greedy decoding with a
prefill, one token per step and the sliding window."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ... import reference
from ...multihead_attention import MultiHeadSelfAttention
from ...transformer_lm import TransformerLM
from .._harness import call, close, describe, diagnose, expect_tensor, fail, generator, passed

# ---------------------------------------------------------------------------------------------------------
# Step 1 · writing into the preallocated cache
# ---------------------------------------------------------------------------------------------------------

_B, _H, _MAX, _DK = 2, 3, 7, 4  # every size differs


def _shares_memory(view: Tensor, buffer: Tensor) -> bool:
    return isinstance(view, Tensor) and view.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()


def check_append_to_cache(append_to_cache: Callable[..., tuple[Tensor, Tensor]]) -> None:
    """Check ``append_to_cache(keys, values, length, k, v)``: write the n new keys and values (batch, heads, n, d_k)
    into the preallocated ``keys`` and ``values`` (batch, heads, max_seq_len, d_k) at positions length … length+n-1, in
    place, and return the keys and values of positions 0 … length+n-1 as views of the buffers.

    Mistakes it recognises: writing at position 0 every time (positions restarting); returning only the new keys;
    returning the whole buffer, empty slots included; a copy (torch.cat) instead of a write into the buffers; keys
    and values swapped; writing along another axis.
    """
    with torch.random.fork_rng(devices=[]):
        gen = generator(0)
        keys, values = torch.zeros(_B, _H, _MAX, _DK, dtype=torch.float64), torch.zeros(_B, _H, _MAX, _DK,
                                                                                          dtype=torch.float64)
        expected_k, expected_v = torch.zeros_like(keys), torch.zeros_like(values)
        length, copied = 0, ""
        for n in (3, 1, 1, 2):  # a prefill of 3, two single tokens, a chunk of 2: the buffer is then full
            k = torch.randn(_B, _H, n, _DK, generator=gen, dtype=torch.float64)
            v = torch.randn(_B, _H, n, _DK, generator=gen, dtype=torch.float64)
            what = f"append_to_cache(keys, values, length={length}, k, v) with {n} new position{'s' * (n > 1)}"
            out = call(what, append_to_cache, keys, values, length, k, v)
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                fail(f"{what} returned {describe(out)}, not the pair (keys so far, values so far)",
                     "return both: the keys and the values of every position so far")
            got_k, got_v = out
            expected_k[:, :, length:length + n], expected_v[:, :, length:length + n] = k, v
            end = length + n
            for got in (got_k, got_v):
                if isinstance(got, Tensor) and got.shape == (_B, _H, n, _DK) and n != end:
                    fail(f"{what} returns the new positions only ({n} of {end}), not every position so far",
                         "return positions 0 … length + n − 1: the new queries attend to every cached key and their "
                         "own")
                if isinstance(got, Tensor) and got.shape == (_B, _H, _MAX, _DK) and end != _MAX:
                    fail(f"{what} returns the whole buffer ({_MAX} positions), its empty slots included",
                         "return only the filled positions, 0 … length + n − 1: a query must not attend to the "
                         "zeros of slots not filled yet")
            expect_tensor(what, got_k, (_B, _H, end, _DK), "return the keys of positions 0 … length + n − 1")
            expect_tensor(what, got_v, (_B, _H, end, _DK), "return the values of positions 0 … length + n − 1")
            if not torch.equal(keys, expected_k) or not torch.equal(values, expected_v):
                if torch.equal(keys, expected_v) or torch.equal(values, expected_k):
                    fail("keys and values are swapped: k is written into values", "k goes into keys, v into values")
                if not keys.any() and not values.any():
                    fail("append_to_cache does not write into the preallocated buffers (torch.cat or a copy makes "
                         "a new tensor at every step)", "write the new positions into the buffers themselves, in "
                         "place: they are made once, and each step copies only its n new positions", f"on {what}")
                if length > 0 and torch.equal(keys[:, :, :n], k):
                    fail("append_to_cache writes the new keys at position 0, not at position `length`: the cached "
                         "ones are overwritten", "write them at positions length … length + n - 1",
                         f"on {what}")
                fail(f"after {what}, the buffers do not hold the keys and values written so far at their positions",
                     "the positions are the buffers' third axis (-2 from the end): write the new ones at "
                     "length … length + n − 1 along it",
                     f"on {what}")
            if not torch.equal(got_k, expected_k[:, :, :end]) or not torch.equal(got_v, expected_v[:, :, :end]):
                fail(f"{what} returns other numbers than the buffers' positions 0 … {end - 1}",
                     "return those positions of each buffer: the keys from keys, the values from values")
            if not _shares_memory(got_k, keys) or not _shares_memory(got_v, values):
                copied = copied or what
            length = end
        if copied:
            fail(f"{copied} returns copies, not views of the buffers", "return slices of the buffers themselves: "
                 "a copy of the whole cache at every step costs what the cache saves")
    passed("append_to_cache: n new keys and values written in place at positions length … length+n-1; views of "
           "every position so far returned (a prefill, single tokens, a chunk, up to the full buffer)")


# ---------------------------------------------------------------------------------------------------------
# Step 2 · the causal mask with a cache
# ---------------------------------------------------------------------------------------------------------

def _mask(new: int, total: int, diagonal: int | None = None) -> Tensor:
    return torch.ones(new, total, dtype=torch.bool).tril(diagonal=total - new if diagonal is None else diagonal)


_ALIGN_TO_LAST = ("the new queries are the last positions, total − new … total − 1: align the mask to the last key, "
                  "so that query i sees keys 0 … total − new + i")


def check_causal_mask_with_cache(causal_mask_with_cache: Callable[[int, int], Tensor]) -> None:
    """Check ``causal_mask_with_cache(new, total)``: the (new, total) bool mask of ``new`` queries at the last
    positions total-new … total-1 over ``total`` keys, True where query i may attend to key j (j <= total-new+i).

    Mistakes it recognises: the mask aligned to the first key (torch.tril of the (new, total) ones without the
    offset); a square (new, new) mask over the new keys only; no mask (all True); polarity inverted; each query
    blocked from its own key; not bool.
    """
    for new, total in [(1, 5), (3, 3), (3, 7), (2, 9)]:
        what = f"causal_mask_with_cache(new={new}, total={total})"
        out = call(what, causal_mask_with_cache, new, total)
        if isinstance(out, Tensor) and tuple(out.shape) == (new, new) and new != total:
            fail(f"{what} returned a square ({new}, {new}) mask: it covers the new keys only",
                 "the new queries attend to every cached key too: the mask is (new, total)")
        expect_tensor(what, out, (new, total), "return a (new, total) mask, one row per new query")
        if out.dtype != torch.bool:
            fail(f"{what} returned {out.dtype}, not bool", "build it with dtype=torch.bool: True = may attend "
                 "(the course's attention takes a bool mask)")
        expected = _mask(new, total)
        variants = [
            (_mask(new, total, 0), "the mask is aligned to the first key (torch.tril without an offset): query i sees "
             "keys 0 … i, as if the new tokens started the sequence",
             _ALIGN_TO_LAST),
            (torch.ones(new, total, dtype=torch.bool), "no mask: every new query also sees the new tokens after it",
             "in a prefill (new > 1) query i must not see the keys after its own position, total − new + i"),
            (~expected, "the polarity is inverted: True where a query must not attend",
             "True means may attend (query i sees keys j <= total - new + i)"),
            (_mask(new, total, total - new - 1), "each new query is blocked from its own key",
             "a token attends to itself: key total − new + i is allowed for query i"),
        ]
        diagnose(what, out.double(), expected.double(), [(w.double(), m, f) for w, m, f in variants],
                 "query i (at position total - new + i) may attend to keys 0 … total - new + i", rtol=0, atol=0)
    passed("causal_mask_with_cache: (new, total) bool, new queries at the last positions see every key up to their "
           "own (one token, a prefill, a chunk after cached keys)")


# ---------------------------------------------------------------------------------------------------------
# Step 3 · the attention step for new tokens at absolute positions
# ---------------------------------------------------------------------------------------------------------

_D, _ATT_H, _CTX, _THETA = 12, 3, 10, 10000.0
_CHUNKS = (3, 1, 1, 3)  # a prefill, two single tokens, a chunk after cached positions: 8 tokens in all


def _attention_module(seed: int = 1) -> MultiHeadSelfAttention:
    torch.manual_seed(seed)
    return MultiHeadSelfAttention(_D, _ATT_H, _CTX, _THETA, dtype=torch.float64)


def _attention_steps(attn: MultiHeadSelfAttention, x: Tensor, *, restart: bool = False, rotate_again: bool = False,
                     mask: str = "right", rotate_values: bool = False, new_keys_only: bool = False,
                     read_first: bool = False) -> Tensor:
    """The cached attention over _CHUNKS of x, from built-ins, right or with one classic mistake."""
    w = {name: p.detach() for name, p in attn.state_dict().items()}
    d_k = _D // _ATT_H
    keys = torch.zeros(x.shape[0], _ATT_H, _CTX, d_k, dtype=x.dtype)
    values = torch.zeros_like(keys)
    outs, start = [], 0
    for n in _CHUNKS:
        chunk = x[:, start:start + n]
        q, k, v = (reference.split_heads(torch.nn.functional.linear(chunk, w[f"{p}_proj.weight"]), _ATT_H)
                   for p in "qkv")
        positions = torch.arange(n) if restart else torch.arange(start, start + n)
        q, k = attn.rope(q, positions), attn.rope(k, positions)  # the module's own tables: the same rounding
        if rotate_values:
            v = attn.rope(v, positions)
        if read_first:  # the buffers read before the write: the new positions are still empty (zeros)
            k_before, v_before = keys[:, :, :start + n].clone(), values[:, :, :start + n].clone()
        keys[:, :, start:start + n], values[:, :, start:start + n] = k, v
        k_all, v_all = (k_before, v_before) if read_first else (keys[:, :, :start + n], values[:, :, :start + n])
        if rotate_again:
            k_all = attn.rope(k_all, torch.arange(start + n))
        if new_keys_only:
            k_all, v_all = k, v
        total = k_all.shape[-2]
        m = {"right": _mask(n, total), "none": None, "top-left": _mask(n, total, 0),
             "top-left for several": _mask(n, total, 0) if n > 1 else None}[mask]
        attended = reference.attention(q, k_all, v_all, m)
        outs.append(torch.nn.functional.linear(reference.merge_heads(attended), w["output_proj.weight"]))
        start += n
    return torch.cat(outs, dim=1)


def check_attention_step(attention_step: Callable[..., Tensor]) -> None:
    """Check ``attention_step(attn, x, keys, values, start)``: ``attn``'s causal attention for the n new tokens x
    (batch, n, d_model) at absolute positions start … start+n-1, with their rotated keys and their values written
    into the preallocated ``keys``/``values`` (batch, heads, max_seq_len, d_k), attending to every position so far.

    Runs a MultiHeadSelfAttention (d_model 12, 3 heads, RoPE) over 8 tokens as a prefill of 3, two single tokens
    and a chunk of 3, and compares each output with attn on the whole sequence. Mistakes it recognises: positions
    restarting at 0 at every call; the cached keys rotated again; no causal mask in a prefill; the mask aligned to
    the first key, always or only for a chunk of several tokens; the cache read before the new keys are written; the
    values rotated; attention to the new keys only (the cache ignored); keys cached before RoPE.
    """
    with torch.random.fork_rng(devices=[]):
        attn = _attention_module()
        x = torch.randn(2, sum(_CHUNKS), _D, generator=generator(2), dtype=torch.float64)
        with torch.no_grad():
            expected_all = attn(x)
        keys = torch.zeros(2, _ATT_H, _CTX, _D // _ATT_H, dtype=torch.float64)
        values = torch.zeros_like(keys)
        outs, start = [], 0
        for n in _CHUNKS:
            what = f"attention_step(attn, x of shape (2, {n}, {_D}), keys, values, start={start})"
            with torch.no_grad():
                out = call(what, attention_step, attn, x[:, start:start + n], keys, values, start)
            expect_tensor(what, out, (2, n, _D), "return attn's output for the new tokens, (batch, n, d_model)")
            outs.append(out)
            start += n
        got = torch.cat(outs, dim=1)
        what = f"attention_step over 8 tokens fed as chunks of {list(_CHUNKS)}"
        variants = [
            (lambda: _attention_steps(attn, x, restart=True), "the positions restart at 0 at every call: the new "
             "tokens are rotated as if they started the sequence", "rotate at the absolute positions "
             "start … start + n − 1: a token keeps its place in the text, whichever call it comes in"),
            (lambda: _attention_steps(attn, x, rotate_again=True), "the cached keys are rotated again: they were "
             "rotated when they were cached, and a second rotation moves them to twice their position",
             "rotate only the new keys, before writing them into the cache; use the cached ones as they are"),
            (lambda: _attention_steps(attn, x, mask="none"), "no causal mask: in a prefill, each new query also sees "
             "the new tokens after it", "attend with the (n, start + n) causal mask of Step 2"),
            (lambda: _attention_steps(attn, x, mask="top-left"), "the causal mask is aligned to the first key: a new "
             "query at position start + i sees only keys 0 … i",
             "the new queries are the last positions, start … start + n − 1: align the mask to the last key, as Step 2 "
             "does, so that query i sees keys 0 … start + i"),
            (lambda: _attention_steps(attn, x, mask="top-left for several"), "the causal mask is aligned to the first "
             "key for a chunk after cached positions: right for the prefill at start 0 (and a single token needs "
             "none), but a query at position start + i of a later chunk sees only keys 0 … i",
             "use the (n, start + n) mask of Step 2 for every call with several new tokens: it is aligned to the last "
             "key"),
            (lambda: _attention_steps(attn, x, read_first=True), "the cache is read before the new keys and values "
             "are written into it: the new queries attend to empty slots (zeros) where their own keys belong",
             "write the new keys and values first, then attend to every position so far, the new ones included"),
            (lambda: _attention_steps(attn, x, rotate_values=True), "the values are rotated too",
             "RoPE rotates the queries and keys only; cache the values as v_proj makes them"),
            (lambda: _attention_steps(attn, x, new_keys_only=True), "the new queries attend to the new keys only: "
             "the cache is written but never read", "attend to the keys and values that append_to_cache returns, "
             "every position so far"),
        ]
        diagnose(what, got, expected_all, variants, "compare each part with attention over the whole sequence: the "
                 "heads, the rotation at the absolute positions, the cache written before it is read, the mask "
                 "aligned to the last key, the output projection", rtol=1e-9, atol=1e-10)
        with torch.no_grad():
            expected_keys = attn.rope(reference.split_heads(x @ attn.k_proj.weight.T, _ATT_H),
                                      torch.arange(sum(_CHUNKS)))
        if not close(keys[:, :, :sum(_CHUNKS)], expected_keys, rtol=1e-9, atol=1e-10):
            unrotated = reference.split_heads(x @ attn.k_proj.weight.detach().T, _ATT_H)
            if close(keys[:, :, :sum(_CHUNKS)], unrotated, rtol=1e-9, atol=1e-10):
                fail("the cache holds the keys before RoPE, so every step must rotate the whole cache again",
                     "rotate the new keys first, then write them: a cached key is rotated once, at its own position")
            fail("the keys buffer does not hold each token's key, rotated at its position, after the steps",
                 "write the rotated new keys and their values into the buffers given, at positions start … "
                 "start + n − 1 (Step 1)")
    passed("attention_step: new tokens rotated at start … start+n-1, rotated keys and values cached, each query "
           "sees every position up to its own; equal to attention over the whole sequence (prefill, single tokens, "
           "a chunk)")


# ---------------------------------------------------------------------------------------------------------
# Step 4 · the whole model's step
# ---------------------------------------------------------------------------------------------------------

_V, _L, _DFF = 11, 2, 16


def _model(seed: int = 3) -> TransformerLM:
    torch.manual_seed(seed)
    model = TransformerLM(_V, _CTX, _D, _L, _ATT_H, _DFF, _THETA, dtype=torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln1.weight") or name.endswith("ln2.weight") or name == "ln_final.weight":
                p.add_(0.3 * torch.randn_like(p))  # gains away from 1, so that each norm shows
    return model


def _caches(batch: int) -> tuple[list[Tensor], list[Tensor]]:
    shape = (batch, _ATT_H, _CTX, _D // _ATT_H)
    return ([torch.zeros(shape, dtype=torch.float64) for _ in range(_L)],
            [torch.zeros(shape, dtype=torch.float64) for _ in range(_L)])


def _lm_steps(model: TransformerLM, ids: Tensor, *, shared_cache: bool = False, no_ln_final: bool = False,
              residual: str = "stream") -> Tensor:
    """The model's cached steps over _CHUNKS of ids, from built-ins, right or with one mistake."""
    sd = {name: p.detach() for name, p in model.state_dict().items()}
    keys, values = _caches(ids.shape[0])
    outs, start = [], 0
    for n in _CHUNKS:
        x = torch.nn.functional.embedding(ids[:, start:start + n], sd["token_embeddings.weight"])
        positions = torch.arange(start, start + n)
        for i in range(_L):
            j = 0 if shared_cache else i
            p = f"layers.{i}."
            h = reference.rms_norm(x, sd[p + "ln1.weight"])
            q, k, v = (reference.split_heads(torch.nn.functional.linear(h, sd[f"{p}attn.{c}_proj.weight"]), _ATT_H)
                       for c in "qkv")
            rope = model.layers[i].attn.rope  # the model's own tables: the same rounding
            q, k = rope(q, positions), rope(k, positions)
            keys[j][:, :, start:start + n], values[j][:, :, start:start + n] = k, v
            attended = reference.attention(q, keys[j][:, :, :start + n], values[j][:, :, :start + n],
                                           _mask(n, start + n))
            a = torch.nn.functional.linear(reference.merge_heads(attended), sd[p + "attn.output_proj.weight"])
            x = {"stream": x, "none": 0, "normed": h}[residual] + a
            x = x + reference.swiglu(reference.rms_norm(x, sd[p + "ln2.weight"]), sd[p + "ffn.w1.weight"],
                                     sd[p + "ffn.w2.weight"], sd[p + "ffn.w3.weight"])
        x = x if no_ln_final else reference.rms_norm(x, sd["ln_final.weight"])
        outs.append(torch.nn.functional.linear(x, sd["lm_head.weight"]))
        start += n
    return torch.cat(outs, dim=1)


def _blocks_uncached(model: TransformerLM, ids: Tensor) -> Tensor:
    """Each chunk through the blocks as they are (layer(x)): no cache, positions 0 … n-1."""
    with torch.no_grad():
        return torch.cat([model(ids[:, s:s + n]) for s, n in zip((0, 3, 4, 5), _CHUNKS)], dim=1)


def check_lm_step(lm_step: Callable[..., Tensor]) -> None:
    """Check ``lm_step(model, token_ids, keys, values, start)``: a TransformerLM's logits (batch, n, vocab) for the n
    new token ids (batch, n) at positions start … start+n-1, each block running attention_step with its own cache
    (keys[i], values[i]), then its feed-forward branch; then ln_final and lm_head.

    Runs a 2-block model over 8 tokens as a prefill of 3, two single tokens and a chunk of 3 and compares the logits
    with model(all 8 ids). Mistakes it recognises: every block using the first block's cache; the blocks run as they
    are (layer(x): no cache, positions from 0); ln_final not applied; the attention branch's residual missing, or
    taken from the normed input (ln1(x) + attention); the logits of the last position only.
    """
    with torch.random.fork_rng(devices=[]):
        model = _model()
        ids = torch.randint(0, _V, (2, sum(_CHUNKS)), generator=generator(4))
        with torch.no_grad():
            expected = model(ids)
        keys, values = _caches(2)
        outs, start = [], 0
        for n in _CHUNKS:
            what = f"lm_step(model, token_ids of shape (2, {n}), keys, values, start={start})"
            with torch.no_grad():
                out = call(what, lm_step, model, ids[:, start:start + n], keys, values, start)
            if isinstance(out, Tensor) and tuple(out.shape) == (2, _V) and n > 1:
                fail(f"{what} returned the logits of the last new token only, shape {tuple(out.shape)}",
                     "return the logits of every new token, (batch, n, vocab_size): generate picks the last itself")
            expect_tensor(what, out, (2, n, _V), "return the logits of the new tokens, (batch, n, vocab)")
            outs.append(out)
            start += n
        got = torch.cat(outs, dim=1)
        variants = [
            (lambda: _lm_steps(model, ids, shared_cache=True), "every block uses the first block's cache (keys[0], "
             "values[0])", "each block keeps the keys and values of its own layer: block i reads and writes the i-th "
             "cache of each list"),
            (lambda: _blocks_uncached(model, ids), "the blocks run as they are (layer(x)): the new tokens see neither "
             "the cache nor their positions", "a block's own forward knows nothing of the cache: run its parts "
             "yourself, attention through attention_step with this block's cache and start, then the feed-forward "
             "branch"),
            (lambda: _lm_steps(model, ids, no_ln_final=True), "ln_final is not applied before lm_head",
             "pre-norm blocks leave the stream unnormalised: ln_final normalises it before lm_head reads it"),
            (lambda: _lm_steps(model, ids, residual="none"), "the attention branch's residual is missing: the "
             "branch's output replaces the stream", "a branch adds its output to the stream and leaves the rest of "
             "it as it is"),
            (lambda: _lm_steps(model, ids, residual="normed"), "the attention branch's residual is taken from the "
             "normed input (ln1(x) + attention), not from the stream x, so the stream loses every token's scale",
             "normalise only what attention reads, and add its output to the stream itself"),
        ]
        diagnose(f"lm_step over 8 tokens fed as chunks of {list(_CHUNKS)}", got, expected, variants,
                 "compare each part with the model's forward: the embedding, each block's two branches (attention "
                 "with this block's cache at the new positions, then the feed-forward network), ln_final and lm_head",
                 rtol=1e-9, atol=1e-10)
    passed("lm_step: each block with its own cache, ln1 -> attention_step -> residual, ln2 -> ffn -> residual, "
           "ln_final, lm_head; equal to the model on the whole sequence (prefill, single tokens, a chunk)")


# ---------------------------------------------------------------------------------------------------------
# Step 5 · greedy decoding: the prefill, one token per step, the sliding window
# ---------------------------------------------------------------------------------------------------------

_GEN_V, _GEN_CTX = 7, 5


class _Step:
    """A stand-in for lm_step with its caches: it keeps the ids it has cached, at their positions, and favours at
    each position an id computed from every id up to it, so that a wrong start, a stale cache or a missing token
    leads somewhere else. It records every call (the ids given, the start)."""

    def __init__(self) -> None:
        self.cached: list[int] = []
        self.calls: list[tuple[list[int], int]] = []

    def __call__(self, token_ids: Tensor, start: int) -> Tensor:
        if not isinstance(token_ids, Tensor) or token_ids.ndim != 2 or token_ids.shape[0] != 1:
            raise ValueError(f"step expects the new ids as a batch of one, shape (1, n), got {describe(token_ids)}")
        new = token_ids[0].tolist()
        self.calls.append((new, int(start)))
        if not new:
            raise ValueError(f"step was given no new ids (at start={start}): the caches already count every id of "
                             "the window")
        if not 0 <= start <= len(self.cached):
            raise ValueError(f"step was given start={start}, but the caches hold {len(self.cached)} positions: the "
                             "new tokens must continue right after them")
        self.cached = self.cached[:start] + new
        if len(self.cached) > _GEN_CTX:
            raise ValueError(f"step: {len(self.cached)} positions pass context_length={_GEN_CTX}: slide the window")
        favoured = [(3 * sum(self.cached[:i + 1]) + i) % _GEN_V for i in range(start, len(self.cached))]
        return 5.0 * torch.nn.functional.one_hot(torch.tensor(favoured), _GEN_V)[None].to(torch.float64)


def _expected_greedy(prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        window = ids[-_GEN_CTX:]
        ids.append((3 * sum(window) + len(window) - 1) % _GEN_V)
    return ids[len(prompt):]


_STALE = ("after the window slides, the stale cache is kept: its keys were rotated at their old positions and computed "
          "with the dropped token in view",
          "once the text is longer than context_length, every cached position is stale: run the whole window again "
          "at start 0")


def check_greedy_with_cache(greedy_with_cache: Callable[..., Tensor]) -> None:
    """Check ``greedy_with_cache(step, prompt_ids, max_new_tokens, context_length)``: greedy decoding where
    ``step(new_ids (1, n), start)`` runs the model on the new ids at positions start … start+n-1 with its caches and
    returns their logits (1, n, vocab). The prompt goes in once (the prefill, start 0), then each new id alone at its
    position; once the text is longer than context_length, the window's ids at start 0 (the positions moved, so the
    cache is refilled). Returns the new ids only: what generate(..., temperature=0) gives.

    Runs on a stand-in step (7 ids, context_length 5) that records its calls. Mistakes it recognises: positions
    restarting at 0 after the prompt; the whole text run at every step (the cache never used); no window (the
    caches overflow); a window that stays at the start of the text; the stale cache kept after the window slides
    (its start, or its count of cached ids); the prompt returned too.
    """
    with torch.random.fork_rng(devices=[]):
        for prompt, n in [([1, 2], 2), ([4, 0, 6], 6), ([3, 1, 2, 5, 6, 4, 0], 2)]:
            step = _Step()
            what = (f"greedy_with_cache(step, prompt_ids={prompt}, max_new_tokens={n}, "
                    f"context_length={_GEN_CTX})")
            try:
                out = call(what, greedy_with_cache, step, torch.tensor(prompt), n, _GEN_CTX)
            except AssertionError as error:
                cause = str(error.__cause__ or "")
                if "pass context_length" in cause:
                    fail("greedy_with_cache does not slide the window: the caches overflow past context_length",
                         "once the text is longer than context_length, run its last context_length ids at start 0",
                         f"on {what}: {cause}")
                if "the caches hold" in cause:
                    fail("greedy_with_cache gives a start past what the caches hold", "the new ids start right after "
                         "the cached positions: start = how many ids the caches hold", f"on {what}: {cause}")
                if "no new ids" in cause:
                    fail(*_STALE, f"on {what}: {cause}")
                raise
            out = expect_tensor(what, out, returns="return the new ids as one sequence, a 1-D tensor")
            if out.ndim != 1:
                fail(f"{what} returned {describe(out)}, not a 1-D tensor of ids", "return the new ids as one sequence")
            got, expected = out.tolist(), _expected_greedy(prompt, n)
            text = list(prompt)
            for j, (new, start) in enumerate(step.calls):
                if j == 0 and (start != 0 or new != prompt[-_GEN_CTX:]):
                    fail(f"the first call of step got ids {new} at start={start}, not the prompt's last "
                         f"{_GEN_CTX} ids at start 0 (the prefill)", "start with one call on the whole prompt "
                         "(at most its last context_length ids), start=0", f"on {what}")
                if j > 0 and len(text) > _GEN_CTX and start != 0:
                    fail(*_STALE, f"on {what}: call {j + 1} got {new} at start={start}")
                if j > 0 and len(text) > _GEN_CTX and new != text[-_GEN_CTX:]:
                    fail("the window stays at the start of the text: past context_length, step is given "
                         f"{new}, not the text's last {_GEN_CTX} ids {text[-_GEN_CTX:]}",
                         "the window slides with the text: once it is longer than context_length, the model sees its "
                         "newest context_length ids", f"on {what}: call {j + 1}")
                if j > 0 and len(text) <= _GEN_CTX and start == 0 and len(new) == 1 and len(text) > 1:
                    fail("the positions restart at 0 after the prompt: each new token is run at position 0",
                         "run the newest id at start = how many ids the caches hold (len(text) - 1)",
                         f"on {what}: call {j + 1} got {new} at start=0")
                if j > 0 and len(text) <= _GEN_CTX and len(new) > 1:
                    fail("greedy_with_cache runs the whole text at every step: the cache is never used",
                         "after the prefill, give step only the newest id, at start = len(text) - 1",
                         f"on {what}: call {j + 1} got {new} at start={start}")
                if j < len(got):
                    text.append(got[j])
            if got == expected:
                continue
            if got[:len(prompt)] == prompt and got[len(prompt):] == expected:
                fail(f"{what} returns the prompt too", "return only the ids it added")
            if len(got) != n:
                fail(f"{what} returned {len(got)} ids, expected max_new_tokens={n}", "loop max_new_tokens times")
            fail(f"{what} returned {got}, expected {expected}", "prefill, then the newest id at its position; past "
                 "context_length the window at start 0; each turn the argmax of the last position's logits",
                 f"step got {step.calls} (ids, start)")
    passed("greedy_with_cache: the prompt once at start 0, then one id per step at its position, the window at "
           "start 0 once the text passes context_length; the new ids only")

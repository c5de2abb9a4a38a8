"""Self-checks for the steps of notebook 16 (decoding fast): the bytes one decode step reads, a matrix stored
column-major, several Linears' weights fused into one matrix, the fused projection split into heads, int8 weights
with one scale per output row, the product with them, and one token's attention over fixed-size cache buffers.

Each compares the learner's function with an answer computed here independently (the bytes from the model's
configuration, the layouts from the strides, the quantization written out row by row, the product in float64) on
small inputs; when they differ, it names the first classic mistake the learner's result matches.
"""

from __future__ import annotations

import numbers
from itertools import permutations
from typing import Any, Callable

import torch
from torch import Tensor, nn

from ...linear import Linear
from ...transformer_lm import TransformerLM
from .._fixtures import LM_CTX, LM_D, LM_DFF, LM_DK, LM_H, LM_KV, LM_THETA, LM_V
from .._harness import (attempt, call, close, crashed, describe, diagnose, dtype_name, expect_tensor, fail, first_line,
                        generator, passed)


def _shares_memory(t: Any, other: Tensor) -> bool:
    """Whether ``t`` is a tensor that lies in ``other``'s memory (a view of it, or ``other`` itself)."""
    return isinstance(t, Tensor) and t.untyped_storage().data_ptr() == other.untyped_storage().data_ptr()


def _column_major(t: Tensor) -> bool:
    """Whether a matrix (d_out, d_in) is stored column by column: one input feature's d_out numbers side by side."""
    return t.ndim == 2 and t.stride(0) == 1 and t.stride(1) >= t.shape[0]


# ---------------------------------------------------------------------------------------------------------
# Step 1 · the bytes one decode step reads
# ---------------------------------------------------------------------------------------------------------

_BYTES_FIX = ("count every weight once, in bytes (numel · element_size): the embedding table as the one row a step "
              "reads (all of it when lm_head is the same matrix: tied), then the keys and the values of cache_length "
              "positions in every layer, num_kv_heads · d_k numbers each, in the model's dtype")


_LAYERS = 3  # not 2: half the cache (keys only) and one layer's cache must differ


def _model(dtype: torch.dtype, tied: bool, num_kv_heads: int) -> TransformerLM:
    """The checks' small TransformerLM (11 ids, d_model 16, 4 heads), of 3 layers, tied or not."""
    torch.manual_seed(0)
    return TransformerLM(LM_V, LM_CTX, LM_D, _LAYERS, LM_H, LM_DFF, LM_THETA, dtype=dtype, num_kv_heads=num_kv_heads,
                         tie_embeddings=tied)


def _bytes_variants(dtype: torch.dtype, tied: bool, kv: int, cache_length: int
                    ) -> tuple[int, list[tuple[int, str, str]]]:
    """The right count, from the configuration, and what each classic mistake counts instead."""
    size = torch.empty((), dtype=dtype).element_size()
    table = LM_V * LM_D
    per_layer = 2 * LM_D * LM_D + 2 * kv * LM_DK * LM_D + 3 * LM_D * LM_DFF + 2 * LM_D  # q, o; k, v; w1-3; two norms
    blocks = _LAYERS * per_layer + LM_D  # and the final norm
    embedding = table if tied else LM_D + table  # tied: one matrix, read whole by lm_head; untied: a row + lm_head
    cache = cache_length * _LAYERS * 2 * kv * LM_DK
    right = size * (blocks + embedding + cache)
    variants = [
        (size * (blocks + 2 * table + cache) if tied else None, "the tied matrix is counted twice: the state dict "
         "names it twice (token_embeddings.weight and lm_head.weight), but it is one tensor in memory", "count a "
         "tensor once however many names it has: two names on the same memory are one tensor to read"),
        (size * (blocks + 2 * table + cache) if not tied else None, "the whole embedding table is counted, but a step "
         "reads only the row of its one token", "count one row of token_embeddings.weight when lm_head has its own "
         "matrix (untied); all of it only when lm_head reads it too (tied)"),
        (size * (blocks + table + cache) if not tied else None, "the embedding table is left out, but a step reads "
         "the row of its token", "count one row of token_embeddings.weight (d_model numbers) when the model is untied"),
        (blocks + embedding + cache, "it counts numbers, not bytes", "a number takes its dtype's bytes: "
         "2 for bfloat16, 4 for float32, so count each tensor's numbers times its element size"),
        (4 * (blocks + embedding + cache) if size != 4 else None, "it counts 4 bytes a number whatever the dtype "
         f"(this model is {dtype_name(dtype)}, {size} bytes a number)", "take each tensor's own element size: "
         "the bytes follow the dtype"),
        (size * (blocks + embedding) if cache else None, "the KV cache is forgotten: each step also reads the keys and "
         "values of every earlier position", "add cache_length · (2 · num_kv_heads · d_k) numbers for every layer"),
        (size * (blocks + embedding + cache // 2) if cache else None, "only the keys (or only the values) of the cache "
         "are counted", "a step reads both, the keys for the scores and the values for the sum: 2 · num_kv_heads · d_k "
         "numbers per position and layer"),
        (size * (blocks + embedding + cache * LM_H // kv) if cache and kv != LM_H else None, "the cache is sized with "
         "num_heads, but with grouped-query attention it holds only num_kv_heads heads of keys and values",
         "use each layer's attn.num_kv_heads: query heads share key/value heads, which is what makes the cache small"),
        (size * (blocks + embedding + cache // _LAYERS) if cache else None, "the cache of one layer only is counted",
         "every layer keeps its own keys and values: count the cache for each block of model.layers"),
        (size * (blocks + embedding) + 4 * cache if cache and size != 4 else None, "the cache is counted in float32 "
         "(4 bytes a number), but it is in the model's dtype", "the keys and values are made in the "
         "model's dtype (the embedding table's): count the cache in its bytes"),
    ]
    return right, [(value, mistake, fix) for value, mistake, fix in variants if value is not None and value != right]


def check_decode_bytes(decode_bytes: Callable[..., int]) -> None:
    """Check ``decode_bytes(model, cache_length)``: the bytes one decode step reads, an int. Every tensor of the state
    dict once (a tied matrix has two names), the embedding table as one row unless lm_head reads it too, then the
    keys and values of cache_length positions in every layer (num_kv_heads · d_k numbers each), in the model's dtype.

    On small TransformerLMs (11 ids, d_model 16, 3 layers, 4 heads), untied and tied, float32 and bfloat16, with 4,
    2 and 1 key/value heads, cache_length 0 and not; the right numbers come from the configuration. Mistakes it
    recognises: the tied matrix counted twice; an untied table counted in full (a step reads one row) or left out;
    numbers instead of bytes; 4 bytes a number whatever the dtype; the cache forgotten; only keys (or only values)
    counted; the cache sized with num_heads instead of num_kv_heads; the cache of one layer only; the cache in
    float32.
    """
    cases = [(torch.float32, False, LM_H, 0), (torch.float32, True, LM_H, 0), (torch.float32, True, LM_H, 6),
             (torch.float32, False, LM_KV, 7), (torch.bfloat16, False, 1, 5), (torch.bfloat16, True, LM_H, 3)]
    with torch.random.fork_rng(devices=[]):
        for dtype, tied, kv, cache_length in cases:
            model = _model(dtype, tied, kv)
            what = (f"decode_bytes({'tied' if tied else 'untied'} {dtype_name(dtype)} model with {kv} key/value heads, "
                    f"cache_length={cache_length})")
            out = call(what, decode_bytes, model, cache_length)
            if isinstance(out, Tensor) and out.numel() == 1 and not out.is_floating_point():
                out = int(out)
            if isinstance(out, bool) or not isinstance(out, numbers.Integral):
                fail(f"{what} returned {describe(out)}, not an int", "return the count of bytes as a Python int "
                     "(sum the tensors' .nbytes)")
            right, variants = _bytes_variants(dtype, tied, kv, cache_length)
            if out == right:
                continue
            evidence = f"on {what}: {int(out):,} bytes, expected {right:,}"
            for value, mistake, fix in variants:
                if out == value:
                    fail(mistake, fix, evidence)
            fail(f"{what} returned {int(out):,}, expected {right:,} bytes", _BYTES_FIX)
    passed("decode_bytes: every weight once in bytes (a tied matrix once, one row of an untied table), the keys and "
           "values of num_kv_heads heads in every layer; float32 and bfloat16, tied and untied")


# ---------------------------------------------------------------------------------------------------------
# Step 2 · a matrix stored column by column
# ---------------------------------------------------------------------------------------------------------

_COLUMN_FIX = ("keep the shape (d_out, d_in) and every number at its (row, column); change only their order in "
               "memory, so that the transpose of the result is contiguous")


def check_column_major(column_major: Callable[[Tensor], Tensor]) -> None:
    """Check ``column_major(weight)``: the same (d_out, d_in) matrix, its numbers stored column by column, so that
    weight.T is contiguous. On a (5, 3) float64 matrix, a square float32 one (where .T keeps the shape) and a (3, 7)
    bfloat16 one.

    Mistakes it recognises: weight.T returned (the shape swapped, or on a square matrix the numbers); a row-major
    copy, or the weight itself (.T not contiguous); the numbers moved (a .view or .reshape of the transposed copy);
    the weight given changed in place.
    """
    gen = generator(2)
    for shape, dtype in [((5, 3), torch.float64), ((4, 4), torch.float32), ((3, 7), torch.bfloat16)]:
        weight = torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
        given = weight.clone()
        stride = given.stride()
        what = f"column_major(weight of shape {shape}, {dtype_name(dtype)})"
        out = call(what, column_major, given)
        if given.shape != weight.shape or given.stride() != stride or not torch.equal(given, weight):
            fail(f"{what} changes the weight it was given in place (its numbers or its layout)", "leave the input as "
                 "it is and return a new tensor: the model's Linear still holds the weight you were given")
        d_out, d_in = shape
        if isinstance(out, Tensor) and d_out != d_in and tuple(out.shape) == (d_in, d_out):
            fail(f"{what} returned shape {(d_in, d_out)}: that is weight.T, a matrix of another shape", _COLUMN_FIX)
        out = expect_tensor(what, out, shape, _COLUMN_FIX, returns="return the matrix, a tensor")
        if out.dtype != dtype:
            fail(f"{what} returned {out.dtype}, expected {dtype} (the weight's)", "keep the numbers as they are: no "
                 ".float() or .to(...) of another dtype")
        if not torch.equal(out, weight):
            if d_out == d_in and torch.equal(out, weight.T):
                fail(f"{what} returned weight.T: the numbers are transposed, not only stored differently",
                     _COLUMN_FIX, "on a square matrix the shape stays, and the rows became columns")
            if torch.equal(out, weight.T.contiguous().view(shape)):
                fail("the numbers moved: the transposed copy was read back with .view or .reshape (row by row), so "
                     "each entry sits at another (row, column)", "a view or a reshape reads memory in its order; "
                     "a transpose keeps every entry at its (row, column): go back by a transpose", f"on {what}")
            fail(f"{what} changes the numbers of the matrix", _COLUMN_FIX)
        if not out.T.is_contiguous():
            if out.is_contiguous():
                fail(f"{what} returned a matrix still stored row by row (.T is not contiguous): a row-major copy, or "
                     "the weight itself", "store it column by column: a copy made while the matrix is transposed is "
                     "laid out in the transposed order, one input feature's d_out numbers side by side", f"strides "
                     f"{out.stride()}, expected {(1, d_out)}")
            fail(f"{what} returned a matrix whose .T is not contiguous (strides {out.stride()})", _COLUMN_FIX)
    passed("column_major: the same matrix, shape and numbers, stored column by column (.T contiguous); the input "
           "left as it was")


# ---------------------------------------------------------------------------------------------------------
# Step 3 · several Linears' weights in one matrix
# ---------------------------------------------------------------------------------------------------------

_FUSE_FIX = ("stack the weights by rows (along d_out) in the order given, store that column-major (Step 2), and make "
             "each linear's weight a Parameter that is a view of its own rows")


def _linears(gen: torch.Generator, rows: list[int], d_in: int, dtype: torch.dtype) -> list[nn.Module]:
    linears = []
    for d_out in rows:
        linear = Linear(d_in, d_out, dtype=dtype)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(d_out, d_in, generator=gen, dtype=torch.float64))
        linears.append(linear)
    return linears


def check_fuse_weights(fuse_weights: Callable[..., Tensor]) -> None:
    """Check ``fuse_weights(*linears)``: one matrix, the linears' weights stacked by rows in the order given, stored
    column-major (Step 2); each linear's weight then a Parameter that is a view of its rows (the same memory, no
    second copy), with its name and numbers unchanged. Three (4, 6) Linears in float64 (equal sizes, so that a stack
    along d_in runs too), the rows of a grouped-query q, k, v (6, 2 and 2 rows) in float32, one Linear alone.

    Mistakes it recognises: stacked along d_in (dim 1) instead of d_out; the order not kept; the fused matrix stored
    row by row; the linears keeping their own copies (their weights not in the fused matrix's memory); views of the
    wrong rows; the linears' numbers changed; the numbers of the fused matrix changed.
    """
    gen = generator(3)
    with torch.random.fork_rng(devices=[]):  # a Linear draws its initial weight from torch's generator
        for rows, d_in, dtype in [([4, 4, 4], 6, torch.float64), ([6, 2, 2], 5, torch.float32),
                                  ([7], 3, torch.float64)]:
            _check_fuse_case(fuse_weights, _linears(gen, rows, d_in, dtype))
    passed("fuse_weights: the weights stacked by rows in order, column-major, each linear's weight a view of its "
           "rows (one copy of the numbers, the same names and values)")


def _check_fuse_case(fuse_weights: Callable[..., Tensor], linears: list[nn.Module]) -> None:
    rows = [linear.weight.shape[0] for linear in linears]
    d_in, dtype = linears[0].weight.shape[1], linears[0].weight.dtype
    weights = [linear.weight.detach().clone() for linear in linears]
    what = f"fuse_weights({', '.join(f'Linear({d_in}, {r})' for r in rows)}) ({dtype_name(dtype)})"
    out = call(what, fuse_weights, *linears)
    expected = torch.cat(weights)
    if isinstance(out, Tensor) and len(rows) > 1 and tuple(out.shape) == (rows[0], d_in * len(rows)):
        fail(f"{what} returned shape {tuple(out.shape)}: the weights are stacked along d_in (dim 1), side by side",
             "stack them along d_out, dim 0: each linear's rows below the previous one's, so that x @ Wᵀ gives "
             "their outputs side by side", f"expected shape {tuple(expected.shape)}")
    out = expect_tensor(what, out, expected.shape, _FUSE_FIX, returns="return the fused matrix, a tensor")
    if out.dtype != dtype:
        fail(f"{what} returned {out.dtype}, expected {dtype} (the weights')", "keep the weights' dtype")
    if not torch.equal(out, expected):
        for order in permutations(range(len(rows))):
            if list(order) != sorted(order) and torch.equal(out, torch.cat([weights[i] for i in order])):
                fail("the weights are not stacked in the order given", "keep the order of the arguments (queries, "
                     "keys, values): the split after the product relies on it", f"on {what}: yours is the order "
                     f"{list(order)}")
        fail(f"{what} differs from the linears' weights stacked by rows", _FUSE_FIX)
    if not _column_major(out):
        fail(f"{what} returned a matrix stored row by row (strides {out.stride()}), not column-major",
             "store the stacked matrix as Step 2 does (column_major), so that x @ Wᵀ reads it in order",
             f"expected strides {(1, out.shape[0])}")
    start = 0
    for i, (linear, weight) in enumerate(zip(linears, weights)):
        label = f"linear {i}'s weight after {what}"
        if not isinstance(linear.weight, nn.Parameter) or linear.weight.shape != weight.shape:
            fail(f"{label} is {describe(linear.weight)}, not a Parameter of its shape {tuple(weight.shape)}",
                 "make it a Parameter of its rows of the fused matrix: the state dict keeps its name and shape")
        if not torch.equal(linear.weight.detach(), weight):
            fail(f"{label} holds other numbers than before", "each linear keeps its own numbers: its rows of the "
                 "fused matrix, start … start + d_out - 1")
        if not _shares_memory(linear.weight, out):
            fail("the linears keep their own copies: their weights are not in the fused matrix's memory",
                 "make each linear's weight a Parameter that is a view of its rows of the fused matrix (a slice is a "
                 "view; a clone or a contiguous copy is not): one copy of the numbers, which the state dict still "
                 "names", f"on {what}: {label} has memory of its own")
        view = out[start:start + weight.shape[0]]
        if linear.weight.data_ptr() != view.data_ptr() or linear.weight.stride() != view.stride():
            fail(f"{label} is a view of other rows of the fused matrix than its own", "linear i's weight is the "
                 "view fused[start:start + d_out], start the rows of the linears before it")
        start += weight.shape[0]
        if list(linear.state_dict()) != ["weight"]:
            fail(f"{label}: the linear's state dict holds {list(linear.state_dict())}, not ['weight']",
                 "assign the view as its weight Parameter, nothing else")


# ---------------------------------------------------------------------------------------------------------
# Step 4 · the fused projection split into q, k and v
# ---------------------------------------------------------------------------------------------------------

_SPLIT_FIX = ("split the last axis into num_heads·d_k, num_kv_heads·d_k and num_kv_heads·d_k (queries, keys, values), "
              "view each as (heads, d_k), then move the heads in front of seq")


def _heads(t: Tensor, heads: int, how: str = "right") -> Tensor:
    """(..., seq, heads·d_k) -> (..., heads, seq, d_k), or a classic wrong way of it."""
    if how == "strided":  # (d_k heads): head h gets features h, h + heads, ...
        return t.unflatten(-1, (-1, heads)).movedim(-1, -3)
    if how == "no transpose":
        return t.reshape(*t.shape[:-2], heads, t.shape[-2], -1)
    return t.unflatten(-1, (heads, -1)).transpose(-3, -2)


def _qkv(qkv: Tensor, heads: int, kv: int, how: str = "right") -> tuple[Tensor, Tensor, Tensor]:
    d_k = qkv.shape[-1] // (heads + 2 * kv)
    q, k, v = qkv.split([heads * d_k, kv * d_k, kv * d_k], dim=-1)
    return _heads(q, heads, how), _heads(k, kv, how), _heads(v, kv, how)


def check_split_qkv(split_qkv: Callable[..., tuple[Tensor, Tensor, Tensor]]) -> None:
    """Check ``split_qkv(qkv, num_heads, num_kv_heads)``: the fused projection's output (..., seq, (num_heads +
    2·num_kv_heads)·d_k) as q (..., num_heads, seq, d_k), k and v (..., num_kv_heads, seq, d_k), head h of q holding
    features h·d_k … (h+1)·d_k - 1 of the queries; views of qkv, no copy. First multi-head attention (4 heads), then
    grouped-query attention (4 heads, 2 and 1 key/value heads), with 0, 1 and 2 leading dimensions, float64 and
    float32; seq, heads and d_k all differ.

    Mistakes it recognises: equal thirds (right only when num_kv_heads = num_heads); the heads left behind seq
    (..., seq, heads, d_k); d_k and heads swapped in the unflatten (each head takes every num_heads-th feature); a
    reshape straight to (..., heads, seq, d_k) without the transpose; k and v swapped; copies instead of views.
    """
    gen = generator(4)
    cases = [((2,), 3, 4, 4, 5, torch.float64), ((2,), 3, 4, 2, 5, torch.float64), ((), 5, 3, 1, 2, torch.float32),
             ((2, 2), 1, 6, 2, 3, torch.float64)]
    mha_passed = False
    for lead, seq, heads, kv, d_k, dtype in cases:
        qkv = torch.randn(*lead, seq, (heads + 2 * kv) * d_k, generator=gen, dtype=torch.float64).to(dtype)
        what = f"split_qkv(qkv of shape {tuple(qkv.shape)}, num_heads={heads}, num_kv_heads={kv})"
        out, error = attempt(what, split_qkv, qkv, heads, kv)
        if error is not None:
            if mha_passed and kv != heads:
                raise AssertionError(
                    f"the split is into equal thirds, right only when num_kv_heads = num_heads: {what} raised "
                    f"{type(error).__name__} ({first_line(error)}), though multi-head attention works: with "
                    "grouped-query attention the keys and values are narrower: split into num_heads·d_k, "
                    "num_kv_heads·d_k and num_kv_heads·d_k, d_k = the width / (num_heads + 2·num_kv_heads).") from error
            crashed(what, error)
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            fail(f"{what} returned {describe(out)}, not three tensors", "return q, k, v")
        expected = _qkv(qkv, heads, kv)
        for name, got, want, n in zip("qkv", out, expected, (heads, kv, kv)):
            label = f"{what} ({name})"
            if isinstance(got, Tensor) and tuple(got.shape) == (*lead, seq, n, d_k) and seq != n:
                fail(f"the heads are left behind seq: {label} has shape {tuple(got.shape)}, (..., seq, heads, d_k)",
                     "move the heads in front of seq: attention runs over seq, once for every head",
                     f"expected {tuple(want.shape)}")
            if isinstance(got, Tensor) and tuple(got.shape) == (*lead, d_k, seq, n) and d_k != n:
                fail(f"d_k and heads are swapped in the unflatten: {label} has shape {tuple(got.shape)}",
                     "view the last axis as (heads, d_k), heads first: head h owns features h·d_k … (h+1)·d_k - 1",
                     f"expected {tuple(want.shape)}")
            if mha_passed and kv != heads and isinstance(got, Tensor) and got.shape != want.shape:
                fail(f"the split is into equal thirds, right only when num_kv_heads = num_heads: {label} has shape "
                     f"{tuple(got.shape)}, expected {tuple(want.shape)}", "with grouped-query attention the keys and "
                     "values are narrower: split into num_heads·d_k, num_kv_heads·d_k and num_kv_heads·d_k")
            got = expect_tensor(label, got, want.shape, _SPLIT_FIX, returns="return q, k, v as tensors")
            if got.dtype != dtype:
                fail(f"{label} is {got.dtype}, expected {dtype} (qkv's)", "split and view only: the numbers stay as "
                     "they are")
        q, k, v = out
        if torch.equal(k, expected[2]) and torch.equal(v, expected[1]) and not torch.equal(k, v):
            fail("k and v are swapped", "the fused output holds queries, then keys, then values: k is the middle part",
                 f"on {what}")
        for name, got, want, n in zip("qkv", out, expected, (heads, kv, kv)):
            if torch.equal(got, want):
                continue
            variants = [(_qkv(qkv, heads, kv, "strided"), "d_k and heads are swapped in the unflatten: each head takes "
                         "every num_heads-th feature, not a block of d_k neighbours", "view the last axis as (heads, "
                         "d_k), heads first: head h owns features h·d_k … (h+1)·d_k - 1, as notebook 08 splits them"),
                        (_qkv(qkv, heads, kv, "no transpose"), "the heads are split with a reshape straight to (..., "
                         "heads, seq, d_k), without the transpose: each head gets pieces of several tokens",
                         "view the last axis as (heads, d_k), then swap seq and heads with a transpose")]
            for wrong, mistake, fix in variants:
                if torch.equal(got, wrong["qkv".index(name)]):
                    fail(mistake, fix, f"on {what} ({name})")
            fail(f"{what} ({name}) holds other numbers than the expected {name}", _SPLIT_FIX)
        copies = [name for name, got in zip("qkv", out) if not _shares_memory(got, qkv)]
        if copies:
            fail(f"{what} copies: {copies[0]} does not share qkv's memory", "split, unflatten and transpose are views: "
                 "a contiguous copy, a clone or a stack copies every number at every step, for nothing")
        mha_passed = mha_passed or kv == heads
    passed("split_qkv: q, k, v of num_heads, num_kv_heads, num_kv_heads heads in front of seq, head h a block of d_k "
           "features, views of qkv; multi-head and grouped-query, 0 to 2 leading dimensions")


# ---------------------------------------------------------------------------------------------------------
# Step 5 · int8 weights, one scale per output row
# ---------------------------------------------------------------------------------------------------------

_QUANT_FIX = ("row i: scale[i] = max_j |W[i, j]| / 127 (1 for a row of zeros), q[i, j] = round(W[i, j] / scale[i]), "
              "q in int8 and scale in float32")


def quantized(weight: Tensor) -> tuple[Tensor, Tensor]:
    """The right (q, scale) of a matrix, row by row: symmetric int8 per output channel, a row of zeros scale 1."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def _weight_case(gen: torch.Generator, rows: list[float], d_in: int, dtype: torch.dtype) -> Tensor:
    """A (len(rows), d_in) matrix whose row i has the size rows[i] (0: a row of zeros)."""
    sizes = torch.tensor(rows, dtype=torch.float64)[:, None]
    return (torch.randn(len(rows), d_in, generator=gen, dtype=torch.float64) * sizes).to(dtype)


def check_quantize_int8(quantize_int8: Callable[[Tensor], tuple[Tensor, Tensor]]) -> None:
    """Check ``quantize_int8(weight)`` -> (q, scale): symmetric int8 per output row, scale[i] = max_j |W[i, j]| / 127
    and q[i, j] = round(W[i, j] / scale[i]) in [-127, 127], q int8 (d_out, d_in), scale float32 (d_out,). A (4, 6)
    float32 matrix whose rows differ in size, a (3, 5) float64 one with a row of zeros (any scale > 0 is accepted
    for it, 1 in the course's version: q is 0 either way), a (5, 4) bfloat16 one.

    Mistakes it recognises: one scale for the whole tensor (per-tensor); a scale per input column; a scale of shape
    (d_out, 1); dividing by 128 (the largest entry becomes 128, which int8 cannot hold); truncation instead of
    rounding; a row of zeros giving scale 0 (q = 0/0, NaN); q not int8; scale not float32; a bfloat16 weight's scale
    computed in bfloat16, then converted; the weight changed in place.
    """
    gen = generator(5)
    cases = [([3.0, 0.1, 1.0, 0.5], 6, torch.float32), ([1.0, 0.0, 2.0], 5, torch.float64),
             ([0.2, 1.0, 4.0, 1.0, 0.05], 4, torch.bfloat16)]
    for rows, d_in, dtype in cases:
        weight = _weight_case(gen, rows, d_in, dtype)
        given = weight.clone()
        d_out = len(rows)
        zeros = ", a row of zeros" if 0 in rows else ""
        what = f"quantize_int8(weight of shape {(d_out, d_in)}, {dtype_name(dtype)}{zeros})"
        out = call(what, quantize_int8, given)
        if not torch.equal(given, weight):
            fail(f"{what} changes the weight it was given in place", "compute q and scale from it without writing "
                 "into it: the float weight is still the model's until the int8 one replaces it")
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            fail(f"{what} returned {describe(out)}, not a pair (q, scale)", "return two tensors: q, scale")
        q, scale = out
        q = expect_tensor(f"{what} (q)", q, (d_out, d_in), "q has the weight's shape (d_out, d_in)",
                          returns="return q and scale as tensors")
        scale = expect_tensor(f"{what} (scale)", scale, None, returns="return q and scale as tensors")
        if scale.numel() == 1:
            fail("one scale for the whole tensor (per-tensor): one large weight then makes every small row's numbers "
                 "round to a few levels", "take one scale per output row: the max of |W| over dim 1 (each row), "
                 "/ 127", f"on {what}: scale has shape {tuple(scale.shape)}, expected {(d_out,)}")
        if tuple(scale.shape) == (d_in,):
            fail("the scale is taken per input column (the max over dim 0), not per output row", "take the max of |W| "
                 "over dim 1: row i (output feature i) gets one scale, which the product applies to output i",
                 f"on {what}: scale has shape {(d_in,)}, expected {(d_out,)}")
        if tuple(scale.shape) == (d_out, 1):
            fail(f"{what} returned scale of shape {(d_out, 1)}, expected {(d_out,)}", "return one number per row, "
                 "(d_out,): the max over dim 1 without keepdim (use scale[:, None] where you divide)")
        scale = expect_tensor(f"{what} (scale)", scale, (d_out,), "one scale per output row: (d_out,)")
        if q.dtype != torch.int8:
            fail(f"{what} returned q as {q.dtype}, not torch.int8", "store q as int8, one byte a number: that is "
                 "where the bytes a step reads go down by 4 from float32")
        if scale.dtype != torch.float32:
            fail(f"{what} returned scale as {scale.dtype}, not torch.float32", "compute the scale in float32 whatever "
                 "the weight's dtype: the int8 kernel takes float32 scales, and d_out of them cost "
                 "nothing")
        right_q, right_scale = quantized(weight)
        zero = torch.tensor([r == 0 for r in rows])
        evidence = f"on {what}: scale {[round(s, 5) for s in scale.tolist()]}, expected {right_scale.tolist()}"
        if zero.any() and not (torch.isfinite(scale[zero]).all() and (scale[zero] > 0).all()):
            fail("a row of zeros gets scale 0, so its q is 0 / 0 = NaN (which int8 turns into garbage)", "give a row "
                 "whose max is 0 the scale 1: its q is then 0, as it should be",
                 evidence)
        keep = ~zero
        amax = weight.detach().float().abs().amax(dim=1)
        if not close(scale[keep], right_scale[keep], rtol=1e-5, atol=0):
            if close(scale[keep], (amax / 128)[keep], rtol=1e-5, atol=0):
                fail("the scale divides by 128: the largest entry then becomes 128, which int8 (-128 … 127) cannot "
                     "hold", "divide by 127, so that q lies in [-127, 127], symmetric around 0", evidence)
            if close(scale, torch.full_like(scale, amax.max().item() / 127), rtol=1e-5, atol=0):
                fail("one scale for the whole tensor (per-tensor): every row got the largest row's scale",
                     "take one scale per output row: the max of |W| over dim 1, / 127", evidence)
            if weight.dtype not in (torch.float32, torch.float64):
                in_dtype = (weight.detach().abs().amax(dim=1) / 127).float()
                if close(scale[keep], in_dtype[keep], rtol=1e-5, atol=0):
                    low = dtype_name(weight.dtype)
                    fail(f"the scale is computed in {low}, then converted: {low} keeps about 3 significant digits, so "
                         f"every scale is off by up to 0.4 %",
                         "convert the weight to float32 first (weight.float()), then take the max and divide by 127",
                         evidence)
            fail(f"{what} returned other scales than max_j |W[i, j]| / 127", _QUANT_FIX, evidence)
        if torch.equal(q, right_q):
            continue
        wrong = (weight.detach().float() / right_scale[:, None]).trunc().clamp(-127, 127).to(torch.int8)
        if torch.equal(q, wrong):
            fail("q is truncated (the fraction cut off), not rounded: every number moves towards 0 by up to a whole "
                 "step", "round to the nearest integer before the cast to int8, which truncates",
                 f"on {what}")
        if (q == -128).any():
            fail("q reaches -128 (or wraps around from 128): the range is ±127", "divide by max / 127 and clamp to "
                 "[-127, 127] before the cast", f"on {what}")
        fail(f"{what} returned q that differs from round(W / scale[:, None])", _QUANT_FIX,
             f"{int((q != right_q).sum())} of {q.numel()} entries differ")
    passed("quantize_int8: one float32 scale per output row, max |W| / 127, q = round(W / scale) in int8 within ±127, "
           "a row of zeros safe; float32, float64 and bfloat16 weights")


# ---------------------------------------------------------------------------------------------------------
# Step 6 · the product with int8 weights
# ---------------------------------------------------------------------------------------------------------

def check_int8_matmul(int8_matmul: Callable[[Tensor, Tensor, Tensor], Tensor]) -> None:
    """Check ``int8_matmul(x, q, scale)``: x @ (q · scale[:, None])ᵀ, (..., d_in) -> (..., d_out) in x's dtype. A
    square q (6, 6) with x (4, 6) float64 first (where a scale per input feature runs too), then x (2, 3, 6) float32,
    x (3, 6) bfloat16 and x (6,) float32; q random in [-127, 127], scales between 0.01 and 0.1.

    Mistakes it recognises: the scale forgotten; the scale applied per input feature (to x) instead of per output;
    the int8 matrix multiplied as it is (PyTorch multiplies one dtype with itself: a crash); q without its transpose
    (x @ q, which the square case runs); the result not in x's dtype.
    """
    gen = generator(6)
    cases = [((4,), 6, 6, torch.float64), ((2, 3), 6, 5, torch.float32), ((3,), 6, 4, torch.bfloat16),
             ((), 6, 5, torch.float32)]
    for lead, d_in, d_out, dtype in cases:
        x = torch.randn(*lead, d_in, generator=gen, dtype=torch.float64).to(dtype)
        q = torch.randint(-127, 128, (d_out, d_in), generator=gen, dtype=torch.int8)
        scale = 0.01 + 0.09 * torch.rand(d_out, generator=gen)
        what = (f"int8_matmul(x of shape {tuple(x.shape)} {dtype_name(dtype)}, q of shape {(d_out, d_in)} int8, "
                f"scale of shape {(d_out,)} float32)")
        out, error = attempt(what, int8_matmul, x.clone(), q.clone(), scale.clone())
        if error is not None:
            if isinstance(error, RuntimeError) and any(word in str(error) for word in ("dtype", "Char", "Int")):
                raise AssertionError(
                    f"the int8 matrix goes into the product as it is: {what} raised {type(error).__name__} "
                    f"({str(error).strip().splitlines()[0]}): PyTorch multiplies two matrices of one dtype: convert q "
                    "to x's dtype first, which is exact for integers up to 127.") from error
            crashed(what, error)
        xd, wd = x.double(), q.double() * scale.double()[:, None]
        expected = (xd @ wd.T).to(dtype)
        out = expect_tensor(what, out, expected.shape, "(..., d_in) -> (..., d_out): x @ qᵀ, then each output column "
                            "times its scale", returns="return the product, a tensor")
        if out.dtype != dtype:
            fail(f"{what} returned {out.dtype} for a {dtype} x: the result must be in x's dtype", "convert q (and "
                 "scale) to x.dtype and multiply in it: no .float() of x, and no float32 result for a bfloat16 input")
        tolerance = dict(rtol=3e-2, atol=0.1) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
        diagnose(what, out, expected, [
            (lambda: (xd @ q.double().T).to(dtype), "the scale is forgotten: the product is x @ qᵀ alone",
             "multiply output column i by scale[i]: q · scale is the weight"),
            (lambda: ((xd * scale.double()) @ q.double().T).to(dtype), "the scale is applied per input feature (to x), "
             "not per output", "scale[i] belongs to row i of q, output feature i: multiply the product's last "
             "dimension by it, (x @ qᵀ) * scale"),
            (lambda: ((xd @ q.double()) * scale.double()).to(dtype), "q is applied without its transpose: x @ q "
             "multiplies x by q's columns, not by its rows", "q is (d_out, d_in) like notebook 01's weight: x @ q.T"),
        ], "x @ (q · scale[:, None])ᵀ: the product with q in x's dtype, then each output column times its scale",
            **tolerance)
    passed("int8_matmul: x @ (q · scale)ᵀ with one scale per output, in x's dtype (float32, float64, bfloat16), with "
           "and without leading dimensions")


# ---------------------------------------------------------------------------------------------------------
# Step 7 · attention at a fixed shape
# ---------------------------------------------------------------------------------------------------------

def _attention(q: Tensor, keys: Tensor, values: Tensor, seen: Tensor, scale: bool = True) -> Tensor:
    """Softmax attention of q (..., h, 1, d) over the positions where `seen` (L,) is True, key/value head j serving
    query heads j·g … j·g+g-1, in float64, written out: the checks' own reference."""
    group = q.shape[-3] // keys.shape[-3]
    k, v = keys.double().repeat_interleave(group, -3), values.double().repeat_interleave(group, -3)
    scores = q.double() @ k.transpose(-2, -1) / (q.shape[-1] ** 0.5 if scale else 1.0)
    weights = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1)
    return (weights @ v).to(q.dtype)


def check_attend_at(attend_at: Callable[..., Tensor]) -> None:
    """Check ``attend_at(q, k, v, keys, values, position)``: k and v written into the buffers at ``position`` (a (1,)
    integer tensor), in place, then q attending over the buffers with every position after ``position`` masked out.
    Buffers of 6 positions whose unwritten ones hold large stale numbers (a reset cache keeps them), at positions 0, 3
    and 5: grouped heads (4 query heads, 2 key/value heads) in float64, then one head per key/value head with a batch
    of 2 in float32.

    Mistakes it recognises: k and v not written into the buffers (or written into a copy), written at the wrong
    position, or swapped; the mask forgotten (the stale positions attended to), `<` for `<=` (the new token does not
    see itself), the mask inverted (True means "attend" for F.scaled_dot_product_attention), a 1-D mask; the heads
    not grouped, or grouped the wrong way; the 1/√d_k forgotten.
    """
    gen = generator(7)
    cases = [((), 4, 2, torch.float64, (0, 3, 5)), ((2,), 2, 2, torch.float32, (0, 5))]
    length, d_k = 6, 4
    for lead, heads, kv_heads, dtype, positions in cases:
        keys = (100 * torch.randn(*lead, kv_heads, length, d_k, generator=gen, dtype=torch.float64)).to(dtype)
        values = (100 * torch.randn(*lead, kv_heads, length, d_k, generator=gen, dtype=torch.float64)).to(dtype)
        for position in positions:
            q = torch.randn(*lead, heads, 1, d_k, generator=gen, dtype=torch.float64).to(dtype)
            k, v = (torch.randn(*lead, kv_heads, 1, d_k, generator=gen, dtype=torch.float64).to(dtype)
                    for _ in range(2))
            at = torch.tensor([position])
            what = (f"attend_at(q {tuple(q.shape)}, k and v {tuple(k.shape)}, keys and values {tuple(keys.shape)}, "
                    f"position tensor([{position}])) in {dtype_name(dtype)}")
            old_keys, old_values = keys.clone(), values.clone()
            out, error = attempt(what, attend_at, q.clone(), k.clone(), v.clone(), keys, values, at.clone())
            if error is not None:
                words = str(error)
                if "Dimension out of range" in words:
                    fail(f"{what} raised {type(error).__name__} ({first_line(error)}): most likely the mask is 1-D, "
                         "(max_seq_len,), which F.scaled_dot_product_attention reads for some shapes and not others",
                         "shape the mask (1, max_seq_len), one row for the one query: mask.view(1, -1)")
                if heads != kv_heads and "must match the size" in words:
                    fail(f"{what} raised {type(error).__name__} ({first_line(error)}): the {heads} query heads meet "
                         f"{kv_heads} key/value heads without being grouped", "let F.scaled_dot_product_attention "
                         "group them (enable_gqa=True), or repeat each key/value head g times in place "
                         "(repeat_interleave(g, dim=-3))")
                crashed(what, error)
            new_keys, new_values = old_keys.clone(), old_values.clone()
            new_keys[..., position, :], new_values[..., position, :] = k[..., 0, :], v[..., 0, :]
            if not (torch.equal(keys, new_keys) and torch.equal(values, new_values)):
                others = [p for p in range(length) if p != position]
                untouched = torch.equal(keys[..., others, :], old_keys[..., others, :])
                if torch.equal(keys, old_keys) and torch.equal(values, old_values):
                    fail("k and v are not written into the buffers: keys and values are unchanged (written into a "
                         "copy, such as the result of index_copy without the underscore, or not at all)",
                         "write in place: keys.index_copy_(-2, position, k) (and the same for values), so that the "
                         "cache keeps them for the next steps", f"on {what}")
                if torch.equal(keys[..., position, :], v[..., 0, :]) and torch.equal(values[..., position, :],
                                                                                     k[..., 0, :]):
                    fail("k and v are swapped: the key went into values and the value into keys",
                         "k into keys, v into values", f"on {what}")
                if not untouched:
                    fail("k and v are written at the wrong place: positions other than `position` changed",
                         "write along the positions' axis (-2) at `position` alone: index_copy_(-2, position, k)",
                         f"on {what}")
                fail("the buffers do not hold k and v at `position` after the call", "keys[..., position, :] must be "
                     "k and values[..., position, :] must be v: index_copy_(-2, position, k)", f"on {what}")
            out = expect_tensor(what, out, q.shape, "one vector per query head: (..., heads, 1, d_k), q's shape",
                                returns="return the attention's output, a tensor")
            span = torch.arange(length)
            expected = _attention(q, new_keys, new_values, span <= position)
            tolerance = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-7, atol=1e-7)
            group = heads // kv_heads
            tiled = lambda t: t.repeat(*([1] * (t.ndim - 3)), group, 1, 1)  # noqa: E731 (heads 0, 1, 0, 1, …)
            variants = [
                (lambda: _attention(q, new_keys, new_values, span >= 0), "the mask is forgotten: q attends to every "
                 "position of the buffers, those not written yet (or left by an earlier text) included",
                 "mask out the positions after `position`: attn_mask = arange(max_seq_len) <= position, shaped (1, "
                 "max_seq_len)"),
                *[(lambda empty=empty: _attention(q, new_keys, new_values, span < position).nan_to_num(empty),
                   "the new token does not see itself: the mask keeps the positions < position, not <= position (at "
                   "position 0 nothing is left: zeros from F.scaled_dot_product_attention, NaN from a softmax)",
                   "keep every position up to and including `position`: arange(max_seq_len) <= position")
                  for empty in (float("nan"), 0.0)],
                *[(lambda empty=empty: _attention(q, new_keys, new_values, span > position).nan_to_num(empty),
                   "the mask is inverted: q attends to the positions after `position` only", "for F.scaled_dot_product"
                   "_attention a boolean mask's True means *take part* (the opposite of masked_fill's): pass "
                   "arange(max_seq_len) <= position") for empty in (float("nan"), 0.0)],
                (lambda: _attention(q, new_keys, new_values, span <= position, scale=False),
                 "the scores are not divided by √d_k", "scale q·kᵀ by 1/√d_k, as notebook 05 (F.scaled_dot_product_"
                 "attention does it by default)"),
            ]
            if group > 1:
                variants.append((lambda: _attention(q, tiled(new_keys), tiled(new_values), span <= position),
                                 "the key/value heads are tiled (0, 1, 0, 1, …), not repeated in place (0, 0, 1, 1, "
                                 "…)", "key/value head j serves query heads j·g … j·g+g-1: repeat_interleave(g, "
                                 "dim=-3), or let F.scaled_dot_product_attention group them (enable_gqa=True)"))
            diagnose(what, out, expected, variants, "attention of q over positions 0 … position of the buffers, "
                     "after writing k and v there", **tolerance)
            keys.copy_(new_keys), values.copy_(new_values)
    passed("attend_at: k and v written in place at `position`, q attending over the buffers up to it and not past it "
           "(stale numbers ignored), grouped heads, float32 and float64")

"""The step checks of notebook 16 pass the right steps and name each planted mistake on their first line."""

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from transformer_from_scratch import fast_decode
from transformer_from_scratch.checks.steps.fast_decode import (check_attend_at, check_column_major,
                                                               check_decode_bytes, check_fuse_weights,
                                                               check_int8_matmul, check_quantize_int8,
                                                               check_split_qkv)
from mutants import Catalogue

# --- the right steps: the course's (src/transformer_from_scratch/fast_decode.py) ----------------------------------

decode_bytes = fast_decode.decode_bytes
column_major = fast_decode.column_major
fuse_weights = fast_decode.fuse_weights
split_qkv = fast_decode.split_qkv
quantize_int8 = fast_decode.quantize_int8
int8_matmul = fast_decode.int8_matmul
attend_at = fast_decode.attend_at


def test_the_right_steps_pass_with_one_line(capsys):
    check_decode_bytes(decode_bytes)
    check_column_major(column_major)
    check_fuse_weights(fuse_weights)
    check_split_qkv(split_qkv)
    check_quantize_int8(quantize_int8)
    check_int8_matmul(int8_matmul)
    check_attend_at(attend_at)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * 7, lines


def _by_parameters(model, cache_length=0):
    """Summing model.parameters() (which holds a tied matrix once) is right too."""
    table, head = model.token_embeddings.weight, model.lm_head.weight
    total = sum(p.nbytes for p in model.parameters())
    if head.data_ptr() != table.data_ptr():
        total -= table.nbytes - table[0].nbytes
    cache = sum(2 * block.attn.num_kv_heads * block.attn.d_k for block in model.layers)
    return total + cache_length * cache * table.element_size()


def _split_with_einops(qkv, num_heads, num_kv_heads):
    d_k = qkv.shape[-1] // (num_heads + 2 * num_kv_heads)
    parts = qkv.split([num_heads * d_k, num_kv_heads * d_k, num_kv_heads * d_k], dim=-1)
    return tuple(rearrange(t, "... seq (heads d_k) -> ... heads seq d_k", d_k=d_k) for t in parts)


def test_other_right_ways_pass(capsys):
    check_decode_bytes(_by_parameters)
    check_column_major(lambda weight: torch.empty_strided(weight.shape, (1, weight.shape[0]),
                                                          dtype=weight.dtype).copy_(weight))
    check_split_qkv(_split_with_einops)
    check_int8_matmul(lambda x, q, scale: x @ (q.to(x.dtype) * scale.to(x.dtype)[:, None]).T)  # dequantized first
    check_attend_at(_attend_written_out)
    check_attend_at(_attend_by_masked_fill)
    assert capsys.readouterr().out.count("✓") == 6


# --- decode_bytes -------------------------------------------------------------------------------------------------

def _bytes(*, dedupe=True, table="row", unit="bytes", cache="right"):
    """decode_bytes with one thing done wrong (each keyword's default is the right way)."""
    def decode_bytes(model, cache_length=0):
        embedding, head = model.token_embeddings.weight, model.lm_head.weight
        tied = head.data_ptr() == embedding.data_ptr()

        def size(t):
            return {"bytes": t.nbytes, "numbers": t.numel(), "four": 4 * t.numel()}[unit]
        seen, total = set(), 0
        for t in model.state_dict().values():
            if dedupe and t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            if t.data_ptr() == embedding.data_ptr() and not tied:
                total += {"row": size(t[0]), "full": size(t), "none": 0}[table]
            else:
                total += size(t)
        if cache == "none":
            return total
        number = {"bytes": embedding.element_size(), "numbers": 1, "four": 4}[unit]
        blocks = model.layers[:1] if cache == "one layer" else model.layers
        per_position = 0
        for block in blocks:
            heads = block.attn.num_heads if cache == "num_heads" else block.attn.num_kv_heads
            per_position += (1 if cache == "keys" else 2) * heads * block.attn.d_k
        return total + cache_length * per_position * (4 if cache == "float32" else number)
    return decode_bytes


BYTES_MUTANTS = [
    (_bytes(dedupe=False), "the tied matrix is counted twice"),
    (_bytes(table="full"), "the whole embedding table is counted"),
    (_bytes(table="none"), "the embedding table is left out"),
    (_bytes(unit="numbers"), "it counts numbers, not bytes"),
    (_bytes(unit="four"), "it counts 4 bytes a number whatever the dtype"),
    (_bytes(cache="none"), "the KV cache is forgotten"),
    (_bytes(cache="keys"), "only the keys (or only the values)"),
    (_bytes(cache="num_heads"), "the cache is sized with num_heads"),
    (_bytes(cache="one layer"), "the cache of one layer only"),
    (_bytes(cache="float32"), "the cache is counted in float32"),
    (lambda model, cache_length=0: float(decode_bytes(model, cache_length)), "returned a float, not an int"),
]


# --- column_major -------------------------------------------------------------------------------------------------

def _column_major_in_place(weight):
    weight.data = weight.T.contiguous().T  # the caller's tensor changes its layout
    return weight


COLUMN_MUTANTS = [
    (lambda weight: weight.T, "that is weight.T"),
    (lambda weight: weight.T.contiguous(), "that is weight.T"),
    (lambda weight: weight.clone(), "still stored row by row"),
    (lambda weight: weight, "still stored row by row"),
    (lambda weight: weight.T.contiguous().view(weight.shape), "the numbers moved"),
    (lambda weight: (2 * weight).T.contiguous().T, "changes the numbers of the matrix"),
    (_column_major_in_place, "changes the weight it was given in place"),
]


# --- fuse_weights -------------------------------------------------------------------------------------------------

def _fuse(*, dim=0, order=1, layout=column_major, views=True, offset=True, reshape=False, returns_copy=False):
    """fuse_weights with one thing done wrong."""
    def fuse_weights(*linears):
        weights = [linear.weight.detach() for linear in linears][::order]
        stacked = torch.cat(weights, dim=dim)
        if reshape:
            stacked = stacked.T.contiguous().view(stacked.shape).T.contiguous().T
        fused = layout(stacked)
        if views and dim == 0:
            start = 0
            for linear in linears:
                rows = linear.weight.shape[0]
                linear.weight = nn.Parameter(fused[start:start + rows], requires_grad=False)
                start += rows if offset else 0
        return torch.empty_like(fused).copy_(fused) if returns_copy else fused  # a copy, not what the linears view
    return fuse_weights


FUSE_MUTANTS = [
    (_fuse(dim=1, views=False), "the weights are stacked along d_in"),
    (_fuse(order=-1), "the weights are not stacked in the order given"),
    (_fuse(layout=lambda t: t), "stored row by row"),
    (_fuse(views=False), "the linears keep their own copies"),
    (_fuse(returns_copy=True), "the linears keep their own copies"),
    (_fuse(offset=False), "holds other numbers than before"),
    (_fuse(reshape=True, views=False), "differs from the linears' weights stacked by rows"),
]


# --- split_qkv ----------------------------------------------------------------------------------------------------

def _split(*, how="right", thirds=False, swap=False, copy=False):
    """split_qkv with one thing done wrong."""
    def split_qkv(qkv, num_heads, num_kv_heads):
        d_k = qkv.shape[-1] // (num_heads + 2 * num_kv_heads)
        if thirds:
            parts = qkv.chunk(3, dim=-1)
        else:
            parts = qkv.split([num_heads * d_k, num_kv_heads * d_k, num_kv_heads * d_k], dim=-1)
        out = []
        for t, heads in zip(parts, (num_heads, num_kv_heads, num_kv_heads)):
            if how == "behind seq":
                t = t.unflatten(-1, (heads, -1))
            elif how == "swapped unflatten":
                t = t.unflatten(-1, (-1, heads)).transpose(-3, -2)
            elif how == "strided":
                t = t.unflatten(-1, (-1, heads)).movedim(-1, -3)
            elif how == "no transpose":
                t = t.reshape(*t.shape[:-2], heads, t.shape[-2], -1)
            else:
                t = t.unflatten(-1, (heads, -1)).transpose(-3, -2)
            out.append(t.contiguous() if copy else t)
        q, k, v = out
        return (q, v, k) if swap else (q, k, v)
    return split_qkv


SPLIT_MUTANTS = [
    (_split(thirds=True), "the split is into equal thirds"),
    (_split(how="behind seq"), "the heads are left behind seq"),
    (_split(how="swapped unflatten"), "d_k and heads are swapped in the unflatten"),
    (_split(how="strided"), "d_k and heads are swapped in the unflatten"),
    (_split(how="no transpose"), "without the transpose"),
    (_split(swap=True), "k and v are swapped"),
    (_split(copy=True), "copies: q does not share qkv's memory"),
]


# --- quantize_int8 ------------------------------------------------------------------------------------------------

def _quantize(*, scale_of=None, step=torch.round, divisor=127, clamp=127, dtype=torch.int8, zero_safe=True,
              scale_dtype=torch.float32, keepdim=False):
    """quantize_int8 with one thing done wrong."""
    def quantize_int8(weight):
        w = weight.detach().to(scale_dtype)
        amax = w.abs().amax(dim=1) if scale_of is None else scale_of(w)
        scale = amax / divisor
        if zero_safe:
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        wide = scale if scale.ndim == 0 else scale[:, None] if scale.shape[0] == w.shape[0] else scale[None, :]
        q = step(w / wide).clamp(-clamp, clamp).to(dtype)
        return q, (scale[:, None] if keepdim else scale)
    return quantize_int8


def _low_precision_scale(weight):
    """The natural first try: the max and the division in the weight's own dtype, the scale converted at the end."""
    scale = weight.abs().amax(dim=1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8), scale.float()


def _in_place(weight):
    q, scale = quantize_int8(weight)
    weight.copy_(q * scale[:, None])  # the float weight becomes its own dequantized copy
    return q, scale


QUANT_MUTANTS = [
    (_quantize(scale_of=lambda w: w.abs().max()), "one scale for the whole tensor (per-tensor): one large weight"),
    (_quantize(scale_of=lambda w: w.abs().max().expand(w.shape[0])), "every row got the largest row's scale"),
    (_quantize(scale_of=lambda w: w.abs().amax(dim=0)), "the scale is taken per input column"),
    (_quantize(keepdim=True), "returned scale of shape (4, 1)"),
    (_quantize(divisor=128), "the scale divides by 128"),
    (_quantize(divisor=128, clamp=128), "the scale divides by 128"),
    (_quantize(step=torch.trunc), "q is truncated"),
    (_quantize(zero_safe=False), "a row of zeros gets scale 0"),
    (_quantize(dtype=torch.float32), "returned q as torch.float32, not torch.int8"),
    (_quantize(scale_dtype=torch.float64), "returned scale as torch.float64, not torch.float32"),
    (_low_precision_scale, "the scale is computed in bfloat16, then converted"),
    (_in_place, "changes the weight it was given in place"),
]


# --- int8_matmul --------------------------------------------------------------------------------------------------

MATMUL_MUTANTS = [
    (lambda x, q, scale: x @ q.T.to(x.dtype), "the scale is forgotten"),
    (lambda x, q, scale: (x * scale.to(x.dtype)) @ q.T.to(x.dtype), "the scale is applied per input feature"),
    (lambda x, q, scale: x @ q.T * scale, "the int8 matrix goes into the product as it is"),
    (lambda x, q, scale: x.float() @ q.T.float() * scale, "the result must be in x's dtype"),
    (lambda x, q, scale: (x @ q.to(x.dtype)) * scale.to(x.dtype), "q is applied without its transpose"),
]



# --- attend_at ----------------------------------------------------------------------------------------------------

def _attend_written_out(q, k, v, keys, values, position):
    """Another right way: the write by a boolean row, the attention by hand with the heads repeated in place."""
    at = (torch.arange(keys.shape[-2]) == position).view(-1, 1)  # (max_seq_len, 1)
    keys.copy_(torch.where(at, k, keys)), values.copy_(torch.where(at, v, values))
    group = q.shape[-3] // keys.shape[-3]
    scores = q @ keys.repeat_interleave(group, -3).transpose(-2, -1) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(torch.arange(keys.shape[-2]) > position, float("-inf"))
    return torch.softmax(scores, dim=-1) @ values.repeat_interleave(group, -3)


def _attend_by_masked_fill(q, k, v, keys, values, position):
    """Another right way: a float mask of -inf, added."""
    keys.index_copy_(-2, position, k), values.index_copy_(-2, position, v)
    mask = torch.zeros(keys.shape[-2], dtype=q.dtype).masked_fill(torch.arange(keys.shape[-2]) > position,
                                                                  float("-inf"))
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask.view(1, -1), enable_gqa=True)


def _attend(write=True, into="keys", at=0, mask=lambda span, p: (span <= p).view(1, -1), scale=None, tile=False,
            gqa=True):
    """attend_at with one mistake: no write (or into a copy), k and v swapped, written `at` positions off, another
    mask, another scale, the key/value heads tiled."""
    def attend_at(q, k, v, keys, values, position):
        if write:
            first, second = (k, v) if into == "keys" else (v, k)
            keys.index_copy_(-2, position + at, first), values.index_copy_(-2, position + at, second)
        else:
            keys, values = keys.index_copy(-2, position, k), values.index_copy(-2, position, v)
        seen = mask(torch.arange(keys.shape[-2]), position)
        if tile:
            group = q.shape[-3] // keys.shape[-3]
            keys, values = (t.repeat(*([1] * (t.ndim - 3)), group, 1, 1) for t in (keys, values))
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=seen, enable_gqa=gqa, scale=scale)
    return attend_at


ATTEND_MUTANTS = [
    (_attend(write=False), "k and v are not written into the buffers"),
    (_attend(into="values"), "k and v are swapped"),
    (_attend(at=1), "k and v are written at the wrong place"),
    (_attend(mask=lambda span, p: (span >= 0).view(1, -1)), "the mask is forgotten"),
    (_attend(mask=lambda span, p: (span < p).view(1, -1)), "the new token does not see itself"),
    (_attend(mask=lambda span, p: (span > p).view(1, -1)), "the mask is inverted"),
    (_attend(tile=True), "the key/value heads are tiled"),
    (_attend(scale=1.0), "the scores are not divided by √d_k"),
    (_attend(mask=lambda span, p: (span <= p).view(-1)), "most likely the mask is 1-D"),
    (_attend(gqa=False), "without being grouped"),
]

CATALOGUES = [
    Catalogue(check_decode_bytes, BYTES_MUTANTS, right=decode_bytes),
    Catalogue(check_column_major, COLUMN_MUTANTS, right=column_major,
              shared=frozenset({"that is weight.T", "still stored row by row"}),
              ids=["weight.T", "weight.T contiguous", "a row-major copy", "the weight itself", "a view of the "
                   "transposed copy", "values changed", "the input changed in place"]),
    Catalogue(check_fuse_weights, FUSE_MUTANTS, right=fuse_weights,
              shared=frozenset({"the linears keep their own copies"}),
              ids=["stacked along d_in", "order not kept", "row-major", "copies", "a copy of the matrix they view",
                   "views of the wrong rows", "values changed"]),
    Catalogue(check_split_qkv, SPLIT_MUTANTS, right=split_qkv,
              shared=frozenset({"d_k and heads are swapped in the unflatten"}),
              ids=["equal thirds", "heads behind seq", "d_k and heads swapped (shape)",
                   "d_k and heads swapped (strided)", "no transpose", "k and v swapped", "copies"]),
    Catalogue(check_quantize_int8, QUANT_MUTANTS, right=quantize_int8,
              shared=frozenset({"the scale divides by 128"}),
              ids=["per-tensor scalar", "per-tensor broadcast", "per input column", "keepdim", "divided by 128",
                   "divided by 128, clamped to 128", "truncation", "zero row", "q float", "scale float64",
                   "scale in bfloat16", "in place"]),
    Catalogue(check_int8_matmul, MATMUL_MUTANTS, right=int8_matmul),
    Catalogue(check_attend_at, ATTEND_MUTANTS, right=attend_at,
              ids=["not written", "k and v swapped", "one position off", "no mask", "< for <=", "mask inverted",
                   "heads tiled", "no 1/sqrt(d_k)", "1-D mask", "heads not grouped"]),
]

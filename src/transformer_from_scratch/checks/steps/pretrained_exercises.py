"""Self-checks for the exercises of notebook 14 (pretrained): the bits per weight of Q8_0 and Q4_1, undoing Hugging
Face's permutation of the query and key rows, and the bytes of SmolLM2's KV cache over its whole context.

The contract is the step checks' (``transformer_from_scratch.checks.steps``): right, one line starting with ✓ that
says what was checked, never the answer; wrong, an ``AssertionError`` whose first line names the mistake and the
principle to fix it, never the code. The answers are computed here, out of the learner's view.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from ...kv_cache import KVCache
from .._harness import call, describe, fail, passed

# ---------------------------------------------------------------------------------------------------------
# Exercise 1 · bits per weight
# ---------------------------------------------------------------------------------------------------------

_BLOCK = 32  # weights per block, both types
_Q8_0_BYTES = {"scale": 2, "values": 32}            # float16 d, 32 int8
_Q4_1_BYTES = {"scale": 2, "minimum": 2, "values": 16}  # float16 d and m, 32 four-bit values in 16 bytes


def _bits(layout: dict[str, int], *, leave_out: tuple[str, ...] = ()) -> float:
    return 8 * sum(n for part, n in layout.items() if part not in leave_out) / _BLOCK


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_bits_per_weight(bits_q8_0: Any, bits_q4_1: Any) -> None:
    """Check exercise 1: ``bits_q8_0`` and ``bits_q4_1``, the bits one weight takes in each type, its share of the
    block's float16 numbers included. The answers are counted here from the block layouts.

    Mistakes it recognises: not numbers; the scale (or Q4_1's minimum) left out; bytes in place of bits; the two
    swapped; float32's 32 bits per weight; Q4_1's 4-bit values counted as a byte each."""
    for name, value in [("bits_q8_0", bits_q8_0), ("bits_q4_1", bits_q4_1)]:
        if not _is_number(value):
            fail(f"{name} is {describe(value)}, not a number", "write the bits per weight as a Python number")
    right = _bits(_Q8_0_BYTES), _bits(_Q4_1_BYTES)
    near = lambda a, b: math.isclose(a, b, rel_tol=1e-6)  # noqa: E731
    if near(bits_q8_0, right[0]) and near(bits_q4_1, right[1]):
        passed("bits per weight: each block's bytes, its float16 numbers included, times 8 over its 32 weights "
               "(counted out of view)")
        return
    if near(bits_q8_0, right[1]) and near(bits_q4_1, right[0]):
        fail("bits_q8_0 and bits_q4_1 are swapped", "Q8_0 stores 8-bit values, Q4_1 4-bit ones: Q8_0 takes more")
    for name, value, layout in [("bits_q8_0", bits_q8_0, _Q8_0_BYTES), ("bits_q4_1", bits_q4_1, _Q4_1_BYTES)]:
        index = 0 if name == "bits_q8_0" else 1
        if near(value, right[index]):
            continue
        if near(value, right[index] / 8):
            fail(f"{name} counts bytes per weight, not bits", "a byte is 8 bits")
        if (near(value, _bits(layout, leave_out=("scale", "minimum")))
                or near(value, _bits(layout, leave_out=("scale",)))):
            fail(f"{name} leaves out the block's float16 numbers", "the scale (and Q4_1's minimum) are 2 bytes each, "
                 "shared by the 32 weights of the block: add their share")
        if near(value, 32):
            fail(f"{name} is float32's 32 bits", "count the bytes of one block of the quantized type")
        if name == "bits_q4_1" and near(value, 8 * (2 + 2 + 32) / _BLOCK):
            fail("bits_q4_1 counts a byte per 4-bit value", "two 4-bit values share one byte: 32 values take 16 bytes")
        fail(f"{name} is not the bits of one block over its 32 weights", "add up the block's bytes (The maths), "
             "times 8, over 32")


# ---------------------------------------------------------------------------------------------------------
# Exercise 2 · undoing Hugging Face's permutation of W_Q and W_K
# ---------------------------------------------------------------------------------------------------------

def _to_half_split(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The interleaved pairs (the course's RoPE) -> Hugging Face's halves: within each head, the rows of the pairs'
    first elements first, then their second elements. Written row by row, from the definition."""
    d_k = w.shape[0] // heads
    order = [h * d_k + 2 * i + half for h in range(heads) for half in (0, 1) for i in range(d_k // 2)]
    return w[order]


def _cases() -> list[tuple[torch.Tensor, int]]:
    generator = torch.Generator().manual_seed(14)
    shapes = [(1, 4, 3), (2, 8, 5), (9, 64, 12), (3, 64, 7)]  # (heads, d_k, columns)
    return [(torch.randn(heads * d_k, columns, generator=generator, dtype=torch.float64), heads)
            for heads, d_k, columns in shapes]


def check_unpermute(unpermute: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
    """Check exercise 2: ``unpermute(w, num_heads)`` takes Hugging Face's rows of W_Q or W_K (within each head, the
    first elements of RoPE's pairs, then the second elements) back to the course's interleaved pairs, on random
    matrices of several head counts and sizes; the permutation is written here row by row from its definition.

    Mistakes it recognises: the permutation applied again instead of undone; the heads ignored (the whole matrix
    treated as one head); the shape changed; the input changed in place."""
    for ours, heads in _cases():
        theirs = _to_half_split(ours, heads)
        given = theirs.clone()
        out = call(f"unpermute(w of shape {tuple(theirs.shape)}, {heads})", unpermute, given, heads)
        if not torch.equal(given, theirs):
            fail("unpermute changed its input in place", "return a new tensor: the state dict you read must not move")
        if not isinstance(out, torch.Tensor) or out.shape != ours.shape:
            fail(f"unpermute returned {describe(out)}, not a tensor of the input's shape {tuple(ours.shape)}",
                 "reorder the rows only: the shape stays (heads·d_k, d_model)")
        if torch.equal(out, ours):
            continue
        if torch.equal(out, _to_half_split(theirs, heads)):
            fail("unpermute applies Hugging Face's permutation again instead of undoing it",
                 "the halves go back into pairs: row i of the first half and row i of the second become rows 2i and "
                 "2i+1")
        if heads > 1 and torch.equal(out, _unsplit_whole(theirs)):
            fail("unpermute treats the whole matrix as one head", "each head has its own two halves: split the rows "
                 "by head first")
        fail(f"unpermute(w, {heads}) puts rows in the wrong places", "within each head, row i of the first half "
             "goes to row 2i and row i of the second half to row 2i+1")
    passed("unpermute: Hugging Face's halves back to the interleaved pairs, head by head, on random matrices of "
           "1 to 9 heads")


def _unsplit_whole(w: torch.Tensor) -> torch.Tensor:
    half = w.shape[0] // 2
    return torch.stack([w[:half], w[half:]], dim=1).reshape(w.shape)


# ---------------------------------------------------------------------------------------------------------
# Exercise 3 · the bytes of SmolLM2's KV cache over its whole context
# ---------------------------------------------------------------------------------------------------------

_LAYERS, _HEADS, _KV_HEADS, _D_K, _CONTEXT = 30, 9, 3, 64, 8192


def _cache_bytes(kv_heads: int) -> int:
    """What notebook 12's caches take for the whole context, float32, batch 1: one KVCache per layer, measured."""
    return _LAYERS * KVCache(1, kv_heads, _CONTEXT, _D_K, device="meta").nbytes


def check_kv_cache_bytes(kv_cache_bytes: Any) -> None:
    """Check exercise 3: ``kv_cache_bytes``, the bytes of SmolLM2's KV cache for its whole context of 8,192 tokens,
    float32, batch 1 (to 1 %). The answer is measured here on notebook 12's KVCache.

    Mistakes it recognises: not a number; the 9 query heads in place of the 3 key/value heads; half of it (keys or
    values only, or float16's 2 bytes); one layer only; gibibytes or megabytes in place of bytes."""
    if not _is_number(kv_cache_bytes):
        fail(f"kv_cache_bytes is {describe(kv_cache_bytes)}, not a number", "write the bytes as a Python number")
    right = _cache_bytes(_KV_HEADS)
    near = lambda a, b: math.isclose(a, b, rel_tol=0.01)  # noqa: E731
    if near(kv_cache_bytes, right):
        passed("kv_cache_bytes: keys and values, every layer, the key/value heads, every position, float32 "
               "(measured out of view)")
        return
    mistakes = [
        (_cache_bytes(_HEADS), "kv_cache_bytes counts the 9 query heads", "with grouped-query attention the cache "
         "holds the key/value heads only"),
        (right / 2, "kv_cache_bytes is half the cache: the keys or the values only, or 2 bytes a number",
         "the cache holds a key and a value per head and position, float32: 4 bytes a number"),
        (right / _LAYERS, "kv_cache_bytes counts one layer", "every layer keeps its own keys and values"),
        (right / 2 ** 30, "kv_cache_bytes is in GiB, not bytes", "give the number of bytes"),
        (right / 1e6, "kv_cache_bytes is in megabytes, not bytes", "give the number of bytes"),
    ]
    for value, mistake, fix in mistakes:
        if near(kv_cache_bytes, value):
            fail(mistake, fix)
    more = "more" if kv_cache_bytes > right else "fewer"
    fail(f"kv_cache_bytes is {more} bytes than the cache takes", "multiply: 2 (keys, values) × layers × key/value "
         "heads × positions × d_k × 4 bytes")

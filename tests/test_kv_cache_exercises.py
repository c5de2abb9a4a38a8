"""The exercise self-checks of notebook 12 pass the right answers with one line that does not print the answer, and
name each planted mistake on their first line."""

import torch
import torch.nn.functional as F

from transformer_from_scratch import scaled_dot_product_attention
from transformer_from_scratch.checks.steps.kv_cache_exercises import (check_gqa_attention, check_kv_cache_gib,
                                                                       check_t_attention)
from mutants import Catalogue

# --- Exercise 1 · the GiB of Llama 2 13B's cache ----------------------------------------------------------------

GIB = 2 * 40 * 4_096 * 5_120 * 2 / 2**30


def gib(per_sequence, batch8=None):
    """The check's two arguments as one, so that a mistake is one value."""
    return (per_sequence, 8 * per_sequence if batch8 is None else batch8)


GIB_MUTANTS = [
    (gib(GIB / 2), "half the cache"),
    (gib(2 * GIB), "4 bytes a number"),
    (gib(2 * 40 * 4_096 * 5_120 * 2 / 1e9), "in GB"),
    (gib(GIB / 40), "one layer's cache"),
    (gib(8 * GIB, 8 * GIB), "counts the batch"),
    (gib(GIB, GIB), "one sequence's cache"),
    (gib(GIB, 4 * GIB), "not the cache of 8 sequences"),
    (gib(1.0), "not the float16 cache of one sequence"),
    (gib("3.125"), "not a number"),
]

# --- Exercise 2 · from which position attention dominates a cached step -------------------------------------

T_MUTANTS = [
    (9_600, "two matrices in the FFN"),
    (3_200, "leaves the FFN out"),
    (25_600, "counts the attention as 2·t·d"),
    (20_480_000, "factor of d"),
    (12_000, "costs less than the rest"),
    (20_000, "costs more than the rest"),
    (None, "not a number"),
]

# --- Exercise 3 · grouped-query attention -------------------------------------------------------------------------


def gqa_attention(q, keys, values, mask=None, *, tiled=False, no_mask=False, top_left=False, swapped=False,
                  unscaled=False, per_kv_head=False):
    group = q.shape[1] // keys.shape[1]
    if per_kv_head:
        return scaled_dot_product_attention(q[:, ::group], keys, values, mask)
    if tiled:
        keys, values = keys.repeat(1, group, 1, 1), values.repeat(1, group, 1, 1)
    else:
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    if swapped:
        keys, values = values, keys
    if no_mask:
        mask = None
    if top_left and mask is not None:
        mask = torch.ones_like(mask).tril()
    if unscaled:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=1.0)
    return scaled_dot_product_attention(q, keys, values, mask)


def variant(**kw):
    return lambda q, keys, values, mask=None: gqa_attention(q, keys, values, mask, **kw)


GQA_MUTANTS = [
    (variant(tiled=True), "interleaved"),
    (variant(per_kv_head=True), "one output per KV head"),
    (variant(no_mask=True), "the mask is not applied"),
    (variant(top_left=True), "top left"),
    (variant(swapped=True), "keys and values are swapped"),
    (variant(unscaled=True), "not scaled"),
]

ALL = [(lambda answer: check_kv_cache_gib(*answer), gib(GIB), GIB_MUTANTS),
       (check_t_attention, 12_800, T_MUTANTS),
       (check_gqa_attention, gqa_attention, GQA_MUTANTS)]
CASES = [(check, m, p, mutants) for check, _, mutants in ALL for m, p in mutants]


def test_the_right_answers_pass_with_one_line_that_keeps_the_answer(capsys):
    check_t_attention(2 * 1_600 + 1.5 * 6_400)  # a float is as right as an int
    for check, right, _ in ALL:
        check(right)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * (len(ALL) + 1), lines
    assert not any(answer in line for line in lines for answer in ("3.125", "12,800", "12800")), lines


def _the_principle_not_the_code(first: str) -> None:
    assert "repeat_interleave" not in first and "enable_gqa" not in first, first


# The random state: on the GQA check, the one that runs code.
CATALOGUES = [Catalogue(check, mutants, right=right if check is check_gqa_attention else None,
                        first_line=_the_principle_not_the_code) for check, right, mutants in ALL]

"""The exercise self-checks of notebook 14 pass the right answers with one line that does not print the answer, and
name each planted mistake on their first line."""

import pytest
import torch

from transformer_from_scratch.checks.steps.pretrained_exercises import (check_bits_per_weight, check_kv_cache_bytes,
                                                                        check_unpermute)
from mutants import assert_own_verdict, assert_phrases_distinct

# --- Exercise 1 · bits per weight --------------------------------------------------------------------------------

BITS = (8.5, 5.0)  # 34 bytes and 20 bytes per 32 weights, by hand
BITS_MUTANTS = [
    ((5.0, 8.5), "are swapped"),
    ((8.0, 5.0), "bits_q8_0 leaves out"),
    ((8.5, 4.0), "bits_q4_1 leaves out"),
    ((8.5 / 8, 5.0), "bits_q8_0 counts bytes"),
    ((8.5, 32), "float32's 32 bits"),
    ((8.5, 9.0), "a byte per 4-bit value"),
    ((8.5, 6.0), "not the bits of one block"),
    (("8.5", 5.0), "not a number"),
]

# --- Exercise 2 · undoing Hugging Face's permutation ------------------------------------------------------------


def right_unpermute(w, heads):
    return w.view(heads, 2, -1, w.shape[1]).transpose(1, 2).reshape(w.shape)


def permute_again(w, heads):  # Hugging Face's own direction (convert_llama_weights_to_hf)
    return w.view(heads, -1, 2, w.shape[1]).transpose(1, 2).reshape(w.shape)


def one_head(w, heads):
    return right_unpermute(w, 1)


def in_place(w, heads):
    w.copy_(right_unpermute(w.clone(), heads))
    return w


def flattened(w, heads):
    return right_unpermute(w, heads).flatten()


def reversed_rows(w, heads):
    return w.flip(0)


UNPERMUTE_MUTANTS = [
    (permute_again, "again instead of undoing"),
    (one_head, "as one head"),
    (in_place, "in place"),
    (flattened, "not a tensor of the input's shape"),
    (reversed_rows, "rows in the wrong places"),
]

# --- Exercise 3 · the KV cache's bytes ---------------------------------------------------------------------------

KV = 2 * 30 * 3 * 8192 * 64 * 4  # by hand: keys and values, layers, kv heads, positions, d_k, float32
KV_MUTANTS = [
    (3 * KV, "the 9 query heads"),
    (KV / 2, "half the cache"),
    (KV / 30, "one layer"),
    (KV / 2 ** 30, "in GiB"),
    (KV / 1e6, "in megabytes"),
    (1.5 * KV, "more bytes than"),
    (None, "not a number"),
]

ALL = [(lambda answer: check_bits_per_weight(*answer), BITS, BITS_MUTANTS),
       (check_unpermute, right_unpermute, UNPERMUTE_MUTANTS),
       (check_kv_cache_bytes, KV, KV_MUTANTS)]
CASES = [(check, m, p, mutants) for check, _, mutants in ALL for m, p in mutants]


def test_the_right_answers_pass_with_one_line_that_keeps_the_answer(capsys):
    check_kv_cache_bytes(377_487_360)
    for check, right, _ in ALL:
        check(right)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * (len(ALL) + 1), lines
    assert not any(answer in line for line in lines for answer in ["8.5", "5.0", "377", "transpose"]), lines


@pytest.mark.parametrize("check, mutant, phrase, mutants", CASES, ids=[f"{i}: {c[2]}" for i, c in enumerate(CASES)])
def test_each_mistake_is_named(check, mutant, phrase, mutants):
    assert_own_verdict(check, mutant, phrase, mutants)


def test_the_phrases_are_distinct():
    for _, _, mutants in ALL:
        assert_phrases_distinct(mutants)


def test_the_permutation_is_hugging_faces():
    """The check's row-by-row definition equals the view/transpose form of Hugging Face's converter."""
    from transformer_from_scratch.checks.steps.pretrained_exercises import _to_half_split
    w = torch.arange(9 * 64 * 2, dtype=torch.float64).reshape(9 * 64, 2)
    assert torch.equal(_to_half_split(w, 9), permute_again(w, 9))

"""The step checks of notebook 05 pass the right steps and name each planted mistake on their first line."""

import math

import pytest
import torch

from transformer_from_scratch import softmax
from transformer_from_scratch.checks.steps.attention import (check_attend, check_attend_masked,
                                                              check_attention_scores, check_masked_scores)
from mutants import Catalogue


def attention_scores(Q, K):
    return Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])


def attend(scores, V):
    return softmax(scores, dim=-1) @ V


def masked_scores(scores, mask):
    return scores.masked_fill(~mask, float("-inf"))


def attend_masked(scores, mask, V):
    no_key = ~mask.any(dim=-1, keepdim=True)
    return attend(masked_scores(scores, mask | no_key), V).masked_fill(no_key, 0.0)


def scores_with_einsum(Q, K):
    from einops import einsum
    return einsum(Q, K, "... n d, ... m d -> ... n m") / math.sqrt(Q.shape[-1])


def masked_with_where(scores, mask):
    return torch.where(mask, scores, float("-inf"))


def patched_after_the_softmax(scores, mask, V):
    """The NaN is made in the softmax and the weights patched after it: the masked_fill of Step 3 cuts the NaN off
    on its way back, so the output and the gradients are right (the contract holds)."""
    no_key = ~mask.any(dim=-1, keepdim=True)
    weights = softmax(masked_scores(scores, mask), dim=-1).masked_fill(no_key, 0.0)
    return weights @ V


def _in_place(scores, mask):
    return scores.masked_fill_(~mask, float("-inf"))


def _assigned(scores, mask):
    scores[~mask] = float("-inf")
    return scores


def _naive_softmax(scores, V):
    e = scores.exp()
    return e / e.sum(dim=-1, keepdim=True) @ V


def _no_key(mask):
    return ~mask.any(dim=-1, keepdim=True)


def _additive_then_patched(scores, mask, V):
    additive = torch.zeros(mask.shape, dtype=scores.dtype).masked_fill(~mask, float("-inf"))
    return softmax(scores + additive, dim=-1).masked_fill(_no_key(mask), 0.0) @ V


def _inverted_no_key(scores, mask, V):
    has_key = mask.any(dim=-1, keepdim=True)
    return attend(masked_scores(scores, mask | has_key), V).masked_fill(has_key, 0.0)


def _no_keepdim(scores, mask, V):
    no_key = ~mask.any(dim=-1)
    return attend(masked_scores(scores, mask | no_key[..., None]), V).masked_fill(no_key, 0.0)


SCORES_MUTANTS = [
    (lambda Q, K: Q @ K.transpose(-2, -1), "not scaled"),
    (lambda Q, K: Q @ K.transpose(-2, -1) / Q.shape[-1], "divided by d_k"),
    (lambda Q, K: Q @ K.transpose(-2, -1) * math.sqrt(Q.shape[-1]), "multiplied by √d_k"),
    (lambda Q, K: Q @ K.transpose(-2, -1) / math.sqrt(K.shape[-2]), "the number of keys"),
    (lambda Q, K: Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-2]), "the number of queries"),
    (lambda Q, K: Q @ K / math.sqrt(Q.shape[-1]), "K is not transposed"),
    (lambda Q, K: K @ Q.transpose(-2, -1) / math.sqrt(Q.shape[-1]), "transposed (K Qᵀ)"),
    (lambda Q, K: Q @ K.T / math.sqrt(Q.shape[-1]), "K.T is used on a batched K"),
]
ATTEND_MUTANTS = [
    (lambda s, V: softmax(s, dim=-2) @ V, "over the queries"),
    (lambda s, V: s @ V, "there is no softmax"),
    (lambda s, V: s.exp() @ V, "not divided by their sum"),
    (_naive_softmax, "exp overflows"),
    (lambda s, V: softmax(s, dim=-1).transpose(-2, -1) @ V, "the weights are transposed"),
    (lambda s, V: softmax(s, dim=-1), "returns the weights"),
]
MASK_MUTANTS = [
    (lambda s, mask: s.masked_fill(mask, float("-inf")), "polarity is inverted"),
    (lambda s, mask: s.masked_fill(~mask, 0.0), "become 0"),
    (lambda s, mask: s.masked_fill(~mask, -1e9), "large finite number (-1e9)"),
    (lambda s, mask: s.masked_fill(~mask, torch.finfo(s.dtype).min), "large finite number (finfo.min)"),
    (lambda s, mask: s.masked_fill(~mask, float("inf")), "+inf"),
    (lambda s, mask: s, "the mask is ignored"),
    (_in_place, "changed in place"),
]
MASK_ALSO = [(_assigned, "changed in place"), (lambda s, mask: s * mask, "multiplied by the mask")]
MASKED_MUTANTS = [
    (lambda s, mask, V: attend(masked_scores(s, mask), V), "give NaN"),
    (lambda s, mask, V: softmax(s.masked_fill(~mask, -1e9), dim=-1) @ V, "the mean of the values"),
    (lambda s, mask, V: attend(masked_scores(s, mask | _no_key(mask)), V), "with their own scores"),
    (lambda s, mask, V: attend(masked_scores(s, mask), V).nan_to_num(0.0), "V.grad has NaN"),
    (_additive_then_patched, "the scores' gradient has NaN"),
    (_inverted_no_key, "DO have an allowed key"),
    (_no_keepdim, "do not broadcast"),
]


def test_the_right_steps_pass_with_one_line(capsys):
    check_attention_scores(attention_scores)
    check_attend(attend)
    check_masked_scores(masked_scores)
    check_attend_masked(attend_masked)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * 4, lines


@pytest.mark.parametrize("right, check", [(scores_with_einsum, check_attention_scores),
                                          (masked_with_where, check_masked_scores),
                                          (patched_after_the_softmax, check_attend_masked)],
                         ids=["einsum", "torch.where", "patched after the softmax"])
def test_other_right_ways_pass(right, check, capsys):
    check(right)
    assert capsys.readouterr().out.startswith("✓ ")


CATALOGUES = [Catalogue(check_attention_scores, SCORES_MUTANTS, right=attention_scores),
              Catalogue(check_attend, ATTEND_MUTANTS, right=attend),
              Catalogue(check_masked_scores, MASK_MUTANTS, right=masked_scores),
              Catalogue(check_masked_scores, MASK_ALSO, exclusive=False, distinct="none"),
              Catalogue(check_attend_masked, MASKED_MUTANTS, right=attend_masked)]

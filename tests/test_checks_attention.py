"""check_scaled_dot_product_attention passes the reference and a second correct implementation, and names
each classic mistake, planted here as a small wrong attention function."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.functional import scaled_dot_product_attention as imported_sdpa

from transformer_from_scratch import scaled_dot_product_attention
from transformer_from_scratch.checks import check_scaled_dot_product_attention

NEG_INF = float("-inf")


def scores_of(Q, K):
    return Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])


def in_its_dtype(Q, K, V, mask=None):
    """matmul, torch.softmax, zero rows for queries with no key, all in the inputs' dtype: right in float32 and
    float64, but half precision rounds on the way."""
    scores = scores_of(Q, K)
    if mask is None:
        return torch.softmax(scores, dim=-1) @ V
    no_key = ~mask.any(dim=-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(~mask & ~no_key, NEG_INF), dim=-1)
    return weights.masked_fill(no_key, 0.0) @ V


def plain(Q, K, V, mask=None):
    """Correct, written differently from the package: in_its_dtype, with half precision computed in float32 and
    rounded once at the end."""
    half = Q.dtype in (torch.float16, torch.bfloat16)
    out = in_its_dtype(*(t.float() if half else t for t in (Q, K, V)), mask)
    return out.to(Q.dtype)


# --- the planted mistakes --------------------------------------------------------------------------------

def builtin(Q, K, V, mask=None):
    return F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)


def builtin_imported_by_name(Q, K, V, mask=None):
    return imported_sdpa(Q, K, V, attn_mask=mask)


def wrong_signature(q, k, v, mask=None):
    return plain(q, k, v, mask)


def no_scale(Q, K, V, mask=None):
    return plain(Q * math.sqrt(Q.shape[-1]), K, V, mask)  # undoes plain's 1/√d_k: softmax(Q Kᵀ) V


def divide_by_d_k(Q, K, V, mask=None):
    return plain(Q / math.sqrt(Q.shape[-1]), K, V, mask)  # Q Kᵀ / d_k


def scale_by_shape_1(Q, K, V, mask=None):
    return plain(Q * math.sqrt(Q.shape[-1] / Q.shape[1]), K, V, mask)  # Q Kᵀ / √Q.shape[1]


def softmax_over_queries(Q, K, V, mask=None):
    scores = scores_of(Q, K) if mask is None else scores_of(Q, K).masked_fill(~mask, NEG_INF)
    return torch.softmax(scores, dim=-2) @ V


def softmax_over_dim_1(Q, K, V, mask=None):
    return torch.softmax(scores_of(Q, K), dim=1) @ V  # the keys for 2-D inputs only


def k_dot_t(Q, K, V, mask=None):
    return torch.softmax(Q @ K.T / math.sqrt(Q.shape[-1]), dim=-1) @ V


def returns_weights(Q, K, V, mask=None):
    return torch.softmax(scores_of(Q, K), dim=-1)


def returns_float32(Q, K, V, mask=None):
    return plain(Q.float(), K.float(), V.float(), mask)


def half_not_cast_back(Q, K, V, mask=None):
    if Q.dtype in (torch.float16, torch.bfloat16):
        return plain(Q.float(), K.float(), V.float(), mask)
    return plain(Q, K, V, mask)


def mask_ignored(Q, K, V, mask=None):
    return plain(Q, K, V)


def mask_inverted(Q, K, V, mask=None):
    return plain(Q, K, V, None if mask is None else ~mask)


def masked_scores_zero(Q, K, V, mask=None):
    scores = scores_of(Q, K)
    if mask is not None:
        scores = scores.masked_fill(~mask, 0.0)
    return torch.softmax(scores, dim=-1) @ V


def weights_times_mask(Q, K, V, mask=None):
    weights = torch.softmax(scores_of(Q, K), dim=-1)
    return (weights if mask is None else weights * mask) @ V


def nan_for_fully_masked_rows(Q, K, V, mask=None):
    scores = scores_of(Q, K) if mask is None else scores_of(Q, K).masked_fill(~mask, NEG_INF)
    return torch.softmax(scores, dim=-1) @ V


def large_finite_fill(Q, K, V, mask=None):
    scores = scores_of(Q, K) if mask is None else scores_of(Q, K).masked_fill(~mask, -1e9)
    return torch.softmax(scores, dim=-1) @ V


def fully_masked_rows_attend_everywhere(Q, K, V, mask=None):
    return plain(Q, K, V, None if mask is None else mask | ~mask.any(dim=-1, keepdim=True))


def additive_mask_zeroed_after(Q, K, V, mask=None):
    """Zeros for the empty rows in the forward pass, but the NaN is created, and flows back to Q and K."""
    if mask is None:
        return plain(Q, K, V)
    additive = torch.zeros(mask.shape, dtype=Q.dtype).masked_fill(~mask, NEG_INF)
    weights = torch.softmax(scores_of(Q, K) + additive, dim=-1)
    return weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0) @ V


def no_max_subtracted(Q, K, V, mask=None):
    scores = scores_of(Q, K) if mask is None else scores_of(Q, K).masked_fill(~mask, NEG_INF)
    exps = torch.exp(scores)
    weights = exps / exps.sum(dim=-1, keepdim=True)
    return weights.nan_to_num(0.0) @ V  # even with the empty rows patched, exp(large) = inf gives inf/inf


def detached_keys(Q, K, V, mask=None):
    return plain(Q, K.detach(), V, mask)


def stub(Q, K, V, mask=None):
    # YOUR CODE HERE
    raise NotImplementedError()


MUTANTS = [
    (builtin, "calls PyTorch's own F.scaled_dot_product_attention"),
    (builtin_imported_by_name, "calls PyTorch's own F.scaled_dot_product_attention"),
    (wrong_signature, "signature is (q, k, v, mask)"),
    (no_scale, "scores are not scaled"),
    (divide_by_d_k, "divides the scores by d_k instead of √d_k"),
    (scale_by_shape_1, "scales by √Q.shape[1]"),
    (softmax_over_queries, "softmax runs over the queries"),
    (softmax_over_dim_1, "softmax runs over the queries"),  # on 3-D inputs, dim=1 *is* the queries
    (k_dot_t, "it uses K.T, which reverses ALL dimensions"),
    (returns_weights, "returns the attention weights"),
    (returns_float32, "returned torch.float32 for torch.float64 inputs"),
    (half_not_cast_back, "returned torch.float32 for torch.float16 inputs"),
    (mask_ignored, "the mask is ignored"),
    (mask_inverted, "polarity is inverted"),
    (masked_scores_zero, "masked scores are set to 0 instead of -inf"),
    (weights_times_mask, "multiplies the weights by the mask after the softmax"),
    (nan_for_fully_masked_rows, "give NaN"),
    (large_finite_fill, "return the mean of the values"),
    (fully_masked_rows_attend_everywhere, "attend to every key"),
    (additive_mask_zeroed_after, "Q.grad has NaN when a query may attend to nothing"),
    (no_max_subtracted, "exp overflows"),
    (in_its_dtype, "the work is done in bfloat16"),
    (detached_keys, "no gradient reaches K"),
]


@pytest.mark.parametrize("impl", [scaled_dot_product_attention, plain], ids=["package", "plain"])
def test_a_correct_function_passes_with_one_line(impl, capsys):
    assert check_scaled_dot_product_attention(impl) is None
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("✓ scaled_dot_product_attention")


@pytest.mark.filterwarnings("ignore:The use of `x.T`")  # k_dot_t: torch warns, once per process
@pytest.mark.parametrize("impl, phrase", MUTANTS, ids=[impl.__name__ for impl, _ in MUTANTS])
def test_each_mistake_is_named_on_the_first_line(impl, phrase, capsys):
    with pytest.raises(AssertionError) as error:
        check_scaled_dot_product_attention(impl)
    assert phrase in str(error.value).splitlines()[0]
    assert capsys.readouterr().out == ""  # no "✓" line when it fails


def test_phrases_are_distinct_per_mistake():
    """Each named mistake has its own message (the two built-in and two dim=1/-2 spellings share theirs)."""
    phrases = [phrase for _, phrase in MUTANTS]
    assert len(set(phrases)) == len(phrases) - 2


def test_the_builtin_is_restored_even_when_the_check_fails():
    original = torch.nn.functional.scaled_dot_product_attention
    with pytest.raises(AssertionError):
        check_scaled_dot_product_attention(builtin)
    with pytest.raises(AssertionError):
        check_scaled_dot_product_attention(stub)
    assert F.scaled_dot_product_attention is original
    assert torch._C._nn.scaled_dot_product_attention is original


def test_a_learner_that_catches_every_exception_is_still_caught_using_the_builtin():
    def careful(Q, K, V, mask=None):
        try:
            return F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)
        except Exception:  # noqa: BLE001 - the learner's fallback must not hide the built-in
            return plain(Q, K, V, mask)

    with pytest.raises(AssertionError, match="calls PyTorch's own F.scaled_dot_product_attention"):
        check_scaled_dot_product_attention(careful)

"""scaled_dot_product_attention (notebook 05) against F.scaled_dot_product_attention, hand-computed cases,
masking (exact zeros, broadcasting, polarity, fully masked rows), gradients, half precision and bad input."""

import math
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES, FLOAT_DTYPES, LEADING_SHAPES

from transformer_from_scratch import scaled_dot_product_attention
from transformer_from_scratch.checks.attention import rounding_steps

N, M, D_K, D_V = 5, 7, 8, 3  # n != m and d_v != d_k, so a swapped axis cannot go unnoticed
HALF_DTYPES = [pytest.param(torch.float16, id="float16"), pytest.param(torch.bfloat16, id="bfloat16")]


def random_qkv(leading=(), n=N, m=M, d_k=D_K, d_v=D_V, device="cpu", dtype=torch.float32, seed=0):
    """Q (..., n, d_k), K (..., m, d_k), V (..., m, d_v), drawn on the CPU from a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(n, d_k), (m, d_k), (m, d_v)]
    return tuple(torch.randn(*leading, *shape, generator=gen, dtype=dtype).to(device) for shape in shapes)


def make_mask(kind, leading, n=N, m=M):
    """None, one random mask per batch element, one (n, m) mask for all, or size-1 leading dimensions."""
    gen = torch.Generator().manual_seed(1)
    if kind == "none":
        return None
    if kind == "per-element":
        return torch.rand(*leading, n, m, generator=gen) < 0.6
    if kind == "shared":
        return torch.tril(torch.ones(n, m, dtype=torch.bool))
    return torch.rand(*(1 for _ in leading), n, m, generator=gen) < 0.6  # "size-1"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("leading", LEADING_SHAPES, ids=str)
@pytest.mark.parametrize("mask_kind", ["none", "per-element", "shared", "size-1"])
def test_matches_torch_sdpa(device, dtype, leading, mask_kind):
    Q, K, V = random_qkv(leading, device=device, dtype=dtype)
    mask = make_mask(mask_kind, leading)
    mask = None if mask is None else mask.to(device)
    out = scaled_dot_product_attention(Q, K, V, mask)
    assert out.shape == (*leading, N, D_V) and out.dtype == dtype and out.device.type == device
    torch.testing.assert_close(out, F.scaled_dot_product_attention(Q, K, V, attn_mask=mask))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_explicit_causal_mask_matches_is_causal(device, dtype):
    Q, K, V = random_qkv((2, 4), n=6, m=6, device=device, dtype=dtype)
    causal = torch.tril(torch.ones(6, 6, dtype=torch.bool, device=device))
    torch.testing.assert_close(
        scaled_dot_product_attention(Q, K, V, causal), F.scaled_dot_product_attention(Q, K, V, is_causal=True)
    )


def test_hand_computed_worked_example():
    # q·k = 4, 2, 0; divided by √4: scores 2, 1, 0; weights e² : e : 1.
    q = torch.tensor([[1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    K = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    V = torch.tensor([[10.0, 0.0], [0.0, 10.0], [0.0, 0.0]], dtype=torch.float64)
    total = math.e**2 + math.e + 1
    expected = torch.tensor([[10 * math.e**2 / total, 10 * math.e / total]], dtype=torch.float64)  # (6.652, 2.447)
    torch.testing.assert_close(scaled_dot_product_attention(q, K, V), expected)


def test_equal_keys_give_the_mean_of_the_values_for_any_query():
    V = torch.tensor([[2.0, 4.0], [6.0, 0.0], [1.0, 5.0]])
    K = torch.tensor([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]])
    Q = torch.tensor([[3.0, -1.0], [-7.0, 0.5], [0.0, 0.0]])
    torch.testing.assert_close(scaled_dot_product_attention(Q, K, V), torch.full((3, 2), 3.0))


def test_two_equally_similar_keys_and_a_blocked_one_give_their_average():
    q = torch.tensor([[1.0, 0.0]])
    K = torch.tensor([[2.0, 0.0], [2.0, 5.0], [9.0, 0.0]])  # q·k = 2, 2, 9: key 3 would win, but it is blocked
    V = torch.tensor([[2.0, 4.0], [6.0, 0.0], [100.0, 100.0]])
    mask = torch.tensor([[True, True, False]])
    assert scaled_dot_product_attention(q, K, V, mask).tolist() == [[4.0, 2.0]]


def test_a_mask_allowing_one_key_returns_exactly_its_value():
    Q, K, V = random_qkv()
    mask = torch.zeros(N, M, dtype=torch.bool)
    allowed = torch.tensor([3, 0, 6, 6, 1])  # query i may attend to key allowed[i] only
    mask[torch.arange(N), allowed] = True
    assert torch.equal(scaled_dot_product_attention(Q, K, V, mask), V[allowed])


@pytest.mark.parametrize("device", DEVICES)
def test_masked_keys_get_probability_exactly_zero(device):
    Q, K, _ = random_qkv((2, 3), device=device)
    mask = make_mask("per-element", (2, 3)).to(device)
    mask[..., 0] = True  # every query may attend to at least one key
    weights = scaled_dot_product_attention(Q, K, torch.eye(M, device=device).expand(2, 3, M, M), mask)  # V = I
    assert (weights[~mask] == 0).all()
    assert (weights[mask] > 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, N, device=device))


def test_masked_keys_and_values_do_not_change_the_output():
    Q, K, V = random_qkv((2,))
    mask = torch.ones(N, M, dtype=torch.bool)
    mask[:, 4] = False  # no query may see key 4
    before = scaled_dot_product_attention(Q, K, V, mask)
    K[:, 4], V[:, 4] = 1e4, -1e4  # huge, so any leak would show
    assert torch.equal(scaled_dot_product_attention(Q, K, V, mask), before)
    K[:, 3] = 1e4  # guard: the same change to a key the queries may see does change the output
    assert not torch.equal(scaled_dot_product_attention(Q, K, V, mask), before)


def test_causal_mask_does_not_leak_the_future_and_the_inverted_one_does():
    Q, K, V = random_qkv(n=6, m=6)
    causal = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    for mask, leaks in [(causal, False), (~causal, True)]:
        before = scaled_dot_product_attention(Q, K, V, mask)
        K2, V2 = K.clone(), V.clone()
        K2[-1], V2[-1] = 3.0, 3.0  # change the last token only
        after = scaled_dot_product_attention(Q, K2, V2, mask)
        assert torch.equal(before[:-1], after[:-1]) is not leaks


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_fully_masked_rows_give_zeros_finite_gradients_and_match_torch(device, dtype):
    Q, K, V = (t.requires_grad_() for t in random_qkv((2, 3), n=4, m=4, device=device, dtype=dtype))
    mask = torch.tril(torch.ones(2, 3, 4, 4, dtype=torch.bool))
    mask[0, 1, 0] = False  # query 0 of one head in one sequence may attend to nothing
    mask[1, :, 2] = False  # query 2 of every head of another
    mask = mask.to(device)
    no_key = ~mask.any(-1)
    out = scaled_dot_product_attention(Q, K, V, mask)
    assert (out[no_key] == 0).all() and torch.isfinite(out).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(Q, K, V, attn_mask=mask))
    out.sum().backward()  # the loss includes the zero rows
    assert all(torch.isfinite(t.grad).all() for t in (Q, K, V))
    assert (Q.grad[no_key] == 0).all()  # a query that sees nothing has no influence and gets no gradient
    # Every other row is exactly what it would be with those rows' mask set to all True.
    reference = scaled_dot_product_attention(Q, K, V, mask | no_key[..., None])
    assert torch.equal(out[~no_key], reference[~no_key])


def test_a_fully_masked_row_creates_no_nan_even_inside_the_backward_pass():
    """Zeroing a NaN row after the softmax would give the same outputs and gradients here, but the NaN would
    still flow through the softmax's backward pass (and out of it, with an additively applied mask).
    Anomaly detection raises on any backward step that returns NaN."""
    Q, K, V = (t.requires_grad_() for t in random_qkv(n=4, m=4, dtype=torch.float64))
    mask = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    mask[0] = False
    with pytest.warns(UserWarning, match="Anomaly Detection"), torch.autograd.detect_anomaly(check_nan=True):
        scaled_dot_product_attention(Q, K, V, mask).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (Q, K, V))


def test_no_keys_at_all_gives_zeros():
    Q, K, V = random_qkv(n=3, m=0)
    out = scaled_dot_product_attention(Q, K, V)
    assert out.shape == (3, D_V) and (out == 0).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(Q, K, V))


@pytest.mark.parametrize("mask_kind", ["none", "shared", "fully-masked-row"])
def test_gradcheck_q_k_and_v(mask_kind):
    Q, K, V = (t.requires_grad_() for t in random_qkv((2, 3), n=4, m=4, d_k=3, d_v=2, dtype=torch.float64))
    mask = None if mask_kind == "none" else torch.tril(torch.ones(4, 4, dtype=torch.bool))
    if mask_kind == "fully-masked-row":
        mask[1] = False
    assert torch.autograd.gradcheck(lambda q, k, v: scaled_dot_product_attention(q, k, v, mask), (Q, K, V))


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_precision_keeps_the_dtype_and_is_close_to_float32(dtype):
    Q, K, V = random_qkv((2,))
    mask = make_mask("shared", (2,))
    out = scaled_dot_product_attention(Q.to(dtype), K.to(dtype), V.to(dtype), mask)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), scaled_dot_product_attention(Q, K, V, mask), rtol=0.05, atol=0.05)


def test_runs_on_the_inputs_device():
    Q, K, V = (torch.empty(2, n, d, device="meta") for n, d in [(N, D_K), (M, D_K), (M, D_V)])
    out = scaled_dot_product_attention(Q, K, V, torch.empty(N, M, dtype=torch.bool, device="meta"))
    assert out.device.type == "meta" and out.shape == (2, N, D_V)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64], ids=str)
def test_a_non_bool_mask_is_refused_and_explained(dtype):
    Q, K, V = random_qkv()
    mask = torch.ones(N, M, dtype=dtype)
    with pytest.raises(TypeError, match=rf"mask must be a bool tensor.*got dtype {dtype}"):
        scaled_dot_product_attention(Q, K, V, mask)
    if dtype.is_floating_point:
        with pytest.raises(TypeError, match=r"\*adds\* a float mask to the scores"):
            scaled_dot_product_attention(Q, K, V, mask)


@pytest.mark.parametrize(
    "shapes, culprit, actual",
    [
        ([(5, 8), (7, 6), (7, 3)], "K", "f32[7,6]"),                      # d_k differs between Q and K
        ([(5, 8), (7, 8), (6, 3)], "V", "f32[6,3]"),                      # m differs between K and V
        ([(2, 5, 8), (1, 7, 8), (1, 7, 3)], "K", "f32[1,7,8]"),           # no broadcasting between Q and K
        ([(5, 8), (2, 7, 8), (2, 7, 3)], "K", "f32[2,7,8]"),              # K has a batch dim Q lacks
        ([(2, 5, 8), (2, 7, 8), (3, 7, 3)], "V", "f32[3,7,3]"),           # V's batch differs
        ([(8,), (7, 8), (7, 3)], "Q", "f32[8]"),                          # Q needs (..., n, d_k)
    ],
    ids=["d_k", "m", "Q-K-batch", "K-extra-dim", "V-batch", "Q-1d"],
)
def test_inconsistent_shapes_name_the_argument_and_its_shape(shapes, culprit, actual):
    Q, K, V = (torch.randn(*shape) for shape in shapes)
    with pytest.raises(TypeError, match=rf"(?s)parameter '{culprit}'.*Actual value: {re.escape(actual)}"):
        scaled_dot_product_attention(Q, K, V)


@pytest.mark.parametrize(
    "mask_shape",
    [(N, M + 1), (M, N), (3, N, M), (4, 2, N, M), (1, 2, 4, N, M)],
    ids=["wrong-m", "transposed", "batch-3-vs-2", "batch-2-vs-4", "more-dims-than-Q"],
)
def test_a_mask_of_the_wrong_shape_is_refused(mask_shape):
    Q, K, V = random_qkv((2, 4))  # Q (2, 4, 5, 8)
    with pytest.raises(TypeError, match=r"(?s)parameter 'mask'.*Actual value: bool\["):
        scaled_dot_product_attention(Q, K, V, torch.ones(mask_shape, dtype=torch.bool))


def test_integer_inputs_are_refused():
    Q, K, V = random_qkv()
    with pytest.raises(TypeError, match=r"parameter 'Q'"):
        scaled_dot_product_attention(Q.long(), K, V)


def test_attention_computes_half_precision_in_float32():
    """The course's attention rounds once, at the end: every output of bfloat16 inputs with sharp scores is within
    one rounding step of the exact answer (computed in bfloat16 throughout, some are dozens of steps off)."""
    gen = torch.Generator().manual_seed(0)
    Q, K, V = (scale * torch.randn(2, 9, 64, generator=gen) for scale in (3, 3, 1))
    Q, K, V = Q.bfloat16(), K.bfloat16(), V.bfloat16()
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    exact = torch.nn.functional.scaled_dot_product_attention(Q.double(), K.double(), V.double(), attn_mask=causal)
    assert rounding_steps(scaled_dot_product_attention(Q, K, V, causal), exact) <= 1.5

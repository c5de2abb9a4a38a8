"""softmax (notebook 03) against torch.softmax, hand-computed cases, extreme and masked inputs, half
precision, gradients and its errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES, FLOAT_DTYPES, LEADING_SHAPES

from transformer_from_scratch import softmax

HALF_DTYPES = [pytest.param(torch.float16, id="float16"), pytest.param(torch.bfloat16, id="bfloat16")]
NEG_INF = float("-inf")


def assert_is_distribution(p: torch.Tensor, dim: int) -> None:
    """Finite, non-negative, and every slice along dim sums to 1 (in float64, to the dtype's precision)."""
    assert torch.isfinite(p).all() and (p >= 0).all()
    sums = p.double().sum(dim=dim)
    torch.testing.assert_close(sums, torch.ones_like(sums), rtol=0, atol=p.shape[dim] * torch.finfo(p.dtype).eps)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("leading", LEADING_SHAPES, ids=str)
def test_matches_torch_softmax_on_every_dim(device, dtype, leading):
    torch.manual_seed(0)
    x = (3 * torch.randn(*leading, 5, dtype=dtype)).to(device)
    for dim in range(-x.ndim, x.ndim):  # every dimension, counted from the front and from the back
        p = softmax(x, dim)
        assert p.shape == x.shape and p.dtype == dtype and p.device.type == device
        torch.testing.assert_close(p, torch.softmax(x, dim=dim))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize(
    "scale, offset",
    [(1000.0, 0.0), (1.0, 1000.0), (1.0, -1000.0), (1e-6, 0.0), (100.0, -5000.0)],
    ids=["large-spread", "all-large", "all-very-negative", "tiny-spread", "mixed"],
)
def test_extreme_inputs_match_torch_and_stay_finite(device, dtype, scale, offset):
    torch.manual_seed(1)
    x = (scale * torch.randn(4, 9, dtype=dtype) + offset).to(device)
    for dim in (0, -1):
        p = softmax(x, dim)
        assert_is_distribution(p, dim)
        torch.testing.assert_close(p, torch.softmax(x, dim=dim))


def test_naive_formula_would_fail_on_these_inputs():
    """Guards the test above: without the max subtraction these inputs give NaN (overflow) and 0/0 (underflow)."""
    big, very_negative = torch.tensor([1000.0, 999.0]), torch.tensor([-1000.0, -1001.0])
    assert torch.isnan(big.exp() / big.exp().sum()).all()
    assert torch.isnan(very_negative.exp() / very_negative.exp().sum()).all()
    expected = [1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))]  # [0.7311, 0.2689]
    torch.testing.assert_close(softmax(big, 0), torch.tensor(expected))
    torch.testing.assert_close(softmax(very_negative, 0), torch.tensor(expected))


def test_hand_computed():
    ln = math.log
    # e^0 : e^ln3 = 1 : 3
    torch.testing.assert_close(softmax(torch.tensor([0.0, ln(3)]), 0), torch.tensor([0.25, 0.75]))
    # 1 : 2 : 5 out of 8
    torch.testing.assert_close(softmax(torch.tensor([0.0, ln(2), ln(5)]), -1), torch.tensor([1 / 8, 2 / 8, 5 / 8]))
    # equal logits: uniform, whatever their size
    assert softmax(torch.full((4,), 123.0), 0).tolist() == [0.25] * 4
    # a matrix along columns (dim=0) and along rows (dim=1)
    m = torch.tensor([[0.0, 0.0], [ln(3), ln(4)]])
    torch.testing.assert_close(softmax(m, 0), torch.tensor([[1 / 4, 1 / 5], [3 / 4, 4 / 5]]))
    torch.testing.assert_close(softmax(m, 1), torch.tensor([[1 / 2, 1 / 2], [3 / 7, 4 / 7]]))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_shift_invariance(dtype):
    torch.manual_seed(2)
    x = torch.randn(3, 6, dtype=dtype)
    per_row = torch.tensor([[-50.0], [0.5], [80.0]], dtype=dtype)  # a different constant for every slice
    for shifted in (x + 30.0, x - 30.0, x + per_row):
        torch.testing.assert_close(softmax(shifted, -1), softmax(x, -1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_neg_inf_entries_get_exactly_zero(device, dtype):
    x = torch.tensor([[0.0, NEG_INF, math.log(3)], [NEG_INF, 2.0, NEG_INF]], dtype=dtype).to(device)
    p = softmax(x, -1)
    assert (p[torch.isneginf(x)] == 0).all()
    torch.testing.assert_close(p.cpu(), torch.tensor([[0.25, 0.0, 0.75], [0.0, 1.0, 0.0]], dtype=dtype))
    torch.testing.assert_close(p, torch.softmax(x, dim=-1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_all_neg_inf_slice_is_nan_like_torch(device, dtype):
    x = torch.tensor([[1.0, 2.0, 3.0], [NEG_INF, NEG_INF, NEG_INF]], dtype=dtype).to(device)
    p = softmax(x, -1)
    assert torch.isnan(p[1]).all(), "an all -inf slice has no distribution: NaN, not an invented one"
    assert torch.isfinite(p[0]).all()
    torch.testing.assert_close(p, torch.softmax(x, dim=-1), equal_nan=True)
    # along the other dim every column has a finite entry, so nothing is NaN
    assert torch.isfinite(softmax(x, 0)).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_precision_keeps_dtype_and_matches_torch(device, dtype):
    torch.manual_seed(3)
    x = (8 * torch.randn(2, 5, 33)).to(dtype).to(device)
    for dim in (0, 1, -1):
        p = softmax(x, dim)
        assert p.dtype == dtype and p.shape == x.shape
        torch.testing.assert_close(p, torch.softmax(x, dim=dim))  # dtype-aware default tolerances
        exact = torch.softmax(x.double(), dim=dim)
        torch.testing.assert_close(p.double(), exact, rtol=torch.finfo(dtype).eps, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
def test_float16_is_computed_in_float32(device):
    """70,000 equal logits: the sum of their exponentials is 70,000, beyond float16's largest value 65,504.
    Summed in float16 it is inf and every probability would be 0; computed in float32 each is 1/70,000."""
    p = softmax(torch.zeros(70_000, dtype=torch.float16, device=device), 0)
    assert p.dtype == torch.float16
    torch.testing.assert_close(p.float(), torch.full_like(p, 1 / 70_000, dtype=torch.float32), rtol=2e-3, atol=0)


def test_empty_dimension_gives_empty_result_like_torch():
    for shape, dim in [((3, 0), -1), ((0, 4), -1), ((0, 4), 0), ((2, 0, 3), 1), ((0,), 0)]:
        x = torch.empty(shape)
        assert softmax(x, dim).shape == torch.softmax(x, dim=dim).shape == shape


def test_input_is_not_modified():
    x = torch.tensor([[1.0, 5.0, -2.0]])
    before = x.clone()
    softmax(x, -1)
    assert torch.equal(x, before)


@pytest.mark.parametrize("shape, dim", [((2, 3), 2), ((2, 3), -3), ((4,), 1), ((2, 3, 4), 5)])
def test_bad_dim_names_dim_and_ndim(shape, dim):
    with pytest.raises(IndexError, match=rf"dim={dim} is out of range for x with x.ndim={len(shape)}"):
        softmax(torch.randn(shape), dim)


@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("value", [3.0, -1000.0, float("-inf")], ids=["3", "-1000", "-inf"])
def test_zero_dim_tensor_is_one_score_like_torch(value, dim):
    """A 0-d tensor is a single score: torch.softmax takes dim 0 or -1 and gives 1 (NaN for -inf, 0/0)."""
    x = torch.tensor(value, dtype=torch.float64, requires_grad=True)
    p = softmax(x, dim)
    expected = torch.softmax(x, dim=dim)
    assert p.shape == () and p.dtype == torch.float64
    torch.testing.assert_close(p, expected, equal_nan=True)
    if value != float("-inf"):
        assert p.item() == 1.0
        p.backward()
        assert x.grad.item() == 0.0  # 1 whatever the score: no gradient


@pytest.mark.parametrize("dim", [1, -2, 5])
def test_zero_dim_tensor_other_dims_are_out_of_range_like_torch(dim):
    x = torch.tensor(3.0)
    with pytest.raises(IndexError):
        torch.softmax(x, dim=dim)
    message = rf"dim={dim} is out of range for x with x.ndim=0 .*\(expected -1 <= dim <= 0\)"
    with pytest.raises(IndexError, match=message):
        softmax(x, dim)


@pytest.mark.parametrize(
    "bad", [torch.ones(2, 4, dtype=torch.long), torch.ones(3, dtype=torch.bool), [1.0, 2.0]],
    ids=["int", "bool", "list"],
)
def test_non_float_input_is_refused(bad):
    with pytest.raises(TypeError):
        softmax(bad, -1)


def test_does_not_call_torch_softmax(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("softmax must not call the built-in it teaches")

    for owner, name in [(torch, "softmax"), (F, "softmax"), (torch.Tensor, "softmax"), (torch.special, "softmax")]:
        monkeypatch.setattr(owner, name, forbidden)
    softmax(torch.randn(3, 4), -1)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gradcheck(dim):
    torch.manual_seed(4)
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: softmax(t, dim), (x,))
    assert torch.autograd.gradgradcheck(lambda t: softmax(t, dim), (x,))


def test_jacobian_is_diag_p_minus_p_p_transpose():
    x = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)
    p = softmax(x, 0)
    jacobian = torch.autograd.functional.jacobian(lambda t: softmax(t, 0), x)
    torch.testing.assert_close(jacobian, torch.diag(p) - torch.outer(p, p))
    zeros = torch.zeros(4, dtype=torch.float64)
    # each row sums to 0, J·1 = 0: adding the same amount to every logit changes nothing (shift invariance)
    torch.testing.assert_close(jacobian.sum(dim=1), zeros)
    # each column sums to 0 too, 1ᵀJ = 0: the probabilities always add up to 1
    torch.testing.assert_close(jacobian.sum(dim=0), zeros)


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_with_masked_entries_matches_torch(device):
    x = torch.tensor([[0.3, NEG_INF, 1.2, -0.4], [NEG_INF, 2.0, 0.1, NEG_INF]], dtype=torch.float64).to(device)
    upstream = torch.tensor([[1.0, 2.0, -1.0, 0.5], [0.3, -0.7, 1.1, 4.0]], dtype=torch.float64).to(device)
    ours = x.clone().requires_grad_(True)
    theirs = x.clone().requires_grad_(True)
    (softmax(ours, -1) * upstream).sum().backward()
    (torch.softmax(theirs, dim=-1) * upstream).sum().backward()
    assert torch.isfinite(ours.grad).all() and (ours.grad[torch.isneginf(x)] == 0).all()
    torch.testing.assert_close(ours.grad, theirs.grad)

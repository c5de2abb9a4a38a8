"""RMSNorm (notebook 04) against F.rms_norm and nn.RMSNorm, its dtype handling, hand-computed cases,
scale invariance, eps, its parameter and its errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES, FLOAT_DTYPES, LEADING_SHAPES
from torch.func import functional_call

from transformer_from_scratch import RMSNorm

HALF_DTYPES = [pytest.param(torch.float16, id="float16"), pytest.param(torch.bfloat16, id="bfloat16")]
ALL_FLOAT_DTYPES = HALF_DTYPES + FLOAT_DTYPES


def random_gain(d_model, dtype=torch.float32):
    """A gain far from the initial ones, so that a dropped or misapplied gain shows."""
    return torch.rand(d_model, dtype=dtype) + 0.5


def float64_reference(x, weight, eps=1e-5):
    """RMSNorm computed in float64 by PyTorch, from the exact values of x and weight."""
    return F.rms_norm(x.double(), (x.shape[-1],), weight.double(), eps=eps)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("leading", LEADING_SHAPES, ids=str)
def test_matches_f_rms_norm(device, dtype, leading):
    torch.manual_seed(0)
    norm = RMSNorm(16, device=device, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(random_gain(16, dtype))
    x = torch.randn(*leading, 16, device=device, dtype=dtype) * 3
    y = norm(x)
    assert y.shape == (*leading, 16) and y.dtype == dtype and y.device.type == device
    torch.testing.assert_close(y, F.rms_norm(x, (16,), norm.weight, eps=1e-5))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_matches_nn_rmsnorm_with_its_state_dict(device, dtype, eps):
    torch.manual_seed(0)
    reference = torch.nn.RMSNorm(12, eps=eps, device=device, dtype=dtype)
    with torch.no_grad():
        reference.weight.copy_(random_gain(12, dtype))
    norm = RMSNorm(12, eps=eps, device=device, dtype=dtype)
    norm.load_state_dict(reference.state_dict(), strict=True)
    x = torch.randn(3, 5, 12, device=device, dtype=dtype) * 0.1  # small enough for eps = 1e-2 to matter
    torch.testing.assert_close(norm(x), reference(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("leading", [(), (7,), (2, 3)], ids=str)
def test_half_precision_matches_float64_to_the_dtypes_precision(device, dtype, leading):
    torch.manual_seed(0)
    x = (torch.randn(*leading, 32) * 4).to(dtype)
    gain = random_gain(32).to(dtype)
    norm = RMSNorm(32, device=device, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(gain)
    y = norm(x.to(device))
    assert y.dtype == dtype
    # An upcast computation is off by the final rounding only: half an ulp, 2^-11 or 2^-8 relative.
    rtol = 2**-10 if dtype == torch.float16 else 2**-7
    torch.testing.assert_close(y.cpu().double(), float64_reference(x, gain), rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_FLOAT_DTYPES)
def test_output_dtype_is_the_input_dtype(device, dtype):
    norm = RMSNorm(8, device=device)  # a float32 gain, whatever the input
    assert norm(torch.randn(3, 8).to(device=device, dtype=dtype)).dtype == dtype


def test_float64_is_computed_in_float64():
    # 1 + 1e-12 is exact enough in float64 but rounds to 1 in float32: a downcast would lose it.
    x = torch.tensor([1.0 + 1e-12, 1.0], dtype=torch.float64)
    y = RMSNorm(2, eps=0.0, dtype=torch.float64)(x)
    rms = math.sqrt(((1.0 + 1e-12) ** 2 + 1.0) / 2)
    assert y.dtype == torch.float64
    assert y[0].item() - y[1].item() == pytest.approx(1e-12 / rms, rel=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_float16_activations_that_overflow_when_squared(device):
    torch.manual_seed(0)
    x = (torch.randn(4, 64) * 300).half()
    assert x.pow(2).isinf().any()  # the premise: a naive float16 computation overflows here
    y = RMSNorm(64, device=device)(x.to(device))
    assert y.dtype == torch.float16 and y.isfinite().all()
    torch.testing.assert_close(y.cpu().double(), float64_reference(x, torch.ones(64)), rtol=2**-10, atol=1e-6)
    assert y.float().pow(2).mean(dim=-1).sqrt().cpu().tolist() == pytest.approx([1.0] * 4, abs=2e-3)


def test_hand_computed():
    # (3, 4): mean square (9 + 16) / 2 = 12.5, RMS = sqrt(12.5) = 2.5 * sqrt(2)
    norm = RMSNorm(2, eps=0.0)
    assert norm(torch.tensor([3.0, 4.0])).tolist() == pytest.approx([0.6 * math.sqrt(2), 0.8 * math.sqrt(2)])
    # (1, 1, 3, 5): mean square (1 + 1 + 9 + 25) / 4 = 9, RMS 3; times the gain (3, 3, 1, 0.6) -> ones
    norm = RMSNorm(4, eps=0.0)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([3.0, 3.0, 1.0, 0.6]))
    rows = torch.tensor([[1.0, 1.0, 3.0, 5.0], [2.0, 2.0, 2.0, 2.0]])
    assert norm(rows).tolist() == [pytest.approx([1.0, 1.0, 1.0, 1.0]), pytest.approx([3.0, 3.0, 1.0, 0.6])]


def test_eps_is_added_under_the_root():
    # (3, 4) with eps = 3.5: sqrt(12.5 + 3.5) = 4, so the output is (0.75, 1)
    assert RMSNorm(2, eps=3.5)(torch.tensor([3.0, 4.0])).tolist() == pytest.approx([0.75, 1.0])


def test_each_vector_is_normalised_on_its_own():
    torch.manual_seed(0)
    norm = RMSNorm(6, eps=0.0)  # exact scale invariance, so a rescaled vector must give the same output
    x = torch.randn(3, 4, 6)
    changed = x.clone()
    changed[1, 2] *= 100.0
    changed[0, 0] = torch.randn(6)
    y, y_changed = norm(x), norm(changed)
    torch.testing.assert_close(y_changed[1, 2], y[1, 2])
    untouched = torch.ones(3, 4, dtype=torch.bool)
    untouched[0, 0] = False
    torch.testing.assert_close(y_changed[untouched], y[untouched])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_output_rms_is_one_with_the_initial_gain(dtype):
    torch.manual_seed(0)
    y = RMSNorm(64, dtype=dtype)(torch.randn(5, 7, 64, dtype=dtype) * 20)
    torch.testing.assert_close(y.pow(2).mean(dim=-1).sqrt(), torch.ones(5, 7, dtype=dtype))


@pytest.mark.parametrize("factor", [1e-3, 0.5, 7.0, 1e4])
def test_scale_invariance(factor):
    torch.manual_seed(0)
    x = torch.randn(4, 16, dtype=torch.float64)
    exact = RMSNorm(16, eps=0.0, dtype=torch.float64)
    torch.testing.assert_close(exact(x * factor), exact(x))
    if factor >= 0.5:  # with the default eps too, as long as the input is far above sqrt(eps)
        default = RMSNorm(16, dtype=torch.float64)
        torch.testing.assert_close(default(x * factor), default(x), rtol=1e-4, atol=1e-4)


def test_eps_breaks_scale_invariance_for_tiny_inputs():
    x = torch.randn(16, dtype=torch.float64)
    x = x / x.pow(2).mean().sqrt() * 1e-4  # RMS 1e-4, far below sqrt(1e-5) ≈ 3.2e-3
    y = RMSNorm(16, dtype=torch.float64)(x)
    expected_rms = 1e-4 / math.sqrt(1e-8 + 1e-5)  # ≈ 0.0316
    assert y.pow(2).mean().sqrt().item() == pytest.approx(expected_rms, rel=1e-9)


@pytest.mark.parametrize("dtype", ALL_FLOAT_DTYPES)
def test_all_zero_input_gives_finite_zeros_and_gradients(dtype):
    x = torch.zeros(2, 8, dtype=dtype, requires_grad=True)
    y = RMSNorm(8)(x)
    assert y.dtype == dtype and torch.equal(y, torch.zeros(2, 8, dtype=dtype))
    y.sum().backward()
    assert x.grad.isfinite().all()


def test_parameter_name_shape_and_ones_init():
    norm = RMSNorm(10)
    assert [(name, tuple(p.shape)) for name, p in norm.named_parameters()] == [("weight", (10,))]
    assert list(norm.state_dict()) == ["weight"]
    assert torch.equal(norm.weight.detach(), torch.ones(10))
    assert (norm.d_model, norm.eps) == (10, 1e-5)
    with torch.no_grad():
        norm.weight.mul_(3.0)
    norm.reset_parameters()
    assert torch.equal(norm.weight.detach(), torch.ones(10))


@pytest.mark.parametrize("device", [*DEVICES, pytest.param("meta", id="meta")])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_device_and_dtype_are_honoured(device, dtype):
    norm = RMSNorm(6, device=device, dtype=dtype)
    assert norm.weight.device.type == device and norm.weight.dtype == dtype


def test_wrong_last_dimension_names_both_sizes():
    with pytest.raises(ValueError, match=r"\(\.\.\., 8\).*d_model=8.*got shape \(2, 3, 5\)"):
        RMSNorm(8)(torch.randn(2, 3, 5))


@pytest.mark.parametrize(
    "bad",
    [torch.ones(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool), torch.tensor(1.0), [1.0, 2.0, 3.0, 4.0]],
    ids=["int", "bool", "0-d", "list"],
)
def test_non_float_or_scalar_input_is_refused(bad):
    with pytest.raises(TypeError):
        RMSNorm(4)(bad)


@pytest.mark.parametrize("kwargs, message", [
    ({"d_model": 0}, "positive d_model"),
    ({"d_model": -3}, "positive d_model"),
    ({"d_model": 4, "eps": -1e-5}, "eps >= 0"),
    ({"d_model": 4, "eps": float("nan")}, "eps >= 0"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RMSNorm(**kwargs)


def test_gradcheck_input_and_weight():
    torch.manual_seed(0)
    norm = RMSNorm(5, dtype=torch.float64)
    x = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    g = random_gain(5, torch.float64).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, g: functional_call(norm, {"weight": g}, (x,)), (x, g))


def test_gradients_match_nn_rmsnorm():
    torch.manual_seed(0)
    reference = torch.nn.RMSNorm(6, eps=1e-5, dtype=torch.float64)
    with torch.no_grad():
        reference.weight.copy_(random_gain(6, torch.float64))
    norm = RMSNorm(6, dtype=torch.float64)
    norm.load_state_dict(reference.state_dict())
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(4, 6, dtype=torch.float64)
    grads = [torch.autograd.grad((module(x) * upstream).sum(), (x, module.weight)) for module in (norm, reference)]
    for ours, theirs in zip(*grads):
        torch.testing.assert_close(ours, theirs)

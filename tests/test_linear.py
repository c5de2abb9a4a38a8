"""Linear (notebook 01) against F.linear, hand-computed cases, its init statistics and its errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES, FLOAT_DTYPES, LEADING_SHAPES
from torch.func import functional_call

from transformer_from_scratch import Linear

TRUNCATED_STD = 0.98658  # std of N(0, 1) truncated to [-3, 3]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("leading", LEADING_SHAPES, ids=str)
def test_matches_f_linear(device, dtype, leading):
    torch.manual_seed(0)
    layer = Linear(16, 8, device=device, dtype=dtype)
    x = torch.randn(*leading, 16, device=device, dtype=dtype)
    y = layer(x)
    assert y.shape == (*leading, 8) and y.dtype == dtype and y.device.type == device
    torch.testing.assert_close(y, F.linear(x, layer.weight))


def test_hand_computed():
    layer = Linear(3, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    assert layer(torch.tensor([1.0, 0.0, -1.0])).tolist() == [-2.0, -2.0]
    rows = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    assert layer(rows).tolist() == [[6.0, 15.0], [2.0, 5.0]]


def test_parameter_names_and_shape_without_bias():
    layer = Linear(5, 3)
    assert [(name, tuple(p.shape)) for name, p in layer.named_parameters()] == [("weight", (3, 5))]
    assert list(layer.state_dict()) == ["weight"]
    assert (layer.in_features, layer.out_features) == (5, 3)


@pytest.mark.parametrize("device", [*DEVICES, pytest.param("meta", id="meta")])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_device_and_dtype_are_honoured(device, dtype):
    layer = Linear(4, 6, device=device, dtype=dtype)
    assert layer.weight.device.type == device and layer.weight.dtype == dtype


def test_loads_a_torch_nn_linear_state_dict():
    reference = torch.nn.Linear(6, 4, bias=False)
    layer = Linear(6, 4)
    layer.load_state_dict(reference.state_dict(), strict=True)
    x = torch.randn(3, 6)
    torch.testing.assert_close(layer(x), reference(x))


@pytest.mark.parametrize("d_in, d_out", [(1024, 2048), (3000, 200)])
def test_init_statistics(d_in, d_out):
    torch.manual_seed(1)
    w = Linear(d_in, d_out).weight.detach().double()
    sigma = math.sqrt(2 / (d_in + d_out))
    n = w.numel()
    assert abs(w.mean().item()) < 5 * sigma / math.sqrt(n)  # five standard errors
    assert w.std().item() / sigma == pytest.approx(TRUNCATED_STD, abs=0.005)
    assert w.abs().max().item() <= 3 * sigma * (1 + 1e-6)  # truncated at ±3σ …
    # … and not at some tighter bound: the share beyond 2σ matches the truncated normal's 4.29 %.
    beyond_2 = (w.abs() > 2 * sigma).double().mean().item()
    expected = (math.erf(3 / math.sqrt(2)) - math.erf(2 / math.sqrt(2))) / math.erf(3 / math.sqrt(2))
    assert beyond_2 == pytest.approx(expected, abs=0.003)


def test_two_layers_start_different():
    assert not torch.equal(Linear(8, 8).weight, Linear(8, 8).weight)


def test_wrong_last_dimension_names_both_sizes():
    with pytest.raises(ValueError, match=r"\(\.\.\., 4\).*got shape \(2, 5\)"):
        Linear(4, 3)(torch.randn(2, 5))


@pytest.mark.parametrize(
    "bad", [torch.ones(2, 4, dtype=torch.long), torch.tensor(1.0), [1.0, 2.0, 3.0, 4.0]], ids=["int", "0-d", "list"]
)
def test_non_float_or_scalar_input_is_refused(bad):
    with pytest.raises(TypeError):
        Linear(4, 3)(bad)


@pytest.mark.parametrize("sizes", [(0, 3), (3, 0), (-1, 2)])
def test_non_positive_sizes_are_refused(sizes):
    with pytest.raises(ValueError, match="positive sizes"):
        Linear(*sizes)


def test_gradcheck_input_and_weight():
    layer = Linear(4, 3, dtype=torch.float64)
    x = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    w = layer.weight.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, w: functional_call(layer, {"weight": w}, (x,)), (x, w))


def test_backward_matches_the_formula():
    layer = Linear(4, 3, dtype=torch.float64)
    x = torch.randn(6, 4, dtype=torch.float64)
    upstream = torch.randn(6, 3, dtype=torch.float64)
    (layer(x) * upstream).sum().backward()
    torch.testing.assert_close(layer.weight.grad, upstream.T @ x)  # dL/dW = Gᵀ X

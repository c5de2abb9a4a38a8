"""silu, SwiGLU and swiglu_hidden_size (notebook 07) against F.silu and F.linear, hand-computed cases, the parameter
budget, the initialisation, gradients and bad input."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES, FLOAT_DTYPES, LEADING_SHAPES
from torch import nn
from torch.func import functional_call

from transformer_from_scratch import reference
from transformer_from_scratch import Linear, SwiGLU, silu, swiglu_hidden_size

HALF_DTYPES = [pytest.param(torch.float16, id="float16"), pytest.param(torch.bfloat16, id="bfloat16")]
TRUNCATED_STD = 0.98658  # std of N(0, 1) truncated to [-3, 3]


def reference_swiglu(x, ffn):
    """w2(silu(w1 x) ⊙ w3 x) from PyTorch's built-ins (the course's reference), with the module's weights."""
    return reference.swiglu(x, ffn.w1.weight, ffn.w2.weight, ffn.w3.weight)


# ------------------------------------------------------------------------------------------------ silu


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("leading", LEADING_SHAPES, ids=str)
def test_silu_matches_f_silu(device, dtype, leading):
    torch.manual_seed(0)
    x = 4 * torch.randn(*leading, 6, device=device, dtype=dtype)
    y = silu(x)
    assert y.shape == x.shape and y.dtype == dtype and y.device.type == device
    torch.testing.assert_close(y, F.silu(x))


def test_silu_of_a_0d_tensor():
    assert silu(torch.tensor(2.0)).shape == ()
    torch.testing.assert_close(silu(torch.tensor(2.0)), F.silu(torch.tensor(2.0)))


def test_silu_hand_computed():
    x = torch.tensor([-1.0, 0.0, 1.0, 2.0], dtype=torch.float64)
    sigmoid = [1 / (1 + math.e), 0.5, 1 / (1 + math.exp(-1)), 1 / (1 + math.exp(-2))]
    expected = torch.tensor([-sigmoid[0], 0.0, sigmoid[2], 2 * sigmoid[3]], dtype=torch.float64)
    torch.testing.assert_close(silu(x), expected)
    assert silu(x).tolist()[2] == pytest.approx(0.7310585786, abs=1e-10)


def test_silu_minimum():
    """The minimum sits at z* ≈ -1.2785, where silu(z*) = z* + 1 (because silu(z) - silu(-z) = z and silu(-z*) = 1)."""
    z = torch.linspace(-3, 0, 300_001, dtype=torch.float64)
    lowest = silu(z).argmin()
    assert z[lowest].item() == pytest.approx(-1.27846, abs=1e-4)
    assert silu(z)[lowest].item() == pytest.approx(z[lowest].item() + 1, abs=2e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_silu_is_finite_at_extreme_inputs(dtype):
    x = torch.tensor([-1e4, -1000.0, -100.0, 100.0, 1000.0, 1e4], dtype=dtype)
    y = silu(x)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, F.silu(x))
    assert (y[:3].abs() < 1e-30).all() and torch.equal(y[3:], x[3:])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_silu_half_precision_keeps_the_dtype_within_two_rounding_steps(device, dtype):
    torch.manual_seed(0)
    x = (4 * torch.randn(10_000)).to(dtype).to(device)
    y = silu(x)
    assert y.dtype == dtype
    exact = F.silu(x.double())
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(y.double(), exact, rtol=2 * eps, atol=0.05 * eps)


def test_silu_gradcheck_and_formula():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(silu, (x,))
    (grad,) = torch.autograd.grad(silu(x).sum(), x)
    s = torch.sigmoid(x.detach())
    torch.testing.assert_close(grad, s * (1 + x.detach() * (1 - s)))


def test_silu_leaves_its_input_alone():
    x = torch.randn(5)
    before = x.clone()
    silu(x)
    assert torch.equal(x, before)


@pytest.mark.parametrize("bad", [torch.arange(4), torch.ones(2, dtype=torch.bool), [1.0, 2.0]], ids=["int", "bool", "list"])
def test_silu_refuses_non_float_input(bad):
    with pytest.raises(TypeError):
        silu(bad)


# ---------------------------------------------------------------------------------------------- SwiGLU


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("leading", LEADING_SHAPES, ids=str)
def test_swiglu_matches_f_linear_and_f_silu(device, dtype, leading):
    torch.manual_seed(0)
    ffn = SwiGLU(16, 40, device=device, dtype=dtype)
    x = torch.randn(*leading, 16, device=device, dtype=dtype)
    y = ffn(x)
    assert y.shape == (*leading, 16) and y.dtype == dtype and y.device.type == device
    torch.testing.assert_close(y, reference_swiglu(x, ffn))


@pytest.mark.parametrize("d_model, d_ff", [(8, 12), (12, 8), (6, 6)])
def test_swiglu_parameters_names_and_shapes(d_model, d_ff):
    ffn = SwiGLU(d_model, d_ff)
    expected = {"w1.weight": (d_ff, d_model), "w2.weight": (d_model, d_ff), "w3.weight": (d_ff, d_model)}
    assert {name: tuple(p.shape) for name, p in ffn.named_parameters()} == expected
    assert list(ffn.state_dict()) == ["w1.weight", "w2.weight", "w3.weight"]
    assert all(isinstance(getattr(ffn, name), Linear) for name in ("w1", "w2", "w3"))
    assert not any(isinstance(m, nn.Linear) for m in ffn.modules())


def test_swiglu_hand_computed():
    """The notebook's exercise 2: W1 = I, W3 = 2I, W2 = [[1, 1], [1, -1]], x = (1, -1)."""
    ffn = SwiGLU(2, 2, dtype=torch.float64)
    ffn.load_state_dict({"w1.weight": torch.eye(2), "w3.weight": 2 * torch.eye(2),
                         "w2.weight": torch.tensor([[1.0, 1.0], [1.0, -1.0]])})
    s = 1 / (1 + math.exp(-1))  # sigmoid(1); sigmoid(-1) = 1 - s
    hidden = [s * 2, -(1 - s) * -2]
    expected = torch.tensor([hidden[0] + hidden[1], hidden[0] - hidden[1]], dtype=torch.float64)
    torch.testing.assert_close(ffn(torch.tensor([1.0, -1.0], dtype=torch.float64)), expected)
    assert [round(v, 2) for v in expected.tolist()] == [2.0, 0.92]


def test_swiglu_gate_and_value_roles():
    """w1 is the gate (through silu), w3 the value: a zero gate input shuts the layer, a zero value too."""
    ffn = SwiGLU(4, 6)
    x = torch.randn(3, 4)
    with torch.no_grad():
        ffn.w1.weight.zero_()
    assert torch.equal(ffn(x), torch.zeros(3, 4))  # silu(0) = 0: unlike GLU's sigmoid(0) = 1/2
    ffn = SwiGLU(4, 6)
    with torch.no_grad():
        ffn.w3.weight.zero_()
    assert torch.equal(ffn(x), torch.zeros(3, 4))


def test_swiglu_loads_a_torch_nn_linear_state_dict():
    class TorchSwiGLU(nn.Module):
        def __init__(self, d_model, d_ff):
            super().__init__()
            self.w1 = nn.Linear(d_model, d_ff, bias=False)
            self.w2 = nn.Linear(d_ff, d_model, bias=False)
            self.w3 = nn.Linear(d_model, d_ff, bias=False)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    reference, ffn = TorchSwiGLU(10, 24), SwiGLU(10, 24)
    ffn.load_state_dict(reference.state_dict(), strict=True)
    x = torch.randn(2, 3, 10)
    torch.testing.assert_close(ffn(x), reference(x))


@pytest.mark.parametrize("device", [*DEVICES, pytest.param("meta", id="meta")])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_swiglu_device_and_dtype_are_honoured(device, dtype):
    ffn = SwiGLU(4, 6, device=device, dtype=dtype)
    assert all(p.device.type == device and p.dtype == dtype for p in ffn.parameters())


def test_swiglu_init_statistics():
    torch.manual_seed(1)
    ffn = SwiGLU(512, 1408)
    for layer in (ffn.w1, ffn.w2, ffn.w3):
        w = layer.weight.detach().double()
        sigma = math.sqrt(2 / sum(w.shape))
        assert abs(w.mean().item()) < 5 * sigma / math.sqrt(w.numel())
        assert w.std().item() / sigma == pytest.approx(TRUNCATED_STD, abs=0.005)
        assert w.abs().max().item() <= 3 * sigma * (1 + 1e-6)
    assert not torch.equal(ffn.w1.weight, ffn.w3.weight)


def test_swiglu_gradcheck_input_and_weights():
    ffn = SwiGLU(4, 6, dtype=torch.float64)
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    names = [name for name, _ in ffn.named_parameters()]
    weights = [p.detach().clone().requires_grad_(True) for p in ffn.parameters()]
    assert torch.autograd.gradcheck(lambda x, *ws: functional_call(ffn, dict(zip(names, ws)), (x,)), (x, *weights))


def test_swiglu_backward_reaches_every_weight():
    ffn = SwiGLU(4, 6)
    ffn(torch.randn(5, 4)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in ffn.parameters())


def test_swiglu_wrong_last_dimension_is_a_value_error_from_linear():
    with pytest.raises(ValueError, match=r"Linear expected an input of shape \(\.\.\., 8\).*got shape \(2, 5, 6\)"):
        SwiGLU(8, 12)(torch.randn(2, 5, 6))


@pytest.mark.parametrize("bad", [torch.ones(2, 8, dtype=torch.long), torch.tensor(1.0)], ids=["int", "0-d"])
def test_swiglu_refuses_integer_or_scalar_input(bad):
    with pytest.raises(TypeError):
        SwiGLU(8, 12)(bad)


@pytest.mark.parametrize("sizes", [(0, 12), (8, 0), (-1, 4)])
def test_swiglu_non_positive_sizes_are_refused(sizes):
    with pytest.raises(ValueError, match="positive sizes"):
        SwiGLU(*sizes)


def test_swiglu_repr_names_the_sizes():
    assert "d_model=8, d_ff=12" in repr(SwiGLU(8, 12))


# -------------------------------------------------------------------------------------- swiglu_hidden_size


@pytest.mark.parametrize("d_model, multiple_of, expected", [
    (768, 64, 2048),     # 8/3 · 768 = 2048 exactly
    (512, 64, 1408),     # 1365.3 -> up to 22 · 64 (the nearest multiple would be 1344)
    (1024, 64, 2752),    # 2730.7 -> 43 · 64
    (2048, 64, 5504),    # 5461.3 -> 86 · 64
    (4096, 64, 10944),   # 10922.7 -> 171 · 64
    (96, 64, 256),       # exactly 4 · 64
    (64, 64, 192),       # 170.7 -> 3 · 64
    (1, 64, 64),         # 2.7 -> one multiple
    (4096, 256, 11008),  # Llama (2) 7B
    (5120, 256, 13824),  # Llama 2 13B
    (768, 1, 2048),
    (512, 1, 1366),      # 1365.3 rounded up
])
def test_swiglu_hidden_size_hand_computed(d_model, multiple_of, expected):
    assert swiglu_hidden_size(d_model, multiple_of) == expected


def test_swiglu_hidden_size_defaults_to_a_multiple_of_64():
    assert swiglu_hidden_size(768) == 2048 and swiglu_hidden_size(512) == 1408


@pytest.mark.parametrize("multiple_of", [1, 8, 64, 128, 256])
def test_swiglu_hidden_size_is_the_smallest_multiple_at_or_above_8_thirds(multiple_of):
    for d_model in range(1, 3000, 7):
        d_ff = swiglu_hidden_size(d_model, multiple_of)
        assert d_ff % multiple_of == 0
        assert 3 * d_ff >= 8 * d_model > 3 * (d_ff - multiple_of)  # d_ff >= 8/3 d_model > d_ff - multiple_of
        assert 3 * d_model * d_ff >= 8 * d_model**2  # at least the budget of a 4·d_model two-matrix FFN


def test_swiglu_hidden_size_is_exact_for_huge_sizes():
    d_model = 3 * 10**20 + 3  # 8/3 · d_model = 8 · 10**20 + 8, an integer float division would round
    assert swiglu_hidden_size(d_model, 8) == 8 * 10**20 + 8


def test_the_parameter_budget_is_that_of_a_4x_two_matrix_ffn():
    def count(*layers):
        return sum(p.numel() for layer in layers for p in layer.parameters())

    d_model = 768
    classic = count(Linear(d_model, 4 * d_model, device="meta"), Linear(4 * d_model, d_model, device="meta"))
    assert count(SwiGLU(d_model, swiglu_hidden_size(d_model), device="meta")) == classic == 8 * d_model**2


@pytest.mark.parametrize("args", [(0,), (-64,), (768, 0), (768, -64)])
def test_swiglu_hidden_size_refuses_non_positive_sizes(args):
    with pytest.raises(ValueError, match="positive sizes"):
        swiglu_hidden_size(*args)


@pytest.mark.parametrize("args", [(768.0,), (768, 64.0), ("768",), (True,)])
def test_swiglu_hidden_size_refuses_non_integers(args):
    with pytest.raises(TypeError, match="must be an int"):
        swiglu_hidden_size(*args)

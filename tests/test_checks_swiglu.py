"""check_silu and check_swiglu pass the reference and name each classic mistake, planted here as a small wrong
silu or SwiGLU."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_from_scratch import Linear, SwiGLU, silu
from transformer_from_scratch.checks import check_silu, check_swiglu
from mutants import Catalogue

# ------------------------------------------------------------------------------------------- silu mutants


def sigmoid_alone(x):
    return torch.sigmoid(x)


def flipped_sign(x):
    return x / (1 + torch.exp(x))


def relu(x):
    return torch.relu(x)


def gelu(x):
    return F.gelu(x)


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def quick_gelu(x):
    return x * torch.sigmoid(1.702 * x)


def x_tanh(x):
    return x * torch.tanh(x)


def mish(x):
    return x * torch.tanh(F.softplus(x))


def softplus(x):
    return torch.log1p(torch.exp(x))


def added(x):
    return x + torch.sigmoid(x)


def overflowing(x):
    return x * torch.exp(x) / (1 + torch.exp(x))


def uses_f_silu(x):
    return F.silu(x)


def uses_nn_silu(x):
    return nn.SiLU()(x)


def returns_float32(x):
    return x.float() * torch.sigmoid(x.float())


def computes_in_float32(x):
    return (x.float() * torch.sigmoid(x.float())).to(x.dtype)


def no_autograd(x):
    with torch.no_grad():
        return x * torch.sigmoid(x)


def detached_sigmoid(x):
    return x * torch.sigmoid(x).detach()


def in_place(x):
    return x.mul_(torch.sigmoid(x))


def summed(x):
    return (x * torch.sigmoid(x)).sum(dim=-1)


def wrong_signature(z):
    return z * torch.sigmoid(z)


SILU_MUTANTS = {
    "sigmoid alone": (sigmoid_alone, "returns sigmoid(x) alone"),
    "sign flipped": (flipped_sign, "the sign in the exponent is flipped"),
    "ReLU": (relu, "returns ReLU(x)"),
    "GELU": (gelu, "computes GELU, x · Φ(x)"),
    "GELU tanh": (gelu_tanh, "GELU's tanh approximation"),
    "quick GELU": (quick_gelu, "sigmoid(1.702 x)"),
    "x tanh x": (x_tanh, "computes x · tanh(x)"),
    "Mish": (mish, "computes Mish"),
    "softplus": (softplus, "returns softplus(x)"),
    "added": (added, "adds x and sigmoid(x)"),
    "overflowing exp": (overflowing, "exp(x) / (1 + exp(x)), which overflows"),
    "F.silu inside": (uses_f_silu, "calls PyTorch's own F.silu"),
    "dtype not kept": (returns_float32, "returns float32 for a float64 input: the dtype is not kept"),
    "float64 in float32": (computes_in_float32, "computes a float64 input in float32"),
    "no autograd": (no_autograd, "cut off from autograd"),
    "detached sigmoid": (detached_sigmoid, "the sigmoid factor is detached"),
    "in place": (in_place, "modifies its input x in place"),
    "wrong shape": (summed, "returned shape"),
    "wrong signature": (wrong_signature, "signature is (z)"),
}


def test_check_silu_passes_the_reference_with_one_line(capsys):
    assert check_silu(silu) is None
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("✓ check_silu")


RIGHT_SILUS = {
    "x * sigmoid(x)": lambda x: x * torch.sigmoid(x),
    "sigmoid(x) * x": lambda x: torch.sigmoid(x) * x,
    "x / (1 + exp(-x))": lambda x: x / (1 + torch.exp(-x)),
    "x * (1 / (1 + exp(-x)))": lambda x: x * (1 / (1 + torch.exp(-x))),
    "x * expit(x)": lambda x: x * torch.special.expit(x),
    "x * F.sigmoid(x)": lambda x: x * F.sigmoid(x),
    "upcast half, cast back": lambda x: (x.float() * torch.sigmoid(x.float())).to(x.dtype)
    if x.dtype in (torch.float16, torch.bfloat16) else x * torch.sigmoid(x),
}


@pytest.mark.parametrize("right", RIGHT_SILUS.values(), ids=list(RIGHT_SILUS))
def test_every_right_way_to_write_silu_passes(right, capsys):
    def silu(x):  # the check reads the parameter's name
        return right(x)

    check_silu(silu)
    assert capsys.readouterr().out.startswith("✓ check_silu")


def test_nn_silu_inside_is_caught_as_f_silu():
    with pytest.raises(AssertionError, match=r"^silu\(x\) with x of shape \(7,\) \(float32\) calls PyTorch's own F.silu"):
        check_silu(uses_nn_silu)


def test_silu_half_precision_returned_as_float32_is_named():
    def half_to_float32(x):
        return x * torch.sigmoid(x) if x.dtype in (torch.float32, torch.float64) else x.float() * torch.sigmoid(x.float())

    with pytest.raises(AssertionError, match=r"^silu returns float32 for a float16 input"):
        check_silu(half_to_float32)


# ----------------------------------------------------------------------------------------- SwiGLU mutants


class SwappedRoles(SwiGLU):
    def forward(self, x):
        return self.w2(self.w1(x) * silu(self.w3(x)))


class SiluAfterProduct(SwiGLU):
    def forward(self, x):
        return self.w2(silu(self.w1(x) * self.w3(x)))


class SiluOnOutput(SwiGLU):
    def forward(self, x):
        return silu(self.w2(self.w1(x) * self.w3(x)))


class W2OnEachPath(SwiGLU):
    def forward(self, x):
        return self.w2(silu(self.w1(x))) * self.w2(self.w3(x))


class W2OnGateBeforeProduct(SwiGLU):
    def forward(self, x):
        return self.w2(silu(self.w1(x))) * self.w3(x)  # crashes unless d_ff == d_model


class MissingGate(SwiGLU):
    def forward(self, x):
        return self.w2(silu(self.w1(x)))


class ValueOnly(SwiGLU):
    def forward(self, x):
        return self.w2(self.w3(x))


class Bilinear(SwiGLU):
    def forward(self, x):
        return self.w2(self.w1(x) * self.w3(x))


class SiluOnBoth(SwiGLU):
    def forward(self, x):
        return self.w2(silu(self.w1(x)) * silu(self.w3(x)))


class SigmoidGate(SwiGLU):
    def forward(self, x):
        return self.w2(torch.sigmoid(self.w1(x)) * self.w3(x))


class ReluGate(SwiGLU):
    def forward(self, x):
        return self.w2(torch.relu(self.w1(x)) * self.w3(x))


class GeluGate(SwiGLU):
    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)) * self.w3(x))


class Added(SwiGLU):
    def forward(self, x):
        return self.w2(silu(self.w1(x)) + self.w3(x))


class UsesFSilu(SwiGLU):
    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class _Layers(nn.Module):
    """A SwiGLU whose three layers come from ``make(d_in, d_out, device, dtype)`` under the given names."""

    make = None
    names = ("w1", "w2", "w3")

    def __init__(self, d_model, d_ff, device=None, dtype=None):
        super().__init__()
        gate, down, up = self.names
        setattr(self, gate, type(self).make(d_model, d_ff, device, dtype))
        setattr(self, down, type(self).make(d_ff, d_model, device, dtype))
        setattr(self, up, type(self).make(d_model, d_ff, device, dtype))
        self._order = self.names

    def forward(self, x):
        gate, down, up = (getattr(self, name) for name in self._order)
        return down(silu(gate(x)) * up(x))


class TorchLinear(_Layers):
    make = staticmethod(lambda i, o, device, dtype: nn.Linear(i, o, bias=False, device=device, dtype=dtype))


class TorchLinearWithBias(_Layers):
    make = staticmethod(lambda i, o, device, dtype: nn.Linear(i, o, device=device, dtype=dtype))


class _LinearWithBias(Linear):
    def __init__(self, in_features, out_features, device=None, dtype=None):
        super().__init__(in_features, out_features, device=device, dtype=dtype)
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype))

    def forward(self, x):
        return super().forward(x) + self.bias


class CourseLinearWithBias(_Layers):
    make = staticmethod(lambda i, o, device, dtype: _LinearWithBias(i, o, device=device, dtype=dtype))


class HuggingFaceNames(_Layers):
    make = staticmethod(lambda i, o, device, dtype: Linear(i, o, device=device, dtype=dtype))
    names = ("gate_proj", "down_proj", "up_proj")


class OtherNames(_Layers):
    make = staticmethod(lambda i, o, device, dtype: Linear(i, o, device=device, dtype=dtype))
    names = ("gate", "out", "value")


class BareParameters(nn.Module):
    def __init__(self, d_model, d_ff, device=None, dtype=None):
        super().__init__()
        self.w1 = nn.Parameter(Linear(d_model, d_ff, device=device, dtype=dtype).weight.detach())
        self.w2 = nn.Parameter(Linear(d_ff, d_model, device=device, dtype=dtype).weight.detach())
        self.w3 = nn.Parameter(Linear(d_model, d_ff, device=device, dtype=dtype).weight.detach())

    def forward(self, x):
        return (silu(x @ self.w1.T) * (x @ self.w3.T)) @ self.w2.T


class W2Transposed(SwiGLU):
    """w2 built as Linear(d_model, d_ff): weight (d_ff, d_model); forward transposes to make it fit."""

    def __init__(self, d_model, d_ff, device=None, dtype=None):
        super().__init__(d_model, d_ff, device=device, dtype=dtype)
        self.w2 = Linear(d_model, d_ff, device=device, dtype=dtype)

    def forward(self, x):
        return (silu(self.w1(x)) * self.w3(x)) @ self.w2.weight


class W1Transposed(SwiGLU):
    def __init__(self, d_model, d_ff, device=None, dtype=None):
        super().__init__(d_model, d_ff, device=device, dtype=dtype)
        self.w1 = Linear(d_ff, d_model, device=device, dtype=dtype)

    def forward(self, x):
        return self.w2(silu(x @ self.w1.weight) * self.w3(x))


class IgnoresDff(SwiGLU):
    def __init__(self, d_model, d_ff, device=None, dtype=None):
        hidden = 64 * math.ceil(8 * d_model / 3 / 64)
        super().__init__(d_model, hidden, device=device, dtype=dtype)


class TiedW3(SwiGLU):
    def __init__(self, d_model, d_ff, device=None, dtype=None):
        super().__init__(d_model, d_ff, device=device, dtype=dtype)
        self.w3 = self.w1


class SameInitW1W3(SwiGLU):
    def __init__(self, d_model, d_ff, device=None, dtype=None):
        super().__init__(d_model, d_ff, device=device, dtype=dtype)
        with torch.no_grad():
            self.w3.weight.copy_(self.w1.weight)


class UnfilledW2(SwiGLU):
    """w2's weight replaced by a new one that nothing fills."""

    def __init__(self, d_model, d_ff, device=None, dtype=None):
        super().__init__(d_model, d_ff, device=device, dtype=dtype)
        self.w2.weight = nn.Parameter(torch.empty_like(self.w2.weight))


class UniformInit(SwiGLU):
    def __init__(self, d_model, d_ff, device=None, dtype=None):
        super().__init__(d_model, d_ff, device=device, dtype=dtype)
        for layer in (self.w1, self.w2, self.w3):
            nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5))


class IgnoresDtype(SwiGLU):
    def __init__(self, d_model, d_ff, device=None, dtype=None):
        super().__init__(d_model, d_ff, device=device)


class IgnoresDevice(SwiGLU):
    def __init__(self, d_model, d_ff, device=None, dtype=None):
        super().__init__(d_model, d_ff, dtype=dtype)


class ComputesInFloat32(SwiGLU):
    def forward(self, x):
        w1, w2, w3 = (layer.weight.float() for layer in (self.w1, self.w2, self.w3))
        xf = x.float()
        return ((silu(xf @ w1.T) * (xf @ w3.T)) @ w2.T).to(x.dtype)


class ReturnsFloat32(SwiGLU):
    def forward(self, x):
        return super().forward(x).float()


class DetachedW2(SwiGLU):
    def forward(self, x):
        return (silu(self.w1(x)) * self.w3(x)) @ self.w2.weight.detach().T


class WrongSignature(SwiGLU):
    def __init__(self, d_model, hidden, device=None, dtype=None):
        super().__init__(d_model, hidden, device=device, dtype=dtype)


SWIGLU_MUTANTS = {
    "w1 and w3 swapped in roles": (SwappedRoles, "w1 and w3 are swapped in roles"),
    "silu after the product": (SiluAfterProduct, "silu is applied after the product"),
    "silu on the output": (SiluOnOutput, "silu is applied to the output"),
    "w2 on each path": (W2OnEachPath, "w2 is applied to each path before the product"),
    "w2 on the gate before the product": (W2OnGateBeforeProduct, "w2 is applied before the product"),
    "missing gate": (MissingGate, "the gate is missing: w3 is never used"),
    "value only": (ValueOnly, "only the value path reaches w2"),
    "bilinear": (Bilinear, "there is no activation"),
    "silu on both": (SiluOnBoth, "silu is applied to both paths"),
    "GLU": (SigmoidGate, "that is GLU, not SwiGLU"),
    "ReGLU": (ReluGate, "that is ReGLU"),
    "GEGLU": (GeluGate, "the gate is GELU(w1 x): that is GEGLU"),
    "added": (Added, "the two paths are added"),
    "F.silu inside": (UsesFSilu, "calls PyTorch's own F.silu"),
    "nn.Linear": (TorchLinear, "builds its layers with torch.nn.Linear"),
    "nn.Linear with bias": (TorchLinearWithBias, "has biases (w1.bias"),
    "Hugging Face names": (HuggingFaceNames, "uses Hugging Face's names"),
    "other names": (OtherNames, "SwiGLU's parameters are named"),
    "bare parameters": (BareParameters, "are bare nn.Parameters"),
    "w2 stored (d_ff, d_model)": (W2Transposed, "w2.weight has shape (12, 8), expected (8, 12) = (d_model, d_ff)"),
    "w1 stored (d_model, d_ff)": (W1Transposed, "w1.weight has shape (8, 12), expected (12, 8) = (d_ff, d_model)"),
    "d_ff ignored": (IgnoresDff, "ignores its d_ff argument"),
    "w3 is w1": (TiedW3, "w3 is the same layer as w1"),
    "w1 and w3 start equal": (SameInitW1W3, "w1 and w3 start with identical weights"),
    "uniform init": (UniformInit, "does not start as Linear's recipe says"),
    "w2 never filled": (UnfilledW2, "SwiGLU.w2.weight is never initialised"),
    "dtype ignored": (IgnoresDtype, "ignores its dtype argument"),
    "device ignored": (IgnoresDevice, "ignores its device argument"),
    "float64 in float32": (ComputesInFloat32, "matches only to float32 precision"),
    "float64 returned as float32": (ReturnsFloat32, "returned float32 for a float64 input"),
    "detached w2": (DetachedW2, "w2.weight's gradient differs"),
    "wrong signature": (WrongSignature, "signature is (d_model, hidden"),
}


def test_check_swiglu_passes_the_reference_with_one_line(capsys):
    assert check_swiglu(SwiGLU) is None
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("✓ check_swiglu")


def test_a_swiglu_written_with_the_weights_directly_passes(capsys):
    class WithWeights(SwiGLU):
        def forward(self, x):
            gate = silu(x @ self.w1.weight.T)
            return (gate * (x @ self.w3.weight.T)) @ self.w2.weight.T

    check_swiglu(WithWeights)
    assert capsys.readouterr().out.startswith("✓ check_swiglu")


def test_a_bias_on_the_course_linear_gets_the_same_verdict():
    with pytest.raises(AssertionError, match=r"^SwiGLU has biases \(w1.bias, w2.bias, w3.bias\)"):
        check_swiglu(CourseLinearWithBias)


def test_the_swap_is_invisible_without_known_weights():
    """Why the check loads its own weights: with the module's random ones, a swapped SwiGLU is a valid network."""
    torch.manual_seed(0)
    swapped = SwappedRoles(8, 12)
    x = torch.randn(4, 8)
    y = swapped(x)
    assert y.shape == (4, 8) and torch.isfinite(y).all()
    reference = SwiGLU(8, 12)
    reference.load_state_dict(swapped.state_dict())
    assert not torch.allclose(reference(x), y)


def test_an_object_instead_of_the_class_is_named():
    with pytest.raises(AssertionError, match="got a SwiGLU object, not the class"):
        check_swiglu(SwiGLU(8, 12))


CATALOGUES = [Catalogue(check_silu, list(SILU_MUTANTS.values()), except_within=True, ids=list(SILU_MUTANTS)),
              Catalogue(check_swiglu, list(SWIGLU_MUTANTS.values()), right=SwiGLU, except_within=True,
                        ids=list(SWIGLU_MUTANTS))]

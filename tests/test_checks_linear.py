"""check_linear passes the reference and names each classic mistake, planted here as a small wrong Linear."""

import math

import pytest
import torch
import torch.nn.functional as F
from einops import einsum
from torch import nn

from transformer_from_scratch import Linear
from transformer_from_scratch.checks import check_linear
from mutants import Catalogue, assert_own_verdict


def _sigma(layer):
    return math.sqrt(2 / (layer.in_features + layer.out_features))


def _std(std_of):
    """A Linear whose reset_parameters cuts at ±3·std but draws with std = std_of(d_in, d_out)."""

    class WrongStd(Linear):
        def reset_parameters(self):
            std = std_of(self.in_features, self.out_features)
            nn.init.trunc_normal_(self.weight, std=std, a=-3 * std, b=3 * std)

    return WrongStd


class NoTranspose(Linear):
    def forward(self, x):
        return x @ self.weight


class StoredInOut(nn.Module):
    def __init__(self, in_features, out_features, device=None, dtype=None):
        super().__init__()
        std = math.sqrt(2 / (in_features + out_features))
        self.weight = nn.Parameter(torch.empty(in_features, out_features, device=device, dtype=dtype))
        nn.init.trunc_normal_(self.weight, std=std, a=-3 * std, b=3 * std)

    def forward(self, x):
        return x @ self.weight


class ReshapeNotTranspose(Linear):
    def forward(self, x):
        return x @ self.weight.reshape(self.in_features, self.out_features)


class DefaultCut(Linear):
    def reset_parameters(self):
        nn.init.trunc_normal_(self.weight, std=_sigma(self))  # a=-2, b=2: in weight units


class TightCut(Linear):
    def reset_parameters(self):
        std = _sigma(self)
        nn.init.trunc_normal_(self.weight, std=std, a=-2 * std, b=2 * std)


class AllDefaults(Linear):
    def reset_parameters(self):
        nn.init.trunc_normal_(self.weight)  # std 1, cut ±2


class NormalNoCut(Linear):
    def reset_parameters(self):
        with torch.no_grad():
            self.weight.normal_(0.0, _sigma(self))


class UniformDefault(Linear):
    def reset_parameters(self):
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # what nn.Linear does


class Zeros(Linear):
    def reset_parameters(self):
        nn.init.zeros_(self.weight)


class NeverFilled(Linear):
    def reset_parameters(self):
        pass  # the weight stays as torch.empty made it


class LegacyConstructor(nn.Module):
    """torch.Tensor(out, in) allocates like torch.empty, through a door no function hook sees, and nothing fills it."""

    def __init__(self, in_features, out_features, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.Tensor(out_features, in_features).to(device=device, dtype=dtype))

    def forward(self, x):
        return x @ self.weight.T


class PartlyFilled(Linear):
    def reset_parameters(self):
        std = _sigma(self)
        nn.init.trunc_normal_(self.weight[:-1], std=std, a=-3 * std, b=3 * std)  # the last row is never filled


class SameEveryTime(Linear):
    def reset_parameters(self):
        std = _sigma(self)
        nn.init.trunc_normal_(self.weight, std=std, a=-3 * std, b=3 * std, generator=torch.Generator().manual_seed(0))


class NotCentred(Linear):
    def reset_parameters(self):
        with torch.no_grad():
            self.weight.copy_(torch.rand_like(self.weight) * 2 * _sigma(self))


class WithBias(Linear):
    def __init__(self, in_features, out_features, device=None, dtype=None):
        super().__init__(in_features, out_features, device=device, dtype=dtype)
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype))

    def forward(self, x):
        return super().forward(x) + self.bias


class HiddenBias(Linear):
    def forward(self, x):
        return super().forward(x) + torch.arange(self.out_features, dtype=x.dtype)


class IgnoresDtype(Linear):
    def __init__(self, in_features, out_features, device=None, dtype=None):
        super().__init__(in_features, out_features, device=device)


class IgnoresDevice(Linear):
    def __init__(self, in_features, out_features, device=None, dtype=None):
        super().__init__(in_features, out_features, dtype=dtype)


class UsesFLinear(Linear):
    def forward(self, x):
        return F.linear(x, self.weight)


class WrapsNNLinear(nn.Module):
    def __init__(self, in_features, out_features, device=None, dtype=None):
        super().__init__()
        self.inner = nn.Linear(in_features, out_features, bias=False, device=device, dtype=dtype)

    def forward(self, x):
        return self.inner(x)


class FixedLeadingDims(Linear):
    def forward(self, x):
        return einsum(x, self.weight, "batch seq d_in, d_out d_in -> batch seq d_out")


class FlattensLeadingDims(Linear):
    def forward(self, x):
        return x.reshape(-1, self.in_features) @ self.weight.T


class CastsToFloat32(Linear):
    def forward(self, x):
        return x.float() @ self.weight.float().T


class ComputesInFloat32(Linear):
    def forward(self, x):
        return (x.float() @ self.weight.float().T).to(x.dtype)


class Detached(Linear):
    def forward(self, x):
        return x @ self.weight.detach().T


class WrongSignature(Linear):
    def __init__(self, d_in, d_out, device=None, dtype=None):
        super().__init__(d_in, d_out, device=device, dtype=dtype)


MUTANTS = {
    "no transpose": (NoTranspose, "without the transpose"),
    "stored (in, out)": (StoredInOut, "stored as (in_features, out_features)"),
    "reshape, not transpose": (ReshapeNotTranspose, "reshapes (or views) the weight"),
    "default absolute cut": (DefaultCut, "default cut a=-2, b=2 is in weight units"),
    "cut too tight": (TightCut, "the cut is too tight"),
    "std 1/sqrt(d_in)": (_std(lambda i, o: 1 / math.sqrt(i)), "std is 1 / sqrt(d_in)"),
    "std 1/sqrt(d_out)": (_std(lambda i, o: 1 / math.sqrt(o)), "std is 1 / sqrt(d_out)"),
    "std 2/sqrt(d_in + d_out)": (_std(lambda i, o: 2 / math.sqrt(i + o)), "the square root must cover the whole fraction"),
    "std sqrt(2/d_in)": (_std(lambda i, o: math.sqrt(2 / i)), "He/Kaiming"),
    "std sqrt(1/(d_in + d_out))": (_std(lambda i, o: math.sqrt(1 / (i + o))), "the 2 is missing"),
    "variance as std": (_std(lambda i, o: 2 / (i + o)), "the variance passed as std"),
    "trunc_normal_ defaults": (AllDefaults, "trunc_normal_'s default std"),
    "uniform (nn.Linear's default)": (UniformDefault, "nn.Linear's default, kaiming_uniform_"),
    "all zeros": (Zeros, "all zeros"),
    "never filled": (NeverFilled, "never initialised: it holds whatever torch.empty left"),
    "partly filled": (PartlyFilled, "is initialised only in part"),
    "same weights every time": (SameEveryTime, "start with identical weights"),
    "not centred": (NotCentred, "not centred at 0"),
    "bias": (WithBias, "has a bias"),
    "hidden bias": (HiddenBias, "adds the same vector to every output"),
    "dtype ignored": (IgnoresDtype, "ignores its dtype argument"),
    "device ignored": (IgnoresDevice, "ignores its device argument"),
    "F.linear inside": (UsesFLinear, "calls PyTorch's own F.linear"),
    "nn.Linear inside": (WrapsNNLinear, "contains) torch.nn.Linear"),
    "fixed leading dims": (FixedLeadingDims, "any number of leading dimensions"),
    "flattened leading dims": (FlattensLeadingDims, "loses the leading dimensions"),
    "casts to float32": (CastsToFloat32, "returned torch.float32 for a torch.float64 input"),
    "computes in float32": (ComputesInFloat32, "only to float32 precision"),
    "detached weight": (Detached, "no gradient reaches Linear.weight"),
    "wrong signature": (WrongSignature, "signature is (d_in, d_out"),
}


def test_reference_passes_with_one_line(capsys):
    assert check_linear(Linear) is None
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("✓ check_linear")


def test_normal_without_a_cut_is_no_truncation():
    with pytest.raises(AssertionError, match=r"^[\d,]+ of 262,144 initial weights lie beyond ±3σ, so nothing was truncated"):
        check_linear(NormalNoCut)


def test_a_weight_never_filled_is_named_however_it_was_allocated():
    """torch.Tensor(out, in) is torch.empty by another door: the same verdict."""
    assert_own_verdict(check_linear, LegacyConstructor, "never initialised: it holds whatever torch.empty left",
                       exclusive=False)


CATALOGUES = [Catalogue(check_linear, list(MUTANTS.values()), right=Linear, ids=list(MUTANTS))]

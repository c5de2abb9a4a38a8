"""Mutation tests for check_rmsnorm: the reference passes with one line; every classic mistake, planted in
a small wrong RMSNorm written here, fails with its own diagnosis on the first line."""

import torch
import torch.nn.functional as F
from torch import nn

from transformer_from_scratch import RMSNorm
from transformer_from_scratch.checks import check_rmsnorm
from mutants import Catalogue


class Right(nn.Module):
    """A plain, correct RMSNorm; the mutants below change one thing each."""

    def __init__(self, d_model, eps=1e-5, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def mean_square(self, x):
        return x.pow(2).mean(dim=-1, keepdim=True)

    def normalise(self, x):  # x already in the compute dtype
        return x / torch.sqrt(self.mean_square(x) + self.eps) * self.weight

    def forward(self, x):
        compute = torch.promote_types(x.dtype, torch.float32)
        return self.normalise(x.to(compute)).to(x.dtype)


# --- parameters and construction -------------------------------------------------------------------------

class NoGain(Right):
    def __init__(self, d_model, eps=1e-5, device=None, dtype=None):
        nn.Module.__init__(self)
        self.eps = eps

    def normalise(self, x):
        return x / torch.sqrt(self.mean_square(x) + self.eps)


class GainNamedG(Right):
    def __init__(self, d_model, eps=1e-5, device=None, dtype=None):
        nn.Module.__init__(self)
        self.eps = eps
        self.g = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))


class GainZeros(Right):
    def __init__(self, d_model, eps=1e-5, device=None, dtype=None):
        super().__init__(d_model, eps, device, dtype)
        nn.init.zeros_(self.weight)


class GainRandom(Right):
    def __init__(self, d_model, eps=1e-5, device=None, dtype=None):
        super().__init__(d_model, eps, device, dtype)
        nn.init.normal_(self.weight)


class NeverFilled(Right):
    def __init__(self, d_model, eps=1e-5, device=None, dtype=None):
        nn.Module.__init__(self)
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(d_model, device=device, dtype=dtype))  # and nothing fills it


class CentredVarianceNotRms(Right):
    def normalise(self, x):
        return x / torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + self.eps) * self.weight


class ResetParametersDoesNothing(Right):
    def reset_parameters(self):
        pass


class DefaultEps1e6(Right):
    def __init__(self, d_model, eps=1e-6, device=None, dtype=None):
        super().__init__(d_model, eps, device, dtype)


class IgnoresDtype(Right):
    def __init__(self, d_model, eps=1e-5, device=None, dtype=None):
        super().__init__(d_model, eps, device, None)


class IgnoresDevice(Right):
    def __init__(self, d_model, eps=1e-5, device=None, dtype=None):
        super().__init__(d_model, eps, None, dtype)


class UsesBuiltin(Right):
    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)


# --- the formula -----------------------------------------------------------------------------------------

class GainNotApplied(Right):
    def normalise(self, x):
        return x / torch.sqrt(self.mean_square(x) + self.eps)


class MeanOverDim0(Right):
    def mean_square(self, x):
        return x.pow(2).mean(dim=0, keepdim=True)


class MeanOverAllDims(Right):
    def mean_square(self, x):
        return x.pow(2).mean()


class NoKeepdim(Right):
    def mean_square(self, x):
        return x.pow(2).mean(dim=-1)


class SumNotMean(Right):
    def mean_square(self, x):
        return x.pow(2).sum(dim=-1, keepdim=True)


class LayerNormInstead(Right):
    def normalise(self, x):
        centred = x - x.mean(dim=-1, keepdim=True)
        return centred / torch.sqrt(centred.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


class StdNotRms(Right):
    def normalise(self, x):
        return x / torch.sqrt(x.var(dim=-1, keepdim=True) + self.eps) * self.weight


class NoSqrt(Right):
    def normalise(self, x):
        return x / (self.mean_square(x) + self.eps) * self.weight


class EpsOutsideSqrt(Right):
    def normalise(self, x):
        return x / (torch.sqrt(self.mean_square(x)) + self.eps) * self.weight


class EpsIgnored(Right):
    def normalise(self, x):
        return x / torch.sqrt(self.mean_square(x)) * self.weight


class FixedEps(Right):
    def normalise(self, x):
        return x / torch.sqrt(self.mean_square(x) + 1e-5) * self.weight


class ChangesInputInPlace(Right):
    def forward(self, x):
        x = x.to(torch.promote_types(x.dtype, torch.float32))  # the same tensor for a float32 input
        x.mul_(torch.rsqrt(self.mean_square(x) + self.eps))
        return x * self.weight


# --- dtypes ----------------------------------------------------------------------------------------------

class NoUpcast(Right):
    def forward(self, x):
        return self.normalise(x).to(x.dtype)


class NotCastBack(Right):
    def forward(self, x):
        return self.normalise(x.to(torch.promote_types(x.dtype, torch.float32)))


class Float64ComputedInFloat32(Right):
    def forward(self, x):
        return self.normalise(x.float()).to(x.dtype)


class Float64ReturnedAsFloat32(Right):
    def forward(self, x):
        out = self.normalise(x.float())
        return out.to(x.dtype) if x.dtype in (torch.float16, torch.bfloat16) else out


# --- gradients -------------------------------------------------------------------------------------------

class RmsDetached(Right):
    def normalise(self, x):
        return x / torch.sqrt(self.mean_square(x) + self.eps).detach() * self.weight


class GainDetached(Right):
    def normalise(self, x):
        return x / torch.sqrt(self.mean_square(x) + self.eps) * self.weight.data


MUTANTS = [
    (NoGain, "has no learnable gain"),
    (GainNamedG, "parameters are named ['g']"),
    (GainZeros, "initialised to zeros"),
    (GainRandom, "initialised to random values"),
    (NeverFilled, "never initialised: it holds whatever torch.empty left"),
    (ResetParametersDoesNothing, "reset_parameters() does not set the gain back to ones"),
    (DefaultEps1e6, "default eps is 1e-06"),
    (IgnoresDtype, "ignores its dtype argument"),
    (IgnoresDevice, "ignores its device argument"),
    (UsesBuiltin, "calls PyTorch's own F.rms_norm"),
    (GainNotApplied, "does not multiply by the gain"),
    (MeanOverDim0, "over dim=0"),
    (MeanOverAllDims, "over all dimensions"),
    (NoKeepdim, "without keepdim=True"),
    (SumNotMean, "summed, not averaged"),
    (LayerNormInstead, "subtracts the mean, which makes it LayerNorm"),
    (StdNotRms, "standard deviation (x.std / x.var)"),
    (CentredVarianceNotRms, "the root of the centred variance"),
    (NoSqrt, "square root is missing"),
    (EpsOutsideSqrt, "eps is added outside the square root"),
    (EpsIgnored, "eps is ignored, so an all-zero vector gives 0/0 = NaN"),
    (FixedEps, "ignores the eps argument and uses a fixed eps = 1e-05"),
    (ChangesInputInPlace, "changes its input in place"),
    (NoUpcast, "no float32 upcast"),
    (NotCastBack, "not cast back to the input's dtype (float16 in, float32 out)"),
    (Float64ComputedInFloat32, "computed in float32"),
    (Float64ReturnedAsFloat32, "downcast and comes back as torch.float32"),
    (RmsDetached, "RMS is detached"),
    (GainDetached, "gradient does not reach the gain"),
]


def test_the_reference_passes_with_one_line(capsys):
    assert check_rmsnorm(RMSNorm) is None
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("✓ check_rmsnorm:")


def test_a_plain_correct_rmsnorm_passes(capsys):
    check_rmsnorm(Right)
    assert capsys.readouterr().out.startswith("✓ check_rmsnorm:")


CATALOGUES = [Catalogue(check_rmsnorm, MUTANTS, ids=[m.__name__ for m, _ in MUTANTS])]

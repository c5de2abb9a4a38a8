"""check_softmax: the reference passes with one line; every classic mistake, planted here as a small wrong
softmax, fails with its own first line (mutation tests)."""

import pytest
import torch
import torch.nn.functional as F
from torch import softmax as renamed_builtin

from transformer_from_scratch import softmax
from transformer_from_scratch.checks import check_softmax
from mutants import Catalogue

HALF = (torch.float16, torch.bfloat16)


def _finish(exps, dim):
    return exps / exps.sum(dim=dim, keepdim=True)


def _upcast(x):
    return x.float() if x.dtype in HALF else x


# ---- the mutants: each is right except for one classic mistake ----------------------------------------------


def no_max_subtraction(x, dim):
    z = _upcast(x)
    return _finish(torch.exp(z), dim).to(x.dtype)


def global_max(x, dim):
    z = _upcast(x)
    return _finish(torch.exp(z - z.max()), dim).to(x.dtype)


def hard_coded_last_dim(x, dim):
    z = _upcast(x)
    return _finish(torch.exp(z - z.amax(dim=-1, keepdim=True)), -1).to(x.dtype)


def hard_coded_first_dim(x, dim):
    z = _upcast(x)
    return _finish(torch.exp(z - z.amax(dim=0, keepdim=True)), 0).to(x.dtype)


def max_along_last_dim(x, dim):
    z = _upcast(x)
    return _finish(torch.exp(z - z.amax(dim=-1, keepdim=True)), dim).to(x.dtype)


def max_without_keepdim(x, dim):
    z = _upcast(x)
    return _finish(torch.exp(z - z.amax(dim=dim)), dim).to(x.dtype)


def sum_without_keepdim(x, dim):
    z = _upcast(x)
    exps = torch.exp(z - z.amax(dim=dim, keepdim=True))
    return (exps / exps.sum(dim=dim)).to(x.dtype)


def max_unsqueezed_last(x, dim):
    z = _upcast(x)
    return _finish(torch.exp(z - z.amax(dim=dim).unsqueeze(-1)), dim).to(x.dtype)


def max_without_keepdim_where_it_broadcasts(x, dim):
    """No crash to give it away: on a square input the dropped dim broadcasts against the wrong axis."""
    z = _upcast(x)
    try:
        shifted = z - z.amax(dim=dim)
    except RuntimeError:
        shifted = z - z.amax(dim=dim, keepdim=True)
    return _finish(torch.exp(shifted), dim).to(x.dtype)


def max_tuple(x, dim):
    z = _upcast(x)
    return _finish(torch.exp(z - z.max(dim)), dim).to(x.dtype)


def not_normalised(x, dim):
    z = _upcast(x)
    return torch.exp(z - z.amax(dim=dim, keepdim=True)).to(x.dtype)


def sums_everything(x, dim):
    z = _upcast(x)
    exps = torch.exp(z - z.amax(dim=dim, keepdim=True))
    return (exps / exps.sum()).to(x.dtype)


def log_probabilities(x, dim):
    z = _upcast(x)
    shifted = z - z.amax(dim=dim, keepdim=True)
    return (shifted - torch.exp(shifted).sum(dim=dim, keepdim=True).log()).to(x.dtype)


def half_not_upcast(x, dim):
    return _finish(torch.exp(x - x.amax(dim=dim, keepdim=True)), dim)


def only_float16_upcast(x, dim):
    z = x.float() if x.dtype == torch.float16 else x
    return _finish(torch.exp(z - z.amax(dim=dim, keepdim=True)), dim).to(x.dtype)


def dtype_not_restored(x, dim):
    z = _upcast(x)
    return _finish(torch.exp(z - z.amax(dim=dim, keepdim=True)), dim)


def float64_in_float32(x, dim):
    z = x.float()
    return _finish(torch.exp(z - z.amax(dim=dim, keepdim=True)), dim).to(x.dtype)


def clamped_away_from_zero(x, dim):
    return softmax(x, dim).clamp_min(1e-12)


def fully_masked_made_up(x, dim):
    return torch.nan_to_num(softmax(x, dim), nan=0.0)


def calls_torch_softmax(x, dim):
    return torch.softmax(x, dim=dim)


def calls_functional_softmax(x, dim):
    return F.softmax(x, dim=dim)


def calls_method(x, dim):
    return x.softmax(dim)


def calls_module(x, dim):
    return torch.nn.Softmax(dim=dim)(x)


def calls_a_renamed_builtin(x, dim):
    return renamed_builtin(x, dim=dim)


def via_log_softmax(x, dim):
    return torch.log_softmax(x, dim=dim).exp()


def no_grad(x, dim):
    with torch.no_grad():
        return softmax(x, dim)


def detached_sum(x, dim):
    z = _upcast(x)
    exps = torch.exp(z - z.amax(dim=dim, keepdim=True))
    return (exps / exps.sum(dim=dim, keepdim=True).detach()).to(x.dtype)


def in_place(x, dim):
    if x.dtype not in HALF:
        x -= x.amax(dim=dim, keepdim=True)
        x.exp_()
        return _finish(x.clone(), dim)
    return softmax(x, dim)


def hand_written_backward(wrong_gradient):
    """A softmax whose forward is right and whose backward, written by hand, returns wrong_gradient(p, g, dim)."""

    class WrongBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, dim):
            p = softmax(x.detach(), dim)
            ctx.save_for_backward(p)
            ctx.dim = dim
            return p

        @staticmethod
        def backward(ctx, g):
            (p,) = ctx.saved_tensors
            return wrong_gradient(p, g, ctx.dim), None

    def softmax_with_this_backward(x, dim):
        return WrongBackward.apply(x, dim)

    softmax_with_this_backward.__name__ = wrong_gradient.__name__
    return softmax_with_this_backward


@hand_written_backward
def backward_without_the_subtraction(p, g, dim):
    return p * g


@hand_written_backward
def backward_without_the_factor_p(p, g, dim):
    return g - (g * p).sum(dim=dim, keepdim=True)


@hand_written_backward
def backward_with_the_sum_of_g(p, g, dim):
    return p * (g - g.sum(dim=dim, keepdim=True))


@hand_written_backward
def backward_along_the_last_dim(p, g, dim):
    return p * (g - (g * p).sum(dim=-1, keepdim=True))


MUTANTS = [
    (no_max_subtraction, "does not subtract the max"),
    (global_max, "max of the whole tensor"),
    (hard_coded_last_dim, "normalises along dim=-1"),
    (hard_coded_first_dim, "normalises along dim=0"),
    (max_along_last_dim, "the max is taken along dim="),
    (max_without_keepdim, "no keepdim=True"),
    (sum_without_keepdim, "no keepdim=True"),
    (max_unsqueezed_last, "no keepdim=True"),
    (max_without_keepdim_where_it_broadcasts, "no keepdim=True"),
    (max_tuple, "returns a (values, indices) pair"),
    (not_normalised, "never divides by the sum"),
    (sums_everything, "sums over every element"),
    (log_probabilities, "returns log-probabilities"),
    (half_not_upcast, "float16 inputs are computed in float16"),
    (only_float16_upcast, "bfloat16 inputs are computed in bfloat16"),
    (dtype_not_restored, "returns float32 for a float16 input"),
    (float64_in_float32, "float64 inputs are computed in float32"),
    (clamped_away_from_zero, "not exactly 0"),
    (fully_masked_made_up, "all -inf slice comes out as numbers"),
    (calls_torch_softmax, "calls PyTorch's own torch.softmax"),
    (calls_functional_softmax, "calls PyTorch's own F.softmax"),
    (calls_method, "calls PyTorch's own x.softmax"),
    (calls_module, "calls PyTorch's own F.softmax"),  # nn.Softmax goes through F.softmax
    (calls_a_renamed_builtin, "calls PyTorch's own torch.softmax"),  # an alias is the same function
    (via_log_softmax, "calls PyTorch's own torch.log_softmax"),
    (no_grad, "cut off from autograd"),
    (detached_sum, "the gradient of"),
    (in_place, "modifies its input x in place"),
    (backward_without_the_subtraction, "the term − p ⟨g, p⟩ is missing"),
    (backward_without_the_factor_p, "without multiplying by p"),
    (backward_with_the_sum_of_g, "subtracts the sum of g instead of"),
    (backward_along_the_last_dim, "a backward written by hand must return"),
]


def test_reference_passes_with_one_line(capsys):
    assert check_softmax(softmax) is None
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("✓ check_softmax")


def via_logsumexp(x, dim):
    z = _upcast(x)
    return torch.exp(z - torch.logsumexp(z, dim=dim, keepdim=True)).to(x.dtype)


def max_values_times_reciprocal(x, dim):
    z = _upcast(x)
    exps = torch.exp(z - z.max(dim=dim, keepdim=True).values)
    return (exps * (1.0 / exps.sum(dim=dim, keepdim=True))).type_as(x)


@pytest.mark.parametrize("right", [via_logsumexp, max_values_times_reciprocal], ids=lambda f: f.__name__)
def test_other_correct_ways_pass(right, capsys):
    check_softmax(right)
    assert capsys.readouterr().out.startswith("✓ check_softmax")


def test_the_builtins_are_restored_even_when_the_check_fails():
    originals = (torch.softmax, F.softmax, torch.log_softmax, torch.special.softmax)
    with pytest.raises(AssertionError):
        check_softmax(calls_torch_softmax)
    assert (torch.softmax, F.softmax, torch.log_softmax, torch.special.softmax) == originals
    assert "softmax" not in vars(torch.Tensor) and "log_softmax" not in vars(torch.Tensor)
    assert torch.equal(torch.tensor([0.0, 0.0]).softmax(0), torch.tensor([0.5, 0.5]))


def test_a_wrong_signature_is_named():
    def wrong(logits, axis):
        return softmax(logits, axis)

    with pytest.raises(AssertionError, match=r"signature is \(logits, axis\).*write it as \(x, dim\)"):
        check_softmax(wrong)


CATALOGUES = [Catalogue(check_softmax, MUTANTS, exclusive=False, distinct="within",
                        ids=[m.__name__ for m, _ in MUTANTS])]

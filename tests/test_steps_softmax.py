"""The step checks of notebook 03 pass the right steps and name each planted mistake on their first line."""

import torch
import torch.nn.functional as F

from transformer_from_scratch.checks.steps.softmax import (
    check_naive_softmax,
    check_softmax_backward,
    check_softmax_by_hand,
    check_stable_softmax,
)
from mutants import Catalogue


def naive_softmax(x, dim):
    exps = torch.exp(x)
    return exps / exps.sum(dim=dim, keepdim=True)


def stable_softmax(x, dim):
    exps = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return exps / exps.sum(dim=dim, keepdim=True)


def softmax_backward(p, g, dim):
    return p * (g - (g * p).sum(dim=dim, keepdim=True))


def by_hand(forward_saves="p", backward_returns_none=True, keeps_dim=True, extra_save=False, unpacks=True):
    """A SoftmaxByHand class, right by default; each argument plants one mistake."""
    class SoftmaxByHand(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, dim):
            p = stable_softmax(x, dim)
            saved = {"p": (p,), "x": (x,)}[forward_saves] + ((x,) if extra_save else ())
            ctx.save_for_backward(*saved)
            if keeps_dim:
                ctx.dim = dim
            return p

        @staticmethod
        def backward(ctx, g):
            p = ctx.saved_tensors[0] if unpacks else ctx.saved_tensors
            grad = softmax_backward(p, g, ctx.dim)
            return (grad, None) if backward_returns_none else grad
    return SoftmaxByHand


class CallsTorchSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        p = torch.softmax(x, dim)
        ctx.save_for_backward(p)
        ctx.dim = dim
        return p

    @staticmethod
    def backward(ctx, g):
        (p,) = ctx.saved_tensors
        return softmax_backward(p, g, ctx.dim), None


def in_place(x, dim):
    x -= x.amax(dim=dim, keepdim=True)
    x.exp_()
    return x / x.sum(dim=dim, keepdim=True)


NAIVE_MUTANTS = [
    (lambda x, dim: torch.exp(x) / torch.exp(x).sum(dim=dim), "no keepdim=True"),
    (lambda x, dim: torch.exp(x) / torch.exp(x).sum(), "sums over every element"),
    (lambda x, dim: torch.exp(x) / torch.exp(x).sum(dim=-1, keepdim=True), "normalises along dim=-1 when asked for dim=0"),
    (lambda x, dim: torch.exp(x), "never divides by the sum"),
    (stable_softmax, "already subtracts the max"),
    (lambda x, dim: torch.softmax(x, dim), "calls PyTorch's own torch.softmax"),
    (lambda x, dim: F.softmax(x, dim=dim), "calls PyTorch's own F.softmax"),
]

STABLE_MUTANTS = [
    (naive_softmax, "does not subtract the max"),
    (lambda x, dim: torch.exp(x - x.max()) / torch.exp(x - x.max()).sum(dim=dim, keepdim=True), "the whole tensor"),
    (lambda x, dim: torch.exp(x - x.amax(dim=dim)) / torch.exp(x - x.amax(dim=dim)).sum(dim=dim, keepdim=True),
     "no keepdim=True"),
    (lambda x, dim: torch.exp(x - x.max(dim=dim)) / 1, "(values, indices) pair"),
    (lambda x, dim: stable_softmax(x, -1), "normalises along dim=-1 when asked for dim=0"),
    (in_place, "changes its input x in place"),
    (lambda x, dim: x.softmax(dim), "calls PyTorch's own x.softmax"),
]

BACKWARD_MUTANTS = [
    (lambda p, g, dim: p * g, "the term ⟨g, p⟩ is missing"),
    (lambda p, g, dim: g - (g * p).sum(dim=dim, keepdim=True), "the factor p is missing"),
    (lambda p, g, dim: p * (g - g.sum(dim=dim, keepdim=True)), "sums g, not g ⊙ p"),
    (lambda p, g, dim: p * (g - (g * p).sum(dim=dim)), "no keepdim=True"),
    (lambda p, g, dim: p * (g - (g * p).sum()), "over every element"),
]

BY_HAND_MUTANTS = [
    (by_hand(backward_returns_none=False), "backward returns one gradient"),
    (by_hand(forward_saves="x"), "saves the input x"),
    (by_hand(keeps_dim=False), "never set"),
    (by_hand(extra_save=True), "saves 2 tensors"),
    (by_hand(unpacks=False), "a tuple, as if it were p"),
    (CallsTorchSoftmax, "calls PyTorch's own torch.softmax"),
]


def test_the_right_steps_pass_with_one_line(capsys):
    check_naive_softmax(naive_softmax)
    check_stable_softmax(stable_softmax)
    check_softmax_backward(softmax_backward)
    check_softmax_by_hand(by_hand())
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * 4, lines


CATALOGUES = [Catalogue(check_naive_softmax, NAIVE_MUTANTS, right=naive_softmax),
              Catalogue(check_stable_softmax, STABLE_MUTANTS, right=stable_softmax),
              Catalogue(check_softmax_backward, BACKWARD_MUTANTS, right=softmax_backward),
              Catalogue(check_softmax_by_hand, BY_HAND_MUTANTS, right=by_hand())]

"""The step checks of notebook 07 pass the right steps and name each planted mistake on their first line."""

import math

import torch
import torch.nn.functional as F

from transformer_from_scratch.checks.steps.swiglu import (check_gated, check_hidden_width, check_silu_draft,
                                                          check_swiglu_draft)
from mutants import Catalogue, assert_own_verdict


def silu_draft(z):
    return z * (1 / (1 + torch.exp(-z)))


def gated(a, b, activation):
    return activation(a) * b


def swiglu_draft(x, W1, W2, W3):
    return gated(x @ W1.T, x @ W3.T, silu_draft) @ W2.T


def hidden_width(d_model, multiple_of=64):
    return math.ceil(8 * d_model / 3 / multiple_of) * multiple_of


def in_place(z):
    return z.mul_(1 / (1 + torch.exp(-z)))


SILU_MUTANTS = [
    (lambda z: 1 / (1 + torch.exp(-z)), "the factor z is missing"),
    (lambda z: z / (1 + torch.exp(z)), "the sign in the exponent is flipped"),
    (lambda z: z * torch.exp(z) / (1 + torch.exp(z)), "which overflows"),
    (lambda z: torch.relu(z), "ReLU(z)"),
    (lambda z: z + 1 / (1 + torch.exp(-z)), "adds z and σ(z)"),
    (in_place, "changes its input z in place"),
    (lambda z: z * torch.sigmoid(z), "silu_draft calls torch.sigmoid"),
    (lambda z: F.silu(z), "silu_draft calls F.silu"),
    (lambda z: silu_draft(z).sum(), "returned shape"),
    (lambda z: z / (1 + math.exp(-z)), "uses math.exp"),
    (lambda z: z / (2 + torch.exp(-z)), "differs from the expected result"),
]


GATED_MUTANTS = [
    (lambda a, b, act: act(b) * a, "the roles of a and b are swapped"),
    (lambda a, b, act: act(a * b), "applied after the product"),
    (lambda a, b, act: act(a) * act(b), "applied to both a and b"),
    (lambda a, b, act: act(a) + b, "added, not multiplied"),
    (lambda a, b, act: a * b, "there is no activation"),
    (lambda a, b, act: act(a), "the values b are missing"),
    (lambda a, b, act: torch.sigmoid(a) * b, "ignores its activation argument"),
    (lambda a, b, act: act(a) @ b.transpose(-1, -2), "returned shape"),
    (lambda a, b, act: act(a) @ b, "uses a matrix product"),
]


def _draft(gate=lambda a, b: silu_draft(a) * b, down=lambda h, W2: h @ W2.T, transposed=True):
    """swiglu_draft with the gate's formula, the last step or the weights' orientation changed (a mistake)."""
    def wrong(x, W1, W2, W3):
        a, b = (x @ W1.T, x @ W3.T) if transposed else (x @ W1, x @ W3)
        return down(gate(a, b), W2 if transposed else W2.T)
    return wrong


def w2_first(x, W1, W2, W3):
    return (silu_draft(x @ W1.T) @ W2.T) * ((x @ W3.T) @ W2.T)


def w2_on_the_gate(x, W1, W2, W3):
    return (silu_draft(x @ W1.T) @ W2.T) * (x @ W3.T)


def crashes_unless_square(x, W1, W2, W3):
    if W1.shape[0] == W1.shape[1]:
        return swiglu_draft(x, W1, W2, W3)
    return (silu_draft(x @ W1.T) * (x @ W3.T)) @ W2  # (..., d_ff) @ (d_model, d_ff)


DRAFT_MUTANTS = [
    (_draft(gate=lambda a, b: a * silu_draft(b)), "swapped in roles"),
    (_draft(gate=lambda a, b: silu_draft(a * b)), "after the product, to W1 x"),
    (lambda x, W1, W2, W3: silu_draft(((x @ W1.T) * (x @ W3.T)) @ W2.T), "applied to the output"),
    (w2_first, "applied to each path before the product"),
    (w2_on_the_gate, "applied to the gate alone"),
    (_draft(gate=lambda a, b: torch.sigmoid(a) * b), "that is GLU"),
    (_draft(gate=lambda a, b: a * b), "bilinear"),
    (_draft(gate=lambda a, b: silu_draft(a)), "W3 is never used"),
    (_draft(gate=lambda a, b: silu_draft(a) * silu_draft(b)), "applied to both paths"),
    (_draft(transposed=False), "without their transpose"),
    (_draft(down=lambda h, W2: h @ W2), "W2 is applied without its transpose"),
    (_draft(gate=lambda a, b: F.silu(a) * b), "calls PyTorch's own F.silu"),
    (crashes_unless_square, "crashes on a shape mismatch"),
]

HIDDEN_MUTANTS = [
    (lambda d, multiple_of=64: round(8 * d / 3 / multiple_of) * multiple_of, "nearest multiple"),
    (lambda d, multiple_of=64: math.floor(8 * d / 3 / multiple_of) * multiple_of, "rounds down (floor)"),
    (lambda d, multiple_of=64: 8 * d / 3, "without rounding it"),
    (lambda d, multiple_of=64: math.ceil(8 * d / 3), "up to a whole number"),
    (lambda d, multiple_of=64: math.ceil(8 * d / 3 / multiple_of), "the number of multiples"),
    (lambda d, multiple_of=64: math.ceil(8 * d / 3 / 64) * 64, "ignores multiple_of"),
    (lambda d, multiple_of=64: math.ceil(4 * d / multiple_of) * multiple_of, "starts from 4 · d_model"),
    (lambda d, multiple_of=64: (8 * d // 3 // multiple_of + 1) * multiple_of, "adds a whole multiple"),
    (lambda d, multiple_of=64: float(hidden_width(d, multiple_of)), "must be an int"),
    (lambda d, multiple_of=64: str(hidden_width(d, multiple_of)), "not a number"),
    (lambda d, multiple_of=64: 0, "returned 0, expected"),
]


def test_the_right_steps_pass_with_one_line(capsys):
    check_silu_draft(silu_draft)
    check_silu_draft(lambda z: z / (1 + torch.exp(-z)))
    check_gated(gated)
    check_swiglu_draft(swiglu_draft)
    check_swiglu_draft(lambda x, W1, W2, W3: F.linear(gated(F.linear(x, W1), F.linear(x, W3), silu_draft), W2))
    check_hidden_width(hidden_width)
    check_hidden_width(lambda d, multiple_of=64: (8 * d + 3 * multiple_of - 1) // (3 * multiple_of) * multiple_of)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * 7, lines


def test_weights_applied_to_a_column_vector_crash_with_the_fix_named():
    def column_vector(x, W1, W2, W3):  # W @ x, as for one token in the GLU example, on the rows of x
        return W2 @ gated(W1 @ x, W3 @ x, silu_draft)
    first = assert_own_verdict(check_swiglu_draft, column_vector, "crashes on a shape mismatch")
    assert "W @ x suits one column vector, not rows" in first


CATALOGUES = [Catalogue(check_silu_draft, SILU_MUTANTS, right=silu_draft),
              Catalogue(check_gated, GATED_MUTANTS, right=gated),
              Catalogue(check_swiglu_draft, DRAFT_MUTANTS, right=swiglu_draft),
              Catalogue(check_hidden_width, HIDDEN_MUTANTS, right=hidden_width)]

"""The step checks of notebook 01 pass the right steps and name each planted mistake on their first line."""

import math

import torch
import torch.nn.functional as F

from transformer_from_scratch.checks.steps.linear import check_apply_weight, check_init_weight, check_recipe_std
from mutants import Catalogue


def apply_weight(x, W):
    return x @ W.T


def recipe_std(d_in, d_out):
    return math.sqrt(2 / (d_in + d_out))


def init_weight(d_out, d_in, std, generator=None):
    weight = torch.empty(d_out, d_in)
    torch.nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-3 * std, b=3 * std, generator=generator)
    return weight


def _init(**changes):
    """init_weight with some of trunc_normal_'s arguments changed (a mistake), or the shape transposed."""
    def wrong(d_out, d_in, std, generator=None):
        shape = (d_in, d_out) if changes.get("transposed") else (d_out, d_in)
        kwargs = dict(mean=0.0, std=std, a=-3 * std, b=3 * std, generator=generator)
        kwargs.update({k: v(std) if callable(v) else v for k, v in changes.items() if k in kwargs})
        weight = torch.empty(*shape)
        torch.nn.init.trunc_normal_(weight, **kwargs)
        return weight
    return wrong


def never_filled(d_out, d_in, std, generator=None):
    return torch.empty(d_out, d_in)  # whatever the memory held: the check makes that NaN


def zeros_from_empty(d_out, d_in, std, generator=None):
    return torch.zeros(d_out, d_in)  # torch.empty often hands back zeroed memory


def not_centred(d_out, d_in, std, generator=None):
    return init_weight(d_out, d_in, std, generator) + std


APPLY_MUTANTS = [
    (lambda x, W: x @ W, "without its transpose"),
    (lambda x, W: x @ W.reshape(W.shape[1], W.shape[0]), "reshaped to (d_in, d_out)"),
    (lambda x, W: x.reshape(-1, x.shape[-1]) @ W.T, "the leading dimensions are lost"),
    (lambda x, W: F.linear(x, W), "calls PyTorch's own F.linear"),
]
STD_MUTANTS = [
    (lambda i, o: 2 / (i + o), "returns the variance"),
    (lambda i, o: math.sqrt(1 / (i + o)), "1 / (d_in + d_out) under the root"),
    (lambda i, o: math.sqrt(1 / i), "LeCun"),
    (lambda i, o: math.sqrt(2 / i), "He's"),
    (lambda i, o: math.sqrt(1 / o), "only d_out"),
    (lambda i, o: torch.tensor([1.0, 2.0]), "not a number"),
    (lambda i, o: 0.1, "not the recipe's σ"),
]
INIT_MUTANTS = [
    (_init(transposed=True), "the transpose of the layer's weight"),
    (never_filled, "as torch.empty made it"),
    (zeros_from_empty, "as torch.empty made it"),
    (_init(a=-2.0, b=2.0), "nothing was cut there"),
    (_init(a=-3.0, b=3.0), "nothing was cut there"),  # ±3 in weight units
    (_init(a=lambda s: -2 * s, b=lambda s: 2 * s), "cuts at ±2·std"),
    (_init(std=1.0, a=-3.0, b=3.0), "ignores std"),
    (_init(std=lambda s: 2 * s, a=lambda s: -6 * s, b=lambda s: 6 * s), "expected 0.987·std"),
    (not_centred, "not 0"),
    (_init(generator=None), "the generator is ignored"),
]


def test_the_right_steps_pass_with_one_line(capsys):
    check_apply_weight(apply_weight)
    check_recipe_std(recipe_std)
    check_init_weight(init_weight)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * 3, lines


CATALOGUES = [Catalogue(check_apply_weight, APPLY_MUTANTS), Catalogue(check_recipe_std, STD_MUTANTS),
              Catalogue(check_init_weight, INIT_MUTANTS, right=init_weight, exclusive=False, distinct="none",
                        ids=[f"{i}: {p}" for i, (_, p) in enumerate(INIT_MUTANTS)])]

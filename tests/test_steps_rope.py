"""The step checks of notebook 06 pass the right steps and name each planted mistake on their first line."""

import math

import pytest
import torch

from transformer_from_scratch.checks.steps.rope import (check_angle_table, check_inverse_frequencies, check_rotate_pair,
                                                        check_rotate_pairs, check_rotate_pairs_complex)
from mutants import Catalogue, assert_own_verdict


def rotate_pair(x0, x1, angle):
    c, s = math.cos(angle), math.sin(angle)
    return x0 * c - x1 * s, x0 * s + x1 * c


def inverse_frequencies(d, theta):
    return theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def angle_table(max_seq_len, d, theta):
    return torch.arange(max_seq_len, dtype=torch.float64)[:, None] * inverse_frequencies(d, theta)


def rotate_pairs(x, cos, sin):
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def rotate_pairs_complex(x, cos, sin):
    pairs = torch.view_as_complex(x.unflatten(-1, (-1, 2)).contiguous())
    return torch.view_as_real(pairs * torch.complex(cos, sin)).flatten(-2)


# Step 1 ---------------------------------------------------------------------------------------------------


def _overwrites_x0(x0, x1, angle):
    x0 = x0 * math.cos(angle) - x1 * math.sin(angle)
    x1 = x0 * math.sin(angle) + x1 * math.cos(angle)
    return x0, x1


PAIR_MUTANTS = [
    (lambda x0, x1, a: (x0 * math.cos(a) + x1 * math.sin(a), -x0 * math.sin(a) + x1 * math.cos(a)),
     "rotates clockwise"),
    (lambda x0, x1, a: (x0 * math.sin(a) - x1 * math.cos(a), x0 * math.cos(a) + x1 * math.sin(a)),
     "cos and sin are swapped"),
    (_overwrites_x0, "already rotated first one"),
    (lambda x0, x1, a: rotate_pair(x0, x1, math.radians(a)), "as degrees"),
    (lambda x0, x1, a: complex(*rotate_pair(x0, x1, a)), "not a pair of two numbers"),
    (lambda x0, x1, a: rotate_pair(x0, x1, a + 0.1), "expected ("),
]

# Step 2 ---------------------------------------------------------------------------------------------------

FREQUENCY_MUTANTS = [
    (lambda d, theta: theta ** (-torch.arange(d // 2, dtype=torch.float64) / d), "k/d instead of 2k/d"),
    (lambda d, theta: theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d), "theta^(+2k/d)"),
    (lambda d, theta: theta ** (-torch.arange(2, d + 1, 2, dtype=torch.float64) / d), "k starts at 1"),
    (lambda d, theta: theta ** (-torch.arange(0, d, dtype=torch.float64) / d), "one per coordinate"),
    (lambda d, theta: theta ** (-torch.arange(0, d, 2) / d), "computed in torch.float32"),
    (lambda d, theta: (theta ** (-torch.arange(0, d, 2) / d)).double(), "converted to float64 afterwards"),
    (lambda d, theta: inverse_frequencies(d, theta) * 1.5, "differs from the expected result"),
]

# Step 3 ---------------------------------------------------------------------------------------------------

TABLE_MUTANTS = [
    (lambda n, d, theta: angle_table(n, d, theta).T, "transposed"),
    (lambda n, d, theta: torch.arange(1, n + 1)[:, None] * inverse_frequencies(d, theta), "shifted by one"),
    (lambda n, d, theta: torch.arange(n)[:, None] * theta ** (-torch.arange(d // 2, dtype=torch.float64) / d),
     "exponent k/d"),
    (lambda n, d, theta: torch.arange(n)[:, None] * theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d),
     "theta^(+2k/d)"),
    (lambda n, d, theta: angle_table(n, d, theta).float(), "computed in torch.float32"),
    (lambda n, d, theta: (torch.arange(n)[:, None] * inverse_frequencies(d, theta).float()).double(),
     "converted to float64 afterwards"),
    (lambda n, d, theta: angle_table(n, d, theta)[:, :-1], "expected (4, 4)"),
]


def test_a_square_table_transposed_is_named_too():
    # The first case is square (4 positions, 4 pairs): the shape cannot tell, the values do.
    first = assert_own_verdict(check_angle_table, lambda n, d, theta: angle_table(n, d, theta).T, "transposed")
    assert first.startswith("the table is transposed"), first


# Steps 4 and 5 --------------------------------------------------------------------------------------------


def _half_split(x, cos, sin):
    first, second = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)


def _with_cat(x, cos, sin):
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.cat((even * cos - odd * sin, even * sin + odd * cos), dim=-1)


def _in_place(x, cos, sin):
    even, odd = x[..., 0::2].clone(), x[..., 1::2].clone()
    x[..., 0::2] = even * cos - odd * sin
    x[..., 1::2] = even * sin + odd * cos
    return x


PAIRS_MUTANTS = [
    (_half_split, "Hugging Face's layout"),
    (_with_cat, "written back with torch.cat"),
    (lambda x, cos, sin: rotate_pairs(x, cos, -sin), "rotates clockwise"),
    (lambda x, cos, sin: rotate_pairs(x, sin, cos), "cos and sin are swapped"),
    (lambda x, cos, sin: rotate_pairs(x, cos, sin).unflatten(-1, (-1, 2)), "left as (..., d/2, 2)"),
    (_in_place, "changes x in place"),
    (lambda x, cos, sin: rotate_pairs(x, cos, sin).float(), "for a torch.float64 x"),
    (lambda x, cos, sin: x, "differs from the expected result"),
]


def _pairs(x):
    return torch.view_as_complex(x.unflatten(-1, (-1, 2)).contiguous())


COMPLEX_MUTANTS = [
    (lambda x, cos, sin: _pairs(x) * torch.complex(cos, sin), "returns a complex tensor"),
    (lambda x, cos, sin: torch.view_as_real(_pairs(x) * torch.complex(cos, sin)), "left as (..., d/2, 2)"),
    (lambda x, cos, sin: torch.view_as_real(_pairs(x) * torch.complex(cos, -sin)).flatten(-2), "rotates clockwise"),
    (lambda x, cos, sin: torch.view_as_real(_pairs(x) * torch.complex(sin, cos)).flatten(-2),
     "cos and sin are swapped"),
    (lambda x, cos, sin: torch.view_as_real(_pairs(_half_split_in(x)) * torch.complex(cos, sin))
     .flatten(-2)[..., _back(x)], "Hugging Face's layout"),
    (lambda x, cos, sin: _with_cat(x, cos, sin) + 0 * _pairs(x).real.sum(), "written back with torch.cat"),
    (lambda x, cos, sin: torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (-1, 2))) * torch.complex(cos, sin))
     .flatten(-2), "two neighbours in memory"),
    (rotate_pairs, "uses no complex number"),
]


def _half_split_in(x):
    """x with its half-split pairs (x[k], x[k + d/2]) moved next to each other."""
    d = x.shape[-1]
    return x[..., torch.stack((torch.arange(d // 2), torch.arange(d // 2, d)), dim=-1).flatten()]


def _back(x):
    """The permutation that puts the half-split pairs back where they came from."""
    d = x.shape[-1]
    return torch.argsort(torch.stack((torch.arange(d // 2), torch.arange(d // 2, d)), dim=-1).flatten())


def test_the_right_steps_pass_with_one_line(capsys):
    check_rotate_pair(rotate_pair)
    check_inverse_frequencies(inverse_frequencies)
    check_angle_table(angle_table)
    check_rotate_pairs(rotate_pairs)
    check_rotate_pairs_complex(rotate_pairs_complex)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * 5, lines


def test_other_right_ways_pass():
    """Complex numbers, torch.outer, a division, einsum: the checks ask for the result, not the spelling."""
    check_rotate_pair(lambda x0, x1, a: (lambda z: (z.real, z.imag))(complex(x0, x1) * complex(math.cos(a),
                                                                                               math.sin(a))))
    check_inverse_frequencies(lambda d, theta: 1.0 / theta ** (torch.arange(d // 2, dtype=torch.float64) * 2 / d))
    check_angle_table(lambda n, d, theta: torch.outer(torch.arange(n, dtype=torch.float64),
                                                      inverse_frequencies(d, theta)))
    check_rotate_pairs(lambda x, cos, sin: torch.einsum("...kij,...kj->...ki", torch.stack(
        (torch.stack((cos, -sin), -1), torch.stack((sin, cos), -1)), -2).expand(*x.shape[:-1], -1, 2, 2),
        x.unflatten(-1, (-1, 2))).flatten(-2))
    check_rotate_pairs_complex(lambda x, cos, sin: torch.view_as_real(
        torch.complex(x[..., 0::2], x[..., 1::2]) * torch.polar(torch.ones_like(cos), torch.atan2(sin, cos))
    ).flatten(-2))


def test_the_float32_angles_are_off_by_about_1e_4_rad_at_position_4000():
    """The evidence the angle table's check gives, and the notebook's claim: float32 angles at position 4,000."""
    with pytest.raises(AssertionError) as error:
        check_angle_table(lambda n, d, theta: (torch.arange(n)[:, None]
                                               * inverse_frequencies(d, theta).float()).double())
    off = float(str(error.value).splitlines()[1].split("off by up to ")[1].split(" rad")[0])
    assert 5e-5 < off < 5e-4, str(error.value)


CATALOGUES = [Catalogue(check_rotate_pair, PAIR_MUTANTS, right=rotate_pair),
              Catalogue(check_inverse_frequencies, FREQUENCY_MUTANTS, right=inverse_frequencies),
              Catalogue(check_angle_table, TABLE_MUTANTS, right=angle_table),
              Catalogue(check_rotate_pairs, PAIRS_MUTANTS, right=rotate_pairs),
              Catalogue(check_rotate_pairs_complex, COMPLEX_MUTANTS, right=rotate_pairs_complex)]

"""Self-checks for the steps of notebook 06 (RoPE): rotating one pair, the frequencies, the angle table, rotating every
pair of a tensor at once, and the same rotation as one complex multiplication."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from .._harness import call, close, describe, diagnose, expect_tensor, fail, generator, passed

_ROTATE_FIX = ("rotate counter-clockwise: (1, 0) goes to (cos φ, sin φ) and (0, 1) to (−sin φ, cos φ), so the new "
               "first member is x0·cos φ − x1·sin φ")
_WRONG_DIRECTION = "it rotates clockwise, the wrong direction (the sign of the sin terms is flipped)"
_SWAPPED = "cos and sin are swapped"
_SWAPPED_FIX = "at angle 0 (cos = 1, sin = 0) the pair must come back unchanged: each member keeps itself through cos"


# ---------------------------------------------------------------------------------------------------------
# Step 1: one pair
# ---------------------------------------------------------------------------------------------------------

def _pair(what: str, out: Any) -> tuple[float, float]:
    """The learner's result as two floats, or a verdict saying what came back."""
    try:
        first, second = out
        return float(first), float(second)
    except Exception:  # noqa: BLE001 - whatever it is, it is not two numbers
        fail(f"{what} returned {describe(out)}, not a pair of two numbers",
             "return the rotated pair as a tuple (x0', x1')")


def check_rotate_pair(rotate_pair: Callable[[float, float, float], tuple[float, float]]) -> None:
    """Check ``rotate_pair(x0, x1, angle)``: (x0, x1) rotated counter-clockwise by ``angle`` radians.

    Mistakes it recognises: the wrong direction (clockwise: the sin terms' signs flipped); cos and sin swapped; the
    second member computed from the already rotated first member (x0 overwritten first); the angle read as degrees.
    """
    cases = [(1.0, 2.0, math.pi / 2), (0.3, -1.2, 0.7), (2.0, 0.5, 2.5), (-1.5, 0.8, -1.1), (0.6, 1.7, 7.9)]
    for x0, x1, angle in cases:
        what = f"rotate_pair({x0}, {x1}, {angle:.4g})"
        got = _pair(what, call(what, rotate_pair, x0, x1, angle))
        c, s = math.cos(angle), math.sin(angle)
        right = (x0 * c - x1 * s, x0 * s + x1 * c)
        first = x0 * c - x1 * s
        cd, sd = math.cos(math.radians(angle)), math.sin(math.radians(angle))
        variants = [
            ((x0 * c + x1 * s, -x0 * s + x1 * c), _WRONG_DIRECTION, _ROTATE_FIX),
            ((x0 * s - x1 * c, x0 * c + x1 * s), _SWAPPED, _SWAPPED_FIX),
            ((first, first * s + x1 * c), "the second member is computed from the already rotated first one "
             "(x0 was overwritten before its second use)", "compute both new members from the original x0 and x1, "
             "for example in one return statement"),
            ((x0 * cd - x1 * sd, x0 * sd + x1 * cd), "it reads the angle as degrees",
             "the angle is in radians, as math.cos and math.sin expect: pass it as it is"),
        ]
        if _same(got, right):
            continue
        shown = f"{what} returned ({got[0]:.4f}, {got[1]:.4f}), expected ({right[0]:.4f}, {right[1]:.4f})"
        for wrong, mistake, fix in variants:
            if _same(got, wrong) and not _same(wrong, right):
                fail(mistake, fix, shown)
        fail(shown, _ROTATE_FIX)
    passed("rotate_pair: counter-clockwise by the angle in radians, on 5 pairs with angles from −1.1 to 7.9 rad")


def _same(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return all(math.isclose(u, v, rel_tol=1e-6, abs_tol=1e-6) for u, v in zip(a, b))


# ---------------------------------------------------------------------------------------------------------
# Steps 2 and 3: the frequencies and the angle table, in float64
# ---------------------------------------------------------------------------------------------------------

def _frequencies(d: int, theta: float, first: int = 0, step: int = 2, sign: int = -1) -> Tensor:
    """theta^(sign·j/d) for j = first, first + step, … (d/2 values): the right one is first=0, step=2, sign=-1."""
    j = torch.arange(d // 2, dtype=torch.float64) * step + first
    return theta ** (sign * j / d)


_FREQUENCY_VARIANTS = [
    (dict(step=1), "the exponent is k/d instead of 2k/d",
     "pair k turns by theta^(−2k/d) per token: the exponents are 0, 2/d, 4/d, … up to (d − 2)/d"),
    (dict(sign=1), "the frequencies are theta^(+2k/d) instead of theta^(−2k/d): the last pairs spin fastest, not "
                   "slowest",
     "flip the exponent's sign: pair 0 turns by 1 radian per token and the others ever more slowly"),
    (dict(first=2), "k starts at 1 instead of 0, so no pair turns by 1 radian per token",
     "k runs over 0 … d/2 − 1: the exponents start at 0"),
]


def _precision(what: str, out: Tensor, expected: Tensor, fix: str, evidence: str = "") -> None:
    """The values are right to float32's precision: fail if they were computed in float32 (dtype, or values)."""
    if out.dtype != torch.float64:
        fail(f"{what} is computed in {out.dtype}, not float64", fix, evidence)
    if not close(out, expected, rtol=1e-12, atol=0.0):
        error = (out - expected).abs().max().item()
        fail(f"{what} is computed in float32 and converted to float64 afterwards: its values are off by up to "
             f"{error:.2g}, float32's rounding", "compute in float64 from the start (create the first tensor "
             "with dtype=torch.float64): converting afterwards cannot bring the lost digits back", evidence)


def check_inverse_frequencies(inverse_frequencies: Callable[[int, float], Tensor]) -> None:
    """Check ``inverse_frequencies(d, theta)``: the (d/2,) float64 tensor theta^(−2k/d), k = 0 … d/2 − 1.

    Mistakes it recognises: the exponent k/d instead of 2k/d; theta^(+2k/d) (the sign); k starting at 1; one entry per
    coordinate (d) instead of one per pair (d/2); computed in float32 (a float32 result, or float32 values converted
    to float64 afterwards).
    """
    fix = "pair k turns by theta^(−2k/d) radians per token, k = 0 … d/2 − 1"
    for d, theta in [(16, 10000.0), (8, 500.0), (128, 10000.0)]:
        what = f"inverse_frequencies({d}, {theta:g})"
        out = call(what, inverse_frequencies, d, theta)
        if isinstance(out, Tensor) and tuple(out.shape) == (d,):
            fail(f"{what} has {d} entries, one per coordinate, instead of d/2 = {d // 2}, one per pair",
                 "k counts the pairs (x[2k], x[2k+1]): 0 … d/2 − 1")
        out = expect_tensor(what, out, (d // 2,), f"return a tensor of d/2 = {d // 2} frequencies, one per pair")
        expected = _frequencies(d, theta)
        variants = [(_frequencies(d, theta, **change), mistake, variant_fix)
                    for change, mistake, variant_fix in _FREQUENCY_VARIANTS]
        shown = (f"yours start {[round(v, 5) for v in out[:3].tolist()]}, "
                 f"expected {[round(v, 5) for v in expected[:3].tolist()]}")
        diagnose(what, out.detach().double(), expected, variants, fix, rtol=1e-5, atol=0.0, evidence=shown)
        _precision(what, out.detach(), expected, "create the exponents in float64 (dtype=torch.float64): the angles "
                   "i·theta^(−2k/d) at positions in the thousands need its precision")
    passed("inverse_frequencies: theta^(−2k/d) for k = 0 … d/2 − 1, in float64, for d = 8, 16, 128 and two "
           "thetas")


def check_angle_table(angle_table: Callable[[int, int, float], Tensor]) -> None:
    """Check ``angle_table(max_seq_len, d, theta)``: the (max_seq_len, d/2) float64 table θ_{i,k} = i·theta^(−2k/d).

    Mistakes it recognises: the table transposed, (d/2, max_seq_len) (also when square); positions shifted by one
    (1 … max_seq_len instead of 0 … max_seq_len − 1); wrong frequencies (the exponent k/d, or +2k/d); computed in
    float32 (off by about 1e-4 rad at position 4,000).
    """
    fix = ("row i holds position i times every frequency of your Step 2: the outer product of the positions "
           "0 … max_seq_len − 1 and inverse_frequencies(d, theta)")
    for max_seq_len, d, theta in [(4, 8, 100.0), (6, 4, 500.0), (4096, 128, 10000.0)]:  # square first: it hides a .T
        what = f"angle_table({max_seq_len}, {d}, {theta:g})"
        out = call(what, angle_table, max_seq_len, d, theta)
        shape = (max_seq_len, d // 2)
        if isinstance(out, Tensor) and tuple(out.shape) == shape[::-1] != shape:
            fail(f"{what} returned shape {tuple(out.shape)}, the table transposed",
                 "one row per position, one column per pair: (max_seq_len, d/2)")
        out = expect_tensor(what, out, shape, "one row per position, one column per pair: (max_seq_len, d/2)")
        positions = torch.arange(max_seq_len, dtype=torch.float64)[:, None]
        frequencies = _frequencies(d, theta)
        expected = positions * frequencies
        variants = [
            (expected.T, "the table is transposed: rows are pairs and columns positions",
             "one row per position, one column per pair: (max_seq_len, d/2)"),
            ((positions + 1) * frequencies, "the positions are shifted by one (1 … max_seq_len instead of 0 … "
             "max_seq_len − 1): the token at position 0 must not be rotated",
             "start the positions at 0: row i is position i"),
            (positions * _frequencies(d, theta, step=1), "the columns' frequencies use the exponent k/d instead of "
             "2k/d", "use your checked Step 2, inverse_frequencies(d, theta), for the columns"),
            (positions * _frequencies(d, theta, sign=1), "the columns' frequencies are theta^(+2k/d) instead of "
             "theta^(−2k/d)", "use your checked Step 2, inverse_frequencies(d, theta), for the columns"),
        ]
        diagnose(what, out.detach().double(), expected, variants, fix, rtol=1e-5, atol=1e-5)
        if max_seq_len < 4000:
            continue  # float32's rounding shows at large positions: checked on the last case
        at = 4000
        _precision(what, out.detach(), expected, "multiply float64 positions (or integers) by the float64 frequencies "
                   "of Step 2, and keep the result in float64: float32 numbers near 4,000 are 2.4e-4 apart",
                   f"at position {at}, yours are off by up to "
                   f"{(out[at].detach().double() - expected[at]).abs().max():.2g} rad")
    passed("angle_table: (max_seq_len, d/2), row i = i · theta^(−2k/d), in float64 (exact at position 4,000, "
           "d = 128)")


# ---------------------------------------------------------------------------------------------------------
# Steps 4 and 5: every pair at once, real-valued and complex
# ---------------------------------------------------------------------------------------------------------

def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The reference: pair k = (x[2k], x[2k+1]) rotated by the angle whose cos and sin are given, laid out again."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def _half_split(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Hugging Face's layout: pair k is (x[k], x[k + d/2]), and the result is written back the same way."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)


def _written_back_with_cat(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    rotated = _rotate(x, cos, sin)
    return torch.cat((rotated[..., 0::2], rotated[..., 1::2]), dim=-1)


_HALF_SPLIT = ("it rotates half-split pairs (x[k], x[k + d/2]), Hugging Face's layout (see Pitfalls), instead of the "
               "interleaved pairs (x[2k], x[2k+1])")
_HALF_SPLIT_FIX = ("pair k is coordinates 2k and 2k + 1, neighbours: take the members from the even and the odd "
                   "coordinates")
_CAT = ("the rotated pairs are written back with torch.cat (all the first members, then all the second ones) "
        "instead of interleaved")
_CAT_FIX = ("put pair k back at 2k and 2k + 1: stack the two rotated members on a new last dimension, then flatten "
            "the last two dimensions")


def _rotation_variants(x: Tensor, cos: Tensor, sin: Tensor, direction_fix: str) -> list[tuple[Tensor, str, str]]:
    return [
        (_half_split(x, cos, sin), _HALF_SPLIT, _HALF_SPLIT_FIX),
        (_written_back_with_cat(x, cos, sin), _CAT, _CAT_FIX),
        (_rotate(x, cos, -sin), _WRONG_DIRECTION, direction_fix),
        (_rotate(x, sin, cos), _SWAPPED, _SWAPPED_FIX),
    ]


def _cases(gen: torch.Generator) -> list[tuple[Tensor, Tensor, Tensor]]:
    """(x, cos, sin) in float64: x (seq, d) with one angle per token and pair, then x with leading dimensions and the
    angles (seq, d/2) broadcast over them."""
    cases = []
    for x_shape, angle_shape in [((5, 8), (5, 4)), ((2, 3, 5, 8), (5, 4)), ((3, 4, 12), (3, 4, 6))]:
        x = torch.randn(x_shape, generator=gen, dtype=torch.float64)
        angles = torch.rand(angle_shape, generator=gen, dtype=torch.float64) * 2 * math.pi
        cases.append((x, angles.cos(), angles.sin()))
    return cases


def _shapes(x: Tensor, cos: Tensor) -> str:
    return f"x {tuple(x.shape)}, cos and sin {tuple(cos.shape)}"


def _expect_rotated(what: str, out: Any, x: Tensor) -> Tensor:
    if isinstance(out, Tensor) and tuple(out.shape) == (*x.shape[:-1], x.shape[-1] // 2, 2):
        fail(f"{what} returned shape {tuple(out.shape)}: the rotated pairs are left as (..., d/2, 2)",
             "flatten the last two dimensions, so that pair k lies at 2k and 2k + 1 of a (..., d) result")
    out = expect_tensor(what, out, tuple(x.shape), "the result has x's shape: every pair rotated in its place")
    if out.dtype != x.dtype:
        fail(f"{what} returned {out.dtype} for a {x.dtype} x", "keep x's dtype: cos and sin have it too, so "
             "nothing needs converting")
    return out


def check_rotate_pairs(rotate_pairs: Callable[[Tensor, Tensor, Tensor], Tensor]) -> None:
    """Check ``rotate_pairs(x, cos, sin)``: every pair (x[..., 2k], x[..., 2k+1]) rotated by the angle whose cos and
    sin are cos[..., k] and sin[..., k], written back at 2k and 2k + 1. x (..., d); cos and sin (..., d/2), broadcast.

    Mistakes it recognises: half-split pairs (x[k], x[k + d/2]) (Hugging Face's layout); the pairs written back with
    torch.cat (first members, then second members) instead of interleaved; the wrong direction; cos and sin swapped;
    the pairs left as (..., d/2, 2); x changed in place.
    """
    for x, cos, sin in _cases(generator(0)):
        what = f"rotate_pairs({_shapes(x, cos)})"
        before = x.clone()
        out = call(what, rotate_pairs, x, cos, sin)
        if not torch.equal(x, before):
            fail(f"{what} changes x in place", "build the result as a new tensor and leave x as it was: x is the "
                 "caller's queries or keys (and autograd refuses to write into a tensor it still needs)")
        out = _expect_rotated(what, out, x)
        diagnose(what, out, _rotate(x, cos, sin), _rotation_variants(x, cos, sin, _ROTATE_FIX),
                 "pair k, the neighbours 2k and 2k + 1, turns by its own angle k, as your Step 1 turns one pair: find "
                 "the part of yours that differs")
    passed("rotate_pairs: interleaved pairs rotated counter-clockwise, each written back at 2k, 2k + 1, with and "
           "without leading dimensions, cos and sin broadcast")


class _ComplexSpy(TorchFunctionMode):
    """Records whether any PyTorch operation inside the block produced a complex tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.complex = False

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        result = func(*args, **(kwargs or {}))
        if isinstance(result, Tensor) and result.is_complex():
            self.complex = True
        return result


def check_rotate_pairs_complex(rotate_pairs_complex: Callable[[Tensor, Tensor, Tensor], Tensor]) -> None:
    """Check ``rotate_pairs_complex(x, cos, sin)``: the rotation of ``rotate_pairs``, computed by reading pair k as the
    complex number x[2k] + i·x[2k+1] and multiplying it by cos + i·sin; also on an x that is a transposed view.

    Mistakes it recognises: a complex tensor returned (not turned back into real pairs); the pairs left as
    (..., d/2, 2); multiplying by cos − i·sin (the wrong direction); sin + i·cos (cos and sin swapped); half-split
    pairs; the pairs written back half-split; a crash on an x whose pairs are not neighbours in memory (view_as_complex
    needs them contiguous); no complex number used at all.
    """
    gen = generator(1)
    cases = _cases(gen)
    base = torch.randn(2, 8, 5, generator=gen, dtype=torch.float64)
    angles = torch.rand(5, 4, generator=gen, dtype=torch.float64) * 2 * math.pi
    cases.append((base.transpose(-1, -2), angles.cos(), angles.sin()))  # x (2, 5, 8), its last stride 5
    direction_fix = "multiply by cos + i·sin, the unit complex number at the angle, not by cos − i·sin"
    for x, cos, sin in cases:
        view = "" if x.is_contiguous() else " (x a transposed view)"
        what = f"rotate_pairs_complex({_shapes(x, cos)}){view}"
        spy = _ComplexSpy()
        try:
            with spy:
                out = call(what, rotate_pairs_complex, x, cos, sin)
        except AssertionError as verdict:
            cause = verdict.__cause__
            if not x.is_contiguous() and isinstance(cause, RuntimeError) and "stride" in str(cause):
                fail(f"{what} fails: view_as_complex needs each pair as two neighbours in memory, and x is a "
                     "transposed view", "make the pairs contiguous (.contiguous()) before torch.view_as_complex; "
                     "it copies only when it must", f"the error: {str(cause).splitlines()[0]}")
            raise
        if isinstance(out, Tensor) and out.is_complex():
            fail(f"{what} returns a complex tensor {tuple(out.shape)}",
                 "turn it back into real pairs with torch.view_as_real, then flatten the last two dimensions")
        out = _expect_rotated(what, out, x)
        variants = _rotation_variants(x, cos, sin, direction_fix)
        variants[1] = (variants[1][0], _CAT, "torch.view_as_real gives (..., d/2, 2), each pair in its place: "
                       "flatten the last two dimensions, no torch.cat")
        diagnose(what, out, _rotate(x, cos, sin), variants,
                 "a rotation by θ is a multiplication by cos θ + i·sin θ, with pair k read as the complex number "
                 "x_2k + i·x_2k+1: find the part of yours that differs")
        if not spy.complex:
            fail(f"{what} is right but uses no complex number: this is Step 4 again",
                 "read each pair as one complex number (torch.view_as_complex) and multiply it by cos + i·sin "
                 "(torch.complex builds it)")
    passed("rotate_pairs_complex: one complex multiplication per pair, the same rotation as rotate_pairs, also on a "
           "transposed view of x")

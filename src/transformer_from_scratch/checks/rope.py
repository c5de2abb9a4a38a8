"""``check_rope``: the learner's ``RotaryPositionalEmbedding`` (notebook 06) against an independent rotation
written with complex numbers (``torch.polar``), its tables, its buffers, its gradients and half precision."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn

from .. import reference
from ._harness import (call, call_for_tensor, check_signature, close, construct, crash_of, describe, fail, first_line,
                       generator, passed)

_NAME = "RotaryPositionalEmbedding"
_THETA, _D_K, _MAX_SEQ_LEN = 10000.0, 16, 64
# Generous for float32 tables: an angle of ~60 radians is itself only good to a few 1e-6 in float32.
_TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
_PAIRS = "(x[2k], x[2k+1])"

Variant = Callable[[Tensor, Tensor, float], Tensor]


# ---------------------------------------------------------------------------------------------------------
# The reference and the classic wrong variants, in float64 on the CPU
# ---------------------------------------------------------------------------------------------------------

def _frequencies(d_k: int, theta: float, exponent: Callable[[Tensor, int], Tensor]) -> Tensor:
    k = torch.arange(d_k // 2, dtype=torch.float64)
    return theta ** exponent(k, d_k)


def _right_exponent(k: Tensor, d_k: int) -> Tensor:
    return -2 * k / d_k


def _angles(positions: Tensor, d_k: int, theta: float, exponent=_right_exponent) -> Tensor:
    """(..., seq, d_k/2): position i times the frequency of pair k."""
    return positions.double()[..., None] * _frequencies(d_k, theta, exponent)


def _rotate_complex(x: Tensor, angles: Tensor) -> Tensor:
    """Pair k = (x[2k], x[2k+1]) read as the complex number x[2k] + i·x[2k+1], times e^{i·angle} (float64, CPU)."""
    return reference.rotate_by(x.detach().cpu().double(), angles.cpu())


def _reference(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    return _rotate_complex(x, _angles(positions.cpu(), x.shape[-1], theta))


def _half_split(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Pairs (x[k], x[k + d_k/2]), as Hugging Face's Llama (rotate_half) does."""
    d_k = x.shape[-1]
    to_interleaved = torch.stack((torch.arange(d_k // 2), torch.arange(d_k // 2, d_k)), dim=-1).flatten()
    out = torch.empty(x.shape, dtype=torch.float64)
    out[..., to_interleaved] = _reference(x[..., to_interleaved], positions, theta)
    return out


def _rotate_half_with_interleaved_tables(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Hugging Face's x·cos + rotate_half(x)·sin, with cos and sin repeated for interleaved pairs: two layouts mixed."""
    x = x.detach().cpu().double()
    angles = _angles(positions.cpu(), x.shape[-1], theta).repeat_interleave(2, dim=-1)
    first, second = x.chunk(2, dim=-1)
    return x * angles.cos() + torch.cat((-second, first), dim=-1) * angles.sin()


def _written_back_half_split(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """The right pairs, rotated right, but returned as torch.cat((evens, odds)) instead of interleaved."""
    rotated = _reference(x, positions, theta)
    return torch.cat((rotated[..., 0::2], rotated[..., 1::2]), dim=-1)


def _wrong_direction(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    return _rotate_complex(x, -_angles(positions.cpu(), x.shape[-1], theta))


def _exponent_k_over_d(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    return _rotate_complex(x, _angles(positions.cpu(), x.shape[-1], theta, lambda k, d: -k / d))


def _positive_exponent(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    return _rotate_complex(x, _angles(positions.cpu(), x.shape[-1], theta, lambda k, d: 2 * k / d))


def _positions_ignored(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    return _reference(x, torch.arange(x.shape[-2]).expand(positions.shape), theta)


def _positions_plus_one(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    return _reference(x, positions + 1, theta)


def _positions_minus_one(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    return _reference(x, positions - 1, theta)


def _theta_ignored(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    return _reference(x, positions, 10000.0)


_VARIANTS: list[tuple[Variant, str, str]] = [
    (_half_split, f"it rotates half-split pairs (x[k], x[k + d_k/2]), as Hugging Face's Llama does, instead of "
                  f"the interleaved pairs {_PAIRS} the course fixes",
     "pair k is the neighbours 2k and 2k + 1: take its members from the even and the odd coordinates, and write "
     "the result back interleaved"),
    (_rotate_half_with_interleaved_tables,
     "it mixes two layouts: Hugging Face's rotate_half pairs x[k] with x[k + d_k/2], while cos and sin are repeated "
     "for "
     "the interleaved pairs (x[2k], x[2k+1]), so the two members of a pair turn by different angles",
     "use the course's layout throughout: the pairs are the neighbours 2k and 2k + 1, each with one cos and one "
     "sin, written back at 2k and 2k + 1"),
    (_written_back_half_split, "the rotated pairs are written back half-split (all the first members, then all the "
                               "second members, as torch.cat does) instead of interleaved",
     "put each rotated pair back where it came from, at 2k and 2k + 1: the members interleave, they are not "
     "concatenated"),
    (_wrong_direction, "it rotates in the wrong direction (the sign of sin is flipped)",
     "rotate counter-clockwise: x'[2k] = x[2k]·cos − x[2k+1]·sin, x'[2k+1] = x[2k]·sin + x[2k+1]·cos"),
    (_exponent_k_over_d, "the frequencies use the exponent k/d_k instead of 2k/d_k",
     "pair k turns by theta^(-2k/d_k) per token: the exponents 2k/d_k run 0, 2/d_k, 4/d_k, … up to (d_k − 2)/d_k"),
    (_positive_exponent, "the frequencies are theta^(+2k/d_k) instead of theta^(-2k/d_k), so the last pairs spin "
                         "fastest instead of slowest",
     "pair k turns by theta^(-2k/d_k) per token: 1 for the first pair, ever slower after it"),
    (_positions_ignored, "it ignores token_positions and rotates the tokens by 0, 1, 2, … (their index in x)",
     "a token turns by the angles of its own position, the one token_positions gives, not by its index in x"),
    (_positions_plus_one, "the positions are shifted by one: the token at position i is rotated by the angles of "
                          "position i + 1 (a table built from torch.arange(1, max_seq_len + 1), or positions + 1)",
     "row i of the tables holds position i's angles, for every position 0 … max_seq_len − 1: look them up with "
     "token_positions as they are"),
    (_positions_minus_one, "the positions are shifted by one: the token at position i is rotated by the angles of "
                           "position i - 1",
     "row i of the tables holds position i's angles, for every position 0 … max_seq_len − 1: look them up with "
     "token_positions as they are"),
    (_theta_ignored, "it ignores theta and always uses 10000",
     "build the frequencies from the theta passed to __init__"),
]


# ---------------------------------------------------------------------------------------------------------
# Running the learner's module
# ---------------------------------------------------------------------------------------------------------

def _shapes(x: Tensor, positions: Tensor) -> str:
    return f"x {tuple(x.shape)}, token_positions {tuple(positions.shape)}"


def _build(impl: type, theta: float = _THETA, d_k: int = _D_K, max_seq_len: int = _MAX_SEQ_LEN,
           **kwargs: Any) -> nn.Module:
    return construct(_NAME, impl, theta, d_k, max_seq_len, **kwargs)


def _run(rope: nn.Module, x: Tensor, positions: Tensor) -> Tensor:
    """The learner's output, checked to be one tensor of x's shape and dtype."""
    what = f"forward({_shapes(x, positions)})"
    out = call_for_tensor(what, rope, x, positions, returns="return the rotated x, of the same shape as x")
    if out.shape != x.shape:
        fail(f"{what} returned shape {tuple(out.shape)}, expected x's shape {tuple(x.shape)}",
             "rotate the pairs in place of x: same leading dimensions, same seq, same d_k "
             "(the leading dimensions of token_positions broadcast against x's)")
    if out.dtype != x.dtype:
        fail(f"{what} returned {out.dtype} for a {x.dtype} input: multiplying by the float32 tables promoted it",
             "compute in x's dtype promoted with float32 (torch.promote_types) and cast the result back to x.dtype")
    return out


def _compare(rope: nn.Module, x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """The learner's output on (x, positions); fail naming the wrong variant it matches, if any."""
    out = _run(rope, x, positions)
    expected = _reference(x, positions, theta)
    if close(out.double(), expected, **_TOLERANCE):
        return out
    for variant, mistake, fix in _VARIANTS:
        wrong = variant(x, positions, theta)
        if not close(wrong, expected, **_TOLERANCE) and close(out.double(), wrong, **_TOLERANCE):
            fail(mistake, fix, f"on {_shapes(x, positions)}, theta={theta}: your output matches that variant")
    if _keeps_half_split_pair_lengths(out, x):
        fail(_VARIANTS[0][1], _VARIANTS[0][2], f"on {_shapes(x, positions)}: each pair (x[k], x[k + d_k/2]) keeps its "
             "length, as a rotation of that pair would, but the pairs (x[2k], x[2k+1]) do not")
    if close(out.double(), x.double(), **_TOLERANCE):
        fail("it returns x unchanged (nothing is rotated)",
             "rotate each pair (x[2k], x[2k+1]) by the angle i / theta^(2k/d_k) of its token's position i")
    diff = (out.detach().double().cpu() - expected).abs().nan_to_num(nan=float("inf")).max().item()
    fail(f"the output differs from the rotation by up to {diff:.3g} on {_shapes(x, positions)}, theta={theta}",
         f"rotate each pair {_PAIRS} of the token at position i by i / theta^(2k/d_k), k = 0 … d_k/2 - 1",
         f"first token, expected {[round(v, 4) for v in expected.reshape(-1, x.shape[-1])[0].tolist()]}, "
         f"yours {[round(v, 4) for v in out.detach().reshape(-1, x.shape[-1])[0].double().tolist()]}")


def _pair_lengths(t: Tensor, half_split: bool) -> Tensor:
    t = t.detach().double().cpu()
    d = t.shape[-1]
    first, second = (t[..., : d // 2], t[..., d // 2:]) if half_split else (t[..., 0::2], t[..., 1::2])
    return torch.hypot(first, second)


def _keeps_half_split_pair_lengths(out: Tensor, x: Tensor) -> bool:
    """Whether ``out`` rotates the half-split pairs (x[k], x[k + d_k/2]), whatever the angles: a rotation keeps the
    length of every pair it rotates, and only of those."""
    if out.shape != x.shape or not torch.isfinite(out.detach()).all():
        return False
    keeps = close(_pair_lengths(out, True), _pair_lengths(x, True), **_TOLERANCE)
    return keeps and not close(_pair_lengths(out, False), _pair_lengths(x, False), **_TOLERANCE)


def _check_float64_angles(impl: type, gen: torch.Generator) -> None:
    """Positions far into a long table: the angles must be computed in float64 (in float32 they are ~1e-4 rad off)."""
    max_seq_len, d_k = 8192, 16
    rope = _build(impl, d_k=d_k, max_seq_len=max_seq_len)
    positions = torch.tensor([0, 1, 2047, 4096, 8000, 8191])
    x = torch.randn(positions.shape[0], d_k, generator=gen, dtype=torch.float64)
    out = _run(rope, x, positions).double()
    expected = _reference(x, positions, _THETA)
    precise = {"rtol": 2e-5, "atol": 2e-5}  # float32 tables of float64 angles: a few 1e-7
    if close(out, expected, **precise):
        return
    k = torch.arange(0, d_k, 2, dtype=torch.float32)
    angles32 = positions.float()[:, None] * _THETA ** (-k / d_k)  # every step in float32
    if close(out, _rotate_complex(x, angles32.double()), rtol=1e-5, atol=1e-5):
        error = (angles32.double() - reference.rope_angles(positions, d_k, _THETA)).abs().max().item()
        fail(f"the angles are computed in float32: at position 8000 they are off by up to {error:.1g} rad, and so is "
             "every rotation there", "compute the frequencies and the angles in float64, take cos and sin, and "
             "only then store the tables in float32",
             f"max_seq_len={max_seq_len}, positions {positions.tolist()}")
    diff = (out - expected).abs().max().item()
    fail(f"the output differs from the rotation by up to {diff:.3g} at positions up to {max_seq_len - 1} "
         f"(max_seq_len={max_seq_len})", "compute the angles in float64 and store cos and sin as float32 tables",
         f"positions {positions.tolist()}")


def _check_structure(impl: type) -> nn.Module:
    """No parameters, nothing in the state dict, tables registered as buffers (so .to() moves them)."""
    check_signature(impl, ["theta", "d_k", "max_seq_len", "device"], _NAME)
    rope = _build(impl)
    if not isinstance(rope, nn.Module):
        fail(f"{_NAME}(...) built {describe(rope)}, not an nn.Module", "subclass torch.nn.Module")
    parameters = [name for name, _ in rope.named_parameters()]
    if parameters:
        fail(f"{_NAME} has learnable parameters {parameters}, but RoPE's angles are fixed by the formula",
             "store the cos/sin tables as non-persistent buffers (register_buffer, persistent=False), not as "
             "nn.Parameter")
    saved = list(rope.state_dict())
    if saved:
        fail(f"{_NAME} saves {saved} in its state dict, so the course's checkpoints no longer load with strict=True",
             "register the tables with register_buffer(..., persistent=False): they are rebuilt from the formula")
    buffers = {id(b) for b in rope.buffers()}
    plain = [name for name, value in vars(rope).items() if isinstance(value, Tensor) and id(value) not in buffers]
    if plain:
        fail(f"the tables {plain} are plain tensor attributes, so model.to('cuda') leaves them behind on the CPU",
             "register them as non-persistent buffers (register_buffer, persistent=False): buffers follow .to()")
    meta = _build(impl, device="meta")
    elsewhere = [name for name, b in meta.named_buffers() if b.device.type != "meta"]
    if elsewhere:
        fail(f"{_NAME} ignores its device argument ({elsewhere[0]} was created on "
             f"{dict(meta.named_buffers())[elsewhere[0]].device})",
             "create the tables there: .to(device) them (or pass device=device) before register_buffer")
    return rope


def _check_every_position(impl: type, gen: torch.Generator) -> None:
    """Positions up to max_seq_len - 1 work, for a max_seq_len larger than d_k and than the defaults."""
    max_seq_len = 200
    rope = _build(impl, max_seq_len=max_seq_len)
    positions = torch.tensor([0, 1, max_seq_len // 2, max_seq_len - 2, max_seq_len - 1])
    x = torch.randn(positions.shape[0], _D_K, generator=gen)
    try:
        _compare(rope, x, positions, _THETA)
    except AssertionError as error:
        cause = crash_of(error)
        if isinstance(cause, (IndexError, RuntimeError)) and "index" in str(cause).lower():
            fail(f"the tables do not cover every position 0 … max_seq_len - 1 (here max_seq_len={max_seq_len})",
                 "build one row per position, 0 … max_seq_len − 1",
                 f"positions {positions.tolist()} raised {type(cause).__name__}: {cause}")
        raise


def _check_gradients(rope: nn.Module, gen: torch.Generator) -> None:
    """The gradient reaching x is the reference's (the inverse rotation of the upstream gradient)."""
    x = torch.randn(2, 6, _D_K, generator=gen, dtype=torch.float64).requires_grad_()
    positions = torch.randint(0, _MAX_SEQ_LEN, (2, 6), generator=gen)
    out = _run(rope, x, positions)
    upstream = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    if out.requires_grad:
        call(f"the backward pass of forward({_shapes(x, positions)})", lambda: (out * upstream).sum().backward())
    if x.grad is None:
        fail("no gradient reaches x", "do not .detach() or use .data / torch.no_grad() in forward: "
             "the queries' and keys' projections learn through this rotation")
    expected = _rotate_complex(upstream, -_angles(positions, _D_K, _THETA))  # a rotation's transpose undoes it
    if not close(x.grad, expected, **_TOLERANCE):
        fail("the gradient of x differs from the rotation's", "build the output from differentiable torch "
             "operations on x only (no in-place changes of x)", f"on {_shapes(x, positions)}")


def _check_half(rope: nn.Module, gen: torch.Generator) -> None:
    """bfloat16 and float16 inputs keep their dtype and are rotated to within a few rounding steps."""
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(3, 8, _D_K, generator=gen).to(dtype)
        positions = torch.randint(0, _MAX_SEQ_LEN, (8,), generator=gen)
        out = _run(rope, x, positions)
        tolerance = 5 * torch.finfo(dtype).eps
        if not close(out.double(), _reference(x, positions, _THETA), rtol=tolerance, atol=tolerance):
            mistake = f"{dtype} inputs are rotated wrongly (more than a few rounding steps off)"
            if close(out.double(), _rotate_complex(x, _angles(positions, _D_K, _THETA).to(dtype).double()),
                     rtol=tolerance, atol=tolerance):
                off = 16 * torch.finfo(dtype).eps  # half a rounding step at 32 … 64
                mistake = (f"the angles are rounded to {dtype} before cos and sin (an angle near 60 radians is then "
                           f"off by up to {off:.3g})")
            fail(mistake, "compute the angles and their cos and sin in float32 (or float64), and cast only the "
                 "looked-up cos and sin to x's dtype", f"on {_shapes(x, positions)}")


def _check_range_positions(rope: nn.Module, gen: torch.Generator) -> None:
    """token_positions as range(start, stop), as attention (notebook 08) and the KV cache (12) pass consecutive
    positions: the rotation of those positions, with no tensor of them ever made."""
    x = torch.randn(2, 3, 5, _D_K, generator=gen)
    what = f"forward(x of shape {tuple(x.shape)}, token_positions=range(7, 12))"
    fix = ("index the tables with what _checked_positions returns (a tensor, or a slice for a range), and use nothing "
           "else of token_positions: attention passes range(seq) for its default positions")
    try:
        out = call(what, rope, x, range(7, 12))
    except AssertionError as error:
        if "raised" not in str(error).splitlines()[0]:
            raise
        fail(f"{what} fails", fix, str(error).splitlines()[0])
    expected = _reference(x, torch.arange(7, 12), _THETA)
    if not isinstance(out, Tensor) or out.shape != x.shape or not close(out.double(), expected, **_TOLERANCE):
        fail(f"{what} is not the rotation of positions 7 … 11", fix)


_ALIGNMENT_FIX = ("view_as_complex reads each pair where it lies, as one complex number, so it needs the pairs aligned "
                  "in memory (last stride 1, every other stride and the storage offset even); when x's layout breaks "
                  "that, copy x into fresh memory first (x.contiguous() returns an already contiguous view as it is, "
                  "odd offset and all)")


def _check_views(rope: nn.Module, gen: torch.Generator) -> None:
    """x handed over as a view of other memory: at an odd storage offset (big[1:].view(...)), and transposed."""
    positions = torch.tensor([5, 17, 0, 63, 17, 2, 40])
    big = torch.randn(1 + 3 * 7 * _D_K, generator=gen)
    cases = [("a contiguous view with an odd storage offset, big[1:].view(3, 7, d_k)", big[1:].view(3, 7, _D_K)),
             ("a transposed view, (7, 3, d_k).transpose(0, 1)", torch.randn(7, 3, _D_K, generator=gen).transpose(0, 1))]
    for name, x in cases:
        try:
            _compare(rope, x, positions, _THETA)
        except AssertionError as error:
            cause = crash_of(error)
            if cause is None:
                raise
            fail(f"forward crashes on x as {name} ({type(cause).__name__}: {first_line(cause)})", _ALIGNMENT_FIX)


def check_rope(impl: type) -> None:
    """Check ``RotaryPositionalEmbedding(theta, d_k, max_seq_len, device=None)`` against an independent rotation.

    The reference reads pair k = (x[2k], x[2k+1]) as the complex number x[2k] + i·x[2k+1] and multiplies it by
    ``torch.polar(1, i / theta^(2k/d_k))`` for the token at position i.

    What it checks: the signature; no parameters and an empty state dict (non-persistent buffers) with the tables
    registered as buffers and created on the ``device`` given; the output (shape, dtype, values) for x of 2-D to
    4-D with token_positions (seq,), (batch, seq) and broadcast (batch, 1, seq), in float32 and float64, with
    positions in any order and repeated, two values of theta; every position up to max_seq_len - 1; the gradient
    reaching x; bfloat16 and float16 inputs; token_positions given as a range of consecutive positions; x as a view
    at an odd storage offset and as a transposed view. Inputs come from a fixed seed on the CPU.

    Mistakes it recognises:
        * half-split pairs (x[k], x[k + d_k/2]) (Hugging Face's rotate_half, notebook 06's first pitfall) instead of
          interleaved pairs, with any angles (recognised by the pairs whose lengths the output keeps);
        * rotated pairs written back half-split (torch.cat of evens and odds) instead of interleaved;
        * rotating in the wrong direction (the sign of sin flipped);
        * frequencies with the exponent k/d_k instead of 2k/d_k, or theta^(+2k/d_k) instead of theta^(-2k/d_k);
        * token_positions ignored (torch.arange(seq) used instead); the positions shifted by one (a table from
          torch.arange(1, …), or positions ± 1); theta ignored (10000 hard-coded);
        * the angles computed in float32 (about 1e-4 rad off at position 8000): checked at positions up to 8191;
        * Hugging Face's rotate_half combined with cos/sin tables repeated for interleaved pairs (two layouts mixed);
        * x returned unchanged;
        * learnable parameters (nn.Parameter tables); persistent buffers (the tables in the state dict);
          tables kept as plain tensor attributes (they do not follow .to(device)); the device argument ignored;
        * tables that do not cover every position up to max_seq_len - 1;
        * the output promoted to float32 by the float32 tables (bfloat16 / float16 inputs); the angles
          rounded to bfloat16 / float16 before cos and sin;
        * no gradient reaching x (a detached computation);
        * a range of positions not taken: the tables indexed with something other than what the given check
          returns;
        * a crash on x handed over as a view: at an odd storage offset (big[1:].view(...), which view_as_complex
          cannot read in place and .contiguous() does not copy) or transposed.
    """
    rope = _check_structure(impl)
    gen = generator(0)

    # Positions 0 … seq-1 first (the simplest call), then positions in any order, repeated, per sequence.
    x = torch.randn(6, _D_K, generator=gen)
    _compare(rope, x, torch.arange(6), _THETA)
    shuffled = torch.tensor([5, 17, 0, 63, 17, 2, 40])
    for leading, positions in [((), shuffled), ((3,), shuffled), ((2, 4), shuffled),
                               ((3,), torch.randint(0, _MAX_SEQ_LEN, (3, 7), generator=gen)),
                               ((2, 4), torch.randint(0, _MAX_SEQ_LEN, (2, 1, 7), generator=gen))]:
        for dtype in (torch.float32, torch.float64):
            x = torch.randn(*leading, 7, _D_K, generator=gen, dtype=dtype)
            _compare(rope, x, positions, _THETA)

    # Another theta and another d_k, and every position up to max_seq_len - 1.
    _compare(_build(impl, 500.0, 8, 32), torch.randn(2, 5, 8, generator=gen), torch.tensor([3, 1, 4, 30, 9]), 500.0)
    _check_every_position(impl, gen)
    _check_float64_angles(impl, gen)
    _check_gradients(rope, gen)
    _check_half(rope, gen)
    _check_range_positions(rope, gen)
    _check_views(rope, gen)
    passed(f"check_rope: {_NAME} matches an independent complex rotation (torch.polar): interleaved pairs, "
           "2-D to 4-D inputs, broadcast token_positions and ranges, float32/float64/bfloat16/float16, two thetas, "
           "every "
           "position < max_seq_len, gradients, no parameters, empty state dict")

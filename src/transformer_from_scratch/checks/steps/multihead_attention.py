"""Self-checks for the steps of notebook 08 (multi-head self-attention): splitting the heads, merging them back, the
causal mask, RoPE on every head, and the assembled draft."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ... import reference
from .._harness import BuiltinSpy, call, diagnose, expect_tensor, fail, generator, passed

_THETA, _MAX_SEQ_LEN = 10000.0, 16
_NO_FUSED = {reference.SDPA: "F.scaled_dot_product_attention"}


def _unless_crash(wrong: Callable[[], Tensor]) -> Callable[[], Tensor | None]:
    """``wrong`` computed, or None where that mistake cannot run on these shapes (it would crash)."""
    def compute() -> Tensor | None:
        try:
            return wrong()
        except RuntimeError:
            return None
    return compute


def _crash(error: AssertionError, kind: type[BaseException], *words: str) -> bool:
    """Whether the learner's code, called through the harness, crashed with ``kind`` saying one of ``words``."""
    cause = error.__cause__
    return isinstance(cause, kind) and (not words or any(word in str(cause) for word in words))


# ------------------------------------------------------------------------------------------- split and merge

def _fixed_axes_crash(error: AssertionError, name: str) -> None:
    """A permute (or view) written for one number of dimensions, run on another: its verdict; else the harness's."""
    if _crash(error, RuntimeError, "number of dimensions", "number of dims", "Dimension out of range"):
        fail(f"{name} names every axis by its position (permute(0, 2, 1, 3) or the like), which fits only one number "
             "of leading dimensions", "count the axes from the end instead, transpose(-3, -2), or name them with "
             "einops, where ... stands for the leading ones", str(error.__cause__).splitlines()[0])
    raise error


def _split_variants(t: Tensor, heads: int) -> list[tuple[Callable[[], Tensor], str, str]]:
    *lead, seq, d = t.shape
    return [
        (lambda: t.reshape(*lead, heads, seq, d // heads), "the heads are split with a reshape straight to "
         "(..., heads, seq, d_k), without the transpose: each head gets pieces of several tokens",
         "reshape to (..., seq, heads, d_k) first, then swap seq and heads with a transpose"),
        (lambda: t.reshape(*lead, seq, d // heads, heads).movedim(-1, -3), "each head takes every num_heads-th "
         "feature ((d_k heads) instead of (heads d_k)), not a block of d_k neighbours",
         "head h owns features h·d_k … (h+1)·d_k - 1: split the last axis as (num_heads, d_k), heads first"),
    ]


def check_split_heads(split_heads: Callable[[Tensor, int], Tensor]) -> None:
    """Check ``split_heads(t, num_heads)``: (..., seq, d_model) -> (..., num_heads, seq, d_k), head h holding features
    h·d_k … (h+1)·d_k - 1 of every token.

    Checked in float64 with 0, 1 and 2 leading dimensions (seq, heads and d_k all different). Mistakes it recognises:
    a reshape straight to (..., heads, seq, d_k) without the transpose; strided heads ((d_k heads)); the heads left
    behind seq (no transpose at all); num_heads used as the head size; a transpose of fixed axes (1, 2), or a permute
    of four named axes, right only with one leading dimension.
    """
    gen = generator(0)
    fix = "view the last axis as (num_heads, d_k), then move the heads in front of seq: transpose(-3, -2)"
    for lead, seq, heads, d_k in [(2,), 5, 3, 4], [(), 5, 3, 4], [(2, 3), 6, 4, 2], [(3,), 7, 2, 5]:
        t = torch.randn(*lead, seq, heads * d_k, generator=gen, dtype=torch.float64)
        what = f"split_heads(t of shape {tuple(t.shape)}, num_heads={heads})"
        try:
            out = call(what, split_heads, t.clone(), heads)
        except AssertionError as error:
            _fixed_axes_crash(error, "split_heads")
        expected = reference.split_heads(t, heads)
        if isinstance(out, Tensor) and tuple(out.shape) != tuple(expected.shape):
            shape = tuple(out.shape)
            if shape == (*lead, seq, heads, d_k):
                fail(f"{what} returned shape {shape}: the heads are still behind seq",
                     "move the heads in front of seq with a transpose(-3, -2), so each head is a (seq, d_k) matrix")
            if shape == (*lead, d_k, seq, heads):
                fail(f"{what} returned shape {shape}: num_heads is used as the head size d_k",
                     "split d_model as (num_heads, d_k) with d_k = d_model // num_heads")
            if len(lead) != 1 and out.numel() == expected.numel() and len(shape) == len(expected.shape):
                fail(f"{what} returned shape {shape}, expected {tuple(expected.shape)}: it transposes fixed axes "
                     "(1, 2), right only when there is exactly one leading dimension",
                     "count the axes from the end, transpose(-3, -2), or name them with einops, where ... stands for "
                 "the leading ones")
        out = expect_tensor(what, out, expected.shape, fix)
        diagnose(what, out, expected, _split_variants(t, heads), fix)
    passed("split_heads: (..., seq, d_model) -> (..., heads, seq, d_k), head h = features h·d_k … (h+1)·d_k - 1, "
           "with 0, 1 and 2 leading dimensions")


def check_merge_heads(merge_heads: Callable[[Tensor], Tensor]) -> None:
    """Check ``merge_heads(t)``: (..., heads, seq, d_k) -> (..., seq, heads·d_k), the inverse of split_heads.

    Its inputs are stored head by head, as attention's output is (so a transpose makes them non-contiguous). Checked in
    float64 with 0, 1 and 2 leading dimensions. Mistakes it recognises: a reshape straight to (..., seq, d_model)
    without the transpose; strided merging ((d_k heads)); view after the transpose (it refuses a non-contiguous
    tensor); the last two axes left unflattened; a transpose of fixed axes (1, 2), or a permute of four named axes.
    """
    gen = generator(1)
    fix = "move seq back in front of the heads with transpose(-3, -2), then flatten (heads, d_k) into one axis"
    for lead, heads, seq, d_k in [(2,), 3, 5, 4], [(), 3, 5, 4], [(2, 3), 4, 6, 2], [(3,), 2, 7, 5]:
        t = torch.randn(*lead, heads, seq, d_k, generator=gen, dtype=torch.float64)
        what = f"merge_heads(t of shape {tuple(t.shape)})"
        try:
            out = call(what, merge_heads, t.clone())
        except AssertionError as error:
            if _crash(error, RuntimeError, "view size is not compatible"):
                fail("merge_heads calls view on the transposed tensor, which is not contiguous in memory",
                     "use reshape (it copies when it must), or .contiguous() before view", str(error.__cause__))
            _fixed_axes_crash(error, "merge_heads")
        expected = reference.merge_heads(t)
        if isinstance(out, Tensor) and tuple(out.shape) == (*lead, seq, heads, d_k):
            fail(f"{what} returned shape {tuple(out.shape)}: the heads are not flattened back into d_model",
                 "reshape (or flatten) the last two axes into one of heads·d_k")
        if isinstance(out, Tensor) and out.numel() == expected.numel() and tuple(out.shape) != tuple(expected.shape) \
                and len(lead) != 1:
            fail(f"{what} returned shape {tuple(out.shape)}, expected {tuple(expected.shape)}: it transposes fixed "
                 "axes (1, 2), right only when there is exactly one leading dimension",
                 "count the axes from the end, transpose(-3, -2), or name them with einops, where ... stands for "
                 "the leading ones")
        out = expect_tensor(what, out, expected.shape, fix)
        diagnose(what, out, expected, [
            (lambda: t.reshape(*lead, seq, heads * d_k), "the heads are merged with a reshape straight to "
             "(..., seq, d_model), without the transpose: rows of different tokens are glued together",
             "swap heads and seq back first, then reshape"),
            (lambda: t.movedim(-3, -1).reshape(*lead, seq, heads * d_k), "the heads are interleaved ((d_k heads)) "
             "instead of laid side by side ((heads d_k))", "head h's d_k features go to h·d_k … (h+1)·d_k - 1: "
             "transpose(-3, -2), then flatten the last two axes"),
        ], fix)
    passed("merge_heads: (..., heads, seq, d_k) -> (..., seq, heads·d_k), the inverse of split_heads, on tensors "
           "stored head by head")


# ------------------------------------------------------------------------------------------------ the mask

class _DeviceWatch(TorchFunctionMode):
    """Inside ``with``: whether any PyTorch call is handed the meta device (as device=... or as .to's argument); the
    call then runs on the CPU instead, so that nothing waits for the meta kernels to load."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def _swap(self, value: Any) -> Any:
        if isinstance(value, (str, torch.device)) and str(value) == "meta":
            self.seen = True
            return "cpu"
        return value

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        args = tuple(self._swap(a) for a in args)
        kwargs = {key: self._swap(value) for key, value in (kwargs or {}).items()}
        return func(*args, **kwargs)


def check_causal_mask(causal_mask: Callable[..., Tensor]) -> None:
    """Check ``causal_mask(seq, device=None)``: a (seq, seq) boolean tensor, True where query i may attend to key j,
    that is j <= i (the lower triangle with the diagonal), created on ``device``.

    Mistakes it recognises: the diagonal hidden (strict triangle); the upper triangle (the future instead of the
    past); True marking the keys to hide (polarity inverted); a float mask (1/0, or the additive 0/-inf), where
    notebook 05's attention takes a boolean one; the device ignored.
    """
    fix = "the lower triangle with its diagonal, as booleans: torch.tril of a (seq, seq) tensor of True"
    for seq in (5, 1, 8):
        what = f"causal_mask({seq})"
        out = call(what, causal_mask, seq)
        expected = torch.ones(seq, seq, dtype=torch.bool).tril()
        out = expect_tensor(what, out, (seq, seq), "one row per query, one column per key: shape (seq, seq)")
        if out.is_floating_point():
            values = out.detach().cpu()
            if torch.equal(values, torch.zeros(seq, seq).masked_fill(~expected, float("-inf"))):
                fail(f"{what} is an additive float mask (0 and -inf)", "notebook 05's scaled_dot_product_attention "
                     "takes a boolean mask, True = may attend, and adds the -inf itself")
            fail(f"{what} is a {out.dtype} tensor, not a boolean one", "build it with dtype=torch.bool: True means "
                 "'may attend', and notebook 05's attention reads it that way")
        if out.dtype != torch.bool:
            fail(f"{what} has dtype {out.dtype}, not torch.bool", "build it with dtype=torch.bool")
        out = out.cpu()
        for wrong, mistake, variant_fix in [
            (expected.tril(-1), "the mask hides the diagonal: query i must see key i, itself",
             "keep the diagonal: tril with its default diagonal=0"),
            (expected.T, "the mask is the upper triangle: each query sees itself and the future instead of the past",
             "take the lower triangle, j <= i"),
            (~expected, "True marks the keys to hide, but True means 'may attend'",
             "invert it: True on and below the diagonal"),
        ]:
            if not torch.equal(wrong, expected) and torch.equal(out, wrong):
                fail(mistake, variant_fix, f"{what} gives {out.int().tolist()}")
        if not torch.equal(out, expected):
            fail(f"{what} is not the causal mask", fix, f"got {out.int().tolist()}, expected {expected.int().tolist()}")
    with _DeviceWatch() as watch:  # 'meta' is seen on its way in, then replaced by the CPU (meta kernels load slowly)
        call("causal_mask(4, device='meta')", causal_mask, 4, device="meta")
    if not watch.seen:
        fail("causal_mask ignores its device argument (causal_mask(4, device='meta') never hands 'meta' on)",
             "create the tensor with device=device, so that it is where x is")
    passed("causal_mask: (seq, seq) booleans, True on and below the diagonal (j <= i), for 1, 5 and 8 tokens, "
           "on the device given")


# ---------------------------------------------------------------------------------------------- RoPE per head

class _Misuse(TypeError):
    """How the learner's code misused the stand-in RoPE: ``kind`` says which way."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Rope(nn.Module):
    """A stand-in for RotaryPositionalEmbedding(theta, d_k, max_seq_len): the reference's rotation, with its checks.

    It refuses what the course's RoPE refuses (missing positions, a wrong last dimension, positions whose leading
    dimensions do not broadcast against x's without growing it), and says which way.
    """

    def __init__(self, d_k: int, theta: float = _THETA, max_seq_len: int = _MAX_SEQ_LEN) -> None:
        super().__init__()
        self.d_k, self.theta, self.max_seq_len = d_k, theta, max_seq_len

    def forward(self, x: Tensor, token_positions: Tensor | None = None) -> Tensor:
        if token_positions is None:
            raise _Misuse("none", "rope(x, None): RoPE needs the positions, it has no default")
        if x.shape[-1] != self.d_k:
            raise _Misuse("width", f"RotaryPositionalEmbedding: x's last dimension must be d_k={self.d_k}, got x of "
                                   f"shape {tuple(x.shape)}")
        if isinstance(token_positions, range):  # consecutive positions, as the course's RoPE takes them
            if token_positions.step != 1 or len(token_positions) != x.shape[-2] or token_positions.start < 0 \
                    or token_positions.stop > self.max_seq_len:
                raise _Misuse("range", f"rope(x of shape {tuple(x.shape)}, {token_positions}): a range must hold one "
                                       f"position per token, consecutive, within [0, {self.max_seq_len})")
            token_positions = torch.arange(token_positions.start, token_positions.stop)
        if token_positions.is_floating_point():
            raise _Misuse("float", f"token_positions must be integers, got {token_positions.dtype}")
        lead, where = tuple(x.shape[:-1]), tuple(token_positions.shape)
        fits = len(where) <= len(lead) and where[-1:] == lead[-1:] and all(
            a in (1, b) for a, b in zip(reversed(where[:-1]), reversed(lead[:-1])))
        if not fits:
            raise _Misuse("shape", f"RotaryPositionalEmbedding: token_positions of shape {where} do not fit x of shape "
                                   f"{tuple(x.shape)}: their leading dimensions must broadcast to {lead[:-1]}")
        return reference.rotate(x, token_positions, self.theta)


def _rope_crash(error: AssertionError, positions: Tensor | None, q: Tensor) -> None:
    """Turn a misuse of the stand-in RoPE into its verdict (or let the harness's verdict stand)."""
    cause = error.__cause__
    if not isinstance(cause, _Misuse):
        raise error
    if cause.kind == "none":
        fail("rope is called with token_positions=None", "when no positions are given, make the default "
             "0, 1, …, seq - 1 yourself: range(seq), with seq = q.shape[-2]", str(cause))
    if cause.kind == "range":
        fail("rope gets a range that is not the positions 0, 1, …, seq - 1", "the default is range(seq), with seq "
             "read off the sequence axis, q.shape[-2]", str(cause))
    if cause.kind == "width":
        fail("rope gets vectors of the wrong width: it rotates one head's d_k features",
             "rotate the split heads (..., heads, seq, d_k), never the (..., seq, d_model) projections", str(cause))
    if cause.kind == "shape" and positions is not None and positions.ndim >= 2 and positions.ndim == q.ndim - 2:
        fail("token_positions reach rope without a head axis: positions (batch, seq) do not fit (batch, heads, seq, "
             "d_k)", "give them a size-1 head axis just before seq, token_positions.unsqueeze(-2): (..., 1, seq)",
             str(cause))
    fail("rope cannot use the positions in the shape they are given", "give them a size-1 head axis just before seq, "
         "(..., 1, seq), so that they broadcast over the heads", str(cause))


def check_rotate_heads(rotate_heads: Callable[..., tuple[Tensor, Tensor]]) -> None:
    """Check ``rotate_heads(rope, q, k, token_positions=None)`` -> (q, k) rotated, with q, k (..., heads, seq, d_k).

    Runs with a stand-in for the course's RoPE (the reference's rotation), in float64, at the default positions, at
    positions shared by the batch (seq,), and at positions per sequence (batch, seq) with batch ≠ heads and with
    batch = heads (where the missing head axis raises no error). Mistakes it recognises: positions without a head
    axis (an error, or head j rotated with sequence j's positions); None passed on to rope, or used as a tensor;
    default positions starting at 1; token_positions ignored; only q, or only k, rotated; q and k returned swapped.
    """
    gen = generator(2)
    for lead, heads, seq, d_k, kind in [((2,), 3, 5, 4, None), ((2,), 3, 5, 4, "shared"),
                                        ((2,), 3, 5, 4, "per sequence"), ((3,), 3, 5, 4, "per sequence"),
                                        ((), 2, 6, 4, "shared"), ((2, 2), 3, 4, 6, "per sequence")]:
        q, k = (torch.randn(*lead, heads, seq, d_k, generator=gen, dtype=torch.float64) for _ in "qk")
        if kind is None:
            positions = None
        elif kind == "shared":
            positions = torch.randperm(_MAX_SEQ_LEN, generator=gen)[:seq].sort().values
        else:
            positions = torch.stack([torch.randperm(_MAX_SEQ_LEN, generator=gen)[:seq] for _ in range(math.prod(lead))]
                                    ).reshape(*lead, seq)
        what = (f"rotate_heads(rope, q and k of shape {tuple(q.shape)}, token_positions="
                + ("None" if positions is None else f"of shape {tuple(positions.shape)}") + ")")
        try:
            out = call(what, rotate_heads, _Rope(d_k), q.clone(), k.clone(), positions)
        except AssertionError as error:
            if positions is None and _crash(error, (TypeError, AttributeError), "'range' object"):
                fail("rotate_heads treats the default range(seq) as a tensor", "a range is the same for every "
                     "sequence and head: pass range(seq) to rope as it is; only given positions get .unsqueeze(-2)",
                     str(error.__cause__).splitlines()[0])
            if positions is None and _crash(error, (TypeError, AttributeError), "NoneType"):
                fail("rotate_heads fails when token_positions is None", "None means the default positions: make "
                     "them first, range(seq) (with seq = q.shape[-2]): a range needs no head axis",
                     str(error.__cause__).splitlines()[0])
            _rope_crash(error, positions, q)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            fail(f"{what} returned {type(out).__name__}, not a pair", "return the rotated queries and keys: q, k")
        q_out, k_out = (expect_tensor(f"{what}[{i}]", t, q.shape, "rotating keeps the shape (..., heads, seq, d_k)")
                        for i, t in enumerate(out))
        where = (torch.arange(seq) if positions is None else positions).unsqueeze(-2)
        q_rot, k_rot = reference.rotate(q, where, _THETA), reference.rotate(k, where, _THETA)
        fix = ("rotate q and k with rope(t, positions), the positions (..., seq) given a head axis, (..., 1, seq); "
               "None means 0 … seq-1")
        no_head_axis = positions is not None and positions.ndim >= 2 and positions.ndim == q.ndim - 2
        for name, got, right, source, other_right in [("q", q_out, q_rot, q, k_rot), ("k", k_out, k_rot, k, q_rot)]:
            variants = []
            if no_head_axis:
                variants.append((_unless_crash(lambda t=source: reference.rotate(t, positions, _THETA)),
                                 "token_positions reach rope without a head axis, so positions (batch, seq) line up "
                                 "with the heads of (batch, heads, seq, d_k): head j is rotated with sequence j's "
                                 "positions", "give them a size-1 head axis, token_positions.unsqueeze(-2), so that "
                                 "every head of a sequence gets the same rotation"))
            if positions is None:
                variants.append((lambda t=source: reference.rotate(t, torch.arange(1, seq + 1), _THETA),
                                 "the default positions start at 1, but the first token sits at position 0",
                                 "default to range(seq): 0, 1, …, seq - 1"))
            else:
                variants.append((lambda t=source: reference.rotate(t, torch.arange(seq), _THETA),
                                 "token_positions is ignored: every token is rotated as if at positions 0 … seq-1",
                                 "use the positions you are given; only None means 0 … seq-1"))
            variants += [(lambda t=source: t, f"{name} is returned without its rotation",
                          "rotate both, the queries and the keys, with the same positions"),
                         (lambda r=other_right: r, "q and k come back swapped",
                          "return them in the order they came: q, k")]
            diagnose(f"the {name} returned by {what}", got, right, variants, fix)
    passed("rotate_heads: q and k rotated, the same rotation for every head, at the default (0 … seq-1), shared "
           "(seq,) and per-sequence (batch, seq) positions")


# ----------------------------------------------------------------------------------------------- the draft

class _Projection(nn.Module):
    """A Linear(d_model, d_model) with known weights: what the draft receives as q_proj, k_proj, v_proj, output_proj."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight)


def _attend(x: Tensor, w: dict[str, Tensor], heads: int, theta: float | None, positions: Tensor | None, *,
            causal: bool = True, rope_v: bool = False, output: bool = True, scale_d_model: bool = False) -> Tensor:
    """Causal multi-head self-attention from the reference's pieces, with one knob turned (a classic mistake)."""
    q, k, v = (reference.split_heads(F.linear(x, w[f"{name}_proj.weight"]), heads) for name in "qkv")
    if theta is not None:
        where = (torch.arange(x.shape[-2]) if positions is None else positions).unsqueeze(-2)
        q, k = reference.rotate(q, where, theta), reference.rotate(k, where, theta)
        v = reference.rotate(v, where, theta) if rope_v else v
    scale = 1 / math.sqrt(x.shape[-1]) if scale_d_model else None
    merged = reference.merge_heads(reference.SDPA(q, k, v, is_causal=causal, scale=scale))
    return F.linear(merged, w["output_proj.weight"]) if output else merged


def check_multihead_draft(multihead_draft: Callable[..., Tensor]) -> None:
    """Check ``multihead_draft(x, projections, num_heads, rope=None, token_positions=None)``: causal multi-head
    self-attention from four projections (q_proj, k_proj, v_proj, output_proj), with RoPE on q and k when given.

    Runs in float64 with known weights and a stand-in RoPE, against the reference (F.linear and
    F.scaled_dot_product_attention(is_causal=True)): without RoPE, with RoPE at the default positions, at positions per
    sequence and shared ones, with 0, 1 and 2 leading dimensions. Mistakes it recognises: no causal mask; RoPE on the
    values too; RoPE before the split; rope called when it is None; the positions not passed on (or passed without a
    head axis, or None to rope); output_proj missing; the scores scaled by 1/√d_model; F.scaled_dot_product_attention
    used (the draft runs on notebook 05's attention).
    """
    gen = generator(3)
    d_model, heads = 12, 3
    fix = "project with q_proj, k_proj, v_proj; split the heads; RoPE on q and k; causal attention; merge; output_proj"
    for lead, seq, with_rope, kind in [((2,), 5, False, None), ((2,), 5, True, None), ((2,), 5, True, "per sequence"),
                                       ((), 6, True, "shared"), ((2, 2), 4, False, None), ((2, 2), 4, True, "shared")]:
        x = torch.randn(*lead, seq, d_model, generator=gen, dtype=torch.float64)
        w = {f"{name}.weight": torch.randn(d_model, d_model, generator=gen, dtype=torch.float64) / math.sqrt(d_model)
             for name in ("q_proj", "k_proj", "v_proj", "output_proj")}
        projections = tuple(_Projection(w[f"{name}.weight"]) for name in ("q_proj", "k_proj", "v_proj", "output_proj"))
        positions = None
        if kind == "shared":
            positions = torch.randperm(_MAX_SEQ_LEN, generator=gen)[:seq].sort().values
        elif kind == "per sequence":
            positions = torch.stack([torch.randperm(_MAX_SEQ_LEN, generator=gen)[:seq].sort().values
                                     for _ in range(math.prod(lead))]).reshape(*lead, seq)
        theta = _THETA if with_rope else None
        rope = _Rope(d_model // heads) if with_rope else None
        what = (f"multihead_draft(x of shape {tuple(x.shape)}, projections, num_heads={heads}, "
                f"rope={'a RoPE' if with_rope else 'None'}"
                + ("" if positions is None else f", token_positions of shape {tuple(positions.shape)}") + ")")
        args = (x, projections, heads, rope) + (() if positions is None else (positions,))
        with BuiltinSpy(_NO_FUSED) as spy:
            try:
                out = call(what, multihead_draft, *args)
            except AssertionError as error:
                if rope is None and _crash(error, TypeError, "'NoneType' object is not callable"):
                    fail("multihead_draft calls rope when it is None", "rope=None means no RoPE: rotate q and k "
                         "only when a rope is given (if rope is not None)", str(error.__cause__).splitlines()[0])
                _rope_crash(error, positions, x.unsqueeze(-3))
        if spy.used:
            fail("multihead_draft calls F.scaled_dot_product_attention", "run the heads through your "
                 "scaled_dot_product_attention from notebook 05, with your causal_mask")
        out = expect_tensor(what, out, x.shape, "merge the heads back to (..., seq, d_model) before output_proj")
        variants = [
            (lambda: _attend(x, w, heads, theta, positions, causal=False), "the attention is not causal: every query "
             "also sees the keys after it",
             "pass your causal_mask(seq, device=x.device) to scaled_dot_product_attention"),
            (lambda: _attend(x, w, heads, theta, positions, output=False), "output_proj is not applied: the merged "
             "heads are returned as they are", "finish with output_proj(merged), which mixes what the heads found"),
            (lambda: _attend(x, w, heads, theta, positions, scale_d_model=True), "the scores are scaled by "
             "1/√d_model instead of 1/√d_k",
             "each head's dot products have d_k terms: use scaled_dot_product_attention "
             "on the split heads, which divides by √d_k"),
        ]
        if with_rope:
            variants += [
                (lambda: _attend(x, w, heads, theta, positions, rope_v=True), "RoPE is applied to the values too: the "
                 "output then depends on absolute positions",
                 "rotate only the queries and the keys (your rotate_heads)"),
                (lambda: _attend(x, w, heads, None, None), "RoPE is not applied, though a rope is given",
                 "rotate q and k with your rotate_heads(rope, q, k, token_positions) after the split"),
                (lambda: _attend(x, w, heads, theta, None), "token_positions is not passed on: the output is the one "
                 "for positions 0 … seq-1", "hand token_positions to your rotate_heads"),
            ]
        diagnose(what, out, _attend(x, w, heads, theta, positions), variants, fix)
    passed("multihead_draft: causal multi-head self-attention with known weights, without RoPE and with it at the "
           "default, per-sequence and shared positions, with 0, 1 and 2 leading dimensions")


# ------------------------------------------------------------------------------------------- grouped-query attention

def _repeat_variants(t: Tensor, group: int) -> list[tuple[Callable[[], Tensor], str, str]]:
    heads = t.shape[-3]
    order = "key/value head j serves query heads j·g … j·g+g-1: each head's g copies side by side (0, 0, 1, 1)"
    return [
        (lambda: torch.cat([t] * group, dim=-3), "the key/value heads are tiled (0, 1, 0, 1): query head h reads "
         "key/value head h mod H_kv instead of h // g", order),
        (lambda: t[..., :1, :, :].expand(*t.shape[:-3], heads * group, *t.shape[-2:]), "every query head reads "
         "key/value head 0: the other key/value heads are never used", order),
    ]


def check_repeat_kv(repeat_kv: Callable[[Tensor, int], Tensor]) -> None:
    """Check ``repeat_kv(t, group)``: (..., kv_heads, seq, d_k) -> (..., kv_heads·group, seq, d_k), output head h
    being input head h // group (grouped-query attention: key/value head j serves query heads j·g … j·g+g-1).

    Checked in float64 with 0, 1 and 2 leading dimensions, groups of 1, 2 and 3, and kv_heads, seq and d_k all
    different. Mistakes it recognises: the heads tiled (0, 1, 0, 1) instead of each repeated in place (0, 0, 1, 1);
    one key/value head shared by every query head; the copies made along the sequence or the features; the heads
    axis counted from the front (right for one number of leading dimensions only); group ignored.
    """
    gen = generator(0)
    fix = "repeat each key/value head g times in place, along the heads axis (the third from the end)"
    for lead, kv_heads, seq, d_k, group in [((2,), 2, 5, 4, 3), ((), 3, 4, 2, 2), ((2, 3), 2, 3, 5, 2),
                                            ((3,), 4, 6, 3, 1)]:
        t = torch.randn(*lead, kv_heads, seq, d_k, generator=gen, dtype=torch.float64)
        what = f"repeat_kv(t of shape {tuple(t.shape)}, group={group})"
        out = call(what, repeat_kv, t.clone(), group)
        expected = t.repeat_interleave(group, dim=-3)
        if isinstance(out, Tensor) and tuple(out.shape) != tuple(expected.shape):
            shape = tuple(out.shape)
            if shape == tuple(t.shape) and group > 1:
                fail(f"{what} returned shape {shape}, the input's: the key/value heads were not repeated",
                     "make g copies of each key/value head, so that there is one per query head")
            if len(lead) != 1 and shape == tuple(t.repeat_interleave(group, dim=1).shape):
                fail(f"{what} returned shape {shape}, expected {tuple(expected.shape)}: the heads axis is counted "
                     "from the front, which is right for one number of leading dimensions only",
                     "count it from the end: the heads are the third axis from the end, whatever leads")
            if shape in ((*lead, kv_heads, seq * group, d_k), (*lead, kv_heads, seq, d_k * group)):
                fail(f"{what} returned shape {shape}: the copies were made along the "
                     f"{'sequence' if shape[-2] != seq else 'features'}, not along the heads", fix)
        out = expect_tensor(what, out, expected.shape, fix)
        diagnose(what, out, expected, _repeat_variants(t, group), fix)
    passed("repeat_kv: (..., kv_heads, seq, d_k) -> (..., kv_heads·g, seq, d_k), key/value head j serving query heads "
           "j·g … j·g+g-1, with 0, 1 and 2 leading dimensions")

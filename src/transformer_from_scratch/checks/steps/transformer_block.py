"""Self-checks for the steps of notebook 09 (Transformer block): the block's four parts, one residual sub-layer wired
pre-norm and post-norm, and the whole block assembled from them."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from ... import reference
from .._harness import call, check_parameters, describe, diagnose, expect_tensor, fail, generator, passed

# d_model 12 in 3 heads, SwiGLU width 16, RoPE for 16 positions: every size differs, so a swapped pair shows.
_D, _HEADS, _DFF, _MAX_SEQ_LEN, _THETA = 12, 3, 16, 16, 10000.0
_NAMES = ("ln1", "attn", "ln2", "ffn")
_EXPECTED = {"ln1.weight": (_D,), **{f"attn.{p}_proj.weight": (_D, _D) for p in ("q", "k", "v", "output")},
             "ln2.weight": (_D,), "ffn.w1.weight": (_DFF, _D), "ffn.w2.weight": (_D, _DFF), "ffn.w3.weight": (_DFF, _D)}


# ---------------------------------------------------------------------------------------------------------
# Step 1: the four parts
# ---------------------------------------------------------------------------------------------------------

def check_make_parts(make_parts: Callable[..., nn.Module]) -> None:
    """Check ``make_parts(d_model, num_heads, d_ff, max_seq_len, theta, device=None)``: the block's four sub-modules,
    named ``ln1``, ``attn``, ``ln2``, ``ffn``.

    Checked with d_model 12, 3 heads, d_ff 16, max_seq_len 16: the names; two separate norms; exactly the course's
    nine weights with their shapes; the attention against the course's reference attention (RoPE with theta, token
    positions 0 … 4) on its own weights; ``device`` honoured (the ``meta`` device). Mistakes it recognises: a part
    missing or misnamed; one RMSNorm shared by both sub-layers; SwiGLU's sizes swapped (d_ff before d_model); the
    attention built without RoPE (max_seq_len and theta not passed on); max_seq_len and theta swapped; device ignored.
    """
    what = f"make_parts({_D}, {_HEADS}, {_DFF}, {_MAX_SEQ_LEN}, {_THETA:g})"
    with torch.random.fork_rng(devices=[]):
        parts = call(what, make_parts, _D, _HEADS, _DFF, _MAX_SEQ_LEN, _THETA)
        if not isinstance(parts, nn.Module):
            fail(f"{what} returned {describe(parts)}, not a module",
                 "return an nn.ModuleDict that holds the four parts under their names")
        found = {name: getattr(parts, name, None) for name in _NAMES}
        missing = [name for name, part in found.items() if not isinstance(part, nn.Module)]
        if missing:
            fail(f"{what} has no part named {', '.join(missing)} (its parts: {[n for n, _ in parts.named_children()]})",
                 "name the four parts ln1, attn, ln2 and ffn: the final class and the course's checkpoints use these")
        if found["ln1"] is found["ln2"]:
            fail("ln1 and ln2 are one and the same RMSNorm (shared), so both sub-layers share one gain",
                 "create two RMSNorm(d_model): each sub-layer gets its own norm, with its own gain")
        w1 = dict(parts.named_parameters()).get("ffn.w1.weight")
        if w1 is not None and tuple(w1.shape) == (_D, _DFF):
            fail(f"the feed-forward part has its sizes swapped (ffn.w1.weight has shape {tuple(w1.shape)}, expected "
                 f"{(_DFF, _D)})", "SwiGLU takes d_model first, then d_ff: SwiGLU(d_model, d_ff)")
        check_parameters(parts, _EXPECTED, what)
        _check_attention(found["attn"], what)
        _check_device(make_parts)
    passed("make_parts: ln1, attn, ln2, ffn, two separate norms, the course's nine weights; attention with RoPE "
           "(max_seq_len, theta); device honoured")


def _check_attention(attn: nn.Module, what: str) -> None:
    """The attention part against the reference attention on its own weights, with and without RoPE."""
    x = torch.randn(2, 5, _D, generator=generator(0))
    out = call(f"{what}'s attention on x of shape {tuple(x.shape)}", attn, x)
    out = expect_tensor(f"{what}'s attention", out, x.shape, "build it with MultiHeadSelfAttention (notebook 08)")
    weights, x64 = reference.float64_copy(attn.state_dict()), x.double()
    right = reference.multihead_self_attention(x64, weights, _HEADS, _THETA)
    tolerance = dict(rtol=1e-4, atol=1e-5)  # the parts are float32
    diagnose(f"{what}'s attention", out.double(), right, [
        (lambda: reference.multihead_self_attention(x64, weights, _HEADS, None),
         "the attention part has no RoPE: max_seq_len and theta are not passed on to it",
         "MultiHeadSelfAttention takes d_model, num_heads, max_seq_len and theta, in that order"),
        (lambda: reference.multihead_self_attention(x64, weights, _HEADS, float(_MAX_SEQ_LEN)),
         "max_seq_len and theta are swapped: the attention's RoPE has base Θ = 16",
         "MultiHeadSelfAttention takes d_model, num_heads, max_seq_len and theta, in that order"),
    ], "build it as MultiHeadSelfAttention(d_model, num_heads, max_seq_len, theta); if it is that already, run "
       "check_multihead_self_attention on your attention (notebook 08)", **tolerance)


def _check_device(make_parts: Callable[..., nn.Module]) -> None:
    what = f"make_parts({_D}, {_HEADS}, {_DFF}, {_MAX_SEQ_LEN}, {_THETA:g}, device='meta')"
    parts = call(what, make_parts, _D, _HEADS, _DFF, _MAX_SEQ_LEN, _THETA, device="meta")
    elsewhere = [name for name, t in [*parts.named_parameters(), *parts.named_buffers()] if t.device.type != "meta"]
    if elsewhere:
        fail(f"make_parts ignores its device argument ({elsewhere[0]} was not created on the meta device)",
             "pass device=device on to each of the four parts")


# ---------------------------------------------------------------------------------------------------------
# Steps 2 and 3: one residual sub-layer, pre-norm and post-norm
# ---------------------------------------------------------------------------------------------------------

def _unit_rms(t: Tensor) -> Tensor:
    return t / t.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt()


def _residual_inputs() -> tuple[Tensor, Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]:
    """x of RMS about 3; a norm with a gain away from ones; a sub-layer that mixes features and does not keep the
    scale. Each wrong wiring then gives a different result."""
    gen = generator(0)
    x = 3 * torch.randn(2, 5, 6, generator=gen, dtype=torch.float64)
    gain = 0.5 + torch.rand(6, generator=gen, dtype=torch.float64)
    A = torch.randn(6, 6, generator=gen, dtype=torch.float64) / 6**0.5
    return x, (lambda t: _unit_rms(t) * gain), (lambda t: 2 * torch.tanh(t @ A.T) + 0.5)


def _call_residual(name: str, step: Callable[..., Tensor], x: Tensor, norm: Callable, sublayer: Callable) -> Tensor:
    what = f"{name}(x, norm, sublayer) with x of shape {tuple(x.shape)}"
    before = x.clone()
    with torch.random.fork_rng(devices=[]):
        out = call(what, step, x, norm, sublayer)
    if not torch.equal(x, before):
        fail(f"{name} changes x in place (x += ..., or an in-place method on x)",
             "return a new tensor, x + ...: the caller still needs x, and autograd may too")
    return expect_tensor(what, out, x.shape, "a residual sub-layer maps (..., d) to (..., d)", dtype=x.dtype)


def check_pre_norm_residual(pre_norm_residual: Callable[..., Tensor]) -> None:
    """Check ``pre_norm_residual(x, norm, sublayer)``: x + sublayer(norm(x)).

    Checked in float64 with a norm whose gain is not ones and a sub-layer that does not keep the scale. Mistakes it
    recognises: the post-norm order, norm(x + sublayer(x)); the residual missing (sublayer(norm(x))); the norm applied
    to the sub-layer's output (x + norm(sublayer(x))); the stream itself normalised (norm(x) + sublayer(norm(x)));
    the norm left out (x + sublayer(x)); x changed in place.
    """
    x, norm, f = _residual_inputs()
    what = f"pre_norm_residual(x, norm, sublayer) with x of shape {tuple(x.shape)}"
    out = _call_residual("pre_norm_residual", pre_norm_residual, x, norm, f)
    fix = "normalise only the copy the sub-layer reads, and add the sub-layer's output to x as it came in"
    diagnose(what, out, x + f(norm(x)), [
        (lambda: norm(x + f(x)), "this is the post-norm order, norm(x + sublayer(x)): it normalises the sum",
         "pre-norm normalises only the sub-layer's input and adds its output to x as it came in"),
        (lambda: f(norm(x)), "the residual is missing: it returns sublayer(norm(x)) and drops x",
         "add the sub-layer's output to x"),
        (lambda: x + norm(f(x)), "the norm is applied to the sub-layer's output instead of its input",
         "the sub-layer reads norm(x); what it returns is added to x unchanged"),
        (lambda: norm(x) + f(norm(x)), "the stream itself is normalised: norm(x) + sublayer(norm(x)) replaces x by "
         "norm(x), so every token loses its scale", "add the sub-layer's output to x as it came in, not to norm(x)"),
        (lambda: x + f(x), "the norm is left out: the sub-layer reads x itself", "the sub-layer reads norm(x)"),
    ], fix)
    passed("pre_norm_residual: the sub-layer reads a normalised copy, the stream gets its output added as it is, x not "
           "changed")


def check_post_norm_residual(post_norm_residual: Callable[..., Tensor]) -> None:
    """Check ``post_norm_residual(x, norm, sublayer)``: norm(x + sublayer(x)).

    Checked in float64 with a norm whose gain is not ones and a sub-layer that does not keep the scale. Mistakes it
    recognises: the pre-norm order (x + sublayer(norm(x)), Step 2); the residual missing (norm(sublayer(x))); x
    normalised before the addition (norm(x) + sublayer(x)); the norm left out (x + sublayer(x)); the sub-layer reading
    norm(x); x changed in place.
    """
    x, norm, f = _residual_inputs()
    what = f"post_norm_residual(x, norm, sublayer) with x of shape {tuple(x.shape)}"
    out = _call_residual("post_norm_residual", post_norm_residual, x, norm, f)
    fix = "post-norm adds first, then normalises the sum, once"
    diagnose(what, out, norm(x + f(x)), [
        (lambda: x + f(norm(x)), "this is the pre-norm order, x + sublayer(norm(x)) (your Step 2)",
         "post-norm lets the sub-layer read x itself and normalises the sum of x and its output"),
        (lambda: norm(f(x)), "the residual is missing: it returns norm(sublayer(x)) and drops x", fix),
        (lambda: norm(x) + f(x), "x is normalised before the addition (norm(x) + sublayer(x)), not the sum", fix),
        (lambda: x + f(x), "the norm is left out: it returns x + sublayer(x)", fix),
        (lambda: norm(x + f(norm(x))), "the sub-layer reads norm(x): in post-norm it reads x as it is", fix),
        (lambda: x + norm(f(x)), "the norm is applied to the sub-layer's output only, not to the sum", fix),
    ], fix)
    passed("post_norm_residual: the norm applied to the residual sum, x not changed")


# ---------------------------------------------------------------------------------------------------------
# Step 4: the whole block
# ---------------------------------------------------------------------------------------------------------

class _Norm(nn.Module):
    """A stand-in for RMSNorm with its own gain, so that ln1 and ln2 cannot be mixed up unnoticed."""

    def __init__(self, gain: Tensor) -> None:
        super().__init__()
        self.gain = gain

    def forward(self, t: Tensor) -> Tensor:
        return _unit_rms(t) * self.gain


class _Attention(nn.Module):
    """A stand-in for attention: a causal running mean of the tokens' features, plus a term that depends on
    token_positions (default 0 … seq-1), so that positions left out show."""

    def __init__(self, V: Tensor, u: Tensor) -> None:
        super().__init__()
        self.V, self.u = V, u

    def forward(self, t: Tensor, token_positions: Tensor | None = None) -> Tensor:
        seq = t.shape[-2]
        positions = torch.arange(seq) if token_positions is None else token_positions
        values = torch.tanh(t @ self.V.T)
        running_mean = values.cumsum(-2) / torch.arange(1, seq + 1, dtype=t.dtype)[:, None]
        return running_mean + torch.sin(0.7 * positions.to(t.dtype))[..., None] * self.u


class _FeedForward(nn.Module):
    """A stand-in for the feed-forward network: token by token, nonlinear."""

    def __init__(self, W1: Tensor, W2: Tensor) -> None:
        super().__init__()
        self.W1, self.W2 = W1, W2

    def forward(self, t: Tensor) -> Tensor:
        return torch.tanh(t @ self.W1.T) @ self.W2.T


def _stand_in_parts() -> nn.ModuleDict:
    gen = generator(1)
    d = 6
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)
    return nn.ModuleDict(dict(
        ln1=_Norm(torch.linspace(0.5, 1.5, d, dtype=torch.float64)),
        attn=_Attention(rand(d, d) / d**0.5, rand(d)),
        ln2=_Norm(torch.linspace(1.4, 0.6, d, dtype=torch.float64)),
        ffn=_FeedForward(rand(2 * d, d) / d**0.5, rand(d, 2 * d) / (2 * d) ** 0.5)))


def _pre(x: Tensor, norm: Callable, sublayer: Callable) -> Tensor:
    return x + sublayer(norm(x))


def _post(x: Tensor, norm: Callable, sublayer: Callable) -> Tensor:
    return norm(x + sublayer(x))


def _wire(p: nn.ModuleDict, x: Tensor, positions: Tensor | None, residual: Callable, *, first: str = "ln1",
          second: str = "ln2", pass_positions: bool = True, ffn_reads: str = "y", order: str = "attn first",
          ffn: bool = True) -> Tensor:
    """The block from ``residual``, or the same with one classic mistake (the keywords)."""
    attention = lambda t: p.attn(t, positions if pass_positions else None)
    if order == "ffn first":
        return residual(residual(x, p[first], p.ffn), p[second], attention)
    y = residual(x, p[first], attention)
    if not ffn:
        return y
    if ffn_reads == "x":
        return residual(x, p[second], p.ffn)
    if ffn_reads == "x, added to y":
        return y + p.ffn(p[second](x))
    return residual(y, p[second], p.ffn)


_VARIANTS = [
    (dict(ffn_reads="x"), "the second sub-layer reads x instead of y, so what attention wrote is lost",
     "the feed-forward sub-layer goes through residual with y, the stream after attention, not x"),
    (dict(ffn_reads="x, added to y"), "the feed-forward network reads x instead of y (y + ffn(ln2(x))), so it never "
     "sees what attention wrote",
     "the feed-forward sub-layer goes through residual with y, the stream after attention"),
    (dict(ffn=False), "it returns y: the feed-forward sub-layer is missing",
     "after attention's sub-layer, apply the residual step once more, with ln2 and the feed-forward network"),
    (dict(order="ffn first"), "the sub-layers are in the wrong order: the feed-forward network comes first",
     "attention first (with ln1), then the feed-forward network (with ln2)"),
    (dict(first="ln2", second="ln1"), "ln1 and ln2 are swapped",
     "ln1 goes with attention, ln2 with the feed-forward network (checkpoints load each gain by name)"),
    (dict(second="ln1"), "ln1 is used before both sub-layers (one norm shared), so ln2's gain is never used",
     "each sub-layer has its own norm: ln1 with attention, ln2 with the feed-forward network"),
    (dict(first="ln2"), "ln2 is used before both sub-layers (one norm shared), so ln1's gain is never used",
     "each sub-layer has its own norm: ln1 with attention, ln2 with the feed-forward network"),
    (dict(pass_positions=False), "token_positions is not passed on to the attention: it uses positions 0 … seq-1",
     "the attention sub-layer is a function of one argument that calls the attention with t and token_positions"),
]


def check_block_forward(block_forward: Callable[..., Tensor]) -> None:
    """Check ``block_forward(parts, x, token_positions=None, residual=pre_norm_residual)``: attention's sub-layer,
    then the feed-forward network's, each through ``residual(stream, norm, sublayer)``.

    Checked on stand-in parts (norms with different gains, a causal token mixer that depends on token_positions, a
    token-wise feed-forward network), in float64, with the check's own pre-norm and post-norm residual steps passed
    as ``residual``, with and without token positions. Mistakes it recognises: the second sub-layer reading x instead
    of y (through the residual step, or as y + ffn(ln2(x))); the feed-forward sub-layer missing (it returns y); the
    sub-layers in the wrong order; ln1 and ln2 swapped, or one of them used twice; token_positions not passed on;
    the residual argument ignored (always pre-norm, or always post-norm); x changed in place.
    """
    parts = _stand_in_parts()
    gen = generator(2)
    x = 2 * torch.randn(2, 5, 6, generator=gen, dtype=torch.float64)
    fix = "attention's sub-layer first (ln1, with the positions), then the feed-forward one on its result (ln2)"
    for positions in (torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]]), None):
        for residual, wiring in ((_pre, "pre-norm"), (_post, "post-norm")):
            shown = "None" if positions is None else positions.tolist()
            what = f"block_forward(parts, x, token_positions={shown}, residual=<the {wiring} step>)"
            before = x.clone()
            with torch.random.fork_rng(devices=[]):
                out = call(what, block_forward, parts, x, positions, residual=residual)
            if not torch.equal(x, before):
                fail("block_forward changes x in place (x += ..., or an in-place method on x)",
                     "build new tensors: y from x, then the output from y")
            out = expect_tensor(what, out, x.shape, "the block maps (..., seq, d) to (..., seq, d)", dtype=x.dtype)
            other = _post if residual is _pre else _pre
            variants = [(lambda knobs=knobs: _wire(parts, x, positions, residual, **knobs), mistake, variant_fix)
                        for knobs, mistake, variant_fix in _VARIANTS]
            variants.append((lambda: _wire(parts, x, positions, other),
                             f"block_forward ignores its residual argument: given the {wiring} step, it wires the "
                             f"block {'post' if other is _post else 'pre'}-norm",
                             "call residual(...) for both sub-layers, never one of your steps by name"))
            diagnose(what, out, _wire(parts, x, positions, residual), variants, fix)
    passed("block_forward: attention's sub-layer (ln1, positions passed on), then the feed-forward one on y (ln2), "
           "each through the residual step given, pre-norm and post-norm")

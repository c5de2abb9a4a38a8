"""``check_multihead_self_attention``: the learner's ``MultiHeadSelfAttention`` (notebook 08), loaded with known
weights, against the course's reference (``transformer_from_scratch.reference``): ``F.linear`` for the four
projections and ``F.scaled_dot_product_attention(is_causal=True)`` for the heads, with RoPE as a complex
multiplication (independent of the package's ``RotaryPositionalEmbedding``). The classic mistakes are the same
computation with one knob turned (``_mhsa``), built from the reference's pieces."""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import reference
from ._harness import (BuiltinSpy, call, check_buffers_device, check_device_and_dtype, check_gradients,
                       check_initialised, check_parameters, check_signature, close, construct, expect_like, fail,
                       generator, passed, refuse_instance, unfilled_is_nan)

# What a composite says of a weight never filled: its parts initialise themselves, as their own checks demand.
_INIT_FIX = ("build each part from the course's Linear (Embedding, RMSNorm), which fills its own weight, and do not "
             "replace a weight with a new, unfilled one afterwards")

_NAME = "MultiHeadSelfAttention"
_SIGNATURE = ["d_model", "num_heads", "max_seq_len", "theta", "device", "dtype"]
_SDPA = reference.SDPA  # saved at import, so the reference is never a patched one
# d_model = 12 in 3 heads of d_k = 4, over 5 tokens: seq, heads and d_k all differ, so a reshape that mixes
# them cannot go unnoticed, and √d_model ≠ √d_k.
_D_MODEL, _HEADS, _SEQ = 12, 3, 5
_MAX_SEQ_LEN, _THETA = 16, 10000.0
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "output_proj")
_SPLIT = "head h owns features h·d_k … (h+1)·d_k − 1 of every token, and the heads become a batch axis before seq"
_RIGHT_ROPE = ("after splitting the heads, with one rotation of size d_k shared by every head (positions that "
               "broadcast over the heads axis)")


# ---------------------------------------------------------------------------------------------------------
# The reference and the classic wrong variants (float64 on the CPU, PyTorch built-ins only)
# ---------------------------------------------------------------------------------------------------------

def _split(t: Tensor, heads: int, how: str) -> Tensor:
    """(..., seq, d_model) -> (..., heads, seq, d_k), the right way or a classic wrong one."""
    *lead, seq, d = t.shape
    if how == "no transpose":  # reshape straight to (..., heads, seq, d_k)
        return t.reshape(*lead, heads, seq, d // heads)
    if how == "strided":  # "(d_k heads)": head h gets features h, h + heads, h + 2·heads, ...
        return t.reshape(*lead, seq, d // heads, heads).movedim(-1, -3)
    return t.reshape(*lead, seq, heads, d // heads).transpose(-3, -2)


def _merge(t: Tensor, how: str) -> Tensor:
    """(..., heads, seq, d_k) -> (..., seq, d_model), the right way or a classic wrong one."""
    *lead, heads, seq, d_k = t.shape
    if how == "no transpose":
        return t.reshape(*lead, seq, heads * d_k)
    if how == "strided":
        return t.movedim(-3, -1).reshape(*lead, seq, heads * d_k)
    return t.transpose(-3, -2).reshape(*lead, seq, heads * d_k)


def _mhsa(x: Tensor, weights: dict[str, Tensor], heads: int, theta: float | None = None,
          positions: Tensor | None = None, *, split: str = "right", merge: str | None = None, mask: str = "causal",
          scale: str = "d_k", rope_on: str = "qk", rope_width: str = "d_k", head_axis: bool = True,
          output_proj: bool = True) -> Tensor:
    """Multi-head self-attention from F.linear and F.scaled_dot_product_attention, with one knob turned."""
    x = x.detach().double().cpu()
    w = {name: weight.double() for name, weight in weights.items()}
    seq, d_model = x.shape[-2:]
    q, k, v = (F.linear(x, w[name]) for name in ("q_proj", "k_proj", "v_proj"))
    rope = theta is not None and rope_on != "none"
    if rope:
        positions = torch.arange(seq) if positions is None else positions.cpu()
        rotated = {"qk": "qk", "qkv": "qkv", "q": "q", "k": "k"}[rope_on]
    if rope and rope_width == "d_model":  # RoPE on the whole d_model-vector, before the split
        q, k, v = (reference.rotate(t, positions, theta) if name in rotated else t for name, t in zip("qkv", (q, k, v)))
    q, k, v = (_split(t, heads, split) for t in (q, k, v))
    if rope and rope_width == "d_k":
        where = positions.unsqueeze(-2) if head_axis else positions
        q, k, v = (reference.rotate(t, where, theta) if name in rotated else t for name, t in zip("qkv", (q, k, v)))
    d_k = d_model // heads
    factor = 1 / math.sqrt(d_model if scale == "d_model" else d_k)
    if mask == "causal":
        out = _SDPA(q, k, v, is_causal=True, scale=factor)
    else:
        allowed = {"none": torch.ones(seq, seq), "diagonal": torch.ones(seq, seq).tril(-1),
                   "flipped": torch.ones(seq, seq).triu()}[mask].bool()
        out = _SDPA(q, k, v, attn_mask=allowed, scale=factor)
    out = _merge(out, split if merge is None else merge)
    return F.linear(out, w["output_proj"]) if output_proj else out


# Each: (keyword arguments of _mhsa that make the mistake, the mistake, the fix). Order: most specific first.
_STRUCTURE_VARIANTS = [
    (dict(split="no transpose"),
     "the heads are split without the transpose: a reshape straight to (..., heads, seq, d_k) hands each head "
     "pieces of several tokens",
     f"split the features of each token first, then move the heads axis before seq: {_SPLIT}"),
    (dict(split="no transpose", merge="right"),
     "the heads are split without the transpose: a reshape straight to (..., heads, seq, d_k) hands each head "
     "pieces of several tokens",
     f"split the features of each token first, then move the heads axis before seq: {_SPLIT}"),
    (dict(merge="no transpose"),
     "the heads are merged without the transpose: a reshape of (..., heads, seq, d_k) straight to (..., seq, d_model) "
     "glues rows of different tokens together",
     "move seq back before the heads first, so that each token's heads are glued together, the exact inverse of the "
     "split"),
    (dict(split="strided"),
     "each head takes every num_heads-th feature ((d_k heads) instead of (heads d_k)), not a contiguous block",
     f"{_SPLIT}; merge back the same way"),
    (dict(mask="none"),
     "the attention is not causal: every query also sees the keys after it (the future)",
     "attend with a causal mask, True where query i may attend to key j, i.e. j ≤ i (the lower triangle)"),
    (dict(mask="flipped"),
     "the causal mask is flipped: each query sees itself and the future instead of itself and the past",
     "query i may attend to keys j ≤ i, the lower triangle: True means 'may attend'"),
    (dict(mask="diagonal"),
     "the causal mask hides the diagonal: query i must see key i (itself) too",
     "the lower triangle includes its diagonal: keys j ≤ i, not j < i"),
    (dict(scale="d_model"),
     "the scores are scaled by 1/√d_model instead of 1/√d_k",
     "each head is a dot product of d_k = d_model / num_heads numbers, so √d_k is its scale; "
     "scaled_dot_product_attention takes it from the last dimension of its inputs by itself"),
    (dict(output_proj=False),
     "output_proj is not applied: the merged heads are returned as they are",
     "the merged heads go through output_proj, which mixes what the heads found"),
]
_ROPE_VARIANTS = [
    (dict(rope_on="qkv"),
     "RoPE is applied to V too: the values, and so the output, then depend on absolute positions",
     f"rotate only the queries and the keys, {_RIGHT_ROPE}"),
    (dict(rope_width="d_model"),
     "RoPE is applied before splitting the heads (with d_k = d_model), so each head gets a different rotation",
     f"apply it {_RIGHT_ROPE} and a RotaryPositionalEmbedding built with d_k = d_model // num_heads"),
    (dict(rope_width="d_model", rope_on="qkv"),
     "RoPE is applied before splitting the heads (with d_k = d_model), so each head gets a different rotation",
     f"apply it {_RIGHT_ROPE} and a RotaryPositionalEmbedding built with d_k = d_model // num_heads"),
    (dict(rope_on="none"),
     "RoPE is not applied, though max_seq_len and theta are given",
     f"with max_seq_len and theta, build a RotaryPositionalEmbedding of size d_k and apply it {_RIGHT_ROPE}"),
    (dict(rope_on="q"),
     "RoPE is applied to the queries only: the scores need both sides rotated to depend on the offset",
     f"rotate the keys too, {_RIGHT_ROPE}"),
    (dict(rope_on="k"),
     "RoPE is applied to the keys only: the scores need both sides rotated to depend on the offset",
     f"rotate the queries too, {_RIGHT_ROPE}"),
]
_POSITION_VARIANTS = [
    (dict(positions=None),
     "token_positions is ignored: the output is the one for positions 0 … seq-1",
     "rotate with the token_positions you are given, and default to range(seq) only when it is None"),
    (dict(head_axis=False),
     "token_positions reach RoPE without a head axis, so positions (batch, seq) line up with the heads of "
     "(batch, heads, seq, d_k) (head j is rotated with sequence j's positions)",
     "give them a size-1 head axis, token_positions.unsqueeze(-2), so that every head gets the same rotation"),
]


# ---------------------------------------------------------------------------------------------------------
# Running the learner's module
# ---------------------------------------------------------------------------------------------------------

def _make(impl: Any, *args: Any, **kwargs: Any) -> nn.Module:
    return construct(_NAME, impl, *args, **kwargs)


def _known_weights(gen: torch.Generator, d_model: int = _D_MODEL) -> dict[str, Tensor]:
    """Four (d_model, d_model) weights, N(0, 1/d_model), so activations stay of order 1."""
    return {name: torch.randn(d_model, d_model, generator=gen, dtype=torch.float64) / math.sqrt(d_model)
            for name in _PROJECTIONS}


def _load(module: nn.Module, weights: dict[str, Tensor]) -> None:
    state = {f"{name}.weight": w for name, w in weights.items()}
    dtype = module.q_proj.weight.dtype
    call(f"{_NAME}.load_state_dict(...) with the names {sorted(state)}",
         module.load_state_dict, {key: value.to(dtype) for key, value in state.items()}, strict=True)


def _forward(module: nn.Module, x: Tensor, positions: Tensor | None, what: str) -> Tensor:
    """The learner's output (F.scaled_dot_product_attention refused unless the module was built with fused=True)."""
    args = (x,) if positions is None else (x, positions)
    if getattr(module, "fused", False) is True:
        out = call(what, module, *args)
    else:
        with BuiltinSpy({_SDPA: "F.scaled_dot_product_attention"}) as spy:
            out = call(what, module, *args)
        if spy.used:
            fail(f"{what} calls F.scaled_dot_product_attention, though the default path (fused=False) is the one "
                 "built from scratch",
                 "run the heads through your scaled_dot_product_attention (notebook 05) with a causal mask; keep the "
                 "built-in for fused=True")
    return expect_like(what, out, x, returns="return only the output of output_proj",
                       shape_fix=f"split into heads and merge them back to (..., seq, d_model): {_SPLIT}")


def _compare(out: Tensor, x: Tensor, weights: dict[str, Tensor], theta: float | None, positions: Tensor | None,
             variants: list, what: str, **tolerance: float) -> None:
    """``out`` equals the built-in reference; if not, name the first classic variant it matches."""
    heads = _HEADS
    expected = _mhsa(x, weights, heads, theta, positions)
    if close(out, expected, **tolerance):
        return
    for knobs, mistake, fix in variants:
        knobs = dict(knobs)
        wrong_positions = knobs.pop("positions", positions)
        if theta is None and any(key.startswith("rope") or key == "head_axis" for key in knobs):
            continue
        try:
            wrong = _mhsa(x, weights, heads, theta, wrong_positions, **knobs)
        except RuntimeError:  # this variant cannot run on these shapes
            continue
        if not close(wrong, expected, **tolerance) and close(out, wrong, **tolerance):
            fail(mistake, fix, f"on {what}, your output matches that variant, not the reference "
                 "(F.linear + F.scaled_dot_product_attention(is_causal=True))")
    diff = (out.detach().double().cpu() - expected).abs().nan_to_num(nan=math.inf).max().item()
    rope_hint = (" If it is right without RoPE (max_seq_len and theta None) but not with it, run check_rope on your "
                 "RotaryPositionalEmbedding.") if theta is not None else ""
    fail(f"the output differs from the built-in reference (F.linear + F.scaled_dot_product_attention(is_causal=True)) "
         f"by up to {diff:.3g} on {what}",
         "project with q_proj, k_proj, v_proj; split into heads; causal attention per head; merge; output_proj"
         + rope_hint)


# ---------------------------------------------------------------------------------------------------------
# The steps
# ---------------------------------------------------------------------------------------------------------

def _check_structure(impl: Any) -> None:
    """Signature, the four Linear submodules with the contract's names and shapes, nothing else, no bias."""
    refuse_instance(impl, "check_multihead_self_attention")
    check_signature(impl, _SIGNATURE, _NAME)
    with unfilled_is_nan():  # a weight never filled is NaN here, never an old tensor's numbers that match another's
        module = _make(impl, _D_MODEL, _HEADS)
    if isinstance(module, nn.MultiheadAttention) or any(isinstance(m, nn.MultiheadAttention) for m in module.modules()):
        fail(f"{_NAME} is (or contains) torch.nn.MultiheadAttention",
             "build it from four Linear layers, q_proj, k_proj, v_proj and output_proj, and "
             "scaled_dot_product_attention")
    projections = [getattr(module, name, None) for name in _PROJECTIONS]
    shared = [name for name, proj in zip(_PROJECTIONS, projections)
              if proj is not None and sum(other is proj for other in projections) > 1]
    if shared:
        fail(f"{' and '.join(shared)} are one and the same Linear, so they share one weight",
             "create each projection as its own Linear(d_model, d_model, device=device, dtype=dtype)")
    found = {key: tuple(p.shape) for key, p in module.named_parameters()}
    expected = {f"{name}.weight": (_D_MODEL, _D_MODEL) for name in _PROJECTIONS}
    if set(found) == set(expected) - {"output_proj.weight"}:
        fail(f"{_NAME} has no output_proj (its parameters are {sorted(found)})",
             "add self.output_proj = Linear(d_model, d_model, device=device, dtype=dtype) and apply it to the merged "
             "heads")
    fused_qkv = [key for key, shape in found.items() if shape == (3 * _D_MODEL, _D_MODEL)]
    if fused_qkv:
        fail(f"{_NAME} computes Q, K and V with one projection ({fused_qkv[0]} of shape {found[fused_qkv[0]]}), "
             "but the course's checkpoints store three",
             "use three Linear(d_model, d_model) submodules named q_proj, k_proj and v_proj")
    check_parameters(module, expected, _NAME)
    rope_module = _make(impl, _D_MODEL, _HEADS, _MAX_SEQ_LEN, _THETA)
    check_parameters(rope_module, expected, f"{_NAME} with RoPE")
    weights = [p.detach() for name, p in module.named_parameters()]
    if any(torch.equal(weights[0], w) for w in weights[1:]):
        fail(f"{_NAME}'s projections start with identical weights",
             "create each projection as its own Linear(d_model, d_model, ...): each draws its own initial weight")


def _check_init(impl: Any) -> None:
    """Each projection starts as the recipe's Linear does: std 0.987·σ with σ² = 2/(d_model + d_model)."""
    d_model = 64
    torch.manual_seed(0)
    module = check_initialised(_NAME, lambda: impl(d_model, 4), _INIT_FIX)
    sigma = math.sqrt(2 / (2 * d_model))
    for name in _PROJECTIONS:
        w = getattr(module, name).weight.detach().double()
        if not torch.isfinite(w).all():
            fail(f"{name}.weight contains NaN or inf, so it is not initialised",
                 "create the projections with the package's Linear, which initialises its weight")
        ratio = w.std().item() / sigma
        if not 0.9 <= ratio <= 1.08:
            fail(f"{name}.weight's initial std is {ratio:.2f} σ, not Linear's 0.987 σ (σ² = 2 / (d_model + d_model))",
                 "create the projections with Linear(d_model, d_model, device=device, dtype=dtype) and keep its "
                 "initialisation")


def _check_devices(impl: Any) -> None:
    check_device_and_dtype(lambda **kwargs: impl(_D_MODEL, _HEADS, **kwargs), _NAME)
    check_buffers_device(lambda **kwargs: impl(_D_MODEL, _HEADS, _MAX_SEQ_LEN, _THETA, **kwargs), _NAME,
                         "pass device=device to RotaryPositionalEmbedding(theta, d_k, max_seq_len, device=device)")


def _inputs(gen: torch.Generator, leading: tuple[int, ...], dtype: torch.dtype = torch.float64,
            seq: int = _SEQ) -> Tensor:
    return torch.randn(*leading, seq, _D_MODEL, generator=gen, dtype=torch.float64).to(dtype)


def _check_without_rope(impl: Any, gen: torch.Generator) -> None:
    """No RoPE: float64 over several leading shapes, then float32."""
    weights = _known_weights(gen)
    for dtype, leading_shapes, tolerance in [(torch.float64, [(2,), (), (2, 3)], {}),
                                             (torch.float32, [(2,)], dict(rtol=1e-5, atol=1e-5))]:
        module = _make(impl, _D_MODEL, _HEADS, dtype=dtype)
        _load(module, weights)
        for leading in leading_shapes:
            x = _inputs(gen, leading, dtype)
            what = f"{_NAME}({_D_MODEL}, {_HEADS}) on x of shape {tuple(x.shape)}, {dtype}"
            out = _forward(module, x, None, what)
            _compare(out, x, weights, None, None, _STRUCTURE_VARIANTS, what, **tolerance)


def _check_with_rope(impl: Any, gen: torch.Generator) -> None:
    """RoPE: default positions, per-sequence positions (batch = heads, so a missing head axis shows), broadcast
    (seq,)."""
    weights = _known_weights(gen)
    module = _make(impl, _D_MODEL, _HEADS, _MAX_SEQ_LEN, _THETA, dtype=torch.float64)
    _load(module, weights)
    tolerance = dict(rtol=1e-6, atol=1e-6)  # RoPE's tables may be float32
    name = f"{_NAME}({_D_MODEL}, {_HEADS}, max_seq_len={_MAX_SEQ_LEN}, theta={_THETA:g})"
    x = _inputs(gen, (_HEADS,))
    what = f"{name} on x of shape {tuple(x.shape)}, token_positions=None"
    _compare(_forward(module, x, None, what), x, weights, _THETA, None, _STRUCTURE_VARIANTS + _ROPE_VARIANTS, what,
             **tolerance)
    # Uneven positions (two packed documents, gaps): a uniform shift would change nothing, RoPE being relative.
    positions = torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 0, 1], [2, 3, 7, 8, 15]])
    what = f"{name} on x of shape {tuple(x.shape)}, token_positions {positions.tolist()}"
    _compare(_forward(module, x, positions, what), x, weights, _THETA, positions,
             _POSITION_VARIANTS + _ROPE_VARIANTS + _STRUCTURE_VARIANTS, what, **tolerance)
    x = _inputs(gen, (2, 2))
    positions = torch.tensor([3, 4, 6, 9, 10])
    what = f"{name} on x of shape {tuple(x.shape)}, token_positions {positions.tolist()} (shared by every sequence)"
    _compare(_forward(module, x, positions, what), x, weights, _THETA, positions,
             _POSITION_VARIANTS + _ROPE_VARIANTS + _STRUCTURE_VARIANTS, what, **tolerance)


def _check_full_length(impl: Any, gen: torch.Generator) -> None:
    """A sequence of max_seq_len tokens with the default positions: 0 … max_seq_len - 1 must all be in RoPE's table.

    A shift of every position by one changes no score (RoPE only sees offsets), so it shows only here, where the last
    position falls off the end of the table.
    """
    weights = _known_weights(gen)
    module = _make(impl, _D_MODEL, _HEADS, _MAX_SEQ_LEN, _THETA, dtype=torch.float64)
    _load(module, weights)
    x = _inputs(gen, (), seq=_MAX_SEQ_LEN)
    what = f"{_NAME}(..., max_seq_len={_MAX_SEQ_LEN}) on x of shape {tuple(x.shape)} (a full-length sequence)"
    try:
        out = _forward(module, x, None, what)
    except AssertionError as error:
        cause = str(error.__cause__ or "")
        if f"got values from 1 to {_MAX_SEQ_LEN}" in cause or f"got range(1, {_MAX_SEQ_LEN + 1})" in cause:
            fail("the default positions are shifted by one (1 … seq instead of 0 … seq - 1): the last token of a "
                 "full-length sequence falls off the end of RoPE's table",
                 "default token_positions to range(seq) (positions start at 0), and pass them on unchanged",
                 f"{what}: {cause.splitlines()[0]}")
        raise
    _compare(out, x, weights, _THETA, None, _STRUCTURE_VARIANTS + _ROPE_VARIANTS, what, rtol=1e-6, atol=1e-6)


def _check_gradients(impl: Any, gen: torch.Generator) -> None:
    """x.grad and every projection's weight.grad equal the reference's (float64, with RoPE)."""
    weights = _known_weights(gen)
    module = _make(impl, _D_MODEL, _HEADS, _MAX_SEQ_LEN, _THETA, dtype=torch.float64)
    _load(module, weights)
    x = _inputs(gen, (2,)).requires_grad_()
    upstream = torch.randn(2, _SEQ, _D_MODEL, generator=gen, dtype=torch.float64)
    what = f"{_NAME} with RoPE on x of shape {tuple(x.shape)}"
    out = _forward(module, x, None, what)
    learner_weights = {name: (f"{name}.weight", getattr(module, name).weight) for name in _PROJECTIONS}
    check_gradients(_NAME, what, out, x, upstream, _mhsa_differentiable, weights, learner_weights,
                    source="the projections and x", unit="projection")


def _mhsa_differentiable(x: Tensor, weights: dict[str, Tensor]) -> Tensor:
    """The reference with RoPE at default positions, keeping the graph to x and the weights."""
    return reference.multihead_self_attention(x, {f"{name}.weight": w for name, w in weights.items()}, _HEADS, _THETA)


def _check_fused(impl: Any, gen: torch.Generator) -> None:
    """If the class takes ``fused``, fused=True must give the same output (through any kernel it likes)."""
    if "fused" not in inspect.signature(impl.__init__).parameters:
        return
    weights = _known_weights(gen)
    module = _make(impl, _D_MODEL, _HEADS, _MAX_SEQ_LEN, _THETA, dtype=torch.float64, fused=True)
    _load(module, weights)
    x = _inputs(gen, (2,))
    out = call(f"{_NAME}(..., fused=True) on x of shape {tuple(x.shape)}", module, x)
    if not close(out, _mhsa(x, weights, _HEADS, _THETA), rtol=1e-6, atol=1e-6):
        fail(f"{_NAME}(..., fused=True) differs from the reference, though the default path matches it",
             "with fused=True, replace only the attention step: F.scaled_dot_product_attention(q, k, v, "
             "is_causal=True) "
             "on the same (rotated) heads")


def check_multihead_self_attention(impl: Callable[..., Any]) -> None:
    """Check the learner's ``MultiHeadSelfAttention`` class; print one line if right, else raise ``AssertionError``.

    Checked: the signature ``(d_model, num_heads, max_seq_len=None, theta=None, device=None, dtype=None)``; the
    parameters exactly ``q_proj.weight``, ``k_proj.weight``, ``v_proj.weight``, ``output_proj.weight``
    (d_model × d_model, no bias), with and without RoPE (its tables are not saved); Linear's initialisation;
    ``device`` and ``dtype`` honoured (RoPE's tables too); then, with known weights loaded by name, the output
    against a reference built from ``F.linear`` and ``F.scaled_dot_product_attention(is_causal=True)``
    (d_model 12 in 3 heads, 5 tokens; leading shapes (), (2,), (2, 3), (2, 2); float64 and float32), with RoPE
    (θ = 10000) at the default positions, at uneven per-sequence positions and at positions shared by the batch;
    the gradients of x and of every weight; ``fused=True`` if the class takes it. The default path may not call
    ``F.scaled_dot_product_attention``. Inputs come from a fixed seed; the caller's random state is kept.

    Mistakes it recognises (by name, in the first line of the error):
        * heads split without the transpose (a reshape straight to (..., heads, seq, d_k));
        * heads merged without the transpose; heads that take strided features ((d_k heads));
        * not causal; the causal mask flipped (the future); the diagonal masked;
        * scores scaled by 1/√d_model instead of 1/√d_k;
        * RoPE applied to V too; RoPE applied before splitting the heads (d_k = d_model, a different rotation per
          head); RoPE missing, or on Q or K only;
        * token_positions ignored; token_positions without a head axis (positions lined up with the heads); the
          default positions shifted by one (1 … seq: seen on a full-length sequence, where the last one falls off
          RoPE's table; everywhere else a uniform shift changes no score);
        * output_proj missing, or not applied; one fused qkv projection; projections that are one shared Linear;
          nn.MultiheadAttention inside;
        * wrong parameter names or shapes, a bias, RoPE tables saved in the state dict;
        * F.scaled_dot_product_attention in the default path; device/dtype ignored; projections with identical
          or never filled (torch.empty) weights; no gradient (detached computations);
        * num_kv_heads (if the class takes it): k_proj and v_proj not num_kv_heads·d_k rows; the key/value heads tiled
          (0, 1, 0, 1) instead of repeated in place; one key/value head for every query head;
        * cache= (if forward takes it; a stand-in with notebook 12's contract, `length` and `update`): the repeated
          heads stored; update never called; new tokens rotated from position 0; the mask aligned to the first key.
    """
    with torch.random.fork_rng(devices=[]):
        _check_structure(impl)
        _check_init(impl)
        _check_devices(impl)
        gen = generator(0)
        _check_without_rope(impl, gen)
        _check_with_rope(impl, gen)
        _check_gradients(impl, gen)
        _check_fused(impl, gen)
        _check_full_length(impl, gen)
        _check_grouped(impl, gen)
        _check_cache_hook(impl, gen)
    takes = inspect.signature(impl.__init__).parameters
    passed("check_multihead_self_attention: q/k/v/output_proj, no bias; matches F.linear + "
           "F.scaled_dot_product_attention(is_causal=True) with known weights (4 leading shapes, float32/64), "
           "with RoPE on Q and K (default, uneven and shared positions); gradients"
           + ("; fused=True" if "fused" in takes else "")
           + ("; grouped-query attention" if "num_kv_heads" in takes else "")
           + ("; the cache's hook" if "cache" in inspect.signature(impl.forward).parameters else ""))


# ---------------------------------------------------------------------------------------------------------
# Grouped-query attention and the cache's hook (Step 6; notebook 12's KVCache, here a stand-in)
# ---------------------------------------------------------------------------------------------------------

# 6 query heads of d_k = 4 over 2 key/value heads (g = 3): d_model 24, so that every order of the heads differs.
_GQA_D_MODEL, _GQA_HEADS, _GQA_KV = 24, 6, 2
_GROUPS = ("key/value head j serves query heads j·g … j·g+g−1 (g = num_heads / num_kv_heads): each key/value head's "
           "g copies side by side, in front of seq")


def _grouped_weights(gen: torch.Generator) -> dict[str, Tensor]:
    d, kv = _GQA_D_MODEL, _GQA_KV * _GQA_D_MODEL // _GQA_HEADS
    rows = {"q_proj": d, "k_proj": kv, "v_proj": kv, "output_proj": d}
    return {name: torch.randn(rows[name], d, generator=gen, dtype=torch.float64) / math.sqrt(d) for name in rows}


def _grouped(x: Tensor, weights: dict[str, Tensor], order: str = "in place") -> Tensor:
    """Grouped-query attention with RoPE (default positions), the key/value heads repeated in `order`: "in place" (the
    right one, 0 0 0 1 1 1), "tiled" (0 1 0 1 0 1) or "first" (every query head reads head 0)."""
    heads, kv, group = _GQA_HEADS, _GQA_KV, _GQA_HEADS // _GQA_KV
    q = reference.split_heads(F.linear(x, weights["q_proj"]), heads)
    k, v = (reference.split_heads(F.linear(x, weights[name]), kv) for name in ("k_proj", "v_proj"))
    where = torch.arange(x.shape[-2]).unsqueeze(-2)
    q, k = reference.rotate(q, where, _THETA), reference.rotate(k, where, _THETA)
    if order == "in place":
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    elif order == "tiled":
        k, v = torch.cat([k] * group, dim=-3), torch.cat([v] * group, dim=-3)
    else:
        k, v = (t[..., :1, :, :].expand(*t.shape[:-3], heads, *t.shape[-2:]) for t in (k, v))
    return F.linear(reference.merge_heads(_SDPA(q, k, v, is_causal=True)), weights["output_proj"])


def _check_grouped(impl: Any, gen: torch.Generator) -> None:
    """num_kv_heads: k_proj and v_proj of num_kv_heads·d_k rows, and the groups in the right order."""
    if "num_kv_heads" not in inspect.signature(impl.__init__).parameters:
        return
    module = _make(impl, _GQA_D_MODEL, _GQA_HEADS, _MAX_SEQ_LEN, _THETA, dtype=torch.float64, num_kv_heads=_GQA_KV)
    d_kv = _GQA_KV * _GQA_D_MODEL // _GQA_HEADS
    shapes = {name: tuple(p.shape) for name, p in module.named_parameters()}
    expected_shapes = {"q_proj.weight": (24, 24), "k_proj.weight": (d_kv, 24), "v_proj.weight": (d_kv, 24),
                       "output_proj.weight": (24, 24)}
    if shapes != expected_shapes:
        fail(f"{_NAME}(24, 6, num_kv_heads=2) has the parameters {shapes}, expected {expected_shapes}",
             "k_proj and v_proj map d_model to num_kv_heads·d_k (d_k = d_model / num_heads): only the keys and values "
             "have fewer heads, the queries keep num_heads")
    weights = _grouped_weights(gen)
    _load(module, weights)
    x = torch.randn(2, 7, _GQA_D_MODEL, generator=gen, dtype=torch.float64)
    what = f"{_NAME}(24, 6, num_kv_heads=2) with RoPE on x of shape {tuple(x.shape)}"
    out = _forward(module, x, None, what)
    expected = _grouped(x, weights)
    if close(out, expected):
        return
    for order, mistake in (("tiled", "the key/value heads are tiled (0, 1, 0, 1, …): query head h reads key/value "
                                     "head h mod num_kv_heads"),
                           ("first", "every query head reads key/value head 0")):
        if close(out, _grouped(x, weights, order)):
            fail(f"{what}: {mistake}", _GROUPS)
    fail(f"{what} differs from grouped-query attention (F.scaled_dot_product_attention with enable_gqa) by up to "
         f"{(out.detach() - expected).abs().max().item():.3g}",
         f"split the keys and values into num_kv_heads heads; {_GROUPS}")


class _RecordingCache:
    """A stand-in for notebook 12's KVCache, with the contract the hook relies on: `length` positions held, and
    `update(k, v)` that appends and returns every key and value so far. It records the shapes it was given."""

    def __init__(self) -> None:
        self.keys = self.values = None
        self.length, self.given = 0, []

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.given.append(tuple(k.shape))
        self.keys = k if self.keys is None else torch.cat([self.keys, k], dim=-2)
        self.values = v if self.values is None else torch.cat([self.values, v], dim=-2)
        self.length = self.keys.shape[-2]
        return self.keys, self.values


def _rows_seeing_the_first_keys(x: Tensor, weights: dict[str, Tensor], kv: int) -> Tensor:
    """The last token's output when its mask is the top-left triangle: it sees key 0 only (the mask of torch.tril
    without the shift, or of is_causal with fewer queries than keys)."""
    heads = _GQA_HEADS
    q = reference.split_heads(F.linear(x, weights["q_proj"]), heads)
    k, v = (reference.split_heads(F.linear(x, weights[name]), kv) for name in ("k_proj", "v_proj"))
    where = torch.arange(x.shape[-2]).unsqueeze(-2)
    q, k = reference.rotate(q, where, _THETA)[..., -1:, :], reference.rotate(k, where, _THETA)
    mask = torch.ones(1, x.shape[-2], dtype=torch.bool).tril()
    attended = _SDPA(q, k, v, attn_mask=mask, enable_gqa=kv != heads)
    return F.linear(reference.merge_heads(attended), weights["output_proj"])


def _check_cache_hook(impl: Any, gen: torch.Generator) -> None:
    """forward(x, cache=...): the new tokens at positions cache.length …, the key/value heads stored once rotated, and
    the queries attending over what update returns: prompt + single tokens + a chunk = the rows of the whole input."""
    if "cache" not in inspect.signature(impl.forward).parameters:
        return
    grouped = "num_kv_heads" in inspect.signature(impl.__init__).parameters
    kv = _GQA_KV if grouped else _GQA_HEADS
    extra = {"num_kv_heads": _GQA_KV} if grouped else {}
    module = _make(impl, _GQA_D_MODEL, _GQA_HEADS, _MAX_SEQ_LEN, _THETA, dtype=torch.float64, **extra)
    weights = _grouped_weights(gen) if grouped else _known_weights(gen, _GQA_D_MODEL)
    _load(module, weights)
    x = torch.randn(2, 8, _GQA_D_MODEL, generator=gen, dtype=torch.float64)
    whole = call(f"{_NAME} on x of shape {tuple(x.shape)}", module, x)
    cache, rows, start = _RecordingCache(), [], 0
    for n in (4, 1, 1, 2):  # a prompt, two single tokens, then a chunk after the cached positions
        what = f"{_NAME}(x[:, {start}:{start + n}], cache=...) after {start} cached positions"
        rows.append(call(what, module, x[:, start:start + n], cache=cache))
        if cache.given and cache.given[-1][1] != kv:
            fail(f"{what} gave the cache keys of shape {cache.given[-1]}: {cache.given[-1][1]} heads, not the "
                 f"{kv} key/value heads",
                 "store the key/value heads as they come from the projections (after RoPE), and repeat them for the "
                 "query heads only after the cache: what it saves is their being fewer")
        if len(cache.given) != len(rows):
            fail(f"{what} did not call cache.update(k, v)",
                 "with a cache, hand it the new keys (rotated) and values, and attend over what it returns")
        start += n
    out = torch.cat(rows, dim=-2)
    if close(out, whole):
        return
    rotated_at_zero = reference.rotate(reference.split_heads(F.linear(x[:, 6:8], weights["k_proj"]), kv),
                                       torch.arange(2).unsqueeze(-2), _THETA)
    if torch.allclose(cache.keys[:, :, 6:8], rotated_at_zero):
        fail("with a cache, the new tokens are rotated as if they started at position 0 (the chunk after 6 cached "
             "positions)", "they sit after the cache.length positions the cache holds: rotate them at length, "
             "length + 1, …")
    if close(rows[1], _rows_seeing_the_first_keys(x[:, :5], weights, kv)):
        fail("with a cache, the new token after 4 cached positions attends as if it were the first: the causal mask "
             "is aligned to the first key", "the new tokens are the last of all the keys: query i (of n new ones) "
             "sees keys 0 … past + i, a triangle shifted by past (one new token sees every key)")
    fail(f"with a cache, prompt + single tokens + a chunk differ from the rows of the whole input by up to "
         f"{(out.detach() - whole.detach()).abs().max().item():.3g}",
         "rotate the new queries and keys at cache.length …, store the keys and values with cache.update, and "
         "attend over every key and value it returns")

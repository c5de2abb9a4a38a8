"""The checks of notebook 16 (decoding fast): ``check_int8_linear`` (a Linear whose weight is int8 with one scale per
output row), ``check_fused_self_attention`` and ``check_fused_swiglu`` (one product where there were three, or two),
``check_prepare_for_decode`` (a whole TransformerLM made ready to decode) and ``check_static_step`` (one token
through the prepared blocks at a fixed shape).

Each compares the learner's code with an answer computed here independently: an Int8Linear's buffers with the
quantization written out row by row and its outputs with x (q · scale)ᵀ in float64; a fused attention or SwiGLU with
the course's MultiHeadSelfAttention or SwiGLU it was built from, over a prompt, given positions and a KV cache, the
classic mistakes built from the reference's pieces (``transformer_from_scratch.reference``); a prepared model with the
same model unprepared (its logits, its greedy tokens through the course's ``generate``, its state dict). When they
differ, it names the first classic mistake the learner's result matches.

The model ``check_prepare_for_decode`` prepares is made of the Linear the learner's code sees (in a student notebook,
``my_transformer``'s own), so that a ``prepare_for_decode`` that recognises only that Linear is checked on it.
"""

from __future__ import annotations

import copy
from itertools import chain
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import reference
from ..kv_cache import KVCache
from ..linear import Linear as CourseLinear
from ..multihead_attention import MultiHeadSelfAttention
from ..swiglu import SwiGLU
from ..transformer_lm import TransformerLM, generate
from ._fixtures import LM_CTX, LM_D, LM_DFF, LM_H, LM_KV, LM_L, LM_THETA, LM_V, learners_linear
from ._harness import (attempt, call, check_signature, close, crashed, describe, diagnose, dtype_name, expect_like,
                       expect_tensor, fail, first_line, generator, passed, refuse_instance, refuses)

_COPIES_FIX = ("make the weights views of the fused matrix (Step 3's fuse_weights does): one copy of the numbers, "
               "which the state dict names and the forward reads")


def _shares_memory(t: Tensor, other: Tensor) -> bool:
    return t.untyped_storage().data_ptr() == other.untyped_storage().data_ptr()


def _column_major(t: Tensor) -> bool:
    return t.ndim == 2 and t.stride(0) == 1 and t.stride(1) >= t.shape[0]


def _check_state_dict(name: str, module: nn.Module, before: dict[str, Tensor], fix: str) -> dict[str, Tensor]:
    """The module's state dict has exactly the names and numbers of the one it was built from; returned."""
    state = module.state_dict()
    extra, missing = [key for key in state if key not in before], [key for key in before if key not in state]
    if extra:
        fail(f"{name} adds {extra} to the state dict", "hold the fused matrix as a non-persistent buffer "
             "(register_buffer(..., persistent=False), as FusedMatmul does): the state dict keeps the original's names "
             "only, so that checkpoints load before and after")
    if missing:
        fail(f"{name} drops {missing} from the state dict", fix)
    if list(state) != list(before):
        fail(f"{name} reorders the state dict: {list(state)}, expected {list(before)}", fix)
    changed = [key for key, t in before.items() if state[key].shape != t.shape or not torch.equal(state[key], t)]
    if changed:
        fail(f"{name} changes the numbers of {changed[0]} in the state dict", "fusing moves the weights into one "
             "matrix: each keeps its shape and numbers")
    return state


def _check_fused_layout(name: str, state: dict[str, Tensor], fused: tuple[str, ...], by_columns: bool = True) -> None:
    """The weights in ``fused`` (state-dict names) lie in one memory, stored column-major (row by row when built
    with by_columns=False)."""
    first = state[fused[0]]
    apart = [key for key in fused[1:] if not _shares_memory(state[key], first)]
    if apart:
        fail(f"{name}'s {' and '.join(fused)} keep their own copies: {apart[0]} is not in the fused matrix's memory",
             _COPIES_FIX)
    if by_columns and not all(_column_major(state[key]) for key in fused):
        fail(f"{name}'s fused matrix is stored row by row (strides {first.stride()}), not column-major",
             "store it column-major (Step 2): fuse_weights does, so that x @ Wᵀ reads it in order")
    if not by_columns and not all(state[key].is_contiguous() for key in fused):
        fail(f"by_columns=False is ignored: {name}'s fused matrix is stored column-major (strides {first.stride()}), "
             "not row by row", "pass by_columns on to fuse_weights: prepare_for_decode(layout=\"rows\") asks for rows "
             "where column-major reads slower (bfloat16, on many CPUs)")


# ------------------------------------------------------------------------------------------------- Int8Linear

_INT8 = "Int8Linear"


def _quantized(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8 per output row, written out: scale = max |row| / 127 (1 for zeros), q = round(W / scale)."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


_D_IN = 16  # PyTorch's int8 kernel (torch 2.13, CPU) crashes the process for bfloat16 unless d_in is a multiple of 16


def _int8_weight(gen: torch.Generator) -> Tensor:
    """(5, 16) float32, its rows of different sizes (so that one scale for all shows)."""
    rows = torch.tensor([1.0, 3.0, 0.2, 0.5, 2.0], dtype=torch.float64)[:, None]
    return (torch.randn(5, _D_IN, generator=gen, dtype=torch.float64) * rows).float()


def _check_int8_buffers(layer: nn.Module, weight: Tensor, what: str) -> tuple[Tensor, Tensor]:
    params, buffers = dict(layer.named_parameters()), dict(layer.named_buffers())
    if params:
        name = next(iter(params))
        if params[name].is_floating_point():
            fail(f"{what} keeps a float Parameter ({name}, {params[name].dtype}): the float weight is still there",
                 "keep only q (int8) and scale: register_buffer('weight', q) and register_buffer('scale', scale), "
                 "so that a step reads a quarter of float32's bytes")
        fail(f"{what} stores {name} as a Parameter, not a buffer", "register_buffer('weight', q): an int8 weight is "
             "no parameter (nothing trains it), but the state dict and .to() still take it")
    if "weight" not in buffers or "scale" not in buffers:
        fail(f"{what} has the buffers {sorted(buffers)}, expected weight and scale", "register_buffer('weight', q) and "
             "register_buffer('scale', scale): the state dict of a prepared model names them so")
    q, scale = buffers["weight"], buffers["scale"]
    if q.dtype != torch.int8:
        fail(f"{what}.weight is {q.dtype}, not torch.int8", "store q from Step 5's quantize_int8, one byte a number")
    if tuple(q.shape) == tuple(weight.shape[::-1]):
        fail(f"{what}.weight has shape {tuple(q.shape)}: it is stored transposed", "keep the weight's own shape "
             "(d_out, d_in), as a Linear does: the int8 kernel reads it so")
    expect_tensor(f"{what}.weight", q, weight.shape, "keep the weight's shape (d_out, d_in)")
    if scale.dtype != torch.float32 or tuple(scale.shape) != (weight.shape[0],):
        fail(f"{what}.scale is {describe(scale)}, expected float32 of shape {(weight.shape[0],)}", "keep Step 5's "
             "scale as it is: one float32 number per output row")
    if set(layer.state_dict()) != {"weight", "scale"}:
        fail(f"{what}'s state dict holds {sorted(layer.state_dict())}, not weight and scale", "register both as "
             "ordinary (persistent) buffers, and nothing else: a prepared model then saves its int8 weights")
    right_q, right_scale = _quantized(weight)
    if not (torch.equal(q, right_q) and close(scale, right_scale, rtol=1e-5, atol=0)):
        if close(scale, torch.full_like(scale, weight.abs().max().item() / 127), rtol=1e-5, atol=0):
            fail(f"{what} uses one scale for the whole matrix (per-tensor)", "one scale per output row: Step 5's "
                 "quantize_int8, scale[i] = max_j |W[i, j]| / 127")
        fail(f"{what}'s weight and scale differ from Step 5's quantization of the weight", "build them with "
             "quantize_int8(weight): check_quantize_int8 says what is wrong with it")
    return q, scale


def _int8_forward(layer: nn.Module, x: Tensor, q: Tensor, scale: Tensor, weight: Tensor, what: str) -> None:
    xd, dequantized = x.double(), q.double() * scale.double()[:, None]
    expected = (xd @ dequantized.T).to(x.dtype)
    with torch.no_grad():
        out, error = attempt(what, layer, x.clone())
    if error is not None:
        if x.dtype == torch.float64 and isinstance(error, RuntimeError):
            raise AssertionError(
                f"{_INT8} crashes on a float64 input: {what} raised {type(error).__name__} ({first_line(error)}): "
                "PyTorch's int8 kernel exists only on the CPU for float32, bfloat16 and float16: elsewhere fall back "
                "to Step 6's int8_matmul(x, self.weight, self.scale).") from error
        if isinstance(error, RuntimeError) and "expected scalar type" in str(error):
            raise AssertionError(
                f"the kernel's scales are not in its rows' dtype: {what} raised {type(error).__name__} "
                f"({first_line(error)}): torch._weight_int8pack_mm takes the scales in the rows' dtype: give it "
                "x's rows and self.scale both in bfloat16 (the buffer itself stays float32).") from error
        if isinstance(error, RuntimeError) and "contiguous" in str(error):
            raise AssertionError(
                f"q is not contiguous when the weight is column-major (a fused matrix, Step 2): {what} raised "
                f"{type(error).__name__} ({first_line(error)}): the int8 kernel reads q row by row: store "
                "q.contiguous() (quantize_int8 keeps the weight's layout otherwise).") from error
        crashed(what, error)
    out = expect_tensor(what, out, expected.shape, "(..., d_in) -> (..., d_out)", returns="return the product, a "
                        "tensor")
    if out.dtype != x.dtype:
        fail(f"{what} returned {out.dtype} for a {x.dtype} input", "return x's dtype: bring the kernel's bfloat16 "
             "result back with .to(x.dtype) (Step 6 computes in x's dtype)")
    exact = dict(rtol=1e-10, atol=1e-10)  # float64: Step 6; float32 and bfloat16: the kernel's bfloat16 roundings
    tolerance = exact if x.dtype == torch.float64 else dict(rtol=3e-2, atol=5e-2)
    diagnose(what, out, expected, [
        (lambda: (xd @ q.double().T).to(x.dtype), "the scale is forgotten in the forward: it returns x @ qᵀ",
         "multiply output i by scale[i] (the kernel takes the scale; Step 6 applies it)"),
        (lambda: (xd @ weight.double().T).to(x.dtype), f"{_INT8} computes with the float weight, not q · scale",
         "compute from the int8 buffers only: the float weight must not be kept, or the bytes read do not go down"),
    ], "y = x @ (q · scale[:, None])ᵀ: PyTorch's int8 kernel on the CPU for float32/bfloat16/float16, else Step 6",
        **tolerance)


def _int8_rounding(impl: type, gen: torch.Generator) -> None:
    """The kernel gets bfloat16 rows: a row [1, -1, 0, ...] times x = [1.0, 1.003, 0, ...] is 0 once x is rounded to
    bfloat16 (1.003 becomes 1.0), -0.003 in float32."""
    weight = torch.zeros(2, _D_IN)
    weight[0, :2] = torch.tensor([1.0, -1.0])
    weight[1] = torch.randn(_D_IN, generator=gen)
    what = f"{_INT8}(a weight whose row 0 is [1, -1, 0, ...])"
    layer = call(what, impl, weight)
    x = torch.zeros(1, _D_IN)
    x[0, :2] = torch.tensor([1.0, 1.003])
    with torch.no_grad():
        out = call(f"{what}(x = [1.0, 1.003, 0, ...], float32)", layer, x)
    out = expect_tensor(f"{what}(x of shape (1, {_D_IN}))", out, (1, 2), "(..., d_in) -> (..., d_out)")
    if abs(out[0, 0].item()) > 1e-4:
        fail(f"{what}(x = [1.0, 1.003, 0, ...], float32) gives {out[0, 0].item():.4f} in output 0, float32's 1.0 - "
             "1.003: the kernel did not get it rounded to bfloat16 (1.003 rounds to 1.0, and the output to 0)",
             "the kernel's fast path takes bfloat16 rows (float32 ones took about 4 times as long in a decode step "
             "on the course's Intel Xeon): x's rows and the scales .to(torch.bfloat16) for it, the result "
             ".to(x.dtype); Step 6 only where the kernel does not serve x")


def check_int8_linear(impl: type) -> None:
    """Check the learner's ``Int8Linear(weight)``; print one line if it is right, else raise ``AssertionError``.

    Checked, from a (5, 16) float32 weight whose rows differ in size: the weight given unchanged; no Parameter, the
    buffers ``weight`` (int8, (d_out, d_in)) and ``scale`` (float32, (d_out,)) equal to the quantization per output
    row written out here, and nothing else in the state dict; outputs close to x (q · scale)ᵀ for float32 (the int8
    kernel for a few vectors, to bfloat16's precision; 20 vectors, a prefill, may take Step 6), equal to it for float64
    (no kernel: Step 6) and close for bfloat16, with leading shapes (2, 3), (4, 5) and (4,) or (3,); one float32 vector
    rounded to bfloat16 for the kernel (a row [1, -1, 0, ...] gives 0 for [1.0, 1.003, 0, ...]); an Int8Linear of a
    column-major weight (a fused matrix) works too.

    Mistakes it recognises (by name, in the first line of the error): the float weight kept (a float Parameter);
    int8 stored as a Parameter, not a buffer; the weight not int8, or stored transposed; the scale not float32 or not
    (d_out,); non-persistent buffers (missing from the state dict); one scale for the whole matrix; the scale forgotten
    in the forward; the product computed with the float weight; a crash on float64 input (the kernel has no float64:
    no fallback to Step 6); float32 scales given to the kernel with bfloat16 rows (its crash); float32 rows given to
    the kernel (its slow path), or Step 6 where the kernel serves; q not contiguous for a column-major weight (the
    kernel's crash); another output dtype (the kernel's bfloat16 not converted back).
    """
    refuse_instance(impl, "check_int8_linear")
    check_signature(impl, ["weight"], _INT8)
    gen = generator(7)
    weight = _int8_weight(gen)
    given = weight.clone()
    what = f"{_INT8}(weight of shape {tuple(weight.shape)}, float32)"
    layer = call(what, impl, given)
    if not torch.equal(given, weight):
        fail(f"{what} changes the weight it was given", "quantize a copy: the float weight belongs to the model until "
             "the Int8Linear replaces it")
    q, scale = _check_int8_buffers(layer, weight, what)
    for lead, dtype in [((2, 3), torch.float32), ((4, 5), torch.float32), ((4,), torch.float64),
                        ((3,), torch.bfloat16)]:
        x = torch.randn(*lead, _D_IN, generator=gen, dtype=torch.float64).to(dtype)
        _int8_forward(layer, x, q, scale, weight, f"{_INT8}(...)(x of shape {tuple(x.shape)}, {dtype_name(dtype)})")
    column = weight.T.contiguous().T
    what = f"{_INT8}(a column-major weight of shape {tuple(weight.shape)}, as a fused matrix)"
    layer = call(what, impl, column)
    x = torch.randn(2, _D_IN, generator=gen)
    _int8_forward(layer, x, q, scale, weight, f"{what}(x of shape {tuple(x.shape)}, float32)")
    _int8_rounding(impl, gen)
    passed("check_int8_linear: int8 weight and float32 scale per output row as buffers, nothing float kept; "
           "x (q · scale)ᵀ with the int8 kernel on bfloat16 rows (float32, bfloat16 inputs) and Step 6 (float64); "
           "column-major weights too")


# ------------------------------------------------------------------------------------------------- FusedSwiGLU

_SWIGLU = "FusedSwiGLU"
_D, _DFF = 6, 10
_SWIGLU_FIX = ("one product x @ W13ᵀ, split into gate (w1's d_ff outputs, first) and up (w3's), then "
               "w2(silu(gate) ⊙ up)")
_KEEP_FIX = ("keep the original Linears as submodules, in their order (their weights become views of the fused "
             "matrix): the state dict is then the original's, names and numbers")


def _swiglu(seed: int, dtype: torch.dtype) -> SwiGLU:
    torch.manual_seed(seed)
    return SwiGLU(_D, _DFF, dtype=dtype)


def _swiglu_output(module: nn.Module, x: Tensor, what: str) -> Tensor:
    with torch.no_grad():
        out = call(what, module, x.clone())
    return expect_like(what, out, x, returns="return the output, a tensor of x's shape",
                       shape_fix="(..., d_model) -> (..., d_model): w2 brings d_ff back to d_model")


def check_fused_swiglu(impl: type) -> None:
    """Check the learner's ``FusedSwiGLU(ffn)``, built from the course's SwiGLU(6, 10); print one line if it is right,
    else raise ``AssertionError``.

    Checked: the state dict keeps SwiGLU's names (w1.weight, w2.weight, w3.weight) and numbers; w1's and w3's weights
    share one memory, column-major (row by row with by_columns=False); outputs equal SwiGLU's, w2(silu(w1 x) ⊙ w3 x),
    for leading shapes (2, 3) and (4,) in float64, and in float32; after load_state_dict of another SwiGLU's weights,
    the outputs are that SwiGLU's.

    Mistakes it recognises: the state dict changed (the Linears dropped, the fused matrix saved); w1 and w3 kept as
    copies beside the fused matrix; the fused matrix row-major; by_columns=False ignored (the float32 one is built
    so); the halves swapped (silu on w3's); silu left out; the forward reading a copy that load_state_dict (or
    training) does not reach; another output dtype or shape.
    """
    refuse_instance(impl, "check_fused_swiglu")
    check_signature(impl, ["ffn"], _SWIGLU)
    gen = generator(8)
    with torch.random.fork_rng(devices=[]):
        ffn = _swiglu(1, torch.float64)
        before = {key: t.detach().clone() for key, t in ffn.state_dict().items()}
        name = f"{_SWIGLU}(SwiGLU({_D}, {_DFF}), float64)"
        fused = call(name, impl, ffn)
        state = _check_state_dict(name, fused, before, _KEEP_FIX)
        _check_fused_layout(name, state, ("w1.weight", "w3.weight"))
        w1, w2, w3 = (before[f"{key}.weight"] for key in ("w1", "w2", "w3"))
        for lead in [(2, 3), (4,)]:
            x = torch.randn(*lead, _D, generator=gen, dtype=torch.float64)
            what = f"{name}(x of shape {tuple(x.shape)})"
            out = _swiglu_output(fused, x, what)
            diagnose(what, out, reference.swiglu(x, w1, w2, w3), [
                (lambda: reference.swiglu(x, w3, w2, w1), "the halves are swapped: silu goes on w3's output, not on "
                 "w1's (the gate)", "the fused matrix holds w1's rows first: gate = the first d_ff outputs, up = the "
                 "last d_ff; silu(gate) ⊙ up"),
                (lambda: F.linear(F.linear(x, w1) * F.linear(x, w3), w2), "silu is left out: the gate is w1 x itself",
                 "apply silu to the gate: w2(silu(gate) ⊙ up)"),
            ], _SWIGLU_FIX, rtol=1e-10, atol=1e-10)
        ffn32 = _swiglu(1, torch.float32)
        weights32 = {key: t.detach().double() for key, t in ffn32.state_dict().items()}
        name32 = f"{_SWIGLU}(SwiGLU({_D}, {_DFF}), float32, by_columns=False)"
        fused32 = call(name32, impl, ffn32, by_columns=False)
        _check_fused_layout(name32, fused32.state_dict(), ("w1.weight", "w3.weight"), by_columns=False)
        x = torch.randn(2, 3, _D, generator=gen)
        what = f"{name32}(x of shape (2, 3, {_D}), float32)"
        out = _swiglu_output(fused32, x, what)
        expected = reference.swiglu(x.double(), weights32["w1.weight"], weights32["w2.weight"], weights32["w3.weight"])
        diagnose(what, out, expected.float(), [], _SWIGLU_FIX, rtol=1e-5, atol=1e-6)
        other = _swiglu(2, torch.float64)
        call(f"{name}.load_state_dict(another SwiGLU's state dict)", fused.load_state_dict, other.state_dict())
        x = torch.randn(2, 3, _D, generator=gen, dtype=torch.float64)
        what = f"{name}(x of shape (2, 3, {_D})) after load_state_dict of another SwiGLU's weights"
        out = _swiglu_output(fused, x, what)
        o1, o2, o3 = (other.state_dict()[f"{key}.weight"] for key in ("w1", "w2", "w3"))
        stale = ("the forward reads its own copy of the weights: loading a state dict (or training) changes the "
                 "Linears' weights, not what the forward computes with")
        diagnose(what, out, reference.swiglu(x, o1, o2, o3), [
            (lambda: reference.swiglu(x, w1, w2, w3), stale, _COPIES_FIX),
            (lambda: reference.swiglu(x, w1, o2, w3), stale, _COPIES_FIX),
            (lambda: reference.swiglu(x, o1, w2, o3), stale, _COPIES_FIX),
        ], _SWIGLU_FIX, rtol=1e-10, atol=1e-10)
    passed("check_fused_swiglu: w1 and w3 one column-major matrix the state dict still names; w2(silu(w1 x) ⊙ w3 x) "
           "in float64 and float32, and after load_state_dict")


# ------------------------------------------------------------------------------------------ FusedSelfAttention

_ATTN = "FusedSelfAttention"
_MAX_SEQ_LEN, _THETA = 16, 10000.0
_ATTN_FIX = ("q, k, v from one product with the fused matrix, split by Step 4, RoPE on q and k at the tokens' "
             "positions (cache.length onwards with a cache), the keys and values through cache.update, then causal "
             "attention and output_proj")
_PROJECTIONS = ("q_proj.weight", "k_proj.weight", "v_proj.weight")
_TOLERANCE = dict(rtol=1e-6, atol=1e-6)  # float64, but RoPE's tables are float32


def _mha(seed: int, d_model: int, heads: int, kv: int, dtype: torch.dtype) -> MultiHeadSelfAttention:
    torch.manual_seed(seed)
    return MultiHeadSelfAttention(d_model, heads, _MAX_SEQ_LEN, _THETA, dtype=dtype, num_kv_heads=kv)


def _attention(x: Tensor, weights: dict[str, Tensor], heads: int, positions: Tensor | None = None, *,
               rope: bool = True, causal: bool = True, swap_kv: bool = False, split: str = "right") -> Tensor:
    """The reference's attention, or a classic wrong one: no RoPE, not causal, k and v swapped, strided heads."""
    if swap_kv:
        weights = dict(weights, **{"k_proj.weight": weights["v_proj.weight"],
                                   "v_proj.weight": weights["k_proj.weight"]})
    if split == "right":
        return reference.multihead_self_attention(x, weights, heads, _THETA if rope else None, positions,
                                                  causal=causal)
    kv = reference.kv_heads_of(weights, heads)
    q, k, v = (F.linear(x, weights[key]).unflatten(-1, (-1, n)).movedim(-1, -3)  # head h: features h, h + n, ...
               for key, n in zip(_PROJECTIONS, (heads, kv, kv)))
    where = torch.arange(x.shape[-2]).unsqueeze(-2)
    q, k = reference.rotate(q, where, _THETA), reference.rotate(k, where, _THETA)
    out = reference.SDPA(q, k, v, is_causal=True, enable_gqa=kv != heads)
    return F.linear(reference.merge_heads(out), weights["output_proj.weight"])


def _attention_output(module: nn.Module, x: Tensor, what: str, **kwargs: Any) -> Tensor:
    with torch.no_grad():
        out = call(what, module, x.clone(), **kwargs)
    return expect_like(what, out, x, returns="return the output, a tensor of x's shape",
                       shape_fix="(..., seq, d_model) -> (..., seq, d_model): merge the heads back, then output_proj")


def _check_attention_config(impl: type, gen: torch.Generator, d_model: int, heads: int, kv: int,
                            mha_passed: bool) -> None:
    mha = _mha(1, d_model, heads, kv, torch.float64)
    original = copy.deepcopy(mha)
    before = {key: t.detach().clone() for key, t in mha.state_dict().items()}
    kind = "multi-head" if kv == heads else "grouped-query"
    name = f"{_ATTN}(MultiHeadSelfAttention({d_model}, {heads}, num_kv_heads={kv}), float64)"
    fused = call(name, impl, mha)
    state = _check_state_dict(name, fused, before, _KEEP_FIX)
    _check_fused_layout(name, state, _PROJECTIONS)
    # a prompt
    x = torch.randn(2, 5, d_model, generator=gen, dtype=torch.float64)
    what = f"{name}(x of shape {tuple(x.shape)})"
    with torch.no_grad():
        out, error = attempt(what, fused, x.clone())
    if error is not None:
        if mha_passed and kv != heads:
            raise AssertionError(
                f"the split is probably into equal thirds: {_ATTN} crashes with grouped-query attention ({what} "
                f"raised {type(error).__name__}: {first_line(error)}), though multi-head attention works: keys and "
                "values are narrower than queries: split with Step 4's split_qkv, given num_heads and num_kv_heads.") \
                from error
        crashed(what, error)
    out = expect_like(what, out, x, returns="return the output, a tensor of x's shape",
                      shape_fix="(..., seq, d_model) -> (..., seq, d_model)")
    with torch.no_grad():
        expected = original(x)
    diagnose(what, out, expected, [
        (lambda: _attention(x, before, heads, causal=False), "the attention is not causal: every token sees the ones "
         "after it", "attend causally (is_causal=True for a prompt, as notebook 08's _attend(…, fused=True) does)"),
        (lambda: _attention(x, before, heads, rope=False), "RoPE is not applied to q and k",
         "rotate q and k with self.rope at the tokens' positions after the split, before the attention"),
        (lambda: _attention(x, before, heads, swap_kv=True), "k and v are swapped after the split",
         "the fused output holds queries, keys, then values: Step 4 returns them in that order"),
        (lambda: _attention(x, before, heads, split="strided"), "each head takes every num_heads-th feature, not a "
         "block of d_k neighbours", "split with Step 4's split_qkv: head h owns features h·d_k … (h+1)·d_k - 1"),
    ], _ATTN_FIX, **_TOLERANCE, evidence=kind)
    # given positions
    x = torch.randn(2, 4, d_model, generator=gen, dtype=torch.float64)
    positions = torch.tensor([[3, 4, 5, 6], [0, 2, 4, 6]])
    what = f"{name}(x of shape {tuple(x.shape)}, token_positions {positions.tolist()})"
    out = _attention_output(fused, x, what, token_positions=positions)
    with torch.no_grad():
        expected = original(x, positions)
    diagnose(what, out, expected, [
        (lambda: _attention(x, before, heads), "token_positions are ignored: RoPE rotates at 0 … seq-1 whatever "
         "positions are given", "rotate q and k at token_positions when given (with a head axis: "
         "token_positions.unsqueeze(-2))"),
    ], _ATTN_FIX, **_TOLERANCE)
    # a cache: a prompt of 4 tokens, then 1, 1 and 2
    x = torch.randn(2, 8, d_model, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        full = original(x)
    cache = KVCache(2, kv, _MAX_SEQ_LEN, d_model // heads, dtype=torch.float64)
    restart = torch.cat([torch.arange(4), torch.arange(1), torch.arange(1), torch.arange(2)])
    for start, end in [(0, 4), (4, 5), (5, 6), (6, 8)]:
        what = f"{name}(x[:, {start}:{end}], cache=a KVCache holding {start} positions)"
        out = _attention_output(fused, x[:, start:end], what, cache=cache)
        diagnose(what, out, full[:, start:end], [
            (lambda: _attention(x[:, start:end], before, heads), "the cache is not used: the new tokens attend only "
             "to themselves", "pass the new keys and values through cache.update(k, v) and attend over what it "
             "returns, every position so far"),
            (lambda: _attention(x[:, :end], before, heads, restart[:end])[:, start:], "RoPE's positions restart at 0 "
             "with a cache: the new tokens are rotated as if they were the first ones", "with a cache the new tokens "
             "sit at cache.length … cache.length + seq - 1 (read cache.length before cache.update)"),
        ], _ATTN_FIX, **_TOLERANCE)
    # load_state_dict reaches the forward
    other = _mha(2, d_model, heads, kv, torch.float64)
    call(f"{name}.load_state_dict(another MultiHeadSelfAttention's state dict)", fused.load_state_dict,
         other.state_dict())
    x = torch.randn(2, 5, d_model, generator=gen, dtype=torch.float64)
    what = f"{name}(x of shape {tuple(x.shape)}) after load_state_dict of another attention's weights"
    out = _attention_output(fused, x, what)
    with torch.no_grad():
        expected = other(x)
    new = {key: t.detach().clone() for key, t in other.state_dict().items()}
    stale_out = dict(new, **{"output_proj.weight": before["output_proj.weight"]})
    stale_qkv = dict(before, **{"output_proj.weight": new["output_proj.weight"]})
    stale = ("the forward reads its own copy of the weights: loading a state dict (or training) changes the Linears' "
             "weights, not what the forward computes with")
    diagnose(what, out, expected, [(lambda: _attention(x, before, heads), stale, _COPIES_FIX),
                                   (lambda: _attention(x, stale_out, heads), stale, _COPIES_FIX),
                                   (lambda: _attention(x, stale_qkv, heads), stale, _COPIES_FIX)],
             _ATTN_FIX, **_TOLERANCE)


def check_fused_self_attention(impl: type) -> None:
    """Check the learner's ``FusedSelfAttention(attn)``, built from the course's MultiHeadSelfAttention with RoPE
    (multi-head: d_model 12 in 3 heads; grouped-query: d_model 16 in 4 heads, 2 key/value heads); print one line if it
    is right, else raise ``AssertionError``.

    Checked: the state dict keeps the attention's names and numbers; q_proj's, k_proj's and v_proj's weights share one
    memory, column-major; outputs equal the original module's on a prompt of 5 tokens, with token_positions, and with
    the course's KVCache over a prompt of 4 tokens then 1, 1 and 2 more; after load_state_dict of another attention's
    weights, the outputs are that attention's; float32 as well as float64.

    Mistakes it recognises: the state dict changed (the Linears dropped, the fused matrix saved); the q, k, v weights
    kept as copies; the fused matrix row-major; by_columns=False ignored (the float32 one is built so); equal thirds
    (a crash with grouped-query attention only); not causal; RoPE missing; token_positions ignored; k and v swapped;
    strided heads; the cache not used; RoPE's positions restarting at 0 with a cache; the forward reading a copy that
    load_state_dict does not reach; another output dtype.
    """
    refuse_instance(impl, "check_fused_self_attention")
    check_signature(impl, ["attn"], _ATTN)
    gen = generator(9)
    with torch.random.fork_rng(devices=[]):
        _check_attention_config(impl, gen, 12, 3, 3, mha_passed=False)
        _check_attention_config(impl, gen, 16, 4, 2, mha_passed=True)
        mha = _mha(3, 16, 4, 2, torch.float32)
        original = copy.deepcopy(mha)
        name32 = f"{_ATTN}(MultiHeadSelfAttention(16, 4, num_kv_heads=2), float32, by_columns=False)"
        fused = call(name32, impl, mha, by_columns=False)
        _check_fused_layout(name32, fused.state_dict(), _PROJECTIONS, by_columns=False)
        x = torch.randn(2, 5, 16, generator=gen)
        what = f"{name32}(x of shape (2, 5, 16), float32)"
        out = _attention_output(fused, x, what)
        with torch.no_grad():
            expected = original(x)
        diagnose(what, out, expected, [], _ATTN_FIX, rtol=1e-5, atol=1e-6)
    passed("check_fused_self_attention: one column-major q/k/v matrix the state dict still names; the original's "
           "outputs (multi-head and grouped-query, positions, a KV cache, float32/64), and after load_state_dict")


# ------------------------------------------------------------------------------------------ prepare_for_decode

_PREPARE = "prepare_for_decode"
_IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]]) % LM_V
_PROMPT = torch.tensor([3, 1, 4, 1, 5])
_NEW = 8


def _lm(linear: type[nn.Module], *, tied: bool, dtype: torch.dtype, num_kv_heads: int | None = None,
        seed: int = 0) -> TransformerLM:
    """The course's small TransformerLM (11 ids, context 8, d_model 16, 2 layers), its Linears of class ``linear``."""
    torch.manual_seed(seed)
    model = TransformerLM(LM_V, LM_CTX, LM_D, LM_L, LM_H, LM_DFF, LM_THETA, dtype=dtype, num_kv_heads=num_kv_heads,
                          tie_embeddings=tied)
    if linear is not CourseLinear:
        for path, module in list(model.named_modules()):
            if isinstance(module, CourseLinear):
                mine = call("Linear", linear, module.in_features, module.out_features, dtype=dtype)
                with torch.no_grad():
                    mine.weight.copy_(module.weight)
                parent, _, attr = path.rpartition(".")
                setattr(model.get_submodule(parent), attr, mine)
        if tied:
            model.lm_head.weight = model.token_embeddings.weight
    return model


def _logits(model: nn.Module, what: str) -> Tensor:
    with torch.no_grad():
        return expect_tensor(what, call(what, model, _IDS.clone()), returns="the model returns its logits")


def _cached_logits(model: nn.Module, what: str) -> Tensor:
    """The logits of _IDS read with the course's KV cache: a prompt of 5 ids, then one id at a time."""
    cache = KVCache.for_model(model, batch=_IDS.shape[0])
    steps = []
    with torch.no_grad():
        for start, end in [(0, 5), (5, 6), (6, 7), (7, 8)]:
            step = f"{what} on ids[:, {start}:{end}] with a KV cache holding {start} positions"
            steps.append(expect_tensor(step, call(step, model, _IDS[:, start:end].clone(), cache=cache),
                                       returns="the model returns its logits"))
    return torch.cat(steps, dim=1)


def _greedy(model: nn.Module, what: str) -> list[int]:
    return call(f"generate({what}, a prompt of {len(_PROMPT)} ids, {_NEW}, temperature=0)", generate, model,
                _PROMPT.clone(), _NEW, temperature=0).tolist()


def _prepare(prepare_for_decode: Callable[..., Any], model: nn.Module, what: str, **kwargs: Any) -> None:
    """prepare_for_decode(model, **kwargs), which works in place and returns the model."""
    out = call(what, prepare_for_decode, model, **kwargs)
    if out is None:
        fail(f"{what} returns None, not the model", "return the model it prepared, so that `model = "
             "prepare_for_decode(model)` works too")
    if out is not model:
        fail(f"{what} returns another model than the one it was given: it does not work in place",
             "change the model given, block by block (block.attn = ..., block.ffn = ...), and return it")


def _check_fuse(prepare_for_decode: Callable[..., Any], linear: type[nn.Module], *, tied: bool, dtype: torch.dtype,
                num_kv_heads: int | None, layout: str) -> nn.Module:
    model = _lm(linear, tied=tied, dtype=dtype, num_kv_heads=num_kv_heads)
    plain = copy.deepcopy(model)
    label = (f"{'a tied' if tied else 'an untied'} {dtype_name(dtype)} TransformerLM"
             f"{' with grouped-query attention' if num_kv_heads else ''}")
    before = {key: t.detach().clone() for key, t in model.state_dict().items()}
    blocks = [(block.attn, block.ffn) for block in model.layers]
    want_logits, want_tokens = _logits(plain, f"the plain model ({label})"), _greedy(plain, "the plain model")
    threads = 1 if torch.get_num_threads() != 1 else 2
    what = f"{_PREPARE}({label}, layout={layout!r}, threads={threads})"
    _prepare(prepare_for_decode, model, what, layout=layout, threads=threads)
    if torch.get_num_threads() != threads:
        fail(f"{what} leaves torch's threads at {torch.get_num_threads()}: threads is ignored",
             "call torch.set_num_threads(threads) when threads is not None")
    for i, (block, (attn, ffn)) in enumerate(zip(model.layers, blocks)):
        if block.attn is attn or block.ffn is ffn:
            part = "attention" if block.attn is attn else "SwiGLU"
            fail(f"{what} does not replace the blocks' modules: block {i} still runs its original {part}",
                 "set the fused module on the block itself: block.attn = FusedSelfAttention(block.attn), block.ffn = "
                 "FusedSwiGLU(block.ffn); a new local name changes nothing")
    state = _check_state_dict(what, model, before, _KEEP_FIX)
    head, table = model.lm_head.weight, model.token_embeddings.weight
    if tied and (head.data_ptr() != table.data_ptr() or head.shape != table.shape):
        fail(f"{what} breaks the tie: lm_head's weight and the embedding table are two matrices now",
             "after fusing lm_head, give the embedding the same Parameter (model.token_embeddings.weight = "
             "model.lm_head.weight): one matrix, as before")
    matrices = ("lm_head.weight", "layers.0.attn.q_proj.weight", "layers.0.ffn.w1.weight")
    if layout == "columns" and not _column_major(state["lm_head.weight"]):
        fail(f"{what} leaves lm_head's matrix row-major", "store lm_head's weight column-major too (fuse_weights of "
             "lm_head alone): it is the largest matrix a step reads")
    if layout == "columns" and not all(_column_major(state[key]) for key in matrices[1:]):
        fail(f"{what} leaves the blocks' fused matrices row-major", "pass by_columns=True on to FusedSelfAttention "
             "and FusedSwiGLU when layout is 'columns'")
    if layout == "rows" and not all(state[key].is_contiguous() for key in matrices):
        fail(f"{what} stores matrices column-major: layout='rows' is ignored", "with layout='rows' keep every "
             "matrix row by row, as loaded: by_columns=False for the fused modules, lm_head untouched")
    got = _logits(model, f"the model after {what}")
    tolerance = dict(rtol=1e-9, atol=1e-9) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-5)
    if not close(got, want_logits, **tolerance):
        fail(f"the logits change after {what}", "fusing must compute the same function: check_fused_self_attention "
             "and check_fused_swiglu say which part is wrong", f"up to {(got - want_logits).abs().max().item():.3g}")
    cached = _cached_logits(model, f"the model after {what}")
    if not close(cached, want_logits, **tolerance):
        fail(f"the logits read with a KV cache change after {what}", "fusing must compute the same function with a "
             "cache too: FusedSelfAttention(…, cache=) rotates the new tokens at cache.length onwards and attends over "
             "cache.update's keys and values", f"up to {(cached - want_logits).abs().max().item():.3g}")
    tokens = _greedy(model, f"the model after {what}")
    if tokens != want_tokens:
        fail(f"the greedy tokens change after {what}: {tokens}, expected {want_tokens}", "fusing must compute the "
             "same function: the cache path too (FusedSelfAttention with cache=)")
    modules = [(block.attn, block.ffn) for block in model.layers]
    again = f"{_PREPARE}(the same model, layout={layout!r}) a second time"
    _prepare(prepare_for_decode, model, again, layout=layout)
    if [(block.attn, block.ffn) for block in model.layers] != modules:
        fail(f"{again} wraps the fused modules again", "skip what is done already (isinstance(block.attn, "
             "FusedSelfAttention)): calling it again must change nothing")
    _check_state_dict(again, model, before, _KEEP_FIX)
    if not close(_logits(model, f"the model after {again}"), want_logits, **tolerance):
        fail(f"the logits change after {again}", "calling it again must change nothing")
    return model


_ROPE_TABLES = ("cos_table", "sin_table")


def _float_matrices(model: nn.Module) -> list[str]:
    """The floating-point matrices the model holds, but the embedding table (a step reads one row) and RoPE's tables."""
    table = model.token_embeddings.weight.data_ptr()
    found = []
    for name, t in chain(model.named_parameters(), model.named_buffers()):
        if t.is_floating_point() and t.ndim == 2 and t.data_ptr() != table and name.rsplit(".", 1)[-1] not in \
                _ROPE_TABLES:
            found.append(name)
    return found


def _check_int8(prepare_for_decode: Callable[..., Any], linear: type[nn.Module], *, tied: bool) -> None:
    model = _lm(linear, tied=tied, dtype=torch.float32, num_kv_heads=LM_KV, seed=1)
    want = _logits(copy.deepcopy(model), "the plain model")
    matrices = sum(module.weight.numel() for module in model.modules() if isinstance(module, linear))
    what = f"{_PREPARE}({'a tied' if tied else 'an untied'} float32 TransformerLM, int8=True)"
    _prepare(prepare_for_decode, model, what, int8=True)
    left = _float_matrices(model)
    if left:
        if any(name.startswith("lm_head.") for name in left):
            fail(f"{what} leaves lm_head in float: it is not quantized", "lm_head's matrix is read whole at every "
                 "step, the largest of all: make it an Int8Linear too (the embedding table, of which a step reads one "
                 "row, stays)")
        if any(part in name for name in left for part in ("q_proj", "k_proj", "v_proj", "output_proj", "w1.", "w2.",
                                                          "w3.")):
            fail(f"{what} keeps the fused modules' float Linears ({left[0]}): their weights are not freed",
                 "set the Linears a fused module no longer reads to None once its matrices are Int8Linears: else the "
                 "float weights stay in memory beside the int8 ones")
        fail(f"{what} leaves float matrices: {left[:3]}", "every matrix a step reads in full becomes an Int8Linear")
    int8 = {t.data_ptr(): t.numel() for t in model.state_dict().values() if t.dtype == torch.int8}
    if not int8:
        fail(f"{what} quantizes nothing", "replace every Linear (and fused matrix) by an Int8Linear of its weight")
    if sum(int8.values()) > matrices:
        fail(f"{what} quantizes matrices twice: {sum(int8.values()):,} int8 numbers for {matrices:,} weights (the "
             "fused modules' own Linears as well as their fused matrices)", "drop the Linears a fused module no "
             "longer reads (set them to None) and quantize its fused matrices only")
    if model.token_embeddings.weight.shape != (LM_V, LM_D) or not model.token_embeddings.weight.is_floating_point():
        fail(f"{what} changes the embedding table", "leave token_embeddings as it is: a step reads one row of it")
    got = _logits(model, f"the model after {what}")
    error, spread = (got - want).abs().max().item(), want.std().item()
    if error > 0.05 * spread:
        fail(f"the logits after {what} are far from the float model's: up to {error:.3g}, for logits whose std is "
             f"{spread:.3g}", "int8 per output row loses about 1/254 of each row's largest weight: check_int8_linear "
             "says whether the Int8Linear is right")
    again = f"{_PREPARE}(the same model, int8=True) a second time"
    _prepare(prepare_for_decode, model, again, int8=True)
    if not close(_logits(model, f"the model after {again}"), got, rtol=0, atol=0):
        fail(f"the logits change after {again}", "calling it again must change nothing: skip what is done already")


def check_prepare_for_decode(prepare_for_decode: Callable[..., Any]) -> None:
    """Check the learner's ``prepare_for_decode(model, *, fuse=True, layout="auto", int8=False, threads=None)`` on small
    random TransformerLMs (11 ids, context 8, d_model 16, 2 layers); print one line if it is right, else raise
    ``AssertionError``.

    Checked, with fuse (the default): on a tied float64 model with grouped-query attention (layout="columns") and an
    untied float32 model (layout="rows"), it works in place and returns the model; threads sets torch's threads
    (given back afterwards); every block's attention and SwiGLU replaced; the state dict's names and numbers
    unchanged; a tied lm_head still the embedding's matrix; every matrix column-major with "columns", row-major with
    "rows"; the logits (read whole, and with the course's KV cache) and the greedy tokens (the course's generate)
    those of the model unprepared; a second call changes nothing. With int8=True, untied and tied: no float matrix
    left but the embedding table, int8 weights, logits within 5 % of the logits' std, a second call harmless.
    threads=0 raises ValueError. The models are made of the Linear the learner's code sees.

    Mistakes it recognises: the blocks' modules not replaced (built but not assigned); not in place (a copy returned),
    or nothing returned; threads ignored; the state dict changed (a fused matrix saved, a Linear dropped); the tie
    broken (lm_head fused, the embedding not); lm_head or the fused matrices left row-major with "columns"; layout
    "rows" ignored; the logits (with or without a cache) or the greedy tokens changed; a second call wrapping the
    fused modules again; with int8, lm_head not quantized, the fused modules' float Linears kept, matrices quantized
    twice, nothing quantized, logits far from the float model's; threads=0 accepted.
    """
    linear = learners_linear(prepare_for_decode)
    threads = torch.get_num_threads()
    try:
        with torch.random.fork_rng(devices=[]):
            _check_fuse(prepare_for_decode, linear, tied=True, dtype=torch.float64, num_kv_heads=LM_KV,
                        layout="columns")
            _check_fuse(prepare_for_decode, linear, tied=False, dtype=torch.float32, num_kv_heads=None, layout="rows")
            _check_int8(prepare_for_decode, linear, tied=False)
            _check_int8(prepare_for_decode, linear, tied=True)
            model = _lm(linear, tied=False, dtype=torch.float32)
            refuses(f"{_PREPARE}(model, threads=0)", lambda: prepare_for_decode(model, threads=0), ValueError,
                    "threads=0 is accepted", "raise ValueError for threads that is not an int >= 1 (None leaves "
                    "torch's threads as they are)", shown=lambda _: "normally")
    finally:
        torch.set_num_threads(threads)
    passed("check_prepare_for_decode: in place; fused blocks, layouts 'columns' and 'rows', the state dict and the tie "
           "kept, the same logits (with a cache too) and greedy tokens, twice harmless; int8: no float matrix but the "
           "table, logits close; threads")


# ---------------------------------------------------------------------------------------------------------
# static_step: one token at a fixed shape (what compile=True compiles)
# ---------------------------------------------------------------------------------------------------------

def _step_written_out(model: nn.Module, token: Tensor, position: Tensor, keys: list[Tensor], values: list[Tensor], *,
                      rope: bool = True, residual: bool = True, parallel: bool = False, final_norm: bool = True,
                      one_buffer: bool = False) -> Tensor:
    """A prepared model's step for one token, written out here from the course's modules (each flag off: one of the
    classic mistakes), the attention over the whole buffers with the later positions masked: logits (1, vocab)."""
    from ..fast_decode import split_qkv  # the course's: the learner's Step 4 is checked on its own

    x = model.token_embeddings.weight[token].view(1, 1, -1)
    seen = torch.arange(keys[0].shape[-2]) <= position
    for i, block in enumerate(model.layers):
        attn, buffer = block.attn, 0 if one_buffer else i
        q, k, v = split_qkv(attn.qkv(block.ln1(x)), attn.num_heads, attn.num_kv_heads)
        if rope:
            q, k = attn.rope(q, position), attn.rope(k, position)
        keys[buffer].index_copy_(-2, position, k), values[buffer].index_copy_(-2, position, v)
        heads = F.scaled_dot_product_attention(q, keys[buffer], values[buffer], attn_mask=seen.view(1, -1),
                                               enable_gqa=True)
        update = attn.out(heads.transpose(-3, -2).flatten(-2))
        mixed = x + update if residual else update
        x = mixed + block.ffn(block.ln2(x if parallel else mixed))
    return model.lm_head(model.ln_final(x) if final_norm else x)[0]


def check_static_step(static_step: Callable[..., Tensor]) -> None:
    """Check the learner's ``static_step(model, token, position, keys, values)`` on small random TransformerLMs (11
    ids, context 8, d_model 16, 2 layers) prepared by the course's prepare_for_decode: tied, float64, grouped-query
    attention, then untied float32. A prompt of 3 ids goes through the model's forward into the course's KV caches,
    whose later positions hold large stale numbers; then each step at positions 3 … 7 must return the logits (1, vocab)
    of the same model's forward with notebook 12's cache, and leave its key and value in block i's buffers.

    Mistakes it recognises: RoPE not applied to q and k; the attention's residual forgotten; the feed-forward reading
    the block's input (a parallel block) instead of x after the attention; ln_final skipped; every block writing into
    block 0's buffers; logits of shape (1, 1, vocab).
    """
    from ..fast_decode import prepare_for_decode  # the course's: the step is checked on its modules

    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6]) % LM_V
    prompt = 3
    for tied, dtype, kv in ((True, torch.float64, LM_KV), (False, torch.float32, None)):
        with torch.random.fork_rng(devices=[]):
            model = prepare_for_decode(_lm(CourseLinear, tied=tied, dtype=dtype, num_kv_heads=kv), layout="rows")
            theirs, ours = KVCache.for_model(model), KVCache.for_model(model)
            gen = generator(16)
            for cache in ours:  # what a reset() cache keeps from a longer text: the mask must make it harmless
                cache.keys.copy_(100 * torch.randn(cache.keys.shape, generator=gen, dtype=torch.float64))
                cache.values.copy_(100 * torch.randn(cache.values.shape, generator=gen, dtype=torch.float64))
            heads = f"{LM_H} heads, {kv or LM_H} key/value heads"
            with torch.no_grad():
                model(ids[None, :prompt], cache=theirs), model(ids[None, :prompt], cache=ours)
                for position in range(prompt, len(ids)):
                    token, at = ids[position:position + 1], torch.tensor([position])
                    what = (f"static_step(model, token tensor([{int(token)}]), position tensor([{position}]), keys, "
                            f"values) on a {'tied' if tied else 'untied'} {dtype_name(dtype)} model ({heads}) after a "
                            f"prompt of {prompt} ids")
                    expected = model(token[None], cache=theirs)[0]
                    before = [cache.keys.clone() for cache in ours], [cache.values.clone() for cache in ours]
                    out, error = attempt(what, static_step, model, token.clone(), at.clone(),
                                         [cache.keys for cache in ours], [cache.values for cache in ours])
                    if error is not None:
                        crashed(what, error)
                    if isinstance(out, Tensor) and out.shape == (1, 1, LM_V):
                        fail(f"{what} returned shape (1, 1, {LM_V}), expected (1, {LM_V})", "return the logits of "
                             "the one token, (1, vocab): the model's output [0], as generate's caller reads it")
                    out = expect_tensor(what, out, (1, LM_V), f"the logits of the one token, (1, {LM_V})",
                                        returns="return the logits, a tensor")

                    def variant(**mistake: bool) -> Callable[[], Tensor]:
                        def run() -> Tensor:
                            keys, values = [t.clone() for t in before[0]], [t.clone() for t in before[1]]
                            return _step_written_out(model, token, at, keys, values, **mistake)
                        return run

                    diagnose(what, out, expected, [
                        (variant(rope=False), "RoPE is not applied: q and k go into the attention unrotated",
                         "rotate q and k by the block's attn.rope at `position` (a tensor of shape (1,), which RoPE "
                         "takes as token_positions), before Step 7"),
                        (variant(residual=False), "the attention's residual is forgotten: x becomes the attention's "
                         "output instead of x plus it", "x = x + attn.out(...), as notebook 09's block adds it"),
                        (variant(parallel=True), "the feed-forward reads the block's input, not x after the "
                         "attention's update (a parallel block)", "update x with the attention first, then x = x + "
                         "block.ffn(block.ln2(x)) on the updated x, as notebook 09's pre-norm block"),
                        (variant(final_norm=False), "ln_final is skipped: lm_head reads x unnormalised",
                         "model.lm_head(model.ln_final(x)), as notebook 10's forward ends"),
                        (variant(one_buffer=True), "every block writes into block 0's buffers: keys[0] and values[0]",
                         "block i writes into keys[i] and values[i]: zip(model.layers, keys, values)"),
                    ], "the logits of the model's forward with a cache, for this one token")
                    for i, (mine, right) in enumerate(zip(ours, theirs)):
                        if not close(mine.keys[..., :position + 1, :], right.keys[..., :position + 1, :]):
                            fail(f"after {what}, block {i}'s key buffer does not hold the keys of the model's own "
                                 f"cache at positions 0 … {position}", "write each block's rotated key into its own "
                                 "buffer at `position`, with your Step 7")
    passed("check_static_step: the logits of the model's forward with a cache at every position, stale buffers "
           "harmless, each block's keys in its own buffers; tied float64 with grouped heads, untied float32")

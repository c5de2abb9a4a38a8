"""``check_transformer_block``: the learner's ``TransformerBlock`` (notebook 09), loaded with known weights by the
course's state-dict names, against a pre-norm block built from the course's reference
(``transformer_from_scratch.reference``: ``F.rms_norm``, ``F.linear``, ``F.silu``,
``F.scaled_dot_product_attention(is_causal=True)``, RoPE as a complex product), independent of the package's own
components. The classic mistakes are the same block with one knob turned (``_block``)."""

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
                       generator, passed, refuse_instance)

# What a composite says of a weight never filled: its parts initialise themselves, as their own checks demand.
_INIT_FIX = ("build each part from the course's Linear (Embedding, RMSNorm), which fills its own weight, and do not "
             "replace a weight with a new, unfilled one afterwards")

_NAME = "TransformerBlock"
_SIGNATURE = ["d_model", "num_heads", "d_ff", "max_seq_len", "theta", "device", "dtype"]
_SDPA, _RMS_NORM = reference.SDPA, reference.RMS_NORM  # saved at import: the reference is never a patched one
# d_model 12 in 3 heads of 4, SwiGLU width 16, 5 tokens: every size differs, so a mixed-up axis cannot go unnoticed.
_D, _HEADS, _DFF, _SEQ, _MAX_SEQ_LEN, _THETA = 12, 3, 16, 5, 16, 10000.0
_CONFIG = (_D, _HEADS, _DFF, _MAX_SEQ_LEN, _THETA)
_SHOWN = f"{_NAME}(d_model={_D}, num_heads={_HEADS}, d_ff={_DFF}, max_seq_len={_MAX_SEQ_LEN}, theta={_THETA:g})"
_PROJECTIONS = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.output_proj")
_EXPECTED = {"ln1.weight": (_D,), **{f"{name}.weight": (_D, _D) for name in _PROJECTIONS}, "ln2.weight": (_D,),
             "ffn.w1.weight": (_DFF, _D), "ffn.w2.weight": (_D, _DFF), "ffn.w3.weight": (_DFF, _D)}
# The maths of the pre-norm block, as the notebook writes it (not the code: the learner writes that)
_RIGHT = ("pre-norm: attention reads ln1 of the stream and adds its output to it, then the feed-forward network reads "
          "ln2 of that new stream and adds its output to it")
_EPS = 1e-5


# ---------------------------------------------------------------------------------------------------------
# The reference and its classic wrong variants (float64 on the CPU, PyTorch built-ins only)
# ---------------------------------------------------------------------------------------------------------

def _attention(t: Tensor, w: dict[str, Tensor], positions: Tensor | None, causal: bool, rope: bool) -> Tensor:
    """Multi-head self-attention from the course's reference, RoPE on the queries and keys."""
    weights = {name[len("attn."):]: weight for name, weight in w.items() if name.startswith("attn.")}
    return reference.multihead_self_attention(t, weights, _HEADS, _THETA if rope else None, positions, causal=causal)


def _block(x: Tensor, w: dict[str, Tensor], positions: Tensor | None = None, *, wiring: str = "pre",
           residual: tuple[bool, bool] = (True, True), norms: tuple[str, str] = ("ln1", "ln2"),
           normed: tuple[bool, bool] = (True, True), ffn_reads: str = "y", causal: bool = True,
           rope: bool = True) -> Tensor:
    """The pre-norm block, or the same with one classic mistake (the keywords). Differentiable in x and w."""
    def norm(which: int) -> Callable[[Tensor], Tensor]:
        if not normed[which]:
            return lambda t: t
        gain = w[f"{norms[which]}.weight"]
        return lambda t: _RMS_NORM(t, (t.shape[-1],), gain, eps=_EPS)

    def attn(t: Tensor) -> Tensor:
        return _attention(t, w, positions, causal, rope)

    def ffn(t: Tensor) -> Tensor:
        return reference.swiglu(t, w["ffn.w1.weight"], w["ffn.w2.weight"], w["ffn.w3.weight"])

    ln1, ln2 = norm(0), norm(1)
    if wiring == "post":
        y = ln1(x + attn(x))
        return ln2(y + ffn(y))
    if wiring.startswith("stream"):  # "stream": both sub-layers; "stream1" / "stream2": one of them
        y = (ln1(x) if wiring in ("stream", "stream1") else x) + attn(ln1(x))
        return (ln2(y) if wiring in ("stream", "stream2") else y) + ffn(ln2(y))
    y = attn(ln1(x)) + (x if residual[0] else 0)
    return ffn(ln2(y if ffn_reads == "y" else x)) + (y if residual[1] else 0)


def _reference(x: Tensor, w: dict[str, Tensor], positions: Tensor | None = None, **knobs: Any) -> Tensor:
    x = x.detach().double().cpu()
    w = {name: weight.detach().double().cpu() for name, weight in w.items()}
    return _block(x, w, None if positions is None else positions.cpu(), **knobs)


_FIX_STREAM = f"normalise only what each sub-layer reads, and add its output to the stream as it is: {_RIGHT}"
# Each: (keyword arguments of _block that make the mistake, the mistake, the fix). Most specific first.
_VARIANTS = [
    (dict(wiring="post"),
     "the block is post-norm: it normalises the stream after each addition (y = ln1(x + attn(x))) instead of "
     "the sub-layer's input", _FIX_STREAM),
    (dict(wiring="stream"),
     "the norm is applied to the residual stream itself (x = ln1(x) + attn(ln1(x))), so the stream loses every "
     "token's scale and the identity path", _FIX_STREAM),
    (dict(wiring="stream1"),
     "the norm is applied to the residual stream itself (x = ln1(x) + attn(ln1(x))), so the stream loses every "
     "token's scale and the identity path", _FIX_STREAM),
    (dict(wiring="stream2"),
     "the norm is applied to the residual stream itself (y = ln2(y) + ffn(ln2(y))), so the stream loses every "
     "token's scale and the identity path", _FIX_STREAM),
    (dict(residual=(False, False)),
     "both residual connections are missing: the block returns ffn(ln2(attn(ln1(x)))) and drops the stream",
     f"add each sub-layer's output to its input: {_RIGHT}"),
    (dict(residual=(False, True)),
     "the attention sub-layer has no residual connection: y = attn(ln1(x)) drops x",
     "add x back: y = x + attn(ln1(x))"),
    (dict(residual=(True, False)),
     "the feed-forward sub-layer has no residual connection (the final add is missing): out = ffn(ln2(y)) drops y",
     "add y back: out = y + ffn(ln2(y))"),
    (dict(ffn_reads="x"),
     "the feed-forward network reads x instead of y (out = y + ffn(ln2(x))), so it never sees what attention wrote",
     "feed it the stream after attention: out = y + ffn(ln2(y))"),
    (dict(norms=("ln2", "ln1")),
     "ln1 and ln2 are swapped: attention reads ln2(x) and the feed-forward network ln1(y)",
     "ln1 goes before attention and ln2 before the feed-forward network (checkpoints load each gain by name)"),
    (dict(norms=("ln1", "ln1")),
     "ln1 is used before both sub-layers (shared), so ln2's gain is never used",
     "each sub-layer has its own norm: self.ln1 before attention, self.ln2 before the feed-forward network"),
    (dict(norms=("ln2", "ln2")),
     "ln2 is used before both sub-layers (shared), so ln1's gain is never used",
     "each sub-layer has its own norm: self.ln1 before attention, self.ln2 before the feed-forward network"),
    (dict(normed=(False, True)),
     "ln1 is not applied: attention reads the raw stream x",
     "normalise what attention reads: y = x + attn(ln1(x))"),
    (dict(normed=(True, False)),
     "ln2 is not applied: the feed-forward network reads the raw stream y",
     "normalise what the feed-forward network reads: out = y + ffn(ln2(y))"),
    (dict(causal=False),
     "the block's attention is not causal: an output depends on later tokens",
     "use MultiHeadSelfAttention (notebook 08), whose heads attend with a causal mask (check it with "
     "check_multihead_self_attention)"),
    (dict(rope=False),
     "the block's attention has no RoPE: max_seq_len and theta are not passed on to it",
     "build the attention with RoPE: pass max_seq_len and theta on to MultiHeadSelfAttention (and device, dtype)"),
]
_NOT_CAUSAL = next(variant for variant in _VARIANTS if variant[0] == dict(causal=False))
_POSITIONS_IGNORED = (
    "token_positions is not passed on to the attention: the output is the one for positions 0 … seq-1",
    "pass token_positions on to the attention: RoPE rotates each token at its own position")


# ---------------------------------------------------------------------------------------------------------
# Running the learner's block
# ---------------------------------------------------------------------------------------------------------

def _make(impl: Any, *args: Any, **kwargs: Any) -> nn.Module:
    return construct(_NAME, impl, *args, **kwargs)


def _known_weights(gen: torch.Generator) -> dict[str, Tensor]:
    """Projections N(0, 1/fan_in), so activations stay of order 1; gains in [0.5, 1.5], different in ln1 and ln2."""
    weights = {}
    for name, shape in _EXPECTED.items():
        if len(shape) == 1:
            weights[name] = 0.5 + torch.rand(shape, generator=gen, dtype=torch.float64)
        else:
            weights[name] = torch.randn(shape, generator=gen, dtype=torch.float64) / math.sqrt(shape[1])
    return weights


def _load(module: nn.Module, weights: dict[str, Tensor], dtype: torch.dtype) -> None:
    call(f"{_NAME}.load_state_dict(...) with the names {list(weights)}, strict=True",
         module.load_state_dict, {name: w.to(dtype) for name, w in weights.items()}, strict=True)


_BUILTINS = {F.layer_norm: "F.layer_norm", _RMS_NORM: "F.rms_norm",
             F.multi_head_attention_forward: "multi-head attention"}


def _forward(module: nn.Module, x: Tensor, positions: Tensor | None, what: str) -> Tensor:
    """The learner's output, refusing PyTorch's own norm and attention (F.scaled_dot_product_attention is allowed
    only when the block's attention was built with fused=True)."""
    builtins = dict(_BUILTINS)
    if getattr(getattr(module, "attn", None), "fused", False) is not True:
        builtins[_SDPA] = "F.scaled_dot_product_attention"
    args = (x,) if positions is None else (x, positions)
    with BuiltinSpy(builtins) as spy:
        out = call(what, module, *args)
    if "F.layer_norm" in spy.used:
        fail(f"{what} calls F.layer_norm: the block normalises with LayerNorm, which subtracts the mean and is not "
             "the Llama block's RMSNorm",
             "use RMSNorm(d_model, device=device, dtype=dtype) from notebook 04 for ln1 and ln2")
    if spy.used:
        fail(f"{what} calls PyTorch's own {spy.used[0]} instead of the course's component",
             "build the block from the package's RMSNorm, MultiHeadSelfAttention and SwiGLU (your notebooks 04, 07, "
             "08)")
    return expect_like(what, out, x, returns="return only out = y + ffn(ln2(y))",
                       shape_fix=f"both sub-layers map (..., seq, d_model) to (..., seq, d_model): {_RIGHT}")


def _causality_broken(module: nn.Module, x: Tensor) -> bool:
    """True if changing the tokens after position t changes an output at a position <= t."""
    gen = generator(99)
    before = call(f"{_NAME} on x of shape {tuple(x.shape)}", module, x)
    for t in range(x.shape[-2] - 1):
        changed = x.clone()
        changed[..., t + 1:, :] = torch.randn(changed[..., t + 1:, :].shape, generator=gen,
                                              dtype=torch.float64).to(x.dtype)
        after = call(f"{_NAME} on x of shape {tuple(x.shape)}", module, changed)
        if not close(after[..., : t + 1, :], before[..., : t + 1, :].detach(), rtol=1e-5, atol=1e-6):
            return True
    return False


def _compare(module: nn.Module, out: Tensor, x: Tensor, weights: dict[str, Tensor], positions: Tensor | None,
             what: str, **tolerance: float) -> None:
    """``out`` equals the built-in reference; if not, name the first classic variant it matches."""
    expected = _reference(x, weights, positions)
    if close(out, expected, **tolerance):
        return
    variants = list(_VARIANTS)
    if positions is not None:
        variants.insert(0, (dict(positions=None), *_POSITIONS_IGNORED))
    for knobs, mistake, fix in variants:
        knobs = dict(knobs)
        wrong = _reference(x, weights, knobs.pop("positions", positions), **knobs)
        if not close(wrong, expected, **tolerance) and close(out, wrong, **tolerance):
            fail(mistake, fix, f"on {what}, your output matches that variant, not the reference "
                 "(F.rms_norm + F.linear + F.silu + F.scaled_dot_product_attention(is_causal=True))")
    if _causality_broken(module, x):
        fail(_NOT_CAUSAL[1], _NOT_CAUSAL[2], f"on {what}: changing later tokens changed an earlier output")
    diff = (out.detach().double().cpu() - expected).abs().nan_to_num(nan=math.inf).max().item()
    fail(f"the output differs from the built-in reference (F.rms_norm + F.linear + F.silu + "
         f"F.scaled_dot_product_attention(is_causal=True)) by up to {diff:.3g} on {what}",
         f"write the pre-norm block, {_RIGHT}, and if it is that already, run check_rmsnorm, check_swiglu and "
         "check_multihead_self_attention on your components")


# ---------------------------------------------------------------------------------------------------------
# The steps
# ---------------------------------------------------------------------------------------------------------

_TORCH_MODULES = {nn.TransformerEncoderLayer: "torch.nn.TransformerEncoderLayer",
                  nn.TransformerDecoderLayer: "torch.nn.TransformerDecoderLayer",
                  nn.MultiheadAttention: "torch.nn.MultiheadAttention", nn.RMSNorm: "torch.nn.RMSNorm"}


def _check_structure(impl: Any) -> None:
    """Signature; the four submodules with the contract's names, each its own; parameters exactly the contract's
    state dict."""
    refuse_instance(impl, "check_transformer_block")
    check_signature(impl, _SIGNATURE, _NAME)
    module = _make(impl, *_CONFIG)
    for sub in module.modules():
        if isinstance(sub, nn.LayerNorm):
            fail(f"{_NAME} normalises with torch.nn.LayerNorm, which subtracts the mean, not with RMSNorm",
                 "use RMSNorm(d_model, device=device, dtype=dtype) from notebook 04 for ln1 and ln2")
        for kind, name in _TORCH_MODULES.items():
            if isinstance(sub, kind):
                fail(f"{_NAME} is (or contains) {name}",
                     "build it from the package's RMSNorm, MultiHeadSelfAttention and SwiGLU (your notebooks 04, 07, "
                     "08)")
    ln1, ln2 = getattr(module, "ln1", None), getattr(module, "ln2", None)
    if ln1 is not None and ln1 is ln2:
        fail("ln1 and ln2 are one and the same module (shared), so both sub-layers share one gain",
             "create two: self.ln1 = RMSNorm(d_model, ...) and self.ln2 = RMSNorm(d_model, ...)")
    check_parameters(module, _EXPECTED, _NAME)


def _check_init(impl: Any) -> None:
    """Gains start at ones; the projections as Linear starts them (std 0.987·σ, σ² = 2/(d_in + d_out))."""
    d_model, d_ff = 64, 128
    torch.manual_seed(0)
    module = check_initialised(_NAME, lambda: impl(d_model, 4, d_ff, 16, _THETA), _INIT_FIX)
    for name in ("ln1", "ln2"):
        gain = module.get_submodule(name).weight.detach()
        if not torch.equal(gain, torch.ones_like(gain)):
            fail(f"{name}.weight does not start at ones (its values lie in [{gain.min().item():.3g}, "
                 f"{gain.max().item():.3g}])", "create it as RMSNorm(d_model, device=device, dtype=dtype), "
                 "whose gain starts at ones, and leave it as it is")
    for name, d_in, d_out in [("attn.q_proj", d_model, d_model), ("attn.output_proj", d_model, d_model),
                              ("ffn.w1", d_model, d_ff), ("ffn.w2", d_ff, d_model)]:
        w = module.get_submodule(name).weight.detach().double()
        ratio = w.std().item() / math.sqrt(2 / (d_in + d_out)) if torch.isfinite(w).all() else math.nan
        if not 0.9 <= ratio <= 1.08:
            fail(f"{name}.weight's initial std is {ratio:.2f} σ, not Linear's 0.987 σ (σ² = 2 / (d_in + d_out))",
                 "create the submodules with the package's MultiHeadSelfAttention and SwiGLU and keep their "
                 "initialisation")


def _check_devices(impl: Any) -> None:
    check_device_and_dtype(lambda **kwargs: impl(*_CONFIG, **kwargs), _NAME)
    check_buffers_device(lambda **kwargs: impl(*_CONFIG, **kwargs), _NAME,
                         "pass device=device on to MultiHeadSelfAttention(..., device=device, dtype=dtype)")


def _inputs(gen: torch.Generator, leading: tuple[int, ...], dtype: torch.dtype = torch.float64) -> Tensor:
    return torch.randn(*leading, _SEQ, _D, generator=gen, dtype=torch.float64).to(dtype)


def _check_outputs(impl: Any, gen: torch.Generator) -> None:
    """Known weights by name; float64 over several leading shapes, then float32; then token positions."""
    weights = _known_weights(gen)
    tolerance = dict(rtol=1e-6, atol=1e-6)  # RoPE's tables may be float32
    for dtype, leading_shapes, tol in [(torch.float64, [(2,), (), (2, 3)], tolerance),
                                       (torch.float32, [(2,)], dict(rtol=1e-5, atol=1e-5))]:
        module = _make(impl, *_CONFIG, dtype=dtype)
        _load(module, weights, dtype)
        for leading in leading_shapes:
            x = _inputs(gen, leading, dtype)
            what = f"{_SHOWN} on x of shape {tuple(x.shape)}, {dtype}"
            _compare(module, _forward(module, x, None, what), x, weights, None, what, **tol)
    module = _make(impl, *_CONFIG, dtype=torch.float64)
    _load(module, weights, torch.float64)
    x = _inputs(gen, (2,))
    for positions in (torch.tensor([[0, 1, 2, 0, 1], [2, 3, 7, 8, 15]]), torch.tensor([3, 4, 6, 9, 10])):
        what = f"{_SHOWN} on x of shape {tuple(x.shape)}, token_positions {positions.tolist()}"
        _compare(module, _forward(module, x, positions, what), x, weights, positions, what, **tolerance)


def _check_gradients(impl: Any, gen: torch.Generator) -> None:
    """x.grad and the grad of every one of the nine weights equal the reference's (float64)."""
    weights = _known_weights(gen)
    module = _make(impl, *_CONFIG, dtype=torch.float64)
    _load(module, weights, torch.float64)
    x = _inputs(gen, (2,)).requires_grad_()
    upstream = torch.randn(2, _SEQ, _D, generator=gen, dtype=torch.float64)
    what = f"{_SHOWN} on x of shape {tuple(x.shape)}"
    out = _forward(module, x, None, what)
    params = dict(module.named_parameters())
    learner_weights = {name: (name, params[name]) for name in _EXPECTED}
    check_gradients(_NAME, what, out, x, upstream, _block, weights, learner_weights,
                    source="x and the submodules", unit="submodule")


def _check_fused(impl: Any, gen: torch.Generator) -> None:
    """If the class takes ``fused``, it reaches the attention, and fused=True gives the same output."""
    if "fused" not in inspect.signature(impl.__init__).parameters:
        return
    weights = _known_weights(gen)
    module = _make(impl, *_CONFIG, dtype=torch.float64, fused=True)
    if getattr(getattr(module, "attn", None), "fused", True) is not True:
        fail(f"{_NAME}(..., fused=True) does not pass fused on to its attention (self.attn.fused is "
             f"{module.attn.fused!r})", "create self.attn = MultiHeadSelfAttention(..., fused=fused)")
    _load(module, weights, torch.float64)
    x = _inputs(gen, (2,))
    out = call(f"{_NAME}(..., fused=True) on x of shape {tuple(x.shape)}", module, x)
    if not close(out, _reference(x, weights), rtol=1e-6, atol=1e-6):
        fail(f"{_NAME}(..., fused=True) differs from the reference, though the default path matches it",
             "fused only changes the attention's kernel: pass it on to MultiHeadSelfAttention and change nothing else")


def check_transformer_block(impl: Callable[..., Any]) -> None:
    """Check the learner's ``TransformerBlock`` class; print one line if right, else raise ``AssertionError``.

    Checked: the signature ``(d_model, num_heads, d_ff, max_seq_len, theta, device=None, dtype=None)``; the parameters
    exactly the contract's (CONTRACT.md) ``ln1.weight``, ``attn.{q,k,v,output}_proj.weight``, ``ln2.weight``,
    ``ffn.{w1,w2,w3}.weight`` (no bias, nothing else saved), ``ln1`` and ``ln2`` two separate modules; the gains
    start at ones and the projections as Linear starts them; ``device`` and ``dtype`` honoured (RoPE's tables too);
    then, with known weights loaded through ``load_state_dict(strict=True)`` (gains that differ between ln1 and ln2),
    the output against a pre-norm block built here from ``F.rms_norm``, ``F.linear``, ``F.silu`` and
    ``F.scaled_dot_product_attention(is_causal=True)`` with RoPE (d_model 12, 3 heads, d_ff 16, 5 tokens; leading
    shapes (), (2,), (2, 3); float64 and float32; token positions per sequence and shared); the gradients of x and of
    the nine weights; ``fused=True`` if the class takes it. PyTorch's own norms and attention are refused inside the
    block. Inputs come from a fixed seed; the caller's random state is kept.

    Mistakes it recognises (by name, in the first line of the error):
        * post-norm instead of pre-norm (y = ln1(x + attn(x)));
        * the norm applied to the residual stream itself (x = ln1(x) + attn(ln1(x)));
        * a missing residual connection: the attention's, the feed-forward network's (the final add), or both;
        * the feed-forward network reading x instead of y (out = y + ffn(ln2(x)));
        * ln1 and ln2 swapped; one norm used before both sub-layers, or ln1 and ln2 one shared module;
        * ln1 or ln2 not applied;
        * attention that is not causal; attention without RoPE; token_positions not passed on;
        * wrong names (parameters or submodules), a bias, extra state-dict entries;
        * LayerNorm instead of RMSNorm; torch.nn.TransformerEncoderLayer, nn.MultiheadAttention, nn.RMSNorm or
          F.rms_norm / F.scaled_dot_product_attention used instead of the course's components;
        * gains not starting at ones, projections not initialised as Linear, a weight never filled; device/dtype
          ignored; the output cast to another dtype; no gradient (detached computations); fused not passed on to the
          attention;
        * (if the class takes them) num_kv_heads, norm_eps or the cache not passed on.
    """
    with torch.random.fork_rng(devices=[]):
        _check_structure(impl)
        _check_init(impl)
        _check_devices(impl)
        gen = generator(0)
        _check_outputs(impl, gen)
        _check_gradients(impl, gen)
        _check_fused(impl, gen)
        _check_keywords(impl)
    fused = "fused" in inspect.signature(impl.__init__).parameters
    grouped = "num_kv_heads" in inspect.signature(impl.__init__).parameters
    passed("check_transformer_block: ln1/attn/ln2/ffn with the course's state-dict names; pre-norm wiring; "
           "matches F.rms_norm + F.linear + F.silu + F.scaled_dot_product_attention"
           "(is_causal=True) with known weights (3 leading shapes, float32/64, token positions); gradients"
           + ("; fused=True" if fused else "")
           + ("; num_kv_heads, norm_eps and the cache passed on" if grouped else ""))


def _check_keywords(impl: Any) -> None:
    """If the class takes them: num_kv_heads and norm_eps reach the attention and the two norms, and `cache` reaches
    the attention (a stand-in with notebook 12's contract: `length`, and `update` that appends and returns all)."""
    takes = inspect.signature(impl.__init__).parameters
    if "num_kv_heads" in takes:
        module = _make(impl, *_CONFIG, num_kv_heads=1)
        rows = tuple(getattr(getattr(getattr(module, "attn", None), "k_proj", None), "weight", torch.empty(0)).shape)
        if rows != (_D // _HEADS, _D):
            fail(f"{_NAME}(..., num_kv_heads=1) has attn.k_proj.weight of shape {rows}, not ({_D // _HEADS}, {_D}): "
                 "num_kv_heads is not passed on to the attention",
                 "build attn with MultiHeadSelfAttention(..., num_kv_heads=num_kv_heads)")
    if "norm_eps" in takes:
        module = _make(impl, *_CONFIG, norm_eps=0.1)
        if (getattr(module.ln1, "eps", None), getattr(module.ln2, "eps", None)) != (0.1, 0.1):
            fail(f"{_NAME}(..., norm_eps=0.1) builds ln1 and ln2 with ε {getattr(module.ln1, 'eps', None)} and "
                 f"{getattr(module.ln2, 'eps', None)}", "pass norm_eps on to both norms, RMSNorm(d_model, norm_eps, …)")
    if "cache" in inspect.signature(impl.forward).parameters:
        class Cache:
            length, keys, values = 0, None, None

            def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
                self.keys = k if self.keys is None else torch.cat([self.keys, k], dim=-2)
                self.values = v if self.values is None else torch.cat([self.values, v], dim=-2)
                self.length = self.keys.shape[-2]
                return self.keys, self.values

        module, cache = _make(impl, *_CONFIG, dtype=torch.float64), Cache()
        x = torch.randn(2, 4, _D, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            rows = [call(f"{_NAME}(x[:, :3], cache=...)", module, x[:, :3], cache=cache)]
            if cache.length != 3:
                fail(f"{_NAME}(x, cache=...) never hands the cache to its attention (it holds {cache.length} "
                     "positions after 3 tokens)", "pass it on: self.attn(self.ln1(x), token_positions, cache=cache)")
            rows.append(call(f"{_NAME}(x[:, 3:], cache=...)", module, x[:, 3:], cache=cache))
            if not close(torch.cat(rows, dim=-2), module(x)):
                fail(f"{_NAME} with a cache differs from the rows of the whole input",
                     "pass the cache on to the attention and nothing else: the norms, the residuals and the "
                     "feed-forward network work on each token alone")

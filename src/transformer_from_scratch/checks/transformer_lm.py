"""``check_transformer_lm``: the learner's ``TransformerLM`` (notebook 10), loaded with known weights by the course's
state-dict names, against the course's reference (``transformer_from_scratch.reference``: ``F.embedding``,
``F.rms_norm``, ``F.linear``, ``F.scaled_dot_product_attention(is_causal=True)``, ``F.silu``, RoPE as a complex
product), independent of the package's own components. The classic mistakes are the same model with one knob turned
(``_lm``), built from the reference's blocks."""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import reference
from ._harness import (BuiltinSpy, call, check_buffers_device, check_device_and_dtype, check_initialised,
                       check_parameters, check_signature, close, construct, crash_of, expect_tensor, fail, generator,
                       passed, refuse_instance)
from ._lm_mistakes import (POSITIONS_NOT_PASSED, as_output, forward_variants, head_not_applied, last_position_only,
                           next_stream)

# What a composite says of a weight never filled: its parts initialise themselves, as their own checks demand.
_INIT_FIX = ("build each part from the course's Linear (Embedding, RMSNorm), which fills its own weight, and do not "
             "replace a weight with a new, unfilled one afterwards")

_NAME = "TransformerLM"
_SIGNATURE = ["vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta", "device",
              "dtype"]
# A vocabulary of 11 ids, 8 positions, d_model 12 in 3 heads of 4, SwiGLU width 16, 2 layers: every size differs,
# so a transposed weight or a mixed-up axis cannot go unnoticed.
_V, _CTX, _D, _L, _H, _DFF, _THETA = 11, 8, 12, 2, 3, 16, 10000.0
_CONFIG = (_V, _CTX, _D, _L, _H, _DFF, _THETA)
_SHOWN = f"{_NAME}(vocab_size={_V}, context_length={_CTX}, d_model={_D}, num_layers={_L}, num_heads={_H}, d_ff={_DFF})"
_BLOCK_NAMES = {"ln1.weight": "d", "attn.q_proj.weight": "dd", "attn.k_proj.weight": "dd", "attn.v_proj.weight": "dd",
                "attn.output_proj.weight": "dd", "ln2.weight": "d", "ffn.w1.weight": "fd", "ffn.w2.weight": "df",
                "ffn.w3.weight": "fd"}
# Names learners often use instead of the course's (nanoGPT, Hugging Face, Meta's Llama code).
_ALIASES = {"layers": ("blocks", "h", "transformer_blocks", "decoder_layers", "block"),
            "ln_final": ("norm", "ln_f", "final_norm", "norm_f", "final_layer_norm", "ln"),
            "token_embeddings": ("embedding", "embeddings", "wte", "tok_embeddings", "embed_tokens", "embed", "emb"),
            "lm_head": ("head", "output", "out_proj", "unembedding", "output_proj", "logits")}


def _expected_shapes(vocab: int = _V, d: int = _D, layers: int = _L, d_ff: int = _DFF) -> dict[str, tuple[int, ...]]:
    """Every name of the state dict (CONTRACT.md), with its shape."""
    sizes = {"d": (d,), "dd": (d, d), "fd": (d_ff, d), "df": (d, d_ff)}
    shapes = {"token_embeddings.weight": (vocab, d)}
    for i in range(layers):
        shapes.update({f"layers.{i}.{name}": sizes[kind] for name, kind in _BLOCK_NAMES.items()})
    shapes.update({"ln_final.weight": (d,), "lm_head.weight": (vocab, d)})
    return shapes


# ---------------------------------------------------------------------------------------------------------
# The reference and its classic wrong variants (float64 on the CPU, PyTorch built-ins only)
# ---------------------------------------------------------------------------------------------------------

def _block(x: Tensor, w: dict[str, Tensor], i: int, positions: Tensor, causal: bool) -> Tensor:
    """Block i of the reference (the course's ``reference.transformer_block``), with or without its causal mask."""
    prefix = f"layers.{i}."
    weights = {name[len(prefix):]: weight for name, weight in w.items() if name.startswith(prefix)}
    return reference.transformer_block(x, weights, _H, _THETA, positions, causal=causal)


def _lm(ids: Tensor, w: dict[str, Tensor], positions: Tensor | None = None, *, causal: bool = True,
        ln_final: bool = True, output: str = "logits", embedding_scale: float = 1.0, chain: str = "right") -> Tensor:
    """The model from built-ins, with one knob turned; ``w`` maps the state-dict names to float64 weights."""
    ids = ids.cpu()
    positions = torch.arange(ids.shape[-1]) if positions is None else positions.cpu()
    embedded = F.embedding(ids, w["token_embeddings.weight"]) * embedding_scale
    x = embedded
    for i in range(_L):
        out = _block(embedded if chain == "embeddings" else x, w, i, positions, causal)
        x = next_stream(chain, x, out)
    if ln_final:
        x = reference.rms_norm(x, w["ln_final.weight"])
    return as_output(F.linear(x, w["lm_head.weight"]), output)


# Each: (keyword arguments of _lm that make the mistake, the mistake, the fix). Order: most specific first. The
# mistakes of any forward pass are _lm_mistakes's, shared with check_lm_forward; two more only a whole model can make.
_FORWARD = forward_variants("forward")
_VARIANTS = [
    *_FORWARD[:3],
    (dict(embedding_scale=math.sqrt(_D)),
     "the embeddings are multiplied by √d_model (as in the original Transformer), which this recipe does not do",
     "use the rows of token_embeddings as they are, unscaled"),
    *_FORWARD[3:],
    (dict(causal=False), "no causal mask anywhere: every position also sees the tokens after it (the future)",
     "the blocks' attention must be causal (query i sees keys j <= i): run check_multihead_self_attention and "
     "check_transformer_block on your components"),
]
_POSITION_VARIANTS = [(dict(positions=None), *POSITIONS_NOT_PASSED)]


# ---------------------------------------------------------------------------------------------------------
# Running the learner's model
# ---------------------------------------------------------------------------------------------------------

def _make(impl: Any, *args: Any, **kwargs: Any) -> nn.Module:
    return construct(_NAME, impl, *args, **kwargs)


def _known_weights(gen: torch.Generator) -> dict[str, Tensor]:
    """Weights that keep activations of order 1, and norm gains away from 1 so that each norm shows."""
    weights = {}
    for name, shape in _expected_shapes().items():
        if name.endswith(("ln1.weight", "ln2.weight", "ln_final.weight")):
            weights[name] = 1 + 0.3 * torch.randn(shape, generator=gen, dtype=torch.float64)
        elif name == "token_embeddings.weight":
            weights[name] = torch.randn(shape, generator=gen, dtype=torch.float64)
        else:
            weights[name] = torch.randn(shape, generator=gen, dtype=torch.float64) / math.sqrt(shape[1])
    return weights


def _load(module: nn.Module, weights: dict[str, Tensor], dtype: torch.dtype) -> None:
    call(f"{_NAME}.load_state_dict(...) with the course's names (strict=True)", module.load_state_dict,
         {name: w.to(dtype) for name, w in weights.items()}, strict=True)


def _ids(gen: torch.Generator, *shape: int) -> Tensor:
    return torch.randint(0, _V, shape, generator=gen)


def _takes_positions(module: nn.Module) -> bool:
    return "token_positions" in inspect.signature(module.forward).parameters


def _forward(module: nn.Module, ids: Tensor, positions: Tensor | None, what: str, dtype: torch.dtype) -> Tensor:
    try:
        out = call(what, module, ids) if positions is None else call(what, module, ids, positions)
    except AssertionError as error:
        cause = str(crash_of(error) or "")
        if f"got values from 1 to {ids.shape[-1]}" in cause:
            fail("the default positions are shifted by one (1 … seq instead of 0 … seq - 1): the last token of a "
                 "full-length sequence falls off the end of RoPE's table",
                 "positions start at 0: the default is 0 … seq − 1, passed on unchanged",
                 f"{what}: {cause.splitlines()[0]}")
        raise
    expect_tensor(what, out, returns="return the logits, lm_head's output")
    expected = (*ids.shape, _V)
    if out.shape != expected:
        if tuple(out.shape) == (*ids.shape[:-1], _V):
            fail(*last_position_only(what, out.shape, expected))
        if tuple(out.shape) == (*ids.shape, _D):
            fail(*head_not_applied(what, out.shape))
        fail(f"{what} returned shape {tuple(out.shape)}, expected {expected} (batch…, seq, vocab_size)",
             "token_embeddings -> every block of self.layers -> ln_final -> lm_head, with no reshape or sum")
    if out.dtype != dtype:
        fail(f"{what} returned {out.dtype} for a model built with dtype={dtype}",
             "keep the model's dtype (no .float() or .double() inside forward)")
    return out


def _sees_the_future(module: nn.Module, ids: Tensor, positions: Tensor | None) -> bool:
    """True when changing the last token changes the logits of an earlier position."""
    changed = ids.clone()
    changed[..., -1] = (changed[..., -1] + 1) % _V
    args = () if positions is None else (positions,)
    with torch.no_grad():
        before, after = call("forward", module, ids, *args), call("forward", module, changed, *args)
    return not torch.equal(before[..., :-1, :], after[..., :-1, :])


def _compare(module: nn.Module, out: Tensor, ids: Tensor, weights: dict[str, Tensor], positions: Tensor | None,
             variants: list, what: str, **tolerance: float) -> None:
    """``out`` equals the reference; if not, name the first classic variant it matches."""
    expected = _lm(ids, weights, positions)
    if close(out, expected, **tolerance):
        return
    if out.detach().min() >= 0 and close(out.detach().sum(-1), torch.ones(out.shape[:-1], dtype=torch.float64),
                                         rtol=1e-4, atol=1e-4):
        fail(_VARIANTS[0][1], _VARIANTS[0][2], f"on {what}: every row is >= 0 and sums to 1")
    for knobs, mistake, fix in variants:
        knobs = dict(knobs)
        wrong_positions = knobs.pop("positions", positions)
        wrong = _lm(ids, weights, wrong_positions, **knobs)
        if not close(wrong, expected, **tolerance) and close(out, wrong, **tolerance):
            fail(mistake, fix, f"on {what}, your logits match that variant, not the reference")
    if _sees_the_future(module, ids, positions):
        fail("later tokens change the logits of earlier positions: no causal mask anywhere", _VARIANTS[-1][2],
             f"on {what}, changing the last token changed the logits of earlier positions")
    diff = (out.detach().double().cpu() - expected).abs().nan_to_num(nan=math.inf).max().item()
    fail(f"the logits differ from the reference (built from F.embedding, F.rms_norm, F.linear, "
         f"F.scaled_dot_product_attention and F.silu) by up to {diff:.3g} on {what}",
         "compare each part with token_embeddings -> every block in turn -> ln_final -> lm_head; if "
         "check_transformer_block fails, fix your block first")


# ---------------------------------------------------------------------------------------------------------
# The steps
# ---------------------------------------------------------------------------------------------------------

def _named_alias(module: nn.Module, name: str) -> str | None:
    children = dict(module.named_children())
    return next((alias for alias in _ALIASES[name] if alias in children or alias in vars(module)), None)


def _check_structure(impl: Any) -> None:
    """The signature; layers a registered ModuleList of distinct blocks; the contract's names and shapes, nothing
    else."""
    refuse_instance(impl, "check_transformer_lm")
    check_signature(impl, _SIGNATURE, _NAME)
    module = _make(impl, *_CONFIG)
    layers = vars(module).get("layers", getattr(module, "layers", None))
    if isinstance(layers, (list, tuple)):
        fail(f"{_NAME}.layers is a plain Python {type(layers).__name__}, so its blocks are not registered: their "
             "parameters are missing from model.parameters() (the optimiser never sees them) and from the state dict",
             "wrap them: self.layers = nn.ModuleList(TransformerBlock(...) for _ in range(num_layers))")
    children = dict(module.named_children())
    for name in ("token_embeddings", "layers", "ln_final", "lm_head"):
        if name not in children:
            alias = _named_alias(module, name)
            if alias is not None:
                fail(f"{_NAME} calls it `{alias}`, but the course's checkpoints call it `{name}`",
                     f"rename self.{alias} to self.{name}: the state dict's names come from the attribute names")
            if name == "ln_final":
                fail(f"{_NAME} has no ln_final: the last block's output must be normalised before lm_head",
                     "add self.ln_final = RMSNorm(d_model, device=device, dtype=dtype) and apply it before lm_head")
            fail(f"{_NAME} has no submodule `{name}` (its submodules are {sorted(children)})",
                 f"create self.{name} as CONTRACT.md describes: token_embeddings -> layers -> ln_final -> lm_head")
    if not isinstance(layers, nn.ModuleList):
        fail(f"{_NAME}.layers is a {type(layers).__name__}, not an nn.ModuleList",
             "self.layers = nn.ModuleList(TransformerBlock(...) for _ in range(num_layers))")
    if len(layers) != _L:
        fail(f"{_NAME}(num_layers={_L}) has {len(layers)} block{'' if len(layers) == 1 else 's'} in layers",
             "create exactly num_layers blocks: nn.ModuleList(TransformerBlock(...) for _ in range(num_layers))")
    if len({id(block) for block in layers}) < len(layers):
        fail(f"every entry of {_NAME}.layers is the same block object ([block] * num_layers), so all layers share "
             "one set of weights",
             "create a new block for each layer: nn.ModuleList(TransformerBlock(...) for _ in range(num_layers))")
    embedding, head = getattr(module.token_embeddings, "weight", None), getattr(module.lm_head, "weight", None)
    if isinstance(embedding, Tensor) and isinstance(head, Tensor) and (
            embedding is head or embedding.data_ptr() == head.data_ptr()):
        fail("lm_head's weight is tied to token_embeddings' (one shared matrix), but this recipe keeps them separate"
             + (" unless tie_embeddings=True" if _takes_tie(impl) else ""),
             "give lm_head its own Linear(d_model, vocab_size): the course's checkpoints hold two different matrices")
    check_parameters(module, _expected_shapes(), _NAME)


def _check_init(impl: Any) -> None:
    """token_embeddings start as Embedding does (std 0.987), lm_head as Linear does (0.987·σ, σ² = 2/(d + V))."""
    torch.manual_seed(0)
    vocab, d = 256, 64
    module = check_initialised(_NAME, lambda: impl(vocab, 16, d, 1, 4, 64, _THETA), _INIT_FIX)
    for name, sigma, recipe in [("token_embeddings", 1.0, "Embedding(vocab_size, d_model): N(0, 1) cut at ±3"),
                                ("lm_head", math.sqrt(2 / (d + vocab)), "Linear(d_model, vocab_size): σ² = 2/(d + V)")]:
        w = getattr(module, name).weight.detach().double()
        ratio = w.std().item() / sigma if torch.isfinite(w).all() else math.nan
        if not 0.93 <= ratio <= 1.05:
            fail(f"{name}.weight's initial std is {ratio:.3g} times its recipe's σ, not 0.987",
                 f"create it with the package's {recipe}, and keep its initialisation")


def _check_devices(impl: Any) -> None:
    check_device_and_dtype(lambda **kwargs: impl(*_CONFIG, **kwargs), _NAME)
    check_buffers_device(lambda **kwargs: impl(*_CONFIG, **kwargs), _NAME,
                         "pass device=device on to every block (and so to RoPE)")


def _check_forward(impl: Any, gen: torch.Generator) -> None:
    """Known weights; several leading shapes in float64, then float32; token_positions if forward takes them."""
    weights = _known_weights(gen)
    for dtype, shapes, tolerance in [(torch.float64, [(2, 6), (_CTX,), (2, 2, 5)], dict(rtol=1e-6, atol=1e-6)),
                                     (torch.float32, [(2, 6)], dict(rtol=1e-4, atol=1e-4))]:
        module = _make(impl, *_CONFIG, dtype=dtype)
        _load(module, weights, dtype)
        for shape in shapes:
            ids = _ids(gen, *shape)
            what = f"{_SHOWN} on token ids of shape {shape}, {dtype}"
            out = _forward(module, ids, None, what, dtype)
            _compare(module, out, ids, weights, None, _VARIANTS, what, **tolerance)
    if _takes_positions(module):
        module = _make(impl, *_CONFIG, dtype=torch.float64)
        _load(module, weights, torch.float64)
        ids = _ids(gen, 2, 6)
        positions = torch.tensor([[0, 1, 2, 0, 1, 2], [0, 2, 4, 5, 6, 7]])  # packed documents, gaps: not a shift
        what = f"{_SHOWN} on token ids of shape (2, 6), token_positions {positions.tolist()}"
        out = _forward(module, ids, positions, what, torch.float64)
        _compare(module, out, ids, weights, positions, _POSITION_VARIANTS + _VARIANTS, what, rtol=1e-6, atol=1e-6)


def _check_gradients(impl: Any, gen: torch.Generator) -> None:
    """Every weight's gradient equals the reference's (float64)."""
    weights = _known_weights(gen)
    module = _make(impl, *_CONFIG, dtype=torch.float64)
    _load(module, weights, torch.float64)
    ids = _ids(gen, 2, 6)
    upstream = torch.randn(2, 6, _V, generator=gen, dtype=torch.float64)
    what = f"{_SHOWN} on token ids of shape (2, 6)"
    out = _forward(module, ids, None, what, torch.float64)
    if not out.requires_grad:
        fail(f"{_NAME}'s logits carry no gradient (computed under torch.no_grad(), or from .detach()/.data)",
             "compute them from the submodules directly, so that autograd can follow")
    call(f"the backward pass of {what}", lambda: (out * upstream).sum().backward())
    reference = {name: w.clone().requires_grad_() for name, w in weights.items()}
    (_lm(ids, reference) * upstream).sum().backward()
    for name, parameter in module.named_parameters():
        if parameter.grad is None:
            fail(f"no gradient reaches {name}", "use every submodule in forward, with no .detach() or .data")
        if not close(parameter.grad, reference[name].grad, rtol=1e-6, atol=1e-6):
            fail(f"{name}'s gradient differs from the reference's", "build the logits from differentiable torch "
                 "operations only (no .item(), .detach(), .data or in-place changes)", f"on {what}")


def _check_fused(impl: Any, gen: torch.Generator) -> None:
    """If the class takes ``fused``, fused=True gives the same logits."""
    if "fused" not in inspect.signature(impl.__init__).parameters:
        return
    weights = _known_weights(gen)
    module = _make(impl, *_CONFIG, dtype=torch.float64, fused=True)
    _load(module, weights, torch.float64)
    ids = _ids(gen, 2, 6)
    with BuiltinSpy({reference.SDPA: "F.scaled_dot_product_attention"}) as spy:
        out = call(f"{_NAME}(..., fused=True) on token ids of shape (2, 6)", module, ids)
    if not spy.used:
        fail(f"{_NAME}(..., fused=True) does not pass fused on to its blocks: they attend with the from-scratch path",
             "build every block with TransformerBlock(..., fused=fused), which passes it on to its attention")
    if not close(out, _lm(ids, weights), rtol=1e-6, atol=1e-6):
        fail(f"{_NAME}(..., fused=True) differs from the reference, though the default path matches it",
             "pass fused on to every block; it may change only how attention is computed")


def check_transformer_lm(impl: Callable[..., Any]) -> None:
    """Check the learner's ``TransformerLM`` class; print one line if right, else raise ``AssertionError``.

    Checked: the signature ``(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta,
    device=None, dtype=None)``; the submodules ``token_embeddings``, ``layers`` (an ``nn.ModuleList`` of distinct
    blocks), ``ln_final``, ``lm_head``; the state dict exactly CONTRACT.md's names and shapes (no bias, nothing else
    saved); lm_head not tied to the embeddings; the initialisation of the embeddings and of lm_head; ``device`` and
    ``dtype`` honoured (RoPE's tables too); then, with known weights loaded by name (strict=True), the logits
    against a reference built here from ``F.embedding``, ``F.rms_norm``, ``F.linear``,
    ``F.scaled_dot_product_attention(is_causal=True)`` and ``F.silu`` with RoPE (11 ids, 2 layers, d_model 12 in 3
    heads, d_ff 16; ids of shape (2, 6), (8,), (2, 2, 5); float64 and float32), uneven ``token_positions`` if
    forward takes them, every weight's gradient, and ``fused=True`` if the class takes it; if it takes
    ``tie_embeddings``, that True makes ``lm_head.weight`` the very Parameter ``token_embeddings.weight`` (saved under
    both names, with the embedding's initialisation), whose logits and gradient (the sum of its two uses) are the
    reference's. Inputs come from a fixed seed; the caller's random state is kept.

    Mistakes it recognises (by name, in the first line of the error):
        * ln_final missing (no such submodule) or not applied;
        * softmax (probabilities) or log_softmax returned instead of logits; the last position's logits only;
          lm_head not applied;
        * no causal mask anywhere (a later token changes earlier logits);
        * embeddings multiplied by √d_model; lm_head tied to token_embeddings;
        * layers in a plain Python list (blocks not registered); the same block repeated ([block] * n);
          the wrong number of blocks;
        * wrong names (blocks, norm, ln_f, wte, head, … instead of the course's), wrong shapes, a bias, extra
          entries in the state dict;
        * token_positions not passed on to the blocks; the default positions shifted by one (seen on a full-length
          sequence, where the last one falls off RoPE's table);
        * fused=True not passed on to the blocks (they never call F.scaled_dot_product_attention);
        * blocks' outputs thrown away (layer(x) without x =); the residual added twice (x = x + layer(x));
          every block reading the embeddings;
        * token_embeddings or lm_head not initialised as their recipe says, or a weight never filled;
        * device/dtype ignored; no gradient (detached computations);
        * (if the class takes them) num_kv_heads or norm_eps not passed on to every block (and norm_eps to
          ln_final); the caches never handed to the blocks, or not one per block;
        * (if the class takes it) tie_embeddings=True ignored, or tied with a copy (a clone, .data copied in) or a
          second nn.Parameter around the embedding's weight instead of the one Parameter; tied the other way (the
          shared matrix gets lm_head's initialisation, not the embedding's); lm_head (and so its name in the state
          dict) dropped.
    """
    with torch.random.fork_rng(devices=[]):
        _check_structure(impl)
        _check_init(impl)
        _check_devices(impl)
        gen = generator(0)
        _check_forward(impl, gen)
        _check_gradients(impl, gen)
        _check_fused(impl, gen)
        _check_keywords(impl, gen)
        _check_cache_hook(impl, gen)
        _check_tie(impl, gen)
    passed(f"check_transformer_lm: token_embeddings -> {_L} layers (nn.ModuleList) -> ln_final -> lm_head with the "
           "course's state-dict names; logits match a reference from PyTorch built-ins with known weights (3 "
           "leading shapes, float32/64, uneven token_positions); gradients"
           + ("; fused=True" if "fused" in inspect.signature(impl.__init__).parameters else "")
           + ("; num_kv_heads and norm_eps passed on" if "num_kv_heads" in inspect.signature(impl.__init__).parameters
              else "")
           + ("; a cache per block" if "cache" in inspect.signature(impl.forward).parameters else "")
           + ("; tie_embeddings=True: one Parameter" if _takes_tie(impl) else ""))


# ---------------------------------------------------------------------------------------------------------
# The keywords passed on to the blocks (num_kv_heads, norm_eps) and the cache's hook
# ---------------------------------------------------------------------------------------------------------

def _check_keywords(impl: Any, gen: torch.Generator) -> None:
    """If the class takes them: num_kv_heads (1 key/value head for the 3 query heads) and norm_eps (0.1) reach every
    block, and the logits are the reference's with them."""
    takes = inspect.signature(impl.__init__).parameters
    if "num_kv_heads" in takes:
        module = _make(impl, *_CONFIG, dtype=torch.float64, num_kv_heads=1)
        rows = {name: tuple(p.shape) for name, p in module.named_parameters() if name.endswith("k_proj.weight")}
        if set(rows.values()) != {(_D // _H, _D)}:
            fail(f"{_NAME}(..., num_kv_heads=1) has k_proj weights of shapes {sorted(set(rows.values()))}, not "
                 f"({_D // _H}, {_D}): num_kv_heads is not passed on to the blocks",
                 "build every block with TransformerBlock(..., num_kv_heads=num_kv_heads), which passes it on to its "
                 "attention")
        weights = _known_weights(gen)
        for name in rows:
            for proj in ("k_proj", "v_proj"):
                weights[name.replace("k_proj", proj)] = weights[name.replace("k_proj", proj)][: _D // _H]
        _load(module, weights, torch.float64)
        ids = _ids(gen, 2, 6)
        out = call(f"{_NAME}(..., num_kv_heads=1) on token ids of shape (2, 6)", module, ids)
        if not close(out, reference.transformer_lm(ids, weights, _H, _THETA)):
            fail(f"{_NAME}(..., num_kv_heads=1) differs from the reference with one key/value head, though the model "
                 "without grouping matches it", "pass num_kv_heads on to every block, unchanged")
    if "norm_eps" in takes:
        module = _make(impl, *_CONFIG, dtype=torch.float64, norm_eps=0.1)
        eps = {name: getattr(m, "eps", None) for name, m in module.named_modules()
               if name.endswith(("ln1", "ln2", "ln_final"))}
        wrong = sorted(name for name, value in eps.items() if value != 0.1)
        if wrong:
            fail(f"{_NAME}(..., norm_eps=0.1) leaves {', '.join(wrong)} with another ε",
                 "pass norm_eps on to every block (its ln1 and ln2) and to ln_final")


def _check_cache_hook(impl: Any, gen: torch.Generator) -> None:
    """If forward takes ``cache``: one cache per block, block i getting cache[i]; a prompt then single ids with the
    course's KVCache give the logits of the whole sequence."""
    if "cache" not in inspect.signature(impl.forward).parameters:
        return
    from ..kv_cache import KVCache  # the course's: what is checked here is how the model hands the caches down
    weights = _known_weights(gen)
    module = _make(impl, *_CONFIG, dtype=torch.float64)
    _load(module, weights, torch.float64)
    ids = _ids(gen, 2, _CTX)
    caches = call("KVCache.for_model(your model, batch=2)", KVCache.for_model, module, 2)
    what = f"{_NAME} with one KVCache per block: a prompt of 5 ids, then single ids"
    shared = (f"{what}: every block writes into the first cache (they hold {{}} positions after a prompt of 5 ids): "
              "the blocks may not share one")
    with torch.no_grad():
        try:
            rows = [call(what, module, ids[:, :5], cache=caches)]
        except AssertionError:
            if caches[0].length >= 5 and all(cache.length == 0 for cache in caches[1:]):
                fail(shared.format([cache.length for cache in caches]), "hand block i its own cache, cache[i]: each "
                     "layer stores its own keys and values")
            raise
        if [cache.length for cache in caches] == [0] * _L:
            fail(f"{what}: the caches stay empty, the blocks never got them",
                 "hand block i its own cache, layer(x, token_positions, cache=cache[i])")
        if [cache.length for cache in caches] != [5] * _L:
            fail(shared.format([cache.length for cache in caches]), "hand block i its own cache, cache[i]: each "
                 "layer stores its own keys and values")
        rows += [call(what, module, ids[:, i:i + 1], cache=caches) for i in range(5, _CTX)]
    if not close(torch.cat(rows, dim=-2), _lm(ids, weights)):
        fail(f"{what}: the logits differ from the model's on the whole sequence",
             "hand block i its own cache, cache[i] (the blocks may not share one), and run the ids as they are: the "
             "attention places them after what its cache holds")


# ---------------------------------------------------------------------------------------------------------
# Tied embeddings (tie_embeddings=True)
# ---------------------------------------------------------------------------------------------------------

_TIE_FIX = ("after creating both parts, make lm_head's weight the embedding's own Parameter: "
            "self.lm_head.weight = self.token_embeddings.weight (one matrix, which the optimiser moves once per step)")


def _takes_tie(impl: Any) -> bool:
    return "tie_embeddings" in inspect.signature(impl.__init__).parameters


def _check_tie(impl: Any, gen: torch.Generator) -> None:
    """If the class takes ``tie_embeddings``: True makes lm_head.weight token_embeddings.weight itself (the same
    Parameter, in the state dict under both names) with the embedding's initialisation, and the logits and the
    gradient are the reference's with the one matrix in both places (its gradient the sum of the two uses)."""
    if not _takes_tie(impl):
        return
    shown = f"{_NAME}(..., tie_embeddings=True)"
    module = _make(impl, *_CONFIG, dtype=torch.float64, tie_embeddings=True)
    lm_head = getattr(module, "lm_head", None)
    embedding, head = module.token_embeddings.weight, getattr(lm_head, "weight", None)
    if not isinstance(head, Tensor):
        fail(f"{shown} has no lm_head.weight: the state dict must keep both names (a tied checkpoint then loads into "
             "an untied model too)", "keep lm_head and tie its weight: " + _TIE_FIX.split(": ", 1)[1])
    if head is not embedding:
        if head.data_ptr() == embedding.data_ptr():
            fail(f"{shown} wraps token_embeddings.weight in a second nn.Parameter: one storage, but two parameters, "
                 "so model.parameters() lists the matrix twice, each gets part of its gradient, and the optimiser "
                 "moves it twice per step", _TIE_FIX)
        if torch.equal(head, embedding):
            fail(f"{shown} copies token_embeddings.weight into lm_head (a clone, or .data copied in): two parameters "
                 "that start equal and drift apart at the first optimiser step", _TIE_FIX)
        fail(f"{shown} ignores tie_embeddings: lm_head.weight is a matrix of its own", _TIE_FIX)
    missing = [name for name in ("token_embeddings.weight", "lm_head.weight") if name not in module.state_dict()]
    if missing:
        fail(f"{shown}'s state dict lacks {', '.join(missing)}: a tied model saves its one matrix under both names",
             "leave state_dict as nn.Module makes it: it lists a shared Parameter under every name it has")
    torch.manual_seed(0)
    vocab, d = 256, 64
    tied = call(f"{_NAME}(vocab_size={vocab}, ..., d_model={d}, tie_embeddings=True)", impl, vocab, 16, d, 1, 4, 64,
                _THETA, tie_embeddings=True)
    std = tied.token_embeddings.weight.detach().double().std().item()
    if not 0.93 <= std <= 1.05:
        head_sigma = math.sqrt(2 / (d + vocab))
        if 0.93 <= std / head_sigma <= 1.05:
            fail(f"{shown}: the shared matrix has lm_head's initialisation (std {std:.3g}, σ² = 2/(d + V)), not the "
                 "embedding's: tied the other way round (token_embeddings.weight = lm_head.weight)",
                 "tie lm_head to the embedding, self.lm_head.weight = self.token_embeddings.weight, so that the one "
                 "matrix keeps Embedding's N(0, 1) cut at ±3, as GPT-2 and SmolLM2 do")
        fail(f"{shown}: the shared matrix's initial std is {std:.3g}, not the embedding's 0.987",
             "keep Embedding's initialisation, N(0, 1) cut at ±3, for the one matrix")
    weights = _known_weights(gen)
    weights["lm_head.weight"] = weights["token_embeddings.weight"]
    _load(module, weights, torch.float64)
    ids = _ids(gen, 2, 6)
    upstream = torch.randn(2, 6, _V, generator=gen, dtype=torch.float64)
    what = f"{shown} on token ids of shape (2, 6)"
    out = _forward(module, ids, None, what, torch.float64)
    if not close(out, _lm(ids, weights), rtol=1e-6, atol=1e-6):
        fail(f"{what} differs from the reference with one matrix as embedding and lm_head, though the untied model "
             "matches it", "tie the Parameter only: the lookup stays token_embeddings', the logits lm_head's")
    call(f"the backward pass of {what}", lambda: (out * upstream).sum().backward())
    shared = weights["token_embeddings.weight"].clone().requires_grad_()
    (_lm(ids, weights | {"token_embeddings.weight": shared, "lm_head.weight": shared}) * upstream).sum().backward()
    if embedding.grad is None or not close(embedding.grad, shared.grad, rtol=1e-6, atol=1e-6):
        fail(f"the gradient of {shown}'s one matrix is not the reference's, the sum of its two uses (the lookup and "
             "the logits)", "compute both uses from the one Parameter, with no .detach() or .data", f"on {what}")

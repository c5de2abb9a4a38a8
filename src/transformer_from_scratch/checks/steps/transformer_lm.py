"""Self-checks for the steps of notebook 10 (Transformer LM): the four parts, the forward pass, the forward FLOPs,
temperature (and greedy), top-k, top-p, and the generation loop."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn

from .._harness import (attempt, call, call_for_tensor, close, describe, diagnose, expect_tensor, fail, first_line,
                        generator, passed)
from .._lm_mistakes import (POSITIONS_NOT_PASSED, as_output, forward_variants, head_not_applied, last_position_only,
                            next_stream)

# ---------------------------------------------------------------------------------------------------------
# Step 1 · the four parts
# ---------------------------------------------------------------------------------------------------------

_V, _T, _D, _L, _H, _DFF, _THETA = 13, 12, 8, 3, 2, 24, 500.0  # every size differs; a theta of its own
_PARTS_CALL = (f"make_parts(vocab_size={_V}, context_length={_T}, d_model={_D}, num_layers={_L}, num_heads={_H}, "
               f"d_ff={_DFF}, rope_theta={_THETA:g})")


def _shape(module: Any) -> tuple[int, ...] | None:
    weight = getattr(module, "weight", None)
    return tuple(weight.shape) if isinstance(weight, Tensor) else None


def _check_block(i: int, block: Any) -> None:
    """layers[i] computes what TransformerBlock(d_model, num_heads, d_ff, context_length, rope_theta) computes."""
    name = f"layers[{i}]"
    if not isinstance(block, nn.Module):
        fail(f"{name} is {describe(block)}, not a block", "fill layers with TransformerBlock(...) modules")
    right = call(f"{type(block).__name__}(d_model, num_heads, d_ff, context_length, rope_theta)", type(block),
                 _D, _H, _DFF, _T, _THETA)
    try:
        right.load_state_dict(block.state_dict(), strict=True)
    except RuntimeError as error:
        fail(f"{name}'s weights do not have the shapes of TransformerBlock(d_model, num_heads, d_ff, context_length, "
             "rope_theta)", "pass the sizes in that order (d_ff is SwiGLU's hidden width)",
             str(error).splitlines()[1] if len(str(error).splitlines()) > 1 else str(error))
    x = torch.randn(2, _T, _D, generator=generator(3))
    out, error = attempt(f"{name}(x)", block, x)
    if error is not None:  # a block too short for the context is the likely cause
        fail(f"{name} fails on a sequence of context_length={_T} tokens ({type(error).__name__}: "
             f"{first_line(error)[:160]})", "pass context_length as the block's max_seq_len (the length RoPE's "
             "tables cover)")
    expected = right(x)
    if torch.allclose(out, expected, rtol=1e-5, atol=1e-6):
        return
    default_theta = call("TransformerBlock(..., rope_theta=10000.0)", type(block), _D, _H, _DFF, _T, 10000.0)
    default_theta.load_state_dict(block.state_dict())
    if torch.allclose(out, default_theta(x), rtol=1e-5, atol=1e-6):
        fail(f"{name} ignores rope_theta (it rotates with a base of 10,000, not the {_THETA:g} asked for)",
             "pass rope_theta on to every block as its theta")
    no_rope = call("TransformerBlock(..., None, None)", type(block), _D, _H, _DFF, None, None)
    no_rope.load_state_dict(block.state_dict())
    if torch.allclose(out, no_rope(x), rtol=1e-5, atol=1e-6):
        fail(f"{name} has no RoPE: the block was created without max_seq_len and theta",
             "pass context_length and rope_theta on to every block")
    fail(f"{name} computes differently from TransformerBlock(d_model, num_heads, d_ff, context_length, rope_theta) "
         "with the same weights", "create each block with exactly these arguments, in this order")


def check_make_parts(make_parts: Callable[..., Any]) -> None:
    """Check ``make_parts(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta)``: the four
    parts (token_embeddings, layers, ln_final, lm_head) of the model.

    Mistakes it recognises: the blocks in a plain Python list (not registered); one block repeated ([block] * n); the
    wrong number of blocks; a block that cannot take context_length tokens (context_length not its max_seq_len);
    rope_theta not passed on; Embedding's or Linear's arguments swapped; lm_head tied to the embeddings; ln_final
    missing or of the wrong width.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        parts = call(_PARTS_CALL, make_parts, _V, _T, _D, _L, _H, _DFF, _THETA)
        if not isinstance(parts, (tuple, list)) or len(parts) != 4:
            fail(f"{_PARTS_CALL} returned {describe(parts)}"
                 + (f" of {len(parts)}" if isinstance(parts, (tuple, list)) else "") + ", not the four parts",
                 "return them as one tuple: token_embeddings, layers, ln_final, lm_head")
        embeddings, layers, ln_final, lm_head = parts
        if _shape(embeddings) == (_D, _V):
            fail(f"token_embeddings' table has shape {(_D, _V)}: Embedding's arguments are swapped",
                 "Embedding(num_embeddings, embedding_dim) takes the vocabulary size first, then d_model")
        if _shape(embeddings) != (_V, _D):
            fail(f"token_embeddings is {describe(embeddings)} with a weight of shape {_shape(embeddings)}, expected "
                 f"an Embedding with a table of shape (vocab_size, d_model) = {(_V, _D)}",
                 "create it with the package's Embedding(vocab_size, d_model)")
        if isinstance(layers, (list, tuple)):
            fail(f"layers is a plain Python {type(layers).__name__}, so its blocks are not registered: a module that "
                 "holds it misses their parameters (the optimiser never sees them) and its state dict lacks them",
                 "wrap the blocks in an nn.ModuleList")
        if not isinstance(layers, nn.ModuleList):
            fail(f"layers is {describe(layers)}, not an nn.ModuleList of blocks",
                 "create num_layers TransformerBlocks inside an nn.ModuleList")
        if len(layers) != _L:
            fail(f"layers holds {len(layers)} block{'' if len(layers) == 1 else 's'}, not num_layers={_L}",
                 "create exactly num_layers blocks")
        if len({id(block) for block in layers}) < len(layers):
            fail("every entry of layers is the same block object ([block] * num_layers), so all layers share one "
                 "set of weights", "create a new TransformerBlock for each layer, in a loop or a generator")
        for i, block in enumerate(layers):
            _check_block(i, block)
        if ln_final is None or _shape(ln_final) is None:
            fail(f"ln_final is {describe(ln_final)}, not an RMSNorm: the last block's output must be normalised "
                 "before lm_head", "create it with RMSNorm(d_model)")
        if _shape(ln_final) != (_D,):
            fail(f"ln_final's gain has shape {_shape(ln_final)}, not (d_model,) = {(_D,)}: it normalises the blocks' "
                 "output, of width d_model", "create it with RMSNorm(d_model)")
        if _shape(lm_head) == (_D, _V):
            fail(f"lm_head's weight has shape {(_D, _V)}: Linear's arguments are swapped",
                 "lm_head maps d_model features to vocab_size logits: Linear(in_features=d_model, out_features="
                 "vocab_size)")
        if _shape(lm_head) != (_V, _D):
            fail(f"lm_head is {describe(lm_head)} with a weight of shape {_shape(lm_head)}, expected a Linear of "
                 f"shape (vocab_size, d_model) = {(_V, _D)}",
                 "create it with the package's Linear(d_model, vocab_size)")
        if lm_head.weight is embeddings.weight or lm_head.weight.data_ptr() == embeddings.weight.data_ptr():
            fail("lm_head's weight is tied to token_embeddings' (one shared matrix), but this recipe keeps them "
                 "separate",
                 "give lm_head its own Linear(d_model, vocab_size)")
    passed(f"make_parts: token_embeddings (vocab_size, d_model); {_L} distinct blocks in an nn.ModuleList that take "
           "context_length tokens with rope_theta; ln_final; lm_head (vocab_size, d_model), not tied")


# ---------------------------------------------------------------------------------------------------------
# Step 2 · the forward pass, on stand-in parts
# ---------------------------------------------------------------------------------------------------------

class _Table(nn.Module):
    """A stand-in for token_embeddings: row token_ids of the table."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)

    def forward(self, token_ids: Tensor) -> Tensor:
        return self.weight[token_ids]


class _Block(nn.Module):
    """A stand-in block, x + tanh(x W)·(1 + position/10), that records the token_positions it was given."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.seen: list[Tensor | None] = []

    def forward(self, x: Tensor, token_positions: Tensor | None = None) -> Tensor:
        self.seen.append(token_positions)
        positions = torch.arange(x.shape[-2]) if token_positions is None else token_positions
        return x + torch.tanh(x @ self.weight) * (1 + 0.1 * positions[..., None].to(x.dtype))


class _Norm(nn.Module):
    """A stand-in for ln_final: x / RMS(x) · gain."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)

    def forward(self, x: Tensor) -> Tensor:
        return x / x.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt() * self.weight


class _Head(nn.Module):
    """A stand-in for lm_head: x Wᵀ."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight.T


def _stand_ins(vocab: int = 9, d: int = 6, layers: int = 3) -> tuple[nn.Module, nn.ModuleList, nn.Module, nn.Module]:
    gen = generator(1)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    return (_Table(rand(vocab, d)), nn.ModuleList(_Block(rand(d, d) / d**0.5) for _ in range(layers)),
            _Norm(1 + 0.3 * rand(d)), _Head(rand(vocab, d) / d**0.5))


def _forward_variant(parts: tuple, ids: Tensor, positions: Tensor | None, *, ln_final: bool = True,
                     chain: str = "right", output: str = "logits") -> Tensor:
    """The forward pass on the stand-ins, right or with one classic mistake (_lm_mistakes's knobs)."""
    embeddings, layers, norm, lm_head = parts
    with torch.no_grad():
        embedded = embeddings(ids)
        x = embedded
        for layer in layers:
            out = layer(embedded if chain == "embeddings" else x, positions)
            x = next_stream(chain, x, out)
        logits = lm_head(norm(x) if ln_final else x)
        for layer in layers:
            layer.seen.clear()
    return as_output(logits, output)


_FORWARD_VARIANTS = forward_variants("lm_forward")  # the same catalogue as check_transformer_lm's


def check_lm_forward(lm_forward: Callable[..., Any]) -> None:
    """Check ``lm_forward(token_ids, token_embeddings, layers, ln_final, lm_head, token_positions=None)``: embed, run
    every block with the positions, final norm, LM head -> logits (..., seq, vocab).

    Runs on small stand-in parts (float64) whose blocks depend on the positions and record what they were given.
    Mistakes it recognises: probabilities (softmax) or log-probabilities returned instead of logits; ln_final not
    applied; lm_head not applied; the last position's logits only; token_positions not passed on to the blocks;
    the blocks' outputs thrown away; the residual added twice; every block reading the embeddings.
    """
    parts = _stand_ins()
    vocab, d = parts[0].weight.shape
    ids_2d = torch.randint(0, vocab, (2, 5), generator=generator(2))
    cases = [(ids_2d, None), (ids_2d, torch.tensor([[0, 1, 2, 0, 1], [3, 4, 5, 6, 7]])), (ids_2d[0], None)]
    for ids, positions in cases:
        what = (f"lm_forward(token ids of shape {tuple(ids.shape)}, the four parts, "
                f"token_positions={None if positions is None else positions.tolist()})")
        with torch.no_grad():
            out = call(what, lm_forward, ids, *parts, positions)
        seen = [list(layer.seen) for layer in parts[1]]
        for layer in parts[1]:
            layer.seen.clear()
        expected = _forward_variant(parts, ids, positions)
        if isinstance(out, Tensor) and close(out, expected, rtol=1e-9, atol=1e-9):
            continue
        if positions is not None and all(seen) and any(
                not any(p is not None and torch.equal(torch.as_tensor(p), positions) for p in s) for s in seen):
            fail(*POSITIONS_NOT_PASSED)
        if isinstance(out, Tensor) and tuple(out.shape) == (*ids.shape[:-1], vocab):
            fail(*last_position_only(what, out.shape, (*ids.shape, vocab)))
        if isinstance(out, Tensor) and tuple(out.shape) == (*ids.shape, d):
            fail(*head_not_applied(what, out.shape))
        out = expect_tensor(what, out, expected.shape, "one row of vocab_size logits per position: (..., seq, vocab)")
        diagnose(what, out, expected, [(lambda k=k: _forward_variant(parts, ids, positions, **k), mistake, fix)
                                       for k, mistake, fix in _FORWARD_VARIANTS],
                 "embed, run every block in order (x becomes its output), ln_final, lm_head",
                 rtol=1e-9, atol=1e-9)
    passed("lm_forward: embeddings -> every block with token_positions -> ln_final -> lm_head, logits for every "
           "position, with and without positions, with and without a batch dimension")


# ---------------------------------------------------------------------------------------------------------
# Step 3 · the forward FLOPs
# ---------------------------------------------------------------------------------------------------------

_FLOP_KEYS = ["attention projections", "attention scores", "FFN", "lm_head"]


def _flops(V: int, t: int, d: int, L: int, d_ff: int) -> dict[str, int]:
    return {"attention projections": L * 8 * t * d * d, "attention scores": L * 4 * t * t * d,
            "FFN": L * 6 * t * d * d_ff, "lm_head": 2 * t * d * V}


def check_forward_flops(forward_flops: Callable[..., Any]) -> None:
    """Check ``forward_flops(vocab_size, t, d_model, num_layers, d_ff)``: the forward FLOPs of one sequence of t
    tokens, by component, matrix products only, (m×n)(n×p) = 2mnp.

    Mistakes it recognises: mnp counted instead of 2mnp; output_proj forgotten (three projections); the attention
    scores counted at half (QKᵀ only, or halved for the causal mask); the FFN with two matrices (GPT-2's MLP, not
    SwiGLU); one block counted instead of num_layers; lm_head counted once per layer.
    """
    for V, t, d, L, d_ff in [(1000, 100, 64, 3, 192), (50_257, 1_024, 768, 12, 3_072)]:
        what = f"forward_flops(vocab_size={V}, t={t}, d_model={d}, num_layers={L}, d_ff={d_ff})"
        out = call(what, forward_flops, V, t, d, L, d_ff)
        if not isinstance(out, dict) or sorted(out) != sorted(_FLOP_KEYS):
            fail(f"{what} returned {describe(out) if not isinstance(out, dict) else f'the keys {sorted(out)}'}",
                 f"return a dict with exactly the keys {_FLOP_KEYS}")
        right = _flops(V, t, d, L, d_ff)
        wrong = {key: value for key, value in out.items() if value != right[key]}
        if not wrong:
            continue
        if all(out[key] * 2 == right[key] for key in _FLOP_KEYS):
            fail("every count is half the right one: it counts mnp multiply-adds, not 2mnp FLOPs",
                 "a product (m×n)(n×p) is mnp multiplications and mnp additions: 2mnp FLOPs")
        if all(out[key] * L == right[key] for key in _FLOP_KEYS[:3]):
            fail("the blocks' FLOPs are those of one block", "multiply the projections, scores and FFN by num_layers")
        variants = {
            "attention projections": [(L * 6 * t * d * d, "the attention projections count three matrices "
                                       "(q, k, v): output_proj is a fourth (t×d)(d×d) product")],
            "attention scores": [(L * 2 * t * t * d, "the attention scores are counted at half: QKᵀ and the weights "
                                  "times V cost 2t²d each per layer, and the causal mask saves nothing (the masked "
                                  "scores are computed all the same)")],
            "FFN": [(L * 4 * t * d * d_ff, "the FFN counts two matrices (GPT-2's MLP): SwiGLU has three, w1, w3 "
                     "and w2")],
            "lm_head": [(L * 2 * t * d * V, "lm_head is counted once per layer: it runs once, after the blocks")],
        }
        for key, value in wrong.items():
            for wrong_value, mistake in variants[key]:
                if value == wrong_value:
                    fail(mistake, "see the table: one row per matrix product",
                         f"{what}[{key!r}] = {value:,}, expected {right[key]:,}")
        key, value = next(iter(wrong.items()))
        fail(f"{what}[{key!r}] is {value!r}, expected {right[key]:,}",
             "count 2mnp for every matrix product of that row of the table, times num_layers for the blocks' parts")
    passed("forward_flops: 2mnp for every matrix product; four projections, QKᵀ and weights·V, SwiGLU's three "
           "matrices per layer, lm_head once (two configurations)")


# ---------------------------------------------------------------------------------------------------------
# Step 4 · temperature, and greedy at 0
# ---------------------------------------------------------------------------------------------------------

def _logits(gen_seed: int, *shape: int) -> Tensor:
    return torch.randn(*shape, generator=generator(gen_seed), dtype=torch.float64) * 2


def _unchanged(name: str, before: Tensor, after: Tensor, argument: str) -> None:
    if not torch.equal(before, after):
        fail(f"{name} changes {argument} in place: the caller's tensor is not the same after the call",
             "compute a new tensor (masked_fill, not masked_fill_; no assignment into the argument)")


def check_temperature_probs(temperature_probs: Callable[[Tensor, float], Tensor]) -> None:
    """Check ``temperature_probs(logits, temperature)``: softmax(logits / temperature) along the last dimension; at
    temperature 0, probability 1 on the largest logit (the first one, if tied), 0 elsewhere.

    Mistakes it recognises: the logits multiplied by the temperature instead of divided; the temperature ignored;
    the probabilities divided instead of the logits; the scaled logits returned (no softmax); the softmax over the
    wrong dimension; at temperature 0: not handled (inf and NaN), the model's own distribution returned, the index
    of the argmax returned, every tied maximum given 1, tied maxima sharing the probability, the last of tied maxima
    chosen; the logits changed in place.
    """
    z = _logits(4, 3, 6)
    z[2] = torch.tensor([0.0, 3.0, -1.0, 3.0, 1.0, 0.5], dtype=torch.float64)  # a tie for the largest
    for logits, temperature in [(z, 0.5), (z, 2.0), (z, 1.0), (z[0], 0.7)]:
        what = f"temperature_probs(logits of shape {tuple(logits.shape)}, temperature={temperature})"
        before = logits.clone()
        out = call_for_tensor(what, temperature_probs, logits, temperature, shape=logits.shape,
                              fix="one probability per logit, the same shape as logits")
        _unchanged("temperature_probs", before, logits, "logits")
        expected = (logits / temperature).softmax(-1)
        variants = [
            ((logits * temperature).softmax(-1), "the logits are multiplied by the temperature instead of divided",
             "divide: a temperature below 1 must sharpen the distribution, above 1 flatten it"),
            (logits.softmax(-1), "the temperature is ignored: this is the model's own distribution",
             "divide the logits by the temperature before the softmax"),
            (logits.softmax(-1) / temperature, "the temperature divides the probabilities, not the logits",
             "divide the logits, then take the softmax: the result must still sum to 1"),
            (logits / temperature, "temperature_probs returns the scaled logits, not probabilities",
             "finish with a softmax over the last dimension"),
        ]
        if logits.ndim > 1:
            variants.append(((logits / temperature).softmax(0), "the softmax runs over the wrong dimension (the rows "
                             "of the batch)", "take it over the last dimension, the vocabulary: dim=-1"))
        diagnose(what, out, expected, variants, "softmax(logits / temperature) over the last dimension",
                 rtol=1e-9, atol=1e-12)
    what = f"temperature_probs(logits of shape {tuple(z.shape)}, temperature=0)"
    before = z.clone()
    try:
        out = temperature_probs(z, 0)
    except ZeroDivisionError:
        fail("temperature 0 is not handled: dividing by it raises ZeroDivisionError",
             "treat 0 apart: greedy puts probability 1 on the largest logit", f"on {what}")
    except Exception:  # noqa: BLE001 - let call() turn a stub or a crash into its verdict
        out = call(what, temperature_probs, z, 0)
    _unchanged("temperature_probs", before, z, "logits")
    if isinstance(out, Tensor) and tuple(out.shape) == tuple(z.shape[:-1]):
        fail(f"{what} returns the index of the largest logit, not a distribution",
             "put probability 1 at that index and 0 everywhere else, in a tensor shaped like logits",
             f"got shape {tuple(out.shape)}")
    out = expect_tensor(what, out, z.shape, "one probability per logit, the same shape as logits")
    if not torch.isfinite(out).all():
        fail("temperature 0 is not handled: logits / 0 gives ±inf, and the softmax of those gives NaN",
             "treat 0 apart: greedy puts probability 1 on the largest logit", f"on {what}")
    expected = torch.zeros_like(z).scatter_(-1, z.argmax(-1, keepdim=True), 1.0)
    maxima = (z == z.amax(-1, keepdim=True)).to(z.dtype)
    last = torch.zeros_like(z).scatter_(-1, (z.shape[-1] - 1 - z.flip(-1).argmax(-1, keepdim=True)), 1.0)
    diagnose(what, out, expected, [
        (z.softmax(-1), "temperature 0 returns the model's own distribution, not greedy",
         "at temperature 0 put probability 1 on the largest logit, 0 elsewhere"),
        (maxima, "at temperature 0 every tied maximum gets probability 1, so a row can sum to 2",
         "put 1 on one of them only, the first (argmax's choice)"),
        (maxima / maxima.sum(-1, keepdim=True), "at temperature 0 tied maxima share the probability",
         "greedy is one token: put 1 on the first of them (argmax's choice)"),
        (last, "at temperature 0 the last of tied maxima gets the probability, not the first",
         "use argmax, which returns the first of tied maxima"),
    ], "at temperature 0: probability 1 on the first largest logit of each row, 0 elsewhere", rtol=0, atol=1e-12)
    passed("temperature_probs: softmax(logits / T) over the last dimension (T = 0.5, 1, 2; one row and a batch); "
           "T = 0 is greedy, 1 on the first maximum")


# ---------------------------------------------------------------------------------------------------------
# Steps 5 and 6 · top-k and top-p, on probabilities
# ---------------------------------------------------------------------------------------------------------

def _probs(seed: int, *shape: int) -> Tensor:
    return _logits(seed, *shape).softmax(-1)


def _renormalise(p: Tensor) -> Tensor:
    return p / p.sum(-1, keepdim=True)


def _keep(probs: Tensor, keep: Tensor) -> Tensor:
    return probs.masked_fill(~keep, 0.0)


def _top_k_keep(probs: Tensor, k: int, *, ties: bool = True) -> Tensor:
    if ties:
        return probs >= probs.topk(k, -1).values[..., -1:]
    return torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, probs.topk(k, -1).indices, True)


def _top_p_keep(probs: Tensor, p: float, rule: str = "right", descending: bool = True) -> Tensor:
    ordered, order = probs.sort(-1, descending=descending)
    cumulative = ordered.cumsum(-1)
    keep_sorted = {"right": cumulative - ordered < p, "crossing dropped": cumulative <= p,
                   "one more": cumulative - ordered <= p}[rule]
    return torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)


def _call_filter(name: str, fn: Callable[[Tensor, Any], Tensor], probs: Tensor, arg: Any, arg_name: str,
                 one_row_works: bool) -> tuple[str, Tensor]:
    what = f"{name}(probs of shape {tuple(probs.shape)}, {arg_name}={arg})"
    before = probs.clone()
    if one_row_works and probs.ndim > 1:
        out, error = attempt(what, fn, probs, arg)
        if error is not None:  # it worked on one row: the batch is what breaks it
            fail(f"{what} fails on a batch of rows, though it works on one row ({type(error).__name__}: "
                 f"{first_line(error)[:120]})",
                 "work along the last dimension of each row: keep a per-row threshold as a column "
                 "(index [..., -1:] or keepdim=True), so that it broadcasts against its own row")
    else:
        out = call(what, fn, probs, arg)
    _unchanged(name, before, probs, "probs")
    return what, expect_tensor(what, out, probs.shape, "the filtered probabilities, the same shape as probs")


def _filter_variants(name: str, probs: Tensor, keep: Tensor) -> list[tuple[Any, str, str]]:
    """The mistakes top-k and top-p share: not renormalised, renormalised over the batch, returned sorted."""
    right = _renormalise(_keep(probs, keep))
    variants = [(_keep(probs, keep), "the kept probabilities are not renormalised: the row no longer sums to 1",
                 "divide each row by its sum, along the last dimension")]
    if probs.ndim > 1:
        variants.append((_keep(probs, keep) / _keep(probs, keep).sum(),
                         "the kept probabilities are renormalised over the whole batch, not each row",
                         "renormalise each row by its own sum, over the last dimension"))
    variants.append((right.sort(-1, descending=True).values, f"{name} returns the probabilities sorted, not in the "
                     "vocabulary's order", "mask the tokens in their own places; sort only to find which to keep"))
    return variants


def _exact_zeros(what: str, out: Tensor, keep: Tensor) -> None:
    if (out[~keep] != 0).any() and torch.allclose(out[~keep], torch.zeros_like(out[~keep]), atol=1e-6):
        fail(f"{what}: the dropped tokens keep a tiny probability instead of exactly 0",
             "set the dropped tokens to 0 (masked_fill), so that a sampler can never draw them")


def check_top_k_filter(top_k_filter: Callable[[Tensor, int], Tensor]) -> None:
    """Check ``top_k_filter(probs, k)``: in each row (the last dimension), keep the k largest probabilities (and any
    tied with the k-th largest), set the others to 0, and renormalise so that the row sums to 1.

    Mistakes it recognises: the k smallest kept; no renormalisation; renormalised over the whole batch; k + 1 or
    k - 1 tokens kept; the probabilities returned sorted; a token tied with the k-th dropped; a per-row threshold
    that breaks on a batch (works on one row only); probs changed in place.
    """
    tie = torch.tensor([0.25, 0.125, 0.0625, 0.25, 0.125, 0.0625, 0.0625, 0.0625], dtype=torch.float64)
    cases = [(_probs(5, 8), 3), (_probs(6, 3, 8), 2), (_probs(7, 3, 8), 8), (tie, 3)]  # tie: 4 tokens stay
    one_row_works = False
    for probs, k in cases:
        what, out = _call_filter("top_k_filter", top_k_filter, probs, k, "k", one_row_works)
        one_row_works = one_row_works or probs.ndim == 1
        keep = _top_k_keep(probs, k)
        _exact_zeros(what, out, keep)
        variants = [(_renormalise(_keep(probs, _top_k_keep(-probs, k))), "top_k_filter keeps the k smallest "
                     "probabilities, "
                     "not the k largest", "keep the largest: topk's default, or sort in descending order")]
        variants += _filter_variants("top_k_filter", probs, keep)
        if k < probs.shape[-1]:
            variants.append((_renormalise(_keep(probs, _top_k_keep(probs, k + 1))), "top_k_filter keeps k + 1 tokens",
                             "the threshold is the k-th largest probability itself (index k - 1 from 0)"))
        if k > 1:
            variants.append((_renormalise(_keep(probs, _top_k_keep(probs, k - 1))), "top_k_filter keeps k - 1 "
                             "tokens: the "
                             "k-th largest itself is dropped", "keep every probability at least as large as the "
                             "k-th largest (>=, or drop those strictly below it)"))
        variants.append((_renormalise(_keep(probs, _top_k_keep(probs, k, ties=False))), "a token tied with the k-th "
                         "largest probability is dropped (exactly k kept)", "keep every token whose probability "
                         "is at least the k-th largest: ties with it stay"))
        diagnose(what, out, _renormalise(_keep(probs, keep)), variants,
                 "keep the k largest of each row (and ties with the k-th), zero the rest, divide by the row's sum",
                 rtol=1e-9, atol=1e-12)
    passed("top_k_filter: the k largest of each row (ties with the k-th stay), the rest exactly 0, renormalised; "
           "one row and a batch, k = 2, 3 and the whole vocabulary")


def check_top_p_filter(top_p_filter: Callable[[Tensor, float], Tensor]) -> None:
    """Check ``top_p_filter(probs, p)``: in each row, keep the smallest set of most likely tokens whose probabilities
    add up to at least p (always at least the most likely one), set the others to 0, and renormalise.

    Mistakes it recognises: the token whose probability crosses p dropped (nothing kept when the top token alone
    exceeds p); one token too many when the kept mass reaches p exactly; the least likely tokens kept; no
    renormalisation; renormalised over the whole batch; the probabilities returned sorted; a batch that breaks a
    one-row version; probs changed in place.
    """
    dyadic = torch.tensor([0.125, 0.5, 0.0625, 0.25, 0.0625], dtype=torch.float64)  # sums are exact in float64
    cases = [(dyadic, 0.4), (dyadic, 0.7), (dyadic, 0.75), (_probs(8, 3, 10), 0.6), (_probs(9, 3, 10), 0.9),
             (dyadic, 1.0)]
    one_row_works = False
    for probs, p in cases:
        what, out = _call_filter("top_p_filter", top_p_filter, probs, p, "p", one_row_works)
        one_row_works = one_row_works or probs.ndim == 1
        keep = _top_p_keep(probs, p)
        if not torch.isfinite(out).all() or (out.sum(-1) == 0).any():
            fail(f"{what} keeps no token at all in some row: the token whose probability crosses p is dropped",
                 "keep a token while the mass of the more likely ones before it is still below p; the most likely "
                 "token always stays", "here the most likely token alone holds more than p" if p < probs.max() else "")
        _exact_zeros(what, out, keep)
        variants = [
            (_renormalise(_keep(probs, _top_p_keep(probs, p, "crossing dropped"))), "the token whose probability "
             "crosses p is dropped, so the kept mass stays below p", "keep a token while the mass of the more likely "
             "ones before it is still below p"),
            (_renormalise(_keep(probs, _top_p_keep(probs, p, "one more"))), "one token too many: when the more "
             "likely tokens already add up to exactly p, the next one is kept too", "stop as soon as the kept mass "
             "reaches p: drop a token when the mass before it is >= p"),
            (_renormalise(_keep(probs, _top_p_keep(probs, p, descending=False))), "top_p_filter keeps the least "
             "likely tokens, "
             "not the most likely", "sort in descending order"),
        ]
        variants += _filter_variants("top_p_filter", probs, keep)
        diagnose(what, out, _renormalise(_keep(probs, keep)), variants,
                 "sort each row in descending order, keep a token while the mass before it is below p, zero the "
                 "rest in the vocabulary's order, divide by the row's sum", rtol=1e-9, atol=1e-12)
    passed("top_p_filter: the smallest set of most likely tokens that reaches p (at least the top one, the crossing "
           "one included, not one more), the rest exactly 0, renormalised; one row and a batch")


# ---------------------------------------------------------------------------------------------------------
# Step 7 · the generation loop, on a stand-in model
# ---------------------------------------------------------------------------------------------------------

_GEN_V, _GEN_CTX = 7, 4


class _Recorder(nn.Module):
    """A stand-in language model (7 ids, context_length 4) that records its inputs. Its logits at position i favour
    one id, computed from the ids up to i, so that every window and every position leads somewhere else."""

    context_length = _GEN_CTX

    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[Tensor] = []

    def forward(self, token_ids: Tensor) -> Tensor:
        if token_ids.ndim != 2 or token_ids.shape[0] != 1:
            raise ValueError(f"the stand-in model expects ids of shape (1, seq), got shape {tuple(token_ids.shape)}: "
                             "give it a batch of one sequence")
        self.inputs.append(token_ids[0].clone())
        favoured = (3 * token_ids.cumsum(-1) + torch.arange(token_ids.shape[-1])) % _GEN_V
        return 5.0 * torch.nn.functional.one_hot(favoured, _GEN_V).to(torch.float32)


def _favoured(window: Tensor) -> int:
    return int((3 * window.sum() + len(window) - 1) % _GEN_V)


def _expected_loop(prompt: Tensor, n: int, eos_id: int | None, window: str = "last") -> list[int]:
    ids, new = prompt.tolist(), []
    for _ in range(n):
        seen = {"last": ids[-_GEN_CTX:], "first": ids[:_GEN_CTX], "all": ids}[window]
        new.append(_favoured(torch.tensor(seen)))
        ids.append(new[-1])
        if eos_id is not None and new[-1] == eos_id:
            break
    return new


class _Pick:
    """The pick function given to the loop: the argmax of the logits, after checking their shape; it records them."""

    def __init__(self) -> None:
        self.given: list[Tensor] = []

    def __call__(self, logits: Tensor) -> Tensor:
        if not isinstance(logits, Tensor) or tuple(logits.shape) != (_GEN_V,):
            raise ValueError(f"pick expects the logits of the last position, shape (vocab,) = ({_GEN_V},), got "
                             f"{describe(logits)}: index the model's output at batch 0 and position -1")
        self.given.append(logits.clone())
        return logits.argmax().view(1)


def check_generation_loop(generation_loop: Callable[..., Tensor]) -> None:
    """Check ``generation_loop(model, prompt_ids, max_new_tokens, pick, eos_id=None)``: up to max_new_tokens times,
    run the model on the last model.context_length ids (as a batch of one), give the last position's logits to
    pick, append the id it returns; stop after appending eos_id. Returns the new ids only.

    Runs on a stand-in model (7 ids, context_length 4) that records its inputs. Mistakes it recognises: no window
    (the whole text goes to the model); the first ids in the window instead of the last; the first position's
    logits; the prompt returned with the new ids; one id too many or too few; no stop at eos_id; eos_id not
    appended before stopping; not an empty result for max_new_tokens = 0.
    """
    with torch.random.fork_rng(devices=[]):
        # [1, 2] continues 3, 6, 4, 6, 4, 0: eos_id 4 comes up first as the third new id.
        for prompt, n, eos_id in [([1, 2], 6, None), ([5, 0, 3, 6, 2, 4], 3, None), ([1, 2], 6, 4), ([3], 0, None)]:
            prompt = torch.tensor(prompt)
            model, pick = _Recorder(), _Pick()
            what = f"generation_loop(model, prompt_ids={prompt.tolist()}, max_new_tokens={n}, pick, eos_id={eos_id})"
            out = call_for_tensor(what, generation_loop, model, prompt, n, pick, eos_id,
                                  returns="return the new ids as one sequence, a 1-D tensor")
            if out.ndim != 1:
                fail(f"{what} returned {describe(out)}, not a 1-D tensor of ids", "return the new ids as one sequence")
            if any(len(seen) > _GEN_CTX for seen in model.inputs):
                longest = max(len(s) for s in model.inputs)
                fail(f"generation_loop gives the model the whole text: it got {longest} ids, more than its "
                     f"context_length={_GEN_CTX}", "before each call keep only the last model.context_length ids",
                     f"on {what}")
            expected = _expected_loop(prompt, n, eos_id)
            got = out.tolist()
            if got == expected:
                continue
            if got[:len(prompt)] == prompt.tolist() and got[len(prompt):] == expected:
                fail(f"{what} returns the prompt too", "return only the ids it added (slice the prompt's length off)")
            text = prompt.tolist() + got
            for j, seen in enumerate(model.inputs):
                so_far = text[:len(prompt) + j]
                if seen.tolist() != so_far[-_GEN_CTX:]:
                    if seen.tolist() == so_far[:_GEN_CTX]:
                        fail("the window holds the first context_length ids, not the last", "keep the last "
                             "model.context_length ids: the newest ones decide what comes next", f"on {what}")
                    fail(f"call {j + 1} gave the model {seen.tolist()}, not the last context_length ids of the text "
                         f"so far, {so_far[-_GEN_CTX:]}", "append each new id to the text, and give the model its "
                         "last model.context_length ids", f"on {what}")
            if pick.given and model.inputs and any(
                    int(logits.argmax()) != _favoured(seen)
                    for logits, seen in zip(pick.given, model.inputs)):
                fail("pick gets the logits of another position, not the last one",
                     "take the model's output at batch 0 and position -1: the last position predicts the next id",
                     f"on {what}")
            if eos_id is not None and got == _expected_loop(prompt, n, None):
                fail(f"generation_loop does not stop at eos_id={eos_id}",
                     "after appending an id equal to eos_id, stop the loop",
                     f"on {what}: {got}")
            if eos_id is not None and got == expected[:-1]:
                fail(f"generation_loop stops before eos_id={eos_id} is appended",
                     "append the id first, then stop if it is eos_id",
                     f"on {what}: {got}")
            if len(got) == n + 1 or len(got) == n - 1:
                fail(f"{what} returned {len(got)} ids: one too {'many' if len(got) > n else 'few'}",
                     "loop exactly max_new_tokens times (fewer only when eos_id stops it)", f"got {got}")
            fail(f"{what} returned {got}, expected {expected}",
                 "each turn: the last context_length ids -> model -> the last position's logits -> pick -> append",
                 f"the model was given {[s.tolist() for s in model.inputs]}")
    passed("generation_loop: a window of the last context_length ids, the last position's logits to pick, the new "
           "ids only, a stop right after eos_id, nothing for max_new_tokens = 0")

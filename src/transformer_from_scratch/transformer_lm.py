# Generated from notebooks/10_transformer_lm.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: 9ce10cbdf8a90fe6166827913a587f4fbd5de34df555b36fa61352ca8969afa0

import inspect
from collections.abc import Callable

import torch
from jaxtyping import Float, Int, Integer
from torch import Tensor, nn

from transformer_from_scratch.embedding import Embedding
from transformer_from_scratch.linear import Linear
from transformer_from_scratch.rmsnorm import RMSNorm
from transformer_from_scratch.shapes import (check_length, check_positions, checking, is_integer_dtype, shape_checked,
                                             trusted)
from transformer_from_scratch.softmax import softmax
from transformer_from_scratch.transformer_block import TransformerBlock


def _check_arguments(**sizes: int) -> None:
    """TransformerLM's and count_resources' check of their sizes, a ValueError that names them."""
    if min(sizes.values()) < 1:
        raise ValueError(f"every size must be >= 1, got " + ", ".join(f"{k}={v}" for k, v in sizes.items()))


def _check_input(model: "TransformerLM", token_ids: Tensor, token_positions: Tensor | None, cache: list | None) -> None:
    """TransformerLM.forward's checks, made once at the model's edge (the blocks inside trust them), each an error
    that names the numbers. Skipped inside `trusted()` (generate, which checked its prompt).

    The ids' range is the embedding's check, the forward's one read-back from the device: not made twice."""
    if not checking():
        return
    if token_ids.ndim < 1:
        raise ValueError(f"TransformerLM expects token ids of shape (..., seq), got a 0-d tensor: "
                         f"wrap one id as a sequence, token_ids.view(1)")
    if not is_integer_dtype(token_ids.dtype):
        raise TypeError(f"TransformerLM expects integer token ids (torch.long), got dtype {token_ids.dtype}")
    past = 0
    if cache is not None:
        lengths = sorted({layer_cache.length for layer_cache in cache})
        if len(cache) != len(model.layers) or len(lengths) != 1:
            raise ValueError(f"TransformerLM: the cache must be one per block, all of one length: {len(model.layers)} "
                             f"blocks, {len(cache)} caches holding {lengths} positions (start again from empty ones)")
        past = lengths[0]
    check_length("TransformerLM", token_ids.shape[-1], model.context_length, "context_length", token_ids.shape,
                 past=past, tensor="token_ids", advice=f"keep the last {model.context_length} tokens, as generate does")
    check_positions("TransformerLM", token_positions, token_ids.shape, token_ids.shape, tensor="token_ids")


def _check_generate(prompt_ids: Tensor, max_new_tokens: int, temperature: float, top_k: int | None,
                    top_p: float | None) -> None:
    """generate's checks, made once before it decodes: the prompt, the count, and the sampling arguments
    (_check_sampling, with next_token_distribution below). The ids' range is the embedding's check."""
    if prompt_ids.ndim != 1 or prompt_ids.numel() == 0:
        raise ValueError(f"generate needs the prompt as one non-empty sequence of ids, shape (prompt,), got "
                         f"shape {tuple(prompt_ids.shape)}")
    if not is_integer_dtype(prompt_ids.dtype):
        raise TypeError(f"generate expects integer token ids (torch.long), got dtype {prompt_ids.dtype}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    _check_sampling(temperature, top_k, top_p)


def _tie_embeddings(model: nn.Module) -> None:
    """TransformerLM(..., tie_embeddings=True): lm_head.weight becomes token_embeddings.weight, one Parameter E that
    both read (the lookup takes E's rows, the logits are E·h), as in GPT-2 and SmolLM2. It keeps the embedding's
    initialisation, N(0, 1) cut at ±3 (lm_head's own is dropped), so the initial logits are about √d_model in size,
    where lm_head's own initialisation keeps them of order 1. model.parameters() holds E once, the state dict under
    both names (its checkpoints load into a tied model and an untied one); .to() and .half() keep the tie. Loading
    copies both names into E, the last one winning: a state dict whose two entries differ is refused instead
    (ValueError, before they are copied), and after load_state_dict(..., assign=True), which gives each name its own
    Parameter, lm_head is tied to the embedding again."""
    model.lm_head.weight = model.token_embeddings.weight
    model.register_load_state_dict_pre_hook(_refuse_two_matrices)
    model.register_load_state_dict_post_hook(_tie_again)


def _refuse_two_matrices(model: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    """A tied model's load_state_dict: its one matrix's two names must hold the same numbers, else a ValueError."""
    names = (prefix + "token_embeddings.weight", prefix + "lm_head.weight")
    if not all(name in state_dict for name in names):
        return                         # a missing name is load_state_dict's to report (strict=True)
    embedding, head = (state_dict[name] for name in names)
    if embedding is head or embedding.is_meta or head.is_meta:
        return
    if embedding.shape != head.shape or not torch.equal(embedding, head.to(embedding.device, embedding.dtype)):
        raise ValueError(f"this TransformerLM ties its embeddings (tie_embeddings=True), but the state dict holds two "
                         f"different matrices for its one: {names[0]} and {names[1]} (shapes "
                         f"{tuple(embedding.shape)}, {tuple(head.shape)}); load it into a model built with "
                         f"tie_embeddings=False, or give both names the same tensor")


def _tie_again(model: nn.Module, incompatible_keys) -> None:
    """After load_state_dict: lm_head's weight is the embedding's again (assign=True gives each name its own)."""
    model.lm_head.weight = model.token_embeddings.weight


class TransformerLM(nn.Module):
    """A decoder-only Transformer language model: token ids (..., seq) -> logits (..., seq, vocab_size).

    token_embeddings (Embedding) -> `layers`, an nn.ModuleList of num_layers pre-norm TransformerBlocks (max_seq_len
    = context_length) -> ln_final (RMSNorm) -> lm_head (Linear): row i of the output holds the logits of the token
    after position i, from tokens 0 … i only. The state dict holds exactly CONTRACT.md's names, no bias.
    rope_theta: RoPE's base Θ; fused, num_kv_heads, norm_eps: passed on to every block (norm_eps to ln_final too);
    tie_embeddings: lm_head's weight is token_embeddings' Parameter (_tie_embeddings); device, dtype: the weights'.
    The input is checked here, once: ValueError for a size < 1, a sequence longer than context_length or an id
    outside [0, vocab_size), TypeError for ids that are not integers. The blocks trust it."""

    def __init__(self, vocab_size: int, context_length: int, d_model: int, num_layers: int, num_heads: int,
                 d_ff: int, rope_theta: float, device=None, dtype=None, *, fused: bool = False,
                 num_kv_heads: int | None = None, norm_eps: float = 1e-5, tie_embeddings: bool = False) -> None:
        super().__init__()
        _check_arguments(vocab_size=vocab_size, context_length=context_length, d_model=d_model, num_layers=num_layers,
                         num_heads=num_heads, d_ff=d_ff)
        self.vocab_size, self.context_length, self.num_layers = vocab_size, context_length, num_layers
        self.token_embeddings = Embedding(vocab_size, d_model, device=device, dtype=dtype)
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, num_heads, d_ff, context_length, rope_theta, device=device, dtype=dtype,
                             fused=fused, num_kv_heads=num_kv_heads, norm_eps=norm_eps)
            for _ in range(num_layers))
        self.ln_final = RMSNorm(d_model, norm_eps, device=device, dtype=dtype)
        self.lm_head = Linear(d_model, vocab_size, device=device, dtype=dtype)
        for layer in self.layers[1:]:  # every block's RoPE tables are the same numbers: keep one set, the first's
            layer.attn.rope = self.layers[0].attn.rope
        if tie_embeddings:             # lm_head reads the embedding's matrix, which keeps its initialisation
            _tie_embeddings(self)

    @shape_checked
    def forward(self, token_ids: Integer[Tensor, "*batch seq"], token_positions: Int[Tensor, "*#batch seq"] | None = None,
                *, cache: list | None = None) -> Float[Tensor, "*batch seq vocab"]:
        """(..., seq) ids -> (..., seq, vocab_size) logits; token_positions (..., seq), None = 0 … seq-1. cache: None,
        or one KVCache per block (notebook 12), block i getting cache[i]: the ids follow what they hold, and join it."""
        _check_input(self, token_ids, token_positions, cache)
        x = self.token_embeddings(token_ids)  # checks the ids' range: the forward's one read-back
        caches = [None] * len(self.layers) if cache is None else cache
        with trusted():                       # checked above: the blocks skip their own checks
            for layer, layer_cache in zip(self.layers, caches):
                x = layer(x, token_positions, cache=layer_cache)
        return self.lm_head(self.ln_final(x))

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, context_length={self.context_length}, num_layers={self.num_layers}"


def count_resources(vocab_size: int, context_length: int, d_model: int, num_layers: int, num_heads: int,
                    d_ff: int, *, num_kv_heads: int | None = None, tie_embeddings: bool = False) -> dict:
    """What a TransformerLM of this configuration costs: its parameters, their float32 memory, and the FLOPs of
    one forward pass over one sequence of t = context_length tokens.

    Returns a dict:
        "parameters": {"token_embeddings": V·d, "attention": 2·d² + 2·d·d_kv per layer (q and output_proj
            d × d, k and v d_kv × d, where d_kv = num_kv_heads · d / num_heads: d_kv = d, 4·d², without grouping),
            "ffn": 3·d·d_ff per layer (w1, w2, w3), "norms": d per RMSNorm (ln1, ln2 per layer, and ln_final),
            "lm_head": d·V (0 with tie_embeddings: its weight is token_embeddings', counted once, there),
            "total": their sum};
        "memory_fp32_bytes": 4 bytes per parameter (the weights alone: no gradients, optimiser state or
            activations);
        "flops": {"attention_projections": 2·t·(2·d² + 2·d·d_kv) per layer, "attention_scores": 2 · 2·t²·d per layer
            (Q·Kᵀ, then weights·V, over all heads), "ffn": 3 · 2·t·d·d_ff per layer, "lm_head": 2·t·d·V,
            "total": their sum}.
    Only matrix products count, (m×n)(n×p) = 2mnp FLOPs; the embedding lookup (a gather), the norms, RoPE,
    the softmax and SiLU are elementwise and left out. num_heads changes none of the numbers (the heads slice
    d_model) but must divide d_model; num_kv_heads (None = num_heads) must divide num_heads, and shrinks k and v.
    All numbers are Python ints (exact for any size).
    """
    _check_arguments(vocab_size=vocab_size, context_length=context_length, d_model=d_model, num_layers=num_layers,
                     num_heads=num_heads, d_ff=d_ff)
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if d_model % num_heads != 0 or num_kv_heads < 1 or num_heads % num_kv_heads != 0:
        raise ValueError(f"count_resources: num_heads must divide d_model and num_kv_heads num_heads, got "
                         f"d_model={d_model}, num_heads={num_heads}, num_kv_heads={num_kv_heads}")
    V, t, d, L = vocab_size, context_length, d_model, num_layers
    d_kv = num_kv_heads * (d_model // num_heads)  # the keys' and values' width: d without grouping
    # Two dicts, `parameters` and `flops`, by component (the keys above, without "total"):
    parameters = {"token_embeddings": V * d, "attention": L * (2 * d * d + 2 * d * d_kv), "ffn": L * 3 * d * d_ff,
                  "norms": (2 * L + 1) * d, "lm_head": d * V}
    flops = {"attention_projections": L * 2 * t * (2 * d * d + 2 * d * d_kv), "attention_scores": L * 2 * 2 * t * t * d,
             "ffn": L * 3 * 2 * t * d * d_ff, "lm_head": 2 * t * d * V}
    if tie_embeddings:  # one matrix for both: counted once; lm_head's product costs its FLOPs all the same
        parameters["lm_head"] = 0
    parameters["total"], flops["total"] = sum(parameters.values()), sum(flops.values())
    return {"parameters": parameters, "memory_fp32_bytes": 4 * parameters["total"], "flops": flops}


def _check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """The sampling arguments' checks, each a ValueError that names the value."""
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 (or None: no top-k filter), got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must lie in (0, 1] (or None: no top-p filter), got {top_p}")


@shape_checked
def next_token_distribution(logits: Float[Tensor, "*batch vocab"], temperature: float = 1.0,
                            top_k: int | None = None, top_p: float | None = None) -> Float[Tensor, "*batch vocab"]:
    """The probabilities that generate draws the next token from, given the logits of the last position.

    temperature 0 is greedy: probability 1 on the largest logit (the first one, if tied). Otherwise, in this
    order: the softmax of the logits divided by temperature (< 1 sharpens the distribution, > 1 flattens it);
    top_k keeps the k largest probabilities (and any tied with the k-th) and renormalises; top_p keeps the
    smallest set of most likely tokens whose probabilities add up to at least top_p (always at least the most
    likely one) and renormalises. Every token a filter drops gets probability exactly 0. None switches a
    filter off (as do top_k >= vocab and top_p = 1). Works on any leading dimensions.

    Raises:
        ValueError: temperature < 0, top_k < 1, or top_p outside (0, 1].
    """
    _check_sampling(temperature, top_k, top_p)
    if logits.ndim < 1 or not logits.is_floating_point():
        raise ValueError(f"next_token_distribution expects floating-point logits of shape (..., vocab), got shape "
                         f"{tuple(logits.shape)} and dtype {logits.dtype}")
    if temperature == 0:  # greedy: probability 1 on the first largest logit of each row
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    probs = softmax(logits / temperature, dim=-1)
    if top_k is not None and top_k < logits.shape[-1]:
        kth_largest = torch.topk(probs, top_k, dim=-1).values[..., -1:]
        probs = probs.masked_fill(probs < kth_largest, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if top_p is not None and top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # what the more likely tokens already hold
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, order, mass_before >= top_p)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _new_cache(model: nn.Module, max_seq_len: int) -> list | None:
    """One empty KV cache per block (notebook 12's KVCache) of max_seq_len positions, for a model whose forward takes
    `cache` (a TransformerLM); None for any other model, and for a KVCache not written yet (the student edition before
    notebook 12: then generate decodes without a cache)."""
    if "cache" not in inspect.signature(model.forward).parameters:
        return None
    from transformer_from_scratch.kv_cache import KVCache  # notebook 12's module: imported when first needed
    try:
        return KVCache.for_model(model, max_seq_len=max_seq_len)
    except NotImplementedError:
        return None


@torch.no_grad()
def generate(model: nn.Module, prompt_ids: Int[Tensor, "prompt"], max_new_tokens: int, *, use_cache: bool = True,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             generator: torch.Generator | None = None, eos_id: int | None = None,
             on_token: Callable[[int], None] | None = None) -> Int[Tensor, "new"]:
    """Continue prompt_ids (one sequence of at least one id, on the model's device) by up to max_new_tokens ids, one
    at a time; return the new ids only, shape (n,) with n <= max_new_tokens.

    Each step runs the model on the last model.context_length ids (so the text can grow past the context), takes
    the logits of the last position and picks the next id: the argmax at temperature 0 (greedy), otherwise one
    torch.multinomial draw from next_token_distribution(logits, temperature, top_k, top_p) with `generator` (seed it
    for a sample you can reproduce; it lives on the model's device). Stops after emitting eos_id, if one is given.
    on_token(id), if given, gets each new id (an int) as soon as it is picked: the ids returned, eos_id included.

    use_cache (the default; a model whose forward takes `cache`, a TransformerLM): every block's keys and values are
    kept (notebook 12's KV cache), so the prompt runs once and each later step the newest id alone, with the same ids
    (to the rounding of the logits). When the window slides, every cached key sits at a stale position: the caches
    start again from the window. Any other model (with .context_length, ids (1, seq) -> logits (1, seq, vocab))
    decodes without one. The arguments are checked once, here; the steps skip the per-call checks (`trusted()`).
    Raises ValueError (TypeError for ids that are not integers) for a prompt that is not one non-empty sequence,
    max_new_tokens < 0, or a sampling argument out of range.
    """
    _check_generate(prompt_ids, max_new_tokens, temperature, top_k, top_p)
    cache = _new_cache(model, min(len(prompt_ids) + max_new_tokens, model.context_length)) if use_cache else None
    ids, start = prompt_ids, 0
    with trusted():
        for _ in range(max_new_tokens):
            window = max(0, len(ids) - model.context_length)   # the model sees ids[window:], context_length at most
            if cache is not None and window != start:          # the window slid: every cached position is stale
                for layer_cache in cache:
                    layer_cache.reset()
            start = window
            if cache is None:
                logits = model(ids[start:].unsqueeze(0))[0, -1]  # (vocab,): the next token's logits
            else:                                            # only the ids the caches do not hold yet
                logits = model(ids[start + cache[0].length:].unsqueeze(0), cache=cache)[0, -1]
            if temperature == 0:
                next_id = logits.argmax().view(1)
            else:
                probs = next_token_distribution(logits, temperature, top_k, top_p)
                next_id = torch.multinomial(probs, 1, generator=generator)
            ids = torch.cat([ids, next_id.to(ids.dtype)])
            if on_token is not None:
                on_token(next_id.item())
            if eos_id is not None and next_id.item() == eos_id:
                break
    return ids[prompt_ids.numel():]

# Generated from notebooks/10_transformer_lm.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: 9155d11197dd05508893111587fafd06cefa83456f62c25ca4aaa6d39db4f3f3

import torch
from jaxtyping import Float, Int, Integer
from torch import Tensor, nn

from transformer_from_scratch.embedding import Embedding
from transformer_from_scratch.linear import Linear
from transformer_from_scratch.rmsnorm import RMSNorm
from transformer_from_scratch.shapes import shape_checked
from transformer_from_scratch.softmax import softmax
from transformer_from_scratch.transformer_block import TransformerBlock


def _check_arguments(**sizes: int) -> None:
    """TransformerLM's and count_resources' check of their sizes, a ValueError that names them."""
    if min(sizes.values()) < 1:
        raise ValueError(f"every size must be >= 1, got " + ", ".join(f"{k}={v}" for k, v in sizes.items()))


def _check_input(model: "TransformerLM", token_ids: Tensor) -> None:
    """TransformerLM.forward's checks of what only the model knows, each a ValueError that names the numbers.

    The ids' range is the embedding's check, the forward's one read-back from the device: not made twice."""
    if token_ids.ndim < 1:
        raise ValueError(f"TransformerLM expects token ids of shape (..., seq), got a 0-d tensor: "
                         f"wrap one id as a sequence, token_ids.view(1)")
    if token_ids.dtype.is_floating_point or token_ids.dtype == torch.bool:
        raise TypeError(f"TransformerLM expects integer token ids (torch.long), got dtype {token_ids.dtype}")
    seq = token_ids.shape[-1]
    if seq > model.context_length:
        raise ValueError(f"TransformerLM: the sequence has {seq} tokens, more than context_length="
                         f"{model.context_length} (token_ids of shape {tuple(token_ids.shape)}); keep the last "
                         f"{model.context_length} tokens, as generate does")


def _check_generate(prompt_ids: Tensor, max_new_tokens: int, temperature: float, top_k: int | None,
                    top_p: float | None) -> None:
    """generate's checks (and the cached generate's, notebook 12): the prompt, the count, and the sampling
    arguments (_check_sampling, with next_token_distribution below)."""
    if prompt_ids.ndim != 1 or prompt_ids.numel() == 0:
        raise ValueError(f"generate needs the prompt as one non-empty sequence of ids, shape (prompt,), got "
                         f"shape {tuple(prompt_ids.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    _check_sampling(temperature, top_k, top_p)


class TransformerLM(nn.Module):
    """A decoder-only Transformer language model: token ids (..., seq) -> logits (..., seq, vocab_size).

    token_embeddings, Embedding(vocab_size, d_model) -> `layers`, an nn.ModuleList of num_layers pre-norm
    TransformerBlock(d_model, num_heads, d_ff, context_length, rope_theta) -> ln_final, RMSNorm(d_model) ->
    lm_head, Linear(d_model, vocab_size). Row i of the output holds the logits of the token after position i,
    from tokens 0 … i only (the blocks are causal). Logits, not probabilities: the loss (cross-entropy) and
    sampling start from them. The state dict holds exactly the names of CONTRACT.md (token_embeddings.weight,
    layers.{i}.ln1.weight, layers.{i}.attn.{q,k,v,output}_proj.weight, layers.{i}.ln2.weight,
    layers.{i}.ffn.{w1,w2,w3}.weight, ln_final.weight, lm_head.weight): no bias, lm_head not tied.

    Args:
        vocab_size: valid ids are 0 … vocab_size - 1. context_length: the longest sequence (the blocks'
            max_seq_len). d_model, num_layers, num_heads, d_ff: width, blocks, heads, SwiGLU's hidden width.
        rope_theta: RoPE's base Θ (10,000 in Llama). device, dtype: where and in which dtype to create the weights.
        fused: passed on to every block (attention with F.scaled_dot_product_attention: same logits, faster).
    Raises ValueError for a size < 1, a sequence longer than context_length or an id outside [0, vocab_size);
    TypeError for ids that are not integers.
    """

    def __init__(self, vocab_size: int, context_length: int, d_model: int, num_layers: int, num_heads: int,
                 d_ff: int, rope_theta: float, device=None, dtype=None, *, fused: bool = False) -> None:
        super().__init__()
        _check_arguments(vocab_size=vocab_size, context_length=context_length, d_model=d_model, num_layers=num_layers,
                         num_heads=num_heads, d_ff=d_ff)
        self.vocab_size, self.context_length, self.num_layers = vocab_size, context_length, num_layers
        self.token_embeddings = Embedding(vocab_size, d_model, device=device, dtype=dtype)
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, num_heads, d_ff, context_length, rope_theta, device=device, dtype=dtype, fused=fused)
            for _ in range(num_layers))
        self.ln_final = RMSNorm(d_model, device=device, dtype=dtype)
        self.lm_head = Linear(d_model, vocab_size, device=device, dtype=dtype)

    @shape_checked
    def forward(self, token_ids: Integer[Tensor, "*batch seq"],
                token_positions: Int[Tensor, "*#batch seq"] | None = None) -> Float[Tensor, "*batch seq vocab"]:
        """(..., seq) ids -> (..., seq, vocab_size) logits; token_positions (..., seq), None = 0 … seq-1."""
        _check_input(self, token_ids)
        x = self.token_embeddings(token_ids)  # checks the ids' range: the forward's one read-back
        for layer in self.layers:
            x = layer(x, token_positions)
        return self.lm_head(self.ln_final(x))

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, context_length={self.context_length}, num_layers={self.num_layers}"


def count_resources(vocab_size: int, context_length: int, d_model: int, num_layers: int, num_heads: int,
                    d_ff: int) -> dict:
    """What a TransformerLM of this configuration costs: its parameters, their float32 memory, and the FLOPs of
    one forward pass over one sequence of t = context_length tokens.

    Returns a dict:
        "parameters": {"token_embeddings": V·d, "attention": 4·d² per layer (q, k, v, output_proj),
            "ffn": 3·d·d_ff per layer (w1, w2, w3), "norms": d per RMSNorm (ln1, ln2 per layer, and ln_final),
            "lm_head": d·V, "total": their sum};
        "memory_fp32_bytes": 4 bytes per parameter (the weights alone: no gradients, optimiser state or
            activations);
        "flops": {"attention_projections": 4 · 2·t·d² per layer, "attention_scores": 2 · 2·t²·d per layer
            (Q·Kᵀ, then weights·V, over all heads), "ffn": 3 · 2·t·d·d_ff per layer, "lm_head": 2·t·d·V,
            "total": their sum}.
    Only matrix products count, (m×n)(n×p) = 2mnp FLOPs; the embedding lookup (a gather), the norms, RoPE,
    the softmax and SiLU are elementwise and left out. num_heads changes none of the numbers (the heads slice
    d_model) but must divide d_model. All numbers are Python ints (exact for any size).
    """
    _check_arguments(vocab_size=vocab_size, context_length=context_length, d_model=d_model, num_layers=num_layers,
                     num_heads=num_heads, d_ff=d_ff)
    if d_model % num_heads != 0:
        raise ValueError(f"count_resources: num_heads must divide d_model, got d_model={d_model}, "
                         f"num_heads={num_heads}")
    V, t, d, L = vocab_size, context_length, d_model, num_layers
    # Two dicts, `parameters` and `flops`, by component (the keys above, without "total"):
    parameters = {"token_embeddings": V * d, "attention": L * 4 * d * d, "ffn": L * 3 * d * d_ff,
                  "norms": (2 * L + 1) * d, "lm_head": d * V}
    flops = {"attention_projections": L * 4 * 2 * t * d * d, "attention_scores": L * 2 * 2 * t * t * d,
             "ffn": L * 3 * 2 * t * d * d_ff, "lm_head": 2 * t * d * V}
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


@torch.no_grad()
def generate(model: nn.Module, prompt_ids: Int[Tensor, "prompt"], max_new_tokens: int, *,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             generator: torch.Generator | None = None, eos_id: int | None = None) -> Int[Tensor, "new"]:
    """Continue prompt_ids by up to max_new_tokens tokens, one at a time, and return the new ids only.

    Each step runs the model on the last model.context_length ids (older ones fall out of the window, so the
    text can grow past the context length), takes the logits of the last position and picks the next id: the
    argmax when temperature is 0 (greedy, the same every time), otherwise a draw with torch.multinomial from
    next_token_distribution(logits, temperature, top_k, top_p), using `generator` (seed it for a sample you
    can reproduce; it must live on the model's device). Stops after emitting eos_id, if one is given.

    Args:
        model: a TransformerLM, or any module with .context_length that maps ids (1, seq) to logits
            (1, seq, vocab).
        prompt_ids: one sequence of at least one id, shape (prompt,), on the model's device.
        max_new_tokens: how many ids to add at most (0 returns an empty tensor).

    Returns:
        The new ids, shape (n,) with n <= max_new_tokens, on the prompt's device.

    Raises:
        ValueError: the prompt is not one non-empty sequence, max_new_tokens < 0, or a sampling argument is
            out of range (see next_token_distribution).
    """
    _check_generate(prompt_ids, max_new_tokens, temperature, top_k, top_p)
    ids = prompt_ids
    for _ in range(max_new_tokens):
        window = ids[-model.context_length:]                   # the last context_length ids at most
        logits = model(window.unsqueeze(0))[0, -1]             # (vocab,): the next token's logits
        if temperature == 0:
            next_id = logits.argmax().view(1)
        else:
            probs = next_token_distribution(logits, temperature, top_k, top_p)
            next_id = torch.multinomial(probs, 1, generator=generator)
        ids = torch.cat([ids, next_id.to(ids.dtype)])
        if eos_id is not None and next_id.item() == eos_id:
            break
    return ids[prompt_ids.numel():]

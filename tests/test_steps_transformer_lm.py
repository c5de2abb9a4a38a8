"""The step checks of notebook 10 pass the right steps and name each planted mistake on their first line."""

import torch
from torch import nn

from transformer_from_scratch import Embedding, Linear, RMSNorm, TransformerBlock, softmax
from transformer_from_scratch.checks.steps.transformer_lm import (check_forward_flops, check_generation_loop,
                                                                   check_lm_forward, check_make_parts,
                                                                   check_temperature_probs, check_top_k_filter,
                                                                   check_top_p_filter)
from mutants import Catalogue


# --- the right steps, as the notebook writes them ------------------------------------------------------------

def make_parts(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):
    token_embeddings = Embedding(vocab_size, d_model)
    layers = nn.ModuleList(TransformerBlock(d_model, num_heads, d_ff, context_length, rope_theta)
                           for _ in range(num_layers))
    return token_embeddings, layers, RMSNorm(d_model), Linear(d_model, vocab_size)


def lm_forward(token_ids, token_embeddings, layers, ln_final, lm_head, token_positions=None):
    x = token_embeddings(token_ids)
    for layer in layers:
        x = layer(x, token_positions)
    return lm_head(ln_final(x))


def forward_flops(vocab_size, t, d_model, num_layers, d_ff):
    return {"attention projections": num_layers * 4 * 2 * t * d_model * d_model,
            "attention scores": num_layers * 2 * 2 * t * t * d_model,
            "FFN": num_layers * 3 * 2 * t * d_model * d_ff, "lm_head": 2 * t * d_model * vocab_size}


def temperature_probs(logits, temperature):
    if temperature == 0:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return softmax(logits / temperature, dim=-1)


def top_k_filter(probs, k):
    kth = probs.topk(k, dim=-1).values[..., -1:]
    kept = probs.masked_fill(probs < kth, 0.0)
    return kept / kept.sum(-1, keepdim=True)


def top_p_filter(probs, p):
    ordered, order = probs.sort(-1, descending=True)
    drop_sorted = ordered.cumsum(-1) - ordered >= p
    kept = probs.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), 0.0)
    return kept / kept.sum(-1, keepdim=True)


@torch.no_grad()
def generation_loop(model, prompt_ids, max_new_tokens, pick, eos_id=None):
    ids = prompt_ids
    for _ in range(max_new_tokens):
        next_id = pick(model(ids[-model.context_length:][None])[0, -1])
        ids = torch.cat([ids, next_id])
        if next_id.item() == eos_id:
            break
    return ids[len(prompt_ids):]


# --- Step 1 · make_parts -----------------------------------------------------------------------------------

def _parts(embedding=None, layers=None, norm=None, head=None):
    """make_parts with one part made wrongly: each argument, if given, builds that part from the sizes."""
    def wrong(V, T, d, L, H, d_ff, theta):
        right = make_parts(V, T, d, L, H, d_ff, theta)
        built = [embedding, layers, norm, head]
        sizes = (V, T, d, L, H, d_ff, theta)
        return tuple(b(*sizes) if b is not None else r for b, r in zip(built, right))
    return wrong


def _blocks(make_block, count=lambda L: L, container=nn.ModuleList):
    return lambda V, T, d, L, H, d_ff, theta: container(make_block(d, H, d_ff, T, theta) for _ in range(count(L)))


def _repeated(V, T, d, L, H, d_ff, theta):
    return nn.ModuleList([TransformerBlock(d, H, d_ff, T, theta)] * L)


def _tied(V, T, d, L, H, d_ff, theta):
    embedding, layers, norm, _ = make_parts(V, T, d, L, H, d_ff, theta)
    head = Linear(d, V)
    head.weight = embedding.weight
    return embedding, layers, norm, head


PARTS_MUTANTS = [
    (_parts(layers=_blocks(TransformerBlock, container=list)), "plain Python list"),
    (_parts(layers=_repeated), "the same block object"),
    (_parts(layers=_blocks(TransformerBlock, count=lambda L: L - 1)), "not num_layers"),
    (_parts(layers=_blocks(lambda d, H, d_ff, T, theta: TransformerBlock(d, H, d_ff, d, theta))),
     "fails on a sequence of context_length"),
    (_parts(layers=_blocks(lambda d, H, d_ff, T, theta: TransformerBlock(d, H, d_ff, T, 10000.0))),
     "ignores rope_theta"),
    (_parts(layers=_blocks(lambda d, H, d_ff, T, theta: TransformerBlock(d, H, d_ff, None, None))), "has no RoPE"),
    (_parts(layers=_blocks(lambda d, H, d_ff, T, theta: TransformerBlock(d, H, d_ff, theta, T))),
     "computes differently"),
    (_parts(layers=_blocks(lambda d, H, d_ff, T, theta: TransformerBlock(d, H, 2 * d_ff, T, theta))),
     "do not have the shapes"),
    (_parts(embedding=lambda V, T, d, *rest: Embedding(d, V)), "Embedding's arguments are swapped"),
    (_parts(head=lambda V, T, d, *rest: Linear(V, d)), "Linear's arguments are swapped"),
    (_parts(norm=lambda V, T, d, *rest: RMSNorm(V)), "ln_final's gain has shape"),
    (_parts(norm=lambda *sizes: None), "not an RMSNorm"),
    (_tied, "tied"),
    (lambda *sizes: make_parts(*sizes)[:3], "not the four parts"),
]


# --- Step 2 · lm_forward -----------------------------------------------------------------------------------

def _forward(*, norm=True, chain="right", output="logits", positions=True, last_only=False, head=True):
    def wrong(token_ids, token_embeddings, layers, ln_final, lm_head, token_positions=None):
        embedded = token_embeddings(token_ids)
        x = embedded
        for layer in layers:
            out = layer(embedded if chain == "embeddings" else x, token_positions if positions else None)
            x = {"right": out, "embeddings": out, "discarded": x, "residual twice": x + out}[chain]
        if norm:
            x = ln_final(x)
        if not head:
            return x
        logits = lm_head(x)
        logits = logits[..., -1, :] if last_only else logits
        return {"logits": logits, "softmax": logits.softmax(-1), "log_softmax": logits.log_softmax(-1)}[output]
    return wrong


FORWARD_MUTANTS = [
    (_forward(output="softmax"), "returns probabilities"),
    (_forward(output="log_softmax"), "returns log-probabilities"),
    (_forward(norm=False), "ln_final is not applied"),
    (_forward(head=False), "lm_head is not applied"),
    (_forward(last_only=True), "the last position only"),
    (_forward(positions=False), "token_positions are not passed on"),
    (_forward(chain="discarded"), "thrown away"),
    (_forward(chain="residual twice"), "the residual is added twice"),
    (_forward(chain="embeddings"), "every block reads the embeddings"),
]


# --- Step 3 · forward_flops --------------------------------------------------------------------------------

def _flops(**changes):
    def wrong(V, t, d, L, d_ff):
        right = forward_flops(V, t, d, L, d_ff)
        return {key: changes[key](V, t, d, L, d_ff) if key in changes else value for key, value in right.items()}
    return wrong


FLOPS_MUTANTS = [
    (lambda *a: {k: v // 2 for k, v in forward_flops(*a).items()}, "mnp multiply-adds"),
    (_flops(**{"attention projections": lambda V, t, d, L, f: L * 6 * t * d * d}), "three matrices (q, k, v)"),
    (_flops(**{"attention scores": lambda V, t, d, L, f: L * 2 * t * t * d}), "counted at half"),
    (_flops(FFN=lambda V, t, d, L, f: L * 4 * t * d * f), "two matrices (GPT-2's MLP)"),
    (_flops(lm_head=lambda V, t, d, L, f: L * 2 * t * d * V), "once per layer"),
    (lambda V, t, d, L, f: forward_flops(V, t, d, 1, f), "those of one block"),
    (lambda *a: dict(list(forward_flops(*a).items())[:3]), "the keys"),
    (_flops(FFN=lambda V, t, d, L, f: 7), "expected"),
]


# --- Step 4 · temperature_probs ----------------------------------------------------------------------------

def _greedy(rule):
    def wrong(logits, temperature):
        if temperature != 0:
            return temperature_probs(logits, temperature)
        maxima = (logits == logits.amax(-1, keepdim=True)).to(logits.dtype)
        if rule == "all":
            return maxima
        if rule == "share":
            return maxima / maxima.sum(-1, keepdim=True)
        if rule == "last":
            last = logits.shape[-1] - 1 - logits.flip(-1).argmax(-1, keepdim=True)
            return torch.zeros_like(logits).scatter_(-1, last, 1.0)
        if rule == "index":
            return logits.argmax(-1)
        if rule == "model":
            return softmax(logits, dim=-1)
        if rule == "python":
            return softmax(logits * (1 / temperature), dim=-1)
    return wrong


def _in_place(logits, temperature):
    if temperature == 0:
        return temperature_probs(logits, 0)
    return softmax(logits.div_(temperature), dim=-1)


TEMPERATURE_MUTANTS = [
    (lambda z, T: softmax(z * T, dim=-1) if T else temperature_probs(z, 0), "multiplied by the temperature"),
    (lambda z, T: softmax(z, dim=-1), "the temperature is ignored"),
    (lambda z, T: softmax(z, dim=-1) / T if T else temperature_probs(z, 0), "divides the probabilities"),
    (lambda z, T: z / T if T else temperature_probs(z, 0), "the scaled logits"),
    (lambda z, T: softmax(z / T, dim=0) if T else temperature_probs(z, 0), "the wrong dimension"),
    (lambda z, T: softmax(z / T, dim=-1), "logits / 0 gives ±inf"),
    (_greedy("python"), "raises ZeroDivisionError"),
    (_greedy("model"), "returns the model's own distribution"),
    (_greedy("index"), "the index of the largest logit"),
    (_greedy("all"), "every tied maximum gets probability 1"),
    (_greedy("share"), "tied maxima share"),
    (_greedy("last"), "the last of tied maxima"),
    (_in_place, "in place"),
]


# --- Steps 5 and 6 · top_k_filter, top_p_filter ------------------------------------------------------------

def _top_k(*, largest=True, renormalise="row", offset=0, ties=True, sorted_out=False, one_row=False, in_place=False):
    def wrong(probs, k):
        values = probs.topk(k + offset, dim=-1, largest=largest).values
        if one_row:
            kth = values[-1]                                             # the draft's 1-D indexing
        else:
            kth = values[..., -1:]
        if ties:
            keep = probs >= kth if largest else probs <= kth
        else:
            keep = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, probs.topk(k, -1).indices, True)
        kept = probs.masked_fill_(~keep, 0.0) if in_place else probs.masked_fill(~keep, 0.0)
        out = {"row": kept / kept.sum(-1, keepdim=True), "batch": kept / kept.sum(), "none": kept}[renormalise]
        return out.sort(-1, descending=True).values if sorted_out else out
    return wrong


def _top_p(*, rule="right", renormalise="row", descending=True, sorted_out=False, in_place=False):
    def wrong(probs, p):
        ordered, order = probs.sort(-1, descending=descending)
        cumulative = ordered.cumsum(-1)
        keep_sorted = {"right": cumulative - ordered < p, "crossing": cumulative <= p,
                       "crossing+": cumulative < p, "one more": cumulative - ordered <= p}[rule]
        keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
        kept = probs.masked_fill_(~keep, 0.0) if in_place else probs.masked_fill(~keep, 0.0)
        out = {"row": kept / kept.sum(-1, keepdim=True), "batch": kept / kept.sum(), "none": kept}[renormalise]
        return out.sort(-1, descending=True).values if sorted_out else out
    return wrong


def _top_p_first_kept_crossing_dropped(probs, p):
    """Keeps the most likely token always, but drops the one that crosses p."""
    ordered, order = probs.sort(-1, descending=True)
    keep_sorted = ordered.cumsum(-1) <= p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    kept = probs.masked_fill(~keep, 0.0)
    return kept / kept.sum(-1, keepdim=True)


def _tiny_not_zero(probs, k):
    out = top_k_filter(probs, k)
    return torch.where(out == 0, torch.full_like(out, 1e-9), out)


TOP_K_MUTANTS = [
    (_top_k(largest=False), "the k smallest"),
    (_top_k(renormalise="none"), "not renormalised"),
    (_top_k(renormalise="batch"), "over the whole batch"),
    (_top_k(offset=1), "keeps k + 1 tokens"),
    (_top_k(offset=-1), "keeps k - 1 tokens"),
    (_top_k(sorted_out=True), "returns the probabilities sorted"),
    (_top_k(ties=False), "a token tied with the k-th"),
    (_top_k(one_row=True), "fails on a batch of rows"),
    (_top_k(in_place=True), "in place"),
    (_tiny_not_zero, "a tiny probability"),
]
TOP_P_MUTANTS = [
    (_top_p(rule="crossing"), "keeps no token at all"),
    (_top_p(rule="crossing+"), "keeps no token at all"),
    (_top_p_first_kept_crossing_dropped, "crosses p is dropped, so the kept mass stays below p"),
    (_top_p(rule="one more"), "one token too many"),
    (_top_p(descending=False), "the least likely"),
    (_top_p(renormalise="none"), "not renormalised"),
    (_top_p(renormalise="batch"), "over the whole batch"),
    (_top_p(sorted_out=True), "returns the probabilities sorted"),
    (_top_p(in_place=True), "in place"),
]


# --- Step 7 · generation_loop ------------------------------------------------------------------------------

def _loop(*, window="last", position=-1, with_prompt=False, extra=0, eos="right", batch=True):
    @torch.no_grad()
    def wrong(model, prompt_ids, max_new_tokens, pick, eos_id=None):
        ids = prompt_ids
        for _ in range(max_new_tokens + extra):
            seen = {"last": ids[-model.context_length:], "first": ids[:model.context_length], "all": ids}[window]
            next_id = pick(model(seen[None] if batch else seen)[0, position])
            if eos == "before" and next_id.item() == eos_id:
                break
            ids = torch.cat([ids, next_id])
            if eos == "right" and next_id.item() == eos_id:
                break
        return ids if with_prompt else ids[len(prompt_ids):]
    return wrong


LOOP_MUTANTS = [
    (_loop(window="all"), "gives the model the whole text"),
    (_loop(window="first"), "the first context_length ids"),
    (_loop(position=0), "another position"),
    (_loop(with_prompt=True), "returns the prompt too"),
    (_loop(extra=1), "one too many"),
    (_loop(extra=-1), "one too few"),
    (_loop(eos="never"), "does not stop at eos_id"),
    (_loop(eos="before"), "stops before eos_id"),
    (_loop(batch=False), "expects ids of shape (1, seq)"),
]


# --- the tests ---------------------------------------------------------------------------------------------

def test_the_right_steps_pass_with_one_line(capsys):
    check_make_parts(make_parts)
    check_lm_forward(lm_forward)
    check_forward_flops(forward_flops)
    check_temperature_probs(temperature_probs)
    check_top_k_filter(top_k_filter)
    check_top_p_filter(top_p_filter)
    check_generation_loop(generation_loop)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * 7, lines


CATALOGUES = [Catalogue(check_make_parts, PARTS_MUTANTS, right=make_parts),
              Catalogue(check_lm_forward, FORWARD_MUTANTS, right=lm_forward),
              Catalogue(check_forward_flops, FLOPS_MUTANTS, right=forward_flops),
              Catalogue(check_temperature_probs, TEMPERATURE_MUTANTS, right=temperature_probs),
              Catalogue(check_top_k_filter, TOP_K_MUTANTS, right=top_k_filter),
              Catalogue(check_top_p_filter, TOP_P_MUTANTS, right=top_p_filter, distinct="none",
                        ids=[f"{i}: {p}" for i, (_, p) in enumerate(TOP_P_MUTANTS)]),
              Catalogue(check_generation_loop, LOOP_MUTANTS, right=generation_loop)]

"""The step checks of notebook 08 pass the right steps and name each planted mistake on their first line."""

import math

import torch
import torch.nn.functional as F
from einops import rearrange

from transformer_from_scratch import scaled_dot_product_attention, softmax
from transformer_from_scratch.checks.steps.multihead_attention import (check_causal_mask, check_merge_heads,
                                                                       check_multihead_draft, check_rotate_heads,
                                                                       check_split_heads)
from mutants import Catalogue


def split_heads(t, num_heads):
    return t.view(*t.shape[:-1], num_heads, -1).transpose(-3, -2)


def merge_heads(t):
    t = t.transpose(-3, -2)
    return t.reshape(*t.shape[:-2], -1)


def causal_mask(seq, device=None):
    return torch.tril(torch.ones(seq, seq, dtype=torch.bool, device=device))


def rotate_heads(rope, q, k, token_positions=None):
    positions = torch.arange(q.shape[-2], device=q.device) if token_positions is None else token_positions
    positions = positions.unsqueeze(-2)
    return rope(q, positions), rope(k, positions)


def rotate_heads_with_a_range(rope, q, k, token_positions=None):
    """The notebook's way: the default positions as range(seq), which RoPE checks without a read-back."""
    positions = range(q.shape[-2]) if token_positions is None else token_positions.unsqueeze(-2)
    return rope(q, positions), rope(k, positions)


def draft(x, projections, num_heads, rope=None, token_positions=None, *, rotate=rotate_heads, mask=True, output=True,
          rope_v=False, attend=None):
    """The right multihead_draft, or one with a knob turned (a mistake)."""
    q_proj, k_proj, v_proj, output_proj = projections
    q, k, v = (split_heads(p(x), num_heads) for p in (q_proj, k_proj, v_proj))
    if rope is not None:
        q, k = rotate(rope, q, k, token_positions)
        if rope_v:
            v = rope(v, torch.arange(x.shape[-2]) if token_positions is None else token_positions.unsqueeze(-2))
    causal = causal_mask(x.shape[-2], x.device) if mask else None
    out = (attend or scaled_dot_product_attention)(q, k, v, causal)
    return output_proj(merge_heads(out)) if output else merge_heads(out)


def multihead_draft(x, projections, num_heads, rope=None, token_positions=None):
    return draft(x, projections, num_heads, rope, token_positions)


def _mutant(**knobs):
    return lambda x, projections, num_heads, rope=None, token_positions=None: draft(
        x, projections, num_heads, rope, token_positions, **knobs)


SPLIT_MUTANTS = [
    (lambda t, h: t.reshape(*t.shape[:-2], h, t.shape[-2], -1), "without the transpose"),
    (lambda t, h: rearrange(t, "... s (d h) -> ... h s d", h=h), "every num_heads-th feature"),
    (lambda t, h: t.unflatten(-1, (h, -1)), "still behind seq"),
    (lambda t, h: t.unflatten(-1, (-1, h)).transpose(-3, -2), "used as the head size"),
    (lambda t, h: t.view(*t.shape[:-1], h, -1).transpose(1, 2), "fixed axes (1, 2)"),
    (lambda t, h: t.reshape(*t.shape[:-1], h, -1).permute(0, 2, 1, 3), "names every axis by its position"),
    (lambda t, h: split_heads(t, h) * 2, "differs from the expected result"),
]


def fixed_axes_merge(t):
    t = t.transpose(1, 2)
    return t.reshape(*t.shape[:-2], -1)


MERGE_MUTANTS = [
    (lambda t: t.reshape(*t.shape[:-3], t.shape[-2], -1), "without the transpose"),
    (lambda t: rearrange(t, "... h s d -> ... s (d h)"), "interleaved"),
    (lambda t: t.transpose(-3, -2).view(*t.shape[:-3], t.shape[-2], -1), "calls view on the transposed tensor"),
    (lambda t: t.transpose(-3, -2), "not flattened back"),
    (fixed_axes_merge, "fixed axes (1, 2)"),
    (lambda t: t.permute(0, 2, 1, 3).reshape(t.shape[0], t.shape[2], -1), "names every axis by its position"),
]

MASK_MUTANTS = [
    (lambda seq, device=None: causal_mask(seq, device).tril(-1), "hides the diagonal"),
    (lambda seq, device=None: causal_mask(seq, device).T, "upper triangle"),
    (lambda seq, device=None: ~causal_mask(seq, device), "True marks the keys to hide"),
    (lambda seq, device=None: causal_mask(seq, device).float(), "not a boolean one"),
    (lambda seq, device=None: torch.zeros(seq, seq).masked_fill(~causal_mask(seq), float("-inf")), "additive"),
    (lambda seq, device=None: causal_mask(seq).int(), "has dtype torch.int32"),
    (lambda seq, device=None: causal_mask(seq), "ignores its device argument"),
    (lambda seq, device=None: causal_mask(seq + 1, device), "expected (5, 5)"),
]


def _rotate(default=lambda q: torch.arange(q.shape[-2]), head_axis=True, use_given=True, which="qk", swap=False,
            head_axis_if_it_fits=False):
    """rotate_heads with a mistake."""
    def wrong(rope, q, k, token_positions=None):
        positions = default(q) if token_positions is None or not use_given else token_positions
        if head_axis_if_it_fits:  # leaves the head axis out whenever the shapes allow it
            head_axis = not (positions.ndim >= 2 and positions.shape[-2] == q.shape[-3])
        else:
            head_axis = head_axis_default
        positions = positions.unsqueeze(-2) if head_axis else positions
        q_out = rope(q, positions) if "q" in which else q
        k_out = rope(k, positions) if "k" in which else k
        return (k_out, q_out) if swap else (q_out, k_out)
    head_axis_default = head_axis
    return wrong


ROTATE_MUTANTS = [
    (_rotate(head_axis=False), "do not fit (batch, heads"),
    (_rotate(head_axis_if_it_fits=True), "line up with the heads"),
    (lambda rope, q, k, token_positions=None: (rope(q, token_positions), rope(k, token_positions)),
     "called with token_positions=None"),
    (lambda rope, q, k, token_positions=None: (rope(q, token_positions[..., None, :]),
                                               rope(k, token_positions[..., None, :])),
     "fails when token_positions is None"),
    (_rotate(default=lambda q: torch.arange(1, q.shape[-2] + 1)), "start at 1"),
    (_rotate(use_given=False), "token_positions is ignored"),
    (lambda rope, q, k, token_positions=None: rotate_heads_with_a_range(rope, q, k, token_positions)
     if token_positions is not None else (rope(q, range(q.shape[-1])), rope(k, range(q.shape[-1]))),  # d_k, not seq
     "a range that is not the positions 0"),
    (lambda rope, q, k, token_positions=None: rotate_heads(rope, q, k, token_positions) if token_positions is not None
     else (rope(q, range(q.shape[-2]).unsqueeze(-2)), rope(k, range(q.shape[-2]).unsqueeze(-2))),
     "treats the default range(seq) as a tensor"),
    (_rotate(which="q"), "k is returned without its rotation"),
    (_rotate(which="k"), "q is returned without its rotation"),
    (_rotate(swap=True), "come back swapped"),
    (lambda rope, q, k, token_positions=None: torch.stack(rotate_heads(rope, q, k, token_positions)), "not a pair"),
    (lambda rope, q, k, token_positions=None: rotate_heads(rope, q, k, None if token_positions is None else
                                                           token_positions.unsqueeze(-1)),
     "in the shape they are given"),
]


def rope_before_split(x, projections, num_heads, rope=None, token_positions=None):
    q_proj, k_proj, v_proj, output_proj = projections
    positions = torch.arange(x.shape[-2]) if token_positions is None else token_positions
    q, k = q_proj(x), k_proj(x)
    if rope is not None:
        q, k = rope(q, positions), rope(k, positions)
    q, k, v = split_heads(q, num_heads), split_heads(k, num_heads), split_heads(v_proj(x), num_heads)
    return output_proj(merge_heads(scaled_dot_product_attention(q, k, v, causal_mask(x.shape[-2]))))


def scaled_by_d_model(q, k, v, mask):
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1] * q.shape[-3])).masked_fill(~mask, float("-inf"))
    return softmax(scores, dim=-1) @ v


def without_head_axis(rope, q, k, token_positions=None):
    positions = torch.arange(q.shape[-2]) if token_positions is None else token_positions
    return rope(q, positions), rope(k, positions)


def rope_even_if_none(x, projections, num_heads, rope=None, token_positions=None):
    q, k, v = (split_heads(p(x), num_heads) for p in projections[:3])
    q, k = rotate_heads(rope, q, k, token_positions)  # no `if rope is not None`
    return projections[3](merge_heads(scaled_dot_product_attention(q, k, v, causal_mask(x.shape[-2]))))


DRAFT_MUTANTS = [
    (_mutant(mask=False), "not causal"),
    (_mutant(output=False), "output_proj is not applied"),
    (_mutant(rope_v=True), "applied to the values too"),
    (_mutant(rotate=lambda rope, q, k, positions: (q, k)), "RoPE is not applied"),
    (_mutant(rotate=lambda rope, q, k, positions: rotate_heads(rope, q, k)), "not passed on"),
    (rope_before_split, "wrong width"),
    (_mutant(attend=lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
     "calls F.scaled_dot_product_attention"),
    (_mutant(attend=scaled_by_d_model), "1/√d_model"),
    (_mutant(rotate=without_head_axis), "do not fit (batch, heads"),
    (rope_even_if_none, "calls rope when it is None"),
]


def test_the_right_steps_pass_with_one_line(capsys):
    check_split_heads(split_heads)
    check_split_heads(lambda t, h: rearrange(t, "... s (h d) -> ... h s d", h=h))
    check_merge_heads(merge_heads)
    check_merge_heads(lambda t: rearrange(t, "... h s d -> ... s (h d)"))
    check_causal_mask(causal_mask)
    check_causal_mask(lambda seq, device=None: torch.ones(seq, seq, dtype=torch.bool).tril().to(device))
    check_rotate_heads(rotate_heads)
    check_rotate_heads(rotate_heads_with_a_range)
    check_multihead_draft(multihead_draft)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * 9, lines


CATALOGUES = [Catalogue(check_split_heads, SPLIT_MUTANTS, right=split_heads),
              Catalogue(check_merge_heads, MERGE_MUTANTS, right=merge_heads),
              Catalogue(check_causal_mask, MASK_MUTANTS, right=causal_mask),
              Catalogue(check_rotate_heads, ROTATE_MUTANTS, right=rotate_heads),
              Catalogue(check_multihead_draft, DRAFT_MUTANTS, right=multihead_draft)]

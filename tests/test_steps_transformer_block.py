"""The step checks of notebook 09 pass the right steps and name each planted mistake on their first line."""

import functools

from torch import nn

from transformer_from_scratch import MultiHeadSelfAttention, RMSNorm, SwiGLU
from transformer_from_scratch.checks.steps.transformer_block import (check_block_forward, check_make_parts,
                                                                     check_post_norm_residual, check_pre_norm_residual)
from mutants import Catalogue


# --- the right steps ----------------------------------------------------------------------------------------------

def make_parts(d_model, num_heads, d_ff, max_seq_len, theta, device=None):
    return nn.ModuleDict(dict(ln1=RMSNorm(d_model, device=device),
                              attn=MultiHeadSelfAttention(d_model, num_heads, max_seq_len, theta, device=device),
                              ln2=RMSNorm(d_model, device=device), ffn=SwiGLU(d_model, d_ff, device=device)))


def pre_norm_residual(x, norm, sublayer):
    return x + sublayer(norm(x))


def post_norm_residual(x, norm, sublayer):
    return norm(x + sublayer(x))


def block_forward(parts, x, token_positions=None, residual=pre_norm_residual):
    y = residual(x, parts.ln1, lambda t: parts.attn(t, token_positions))
    return residual(y, parts.ln2, parts.ffn)


# --- Step 1: the parts --------------------------------------------------------------------------------------------

def _parts(names=("ln1", "attn", "ln2", "ffn"), pass_device=True, shared=False, **builders):
    """make_parts with some parts built by ``builders`` (functions of the sizes and the device), other names, the
    device not passed on, or one norm for both sub-layers."""
    right = dict(ln1=lambda d, h, d_ff, m, t, device: RMSNorm(d, device=device),
                 attn=lambda d, h, d_ff, m, t, device: MultiHeadSelfAttention(d, h, m, t, device=device),
                 ln2=lambda d, h, d_ff, m, t, device: RMSNorm(d, device=device),
                 ffn=lambda d, h, d_ff, m, t, device: SwiGLU(d, d_ff, device=device))

    def wrong(d_model, num_heads, d_ff, max_seq_len, theta, device=None):
        sizes = (d_model, num_heads, d_ff, max_seq_len, theta, device if pass_device else None)
        built = {key: builders.get(key, make)(*sizes) for key, make in right.items()}
        if shared:
            built["ln2"] = built["ln1"]
        return nn.ModuleDict(dict(zip(names, built.values())))
    return wrong


def a_list(d_model, num_heads, d_ff, max_seq_len, theta, device=None):
    return [RMSNorm(d_model), MultiHeadSelfAttention(d_model, num_heads, max_seq_len, theta), RMSNorm(d_model),
            SwiGLU(d_model, d_ff)]


PARTS_MUTANTS = [
    (_parts(names=("norm1", "attn", "norm2", "ffn")), "has no part named ln1, ln2"),
    (_parts(names=("ln1", "attention", "ln2", "ffn")), "has no part named attn"),
    (_parts(shared=True), "one and the same RMSNorm"),
    (_parts(ffn=lambda d, h, d_ff, m, t, device: SwiGLU(d_ff, d, device=device)), "sizes swapped"),
    (_parts(attn=lambda d, h, d_ff, m, t, device: MultiHeadSelfAttention(d, h, device=device)), "has no RoPE"),
    (_parts(attn=lambda d, h, d_ff, m, t, device: MultiHeadSelfAttention(d, h, t, m, device=device)),
     "max_seq_len and theta are swapped"),
    (_parts(pass_device=False), "ignores its device argument"),
    (_parts(ffn=lambda d, h, d_ff, m, t, device: SwiGLU(d, 2 * d_ff, device=device)), "ffn.w1.weight has shape (32, 12)"),
    (a_list, "not a module"),
]


# --- Steps 2 and 3: one residual sub-layer ------------------------------------------------------------------------

def in_place_pre(x, norm, sublayer):
    x += sublayer(norm(x))
    return x


def in_place_post(x, norm, sublayer):
    x += sublayer(x)
    return norm(x)


PRE_MUTANTS = [
    (post_norm_residual, "post-norm order"),
    (lambda x, norm, f: f(norm(x)), "the residual is missing"),
    (lambda x, norm, f: x + norm(f(x)), "applied to the sub-layer's output instead of its input"),
    (lambda x, norm, f: norm(x) + f(norm(x)), "the stream itself is normalised"),
    (lambda x, norm, f: x + f(x), "the norm is left out"),
    (in_place_pre, "changes x in place"),
    (lambda x, norm, f: (x + f(norm(x)))[..., :-1], "expected (2, 5, 6)"),
]
POST_MUTANTS = [
    (pre_norm_residual, "pre-norm order"),
    (lambda x, norm, f: norm(f(x)), "the residual is missing"),
    (lambda x, norm, f: norm(x) + f(x), "normalised before the addition"),
    (lambda x, norm, f: x + f(x), "the norm is left out"),
    (lambda x, norm, f: norm(x + f(norm(x))), "the sub-layer reads norm(x)"),
    (lambda x, norm, f: x + norm(f(x)), "output only"),
    (in_place_post, "changes x in place"),
]


# --- Step 4: the whole block --------------------------------------------------------------------------------------

def _block(**mistakes):
    """block_forward with one classic mistake."""
    def wrong(parts, x, token_positions=None, residual=pre_norm_residual):
        first, second = mistakes.get("norms", ("ln1", "ln2"))
        positions = None if mistakes.get("drop_positions") else token_positions
        attention = lambda t: parts.attn(t, positions)
        if mistakes.get("ffn_first"):
            return residual(residual(x, parts[first], parts.ffn), parts[second], attention)
        y = residual(x, parts[first], attention)
        if mistakes.get("return_y"):
            return y
        if mistakes.get("reads_x"):
            return residual(x, parts[second], parts.ffn)
        if mistakes.get("reads_x_added"):
            return y + parts.ffn(parts[second](x))
        return residual(y, parts[second], parts.ffn)
    return wrong


def always(step):
    """block_forward that ignores its residual argument and always uses ``step``."""
    return lambda parts, x, token_positions=None, residual=None: block_forward(parts, x, token_positions, step)


def in_place_block(parts, x, token_positions=None, residual=pre_norm_residual):
    x += parts.attn(parts.ln1(x), token_positions)
    return residual(x, parts.ln2, parts.ffn)


BLOCK_MUTANTS = [
    (_block(reads_x=True), "the second sub-layer reads x instead of y"),
    (_block(reads_x_added=True), "the feed-forward network reads x instead of y"),
    (_block(return_y=True), "it returns y"),
    (_block(ffn_first=True), "the sub-layers are in the wrong order"),
    (_block(norms=("ln2", "ln1")), "ln1 and ln2 are swapped"),
    (_block(norms=("ln1", "ln1")), "ln1 is used before both sub-layers"),
    (_block(norms=("ln2", "ln2")), "ln2 is used before both sub-layers"),
    (_block(drop_positions=True), "token_positions is not passed on"),
    (always(pre_norm_residual), "wires the block pre-norm"),
    (always(post_norm_residual), "wires the block post-norm"),
    (in_place_block, "block_forward changes x in place"),
]


def test_the_right_steps_pass_with_one_line(capsys):
    check_make_parts(make_parts)
    check_pre_norm_residual(pre_norm_residual)
    check_post_norm_residual(post_norm_residual)
    check_block_forward(block_forward)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * 4, lines


def test_keyword_calls_and_partial_pass(capsys):
    """The attention called with token_positions= as a keyword, through functools.partial, passes too."""
    def by_keyword(parts, x, token_positions=None, residual=pre_norm_residual):
        y = residual(x, parts["ln1"], functools.partial(parts["attn"], token_positions=token_positions))
        return residual(y, parts["ln2"], parts["ffn"])
    check_block_forward(by_keyword)
    assert capsys.readouterr().out.startswith("✓ ")


CATALOGUES = [Catalogue(check_make_parts, PARTS_MUTANTS, right=make_parts),
              Catalogue(check_pre_norm_residual, PRE_MUTANTS, right=pre_norm_residual),
              Catalogue(check_post_norm_residual, POST_MUTANTS, right=post_norm_residual),
              Catalogue(check_block_forward, BLOCK_MUTANTS, right=block_forward)]

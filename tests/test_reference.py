"""The course's reference (transformer_from_scratch.reference): PyTorch's built-ins and a complex-number RoPE,
independent of the components. It is what the checks, the benchmark and the tests compare with, so it is checked
here: by hand on small cases, against the package's components, and its two forms (functional, ReferenceLM) against
each other and against TransformerLM."""

import math

import pytest
import torch

from conftest import DEVICES
from transformer_from_scratch import (MultiHeadSelfAttention, RotaryPositionalEmbedding, SwiGLU, TransformerBlock,
                                      TransformerLM)
from transformer_from_scratch import reference
from transformer_from_scratch.reference import ReferenceLM


def test_rotate_by_hand():
    """(1, 0, 0, 2) at position 1 with theta 100: pair 0 turns by 1 rad, pair 1 by 100^(-1/2) = 0.1 rad."""
    x = torch.tensor([[1.0, 0.0, 0.0, 2.0]], dtype=torch.float64)
    out = reference.rotate(x, torch.tensor([1]), theta=100.0)
    expected = [math.cos(1), math.sin(1), -2 * math.sin(0.1), 2 * math.cos(0.1)]
    torch.testing.assert_close(out[0], torch.tensor(expected, dtype=torch.float64))
    assert torch.equal(reference.rotate(x, torch.tensor([0]), 100.0), x), "position 0 is no rotation"


def test_rope_angles_by_hand():
    angles = reference.rope_angles(torch.tensor([0, 3]), d_k=4, theta=100.0)
    torch.testing.assert_close(angles, torch.tensor([[0.0, 0.0], [3.0, 0.3]], dtype=torch.float64))


def test_rotate_matches_the_package_rope():
    torch.manual_seed(0)
    x, positions = torch.randn(2, 3, 7, 16, dtype=torch.float64), torch.randint(0, 64, (2, 1, 7))
    rope = RotaryPositionalEmbedding(10000.0, 16, 64)
    torch.testing.assert_close(reference.rotate(x, positions, 10000.0), rope(x, positions), rtol=1e-6, atol=1e-6)


def test_split_and_merge_heads():
    t = torch.arange(2 * 5 * 12.0).reshape(2, 5, 12)
    heads = reference.split_heads(t, 3)
    assert heads.shape == (2, 3, 5, 4) and torch.equal(heads[1, 2, 4], t[1, 4, 8:12])
    assert torch.equal(reference.merge_heads(heads), t)


def test_the_pieces_match_the_package():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    ffn = SwiGLU(12, 16, dtype=torch.float64)
    torch.testing.assert_close(reference.swiglu(x, ffn.w1.weight, ffn.w2.weight, ffn.w3.weight), ffn(x))
    attn = MultiHeadSelfAttention(12, 3, 16, 10000.0, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3, 4], [3, 4, 5, 6, 9]])
    torch.testing.assert_close(reference.multihead_self_attention(x, attn.state_dict(), 3, 10000.0, positions),
                               attn(x, positions), rtol=1e-6, atol=1e-6)
    block = TransformerBlock(12, 3, 16, 16, 10000.0, dtype=torch.float64)
    with torch.no_grad():
        block.ln1.weight.uniform_(0.5, 1.5)
        block.ln2.weight.uniform_(0.5, 1.5)
    torch.testing.assert_close(reference.transformer_block(x, block.state_dict(), 3, 10000.0), block(x),
                               rtol=1e-6, atol=1e-6)


def test_multihead_attention_without_rope_or_mask():
    torch.manual_seed(1)
    x = torch.randn(4, 12, dtype=torch.float64)
    attn = MultiHeadSelfAttention(12, 3, dtype=torch.float64)
    torch.testing.assert_close(reference.multihead_self_attention(x, attn.state_dict(), 3), attn(x))
    full = reference.multihead_self_attention(x, attn.state_dict(), 3, causal=False)
    assert torch.allclose(full[-1], attn(x)[-1]) and not torch.allclose(full[0], attn(x)[0]), \
        "without the mask only the last token, which sees everything anyway, is unchanged"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused", [False, True], ids=["from-scratch", "fused"])
def test_reference_lm_and_the_functional_form_match_transformer_lm(device, fused):
    torch.manual_seed(0)
    model = TransformerLM(97, 24, 32, 2, 4, 64, 10000.0, device=device, dtype=torch.float64, fused=fused)
    ids = torch.randint(0, 97, (3, 24), device=device)
    expected = ReferenceLM(model)(ids)
    assert expected.shape == (3, 24, 97)
    torch.testing.assert_close(model(ids), expected, rtol=1e-6, atol=1e-6)  # RoPE: float32 tables, complex64 here
    functional = reference.transformer_lm(ids, model.state_dict(), num_heads=4, theta=10000.0)
    torch.testing.assert_close(functional, model(ids), rtol=1e-6, atol=1e-6)
    assert reference.num_layers(model.state_dict()) == 2


def test_reference_lm_holds_a_copy_of_the_weights():
    model = TransformerLM(50, 8, 16, 1, 2, 32, 10000.0)
    copy = ReferenceLM(model)
    assert copy.weights.state_dict().keys() == model.state_dict().keys()
    with torch.no_grad():
        model.lm_head.weight.zero_()
    assert copy.weights.lm_head.weight.abs().sum() > 0  # training one does not move the other

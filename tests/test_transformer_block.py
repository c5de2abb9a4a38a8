"""TransformerBlock (notebook 09) against a pre-norm block built from F.rms_norm, F.linear, F.silu and
F.scaled_dot_product_attention; causality as a property; the state dict's names; the parameter count; the fused
path; device and dtype; gradients; bad input."""

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES, FLOAT_DTYPES, LEADING_SHAPES

from transformer_from_scratch import reference as course_reference
from transformer_from_scratch import MultiHeadSelfAttention, RMSNorm, SwiGLU, TransformerBlock

D_MODEL, HEADS, D_FF, SEQ, MAX_SEQ_LEN, THETA = 12, 3, 16, 5, 16, 10000.0
NAMES = ["ln1.weight", "attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight", "attn.output_proj.weight",
         "ln2.weight", "ffn.w1.weight", "ffn.w2.weight", "ffn.w3.weight"]


def reference(block, x, token_positions=None):
    """The pre-norm block from the course's reference (PyTorch built-ins, RoPE as a complex product)."""
    return course_reference.transformer_block(x, dict(block.named_parameters()), block.attn.num_heads, block.attn.theta,
                                              token_positions, eps=block.ln1.eps)


def make(device="cpu", dtype=torch.float32, seed=0, **kwargs):
    """A block with gains away from ones and different in ln1 and ln2, so that a swap would show."""
    torch.manual_seed(seed)
    block = TransformerBlock(D_MODEL, HEADS, D_FF, MAX_SEQ_LEN, THETA, device=device, dtype=dtype, **kwargs)
    with torch.no_grad():
        block.ln1.weight.copy_(torch.linspace(0.5, 1.5, D_MODEL))
        block.ln2.weight.copy_(torch.linspace(1.4, 0.6, D_MODEL))
    return block


def random_x(leading=(), seq=SEQ, device="cpu", dtype=torch.float32, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*leading, seq, D_MODEL, generator=gen, dtype=dtype).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("leading", LEADING_SHAPES, ids=str)
def test_matches_the_builtin_reference(device, dtype, leading):
    block = make(device, dtype)
    x = random_x(leading, device=device, dtype=dtype)
    out = block(x)
    assert out.shape == x.shape and out.dtype == dtype and out.device.type == device
    torch.testing.assert_close(out, reference(block, x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_token_positions_per_sequence_and_shared(device, dtype):
    block = make(device, dtype)
    x = random_x((2, 3), device=device, dtype=dtype)
    per_sequence = torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 0, 1], [2, 3, 7, 8, 15]], device=device).expand(2, 3, SEQ)
    for positions in (per_sequence, per_sequence[0], torch.tensor([3, 4, 6, 9, 10], device=device)):
        torch.testing.assert_close(block(x, positions), reference(block, x, positions))
    assert torch.equal(block(x), block(x, torch.arange(SEQ, device=device)))


def test_hand_computed_pre_norm_order():
    """The same submodules, wired by hand: y = x + attn(ln1(x)); out = y + ffn(ln2(y)), and not post-norm."""
    block, x = make(dtype=torch.float64), random_x((2,), dtype=torch.float64)
    y = x + block.attn(block.ln1(x))
    torch.testing.assert_close(block(x), y + block.ffn(block.ln2(y)))
    post = block.ln2(block.ln1(x + block.attn(x)) + block.ffn(block.ln1(x + block.attn(x))))
    assert not torch.allclose(block(x), post)


@pytest.mark.parametrize("fused", [False, True], ids=["from-scratch", "fused"])
def test_causal_later_tokens_never_change_earlier_outputs(fused):
    block, x = make(fused=fused), random_x((2,), seq=8)
    before = block(x)
    gen = torch.Generator().manual_seed(5)
    for t in range(8):
        changed = x.clone()
        changed[:, t + 1:] = torch.randn(2, 7 - t, D_MODEL, generator=gen)
        assert torch.equal(block(changed)[:, : t + 1], before[:, : t + 1]), f"position {t} saw the future"
        if t < 7:
            assert not torch.allclose(block(changed)[:, t + 1:], before[:, t + 1:])


def test_fused_path_matches_and_reaches_the_attention():
    block = make(dtype=torch.float64, fused=True)
    assert block.attn.fused is True and make().attn.fused is False
    x = random_x((2,), dtype=torch.float64)
    torch.testing.assert_close(block(x), reference(block, x))


def test_a_block_whose_writes_are_zero_is_the_identity():
    block, x = make(), random_x((2,))
    with torch.no_grad():
        block.attn.output_proj.weight.zero_()
        block.ffn.w2.weight.zero_()
    assert torch.equal(block(x), x)


def test_submodules_and_state_dict_names():
    block = make()
    assert isinstance(block.ln1, RMSNorm) and isinstance(block.ln2, RMSNorm) and block.ln1 is not block.ln2
    assert isinstance(block.attn, MultiHeadSelfAttention) and isinstance(block.ffn, SwiGLU)
    assert list(block.state_dict()) == NAMES
    assert [name for name, _ in block.named_parameters()] == NAMES
    shapes = {name: tuple(p.shape) for name, p in block.named_parameters()}
    assert shapes["ffn.w1.weight"] == (D_FF, D_MODEL) and shapes["ffn.w2.weight"] == (D_MODEL, D_FF)
    assert {name for name, _ in block.named_buffers()} == {"attn.rope.cos_table", "attn.rope.sin_table"}


def test_state_dict_round_trip_with_strict_loading():
    block, other = make(seed=0), make(seed=1)
    x = random_x((2,))
    assert not torch.allclose(block(x), other(x))
    other.load_state_dict(block.state_dict(), strict=True)
    assert torch.equal(block(x), other(x))


def test_initialisation_gains_are_ones():
    block = TransformerBlock(D_MODEL, HEADS, D_FF, MAX_SEQ_LEN, THETA)
    assert torch.equal(block.ln1.weight, torch.ones(D_MODEL)) and torch.equal(block.ln2.weight, torch.ones(D_MODEL))


@pytest.mark.parametrize("d_model, num_heads, d_ff", [(12, 3, 16), (64, 4, 192), (768, 12, 2048), (1600, 25, 6400)])
def test_parameter_count_equals_the_formula(d_model, num_heads, d_ff):
    block = TransformerBlock(d_model, num_heads, d_ff, 1024, THETA, device="meta")
    assert sum(p.numel() for p in block.parameters()) == 2 * d_model + 4 * d_model**2 + 3 * d_model * d_ff


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_device_and_dtype_are_honoured(device, dtype):
    block = TransformerBlock(D_MODEL, HEADS, D_FF, MAX_SEQ_LEN, THETA, device=device, dtype=dtype)
    assert all(p.dtype == dtype and p.device.type == device for p in block.parameters())
    assert all(b.device.type == device for b in block.buffers())
    out = block(random_x((2,), device=device, dtype=dtype))
    assert out.dtype == dtype and out.device.type == device


def test_meta_device():
    block = TransformerBlock(D_MODEL, HEADS, D_FF, MAX_SEQ_LEN, THETA, device="meta")
    assert all(t.device.type == "meta" for t in [*block.parameters(), *block.buffers()])


def test_gradcheck_of_input_and_every_weight():
    from torch.func import functional_call

    block = TransformerBlock(4, 2, 6, 8, THETA, dtype=torch.float64)
    with torch.no_grad():
        block.ln1.weight.uniform_(0.5, 1.5)
        block.ln2.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    names = [name for name, _ in block.named_parameters()]
    weights = tuple(p.detach().clone().requires_grad_() for p in block.parameters())
    assert torch.autograd.gradcheck(lambda x, *w: functional_call(block, dict(zip(names, w)), (x,)), (x, *weights))


def test_gradients_match_the_reference():
    block, x = make(dtype=torch.float64), random_x((2,), dtype=torch.float64).requires_grad_()
    upstream = torch.randn(2, SEQ, D_MODEL, dtype=torch.float64)
    (block(x) * upstream).sum().backward()
    ours = {name: p.grad.clone() for name, p in block.named_parameters()}
    x_grad = x.grad.clone()
    block.zero_grad()
    x.grad = None
    (reference(block, x) * upstream).sum().backward()
    tolerance = dict(rtol=1e-6, atol=1e-6)  # the block's RoPE tables are float32, the reference's angles float64
    torch.testing.assert_close(x.grad, x_grad, **tolerance)
    for name, p in block.named_parameters():
        torch.testing.assert_close(p.grad, ours[name], msg=name, **tolerance)


def test_wrong_last_dimension_is_a_clear_error():
    block = make()
    with pytest.raises(ValueError, match=r"TransformerBlock expected x of shape \(\.\.\., seq, 12\) \(d_model=12\), "
                                         r"got shape \(2, 5, 16\)"):
        block(torch.randn(2, 5, 16))


def test_sequence_longer_than_max_seq_len_is_a_clear_error():
    block = make()
    with pytest.raises(ValueError, match=r"the sequence has 17 tokens, more than max_seq_len=16 "
                                         r"\(x of shape \(2, 17, 12\)\)"):
        block(torch.randn(2, 17, D_MODEL))
    assert block(torch.randn(2, MAX_SEQ_LEN, D_MODEL)).shape == (2, MAX_SEQ_LEN, D_MODEL)


def test_bad_arguments_and_inputs():
    with pytest.raises(ValueError, match="d_model must be divisible by num_heads"):
        TransformerBlock(12, 5, D_FF, MAX_SEQ_LEN, THETA)
    with pytest.raises(TypeError):  # jaxtyping: no sequence axis
        make()(torch.randn(D_MODEL))
    with pytest.raises(TypeError):  # jaxtyping: integers are not a float tensor
        make()(torch.ones(2, SEQ, D_MODEL, dtype=torch.long))
    with pytest.raises(ValueError, match="token_positions must lie in"):
        make()(random_x(), torch.tensor([0, 1, 2, 3, MAX_SEQ_LEN]))


def test_without_rope():
    block = TransformerBlock(D_MODEL, HEADS, D_FF, None, None)
    assert block.attn.rope is None
    x = random_x((2,))
    assert block(x).shape == x.shape
    assert block(torch.randn(2, 100, D_MODEL)).shape == (2, 100, D_MODEL)  # no max_seq_len to exceed

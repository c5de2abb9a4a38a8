"""MultiHeadSelfAttention (notebook 08) against the course's reference (F.linear, F.scaled_dot_product_attention),
with and without RoPE; causality as a property; RoPE's relative positions; the fused path; the state dict;
device and dtype; gradients; bad input."""

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES, FLOAT_DTYPES, LEADING_SHAPES

from transformer_from_scratch import reference as course_reference
from transformer_from_scratch import MultiHeadSelfAttention, RotaryPositionalEmbedding

D_MODEL, HEADS, SEQ, MAX_SEQ_LEN, THETA = 12, 3, 5, 16, 10000.0
NAMES = ["q_proj.weight", "k_proj.weight", "v_proj.weight", "output_proj.weight"]


def reference(attn, x, token_positions=None):
    """The same computation from the course's reference (PyTorch built-ins, RoPE as a complex product)."""
    theta = attn.theta if attn.max_seq_len is not None else None
    return course_reference.multihead_self_attention(x, dict(attn.named_parameters()), attn.num_heads, theta,
                                                     token_positions)


def make(rope=True, device="cpu", dtype=torch.float32, seed=0, **kwargs):
    torch.manual_seed(seed)
    extra = dict(max_seq_len=MAX_SEQ_LEN, theta=THETA) if rope else {}
    return MultiHeadSelfAttention(D_MODEL, HEADS, **extra, device=device, dtype=dtype, **kwargs)


def random_x(leading=(), seq=SEQ, device="cpu", dtype=torch.float32, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*leading, seq, D_MODEL, generator=gen, dtype=dtype).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("leading", LEADING_SHAPES, ids=str)
@pytest.mark.parametrize("rope", [False, True], ids=["no-rope", "rope"])
def test_matches_the_builtin_reference(device, dtype, leading, rope):
    attn = make(rope, device, dtype)
    x = random_x(leading, device=device, dtype=dtype)
    out = attn(x)
    assert out.shape == x.shape and out.dtype == dtype and out.device.type == device
    torch.testing.assert_close(out, reference(attn, x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_token_positions_per_sequence_and_shared(device, dtype):
    attn = make(True, device, dtype)
    x = random_x((2, 3), device=device, dtype=dtype)
    per_sequence = torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 0, 1], [2, 3, 7, 8, 15]], device=device).expand(2, 3, SEQ)
    for positions in (per_sequence, per_sequence[0], torch.tensor([3, 4, 6, 9, 10], device=device)):
        torch.testing.assert_close(attn(x, positions), reference(attn, x, positions))


def test_positions_default_to_0_to_seq_minus_1():
    attn, x = make(), random_x((2,))
    assert torch.equal(attn(x), attn(x, torch.arange(SEQ)))
    assert torch.equal(attn(x), attn(x, torch.arange(SEQ).expand(2, SEQ)))


def test_uneven_positions_change_the_output_and_a_shift_does_not():
    """RoPE is relative: adding the same offset to every position changes nothing; moving one token does."""
    attn, x = make(dtype=torch.float64), random_x((2,), dtype=torch.float64)
    base = attn(x)
    torch.testing.assert_close(attn(x, torch.arange(SEQ) + 9), base)
    moved = attn(x, torch.tensor([0, 1, 2, 3, 11]))
    assert torch.equal(moved[:, :4], base[:, :4])  # the earlier outputs cannot see token 4
    assert not torch.allclose(moved[:, 4], base[:, 4])


def test_rope_is_on_queries_and_keys_only():
    """With one token, attention returns its value: rotating V would change the output with the position."""
    attn, x = make(dtype=torch.float64), random_x((2,), seq=1, dtype=torch.float64)
    expected = F.linear(F.linear(x, attn.v_proj.weight), attn.output_proj.weight)
    for position in (0, 3, 15):
        torch.testing.assert_close(attn(x, torch.tensor([position])), expected)


def test_without_rope_the_order_of_the_earlier_tokens_does_not_matter():
    """No RoPE: the last output is the same for any order of the tokens before it."""
    attn, x = make(rope=False, dtype=torch.float64), random_x((2,), dtype=torch.float64)
    shuffled = x[:, [2, 0, 3, 1, 4]]
    torch.testing.assert_close(attn(shuffled)[:, -1], attn(x)[:, -1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused", [False, True], ids=["from-scratch", "fused"])
@pytest.mark.parametrize("t", range(8))
def test_causality_later_tokens_never_change_earlier_outputs(device, fused, t):
    attn = make(True, device, fused=fused)
    x = random_x((2,), seq=8, device=device)
    changed = x.clone()
    changed[:, t + 1:] = random_x((2,), seq=7 - t, device=device, seed=7) * 100
    before, after = attn(x), attn(changed)
    assert torch.equal(after[:, : t + 1], before[:, : t + 1])
    if t < 7:
        assert not torch.allclose(after[:, t + 1:], before[:, t + 1:])


def test_every_head_gets_the_same_rotation():
    """Permuting the heads (blocks of rows of q, k, v and columns of output_proj) changes nothing."""
    attn, x = make(dtype=torch.float64), random_x((2,), dtype=torch.float64)
    d_k = D_MODEL // HEADS
    order = torch.cat([torch.arange(h * d_k, (h + 1) * d_k) for h in (2, 0, 1)])
    permuted = make(dtype=torch.float64)
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(permuted, name).weight.copy_(getattr(attn, name).weight[order])
        permuted.output_proj.weight.copy_(attn.output_proj.weight[:, order])
    torch.testing.assert_close(permuted(x), attn(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rope", [False, True], ids=["no-rope", "rope"])
def test_fused_path_agrees_with_the_from_scratch_path(device, rope):
    attn, x = make(rope, device), random_x((2, 3), device=device)
    from_scratch = attn(x)
    attn.fused = True
    torch.testing.assert_close(attn(x), from_scratch)
    assert make(rope, device, fused=True).fused is True and make(rope, device).fused is False


def test_the_default_path_does_not_call_the_builtin(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("F.scaled_dot_product_attention was called")

    monkeypatch.setattr(F, "scaled_dot_product_attention", forbidden)
    make()(random_x((2,)))  # the from-scratch path: fine
    with pytest.raises(AssertionError, match="was called"):
        make(fused=True)(random_x((2,)))


@pytest.mark.parametrize("rope", [False, True], ids=["no-rope", "rope"])
def test_state_dict_holds_exactly_the_four_weights(rope):
    attn = make(rope)
    assert list(attn.state_dict()) == NAMES
    assert all(tuple(w.shape) == (D_MODEL, D_MODEL) for w in attn.state_dict().values())
    assert not any(name.endswith("bias") for name, _ in attn.named_parameters())
    fresh = make(rope, seed=5)
    fresh.load_state_dict(attn.state_dict(), strict=True)
    x = random_x((2,))
    assert torch.equal(fresh(x), attn(x))


def test_projections_are_initialised_like_linear():
    torch.manual_seed(0)
    attn = MultiHeadSelfAttention(256, 4)
    sigma = (2 / 512) ** 0.5
    weights = [getattr(attn, name).weight.detach() for name in ("q_proj", "k_proj", "v_proj", "output_proj")]
    for w in weights:
        assert abs(w.std().item() / sigma - 0.987) < 0.02 and w.abs().max() <= 3 * sigma * (1 + 1e-6)
    assert not torch.equal(weights[0], weights[1])


def test_device_and_dtype_are_honoured():
    attn = MultiHeadSelfAttention(D_MODEL, HEADS, MAX_SEQ_LEN, THETA, device="meta", dtype=torch.float64)
    assert all(p.device.type == "meta" and p.dtype == torch.float64 for p in attn.parameters())
    assert all(b.device.type == "meta" for b in attn.buffers())
    attn = MultiHeadSelfAttention(D_MODEL, HEADS, device="meta", dtype=torch.float64)  # (RoPE reads its positions)
    out = attn(torch.empty(2, SEQ, D_MODEL, device="meta", dtype=torch.float64))
    assert out.device.type == "meta" and out.shape == (2, SEQ, D_MODEL)


@pytest.mark.parametrize("rope", [False, True], ids=["no-rope", "rope"])
def test_gradcheck_input_and_every_weight(rope):
    torch.manual_seed(0)
    extra = dict(max_seq_len=4, theta=THETA) if rope else {}
    attn = MultiHeadSelfAttention(4, 2, **extra, dtype=torch.float64)
    x = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    names = [name for name, _ in attn.named_parameters()]
    weights = tuple(p.detach().clone().requires_grad_() for p in attn.parameters())
    as_function = lambda x, *w: torch.func.functional_call(attn, dict(zip(names, w)), (x,))
    assert torch.autograd.gradcheck(as_function, (x, *weights))


def test_gradients_match_the_reference():
    attn, x = make(dtype=torch.float64), random_x((2,), dtype=torch.float64).requires_grad_()
    upstream = random_x((2,), dtype=torch.float64, seed=3)
    (attn(x) * upstream).sum().backward()
    ours = [x.grad.clone()] + [getattr(attn, n.split(".")[0]).weight.grad.clone() for n in NAMES]
    x.grad = None
    attn.zero_grad()
    (reference(attn, x) * upstream).sum().backward()
    theirs = [x.grad] + [getattr(attn, n.split(".")[0]).weight.grad for n in NAMES]
    for mine, ref in zip(ours, theirs):
        torch.testing.assert_close(mine, ref, rtol=1e-6, atol=1e-6)  # the module's RoPE tables are float32


@pytest.mark.parametrize("d_model, num_heads", [(12, 5), (12, 0), (10, 4)])
def test_d_model_not_divisible_by_num_heads_is_refused(d_model, num_heads):
    with pytest.raises(ValueError, match=rf"d_model must be divisible by num_heads.*d_model={d_model}, "
                                         rf"num_heads={num_heads}"):
        MultiHeadSelfAttention(d_model, num_heads)


@pytest.mark.parametrize("kwargs", [dict(max_seq_len=16), dict(theta=10000.0)], ids=["max_seq_len-only", "theta-only"])
def test_only_one_of_max_seq_len_and_theta_is_refused(kwargs):
    with pytest.raises(ValueError, match="give both max_seq_len and theta"):
        MultiHeadSelfAttention(D_MODEL, HEADS, **kwargs)


def test_a_sequence_longer_than_max_seq_len_is_refused():
    attn = make()
    attn(random_x((2,), seq=MAX_SEQ_LEN))  # exactly max_seq_len is fine
    with pytest.raises(ValueError, match=rf"the sequence has {MAX_SEQ_LEN + 1} tokens, more than max_seq_len={MAX_SEQ_LEN}"):
        attn(random_x((2,), seq=MAX_SEQ_LEN + 1))


def test_a_wrong_d_model_is_refused():
    with pytest.raises(ValueError, match=r"expected x of shape \(\.\.\., seq, 12\).*got shape \(2, 5, 8\)"):
        make()(torch.randn(2, 5, 8))


@pytest.mark.parametrize("positions", [[0, 1, 2, 3, MAX_SEQ_LEN], [-1, 0, 1, 2, 3]], ids=["too-large", "negative"])
def test_positions_outside_ropes_table_are_refused(positions):
    with pytest.raises(ValueError, match=r"token_positions must lie in \[0, max_seq_len\)"):
        make()(random_x((2,)), torch.tensor(positions))


def test_positions_without_rope_are_refused():
    with pytest.raises(ValueError, match="token_positions were given, but this module has no RoPE"):
        make(rope=False)(random_x((2,)), torch.arange(SEQ))


@pytest.mark.parametrize("positions", [torch.arange(SEQ + 1), torch.arange(SEQ).float(), torch.zeros(4, SEQ, dtype=torch.long)],
                         ids=["wrong-seq", "float", "batch-does-not-broadcast"])
def test_positions_of_the_wrong_shape_or_dtype_are_refused(positions):
    with pytest.raises(TypeError, match="token_positions"):
        make()(random_x((2,)), positions)

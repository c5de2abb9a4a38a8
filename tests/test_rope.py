"""RotaryPositionalEmbedding (notebook 06) against an independent rotation (complex numbers, torch.polar) and the
d_k × d_k block-diagonal matrix, hand-computed cases, relative positions, buffers, gradients and bad input."""

import math
import re

import pytest
import torch
from conftest import DEVICES, FLOAT_DTYPES, LEADING_SHAPES

from transformer_from_scratch import reference
from transformer_from_scratch import RotaryPositionalEmbedding

THETA, D_K, MAX_SEQ_LEN, SEQ = 10000.0, 16, 64, 7


def angles(positions, d_k=D_K, theta=THETA):
    """(..., seq, d_k/2): θ_{i,k} = i / theta^(2k/d_k), in float64 (the course's reference)."""
    return reference.rope_angles(positions, d_k, theta)


def rotate_complex(x, positions, theta=THETA):
    """The course's reference: pair k = (x[2k], x[2k+1]) as x[2k] + i·x[2k+1], times e^{iθ}, in float64 on the CPU."""
    return reference.rotate(x.detach().cpu().double(), positions.cpu(), theta)


def rotation_matrix(position, d_k=D_K, theta=THETA):
    """The d_k × d_k block-diagonal R_i: one 2 × 2 rotation per pair."""
    R = torch.zeros(d_k, d_k, dtype=torch.float64)
    for k, a in enumerate(angles(torch.tensor(position), d_k, theta).tolist()):
        R[2 * k: 2 * k + 2, 2 * k: 2 * k + 2] = torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
    return R


def random_x(*shape, dtype=torch.float32, device="cpu", seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype).to(device)


def tolerance(dtype):
    # The tables are float32: a float64 input is rotated to float32 accuracy.
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float64 else {}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("leading", LEADING_SHAPES, ids=str)
@pytest.mark.parametrize("positions_kind", ["arange", "shared", "per-element", "size-1"])
def test_matches_the_complex_rotation(device, dtype, leading, positions_kind):
    rope = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN, device=device)
    x = random_x(*leading, SEQ, D_K, dtype=dtype, device=device)
    gen = torch.Generator().manual_seed(1)
    positions = {"arange": torch.arange(SEQ),
                 "shared": torch.randint(0, MAX_SEQ_LEN, (SEQ,), generator=gen),
                 "per-element": torch.randint(0, MAX_SEQ_LEN, (*leading, SEQ), generator=gen),
                 "size-1": torch.randint(0, MAX_SEQ_LEN, (*(1 for _ in leading), SEQ), generator=gen)}[positions_kind]
    out = rope(x, positions.to(device))
    assert out.shape == x.shape and out.dtype == dtype and out.device.type == device
    expected = rotate_complex(x, positions).to(dtype)
    torch.testing.assert_close(out.cpu(), expected, **tolerance(dtype))


@pytest.mark.parametrize("theta, d_k", [(10000.0, 2), (10000.0, 64), (500.0, 8), (1e6, 32)])
def test_other_sizes_and_thetas(theta, d_k):
    rope = RotaryPositionalEmbedding(theta, d_k, 128)
    x, positions = random_x(3, 10, d_k, dtype=torch.float64), torch.randint(0, 128, (3, 10))
    torch.testing.assert_close(rope(x, positions), rotate_complex(x, positions, theta), **tolerance(torch.float64))


def test_matches_the_block_diagonal_matrix():
    rope = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN)
    x, positions = random_x(SEQ, D_K, dtype=torch.float64), torch.tensor([0, 1, 2, 9, 30, 31, 63])
    by_matrix = torch.stack([rotation_matrix(i) @ row for i, row in zip(positions.tolist(), x)])
    torch.testing.assert_close(rope(x, positions), by_matrix, **tolerance(torch.float64))


def test_hand_computed_case():
    # d_k = 4, theta = 100: pair 0 turns 1 rad per token, pair 1 turns 1/100^(2/4) = 0.1 rad per token.
    rope = RotaryPositionalEmbedding(100.0, 4, 8)
    x = torch.tensor([[1.0, 0.0, 0.0, 2.0]])
    expected = torch.tensor([[math.cos(1), math.sin(1), -2 * math.sin(0.1), 2 * math.cos(0.1)]])
    torch.testing.assert_close(rope(x, torch.tensor([1])), expected)


def test_position_zero_is_the_identity_and_lengths_are_kept():
    rope = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN)
    x = random_x(2, SEQ, D_K)
    assert torch.equal(rope(x, torch.zeros(SEQ, dtype=torch.long)), x)
    out = rope(x, torch.randint(0, MAX_SEQ_LEN, (SEQ,)))
    pair_lengths = lambda t: t.reshape(*t.shape[:-1], -1, 2).norm(dim=-1)  # noqa: E731
    torch.testing.assert_close(pair_lengths(out), pair_lengths(x))


def test_scores_depend_only_on_the_offset():
    rope = RotaryPositionalEmbedding(THETA, D_K, 4096)
    q, k = random_x(1, D_K, dtype=torch.float64, seed=1), random_x(1, D_K, dtype=torch.float64, seed=2)

    def score(m, n):
        return (rope(q, torch.tensor([m])) * rope(k, torch.tensor([n]))).sum().item()

    for offset in (0, 3, -5, 100):
        scores = [score(n + offset, n) for n in (200, 1000, 3000)]
        assert max(scores) - min(scores) < 1e-5, (offset, scores)
    assert abs(score(10, 7) - score(10, 8)) > 1e-3


def test_integer_dtypes_of_positions():
    rope = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN)
    x, positions = random_x(SEQ, D_K), torch.arange(SEQ)
    for dtype in (torch.int32, torch.int16, torch.int8):
        torch.testing.assert_close(rope(x, positions.to(dtype)), rope(x, positions))
    with pytest.raises(TypeError):  # uint8 would index as a mask; the annotation refuses it
        rope(x, positions.to(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_views_of_x_that_view_as_complex_cannot_read_are_rotated_too(dtype):
    """A transposed view, a slice with odd strides, a slice at an odd offset: forward copies the pairs first."""
    rope = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN)
    positions = torch.arange(SEQ)
    views = {"transposed": random_x(2, D_K, SEQ, dtype=dtype).transpose(-1, -2),
             "odd strides": random_x(2, SEQ, D_K + 1, dtype=dtype)[..., 1:],
             "odd offset": random_x(1 + 2 * SEQ * D_K, dtype=dtype)[1:].view(2, SEQ, D_K)}
    for name, x in views.items():
        out = rope(x, positions)
        torch.testing.assert_close(out, rotate_complex(x, positions).to(dtype), **tolerance(dtype), msg=name)
        torch.testing.assert_close(out, rope(x.clone(), positions), rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_keeps_the_dtype_and_is_within_a_few_rounding_steps(dtype):
    rope = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN)
    x, positions = random_x(3, SEQ, D_K).to(dtype), torch.randint(0, MAX_SEQ_LEN, (SEQ,))
    out = rope(x, positions)
    assert out.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(out.double(), rotate_complex(x, positions), rtol=4 * eps, atol=4 * eps)


def test_no_parameters_and_an_empty_state_dict():
    rope = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN)
    assert list(rope.parameters()) == []
    assert rope.state_dict() == {}
    assert {name: tuple(b.shape) for name, b in rope.named_buffers()} == {
        "cos_table": (MAX_SEQ_LEN, D_K // 2), "sin_table": (MAX_SEQ_LEN, D_K // 2)}
    rope.load_state_dict({}, strict=True)


@pytest.mark.parametrize("device", DEVICES)
def test_tables_live_on_the_device_given_and_follow_to(device):
    rope = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN, device=device)
    assert all(b.device.type == device for b in rope.buffers())
    meta = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN, device="meta")
    assert all(b.device.type == "meta" for b in meta.buffers())
    moved = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN).to(device)
    assert all(b.device.type == device for b in moved.buffers())


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device):
    rope = RotaryPositionalEmbedding(THETA, 8, 32, device=device)
    x = random_x(2, 5, 8, dtype=torch.float64, device=device).requires_grad_()
    positions = torch.tensor([[0, 3, 31, 3, 7]], device=device)
    assert torch.autograd.gradcheck(lambda t: rope(t, positions), (x,))


def test_the_gradient_is_the_inverse_rotation():
    rope = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN)
    x, positions = random_x(SEQ, D_K, dtype=torch.float64).requires_grad_(), torch.randint(0, MAX_SEQ_LEN, (SEQ,))
    upstream = random_x(SEQ, D_K, dtype=torch.float64, seed=3)
    (rope(x, positions) * upstream).sum().backward()
    torch.testing.assert_close(x.grad, rotate_complex(upstream, -positions), **tolerance(torch.float64))


@pytest.mark.parametrize("d_k", [7, 1, 0, -4])
def test_odd_or_non_positive_d_k_is_refused(d_k):
    with pytest.raises(ValueError, match=f"needs an even d_k > 0 .*got theta=10000.0, d_k={d_k}, max_seq_len=64"):
        RotaryPositionalEmbedding(THETA, d_k, MAX_SEQ_LEN)


def test_non_positive_max_seq_len_and_theta_are_refused():
    with pytest.raises(ValueError, match="max_seq_len > 0 and theta > 0, got theta=10000.0, d_k=16, max_seq_len=0"):
        RotaryPositionalEmbedding(THETA, D_K, 0)
    with pytest.raises(ValueError, match="max_seq_len > 0 and theta > 0, got theta=-1.0, d_k=16, max_seq_len=64"):
        RotaryPositionalEmbedding(-1.0, D_K, MAX_SEQ_LEN)


@pytest.mark.parametrize("positions, low, high", [([0, 5, 64], 0, 64), ([-1, 2, 3], -1, 3), ([-2, 100, 1], -2, 100)])
def test_positions_outside_the_table_are_refused(positions, low, high):
    rope = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN)
    message = re.escape(f"token_positions must lie in [0, max_seq_len) = [0, 64), got values from {low} to {high}")
    with pytest.raises(ValueError, match=message):
        rope(random_x(3, D_K), torch.tensor(positions))


def test_the_last_position_is_accepted():
    rope = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN)
    rope(random_x(1, D_K), torch.tensor([MAX_SEQ_LEN - 1]))


def test_wrong_d_k_is_refused():
    rope = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN)
    with pytest.raises(ValueError, match=re.escape("x's last dimension must be d_k=16, got x of shape (2, 3, 8)")):
        rope(random_x(2, 3, 8), torch.arange(3))


@pytest.mark.parametrize("x_shape, positions_shape", [((2, 5, D_K), (4,)), ((2, 5, D_K), (3, 5)),
                                                      ((5, D_K), (2, 5)), ((2, 4, 5, D_K), (2, 5))])
def test_shapes_that_do_not_broadcast_are_refused(x_shape, positions_shape):
    rope = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN)
    with pytest.raises(TypeError):
        rope(random_x(*x_shape), torch.zeros(positions_shape, dtype=torch.long))


def test_float_positions_are_refused():
    rope = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN)
    with pytest.raises(TypeError):
        rope(random_x(3, D_K), torch.arange(3.0))


def test_empty_sequence():
    rope = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN)
    assert rope(random_x(2, 0, D_K), torch.zeros(0, dtype=torch.long)).shape == (2, 0, D_K)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_a_range_of_positions_rotates_as_the_same_positions_in_a_tensor(dtype):
    rope = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN)
    x = random_x(2, 3, SEQ, D_K, dtype=dtype)
    assert torch.equal(rope(x, range(40, 40 + SEQ)), rope(x, torch.arange(40, 40 + SEQ)))
    torch.testing.assert_close(rope(x, range(SEQ)).double(), rotate_complex(x, torch.arange(SEQ)), **tolerance(dtype))


def test_a_range_is_checked_without_reading_the_device():
    """A tensor of positions costs one read-back (aminmax, then tolist); a range costs none: its bounds are ints."""
    rope = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN)
    x = random_x(1, SEQ, D_K)
    seen = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    with Spy():
        rope(x, range(3, 3 + SEQ))
    assert not {"aminmax", "tolist", "item"} & set(seen), seen
    with Spy():
        rope(x, torch.arange(3, 3 + SEQ))
    assert "aminmax" in seen  # the spy sees a tensor's check: the test above can fail


@pytest.mark.parametrize("positions, message", [
    (range(0, SEQ - 1), r"one per token \(range\(start, start \+ 7\)\), got range\(0, 6\)"),
    (range(0, 2 * SEQ, 2), r"must be consecutive"),
    (range(MAX_SEQ_LEN - SEQ + 1, MAX_SEQ_LEN + 1), r"\[0, 64\), got range\(58, 65\)"),
    (range(-1, SEQ - 1), r"\[0, 64\), got range\(-1, 6\)"),
])
def test_bad_ranges_are_refused_with_the_numbers(positions, message):
    rope = RotaryPositionalEmbedding(THETA, D_K, MAX_SEQ_LEN)
    with pytest.raises(ValueError, match=message):
        rope(random_x(SEQ, D_K), positions)

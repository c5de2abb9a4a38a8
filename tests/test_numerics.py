"""Numerics: softmax at ±1e4 and with -inf, attention with fully masked rows, RMSNorm in half precision
with large values and in float64, the whole TransformerLM in bfloat16 and float64 against float32, and gradcheck
(float64) of softmax, RMSNorm, RoPE, attention and a tiny TransformerBlock, plus gradgradcheck of softmax.

Every expected value comes from PyTorch's built-ins (torch.softmax, F.rms_norm, F.scaled_dot_product_attention)
computed in float64, or from the same model in another dtype; never from the code under test alone.
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES, FLOAT_DTYPES
from torch.func import functional_call

from transformer_from_scratch import (
    RMSNorm,
    RotaryPositionalEmbedding,
    TransformerBlock,
    TransformerLM,
    scaled_dot_product_attention,
    softmax,
)

HALF_DTYPES = [pytest.param(torch.float16, id="float16"), pytest.param(torch.bfloat16, id="bfloat16")]
THETA = 10_000.0


def seeded(*shape, dtype=torch.float64, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ---- softmax -------------------------------------------------------------------------------------------------

# Rows that break the textbook exp(x) / sum(exp(x)): exp(1e4) overflows to inf (inf / inf = NaN), exp(-1e4)
# underflows to 0 (0 / 0 = NaN), and mixed rows whose answer needs both ends.
EXTREME = torch.tensor([
    [1e4, 1e4 - 1.0, 1e4 - 2.5, 0.0, -1e4],
    [-1e4, -1e4 + 1.0, -1e4 + 0.5, -1e4 - 3.0, -1e4],
    [1e4, -1e4, 1e4, -1e4, 1e4 - 30.0],
    [-1e4, 1e4, 0.5, -0.5, 1e4 - 1e-3],
], dtype=torch.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("dim", [-1, 0])
def test_softmax_is_exact_at_plus_minus_1e4(device, dtype, dim):
    x = EXTREME.to(device=device, dtype=dtype)
    assert not torch.isfinite(x.double().exp() / x.double().exp().sum(dim, keepdim=True)).all()  # the premise
    p = softmax(x, dim=dim)
    reference = torch.softmax(x.double(), dim=dim)  # float64, from the same (rounded) inputs
    assert p.dtype == dtype and torch.isfinite(p).all()
    tolerance = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else {}  # float32: its default 1.3e-6
    torch.testing.assert_close(p.double(), reference, **tolerance)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_softmax_minus_inf_entries_get_exactly_zero_and_an_all_minus_inf_slice_is_nan(device, dtype):
    inf = float("inf")
    x = torch.tensor([[0.5, -inf, 2.0, -inf],
                      [-inf, -inf, -inf, -inf],   # no distribution at all: NaN, as torch.softmax gives
                      [-inf, 1e4, -inf, -inf],    # one finite entry: probability exactly 1
                      [-inf, -1e4, -1e4, 3.0]], device=device, dtype=dtype)
    p = softmax(x, dim=-1)
    reference = torch.softmax(x.double(), dim=-1)
    assert (p[x == -inf][~torch.isnan(p[x == -inf])] == 0).all()  # exactly 0, not 1e-300
    assert torch.isnan(p[1]).all() and torch.isnan(reference[1]).all()
    assert p[2, 1].item() == 1.0
    tolerance = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else {}
    torch.testing.assert_close(p.double(), reference, equal_nan=True, **tolerance)


# ---- attention with fully masked rows ------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_attention_fully_masked_rows_are_zero_finite_and_match_torch_with_gradients(device, dtype):
    Q, K, V = (seeded(2, 3, 4, d, dtype=dtype, seed=s).to(device) for s, d in [(0, 6), (1, 6), (2, 5)])
    mask = torch.tril(torch.ones(2, 3, 4, 4, dtype=torch.bool))
    mask[0, 1, 0] = False   # one query of one head may attend to nothing
    mask[1, :, 3] = False   # the last query of every head of the second sequence, too
    mask = mask.to(device)
    no_key = ~mask.any(dim=-1)
    upstream = seeded(2, 3, 4, 5, dtype=dtype, seed=3).to(device)  # a random dL/d(out), not just ones

    ours = [t.clone().requires_grad_() for t in (Q, K, V)]
    out = scaled_dot_product_attention(*ours, mask)
    out.backward(upstream)
    theirs = [t.clone().requires_grad_() for t in (Q, K, V)]
    reference = F.scaled_dot_product_attention(*theirs, attn_mask=mask)
    reference.backward(upstream)

    assert torch.isfinite(out).all() and (out[no_key] == 0).all()  # exactly zero, not merely small
    torch.testing.assert_close(out, reference)
    for mine, its in zip(ours, theirs):
        assert torch.isfinite(mine.grad).all()
        torch.testing.assert_close(mine.grad, its.grad)
    assert (ours[0].grad[no_key] == 0).all()


# ---- RMSNorm -------------------------------------------------------------------------------------------------

def rms_norm_float64(x, weight, eps=1e-5):
    """The reference: F.rms_norm on the exact values of x and the gain, in float64."""
    return F.rms_norm(x.double(), (x.shape[-1],), weight.double(), eps=eps)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("scale", [300.0, 1e4])
def test_rmsnorm_half_precision_with_large_values_against_float64(device, dtype, scale):
    x = (seeded(3, 5, 64, dtype=torch.float32) * scale).to(dtype)
    assert torch.isfinite(x).all()
    if dtype == torch.float16:
        assert torch.isinf(x.pow(2)).any()  # the premise: 300² = 90000 > 65504, float16's largest value
    norm = RMSNorm(64, device=device, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 64))  # a gain away from ones, rounded to dtype
    y = norm(x.to(device))
    assert y.dtype == dtype and torch.isfinite(y).all()
    # The exact answer, rounded once to dtype, is within half a unit in the last place: rtol = one eps leaves
    # room for float32's rounding inside; atol covers float16's subnormal outputs (spacing 6e-8).
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(y.cpu().double(), rms_norm_float64(x, norm.weight.cpu()), rtol=eps, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gain_dtype", [torch.float64, torch.float32], ids=["float64-gain", "float32-gain"])
def test_rmsnorm_float64_input_stays_float64(device, gain_dtype):
    x = seeded(4, 6, 32) * 7 + 1  # float64 values that float32 could not hold (a downcast errs by ~1e-7)
    norm = RMSNorm(32, device=device, dtype=gain_dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.25, 2.0, 32))
    y = norm(x.to(device))
    assert y.dtype == torch.float64
    torch.testing.assert_close(y.cpu(), rms_norm_float64(x, norm.weight.cpu()), rtol=1e-12, atol=1e-12)


# ---- the whole model in bfloat16 and float64 -----------------------------------------------------------------

TINY_LM = dict(vocab_size=50, context_length=16, d_model=32, num_layers=2, num_heads=4, d_ff=64, rope_theta=THETA)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["float64", "bfloat16"])
def test_transformer_lm_in_another_dtype_is_close_to_float32(device, dtype):
    """The float32 model's weights, copied into a model built with dtype=...; logits compared with float32's.

    Tolerances. float64: the float32 run is the inexact one, its unit roundoff 6e-8 grown through two layers
    (measured: max |error| ~1e-6 on logits of std ~0.9), so atol = rtol = 1e-5. bfloat16 keeps 8 significant bits
    (eps 2^-7 = 0.0078, about 2-3 significant digits): measured over five seeds, the error's norm is 0.7% of the
    logits' norm and the largest error 0.035; the test allows 2% and 0.1, about three times that, while a real
    bug (a swapped axis, a missing scale) moves the logits by O(1).
    """
    torch.manual_seed(0)
    model32 = TransformerLM(**TINY_LM, device=device)
    model = TransformerLM(**TINY_LM, device=device, dtype=dtype)
    model.load_state_dict(model32.state_dict())
    assert all(p.dtype == dtype for p in model.parameters())
    ids = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        reference, logits = model32(ids).double(), model(ids)
    assert logits.dtype == dtype and torch.isfinite(logits).all()
    error = logits.double() - reference
    if dtype == torch.float64:
        torch.testing.assert_close(logits, reference, rtol=1e-5, atol=1e-5)
    else:
        assert error.norm() / reference.norm() < 0.02
        assert error.abs().max() < 0.1


# ---- gradcheck (float64) -------------------------------------------------------------------------------------

def rmsnorm_as_function(device):
    norm = RMSNorm(5, device=device, dtype=torch.float64)
    return lambda x, g: functional_call(norm, {"weight": g}, (x,)), (seeded(2, 3, 5), seeded(5, seed=1) + 1.5)


def rope_as_function(device):
    rope = RotaryPositionalEmbedding(THETA, 6, 8, device=device)
    positions = torch.tensor([[0, 3, 7], [5, 1, 2]], device=device)
    return lambda x: rope(x, positions), (seeded(2, 3, 6),)


def attention_as_function(device):
    causal = torch.tril(torch.ones(4, 4, dtype=torch.bool, device=device))
    return (lambda q, k, v: scaled_dot_product_attention(q, k, v, causal),
            (seeded(2, 4, 3), seeded(2, 4, 3, seed=1), seeded(2, 4, 2, seed=2)))


def block_as_function(device):
    """A tiny block as a function of its input and every weight (functional_call), so all of them are checked."""
    torch.manual_seed(0)
    block = TransformerBlock(d_model=4, num_heads=2, d_ff=6, max_seq_len=4, theta=THETA, device=device,
                             dtype=torch.float64)
    names = [name for name, _ in block.named_parameters()]
    weights = [p.detach().cpu() + 0.1 * seeded(*p.shape, seed=i + 10) for i, p in enumerate(block.parameters())]
    return (lambda x, *w: functional_call(block, dict(zip(names, w)), (x,)), (seeded(1, 3, 4), *weights))


GRADCHECKS = [
    pytest.param(lambda device: (lambda x: softmax(x, dim=-1), (seeded(3, 5),)), id="softmax-last-dim"),
    pytest.param(lambda device: (lambda x: softmax(x, dim=0), (seeded(3, 5) * 10,)), id="softmax-dim-0-large"),
    pytest.param(rmsnorm_as_function, id="RMSNorm-x-and-gain"),
    pytest.param(rope_as_function, id="RoPE-x"),
    pytest.param(attention_as_function, id="attention-QKV-causal"),
    pytest.param(block_as_function, id="TransformerBlock-x-and-weights"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make", GRADCHECKS)
def test_gradcheck_float64(device, make):
    function, inputs = make(device)
    inputs = tuple(t.to(device).requires_grad_() for t in inputs)
    assert torch.autograd.gradcheck(function, inputs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [-1, 0])
def test_softmax_gradgradcheck(device, dim):
    """softmax's backward is written by hand (p ⊙ (g − ⟨g, p⟩)) and claims to be differentiable itself."""
    x = (seeded(3, 4) * 3).to(device).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda t: softmax(t, dim=dim), (x,))

"""Notebook 16's module (fast_decode.py) against independent computations: the bytes of a decode step counted by hand
from the configuration, layouts read from strides, notebook 08's head split on separate projections, int8 written out
by hand and the product in float64, the fused modules against the course's MultiHeadSelfAttention and SwiGLU (with and
without a KV cache), a prepared TransformerLM against the same model unprepared, and SmolLM2 (the real weights, when
`make weights` has fetched them): its greedy reply unchanged by prepare_for_decode.
"""

import copy
import subprocess
import sys

import pytest
import torch

from conftest import DEVICES, FLOAT_DTYPES
from transformer_from_scratch import KVCache, MultiHeadSelfAttention, SwiGLU, TransformerLM, generate
from transformer_from_scratch.fast_decode import (KERNEL_ROWS, FusedSelfAttention, FusedSwiGLU, Int8Linear,
                                                  column_major, copy_bandwidth, decode_bytes, faster_layout,
                                                  fuse_weights, int8_matmul, prepare_for_decode, quantize_int8,
                                                  split_qkv, static_step)
from transformer_from_scratch.linear import Linear
from transformer_from_scratch.multihead_attention import _split_heads

V, CTX, D, L, H, DFF, THETA = 13, 16, 24, 2, 4, 40, 10_000.0
DK = D // H
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-6, atol=1e-6)}  # RoPE's tables
# are float32, in a float64 model too


def lm(*, tied=False, dtype=torch.float32, kv=None, seed=0, device=None):
    torch.manual_seed(seed)
    return TransformerLM(V, CTX, D, L, H, DFF, THETA, device=device, dtype=dtype, num_kv_heads=kv,
                         tie_embeddings=tied)


def randn(*shape, dtype=torch.float32, seed=0, device=None):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(device, dtype)


# --- Step 1: decode_bytes -----------------------------------------------------------------------------------------

def hand_bytes(*, tied, dtype, kv, cache_length):
    """The bytes of one step, from the configuration: every matrix and norm once, one row of an untied table (all of it
    when tied, as lm_head), the keys and values of cache_length positions in every layer."""
    size = torch.tensor([], dtype=dtype).element_size()
    kv = kv or H
    per_layer = D * D + 2 * kv * DK * D + D * D + 3 * D * DFF + 2 * D
    numbers = L * per_layer + D + V * D + (0 if tied else D)
    return size * (numbers + cache_length * L * 2 * kv * DK)


def hand_int8_bytes(*, dtype, kv, cache_length):
    """An int8-prepared (and fused) model: one byte for each weight of the matrices, lm_head's included, a float32 scale
    per output row, the norms and one row of the table in the model's dtype, the cache in it too."""
    size = torch.tensor([], dtype=dtype).element_size()
    rows = [D + 2 * kv * DK, D, 2 * DFF, D]  # qkv, out, w1 and w3, w2
    matrices = L * (D * (D + 2 * kv * DK) + D * D + 2 * DFF * D + DFF * D) + V * D
    scales = 4 * (L * sum(rows) + V)
    floats = size * (L * 2 * D + D + D)  # the norms, the final norm, one row of the table
    return matrices + scales + floats + size * cache_length * L * 2 * kv * DK


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("kv", [None, 2, 1], ids=["MHA", "GQA-2", "GQA-1"])
def test_decode_bytes_by_hand(tied, dtype, kv):
    model = lm(tied=tied, dtype=dtype, kv=kv)
    for cache_length in (0, 1, 9):
        assert decode_bytes(model, cache_length) == hand_bytes(tied=tied, dtype=dtype, kv=kv, cache_length=cache_length)
    prepare_for_decode(model, layout="columns")  # fused: the same bytes
    assert decode_bytes(model, 5) == hand_bytes(tied=tied, dtype=dtype, kv=kv, cache_length=5)
    rows = prepare_for_decode(lm(tied=tied, dtype=dtype, kv=kv), layout="rows")
    assert decode_bytes(rows, 5) == hand_bytes(tied=tied, dtype=dtype, kv=kv, cache_length=5)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_decode_bytes_of_an_int8_model_by_hand(tied):
    model = prepare_for_decode(lm(tied=tied, kv=2), int8=True)
    assert decode_bytes(model, 7) == hand_int8_bytes(dtype=torch.float32, kv=2, cache_length=7)
    assert decode_bytes(model) < hand_bytes(tied=tied, dtype=torch.float32, kv=2, cache_length=0) / 3


def test_copy_bandwidth_is_a_positive_rate():
    assert copy_bandwidth(2**20, repeats=2) > 0


def test_faster_layout_names_a_layout():
    assert faster_layout(randn(64, 32), repeats=2) in ("rows", "columns")


# --- Steps 2 and 3: column_major and fuse_weights ------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_column_major_keeps_shape_and_numbers_and_changes_the_layout(dtype, device):
    weight = randn(5, 3, dtype=dtype, device=device)
    given = weight.clone()
    out = column_major(given)
    assert torch.equal(given, weight) and given.is_contiguous()  # the input untouched
    assert out.shape == (5, 3) and out.dtype == dtype and out.device == weight.device and torch.equal(out, weight)
    assert out.stride() == (1, 5) and out.T.is_contiguous()
    assert torch.equal(out @ torch.eye(3, dtype=dtype, device=device), weight)
    again = column_major(out)  # already column-major: the same layout and numbers
    assert again.stride() == (1, 5) and torch.equal(again, weight)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_fuse_weights_stacks_shares_memory_and_keeps_the_state_dict(dtype, device):
    torch.manual_seed(0)
    q, k, v = (Linear(D, rows, device=device, dtype=dtype) for rows in (D, 2 * DK, 2 * DK))
    weights = [p.weight.detach().clone() for p in (q, k, v)]
    x = randn(2, 3, D, dtype=dtype, device=device)
    separate = torch.cat([x @ w.T for w in weights], dim=-1)
    fused = fuse_weights(q, k, v)
    assert fused.shape == (D + 4 * DK, D) and fused.stride() == (1, D + 4 * DK)
    assert torch.equal(fused, torch.cat(weights))
    torch.testing.assert_close(x @ fused.T, separate, **TOLERANCE[dtype])
    for linear, weight in zip((q, k, v), weights):
        assert isinstance(linear.weight, torch.nn.Parameter) and torch.equal(linear.weight, weight)
        assert linear.weight.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
        assert list(linear.state_dict()) == ["weight"]
    with torch.no_grad():
        fused[D:D + 2 * DK] = 0  # k's rows, written through the fused matrix
    assert not k.weight.any() and torch.equal(q.weight, weights[0]) and torch.equal(v.weight, weights[2])


def test_fuse_weights_by_rows_keeps_the_rows_layout():
    torch.manual_seed(0)
    w1, w3 = Linear(D, DFF), Linear(D, DFF)
    weights = [w1.weight.detach().clone(), w3.weight.detach().clone()]
    fused = fuse_weights(w1, w3, by_columns=False)
    assert fused.is_contiguous() and torch.equal(fused, torch.cat(weights))
    assert w1.weight.is_contiguous() and w3.weight.data_ptr() == fused[DFF:].data_ptr()


# --- Step 4: split_qkv against notebook 08's split of separate projections ------------------------------------------

@pytest.mark.parametrize("lead", [(), (2,), (2, 3)], ids=str)
@pytest.mark.parametrize("kv", [4, 2, 1], ids=["MHA", "GQA-2", "GQA-1"])
def test_split_qkv_equals_notebook_08s_split_of_separate_projections(lead, kv):
    x = randn(*lead, 5, D, dtype=torch.float64)
    wq, wk, wv = randn(D, D, seed=1), randn(kv * DK, D, seed=2), randn(kv * DK, D, seed=3)
    wq, wk, wv = (w.double() for w in (wq, wk, wv))
    qkv = x @ torch.cat([wq, wk, wv]).T
    q, k, v = split_qkv(qkv, H, kv)
    assert torch.allclose(q, _split_heads(x @ wq.T, H), rtol=0, atol=1e-12)
    assert torch.allclose(k, _split_heads(x @ wk.T, kv), rtol=0, atol=1e-12)
    assert torch.allclose(v, _split_heads(x @ wv.T, kv), rtol=0, atol=1e-12)
    assert all(t.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr() for t in (q, k, v))  # views


# --- Steps 5 and 6: quantize_int8 and int8_matmul -----------------------------------------------------------------

def test_quantize_int8_by_hand():
    weight = torch.tensor([[2.54, -1.0, 0.26], [0.0, 0.0, 0.0], [-0.5, 0.2, 0.1]])
    q, scale = quantize_int8(weight)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    assert q.tolist() == [[127, -50, 13], [0, 0, 0], [-127, 51, 25]]  # 0.2·127/0.5 = 50.8, 0.1·127/0.5 = 25.4
    torch.testing.assert_close(scale, torch.tensor([0.02, 1.0, 0.5 / 127]))  # a row of zeros: scale 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_quantize_int8_reconstructs_within_half_a_step(dtype):
    weight = randn(7, 33, dtype=dtype) * torch.logspace(-2, 1, 7, dtype=dtype)[:, None]
    q, scale = quantize_int8(weight)
    assert q.shape == weight.shape and q.is_contiguous() and scale.shape == (7,) and scale.dtype == torch.float32
    assert q.abs().max() == 127 and (q.abs() <= 127).all()
    error = (q.double() * scale.double()[:, None] - weight.double()).abs()
    assert (error <= scale.double()[:, None] / 2 * (1 + 1e-5)).all()
    column = weight.T.contiguous().T  # a fused matrix's layout: the same numbers, q contiguous still
    q2, scale2 = quantize_int8(column)
    assert q2.is_contiguous() and torch.equal(q2, q) and torch.equal(scale2, scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_int8_matmul_equals_the_dequantized_product_in_float64(dtype):
    q, scale = quantize_int8(randn(6, 16, seed=1))
    x = randn(2, 3, 16, dtype=dtype)
    out = int8_matmul(x, q, scale)
    expected = x.double() @ (q.double() * scale.double()[:, None]).T
    assert out.dtype == dtype and out.shape == (2, 3, 6)
    tolerance = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), expected, **tolerance)


def test_int8_linear_kernel_and_fallback_agree():
    """float32 goes through PyTorch's int8 kernel (on bfloat16 rows), float64 through Step 6: both give x (q · scale)ᵀ,
    the kernel to bfloat16's precision; more than KERNEL_ROWS float32 vectors take Step 6, to float32's."""
    weight = randn(6, 16, seed=2)
    layer = Int8Linear(weight)
    assert {name: (b.dtype, tuple(b.shape)) for name, b in layer.named_buffers()} == {
        "weight": (torch.int8, (6, 16)), "scale": (torch.float32, (6,))}
    assert not list(layer.parameters()) and set(layer.state_dict()) == {"weight", "scale"}
    x = randn(2, 3, 16, seed=3)
    dequantized = x.double() @ (layer.weight.double() * layer.scale.double()[:, None]).T
    kernel, fallback = layer(x), layer(x.double())
    assert kernel.dtype == torch.float32 and fallback.dtype == torch.float64
    torch.testing.assert_close(fallback, dequantized, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(kernel.double(), dequantized, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(layer(x.bfloat16()).double(), dequantized, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(layer(x.bfloat16()), kernel.bfloat16(), rtol=0, atol=0)  # the same bfloat16 rows
    column = Int8Linear(weight.T.contiguous().T)  # a fused matrix's layout
    torch.testing.assert_close(column(x), kernel)
    prefill = randn(KERNEL_ROWS + 3, 16, seed=4)  # more vectors than the kernel takes: Step 6
    torch.testing.assert_close(layer(prefill).double(), prefill.double() @ (
        layer.weight.double() * layer.scale.double()[:, None]).T, rtol=1e-5, atol=1e-5)


def test_int8_linear_takes_a_single_vector():
    layer = Int8Linear(randn(6, 16))
    x = randn(16)
    torch.testing.assert_close(layer(x), layer(x.unsqueeze(0))[0])


def test_int8_linear_takes_bfloat16_of_any_width():
    """torch 2.13's int8 kernel crashed the process on bfloat16 rows of 6 (an AMD EPYC), and of 8, 24, 40 or 56 (an
    Intel Xeon with AVX-512 and AMX), for 1 to 8 rows: Int8Linear keeps it to multiples of 16. In a process of its own,
    so a crash fails this test, not the run."""
    code = ("import torch; from transformer_from_scratch.fast_decode import Int8Linear\n"
            "for width in (6, 8, 24, 40, 56):\n"
            "    for rows in (1, 2, 5, 8):\n"
            "        Int8Linear(torch.randn(7, width))(torch.randn(rows, width, dtype=torch.bfloat16))\n"
            "print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"exit code {result.returncode}: {result.stderr[-300:]}"


# --- the fused modules against the originals ---------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("kv", [None, 2], ids=["MHA", "GQA"])
@pytest.mark.parametrize("by_columns", [True, False], ids=["columns", "rows"])
def test_fused_self_attention_equals_the_original(by_columns, kv, dtype, device):
    torch.manual_seed(0)
    attn = MultiHeadSelfAttention(D, H, CTX, THETA, device=device, dtype=dtype, num_kv_heads=kv)
    original = copy.deepcopy(attn)
    state = {key: t.clone() for key, t in attn.state_dict().items()}
    fused = FusedSelfAttention(attn, by_columns=by_columns)
    assert list(fused.state_dict()) == list(state)
    assert all(torch.equal(fused.state_dict()[key], t) for key, t in state.items())
    assert len({fused.state_dict()[f"{p}_proj.weight"].untyped_storage().data_ptr() for p in "qkv"}) == 1
    assert (fused.state_dict()["q_proj.weight"].stride(0) == 1) == by_columns  # rows of a column-major matrix
    x = randn(2, 7, D, dtype=dtype, device=device)
    positions = torch.tensor([[0, 2, 3, 5, 8, 9, 15], [1, 2, 3, 4, 5, 6, 7]], device=device)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), original(x), **TOLERANCE[dtype])
        torch.testing.assert_close(fused(x, positions), original(x, positions), **TOLERANCE[dtype])
        cache, reference = (KVCache(2, kv or H, CTX, DK, device=device, dtype=dtype) for _ in range(2))
        for start, end in [(0, 3), (3, 4), (4, 5), (5, 7)]:
            torch.testing.assert_close(fused(x[:, start:end], cache=cache),
                                       original(x[:, start:end], cache=reference), **TOLERANCE[dtype])
        torch.testing.assert_close(fused(x[:, :2], positions[:, 3:5]), original(x[:, :2], positions[:, 3:5]),
                                   **TOLERANCE[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("by_columns", [True, False], ids=["columns", "rows"])
def test_fused_swiglu_equals_the_original(by_columns, dtype, device):
    torch.manual_seed(0)
    ffn = SwiGLU(D, DFF, device=device, dtype=dtype)
    original = copy.deepcopy(ffn)
    keys = list(ffn.state_dict())
    fused = FusedSwiGLU(ffn, by_columns=by_columns)
    assert list(fused.state_dict()) == keys
    assert (fused.state_dict()["w1.weight"].stride(0) == 1) == by_columns
    for lead in [(), (3,), (2, 5)]:
        x = randn(*lead, D, dtype=dtype, device=device)
        with torch.no_grad():
            torch.testing.assert_close(fused(x), original(x), **TOLERANCE[dtype])


# --- prepare_for_decode on a small random model -------------------------------------------------------------------

IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8]])


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("dtype, layout", [(torch.float32, "columns"), (torch.float64, "columns"),
                                           (torch.float32, "rows"), (torch.float32, "auto")],
                         ids=["float32-columns", "float64-columns", "float32-rows", "float32-auto"])
def test_prepare_for_decode_is_the_same_function(tied, dtype, layout):
    model = lm(tied=tied, dtype=dtype, kv=2)
    plain = copy.deepcopy(model)
    state = {key: t.clone() for key, t in model.state_dict().items()}
    prompt = torch.tensor([3, 1, 4])
    want = generate(plain, prompt, 18, temperature=0)  # past the context of 16: the window slides
    assert prepare_for_decode(model, layout=layout) is model
    assert all(isinstance(block.attn, FusedSelfAttention) and isinstance(block.ffn, FusedSwiGLU)
               for block in model.layers)
    assert list(model.state_dict()) == list(state)
    assert all(torch.equal(model.state_dict()[key], t) for key, t in state.items())
    by_columns = model.state_dict()["layers.0.attn.q_proj.weight"].stride(0) == 1
    assert by_columns == (layout == "columns") or layout == "auto"  # auto: the faster on this machine
    for key in ("lm_head.weight", "layers.0.ffn.w1.weight", "layers.1.attn.k_proj.weight"):
        assert (model.state_dict()[key].stride(0) == 1) == by_columns, key  # one layout for all
    if tied:
        assert model.lm_head.weight is model.token_embeddings.weight
    with torch.no_grad():
        torch.testing.assert_close(model(IDS), plain(IDS), **TOLERANCE[dtype])
    assert torch.equal(generate(model, prompt, 18, temperature=0), want)
    modules = [(block.attn, block.ffn) for block in model.layers]
    assert prepare_for_decode(model, layout=layout) is model  # again: nothing changes
    assert [(block.attn, block.ffn) for block in model.layers] == modules
    with torch.no_grad():
        torch.testing.assert_close(model(IDS), plain(IDS), **TOLERANCE[dtype])


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_prepare_for_decode_int8_stays_close(tied, fuse):
    model = lm(tied=tied, kv=2, seed=1)
    with torch.no_grad():
        want = model(IDS)
    prepare_for_decode(model, fuse=fuse, int8=True)
    floats = [name for name, t in model.state_dict().items() if t.is_floating_point() and t.ndim == 2]
    assert floats == ["token_embeddings.weight"]  # every other matrix int8, the table whole
    with torch.no_grad():
        got = model(IDS)
        assert (got - want).abs().max() < 0.05 * want.std()
        prepare_for_decode(model, fuse=fuse, int8=True)  # again: nothing changes
        assert torch.equal(model(IDS), got)
    assert len(generate(model, torch.tensor([3, 1, 4]), 6, temperature=0)) == 6  # decodes, with its cache


def test_prepare_for_decode_sets_the_threads():
    threads = torch.get_num_threads()
    try:
        prepare_for_decode(lm(), threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="threads must be an int >= 1 or None"):
            prepare_for_decode(lm(), threads=bad)


# --- SmolLM2, the real weights ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    from transformer_from_scratch.pretrained import load_gguf
    from transformer_from_scratch.weights import gguf_path
    try:
        path = gguf_path()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    return load_gguf(path)


def test_smollm2_greedy_reply_is_unchanged_by_prepare_for_decode(smollm2):
    """The fused model decodes 32 greedy tokens of a ChatML prompt; the plain model, teacher-forced on them in one
    forward, picks the same token at every step (the same greedy reply, at a fraction of a second decode's cost)."""
    from transformer_from_scratch.pretrained import chat_prompt, default_system
    model, tokenizer = smollm2
    prompt = chat_prompt([{"role": "user", "content": "What is the capital of France?"}],
                         default_system(tokenizer.chat_template))
    ids = torch.tensor(tokenizer.encode(prompt))
    fused = prepare_for_decode(copy.deepcopy(model))
    assert fused.lm_head.weight is fused.token_embeddings.weight and list(fused.state_dict()) == list(
        model.state_dict())
    reply = generate(fused, ids, 32, temperature=0)
    with torch.no_grad():
        logits = model(torch.cat([ids, reply[:-1]]).unsqueeze(0))[0, len(ids) - 1:]
    assert torch.equal(logits.argmax(-1), reply)
    assert tokenizer.decode(reply.tolist()).startswith("The capital of France is Paris.")


# --- compile=True: static_step (Step 7's fixed shapes), eager and compiled ----------------------------------------

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_static_step_gives_the_prepared_models_logits(dtype):
    """static_step (full cache buffers, Step 7's mask, the position as a tensor) gives, eagerly, at every position after
    a prompt, the logits of the same model's forward with notebook 12's cache, and leaves the same keys in the
    buffers, although they start full of stale numbers (grouped heads, so enable_gqa is exercised)."""
    model = prepare_for_decode(lm(dtype=dtype, kv=2, seed=3))
    ids = torch.tensor([1, 5, 2, 7, 3, 11, 4, 9, 0, 12])
    prompt = 4
    theirs, ours = KVCache.for_model(model, max_seq_len=len(ids)), KVCache.for_model(model, max_seq_len=len(ids))
    for cache in ours:
        cache.keys.normal_(0, 100), cache.values.normal_(0, 100)  # what a reset() cache keeps from a longer text
    with torch.no_grad():
        model(ids[None, :prompt], cache=theirs)
        model(ids[None, :prompt], cache=ours)
        for position in range(prompt, len(ids)):
            expected = model(ids[None, position:position + 1], cache=theirs)[0]
            logits = static_step(model, ids[position:position + 1], torch.tensor([position]),
                                 [cache.keys for cache in ours], [cache.values for cache in ours])
            torch.testing.assert_close(logits, expected, **TOLERANCE[dtype])
    torch.testing.assert_close(ours[0].keys, theirs[0].keys, **TOLERANCE[dtype])


def test_compile_gives_generates_tokens_and_compiles_once():
    """prepare_for_decode(compile=True): generate's greedy ids equal the plain model's, for three prompt and reply
    lengths (so three cache lengths, the first equal to the number of key/value heads, which dynamic=True would have
    tied to it: one compilation serves all, none is added), and for a deepcopy of the model, whose forward is its own.
    The model's other calls (a prompt, no cache) run its own forward."""
    plain = lm(seed=5)  # 4 key/value heads
    model = prepare_for_decode(copy.deepcopy(plain), compile=True)
    assert prepare_for_decode(model, compile=True).forward.__func__ is model.forward.__func__  # again: unchanged
    torch._dynamo.reset()
    counts = torch._dynamo.utils.counters
    counts.clear()
    for prompt, new in (([1, 2], 2), ([1, 2, 3], 10), ([4, 5, 6, 7, 8], 7)):  # first a length of 4, the heads' number
        expected = generate(plain, torch.tensor(prompt), new, temperature=0)
        assert generate(model, torch.tensor(prompt), new, temperature=0).tolist() == expected.tolist()
    assert counts["stats"]["unique_graphs"] == 1, dict(counts["stats"])
    twin = copy.deepcopy(model)
    assert twin.forward.__self__ is twin
    expected = generate(plain, torch.tensor([9, 1]), 6, temperature=0)
    assert generate(twin, torch.tensor([9, 1]), 6, temperature=0).tolist() == expected.tolist()
    torch.testing.assert_close(model(torch.tensor([[1, 2, 3]])), plain(torch.tensor([[1, 2, 3]])))
    with pytest.raises(ValueError, match=f"got ids from {V} to {V}"):  # a prompt of one id: the model's own checks
        generate(model, torch.tensor([V]), 2, temperature=0)

def test_a_step_that_is_not_one_graph_says_so(monkeypatch):
    """A learner's static_step that runs but that dynamo cannot trace whole (a print in it): the compiled forward runs
    it once as written, then raises one RuntimeError that names the reason, not dynamo's page."""
    import transformer_from_scratch.fast_decode as fast_decode

    written = fast_decode.static_step

    def chatty_step(model, token, position, keys, values):
        print("step at", position)
        return written(model, token, position, keys, values)

    monkeypatch.setattr(fast_decode, "static_step", chatty_step)
    monkeypatch.setattr(fast_decode, "_compiled_steps", {})  # compiled anew, from the step above
    model = prepare_for_decode(lm(), compile=True)
    with pytest.raises(RuntimeError, match=r"static_step runs, but torch.compile cannot make it one graph: Failed to "
                                           r"trace builtin operator .*`print`.* Keep it to tensor operations"):
        generate(model, torch.tensor([1, 2]), 2, temperature=0)


def test_compile_needs_fuse():
    with pytest.raises(ValueError, match="compile=True compiles the fused step: it needs fuse=True"):
        prepare_for_decode(lm(), fuse=False, compile=True)


# --- compile=True with int8: inductor's C++ int8 kernel on bfloat16 inputs ----------------------------------------

def wide_lm(seed):
    """Widths that are multiples of 16 (d_model 64, d_ff 128), so that the int8 kernel serves every product."""
    torch.manual_seed(seed)
    return TransformerLM(61, 32, 64, 2, 4, 128, THETA, num_kv_heads=2)


def test_int8_linear_rounds_the_kernels_rows_to_bfloat16():
    """The kernel's fast path takes bfloat16 rows: a few float32 vectors are rounded to bfloat16 for it, written out by
    hand in float64 here, the result in float32, and a difference 1.0 - 1.003 that the rounding makes exactly 0; more
    than KERNEL_ROWS vectors (a prefill) take Step 6 in float32 (-0.003). The state dict keeps its two buffers."""
    layer = Int8Linear(randn(256, 64, seed=1))
    assert set(layer.state_dict()) == {"weight", "scale"}
    x = randn(3, 64, seed=4)
    rounded = x.to(torch.bfloat16).double() @ layer.weight.double().T * layer.scale.to(torch.bfloat16).double()
    out = layer(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), rounded, rtol=1e-2, atol=1e-2)  # the kernel's bfloat16 result
    exact = x.double() @ (layer.weight.double() * layer.scale.double()[:, None]).T
    assert (out.double() - exact).abs().max() > 1e-4  # not float32's product
    with torch.no_grad():  # every row x0 - x1: 1.0 - 1.003 in float32, 1.0 - 1.0 = 0 once x is rounded to bfloat16
        layer.weight.zero_()
        layer.weight[:, :2] = torch.tensor([127, -127], dtype=torch.int8)
        layer.scale.fill_(1 / 127)
    close = torch.zeros(KERNEL_ROWS + 1, 64)
    close[:, :2] = torch.tensor([1.0, 1.003])
    assert layer(close[:1]).abs().max() == 0
    torch.testing.assert_close(layer(close), torch.full((KERNEL_ROWS + 1, 256), -0.003), rtol=1e-3, atol=1e-6)


def compiled_steps_logits(model, ids, prompt):
    """The logits of each one-token step after `prompt` ids of `ids`, as generate's steps call the model: a cache,
    inside trusted() (the inputs checked by the caller), one id at a time (the compiled step, for a model prepared
    with compile=True)."""
    from transformer_from_scratch.shapes import trusted

    cache = KVCache.for_model(model, max_seq_len=len(ids))
    with torch.no_grad(), trusted():
        model(ids[None, :prompt], cache=cache)
        return torch.cat([model(ids[None, i:i + 1], cache=cache)[0] for i in range(prompt, len(ids))])


def test_compile_with_int8_gives_each_models_logits():
    """prepare_for_decode(int8=True, compile=True) on two models of different weights, stepped in turn through the one
    int8 step (the weights frozen into it): each step's logits are its own eager int8 model's (whose prefill of 12
    ids takes Step 6, without the kernel's bfloat16 roundings: measured 0.02 at most; 0.06 allowed), while the two models' logits differ by
    far more, so the frozen weights of one never serve the other."""
    import transformer_from_scratch.fast_decode as fast_decode

    ids = torch.tensor([1, 2, 3, 7, 8, 40, 13, 5, 60, 21, 33, 2])
    eager = [prepare_for_decode(wide_lm(seed), int8=True) for seed in (1, 2)]
    compiled = [prepare_for_decode(wide_lm(seed), int8=True, compile=True) for seed in (1, 2)]
    with torch.no_grad():
        expected = [model(ids[None])[0, 3:] for model in eager]  # at positions 3 to 11, those of the steps
    assert (expected[0] - expected[1]).abs().max() > 1.0
    for _ in range(2):  # the second time, both models' steps are compiled already
        for model, logits in zip(compiled, expected):
            torch.testing.assert_close(compiled_steps_logits(model, ids, 3), logits, rtol=0, atol=0.06)
    assert "int8" in fast_decode._compiled_steps  # the int8 step, with its options, not the float one

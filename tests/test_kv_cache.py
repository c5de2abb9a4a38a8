"""The KV cache (notebook 12), used through the hooks of notebooks 08-10 (the attention's, block's and model's
`cache=`): cached logits equal the model's on the whole sequence, with multi-head and grouped-query attention;
generate with the cache equals generate without it (greedy, sampled, past the context where the window slides); the
cache holds the key/value heads only; and bad input gets an error that names the numbers."""

import pytest
import torch
from conftest import DEVICES

import transformer_from_scratch as tfs
from transformer_from_scratch import KVCache, MultiHeadSelfAttention, TransformerLM, generate
from transformer_from_scratch.reference import ReferenceLM, greedy_decode_with_cache

V, CTX, D, L, H, DFF = 23, 12, 16, 2, 4, 24


@pytest.fixture
def fast():
    """The numerics tests run with the run-time shape checks off (the same numbers, a fraction of the time)."""
    with tfs.shape_checks(False):
        yield


def make(dtype=torch.float32, device="cpu", fused=False, seed=0, num_kv_heads=None):
    torch.manual_seed(seed)
    return TransformerLM(V, CTX, D, L, H, DFF, 10000.0, device=device, dtype=dtype, fused=fused,
                         num_kv_heads=num_kv_heads)


def uncached(model, prompt, n, **kwargs):
    return generate(model, prompt, n, use_cache=False, **kwargs)


def fed(model, ids, chunks):
    """The logits of ids (batch, seq) from the model with one cache per block, fed in chunks."""
    caches = KVCache.for_model(model, ids.shape[0])
    outs, start = [], 0
    for n in chunks:
        outs.append(model(ids[:, start:start + n], cache=caches))
        start += n
    assert caches[0].length == start
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("fused", [False, True], ids=["from scratch", "fused"])
@pytest.mark.parametrize("num_kv_heads", [H, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_cached_logits_equal_the_whole_sequence_for_every_prompt_length(dtype, tolerance, fused, num_kv_heads, fast):
    model = make(dtype, fused=fused, num_kv_heads=num_kv_heads)
    ids = torch.randint(0, V, (2, CTX), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids)
        for prompt in range(1, CTX + 1):
            got = fed(model, ids, [prompt] + [1] * (CTX - prompt))
            assert (got - expected).abs().max().item() <= tolerance, prompt
        got = fed(model, ids, [3, 1, 4, 2, 2])  # chunks after cached positions: the mask's offset
        assert (got - expected).abs().max().item() <= tolerance


@pytest.mark.parametrize("num_kv_heads", [H, 2], ids=["MHA", "GQA"])
def test_the_attention_with_a_cache_equals_its_rows_and_stores_the_kv_heads_only(num_kv_heads):
    model = make(torch.float64, num_kv_heads=num_kv_heads)
    attn = model.layers[0].attn
    x = torch.randn(3, 7, D, dtype=torch.float64)
    cache = KVCache(3, num_kv_heads, CTX, D // H, dtype=torch.float64)
    with torch.no_grad():
        out = torch.cat([attn(x[:, :4], cache=cache), attn(x[:, 4:], cache=cache)], dim=1)
        torch.testing.assert_close(out, attn(x), rtol=0, atol=1e-12)
    assert cache.length == 7 and cache.keys.shape == (3, num_kv_heads, CTX, D // H)


def test_a_cache_of_the_repeated_heads_is_refused():
    """The cache must hold the key/value heads: one made for every query head does not fit what attention stores."""
    attn = MultiHeadSelfAttention(D, H, CTX, 10000.0, num_kv_heads=2)
    with pytest.raises(ValueError, match=r"k and v of shape \(batch, heads, new, d_k\) = \(1, 4, new, 4\)"):
        attn(torch.randn(1, 3, D), cache=KVCache(1, H, CTX, D // H))


def test_the_cache_hook_takes_any_object_with_length_and_update():
    """Notebook 08's contract, which a learner's 08 and 12 meet: `length`, and `update(k, v)` returning all so far."""
    class Concat:
        length, keys, values = 0, None, None

        def update(self, k, v):
            self.keys = k if self.keys is None else torch.cat([self.keys, k], dim=-2)
            self.values = v if self.values is None else torch.cat([self.values, v], dim=-2)
            self.length = self.keys.shape[-2]
            return self.keys, self.values

    attn = MultiHeadSelfAttention(D, H, CTX, 10000.0, num_kv_heads=1, dtype=torch.float64)
    x, cache = torch.randn(2, 6, D, dtype=torch.float64), Concat()
    rows = [attn(x[:, i:i + 1], cache=cache) for i in range(6)]
    torch.testing.assert_close(torch.cat(rows, dim=1), attn(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("prompt_length", [1, 5, CTX, CTX + 7])
@pytest.mark.parametrize("num_kv_heads", [H, 2], ids=["MHA", "GQA"])
def test_greedy_is_identical_across_the_window_slide(dtype, prompt_length, num_kv_heads, fast):
    model = make(dtype, seed=2, num_kv_heads=num_kv_heads)
    prompt = torch.randint(0, V, (prompt_length,), generator=torch.Generator().manual_seed(prompt_length))
    cached = generate(model, prompt, 2 * CTX, temperature=0)
    assert cached.shape == (2 * CTX,)
    assert torch.equal(cached, uncached(model, prompt, 2 * CTX, temperature=0))


@pytest.mark.parametrize("kwargs", [dict(), dict(temperature=0.7, top_k=5), dict(temperature=1.3, top_p=0.8)])
def test_seeded_samples_are_identical(kwargs, fast):
    model = make(seed=3)
    prompt = torch.tensor([1, 2, 3])
    draw = lambda fn: fn(model, prompt, 2 * CTX, generator=torch.Generator().manual_seed(5), **kwargs)
    assert torch.equal(draw(generate), draw(uncached))


def test_eos_stops_and_zero_tokens_give_nothing():
    model = make(seed=4)
    prompt = torch.tensor([4, 5])
    full = generate(model, prompt, 10, temperature=0)
    stopped = generate(model, prompt, 10, temperature=0, eos_id=full[2].item())
    assert torch.equal(stopped, full[:int((full == full[2]).nonzero()[0]) + 1])
    assert generate(model, prompt, 0).shape == (0,)


def test_generate_uses_the_cache_one_token_per_step():
    model = make(seed=5)
    sizes, calls = [], []
    handles = [model.token_embeddings.register_forward_hook(lambda m, i, o: sizes.append(i[0].shape[-1])),
               model.register_forward_hook(lambda m, i, o: calls.append(1))]
    generate(model, torch.tensor([1, 2, 3, 4]), CTX + 2, temperature=0)
    for handle in handles:
        handle.remove()
    # the prefill (4), one token per step up to the context (8 steps), then the whole window after each slide (5),
    # each through the model's own forward (its cache hook), once per step
    assert sizes == [4] + [1] * (CTX - 4) + [CTX] * 5 and len(calls) == CTX + 2


def test_a_model_without_the_parts_runs_uncached():
    class Fixed(torch.nn.Module):
        context_length = 4

        def forward(self, ids):
            return torch.nn.functional.one_hot((ids + 1) % 6, 6).float()

    assert generate(Fixed(), torch.tensor([0]), 5, temperature=0).tolist() == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("num_kv_heads", [H, 2], ids=["MHA", "GQA"])
def test_the_reference_decode_with_its_cache_agrees(num_kv_heads):
    model = make(seed=6, num_kv_heads=num_kv_heads)
    prompt = torch.randint(0, V, (5,), generator=torch.Generator().manual_seed(0))
    assert torch.equal(greedy_decode_with_cache(ReferenceLM(model), prompt, 2 * CTX),
                       generate(model, prompt, 2 * CTX, temperature=0))


def test_cache_memory_is_two_layers_tokens_width_bytes():
    for dtype, size in [(torch.float32, 4), (torch.float16, 2)]:
        model = TransformerLM(V, 4096, 4096, 32, 32, 11008, 10000.0, device="meta", dtype=dtype)  # Llama 2 7B's sizes
        caches = KVCache.for_model(model, batch=2)
        assert sum(cache.nbytes for cache in caches) == 2 * 32 * 4096 * 4096 * size * 2
    # Llama 2 70B's grouping: 64 query heads, 8 key/value heads of 128: the cache is 8 times smaller
    grouped = TransformerLM(V, 4096, 8192, 80, 64, 28672, 10000.0, device="meta", dtype=torch.float16, num_kv_heads=8)
    assert sum(cache.nbytes for cache in KVCache.for_model(grouped)) == 2 * 80 * 4096 * 8 * 128 * 2


@pytest.mark.parametrize("device", DEVICES)
def test_on_every_device(device):
    model = make(device=device, seed=7)
    prompt = torch.tensor([3, 1], device=device)
    out = generate(model, prompt, CTX + 3, temperature=0)
    assert out.device == prompt.device and torch.equal(out, uncached(model, prompt, CTX + 3, temperature=0))


@pytest.mark.parametrize("checks", [False, True], ids=["shape checks off", "on"])
def test_bad_input_is_named(checks):
    """The explicit checks stay on without the run-time shape checks; with them, jaxtyping may speak first."""
    with tfs.shape_checks(checks):
        _bad_inputs(checks)


def _bad_inputs(checks):
    model = make()
    caches = KVCache.for_model(model)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 22\]"):
        model(torch.tensor([[1, V]]), cache=caches)
    with pytest.raises(TypeError, match="token_ids is f32" if checks else "integer token ids"):
        model(torch.tensor([[1.0, 2.0]]), cache=caches)
    with pytest.raises(ValueError, match="one per block, all of one length: 2 blocks, 1 caches"):
        model(torch.tensor([[1, 2]]), cache=caches[:1])
    with pytest.raises(ValueError, match=r"= \(1, 4, new, 4\), got k \(2, 4, 1, 4\)"):
        model(torch.tensor([[1], [2]]), cache=caches)
    for cache in caches:
        cache.reset()
    model(torch.zeros(1, CTX - 1, dtype=torch.long), cache=caches)
    with pytest.raises(ValueError, match="the sequence has 2 tokens after 11 cached positions, more than "
                                         "context_length=12"):
        model(torch.tensor([[1, 2]]), cache=caches)
    caches[0].reset()
    with pytest.raises(ValueError, match=r"2 blocks, 2 caches holding \[0, 11\] positions"):
        model(torch.tensor([[1]]), cache=caches)
    cache = KVCache(1, 2, 3, 4)
    with pytest.raises(ValueError, match="do not fit after the 0 cached ones"):
        cache.update(torch.zeros(1, 2, 4, 4), torch.zeros(1, 2, 4, 4))
    with pytest.raises(ValueError, match=r"k and v of shape \(batch, heads, new, d_k\) = \(1, 2, new, 4\)"):
        cache.update(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))
    with pytest.raises(ValueError, match="every size must be >= 1"):
        KVCache(1, 0, 3, 4)
    with pytest.raises(ValueError, match="non-empty sequence"):
        generate(model, torch.tensor([], dtype=torch.long), 3)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        generate(model, torch.tensor([1]), 3, temperature=-1.0)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        generate(model, torch.tensor([1]), -1)


def test_one_generate_decodes_with_the_cache_by_default():
    """One decode loop: the package's generate is transformer_lm's, and its default is the cache."""
    import inspect

    from transformer_from_scratch import transformer_lm
    assert tfs.generate is transformer_lm.generate
    assert inspect.signature(generate).parameters["use_cache"].default is True
    model = make(seed=9)
    sizes = []
    model.token_embeddings.register_forward_hook(lambda m, i, o: sizes.append(i[0].shape[-1]))
    generate(model, torch.tensor([1, 2, 3]), 3, temperature=0)
    assert sizes == [3, 1, 1]


def test_the_steps_skip_the_per_call_checks():
    """generate checks its arguments once; the model's forward and its blocks then trust them (no jaxtyping per call)."""
    from transformer_from_scratch import shapes
    model, depths = make(seed=10), []
    model.layers[0].register_forward_pre_hook(lambda m, i: depths.append(shapes.checking()))
    generate(model, torch.tensor([1, 2]), 2, temperature=0)
    model(torch.tensor([[1, 2]]))
    assert depths == [False, False, False] and shapes.checking()


def test_shape_checks_off_gives_the_same_ids():
    model = make(seed=8)
    prompt = torch.tensor([2, 7, 1])
    with tfs.shape_checks(False):
        off = generate(model, prompt, CTX, temperature=0)
    assert torch.equal(off, generate(model, prompt, CTX, temperature=0))


def test_a_cached_step_reads_the_device_once_whatever_the_depth():
    """The ids' range, the embedding's check; none per layer: RoPE gets range(start, start + n)."""
    reads = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            reads.extend([func] if getattr(func, "__name__", "") in ("tolist", "item") else [])
            return func(*args, **(kwargs or {}))

    model = make()
    caches = KVCache.for_model(model)
    ids = torch.randint(0, model.vocab_size, (1, 6), generator=torch.Generator().manual_seed(0))
    with Spy():
        model(ids[:, :5], cache=caches)
    assert len(reads) == 1 and len(model.layers) > 1
    with Spy():
        model(ids[:, 5:], cache=caches)
    assert len(reads) == 2


def test_trusted_is_per_thread():
    """A model's trusted() block skips the checks of its own thread only: another thread's calls keep theirs."""
    import threading

    from transformer_from_scratch import shapes
    seen = []
    with shapes.trusted():
        thread = threading.Thread(target=lambda: seen.append(shapes.checking()))
        thread.start()
        thread.join()
        assert not shapes.checking()
    assert seen == [True] and shapes.checking()

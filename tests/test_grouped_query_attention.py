"""Grouped-query attention (notebook 08's Step 6, `num_kv_heads`): against the reference (which hands the grouping to
PyTorch's `enable_gqa`), against multi-head attention with tied key/value heads (which pins which query heads each
key/value head serves), the state dict of `num_kv_heads == num_heads` (today's checkpoints load strictly), the
parameter and FLOP counts, and the errors."""

import pytest
import torch
from conftest import DEVICES
from torch.utils.flop_counter import FlopCounterMode

from transformer_from_scratch import MultiHeadSelfAttention, TransformerBlock, TransformerLM, count_resources
from transformer_from_scratch.reference import multihead_self_attention as reference_attention
from transformer_from_scratch.reference import transformer_lm as reference_lm

D, H, THETA, SEQ = 24, 6, 10000.0, 16


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kv_heads", [1, 2, 3, 6])
@pytest.mark.parametrize("fused", [False, True], ids=["from scratch", "fused"])
def test_matches_the_reference(device, dtype, kv_heads, fused):
    """On the device, against the reference computed on the CPU from the same weights."""
    torch.manual_seed(kv_heads)
    attn = MultiHeadSelfAttention(D, H, SEQ, THETA, dtype=dtype, fused=fused, num_kv_heads=kv_heads, device=device)
    weights = {name: w.cpu() for name, w in attn.state_dict().items()}
    for leading in [(), (3,), (2, 2)]:
        x = torch.randn(*leading, 7, D, dtype=dtype)
        torch.testing.assert_close(attn(x.to(device)).cpu(), reference_attention(x, weights, H, THETA))
    x = torch.randn(2, 5, D, dtype=dtype)
    positions = torch.tensor([[0, 1, 2, 0, 1], [2, 3, 7, 8, 15]])
    torch.testing.assert_close(attn(x.to(device), positions.to(device)).cpu(),
                               reference_attention(x, weights, H, THETA, positions))


@pytest.mark.parametrize("kv_heads", [1, 2, 3])
def test_key_value_head_j_serves_query_heads_j_g_to_j_g_plus_g_minus_1(kv_heads):
    """GQA is MHA whose key/value heads within a group are tied: MHA's k_proj and v_proj rows of query head h are the
    grouped module's rows of head h // g. Repeating the wrong axis (0, 1, 0, 1) or sharing one head fails this."""
    torch.manual_seed(0)
    group, d_k = H // kv_heads, D // H
    grouped = MultiHeadSelfAttention(D, H, SEQ, THETA, dtype=torch.float64, num_kv_heads=kv_heads)
    full = MultiHeadSelfAttention(D, H, SEQ, THETA, dtype=torch.float64)
    state = grouped.state_dict()
    for name in ("k_proj.weight", "v_proj.weight"):
        state[name] = state[name].unflatten(0, (kv_heads, d_k)).repeat_interleave(group, dim=0).flatten(0, 1)
    full.load_state_dict(state, strict=True)
    x = torch.randn(2, 9, D, dtype=torch.float64)
    torch.testing.assert_close(grouped(x), full(x), rtol=0, atol=1e-12)


def test_projections_have_the_key_value_heads_only():
    attn = MultiHeadSelfAttention(576, 9, num_kv_heads=3, device="meta")  # SmolLM2-135M's attention
    shapes = {name: tuple(p.shape) for name, p in attn.named_parameters()}
    assert shapes == {"q_proj.weight": (576, 576), "k_proj.weight": (192, 576), "v_proj.weight": (192, 576),
                      "output_proj.weight": (576, 576)}
    assert "num_kv_heads=3" in repr(attn)


def test_num_kv_heads_equal_to_num_heads_is_todays_model_and_loads_its_checkpoints_strictly():
    torch.manual_seed(1)
    today = TransformerLM(40, SEQ, D, 2, H, 64, THETA)
    same = TransformerLM(40, SEQ, D, 2, H, 64, THETA, num_kv_heads=H)
    assert {k: v.shape for k, v in same.state_dict().items()} == {k: v.shape for k, v in today.state_dict().items()}
    same.load_state_dict(today.state_dict(), strict=True)
    ids = torch.randint(0, 40, (2, SEQ))
    assert torch.equal(same(ids), today(ids))


def test_the_model_with_grouped_heads_matches_the_reference():
    torch.manual_seed(2)
    model = TransformerLM(40, SEQ, D, 2, H, 64, THETA, dtype=torch.float64, num_kv_heads=2)
    ids = torch.randint(0, 40, (3, SEQ))
    torch.testing.assert_close(model(ids), reference_lm(ids, model.state_dict(), H, THETA))


def test_gradients_match_finite_differences():
    attn = MultiHeadSelfAttention(8, 4, 8, THETA, dtype=torch.float64, num_kv_heads=2)
    x = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(attn, (x,))


@pytest.mark.parametrize("kv_heads", [1, 3, 9])
def test_count_resources_counts_the_grouped_projections(kv_heads):
    config = dict(vocab_size=100, context_length=32, d_model=72, num_layers=2, num_heads=9, d_ff=192)
    counted = count_resources(**config, num_kv_heads=kv_heads)
    model = TransformerLM(**config, rope_theta=THETA, num_kv_heads=kv_heads)
    assert counted["parameters"]["total"] == sum(p.numel() for p in model.parameters())
    assert counted["parameters"]["attention"] == sum(p.numel() for n, p in model.named_parameters() if ".attn." in n)
    with FlopCounterMode(display=False) as flops:
        model(torch.zeros(1, 32, dtype=torch.long))
    assert counted["flops"]["total"] == flops.get_total_flops()
    assert count_resources(**config) == count_resources(**config, num_kv_heads=9)


def test_norm_eps_reaches_every_norm():
    model = TransformerLM(40, SEQ, D, 2, H, 64, THETA, norm_eps=1e-6)
    assert {m.eps for n, m in model.named_modules() if n.endswith(("ln1", "ln2", "ln_final"))} == {1e-6}
    assert TransformerBlock(D, H, 64, SEQ, THETA).ln1.eps == 1e-5


@pytest.mark.parametrize("kv_heads", [0, 4, 7])
def test_a_num_kv_heads_that_does_not_divide_num_heads_is_refused(kv_heads):
    with pytest.raises(ValueError, match=f"num_kv_heads must divide num_heads .* got num_heads=6, num_kv_heads={kv_heads}"):
        MultiHeadSelfAttention(D, H, num_kv_heads=kv_heads)
    with pytest.raises(ValueError, match=f"num_kv_heads={kv_heads}"):
        count_resources(100, 32, D, 1, H, 64, num_kv_heads=kv_heads)


# ---- notebook 08's Step 6 check: each planted mistake caught with its own message ------------------------------------

from transformer_from_scratch.checks.steps.multihead_attention import check_repeat_kv  # noqa: E402

REPEAT_MISTAKES = {
    "tiled (0, 1, 0, 1)": (lambda t, g: torch.cat([t] * g, dim=-3), "tiled (0, 1, 0, 1)"),
    "one head shared by all": (lambda t, g: t[..., :1, :, :].expand(*t.shape[:-3], t.shape[-3] * g, *t.shape[-2:]),
                               "every query head reads key/value head 0"),
    "copies along the sequence": (lambda t, g: t.repeat_interleave(g, dim=-2), "along the sequence"),
    "copies along the features": (lambda t, g: t.repeat_interleave(g, dim=-1), "along the features"),
    "heads counted from the front": (lambda t, g: t.repeat_interleave(g, dim=1), "counted from the front"),
    "group ignored": (lambda t, g: t, "were not repeated"),
}


@pytest.mark.parametrize("name", REPEAT_MISTAKES)
def test_check_repeat_kv_names_each_mistake(name):
    wrong, phrase = REPEAT_MISTAKES[name]
    with pytest.raises(AssertionError) as caught:
        check_repeat_kv(wrong)
    assert phrase in str(caught.value).splitlines()[0]


@pytest.mark.parametrize("right", [lambda t, g: t.repeat_interleave(g, dim=-3),
                                   lambda t, g: t.unsqueeze(-3).expand(*t.shape[:-2], g, *t.shape[-2:]).flatten(-4, -3)],
                         ids=["repeat_interleave", "expand"])
def test_check_repeat_kv_passes_right_answers(right, capsys):
    check_repeat_kv(right)
    assert capsys.readouterr().out.startswith("✓ repeat_kv")


# ---- the component check's grouped-query and cache parts: each planted mistake caught with its own message ---------

import torch.nn.functional as F  # noqa: E402

from transformer_from_scratch import Linear, scaled_dot_product_attention  # noqa: E402
from transformer_from_scratch.checks import check_multihead_self_attention  # noqa: E402
from transformer_from_scratch.multihead_attention import _merge_heads, _split_heads  # noqa: E402


def mutant(*, order="in place", kv_proj_full=False, store_repeated=False, restart=False, top_left=False,
           skip_update=False):
    """The course's attention, rewritten with one mistake switched on."""
    class Attention(MultiHeadSelfAttention):
        def __init__(self, d_model, num_heads, max_seq_len=None, theta=None, device=None, dtype=None, *, fused=False,
                     num_kv_heads=None):
            super().__init__(d_model, num_heads, max_seq_len, theta, device, dtype, fused=fused,
                             num_kv_heads=num_kv_heads)
            if kv_proj_full:
                like = dict(device=self.q_proj.weight.device, dtype=self.q_proj.weight.dtype)
                self.k_proj, self.v_proj = Linear(self.d_model, self.d_model, **like), Linear(self.d_model, self.d_model, **like)

        def forward(self, x, token_positions=None, *, cache=None):
            past = 0 if cache is None or restart else cache.length
            kv = self.d_model // self.d_k if kv_proj_full else self.num_kv_heads
            group = self.num_heads // kv
            q = _split_heads(self.q_proj(x), self.num_heads)
            k, v = _split_heads(self.k_proj(x), kv), _split_heads(self.v_proj(x), kv)
            if self.rope is not None:
                positions = range(past, past + x.shape[-2]) if token_positions is None else token_positions.unsqueeze(-2)
                q, k = self.rope(q, positions), self.rope(k, positions)

            def repeat(t):
                if order == "tiled":
                    return torch.cat([t] * group, dim=-3)
                if order == "first" and group > 1:
                    return t[..., :1, :, :].expand(*t.shape[:-3], t.shape[-3] * group, *t.shape[-2:])
                return t.repeat_interleave(group, dim=-3)

            if store_repeated:
                k, v = repeat(k), repeat(v)
            if cache is not None and not skip_update:
                k, v = cache.update(k, v)
            if not store_repeated:
                k, v = repeat(k), repeat(v)
            new, total = q.shape[-2], k.shape[-2]
            mask = torch.ones(new, total, dtype=torch.bool, device=x.device).tril(diagonal=0 if top_left else total - new)
            return self.output_proj(_merge_heads(scaled_dot_product_attention(q, k, v, mask)))

    return Attention


COMPONENT_MISTAKES = {
    "tiled heads": (dict(order="tiled"), "tiled (0, 1, 0, 1"),
    "one head for all": (dict(order="first"), "every query head reads key/value head 0"),
    "k and v projections of d_model rows": (dict(kv_proj_full=True), "k_proj and v_proj map d_model to num_kv_heads"),
    "the cache stores the repeated heads": (dict(store_repeated=True), "not the 2 key/value heads"),
    "update never called": (dict(skip_update=True), "did not call cache.update"),
    "positions restart at 0": (dict(restart=True), "as if they started at position 0"),
    "the mask aligned to the first key": (dict(top_left=True), "aligned to the first key"),
}


# ---- check_transformer_lm's keywords and cache parts: each planted mistake caught with its own message -------------

from transformer_from_scratch import RMSNorm  # noqa: E402
from transformer_from_scratch.checks import check_transformer_lm  # noqa: E402
from transformer_from_scratch.shapes import trusted  # noqa: E402


def lm_mutant(*, drop_kv=False, drop_eps=False, cache_mode="right"):
    class LM(TransformerLM):
        def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta, device=None,
                     dtype=None, *, fused=False, num_kv_heads=None, norm_eps=1e-5):
            super().__init__(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta, device,
                             dtype, fused=fused, num_kv_heads=None if drop_kv else num_kv_heads,
                             norm_eps=1e-5 if drop_eps else norm_eps)

        def forward(self, token_ids, token_positions=None, *, cache=None):
            x = self.token_embeddings(token_ids)
            with trusted():
                for i, layer in enumerate(self.layers):
                    given = None if cache is None or cache_mode == "dropped" else (
                        cache[0] if cache_mode == "shared" else cache[i])
                    x = layer(x, token_positions, cache=given)
            return self.lm_head(self.ln_final(x))

    return LM


LM_MUTANTS = {
    "num_kv_heads not passed on": (dict(drop_kv=True), "num_kv_heads is not passed on to the blocks"),
    "norm_eps not passed on": (dict(drop_eps=True), "with another ε"),
    "caches never handed down": (dict(cache_mode="dropped"), "the caches stay empty"),
    "one cache for every block": (dict(cache_mode="shared"), "the blocks may not share one"),
}


# ---- check_transformer_block's keywords and cache: each planted mistake caught with its own message ----------------

from transformer_from_scratch.checks import check_transformer_block  # noqa: E402


def block_mutant(*, drop_kv=False, drop_eps=False, drop_cache=False):
    class Block(TransformerBlock):
        def __init__(self, d_model, num_heads, d_ff, max_seq_len, theta, device=None, dtype=None, *, fused=False,
                     num_kv_heads=None, norm_eps=1e-5):
            super().__init__(d_model, num_heads, d_ff, max_seq_len, theta, device, dtype, fused=fused,
                             num_kv_heads=None if drop_kv else num_kv_heads, norm_eps=1e-5 if drop_eps else norm_eps)

        def forward(self, x, token_positions=None, *, cache=None):
            return super().forward(x, token_positions, cache=None if drop_cache else cache)

    return Block


BLOCK_MUTANTS = {
    "num_kv_heads not passed on": (dict(drop_kv=True), "num_kv_heads is not passed on to the attention"),
    "norm_eps not passed on": (dict(drop_eps=True), "builds ln1 and ln2 with ε"),
    "the cache not passed on": (dict(drop_cache=True), "never hands the cache to its attention"),
}


# ---- the three component checks: each planted mistake above named in the first line; no mistake, one pass line ------

PLANTED = {**{f"attention: {name}": (check_multihead_self_attention, mutant, *case)
              for name, case in COMPONENT_MISTAKES.items()},
           **{f"block: {name}": (check_transformer_block, block_mutant, *case) for name, case in BLOCK_MUTANTS.items()},
           **{f"model: {name}": (check_transformer_lm, lm_mutant, *case) for name, case in LM_MUTANTS.items()}}
RIGHT = {"attention": (check_multihead_self_attention, mutant, "grouped-query attention; the cache's hook"),
         "block": (check_transformer_block, block_mutant, "num_kv_heads, norm_eps and the cache passed on"),
         "model": (check_transformer_lm, lm_mutant, "num_kv_heads and norm_eps passed on; a cache per block")}


@pytest.mark.parametrize("name", PLANTED)
def test_each_planted_mistake_is_named_in_the_first_line(name):
    check, make, flags, phrase = PLANTED[name]
    with pytest.raises(AssertionError) as caught:
        check(make(**flags))
    assert phrase in str(caught.value).splitlines()[0], str(caught.value)


@pytest.mark.parametrize("name", RIGHT)
def test_without_a_mistake_the_check_passes_and_says_what_it_checked(name, capsys):
    check, make, said = RIGHT[name]
    check(make())
    assert said in capsys.readouterr().out


def test_the_blocks_share_one_set_of_rope_tables():
    """Every block's RoPE holds the same cos and sin tables: the model keeps one (SmolLM2's 30 layers at a context of
    8,192 would otherwise hold 30 copies of 2 MiB), moved once by .to(), and none of it in the state dict."""
    model = TransformerLM(40, SEQ, D, 3, H, 64, THETA)
    assert len({id(layer.attn.rope) for layer in model.layers}) == 1
    assert [name for name, _ in model.named_buffers()] == ["layers.0.attn.rope.cos_table", "layers.0.attn.rope.sin_table"]
    assert not any("rope" in name for name in model.state_dict())
    model.to(torch.float64)  # moved (and cast) once, still shared
    assert model.layers[2].attn.rope is model.layers[0].attn.rope
    assert model.layers[2].attn.rope.cos_table.dtype == torch.float64

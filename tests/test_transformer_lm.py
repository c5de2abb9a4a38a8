"""TransformerLM (notebook 10): the composition embeddings -> blocks -> ln_final -> lm_head against the same steps
written with PyTorch built-ins, causality, state-dict names and a save/load round trip, device and dtype, gradients,
bad input; tie_embeddings (one Parameter, both names saved, its load rule, its gradient); count_resources against
counted parameters and PyTorch's FLOP counter; next_token_distribution and generate (greedy = the argmax loop, seeded
samples, filters never emit an excluded token, the context window)."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES, FLOAT_DTYPES, LEADING_SHAPES
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from transformer_from_scratch import TransformerBlock, TransformerLM, count_resources, generate, next_token_distribution

V, CTX, D, L, H, D_FF, THETA = 11, 8, 12, 2, 3, 16, 10000.0
CONFIG = (V, CTX, D, L, H, D_FF, THETA)
BLOCK_NAMES = ["ln1.weight", "attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight",
               "attn.output_proj.weight", "ln2.weight", "ffn.w1.weight", "ffn.w2.weight", "ffn.w3.weight"]
GPT2 = {"small": (12, 768, 12, 3072), "medium": (24, 1024, 16, 4096), "large": (36, 1280, 20, 5120),
        "XL": (48, 1600, 25, 6400)}


def spec_names(num_layers):
    """The state-dict names of CONTRACT.md, in order."""
    return (["token_embeddings.weight"] + [f"layers.{i}.{name}" for i in range(num_layers) for name in BLOCK_NAMES]
            + ["ln_final.weight", "lm_head.weight"])


def make(device="cpu", dtype=torch.float32, seed=0, **kwargs):
    torch.manual_seed(seed)
    return TransformerLM(*CONFIG, device=device, dtype=dtype, **kwargs)


def random_ids(*shape, seed=1, device="cpu", vocab=V):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed)).to(device)


def composed(model, token_ids, token_positions=None):
    """The same model from its parts: F.embedding, the package's blocks, F.rms_norm, F.linear."""
    x = F.embedding(token_ids, model.token_embeddings.weight)
    for block in model.layers:
        x = block(x, token_positions)
    x = F.rms_norm(x, (x.shape[-1],), model.ln_final.weight, eps=model.ln_final.eps)
    return F.linear(x, model.lm_head.weight)


# --- the forward pass ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("leading", LEADING_SHAPES, ids=str)
def test_logits_are_the_composition_of_the_parts(device, dtype, leading):
    model = make(device, dtype)
    ids = random_ids(*leading, 6, device=device)
    logits = model(ids)
    assert logits.shape == (*leading, 6, V) and logits.dtype == dtype and logits.device.type == device
    torch.testing.assert_close(logits, composed(model, ids))


@pytest.mark.parametrize("device", DEVICES)
def test_token_positions_reach_every_block(device):
    model = make(device, torch.float64)
    ids = random_ids(2, 6, device=device)
    positions = torch.tensor([[0, 1, 2, 0, 1, 2], [0, 2, 4, 5, 6, 7]], device=device)
    torch.testing.assert_close(model(ids, positions), composed(model, ids, positions))
    assert not torch.allclose(model(ids, positions), model(ids))
    assert torch.equal(model(ids), model(ids, torch.arange(6, device=device)))
    torch.testing.assert_close(model(ids, torch.arange(6, device=device) + 2), model(ids))  # RoPE is relative


def test_logits_not_probabilities():
    logits = make()(random_ids(2, 6))
    assert (logits < 0).any() and not torch.allclose(logits.sum(-1), torch.ones(2, 6))


@pytest.mark.parametrize("t", range(CTX))
def test_causality_later_tokens_never_change_earlier_logits(t):
    model = make()
    ids = random_ids(2, CTX)
    changed = ids.clone()
    changed[:, t + 1:] = random_ids(2, CTX - 1 - t, seed=7)
    assert torch.equal(model(changed)[:, : t + 1], model(ids)[:, : t + 1])


def test_the_full_context_is_accepted_and_one_more_token_refused():
    model = make()
    assert model(random_ids(CTX)).shape == (CTX, V)
    with pytest.raises(ValueError, match=rf"the sequence has {CTX + 1} tokens, more than context_length={CTX}"):
        model(random_ids(2, CTX + 1))


@pytest.mark.parametrize("bad, low, high", [(V, 0, V), (-1, -1, 3), (100, 0, 100)])
def test_ids_out_of_range_are_refused_with_the_numbers(bad, low, high):
    """The embedding's check, the one the model relies on (it does not read the ids back a second time)."""
    ids = torch.tensor([[0, 3, bad]])
    with pytest.raises(ValueError, match=rf"token ids must be in \[0, {V - 1}\] \(num_embeddings={V}\), "
                                         rf"got ids from {low} to {high}"):
        make()(ids)


def test_float_ids_are_refused():
    with pytest.raises(Exception, match="token_ids"):
        make()(torch.zeros(2, 3))


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="every size must be >= 1.*num_layers=0"):
        TransformerLM(V, CTX, D, 0, H, D_FF, THETA)


def test_fused_gives_the_same_logits():
    ids = random_ids(2, 6)
    torch.testing.assert_close(make(fused=True)(ids), make()(ids))
    assert all(block.attn.fused for block in make(fused=True).layers)


# --- structure, state dict, initialisation, device ---------------------------------------------------------

@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_state_dict_names_are_exactly_the_specs(num_layers):
    model = TransformerLM(V, CTX, D, num_layers, H, D_FF, THETA)
    assert list(model.state_dict()) == spec_names(num_layers)
    assert isinstance(model.layers, nn.ModuleList) and all(isinstance(b, TransformerBlock) for b in model.layers)
    assert len({id(block) for block in model.layers}) == num_layers
    assert model.lm_head.weight.data_ptr() != model.token_embeddings.weight.data_ptr()
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())


def test_a_checkpoint_round_trips_with_identical_logits(tmp_path):
    model = make(seed=0)
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    fresh = make(seed=5)
    ids = random_ids(2, 6)
    assert not torch.allclose(fresh(ids), model(ids))
    fresh.load_state_dict(torch.load(path, weights_only=True), strict=True)
    assert torch.equal(fresh(ids), model(ids))


def test_initialisation_of_the_embeddings_and_the_head():
    torch.manual_seed(0)
    model = TransformerLM(512, 16, 128, 1, 4, 64, THETA)
    assert abs(model.token_embeddings.weight.std().item() - 0.987) < 0.02
    sigma = math.sqrt(2 / (128 + 512))
    assert abs(model.lm_head.weight.std().item() / sigma - 0.987) < 0.02
    assert torch.equal(model.ln_final.weight, torch.ones(128))


def test_device_and_dtype_are_honoured():
    model = TransformerLM(*CONFIG, device="meta", dtype=torch.float64)
    assert all(p.device.type == "meta" and p.dtype == torch.float64 for p in model.parameters())
    assert all(b.device.type == "meta" for b in model.buffers())


def test_gradcheck_every_weight():
    torch.manual_seed(0)
    model = TransformerLM(5, 4, 4, 1, 2, 4, THETA, dtype=torch.float64)
    ids = torch.tensor([[1, 4, 0], [2, 2, 3]])
    names = [name for name, _ in model.named_parameters()]
    weights = tuple(p.detach().clone().requires_grad_() for p in model.parameters())
    as_function = lambda *w: torch.func.functional_call(model, dict(zip(names, w)), (ids,))
    assert torch.autograd.gradcheck(as_function, weights)


# --- tie_embeddings ------------------------------------------------------------------------------------------

def test_tied_lm_head_is_the_embeddings_parameter_saved_under_both_names():
    tied, untied = make(tie_embeddings=True), make()
    assert tied.lm_head.weight is tied.token_embeddings.weight
    assert [name for name, _ in tied.named_parameters()] == spec_names(L)[:-1]  # listed once, under its first name
    state = tied.state_dict()
    assert list(state) == spec_names(L) and torch.equal(state["lm_head.weight"], state["token_embeddings.weight"])
    assert sum(p.numel() for p in tied.parameters()) == sum(p.numel() for p in untied.parameters()) - V * D


def test_tying_changes_nothing_else_and_keeps_the_embeddings_initialisation():
    """The same seed gives the same weights as the untied model (lm_head's own is drawn, then dropped), and the one
    matrix keeps Embedding's N(0, 1) cut at ±3."""
    tied, untied = make(tie_embeddings=True), make()
    for (name, p), (_, q) in zip(tied.named_parameters(), untied.named_parameters()):
        assert torch.equal(p, q), name
    torch.manual_seed(0)
    big = TransformerLM(512, 16, 128, 1, 4, 64, THETA, tie_embeddings=True)
    assert abs(big.lm_head.weight.std().item() - 0.987) < 0.02


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_tied_logits_are_the_composition_with_one_matrix(dtype):
    model = make(dtype=dtype, tie_embeddings=True)
    ids = random_ids(2, 6)
    torch.testing.assert_close(model(ids), composed(model, ids))
    x = F.rms_norm(model.layers[1](model.layers[0](model.token_embeddings.weight[ids])), (D,), model.ln_final.weight,
                   eps=model.ln_final.eps)
    torch.testing.assert_close(model(ids), x @ model.token_embeddings.weight.T)


def test_the_gradient_of_the_one_matrix_is_the_sum_of_its_two_uses():
    """Against the untied model holding the same numbers in both matrices: the tied gradient is the sum of the
    embedding's and lm_head's there; and against a functional call where one leaf plays both parts."""
    tied = make(dtype=torch.float64, tie_embeddings=True)
    untied = make(dtype=torch.float64)
    untied.load_state_dict(tied.state_dict(), strict=True)
    ids, upstream = random_ids(2, 6), torch.randn(2, 6, V, generator=torch.Generator().manual_seed(3),
                                                  dtype=torch.float64)
    (tied(ids) * upstream).sum().backward()
    (untied(ids) * upstream).sum().backward()
    shared = tied.token_embeddings.weight.grad
    torch.testing.assert_close(shared, untied.token_embeddings.weight.grad + untied.lm_head.weight.grad)
    assert not torch.allclose(shared, untied.lm_head.weight.grad)  # both uses count
    leaf = tied.token_embeddings.weight.detach().clone().requires_grad_()
    weights = {name: p.detach() for name, p in tied.named_parameters()} | {"token_embeddings.weight": leaf,
                                                                            "lm_head.weight": leaf}
    (torch.func.functional_call(untied, weights, (ids,)) * upstream).sum().backward()
    torch.testing.assert_close(shared, leaf.grad)
    for (name, p), (_, q) in zip(tied.named_parameters(), untied.named_parameters()):
        if name != "token_embeddings.weight":
            torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_a_tied_checkpoint_loads_strictly_into_a_tied_model_and_an_untied_one(tmp_path):
    model = make(tie_embeddings=True)
    path = tmp_path / "tied.pt"
    torch.save(model.state_dict(), path)
    ids = random_ids(2, 6)
    for tie in (True, False):
        fresh = make(seed=5, tie_embeddings=tie)
        assert not torch.allclose(fresh(ids), model(ids))
        fresh.load_state_dict(torch.load(path, weights_only=True), strict=True)
        assert torch.equal(fresh(ids), model(ids))
        assert (fresh.lm_head.weight is fresh.token_embeddings.weight) is tie
    untied = make(seed=5)
    untied.load_state_dict(torch.load(path, weights_only=True), strict=True)
    assert torch.equal(untied.lm_head.weight, untied.token_embeddings.weight)
    untied.lm_head.weight.data.add_(1.0)  # the untied model's two matrices are separate from now on
    assert not torch.equal(untied.lm_head.weight, untied.token_embeddings.weight)


@pytest.mark.parametrize("strict", [True, False])
def test_a_tied_model_refuses_two_different_matrices_and_copies_nothing(strict):
    tied = make(tie_embeddings=True)
    before = {name: t.clone() for name, t in tied.state_dict().items()}
    untied = make(seed=5).state_dict()
    with pytest.raises(ValueError, match=r"token_embeddings\.weight and lm_head\.weight.*tie_embeddings=False"):
        tied.load_state_dict(untied, strict=strict)
    assert all(torch.equal(t, before[name]) for name, t in tied.state_dict().items())
    assert tied.lm_head.weight is tied.token_embeddings.weight
    with pytest.raises(RuntimeError, match="Missing key.*lm_head.weight"):  # a missing name is PyTorch's to report
        tied.load_state_dict({k: v for k, v in untied.items() if k != "lm_head.weight"}, strict=True)


def test_the_rule_holds_inside_another_module_under_its_prefix():
    outer = nn.Sequential(make(tie_embeddings=True))
    state = {name: t.clone() for name, t in outer.state_dict().items()}
    state["0.lm_head.weight"] += 1
    with pytest.raises(ValueError, match=r"0\.token_embeddings\.weight and 0\.lm_head\.weight"):
        outer.load_state_dict(state)


def test_assign_true_keeps_the_tie():
    """load_state_dict(..., assign=True) gives every name a Parameter of its own; the tied model ties again."""
    source = make(seed=5, tie_embeddings=True).state_dict()
    model = make(tie_embeddings=True)
    model.load_state_dict(source, assign=True, strict=True)
    assert model.lm_head.weight is model.token_embeddings.weight
    assert torch.equal(model.token_embeddings.weight, source["token_embeddings.weight"])
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in make().parameters()) - V * D


def test_to_half_deepcopy_and_the_meta_device_keep_the_tie():
    model = make(tie_embeddings=True)
    for moved in (model.to(torch.float64), model.half(), copy.deepcopy(model),
                  TransformerLM(*CONFIG, device="meta", tie_embeddings=True)):
        assert moved.lm_head.weight is moved.token_embeddings.weight
    assert model.lm_head.weight.dtype == torch.float16


@pytest.mark.parametrize("device", DEVICES)
def test_a_tied_model_trains_its_one_matrix_once_per_step(device):
    model = make(device, tie_embeddings=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    assert sum(len(group["params"]) for group in optimizer.param_groups) == len(spec_names(L)) - 1
    F.cross_entropy(model(random_ids(2, 6, device=device)).flatten(0, 1), random_ids(12, seed=2, device=device)).backward()
    optimizer.step()
    assert model.lm_head.weight is model.token_embeddings.weight


# --- count_resources -----------------------------------------------------------------------------------------

def counted(model):
    return {"token_embeddings": model.token_embeddings.weight.numel(), "lm_head": model.lm_head.weight.numel(),
            "attention": sum(p.numel() for block in model.layers for p in block.attn.parameters()),
            "ffn": sum(p.numel() for block in model.layers for p in block.ffn.parameters()),
            "norms": model.ln_final.weight.numel() + sum(b.ln1.weight.numel() + b.ln2.weight.numel()
                                                          for b in model.layers),
            "total": sum(p.numel() for p in model.parameters())}


@pytest.mark.parametrize("config", [CONFIG[:-1], (58, 64, 64, 2, 4, 192), (7, 4, 8, 3, 2, 16)], ids=str)
def test_counted_parameters_of_an_instantiated_model_equal_the_formula(config):
    resources = count_resources(*config)
    model = TransformerLM(*config, THETA)
    assert resources["parameters"] == counted(model)
    assert resources["memory_fp32_bytes"] == 4 * sum(p.numel() for p in model.parameters())
    assert resources["memory_fp32_bytes"] == sum(t.numel() * t.element_size() for t in model.state_dict().values())


@pytest.mark.parametrize("name", list(GPT2))
def test_gpt2_configurations_on_the_meta_device(name):
    num_layers, d_model, num_heads, d_ff = GPT2[name]
    config = (50_257, 1_024, d_model, num_layers, num_heads, d_ff)
    assert count_resources(*config)["parameters"] == counted(TransformerLM(*config, THETA, device="meta"))


def test_gpt2_xl_by_hand():
    xl = count_resources(50_257, 1_024, 1_600, 48, 25, 6_400)
    assert xl["parameters"]["total"] == 2_127_057_600 and xl["memory_fp32_bytes"] == 8_508_230_400
    assert xl["flops"] == {"attention_projections": 48 * 8 * 1024 * 1600**2, "attention_scores": 48 * 4 * 1024**2 * 1600,
                           "ffn": 48 * 6 * 1024 * 1600 * 6400, "lm_head": 2 * 1024 * 1600 * 50_257,
                           "total": 4_513_336_524_800}
    long = count_resources(50_257, 16_384, 1_600, 48, 25, 6_400)
    assert long["parameters"] == xl["parameters"]  # RoPE: the context costs no parameters
    assert long["flops"]["attention_scores"] == 256 * xl["flops"]["attention_scores"]
    assert long["flops"]["ffn"] == 16 * xl["flops"]["ffn"]
    assert long["flops"]["attention_scores"] > long["flops"]["total"] / 2


@pytest.mark.parametrize("config", [CONFIG[:-1], (58, 64, 64, 2, 4, 192)], ids=str)
def test_flops_equal_what_pytorch_counts(config):
    model = TransformerLM(*config, THETA)
    vocab, context = config[:2]
    with FlopCounterMode(display=False) as counter:
        model(random_ids(1, context, vocab=vocab))
    assert counter.get_total_flops() == count_resources(*config)["flops"]["total"]


@pytest.mark.parametrize("config", [CONFIG[:-1], (58, 64, 64, 2, 4, 192)], ids=str)
def test_count_resources_counts_a_tied_matrix_once(config):
    tied, untied = count_resources(*config, tie_embeddings=True), count_resources(*config)
    model = TransformerLM(*config, THETA, tie_embeddings=True)
    vocab, d_model = config[0], config[2]
    assert tied["parameters"]["total"] == sum(p.numel() for p in model.parameters())
    assert tied["parameters"] == untied["parameters"] | {"lm_head": 0, "total": untied["parameters"]["total"]
                                                         - vocab * d_model}
    assert tied["memory_fp32_bytes"] == 4 * tied["parameters"]["total"]
    assert tied["flops"] == untied["flops"]  # lm_head's product runs all the same


def test_count_resources_refuses_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="d_model=12, num_heads=5"):
        count_resources(V, CTX, 12, L, 5, D_FF)


# --- next_token_distribution ---------------------------------------------------------------------------------

LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0], [0.0, 3.0, 0.0, 3.0, 1.0]])


def test_temperature_one_is_the_softmax_and_temperature_scales_the_logits():
    torch.testing.assert_close(next_token_distribution(LOGITS), torch.softmax(LOGITS, -1))
    torch.testing.assert_close(next_token_distribution(LOGITS, temperature=0.5), torch.softmax(2 * LOGITS, -1))
    torch.testing.assert_close(next_token_distribution(LOGITS, temperature=2), torch.softmax(LOGITS / 2, -1))


def test_temperature_zero_is_greedy_first_maximum_on_ties():
    expected = torch.tensor([[1.0, 0, 0, 0, 0], [0, 1, 0, 0, 0]])
    assert torch.equal(next_token_distribution(LOGITS, temperature=0), expected)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 10])
def test_top_k_keeps_the_k_largest(k):
    logits = torch.randn(4, 20, generator=torch.Generator().manual_seed(k))
    probs = next_token_distribution(logits, top_k=k)
    kept = probs > 0
    assert (kept.sum(-1) == k).all()
    assert torch.equal(kept, torch.zeros_like(kept).scatter_(-1, logits.topk(k, -1).indices, True))
    torch.testing.assert_close(probs.sum(-1), torch.ones(4))
    assert torch.equal(next_token_distribution(LOGITS, top_k=2) > 0,
                       torch.tensor([[1, 1, 0, 0, 0], [0, 1, 0, 1, 0]]).bool())  # ties with the k-th stay


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.8, 0.95])
def test_top_p_keeps_the_smallest_set_that_reaches_p(p):
    logits = torch.randn(4, 20, generator=torch.Generator().manual_seed(int(100 * p)))
    base = torch.softmax(logits, -1)
    probs = next_token_distribution(logits, top_p=p)
    for row in range(4):
        kept = probs[row] > 0
        assert base[row][kept].sum() >= p - 1e-6                            # enough mass
        assert base[row][kept].sum() - base[row][kept].min() < p             # and not one token more
        assert base[row][kept].min() >= torch.cat([base[row][~kept], torch.zeros(1)]).max()  # the most likely
        torch.testing.assert_close(probs[row][kept], base[row][kept] / base[row][kept].sum())


def test_top_p_renormalises_what_it_keeps():
    # Probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 (exact in binary): top_p = 0.7 keeps 0.5 and 0.25 (0.5 alone falls
    # short of 0.7, 0.75 reaches it), and renormalised they are 2/3 and 1/3, not 0.5 and 0.25.
    probs = torch.tensor([0.125, 0.5, 0.0625, 0.25, 0.0625], dtype=torch.float64)
    kept = next_token_distribution(probs.log(), top_p=0.7)
    assert torch.equal(kept > 0, torch.tensor([False, True, False, True, False]))
    torch.testing.assert_close(kept, torch.tensor([0, 2 / 3, 0, 1 / 3, 0], dtype=torch.float64))
    batch = next_token_distribution(torch.randn(5, 30, generator=torch.Generator().manual_seed(0)), top_p=0.5)
    torch.testing.assert_close(batch.sum(-1), torch.ones(5))       # every row sums to 1 again, on its own
    assert ((batch > 0).sum(-1) < 30).all()


def test_filters_off():
    for kwargs in [dict(top_k=5), dict(top_k=50), dict(top_p=1.0), dict(top_k=None, top_p=None)]:
        torch.testing.assert_close(next_token_distribution(LOGITS, **kwargs), torch.softmax(LOGITS, -1))


@pytest.mark.parametrize("kwargs, message", [(dict(temperature=-1), "temperature must be >= 0"),
                                             (dict(top_k=0), "top_k must be >= 1"),
                                             (dict(top_p=0.0), r"top_p must lie in \(0, 1\]"),
                                             (dict(top_p=1.5), r"top_p must lie in \(0, 1\]")])
def test_bad_sampling_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        next_token_distribution(LOGITS, **kwargs)
    with pytest.raises(ValueError, match=message):
        generate(make(), torch.tensor([1]), 3, **kwargs)


# --- generate ------------------------------------------------------------------------------------------------

class FixedLogits(nn.Module):
    """A fake model: the same next-token logits whatever the input; it records the lengths it was given."""

    def __init__(self, logits, context_length=4):
        super().__init__()
        self.logits, self.context_length, self.seen = logits, context_length, []

    def forward(self, token_ids):
        self.seen.append(token_ids.clone())
        return self.logits.expand(*token_ids.shape, -1)


def argmax_loop(model, prompt, n):
    ids = prompt.clone()
    for _ in range(n):
        ids = torch.cat([ids, model(ids[-model.context_length:][None])[0, -1].argmax().view(1)])
    return ids[len(prompt):]


def test_greedy_equals_the_argmax_loop_and_is_deterministic():
    model = make()
    prompt = random_ids(3)
    with torch.no_grad():
        expected = argmax_loop(model, prompt, 20)  # 23 tokens: the window of 8 slides
    first = generate(model, prompt, 20, temperature=0)
    assert torch.equal(first, expected) and torch.equal(generate(model, prompt, 20, temperature=0), first)
    assert first.dtype == prompt.dtype and first.shape == (20,)


def test_top_k_one_is_greedy():
    model = make()
    prompt = random_ids(3)
    sample = generate(model, prompt, 10, top_k=1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample, generate(model, prompt, 10, temperature=0))


def test_a_seeded_sample_is_reproducible():
    model, prompt = make(), random_ids(3)
    draw = lambda seed: generate(model, prompt, 30, temperature=1.5, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(draw(0), draw(0)) and not torch.equal(draw(0), draw(1))


@pytest.mark.parametrize("kwargs", [dict(top_k=3), dict(top_p=0.6), dict(top_k=4, top_p=0.9, temperature=2.0)],
                         ids=str)
def test_filters_never_emit_an_excluded_token(kwargs):
    logits = torch.randn(30, generator=torch.Generator().manual_seed(0))
    allowed = set(torch.nonzero(next_token_distribution(logits, **kwargs)).flatten().tolist())
    assert 1 <= len(allowed) < 30
    emitted = generate(FixedLogits(logits), torch.tensor([0]), 500, generator=torch.Generator().manual_seed(1), **kwargs)
    assert set(emitted.tolist()) <= allowed
    assert len(set(emitted.tolist())) == len(allowed)  # and every allowed one does come up in 500 draws


def test_filters_never_emit_an_excluded_token_from_a_real_model():
    model, prompt = make(), random_ids(2)
    generator = torch.Generator().manual_seed(0)
    ids = prompt
    for _ in range(40):
        with torch.no_grad():
            allowed = next_token_distribution(model(ids[-CTX:][None])[0, -1], top_k=3) > 0
        new = generate(model, ids, 1, top_k=3, generator=generator)
        assert allowed[new.item()]
        ids = torch.cat([ids, new])


def test_the_context_window_holds():
    fake = FixedLogits(torch.randn(6), context_length=4)
    prompt = torch.tensor([1, 2, 3])
    new = generate(fake, prompt, 10, temperature=0)
    text = torch.cat([prompt, new])
    assert [seen.shape for seen in fake.seen] == [(1, min(3 + i, 4)) for i in range(10)]
    for i, seen in enumerate(fake.seen):
        assert torch.equal(seen[0], text[max(0, 3 + i - 4):3 + i])  # the last context_length ids, in order
    model = make()
    long_prompt = random_ids(CTX + 5)  # longer than the context from the start
    assert generate(model, long_prompt, 5, temperature=0).shape == (5,)


def test_eos_stops_generation_and_zero_tokens_is_empty():
    logits = torch.full((6,), -10.0)
    logits[4] = 10.0
    assert generate(FixedLogits(logits), torch.tensor([1]), 10, temperature=0, eos_id=4).tolist() == [4]
    assert generate(FixedLogits(logits), torch.tensor([1]), 0).shape == (0,)


def test_generate_does_not_record_gradients():
    assert not generate(make(), torch.tensor([1, 2]), 3).requires_grad


@pytest.mark.parametrize("prompt, message", [(torch.tensor([], dtype=torch.long), r"shape \(0,\)"),
                                             (torch.tensor([[1, 2]]), r"shape \(1, 2\)")])
def test_bad_prompts_are_refused(prompt, message):
    with pytest.raises(ValueError, match=message):
        generate(make(), prompt, 3)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0, got -1"):
        generate(make(), torch.tensor([1]), -1)


@pytest.mark.parametrize("device", DEVICES)
def test_generate_on_the_device(device):
    model = make(device)
    prompt = random_ids(3, device=device)
    out = generate(model, prompt, 5, generator=torch.Generator(device=device).manual_seed(0))
    assert out.device.type == device and out.shape == (5,)


class _ReadBacks(torch.overrides.TorchFunctionMode):
    """Counts the host read-backs of a forward: every value check reads min and max with aminmax, then tolist."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", "") in ("tolist", "item")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("num_layers", [1, 4])
def test_a_forward_reads_the_device_once_whatever_its_depth(num_layers):
    """The ids' range, in the embedding (the LM leaves it to it); none per layer: the default positions reach RoPE
    as a range."""
    torch.manual_seed(0)
    model, ids = TransformerLM(V, CTX, D, num_layers, H, D_FF, THETA), random_ids(2, CTX)
    with _ReadBacks() as spy:
        model(ids)
    assert spy.count == 1
    with _ReadBacks() as spy:
        model(ids, torch.arange(CTX))  # positions given as a tensor: RoPE checks them for q and k in every layer
    assert spy.count == 1 + 2 * num_layers

"""The fine-tuning module (notebook 15): LoRALinear against hand computations and its contract (initialisation,
gradients, merge and unmerge, errors), apply_lora on small random models, the steps of a fine-tuning batch against
PyTorch (cross_entropy's ignore_index) and against greedy decoding, the task's split and the Wilson interval. Small
random models only: no weights are loaded here."""

import math
import random

import pytest
import torch
import torch.nn.functional as F
from jaxtyping import TypeCheckError
from torch import nn

from conftest import DEVICES, FLOAT_DTYPES
from transformer_from_scratch import (AdamW, Linear, LoRALinear, Tokenizer, TransformerLM, apply_lora,
                                      assistant_targets, chat_prompt, cross_entropy, encode_example, exact_match,
                                      generate, held_out, lora_delta, masked_cross_entropy, pad_batch, reverse_task,
                                      shape_checks, wilson_interval)
from transformer_from_scratch.finetune import IGNORE, WORDS


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _tiny_lm(seed=0, **kwargs) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(vocab_size=40, context_length=32, d_model=16, num_layers=2, num_heads=4, d_ff=32,
                         rope_theta=10_000.0, **kwargs).eval()


# ---- lora_delta -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("leading", [(), (3,), (2, 1, 4)])
def test_lora_delta_is_scaling_B_A_x(dtype, leading):
    x = torch.randn(*leading, 5, generator=_gen(), dtype=dtype)
    A, B = torch.randn(2, 5, generator=_gen(1), dtype=dtype), torch.randn(3, 2, generator=_gen(2), dtype=dtype)
    out = lora_delta(x, A, B, 1.5)
    assert out.shape == (*leading, 3) and out.dtype == dtype
    torch.testing.assert_close(out, 1.5 * torch.einsum("or,ri,...i->...o", B, A, x))


def test_lora_delta_by_hand():
    x = torch.tensor([1.0, 2.0, 3.0])
    A = torch.tensor([[1.0, 0.0, -1.0]])          # A x = 1 - 3 = -2
    B = torch.tensor([[2.0], [0.5]])              # B (A x) = (-4, -1)
    assert lora_delta(x, A, B, 2.0).tolist() == [-8.0, -2.0]


@pytest.mark.parametrize("checks", [True, False], ids=["checks-on", "checks-off"])
def test_lora_delta_refuses_shapes_that_do_not_fit(checks):
    with shape_checks(checks), pytest.raises(TypeError if checks else ValueError):
        lora_delta(torch.randn(2, 5), torch.randn(2, 4), torch.randn(3, 2), 1.0)
    with shape_checks(checks), pytest.raises(TypeError if checks else ValueError):
        lora_delta(torch.randn(2, 5), torch.randn(2, 5), torch.randn(3, 4), 1.0)


# ---- LoRALinear -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_lora_linear_by_hand_on_a_2x3_layer(dtype):
    base = Linear(3, 2, dtype=dtype)
    layer = LoRALinear(base, rank=1, alpha=4.0)        # scaling 4
    with torch.no_grad():
        base.weight.copy_(torch.tensor([[1.0, 0.0, 2.0], [0.0, -1.0, 1.0]]))
        layer.lora_A.copy_(torch.tensor([[0.5, 1.0, 0.0]]))
        layer.lora_B.copy_(torch.tensor([[1.0], [-1.0]]))
    x = torch.tensor([[2.0, 1.0, -1.0]], dtype=dtype)
    # W x = (2 - 2, -1 - 1) = (0, -2); A x = 1 + 1 = 2; 4 · B (A x) = (8, -8)
    out = layer(x)
    assert out.dtype == dtype and out.tolist() == [[8.0, -10.0]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_lora_linear_starts_exactly_as_its_base(device, dtype):
    torch.manual_seed(0)
    base = Linear(6, 4, device=device, dtype=dtype)
    x = torch.randn(2, 3, 6, generator=_gen(), dtype=dtype).to(device)
    expected = base(x)
    layer = LoRALinear(base, rank=2, alpha=8)
    assert torch.equal(layer(x), expected)
    assert layer.base is base and not base.weight.requires_grad
    assert layer.lora_A.shape == (2, 6) and layer.lora_B.shape == (4, 2) and layer.scaling == 4.0
    for factor in (layer.lora_A, layer.lora_B):
        assert factor.device.type == device and factor.dtype == dtype and factor.requires_grad
    assert torch.equal(layer.lora_B, torch.zeros_like(layer.lora_B))


def test_lora_A_is_a_truncated_normal_of_variance_one_over_d_in():
    torch.manual_seed(0)
    layer = LoRALinear(Linear(1024, 64), rank=64, alpha=64)
    std = 1 / math.sqrt(1024)
    a = layer.lora_A.detach()
    assert a.abs().max() <= 3 * std + 1e-7
    # a normal cut at ±3σ has a standard deviation of 0.9865σ; 65,536 draws measure it to about 0.3 %
    assert abs(a.std().item() / std - 0.9865) < 0.02 and abs(a.mean().item()) < 0.1 * std


def test_only_the_factors_get_gradients():
    torch.manual_seed(0)
    layer = LoRALinear(Linear(5, 3), rank=2, alpha=2)
    with torch.no_grad():
        layer.lora_B.normal_()
    layer(torch.randn(4, 5)).square().sum().backward()
    grads = {name: p.grad is not None for name, p in layer.named_parameters()}
    assert grads == {"base.weight": False, "lora_A": True, "lora_B": True}
    assert sorted(layer.state_dict()) == ["base.weight", "lora_A", "lora_B"]


def test_the_first_step_moves_B_only():
    torch.manual_seed(0)
    layer = LoRALinear(Linear(5, 3), rank=2, alpha=2)
    layer(torch.randn(4, 5)).square().sum().backward()
    assert layer.lora_B.grad.abs().sum() > 0 and torch.equal(layer.lora_A.grad, torch.zeros_like(layer.lora_A))


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_merge_and_unmerge_keep_the_outputs_and_the_weight(dtype, tolerance):
    torch.manual_seed(0)
    layer = LoRALinear(Linear(8, 6, dtype=dtype), rank=3, alpha=6)
    with torch.no_grad():
        layer.lora_B.normal_()
    weight = layer.base.weight.detach().clone()
    x = torch.randn(5, 8, generator=_gen(), dtype=dtype)
    unmerged = layer(x)
    layer.merge()
    assert layer.merged
    torch.testing.assert_close(layer(x), unmerged, rtol=0, atol=tolerance)
    torch.testing.assert_close(layer.base(x), unmerged, rtol=0, atol=tolerance)   # the update is in the weight
    layer.unmerge()
    assert not layer.merged
    torch.testing.assert_close(layer.base.weight, weight, rtol=0, atol=tolerance)
    torch.testing.assert_close(layer(x), unmerged, rtol=0, atol=tolerance)


def test_merging_twice_and_unmerging_an_unmerged_layer_are_refused():
    layer = LoRALinear(Linear(4, 4), rank=1, alpha=1)
    with pytest.raises(RuntimeError, match="not merged"):
        layer.unmerge()
    layer.merge()
    with pytest.raises(RuntimeError, match="already merged"):
        layer.merge()


def test_lora_linear_adapts_torch_linear_without_bias():
    torch.manual_seed(0)
    base = nn.Linear(5, 3, bias=False)
    layer = LoRALinear(base, rank=2, alpha=4)
    x = torch.randn(2, 5)
    assert torch.equal(layer(x), base(x))


@pytest.mark.parametrize("base, error, phrase", [
    (nn.Linear(4, 3), TypeError, "without bias"),
    (nn.Embedding(4, 3), TypeError, "got Embedding"),
    (LoRALinear(Linear(4, 3), rank=1, alpha=1), TypeError, "got LoRALinear"),
    ("a Linear", TypeError, "got str"),
])
def test_a_base_that_is_not_a_linear_without_bias_is_refused(base, error, phrase):
    with pytest.raises(error, match=phrase):
        LoRALinear(base, rank=1, alpha=1)


@pytest.mark.parametrize("rank", [0, -1, 4, 1.0, True, "2"])
def test_a_rank_out_of_range_is_refused(rank):
    with pytest.raises(ValueError, match=r"rank must be an int in \[1, min\(d_in, d_out\)\] = \[1, 3\]"):
        LoRALinear(Linear(5, 3), rank=rank, alpha=1)


@pytest.mark.parametrize("alpha", [0, -2.0, math.inf, math.nan, True, "16"])
def test_an_alpha_that_is_not_positive_is_refused(alpha):
    with pytest.raises(ValueError, match="alpha must be a number > 0"):
        LoRALinear(Linear(5, 3), rank=1, alpha=alpha)


# ---- apply_lora --------------------------------------------------------------------------------------------------

def test_apply_lora_replaces_exactly_the_named_linears_and_freezes_the_rest():
    model = _tiny_lm()
    ids = torch.randint(40, (2, 7), generator=_gen())
    with torch.no_grad():
        before = model(ids)
    untouched = {name: module for name, module in model.named_modules() if not name.endswith(("q_proj", "v_proj"))}
    adapters = apply_lora(model, ("q_proj", "v_proj"), rank=2, alpha=4.0)
    assert list(adapters) == ["layers.0.attn.q_proj", "layers.0.attn.v_proj", "layers.1.attn.q_proj",
                              "layers.1.attn.v_proj"]
    for path, adapter in adapters.items():
        assert model.get_submodule(path) is adapter and isinstance(adapter, LoRALinear)
        assert (adapter.rank, adapter.alpha, adapter.scaling) == (2, 4.0, 2.0)
    for name, module in model.named_modules():
        if not name.endswith(("q_proj", "v_proj")) and ".base" not in name and "lora_" not in name:
            assert untouched[name] is module, name
    trainable = sorted(name for name, p in model.named_parameters() if p.requires_grad)
    assert trainable == sorted(f"{path}.lora_{f}" for path in adapters for f in "AB")
    with torch.no_grad():
        assert torch.equal(model(ids), before)
    keys = set(model.state_dict())
    assert "layers.0.attn.q_proj.base.weight" in keys and "layers.1.attn.v_proj.lora_B" in keys


def test_apply_lora_counts_r_times_d_in_plus_d_out_per_matrix():
    model = _tiny_lm(num_kv_heads=2)  # k_proj and v_proj are 8 x 16
    apply_lora(model, ("v_proj", "w2"), rank=3, alpha=1.0)
    counted = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert counted == 2 * (3 * (16 + 8) + 3 * (32 + 16))


def test_apply_lora_takes_one_name_as_a_string_and_a_torch_linear():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4, bias=False)
            self.out = nn.Linear(4, 2, bias=False)

        def forward(self, x):
            return self.out(self.proj(x))

    net = Net()
    adapters = apply_lora(net, "out", rank=2, alpha=2.0)
    assert list(adapters) == ["out"] and net.out is adapters["out"] and not net.proj.weight.requires_grad


def test_a_model_trains_only_its_adapters():
    model = _tiny_lm()
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    apply_lora(model, ("q_proj", "v_proj", "w1"), rank=2, alpha=4.0)
    params = [p for p in model.parameters() if p.requires_grad]
    ids = torch.randint(40, (3, 9), generator=_gen())
    optimizer = AdamW(params, lr=1e-2)
    for _ in range(2):
        optimizer.zero_grad()
        cross_entropy(model(ids[:, :-1]), ids[:, 1:]).backward()
        optimizer.step()
    for name, p in model.named_parameters():
        if "lora_" not in name:
            assert torch.equal(p, start[name.replace(".base", "")]), name


@pytest.mark.parametrize("targets, phrase", [(("q_proj", "wq"), "no Linear is called wq"),
                                             (("token_embeddings",), "no Linear is called token_embeddings")])
def test_apply_lora_refuses_a_target_no_linear_is_called(targets, phrase):
    model = _tiny_lm()
    with pytest.raises(ValueError, match=phrase):
        apply_lora(model, targets)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert all(p.requires_grad for p in model.parameters())  # left as it was


def test_apply_lora_refuses_a_second_time_a_tied_head_and_a_bad_rank_without_changing_the_model():
    model = _tiny_lm()
    apply_lora(model, ("q_proj",), rank=1, alpha=1.0)
    with pytest.raises(ValueError, match="has LoRA adapters already"):
        apply_lora(model, ("v_proj",))
    tied = _tiny_lm(tie_embeddings=True)
    with pytest.raises(ValueError, match="lm_head.weight is shared"):
        apply_lora(tied, ("q_proj", "lm_head"))
    fresh = _tiny_lm()
    with pytest.raises(ValueError, match="rank must be an int"):
        apply_lora(fresh, ("q_proj", "output_proj"), rank=20)  # 20 > d_model: refused before anything changes
    assert not any(isinstance(m, LoRALinear) for m in list(tied.modules()) + list(fresh.modules()))
    assert all(p.requires_grad for p in fresh.parameters())


# ---- the batch: targets, padding, loss, grade --------------------------------------------------------------------

def test_assistant_targets_by_hand():
    prompt, reply = [5, 6, 7], [8, 9, 2]
    ids, targets = assistant_targets(prompt, reply)
    assert ids == [5, 6, 7, 8, 9]
    assert targets == [IGNORE, IGNORE, 8, 9, 2]
    assert prompt == [5, 6, 7] and reply == [8, 9, 2]   # the caller's lists are left as they were
    assert assistant_targets([1], [2]) == ([1], [2])


@pytest.mark.parametrize("prompt, reply", [([], [1]), ([1], [])])
def test_assistant_targets_refuses_an_empty_side(prompt, reply):
    with pytest.raises(ValueError, match="at least one id each"):
        assistant_targets(prompt, reply)


def test_pad_batch_by_hand():
    ids, targets = pad_batch([([1, 2], [IGNORE, 3]), ([4, 5, 6, 7], [IGNORE, IGNORE, 8, 9]), ([1], [2])], pad_id=0)
    assert ids.dtype == targets.dtype == torch.long
    assert ids.tolist() == [[1, 2, 0, 0], [4, 5, 6, 7], [1, 0, 0, 0]]
    assert targets.tolist() == [[IGNORE, 3, IGNORE, IGNORE], [IGNORE, IGNORE, 8, 9], [2, IGNORE, IGNORE, IGNORE]]


@pytest.mark.parametrize("examples, phrase", [([], "no examples"), ([([1, 2], [3])], "example 0 has 2 ids and 1 targets"),
                                              ([([1], [2]), ([], [])], "example 1 has 0 ids")])
def test_pad_batch_refuses_what_is_not_a_batch(examples, phrase):
    with pytest.raises(ValueError, match=phrase):
        pad_batch(examples, 0)


def test_right_padding_changes_no_real_position():
    model = _tiny_lm()
    short, long = [3, 4, 5], [6, 7, 8, 9, 10, 11]
    ids, _ = pad_batch([(short, short), (long, long)], pad_id=1)
    with torch.no_grad():
        alone = model(torch.tensor([short]))[0]
        batched = model(ids)[0, :3]
    torch.testing.assert_close(batched, alone, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_masked_cross_entropy_equals_f_cross_entropy_with_ignore_index(dtype):
    logits = torch.randn(3, 5, 7, generator=_gen(), dtype=dtype)
    targets = torch.randint(7, (3, 5), generator=_gen(1))
    targets[0, :3] = IGNORE
    targets[2, 4] = IGNORE
    expected = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
    out = masked_cross_entropy(logits, targets)
    assert out.shape == () and out.dtype == dtype
    torch.testing.assert_close(out, expected)


def test_masked_cross_entropy_weighs_every_counted_token_the_same():
    logits = torch.zeros(2, 3, 4)
    logits[0, 0, 1] = 10.0       # one confident right token in a one-token reply
    targets = torch.tensor([[1, IGNORE, IGNORE], [0, 1, 2]])
    by_token = (cross_entropy(logits[0, 0], torch.tensor(1)) + 3 * math.log(4)) / 4
    torch.testing.assert_close(masked_cross_entropy(logits, targets), by_token)


def test_masked_cross_entropy_refuses_nothing_to_count_and_shapes_that_differ():
    with pytest.raises(ValueError, match="every target is IGNORE"):
        masked_cross_entropy(torch.zeros(1, 2, 3), torch.full((1, 2), IGNORE))
    with pytest.raises(ValueError, match="the same batch and seq"):
        masked_cross_entropy(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer targets"):
        exact_match(torch.zeros(2, 3, 4), torch.zeros(2, 3))


def test_exact_match_by_hand():
    logits = torch.zeros(3, 3, 5)
    for row, best in enumerate([[1, 2, 3], [1, 4, 3], [0, 0, 0]]):
        logits[row, torch.arange(3), torch.tensor(best)] = 1.0
    targets = torch.tensor([[IGNORE, 2, 3], [IGNORE, 2, 3], [IGNORE, IGNORE, IGNORE]])
    assert exact_match(logits, targets).tolist() == [True, False, True]


def test_exact_match_of_a_batch_equals_greedy_decoding():
    """Teacher-forced argmax == greedy generation: a prompt followed by its own greedy continuation passes, and the
    same continuation with any one token changed fails; prompts of different lengths share one padded batch."""
    model = _tiny_lm(3)
    rng = torch.Generator().manual_seed(4)
    examples, expected = [], []
    for length in (3, 5, 8, 4):
        prompt = torch.randint(40, (length,), generator=rng).tolist()
        greedy = generate(model, torch.tensor(prompt), 6, temperature=0.0).tolist()
        examples.append(assistant_targets(prompt, greedy))
        expected.append(True)
        for position in (0, 3, 5):
            changed = list(greedy)
            changed[position] = (changed[position] + 1) % 40
            examples.append(assistant_targets(prompt, changed))
            expected.append(False)
    ids, targets = pad_batch(examples, pad_id=0)
    with torch.no_grad():
        assert exact_match(model(ids), targets).tolist() == expected


# ---- the task, the example, the interval -------------------------------------------------------------------------

def test_reverse_task_answers_the_list_reversed_and_the_splits_never_share_a_list():
    rng = random.Random(0)
    seen = {"train": set(), "test": set()}
    for split in ("train", "test"):
        for _ in range(3000):
            question, answer = reverse_task(rng, split=split)
            words = question.split(": ", 1)[1].removesuffix(". Reply with the list only.").split(", ")
            assert answer.split(", ") == words[::-1] and 3 <= len(words) <= 6 and len(set(words)) == len(words)
            assert set(words) <= set(WORDS) and held_out(tuple(words)) == (split == "test")
            seen[split].add(tuple(words))
    assert not seen["train"] & seen["test"]
    assert reverse_task(random.Random(5)) == reverse_task(random.Random(5))


def test_held_out_keeps_about_one_list_in_five():
    rng = random.Random(1)
    lists = [tuple(rng.sample(WORDS, rng.randint(3, 6))) for _ in range(20_000)]
    assert 0.18 < sum(map(held_out, lists)) / len(lists) < 0.22


def test_reverse_task_refuses_another_split():
    with pytest.raises(ValueError, match="split is 'train' or 'test'"):
        reverse_task(random.Random(0), split="valid")


def test_encode_example_trains_on_the_answer_and_its_end_only():
    specials = ["<|im_start|>", "<|im_end|>"]
    tokenizer = Tokenizer({i: bytes([i]) for i in range(256)}, [], specials)
    end = tokenizer.special_ids["<|im_end|>"]
    ids, targets = encode_example(tokenizer, "Reverse: a, b", "b, a", "Be brief.")
    prompt = chat_prompt([{"role": "user", "content": "Reverse: a, b"}], "Be brief.")
    assert tokenizer.decode(ids) == prompt + "b, a"
    assert [t for t in targets if t != IGNORE] == tokenizer.encode("b, a") + [end]
    assert len(ids) == len(targets) == len(tokenizer.encode(prompt)) + len("b, a")


Z2 = 1.96 ** 2


@pytest.mark.parametrize("correct, n, low, high, tolerance", [
    (0, 200, 0.0, Z2 / (200 + Z2), 1e-12),        # at k = 0 the interval is [0, z² / (n + z²)]: 0.0188
    (200, 200, 200 / (200 + Z2), 1.0, 1e-12),     # and at k = n, [n / (n + z²), 1]
    (10, 100, 0.0552, 0.1744, 1e-4),              # 10 %: from 5.5 % to 17.4 %
    (1, 2, 0.0945, 0.9055, 1e-4),
])
def test_wilson_interval_against_known_values(correct, n, low, high, tolerance):
    assert wilson_interval(correct, n) == pytest.approx((low, high), abs=tolerance)


@pytest.mark.parametrize("correct, n", [(3, 2), (-1, 5), (0, 0), (1.0, 2), (True, 2)])
def test_wilson_interval_refuses_impossible_counts(correct, n):
    with pytest.raises(ValueError, match="0 <= correct <= n"):
        wilson_interval(correct, n)

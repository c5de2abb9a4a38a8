"""The training module (notebook 11) against PyTorch's own: cross_entropy, AdamW, the schedule, clipping, batches
from a token file, checkpoints, and the GPT-2-style baseline."""

import io
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import DEVICES, FLOAT_DTYPES
from transformer_from_scratch import (AdamW, GPT2StyleLM, TransformerLM, cross_entropy, get_batch, gradient_clipping,
                                      load_checkpoint, lr_cosine_schedule, save_checkpoint, tokenize_file)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---- cross_entropy ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("leading", [(7,), (2, 3), (2, 1, 4)])
@pytest.mark.parametrize("shift", [0.0, 1000.0, -1000.0])
def test_cross_entropy_equals_f_cross_entropy(device, dtype, leading, shift):
    z = (3 * torch.randn(*leading, 11, generator=_gen(), dtype=dtype) + shift).to(device)
    y = torch.randint(11, leading, generator=_gen(1)).to(device)
    expected = F.cross_entropy(z.reshape(-1, 11), y.reshape(-1))
    out = cross_entropy(z, y)
    assert out.shape == () and out.dtype == dtype and torch.isfinite(out)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_cross_entropy_target_far_below_the_rest_is_exact(device):
    z = torch.full((3, 5), 1000.0, device=device)
    y = torch.tensor([0, 2, 4], device=device)
    z[torch.arange(3), y] = -1000.0
    torch.testing.assert_close(cross_entropy(z, y), torch.tensor(2000.0 + math.log(4), device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_precision_logits_are_computed_in_float32(device, half):
    z = (8 * torch.randn(16, 500, generator=_gen()) + 30).to(half).to(device)
    y = torch.randint(500, (16,), generator=_gen(1)).to(device)
    out = cross_entropy(z, y)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, F.cross_entropy(z.float(), y))


@pytest.mark.parametrize("device", DEVICES)
def test_cross_entropy_gradient_equals_f_cross_entropy(device):
    z = torch.randn(2, 3, 7, generator=_gen(), dtype=torch.float64).to(device).requires_grad_()
    y = torch.randint(7, (2, 3), generator=_gen(1)).to(device)
    cross_entropy(z, y).backward()
    reference = z.detach().clone().requires_grad_()
    F.cross_entropy(reference.reshape(-1, 7), y.reshape(-1)).backward()
    torch.testing.assert_close(z.grad, reference.grad)
    assert torch.autograd.gradcheck(lambda t: cross_entropy(t, y), (z.detach().clone().requires_grad_(),))


def test_a_uniform_model_scores_ln_v():
    assert math.isclose(cross_entropy(torch.zeros(10, 256), torch.arange(10)).item(), math.log(256), rel_tol=1e-6)


# ---- AdamW ------------------------------------------------------------------------------------------------------

def _model(dtype, device, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).to(dtype=dtype, device=device)


def _train(model, optimizer, steps, device, schedule=None, seed=0):
    gen = _gen(seed)
    for step in range(steps):
        if schedule is not None:
            for group in optimizer.param_groups:
                group["lr"] = schedule(step)
        x = torch.randn(5, 6, generator=gen, dtype=next(model.parameters()).dtype).to(device)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_adamw_equals_torch_adamw_step_for_step(device, dtype):
    ours, theirs = _model(dtype, device), _model(dtype, device)
    kwargs = dict(lr=0.01, betas=(0.8, 0.95), eps=1e-8, weight_decay=0.1)
    ours_opt, theirs_opt = AdamW(ours.parameters(), **kwargs), torch.optim.AdamW(theirs.parameters(), **kwargs)
    schedule = lambda step: lr_cosine_schedule(step, 0.01, 0.001, 3, 12)  # noqa: E731
    for step in range(15):
        _train(ours, ours_opt, 1, device, lambda _: schedule(step), seed=step)
        _train(theirs, theirs_opt, 1, device, lambda _: schedule(step), seed=step)
        for a, b in zip(ours.parameters(), theirs.parameters()):
            torch.testing.assert_close(a, b)


def test_adamw_defaults_and_param_groups_follow_torch():
    ours, theirs = _model(torch.float64, "cpu"), _model(torch.float64, "cpu")
    groups = lambda m: [{"params": m[0].parameters()}, {"params": m[2].parameters(), "lr": 0.05, "weight_decay": 0.0}]  # noqa: E731
    ours_opt, theirs_opt = AdamW(groups(ours)), torch.optim.AdamW(groups(theirs))
    _train(ours, ours_opt, 5, "cpu")
    _train(theirs, theirs_opt, 5, "cpu")
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b)


def test_adamw_skips_a_parameter_without_gradient_and_keeps_state_in_self_state():
    model = _model(torch.float64, "cpu")
    frozen = nn.Parameter(torch.ones(3, dtype=torch.float64))
    optimizer = AdamW([*model.parameters(), frozen], weight_decay=0.5)
    _train(model, optimizer, 3, "cpu")
    assert torch.equal(frozen, torch.ones(3, dtype=torch.float64)) and frozen not in optimizer.state
    state = optimizer.state[next(model.parameters())]
    assert set(state) == {"step", "exp_avg", "exp_avg_sq"} and state["step"] == 3


def test_adamw_state_dict_round_trips():
    model, copy = _model(torch.float64, "cpu"), _model(torch.float64, "cpu")
    optimizer = AdamW(model.parameters(), lr=0.02)
    _train(model, optimizer, 3, "cpu")
    copy.load_state_dict(model.state_dict())
    resumed = AdamW(copy.parameters(), lr=0.02)
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    _train(model, optimizer, 4, "cpu", seed=9)
    _train(copy, resumed, 4, "cpu", seed=9)
    for a, b in zip(model.parameters(), copy.parameters()):
        assert torch.equal(a, b)


# ---- lr_cosine_schedule -----------------------------------------------------------------------------------------

def test_the_schedule_is_the_formula():
    hi, lo, warm, end = 1.0, 0.1, 7, 21
    for it in range(30):
        if it < warm:
            expected = hi * it / warm
        elif it <= end:
            expected = lo + 0.5 * (1 + math.cos(math.pi * (it - warm) / (end - warm))) * (hi - lo)
        else:
            expected = lo
        assert math.isclose(lr_cosine_schedule(it, hi, lo, warm, end), expected, rel_tol=1e-12, abs_tol=1e-15), it
    assert lr_cosine_schedule(0, hi, lo, warm, end) == 0.0
    assert lr_cosine_schedule(warm, hi, lo, warm, end) == hi
    assert math.isclose(lr_cosine_schedule(end, hi, lo, warm, end), lo)
    assert math.isclose(lr_cosine_schedule(14, hi, lo, warm, end), (hi + lo) / 2)
    assert lr_cosine_schedule(0, hi, lo, 0, 10) == hi  # no warm-up: the cosine starts at the peak
    assert lr_cosine_schedule(np.int64(3), hi, lo, warm, end) == hi * 3 / warm


# ---- gradient_clipping ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("max_norm", [0.01, 0.5, 100.0])
def test_gradient_clipping_equals_clip_grad_norm(device, dtype, max_norm):
    shapes = [(3, 4), (4,), (2, 2, 2)]
    grads = [torch.randn(*s, generator=_gen(k), dtype=dtype).to(device) for k, s in enumerate(shapes)]
    ours = [nn.Parameter(torch.zeros_like(g)) for g in grads] + [nn.Parameter(torch.zeros(2, device=device))]
    theirs = [nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, q, g in zip(ours, theirs, grads):
        p.grad, q.grad = g.clone(), g.clone()
    norm = gradient_clipping(iter(ours), max_norm)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    torch.testing.assert_close(norm, expected)
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p.grad, q.grad)
    assert ours[-1].grad is None


def test_gradient_clipping_of_float16_gradients_computes_the_norm_in_float32():
    p = nn.Parameter(torch.zeros(1000, dtype=torch.float16))
    p.grad = torch.full((1000,), 300.0, dtype=torch.float16)  # 300² overflows float16
    norm = gradient_clipping([p], 1.0)
    assert torch.isfinite(norm) and math.isclose(norm.item(), 300.0 * math.sqrt(1000), rel_tol=1e-3)
    assert math.isclose(p.grad.float().norm().item(), 1.0, rel_tol=1e-2)


def test_gradient_clipping_without_gradients_returns_zero():
    assert gradient_clipping([nn.Parameter(torch.ones(3))], 1.0).item() == 0.0


# ---- tokenize_file and get_batch --------------------------------------------------------------------------------

def test_tokenize_file_writes_the_bytes_once_and_maps_them(tmp_path):
    text = tmp_path / "plays.txt"
    text.write_text("ROMEO: But, soft!\nJULIET: Ay me!\n", encoding="utf-8")
    tokens = tokenize_file(text)
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint8 and not tokens.flags.writeable
    assert bytes(tokens) == text.read_bytes() and (tmp_path / "plays.npy").is_file()
    written = (tmp_path / "plays.npy").stat().st_mtime_ns
    tokenize_file(text)
    assert (tmp_path / "plays.npy").stat().st_mtime_ns == written, "not written again when the text is unchanged"
    text.write_text("Exeunt\n", encoding="utf-8")
    os.utime(text, ns=(written + 10**9, written + 10**9))
    assert bytes(tokenize_file(text)) == b"Exeunt\n"
    assert not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize("device", DEVICES)
def test_get_batch_on_a_memmap(tmp_path, device):
    path = tmp_path / "tokens.bin"
    np.arange(200, dtype=np.uint16).tofile(path)
    dataset = np.memmap(path, dtype=np.uint16, mode="r")
    x, y = get_batch(dataset, 8, 16, device, generator=_gen())
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == torch.long
    assert x.device.type == y.device.type == torch.device(device).type
    assert torch.equal(y, x + 1) and torch.equal(x[:, 1:] - x[:, :-1], torch.ones(8, 15, dtype=torch.long, device=device))
    again, _ = get_batch(dataset, 8, 16, device, generator=_gen())
    assert torch.equal(x, again), "a seeded generator gives the same batch"


def test_get_batch_draws_every_valid_start_uniformly():
    x, y = get_batch(np.arange(12), 8000, 4, "cpu", generator=_gen())
    counts = torch.bincount(x[:, 0], minlength=12)
    assert counts[8:].sum() == 0 and (counts[:8] > 850).all() and (counts[:8] < 1150).all()
    assert y.max() == 11, "the last valid start's targets end on the last token"


def test_get_batch_uses_the_global_generator_without_one():
    torch.manual_seed(5)
    a, _ = get_batch(np.arange(100), 4, 8, "cpu")
    torch.manual_seed(5)
    b, _ = get_batch(np.arange(100), 4, 8, "cpu")
    assert torch.equal(a, b)


# ---- checkpoints ------------------------------------------------------------------------------------------------

def _lm(seed):
    torch.manual_seed(seed)
    return TransformerLM(32, 8, 16, 1, 2, 32, 10000.0)


def _steps(model, optimizer, batches, n):
    data = np.arange(1000) % 32
    losses = []
    for _ in range(n):
        x, y = get_batch(data, 4, 8, "cpu", generator=batches)
        loss = cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("kind", ["path", "str", "bytesio"])
def test_a_checkpoint_resumes_exactly(tmp_path, kind):
    straight_model = _lm(0)
    straight = _steps(straight_model, AdamW(straight_model.parameters(), lr=0.01), _gen(), 6)
    model = _lm(0)
    optimizer, batches = AdamW(model.parameters(), lr=0.01), _gen()
    first = _steps(model, optimizer, batches, 3)
    target = {"path": tmp_path / "ckpt.pt", "str": str(tmp_path / "ckpt.pt"), "bytesio": io.BytesIO()}[kind]
    save_checkpoint(model, optimizer, 3, target, extra={"batches": batches.get_state()})
    if kind == "bytesio":
        target.seek(0)
    other = _lm(1)
    other_optimizer = AdamW(other.parameters(), lr=0.01)
    assert load_checkpoint(target, other, other_optimizer) == 3
    if kind == "bytesio":
        target.seek(0)
    resumed_batches = _gen(7)
    resumed_batches.set_state(torch.load(target, weights_only=True)["extra"]["batches"])
    assert first + _steps(other, other_optimizer, resumed_batches, 3) == straight
    assert not list(tmp_path.glob("*.partial"))


def test_a_wrapped_model_is_saved_under_its_own_names_and_loads_without_optimizer():
    model, buffer = _lm(0), io.BytesIO()
    save_checkpoint(nn.DataParallel(model), AdamW(model.parameters()), 5, buffer)
    buffer.seek(0)
    assert set(torch.load(buffer, weights_only=True)["model"]) == set(model.state_dict())
    buffer.seek(0)
    fresh = _lm(1)
    assert load_checkpoint(buffer, nn.DataParallel(fresh)) == 5
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))


def test_a_truncated_or_foreign_checkpoint_is_refused_with_a_clear_error(tmp_path):
    model, path = _lm(0), tmp_path / "ckpt.pt"
    save_checkpoint(model, AdamW(model.parameters()), 1, path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load_checkpoint(path, model)
    buffer = io.BytesIO()
    torch.save({"weights": model.state_dict()}, buffer)
    buffer.seek(0)
    with pytest.raises(ValueError, match=r"lacks \['model', 'optimizer', 'iteration'\]"):
        load_checkpoint(buffer, model)


# ---- GPT2StyleLM ------------------------------------------------------------------------------------------------

def test_gpt2_style_lm_is_causal_handles_leading_dimensions_and_starts_near_ln_v():
    torch.manual_seed(0)
    model = GPT2StyleLM(50, 16, 32, 2, 4, 128)
    ids = torch.randint(50, (2, 3, 10))
    logits = model(ids)
    assert logits.shape == (2, 3, 10, 50)
    torch.testing.assert_close(logits[1, 2], model(ids[1, 2]))
    changed = ids.clone()
    changed[..., 6:] = (changed[..., 6:] + 1) % 50
    torch.testing.assert_close(model(changed)[..., :6, :], logits[..., :6, :])
    loss = cross_entropy(logits[..., :-1, :], ids[..., 1:])
    assert abs(loss.item() - math.log(50)) < 0.05


def test_gpt2_style_lm_has_the_parameters_of_gpt2s_block():
    d, d_ff, vocab, context, layers = 64, 256, 256, 64, 2
    model = GPT2StyleLM(vocab, context, d, layers, 4, d_ff)
    per_layer = 4 * d * d + 4 * d + 2 * d * d_ff + d_ff + d + 4 * d
    assert sum(p.numel() for p in model.parameters()) == vocab * d + context * d + layers * per_layer + 2 * d + d * vocab
    assert sum(p.numel() for p in model.parameters()) - sum(
        p.numel() for p in TransformerLM(vocab, context, d, layers, 4, 185, 10000.0).parameters()) == 64

"""`make finetune` (transformer_from_scratch.tune): the adapter files and their round trip, the refusal of truncated and
foreign adapters and checkpoints, exact resume after --stop-at, SIGTERM and kill -9, no silent overwrite, two
processes under torchrun against one, and `make chat --adapter`. On notebook 14's tiny random llama GGUF file (with a
context of 512, as a question of the task needs): each run takes a second or two."""

import json
import random
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from running import start, wait_for
from safetensors.torch import load_file

from transformer_from_scratch import chat as chat_cli
from transformer_from_scratch import finetune
from transformer_from_scratch import tune
from transformer_from_scratch.checks import _tiny_gguf
from transformer_from_scratch.finetune import apply_lora
from transformer_from_scratch.pretrained import load_gguf

ALL = ("q_proj", "k_proj", "v_proj", "output_proj", "w1", "w2", "w3")
SMALL = ["--batch-size", "4", "--eval-examples", "4", "--eval-batch-size", "4", "--threads", "1", "--no-progress"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """The tiny GGUF file of notebook 14's checks, with a context of 512 tokens (its 64 hold no question)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(_tiny_gguf.SIZES, "context_length", 512)
        return Path(_tiny_gguf.write_tiny_gguf(tmp_path_factory.mktemp("weights") / "tiny.gguf"))


def flags(tiny: Path, out: Path, *extra: str) -> list[str]:
    return ["--weights", str(tiny), "--out-dir", str(out), *SMALL, *extra]


def adapter_bytes(out: Path) -> bytes:
    return (out / tune.ADAPTER_WEIGHTS).read_bytes()


def checkpoint_adapter(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / tune.CHECKPOINT, weights_only=True)["adapter"]


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / tune.METRICS).read_text().splitlines()]


def with_random_adapter(tiny: Path, targets=ALL, rank: int = 4, seed: int = 0):
    """The tiny model with LoRA on `targets`, lora_B random (nonzero), and its tokenizer."""
    model, tokenizer = load_gguf(tiny)
    torch.manual_seed(seed)
    for lora in apply_lora(model, targets, rank=rank, alpha=2.0 * rank).values():
        with torch.no_grad():
            lora.lora_B.normal_(std=0.1)
    return model, tokenizer


def test_the_steps_logits_are_the_models_at_the_replies_positions(tiny):
    """make finetune's step runs the LM head on the counted positions only: the same logits as the whole model's
    there, and a loss and gradients equal to the full forward's."""
    model, tokenizer = with_random_adapter(tiny)
    examples = [finetune.encode_example(tokenizer, *finetune.reverse_task(random.Random(k), split="train"), None)
                for k in range(3)]
    ids, targets = finetune.pad_batch(examples, 0)
    counted = targets != finetune.IGNORE
    assert 0 < counted.sum() < counted.numel()
    ours = tune.reply_logits(model, ids, counted)
    full = model(ids)
    torch.testing.assert_close(ours, full[counted], rtol=1e-5, atol=1e-5)
    trained = [p for p in model.parameters() if p.requires_grad]
    grads = []
    for loss in (finetune.masked_cross_entropy(ours[None], targets[counted][None]),
                 finetune.masked_cross_entropy(full, targets)):
        grads.append(torch.autograd.grad(loss, trained))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------- the adapter files

def test_rows_to_hf_is_transformers_reverse_permutation_and_rows_from_hf_undoes_it():
    """transformers' GGUF loader permutes the rows of q_proj (heads) and k_proj (key/value heads): rows_to_hf is
    that permutation, on any matrix whose rows are output features, and rows_from_hf its inverse."""
    processor = pytest.importorskip("transformers.modeling_gguf_pytorch_utils").LlamaTensorProcessor
    # (rows, the heads and key/value heads transformers is given, the heads of those rows): SmolLM2's q_proj and
    # k_proj, the tiny model's
    for n_rows, heads, kv_heads, ours in [(576, 9, 9, 9), (192, 9, 3, 3), (64, 4, 4, 4), (32, 4, 2, 2)]:
        b = torch.randn(n_rows, 8)
        expected = torch.from_numpy(processor()._reverse_permute_weights(b.numpy(), heads, kv_heads))
        assert torch.equal(tune.rows_to_hf(b, ours), expected)
        assert torch.equal(tune.rows_from_hf(expected, ours), b)
        assert not torch.equal(expected, b)


def test_save_then_load_gives_identical_logits_and_peft_names(tiny, tmp_path):
    model, tokenizer = with_random_adapter(tiny)
    ids = torch.tensor([tokenizer.encode("<|im_start|>user\nHello there<|im_end|>\n")])
    with torch.no_grad():
        expected = model(ids)
    tune.save_adapter(model, tmp_path)
    config = json.loads((tmp_path / tune.ADAPTER_CONFIG).read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"], config["lora_dropout"], config["bias"],
            config["task_type"], config["fan_in_fan_out"]) == ("LORA", 4, 8.0, 0.0, "none", "CAUSAL_LM", False)
    assert config["target_modules"] == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj",
                                               "up_proj"])
    tensors = load_file(tmp_path / tune.ADAPTER_WEIGHTS)
    assert len(tensors) == 2 * 7 * 2
    q = model.layers[1].attn.q_proj
    assert torch.equal(tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"], q.lora_A)
    assert torch.equal(tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"],
                       tune.rows_to_hf(q.lora_B.detach(), 4))  # 4 heads
    w1 = model.layers[0].ffn.w1
    assert torch.equal(tensors["base_model.model.model.layers.0.mlp.gate_proj.lora_B.weight"], w1.lora_B)
    fresh, _ = load_gguf(tiny)
    loras = tune.load_adapter(fresh, tmp_path)
    assert list(loras) == list(tune.adapters_of(model))
    with torch.no_grad():
        assert torch.equal(fresh(ids), expected)


def _corrupt(directory: Path, how: str) -> None:
    config_path, weights_path = directory / tune.ADAPTER_CONFIG, directory / tune.ADAPTER_WEIGHTS
    config = json.loads(config_path.read_text())
    if how == "truncated weights":
        weights_path.write_bytes(weights_path.read_bytes()[:1000])
    elif how == "truncated config":
        config_path.write_text(config_path.read_text()[:40])
    elif how == "no weights":
        weights_path.unlink()
    elif how == "another rank":
        config_path.write_text(json.dumps(dict(config, r=8)))
    elif how == "another model's layers":
        tensors = load_file(weights_path)
        tensors = {k.replace("layers.1.", "layers.7."): v for k, v in tensors.items()}
        from safetensors.torch import save_file
        save_file(tensors, weights_path)
    elif how == "prefix tuning":
        config_path.write_text(json.dumps(dict(config, peft_type="PREFIX_TUNING")))
    elif how == "dora":
        config_path.write_text(json.dumps(dict(config, use_dora=True)))
    elif how == "lm_head":
        config_path.write_text(json.dumps(dict(config, target_modules=["q_proj", "lm_head"])))
    elif how == "no directory":
        for path in (config_path, weights_path):
            path.unlink()


@pytest.mark.parametrize("how, message", [
    ("truncated weights", r"adapter_model.safetensors is not a readable safetensors file \(truncated\?\)"),
    ("truncated config", r"adapter_config.json is not valid JSON \(truncated\?\)"),
    ("no weights", r"has adapter_config.json but no adapter_model.safetensors"),
    ("another rank", r"does not fit this model: 8 tensors of other shapes or not floats, the first "
                     r"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight \(4, 64\) \(this model's: "
                     r"\(8, 64\)\)"),
    ("another model's layers", r"does not fit this model: 4 keys missing \(the first: base_model.model.model.layers.1"
                               r".self_attn.q_proj.lora_A.weight\); 4 keys this model has no place for"),
    ("prefix tuning", r"is a 'PREFIX_TUNING' adapter, not peft's 'LORA'"),
    ("dora", r"load_adapter reads plain LoRA .* this adapter has use_dora True"),
    ("lm_head", r"target_modules \['lm_head'\] are not among transformers' Llama names"),
    ("no directory", r"no LoRA adapter in .*: it has no adapter_config.json"),
])
def test_a_truncated_or_foreign_adapter_is_refused_in_one_line_and_the_model_is_left_as_it_was(tiny, tmp_path, how,
                                                                                               message):
    model, _ = with_random_adapter(tiny, targets=("q_proj", "v_proj"))
    tune.save_adapter(model, tmp_path)
    _corrupt(tmp_path, how)
    fresh, _ = load_gguf(tiny)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(ValueError, match=message) as error:
        tune.load_adapter(fresh, tmp_path)
    assert "\n" not in str(error.value)
    assert not tune.adapters_of(fresh)
    assert all(torch.equal(v, before[k]) for k, v in fresh.state_dict().items())


# ---------------------------------------------------------------- the program

def test_a_run_writes_the_adapter_metrics_and_the_accuracies(tiny, tmp_path, capsys):
    out = tmp_path / "run"
    summary = tune.main(flags(tiny, out, "--steps", "4", "--checkpoint-every", "2", "--rank", "2", "--alpha", "4",
                              "--targets", "q_proj,o_proj,gate_proj"))
    assert summary["stopped"] is False and summary["step"] == 4
    assert [r["step"] for r in rows(out)] == [1, 2, 3, 4]
    assert set(rows(out)[0]) == {"step", "loss", "exact_match", "lr", "grad_norm", "elapsed_s"}
    results = json.loads((out / tune.RESULTS).read_text())
    assert results["before"]["n"] == results["after"]["n"] == 4
    printed = capsys.readouterr()
    err = printed.err
    assert "LoRA rank 2, alpha 4 on q_proj, output_proj, w1 (6 matrices)" in err
    assert "held-out exact match before: " in err
    config = json.loads((out / tune.ADAPTER_CONFIG).read_text())
    assert config["target_modules"] == ["gate_proj", "o_proj", "q_proj"] and config["r"] == 2
    model, _ = load_gguf(tiny)
    loras = tune.load_adapter(model, out)  # the adapter the run ended with, from peft's layout
    saved = checkpoint_adapter(out)
    for path, lora in loras.items():
        assert torch.equal(lora.lora_A, saved[f"{path}.lora_A"]) and torch.equal(lora.lora_B, saved[f"{path}.lora_B"])
        assert lora.lora_B.abs().max() > 0  # trained away from its zero start
    assert not list(out.glob("*.partial"))
    # What it forgot: the loss per byte of the held-out plays, by the model as loaded and by the model with its adapter
    # merged, computed here from the files the run wrote.
    text = tune.PLAYS.read_text(encoding="utf-8")[:6_000]
    base, tokenizer = load_gguf(tiny)
    ids = torch.tensor(tokenizer.encode(text)[:1024]).view(4, 256)
    nbytes = sum(len(tokenizer.vocab[i]) for i in ids[:, 1:].flatten().tolist())
    for when, model in (("before", base), ("after", merged(tiny, out))):
        with torch.no_grad():
            nats = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten(),
                                                     reduction="sum").item()
        assert results["plays_loss_per_byte"][when] == pytest.approx(nats / nbytes, rel=1e-5), when
    assert results["plays_loss_per_byte"]["after"] != results["plays_loss_per_byte"]["before"]
    assert "what it forgot: the loss on Shakespeare's held-out plays" in printed.out


def merged(tiny: Path, out: Path) -> torch.nn.Module:
    model, _ = load_gguf(tiny)
    for lora in tune.load_adapter(model, out).values():
        lora.merge()
    return model


@pytest.mark.parametrize("stop", [1, 3])
def test_a_run_stopped_at_any_step_and_resumed_writes_the_adapter_of_one_never_stopped(tiny, tmp_path, stop):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    tune.main(flags(tiny, straight, "--steps", "6", "--checkpoint-every", "4"))
    assert tune.main(flags(tiny, stopped, "--steps", "6", "--checkpoint-every", "4", "--stop-at", str(stop))) == \
        dict(step=stop, stopped=True)
    assert not (stopped / tune.ADAPTER_WEIGHTS).exists()
    tune.main(flags(tiny, stopped, "--resume"))
    assert adapter_bytes(stopped) == adapter_bytes(straight)
    assert [r["loss"] for r in rows(stopped)] == [r["loss"] for r in rows(straight)]
    assert json.loads((stopped / tune.RESULTS).read_text())["after"] == \
        json.loads((straight / tune.RESULTS).read_text())["after"]


def _start(tiny: Path, out: Path, *extra: str) -> subprocess.Popen:
    return start("transformer_from_scratch.tune", *flags(tiny, out, *extra))


def test_sigterm_finishes_the_step_saves_and_the_resumed_run_is_the_run_never_stopped(tiny, tmp_path):
    out, straight = tmp_path / "run", tmp_path / "straight"
    long = ["--steps", "100000", "--checkpoint-every", "100000"]
    child = _start(tiny, out, *long)
    wait_for(child, lambda: (out / tune.METRICS).is_file() and len(rows(out)) >= 3)
    child.send_signal(signal.SIGTERM)
    _, stderr = child.communicate(timeout=60)
    assert child.returncode == 0, stderr
    step = torch.load(out / tune.CHECKPOINT, weights_only=True)["step"]
    assert "SIGTERM: finishing this step" in stderr and f"stopped after step {step} of 100000" in stderr
    assert "go on with `make finetune FINETUNE_ARGS=\"--resume --out-dir" in stderr
    tune.main(flags(tiny, out, "--resume", "--stop-at", str(step + 3)))
    tune.main(flags(tiny, straight, *long, "--stop-at", str(step + 3)))
    for name, tensor in checkpoint_adapter(straight).items():
        assert torch.equal(tensor, checkpoint_adapter(out)[name]), name
    assert [r["loss"] for r in rows(out)] == [r["loss"] for r in rows(straight)]


def test_kill_9_then_resume_from_the_last_checkpoint_is_the_run_never_stopped(tiny, tmp_path):
    out, straight = tmp_path / "run", tmp_path / "straight"
    long = ["--steps", "100000", "--checkpoint-every", "5"]
    child = _start(tiny, out, *long)

    def saved_and_on():
        if not (out / tune.CHECKPOINT).is_file() or not (out / tune.METRICS).is_file():
            return False
        return len(rows(out)) >= 7  # killed after the checkpoint of step 5, with rows logged past it
    wait_for(child, saved_and_on)
    child.kill()
    child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    saved = torch.load(out / tune.CHECKPOINT, weights_only=True)["step"]
    stop = saved + 4
    tune.main(flags(tiny, out, "--resume", "--stop-at", str(stop)))
    assert [r["step"] for r in rows(out)] == list(range(1, stop + 1))  # the rows after the checkpoint logged again
    tune.main(flags(tiny, straight, *long, "--stop-at", str(stop)))
    for name, tensor in checkpoint_adapter(straight).items():
        assert torch.equal(tensor, checkpoint_adapter(out)[name]), name
    assert [r["loss"] for r in rows(out)] == [r["loss"] for r in rows(straight)]


def test_an_out_dir_that_holds_a_fine_tune_is_never_overwritten_without_asking(tiny, tmp_path, capsys):
    out = tmp_path / "run"
    tune.main(flags(tiny, out, "--steps", "2"))
    adapter = adapter_bytes(out)
    with pytest.raises(SystemExit, match=r"holds a fine-tune \(checkpoint.pt, adapter_model.safetensors, "
                                         r"adapter_config.json\): --resume to go on with it, --overwrite to start"):
        tune.main(flags(tiny, out, "--steps", "2"))
    (out / tune.CHECKPOINT).unlink()  # an adapter alone is protected too
    with pytest.raises(SystemExit, match=r"holds a fine-tune \(adapter_model.safetensors"):
        tune.main(flags(tiny, out, "--steps", "2"))
    assert adapter_bytes(out) == adapter
    with pytest.raises(SystemExit, match=r"--resume goes on .* --overwrite starts it again: not both"):
        tune.main(flags(tiny, out, "--resume", "--overwrite"))
    assert tune.main(flags(tiny, out, "--steps", "2", "--seed", "1", "--overwrite"))["step"] == 2
    assert adapter_bytes(out) != adapter
    capsys.readouterr()
    assert tune.main(flags(tiny, out, "--resume")) == dict(step=2, stopped=False)
    assert "already finished at step 2" in capsys.readouterr().out


def test_a_truncated_or_foreign_checkpoint_stops_resume_in_one_line_and_is_left_as_it_is(tiny, tmp_path):
    out = tmp_path / "run"
    tune.main(flags(tiny, out, "--steps", "4", "--stop-at", "2"))
    path = out / tune.CHECKPOINT
    whole = path.read_bytes()
    path.write_bytes(whole[:3000])
    cases = [(r"checkpoint.pt is not a readable checkpoint \(truncated or not written by torch.save\)", None)]
    cases.append((r"checkpoint.pt is not a checkpoint of transformer_from_scratch.tune: it has no format",
                  dict(model={}, optimizer={}, iteration=3, extra=dict(format="transformer_from_scratch.train/1"))))
    for message, content in cases:
        if content is not None:
            torch.save(content, path)
        before = path.read_bytes()
        with pytest.raises(SystemExit, match=message) as error:
            tune.main(flags(tiny, out, "--resume"))
        assert "\n" not in str(error.value) and path.read_bytes() == before
    path.write_bytes(whole)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["adapter"]["layers.0.attn.q_proj.lora_A"] = torch.zeros(3, 3)
    torch.save(checkpoint, path)
    with pytest.raises(SystemExit, match=r"--resume: the checkpoint's adapters do not fit the model "
                                         r"\(layers.0.attn.q_proj.lora_A and 0 more\)"):
        tune.main(flags(tiny, out, "--resume"))


def test_resume_refuses_other_training_settings_and_takes_other_operational_ones(tiny, tmp_path, capsys):
    out = tmp_path / "run"
    tune.main(flags(tiny, out, "--steps", "4", "--stop-at", "2"))
    with pytest.raises(SystemExit, match=r"--resume continues the fine-tune .* these settings differ: --rank 4 \(the "
                                         r"checkpoint's: 8\); --targets 'q_proj,k_proj' \(the checkpoint's: "
                                         r"'q_proj,v_proj'\)"):
        tune.main(flags(tiny, out, "--resume", "--rank", "4", "--targets", "k_proj,q_proj"))
    assert tune.main(flags(tiny, out, "--resume", "--targets", "v_proj,q_proj", "--eval-examples", "6"))["after"]["n"] \
        == 6
    results = json.loads((out / tune.RESULTS).read_text())
    assert results["before"]["n"] == 6  # graded again, adapters off, on the 6 lists


@pytest.mark.parametrize("extra, message", [
    (["--targets", "lm_head"], r"--targets must be a comma list of q_proj, k_proj"),
    (["--rank", "0"], r"--rank must be >= 1, got 0"),
    (["--lr", "0"], r"--lr must be a number > 0, got 0.0"),
    (["--batch-size", "0"], r"--batch-size must be >= 1"),
    (["--rank", "100"], r"--targets/--rank: LoRALinear: rank must be an int in \[1, min\(d_in, d_out\)\]"),
    (["--weights", "no/such.gguf"], r"--weights: no GGUF file at no/such.gguf"),
    (["--stop-at", "0"], r"--stop-at must be >= 1, got 0"),
])
def test_bad_settings_stop_with_one_line_that_names_the_value(tiny, tmp_path, extra, message):
    with pytest.raises(SystemExit, match=message) as error:
        tune.main(flags(tiny, tmp_path / "run", "--steps", "2", *extra))
    assert "\n" not in str(error.value)


def test_two_processes_under_torchrun_write_the_adapter_of_one(tiny, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    settings = ["--steps", "5", "--eval-examples", "6"]
    tune.main(flags(tiny, one, *settings))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "transformer_from_scratch.tune", *flags(tiny, two, *settings)], env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 process(es) on cpu" in done.stderr and done.stderr.count("LoRA rank") == 1  # rank 0 alone reports
    for a, b in zip(rows(one), rows(two), strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and a["exact_match"] == b["exact_match"]
    mine, theirs = load_file(one / tune.ADAPTER_WEIGHTS), load_file(two / tune.ADAPTER_WEIGHTS)
    assert mine.keys() == theirs.keys()
    for name, tensor in mine.items():
        torch.testing.assert_close(theirs[name], tensor, rtol=1e-4, atol=1e-6, msg=name)
    results = [json.loads((out / tune.RESULTS).read_text()) for out in (one, two)]
    assert results[0]["after"] == results[1]["after"] and results[1]["processes"] == 2


# ---------------------------------------------------------------- make chat --adapter

def test_chat_adapter_merges_the_adapter_into_the_weights(tiny, tmp_path, monkeypatch, capsys):
    model, _ = with_random_adapter(tiny, targets=("q_proj", "v_proj", "w2"))
    tune.save_adapter(model, tmp_path)
    seen = []

    class Spy(chat_cli.Session):
        def __init__(self, pretrained, model, tokenizer, args):
            seen.append(model)
            super().__init__(pretrained, model, tokenizer, args)

    monkeypatch.setattr(chat_cli, "Session", Spy)
    assert chat_cli.main(["--weights", str(tiny), "--adapter", str(tmp_path), "--prompt", "Hello",
                          "--max-new-tokens", "4", "--threads", "1"]) == 0
    assert f"LoRA adapter {tmp_path} merged (rank 4, alpha 8 on q_proj, v_proj, w2: 6 matrices)" in \
        capsys.readouterr().err
    chatted, = seen
    base, _ = load_gguf(tiny)
    for path, lora in tune.adapters_of(model).items():
        merged = chatted.get_submodule(path)
        assert merged.merged
        expected = base.get_submodule(path).weight + lora.scaling * (lora.lora_B @ lora.lora_A)
        torch.testing.assert_close(merged.base.weight, expected.detach(), rtol=0, atol=1e-6)


def test_chat_adapter_errors_are_one_line_and_exit_2(tiny, tmp_path, capsys):
    assert chat_cli.main(["--weights", str(tiny), "--adapter", str(tmp_path / "none"), "--prompt", "Hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"chat: --adapter {tmp_path / 'none'}: no adapter_config.json there") and err.count("\n") == 1
    model, _ = with_random_adapter(tiny, targets=("q_proj",))
    tune.save_adapter(model, tmp_path)
    (tmp_path / tune.ADAPTER_WEIGHTS).write_bytes((tmp_path / tune.ADAPTER_WEIGHTS).read_bytes()[:500])
    assert chat_cli.main(["--weights", str(tiny), "--adapter", str(tmp_path), "--prompt", "Hi", "--threads", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("chat: --adapter: ") and "is not a readable safetensors file" in err[-1]


def test_package_loads_with_its_own_pretrained_and_adapts_with_its_finetune_where_it_has_one(tiny, tmp_path,
                                                                                           monkeypatch, capsys):
    """--package NAME: NAME.pretrained.load_gguf loads the model, NAME.finetune (a learner's notebook 15) adapts it;
    a package without finetune gets the course's, and says so."""
    package = tmp_path / "packages" / "mine"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "pretrained.py").write_text("from transformer_from_scratch.pretrained import chat, load_gguf  # noqa\n"
                                           "loads = []\n_real = load_gguf\n"
                                           "def load_gguf(path, **kwargs):\n"
                                           "    loads.append(path)\n    return _real(path, **kwargs)\n")
    monkeypatch.syspath_prepend(str(package.parent))
    tune.main(flags(tiny, tmp_path / "a", "--steps", "2", "--package", "mine"))
    assert "--package mine: it has no finetune module yet (notebook 15)" in capsys.readouterr().err
    assert len(sys.modules["mine.pretrained"].loads) == 1
    (package / "finetune.py").write_text("from transformer_from_scratch.finetune import *  # noqa\n"
                                         "from transformer_from_scratch.finetune import apply_lora as _real\n"
                                         "calls = []\n"
                                         "def apply_lora(*args, **kwargs):\n"
                                         "    calls.append(args)\n    return _real(*args, **kwargs)\n")
    tune.main(flags(tiny, tmp_path / "b", "--steps", "2", "--package", "mine"))
    assert "no finetune module" not in capsys.readouterr().err
    assert len(sys.modules["mine.finetune"].calls) == 1
    assert adapter_bytes(tmp_path / "a") == adapter_bytes(tmp_path / "b")  # the same code: the same adapter
    for name in [name for name in sys.modules if name.partition(".")[0] == "mine"]:
        del sys.modules[name]

"""`make train` (transformer_from_scratch.train): outputs, exact resume, Ctrl-C, NaN, bad checkpoints and settings,
sampling, BPE tokens, and two processes under torchrun against one. Tiny models on a slice of the corpus: seconds
each."""

import dataclasses
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from running import start, wait_for

from transformer_from_scratch import sample
from transformer_from_scratch import train as tr
from transformer_from_scratch._project import repo_root
from transformer_from_scratch.data import ByteTokenizer
from transformer_from_scratch.reference import ReferenceLM
from transformer_from_scratch.tokenizer import Tokenizer
from transformer_from_scratch.training import AdamW, save_checkpoint

REPO = repo_root()
CORPUS = REPO / "notebooks" / "data" / "shakespeare"
TINY = ["--d-model", "16", "--num-layers", "1", "--num-heads", "2", "--context-length", "16", "--batch-size", "4",
        "--warmup-steps", "2", "--eval-every", "4", "--eval-batches", "2", "--log-every", "1", "--sample-tokens", "20",
        "--no-progress"]
BPE = ["--tokenizer", "bpe", "--vocab-size", "300"]  # 44 merges of the tiny corpus


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and never fight a busy machine's other processes for the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, Path]:
    """20 KB of the training plays and 5 KB of the held-out ones, in a folder of the test's own."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").write_bytes((CORPUS / "train.txt").read_bytes()[:20_000])
    (data / "heldout.txt").write_bytes((CORPUS / "heldout.txt").read_bytes()[:5_000])
    return data / "train.txt", data / "heldout.txt"


def args(corpus, out: Path, *extra: str) -> list[str]:
    return ["--train-data", str(corpus[0]), "--val-data", str(corpus[1]), "--out-dir", str(out), *TINY, *extra]


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "checkpoint.pt", weights_only=True)["model"]


def tokenizer_files(out: Path) -> dict[str, tuple[int, bytes]]:
    """The BPE tokenizer's files of a run: each one's modification time and contents."""
    return {name: ((out / name).stat().st_mtime_ns, (out / name).read_bytes()) for name in ("vocab.json", "merges.txt")}


def test_the_defaults_are_written_once_in_TrainConfig(monkeypatch):
    """make train without arguments trains TrainConfig() itself, and the package's config files only change settings:
    each key a setting, no value its default."""
    runs = []
    monkeypatch.setattr(tr, "train", lambda config, **options: runs.append((config, options["requested"])))
    tr.main([])
    assert runs == [(tr.TrainConfig(), {})]
    defaults = dataclasses.asdict(tr.TrainConfig())
    files = sorted(tr.CONFIGS.glob("*.json"))
    assert files, f"no example config in {tr.CONFIGS}"
    for path in files:
        settings = tr.read_config_file(path)  # SystemExit for a key that is not a setting
        repeated = {name: value for name, value in settings.items() if value == defaults[name]}
        assert not repeated, f"{path.name} repeats TrainConfig's defaults {repeated}"
        tr.main(["--config", str(path)])
        assert runs[-1] == (tr.TrainConfig(**settings), settings)


def test_a_run_writes_metrics_a_curve_samples_and_a_checkpoint(corpus, tmp_path):
    out = tmp_path / "run"
    summary = tr.main(args(corpus, out, "--max-steps", "10", "--checkpoint-every", "5"))
    logged = rows(out)
    assert [r["step"] for r in logged] == list(range(1, 11))
    assert set(logged[0]) == {"step", "tokens", "train_loss", "val_loss", "val_loss_per_byte", "lr", "grad_norm",
                              "tokens_per_s", "elapsed_s"}
    assert [r["step"] for r in logged if r["val_loss"] is not None] == [4, 8, 10]
    assert logged[-1]["tokens"] == 10 * 4 * 16 and summary["val_loss"] == logged[-1]["val_loss"]
    assert logged[0]["train_loss"] > logged[-1]["train_loss"]  # it learns, from about ln 256
    assert abs(logged[0]["train_loss"] - math.log(256)) < 0.5
    assert logged[0]["lr"] == pytest.approx(1.5e-3) and logged[-1]["lr"] == pytest.approx(3e-4)  # warm-up, cosine end
    assert (out / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    samples = (out / "samples.txt").read_text()
    assert "ROMEO:\n" in samples and "KING HENRY:\nWhat" in samples
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    assert checkpoint["iteration"] == 10 and checkpoint["extra"]["config"]["d_model"] == 16
    assert (checkpoint["extra"]["config"]["tokenizer"], checkpoint["extra"]["config"]["vocab_size"]) == ("bytes", 256)
    assert not list(out.glob("*.partial"))  # written to a temporary file, then renamed
    assert not list(out.glob("*.npy")) and not (out / "vocab.json").exists()  # bytes: tokenize_file's, by the text


def test_log_rows_hold_the_mean_loss_since_the_last_row(corpus, tmp_path):
    every_step, every_third = tmp_path / "a", tmp_path / "b"
    tr.main(args(corpus, every_step, "--max-steps", "6"))
    tr.main(args(corpus, every_third, "--max-steps", "6", "--log-every", "3", "--eval-every", "6"))
    losses = [r["train_loss"] for r in rows(every_step)]
    assert [r["train_loss"] for r in rows(every_third)] == pytest.approx([sum(losses[:3]) / 3, sum(losses[3:]) / 3])


@pytest.mark.parametrize("stop, tokens", [(1, []), (3, []), (6, []), (3, BPE)], ids=["1", "3", "6", "3-bpe"])
def test_a_run_stopped_at_any_step_and_resumed_ends_bit_for_bit_as_one_never_stopped(corpus, tmp_path, stop, tokens):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    tr.main(args(corpus, straight, "--max-steps", "8", "--checkpoint-every", "4", *tokens))
    summary = tr.main(args(corpus, stopped, "--max-steps", "8", "--checkpoint-every", "4", "--stop-at", str(stop),
                           *tokens))
    assert summary == dict(step=stop, stopped=True, val_loss=summary["val_loss"],
                           val_loss_per_byte=summary["val_loss_per_byte"])
    assert [r["step"] for r in rows(stopped)] == list(range(1, stop + 1))
    tr.main(args(corpus, stopped, "--resume"))
    assert [r["train_loss"] for r in rows(stopped)] == [r["train_loss"] for r in rows(straight)]
    assert [r["val_loss"] for r in rows(stopped)] == [r["val_loss"] for r in rows(straight)]
    for name, tensor in weights(straight).items():
        assert torch.equal(tensor, weights(stopped)[name]), name
    assert (stopped / "samples.txt").read_text() == (straight / "samples.txt").read_text()


def test_log_rows_written_after_the_last_checkpoint_are_dropped_on_resume(corpus, tmp_path):
    out = tmp_path / "run"
    tr.main(args(corpus, out, "--max-steps", "8", "--stop-at", "3"))
    with (out / "metrics.jsonl").open("a") as file:  # a run killed after logging step 4, before saving it
        file.write(json.dumps(dict(rows(out)[-1], step=4)) + "\n")
    tr.main(args(corpus, out, "--resume", "--stop-at", "5"))
    assert [r["step"] for r in rows(out)] == [1, 2, 3, 4, 5]


def test_ctrl_c_finishes_the_step_saves_and_exits_cleanly(corpus, tmp_path):
    out = tmp_path / "run"
    child = start("transformer_from_scratch.train", *args(corpus, out, "--max-steps", "100000",
                                                          "--checkpoint-every", "100000"))
    wait_for(child, lambda: (out / "metrics.jsonl").is_file() and len(rows(out)) >= 3)
    child.send_signal(signal.SIGINT)
    _, stderr = child.communicate(timeout=60)
    assert child.returncode == 0, stderr
    step = torch.load(out / "checkpoint.pt", weights_only=True)["iteration"]
    assert "Ctrl-C: finishing this step" in stderr and f"stopped after step {step} of 100000" in stderr
    assert [r["step"] for r in rows(out)] == list(range(1, step + 1))
    # The state saved on Ctrl-C is the state of a run stopped at that step.
    same = tmp_path / "same"
    tr.main(args(corpus, same, "--max-steps", "100000", "--checkpoint-every", "100000", "--stop-at", str(step)))
    for name, tensor in weights(same).items():
        assert torch.equal(tensor, weights(out)[name]), name


def test_a_loss_that_is_not_finite_stops_the_run_and_keeps_the_last_good_checkpoint(corpus, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match=r"the (loss|gradient norm) is (nan|inf) at step \d+ .*: stopped before the "
                                         r"update; the last good checkpoint, of step \d+, is kept at"):
        tr.main(args(corpus, out, "--max-steps", "10", "--warmup-steps", "0", "--max-lr", "1e30", "--min-lr", "1e30",
                     "--checkpoint-every", "1"))
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    assert checkpoint["iteration"] >= 1
    assert all(torch.isfinite(t).all() for t in checkpoint["model"].values())


def test_a_truncated_checkpoint_stops_resume_with_a_clear_error_and_is_left_as_it_is(corpus, tmp_path):
    out = tmp_path / "run"
    tr.main(args(corpus, out, "--max-steps", "4", "--stop-at", "2"))
    path = out / "checkpoint.pt"
    path.write_bytes(path.read_bytes()[:2000])
    before = path.read_bytes()
    with pytest.raises(SystemExit, match=r"checkpoint.pt is not a readable checkpoint \(truncated"):
        tr.main(args(corpus, out, "--resume"))
    assert path.read_bytes() == before


def test_a_foreign_checkpoint_stops_resume_naming_what_does_not_fit(corpus, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    model = torch.nn.Linear(2, 2)
    save_checkpoint(model, AdamW(model.parameters()), 3, out / "checkpoint.pt")
    with pytest.raises(SystemExit, match=r"not a checkpoint of transformer_from_scratch.train: it has no "
                                         r"extra\['format'\]"):
        tr.main(args(corpus, out, "--resume"))
    tr.main(args(corpus, tmp_path / "good", "--max-steps", "4", "--stop-at", "2"))
    checkpoint = torch.load(tmp_path / "good" / "checkpoint.pt", weights_only=True)
    checkpoint["model"]["lm_head.weight"] = torch.zeros(3, 3)
    torch.save(checkpoint, out / "checkpoint.pt")
    with pytest.raises(SystemExit, match=r"--resume: load_checkpoint: .* other shapes "
                                         r"\[.lm_head.weight \(3, 3\) \(the model's: \(256, 16\)\)"):
        tr.main(args(corpus, out, "--resume"))


def test_resume_and_sample_read_the_checkpoint_once(corpus, tmp_path, monkeypatch):
    out = tmp_path / "run"
    tr.main(args(corpus, out, "--max-steps", "4", "--stop-at", "2"))
    loads, real_load = [], torch.load

    def counting_load(source, *rest, **options):
        loads.append(source)
        return real_load(source, *rest, **options)

    monkeypatch.setattr(torch, "load", counting_load)
    assert tr.main(args(corpus, out, "--resume"))["step"] == 4
    assert loads == [out / "checkpoint.pt"]
    loads.clear()
    tr.main(["sample", "--checkpoint", str(out / "checkpoint.pt"), "--max-new-tokens", "5", "--device", "cpu"])
    assert loads == [out / "checkpoint.pt"]


def test_a_checkpoint_without_its_parts_or_with_other_shapes_stops_resume_and_sample(corpus, tmp_path):
    out = tmp_path / "run"
    tr.main(args(corpus, out, "--max-steps", "4", "--stop-at", "2"))
    path = out / "checkpoint.pt"
    good = torch.load(path, weights_only=True)
    torch.save({k: v for k, v in good.items() if k != "optimizer"}, path)
    with pytest.raises(SystemExit, match=r"checkpoint.pt is not a checkpoint of save_checkpoint, it lacks "
                                         r"\['optimizer'\]"):
        tr.main(args(corpus, out, "--resume"))
    torch.save(dict(good, model=dict(good["model"], **{"lm_head.weight": torch.zeros(3, 3)})), path)
    with pytest.raises(SystemExit, match=r"--checkpoint .*checkpoint.pt: load_checkpoint: .* other shapes "
                                         r"\[.lm_head.weight \(3, 3\)"):
        tr.main(["sample", "--checkpoint", str(path), "--device", "cpu"])


def test_resume_refuses_other_training_settings_and_takes_other_operational_ones(corpus, tmp_path):
    out = tmp_path / "run"
    tr.main(args(corpus, out, "--max-steps", "6", "--stop-at", "2"))
    with pytest.raises(SystemExit, match=r"--resume continues the run .* --d-model 32 \(the checkpoint's: 16\)"):
        tr.main(args(corpus, out, "--resume", "--d-model", "32"))
    summary = tr.main(args(corpus, out, "--resume", "--eval-every", "3"))
    assert summary["step"] == 6 and [r["step"] for r in rows(out) if r["val_loss"] is not None] == [3, 6]


def test_an_existing_checkpoint_is_never_overwritten_without_asking(corpus, tmp_path):
    out = tmp_path / "run"
    tr.main(args(corpus, out, "--max-steps", "4", "--stop-at", "2"))
    with pytest.raises(SystemExit, match=r"checkpoint.pt exists: --resume to go on with it, --overwrite"):
        tr.main(args(corpus, out, "--max-steps", "4"))
    assert tr.main(args(corpus, out, "--max-steps", "4", "--overwrite"))["step"] == 4


@pytest.mark.parametrize("flags, message", [
    (["--train-data", "no/such/train.txt"], r"--train-data: no training text at no/such/train.txt"),
    (["--val-data", "no/such/heldout.txt"], r"--val-data: no held-out text at no/such/heldout.txt"),
    (["--seq-len", "32"], r"--seq-len 32 is longer than the model's --context-length 16"),
    (["--batch-size", "0"], r"--batch-size must be >= 1, got 0"),
    (["--device", "tpu"], r"--device 'tpu' is not one of auto, cpu, cuda, cuda:N, mps"),
    (["--num-heads", "3"], r"--num-heads 3 must divide --d-model 16"),
    (["--warmup-steps", "10", "--max-steps", "10"], r"--warmup-steps 10 must be < --max-steps 10"),
    (["--top-p", "0"], r"--top-p must lie in \(0, 1\], got 0.0"),
    (["--model", "rnn"], r"--model must be one of transformer_lm, gpt2_style, got 'rnn'"),
    (["--stop-at", "0"], r"--stop-at must be >= 1, got 0"),
    (["--tokenizer", "words"], r"--tokenizer must be one of bytes, bpe, got 'words'"),
    (["--vocab-size", "300"], r"--vocab-size 300 needs --tokenizer bpe: bytes have a vocabulary of 256"),
    (["--tokenizer", "bpe", "--vocab-size", "256"], r"--vocab-size must lie in \(256, 2\*\*32\] for --tokenizer bpe"),
    (["--tokenizer", "bpe", "--vocab-size", "100000"], r"--vocab-size 100000: .*train.txt gives only \d+ merges"),
])
def test_bad_settings_stop_with_one_line_that_names_the_value(corpus, tmp_path, flags, message):
    with pytest.raises(SystemExit, match=message) as error:
        tr.main(args(corpus, tmp_path / "run", "--max-steps", "4", *flags))
    assert "\n" not in str(error.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_asking_for_cuda_without_it_names_the_device(corpus, tmp_path):
    with pytest.raises(SystemExit, match=r"--device cuda: CUDA is not available here"):
        tr.main(args(corpus, tmp_path / "run", "--device", "cuda"))


def test_a_config_file_replaces_the_defaults_and_flags_replace_it(corpus, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(dict(max_steps=3, d_model=8, num_heads=2)))
    out = tmp_path / "run"
    tr.main(["--config", str(config), *args(corpus, out, "--d-model", "16")])
    saved = torch.load(out / "checkpoint.pt", weights_only=True)["extra"]["config"]
    assert (saved["max_steps"], saved["d_model"], saved["num_heads"]) == (3, 16, 2)
    config.write_text(json.dumps(dict(max_step=3)))
    with pytest.raises(SystemExit, match=r"config.json has unknown settings \['max_step'\]"):
        tr.main(["--config", str(config), *args(corpus, out)])
    config.write_text("{max_steps: 3}")
    with pytest.raises(SystemExit, match=r"config.json is not valid JSON"):
        tr.main(["--config", str(config), *args(corpus, out)])


def test_the_gpt2_style_baseline_trains_with_the_same_loop(corpus, tmp_path):
    out = tmp_path / "run"
    tr.main(args(corpus, out, "--max-steps", "4", "--model", "gpt2_style"))
    assert "position_embeddings.weight" in weights(out) and rows(out)[-1]["val_loss"] < math.log(256) + 0.5


def test_sample_continues_the_prompt_from_any_checkpoint(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    tr.main(args(corpus, out, "--max-steps", "6", "--stop-at", "3"))
    checkpoint = str(out / "checkpoint.pt")
    greedy = tr.main(["sample", "--checkpoint", checkpoint, "--prompt", "ROMEO:", "--max-new-tokens", "25",
                      "--temperature", "0", "--device", "cpu"])
    assert greedy.startswith("ROMEO:") and len(greedy.encode()) >= 25 and greedy in capsys.readouterr().out
    assert tr.main(["sample", "--checkpoint", checkpoint, "--prompt", "ROMEO:", "--max-new-tokens", "25",
                    "--temperature", "0"]) == greedy
    drawn = [tr.main(["sample", "--checkpoint", checkpoint, "--prompt", "O", "--max-new-tokens", "30",
                      "--temperature", "1.2", "--top-k", "5", "--top-p", "0.9", "--seed", str(seed)])
             for seed in (0, 0, 1)]
    assert drawn[0] == drawn[1] != drawn[2]


@pytest.mark.parametrize("flags, message", [
    (["--checkpoint", "no/such.pt"], r"--checkpoint: no checkpoint at no/such.pt"),
    (["--top-p", "1.5"], r"top_p must lie in \(0, 1\]"),
    (["--prompt", ""], r"--prompt must hold at least one character"),
    (["--device", "tpu"], r"--device 'tpu' is not one of"),
])
def test_sample_bad_input_names_the_value(corpus, tmp_path, flags, message):
    out = tmp_path / "run"
    tr.main(args(corpus, out, "--max-steps", "3"))
    with pytest.raises(SystemExit, match=message):
        tr.main(["sample", "--checkpoint", str(out / "checkpoint.pt"), *flags])


def test_bpe_trains_its_tokenizer_once_beside_the_checkpoint_and_resume_reuses_it(corpus, tmp_path):
    out = tmp_path / "run"
    tr.main(args(corpus, out, "--max-steps", "6", "--stop-at", "2", *BPE))
    tokenizer = Tokenizer.from_files(out / "vocab.json", out / "merges.txt")
    assert len(tokenizer) == 300 and len(tokenizer.merges) == 44
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    assert (checkpoint["extra"]["config"]["tokenizer"], checkpoint["extra"]["config"]["vocab_size"]) == ("bpe", 300)
    assert checkpoint["model"]["lm_head.weight"].shape == (300, 16)  # the model's vocabulary is the tokenizer's
    for name, text in zip(("train_tokens.npy", "val_tokens.npy"), corpus):
        ids = np.load(out / name, mmap_mode="r")
        assert ids.dtype == np.uint16 and ids.tolist() == tokenizer.encode(text.read_text())
    files = tokenizer_files(out)
    for flags, message in [(["--vocab-size", "400"], r"--vocab-size 400 \(the checkpoint's: 300\)"),
                           (["--tokenizer", "bytes", "--vocab-size", "none"],
                            r"--tokenizer 'bytes' \(the checkpoint's: 'bpe'\); --vocab-size 256 \(the")]:
        with pytest.raises(SystemExit, match=r"--resume continues the run .* " + message) as error:
            tr.main(args(corpus, out, "--resume", *flags))
        assert "\n" not in str(error.value)
    assert tr.main(args(corpus, out, "--resume", "--stop-at", "4", *BPE))["step"] == 4  # the same settings: taken
    assert tokenizer_files(out) == files  # not trained again, not even rewritten
    (out / "vocab.json").write_text((out / "vocab.json").read_text().replace('"e": 101', '"e": 299'))
    with pytest.raises(SystemExit, match=r"--resume: .*vocab.json and .*merges.txt are not the tokenizer the "
                                         r"checkpoint was trained with"):
        tr.main(args(corpus, out, "--resume"))
    (out / "merges.txt").unlink()
    with pytest.raises(SystemExit, match=r"--checkpoint .*: the run's BPE tokenizer is missing: no .*merges.txt"):
        tr.main(["sample", "--checkpoint", str(out / "checkpoint.pt")])


@pytest.mark.parametrize("tokens", [[], BPE], ids=["bytes", "bpe"])
def test_the_held_out_loss_per_byte_is_the_loss_per_token_times_tokens_per_byte(corpus, tmp_path, tokens):
    out = tmp_path / "run"
    summary = tr.main(args(corpus, out, "--max-steps", "8", *tokens))
    text = corpus[1].read_bytes()
    if tokens:  # counted again, by the saved tokenizer and the held-out text, not by the token file
        count = len(Tokenizer.from_files(out / "vocab.json", out / "merges.txt").encode(text.decode()))
        assert count < 0.8 * len(text)  # BPE tokens are longer than a byte
    else:
        count = len(text)
    evaluated = [r for r in rows(out) if r["val_loss"] is not None]
    assert [r["step"] for r in evaluated] == [4, 8]
    assert all(r["val_loss_per_byte"] is None for r in rows(out) if r["val_loss"] is None)
    for row in evaluated:
        assert row["val_loss_per_byte"] == pytest.approx(row["val_loss"] * count / len(text), rel=1e-12)
        assert not tokens or row["val_loss_per_byte"] < row["val_loss"]
        assert tokens or row["val_loss_per_byte"] == row["val_loss"]  # bytes: the same number
    assert summary["val_loss_per_byte"] == evaluated[-1]["val_loss_per_byte"]


def test_sample_encodes_the_prompt_and_decodes_with_the_runs_bpe_tokenizer(corpus, tmp_path):
    out = tmp_path / "run"
    tr.main(args(corpus, out, "--max-steps", "6", *BPE))
    checkpoint = str(out / "checkpoint.pt")
    greedy = tr.main(["sample", "--checkpoint", checkpoint, "--prompt", "ROMEO:", "--max-new-tokens", "12",
                      "--temperature", "0", "--tokenizer", "bpe"])
    tokenizer = Tokenizer.from_files(out / "vocab.json", out / "merges.txt")
    model = tr.load_for_sampling(checkpoint, torch.device("cpu"))[0]
    new = tr.generate(model, torch.tensor(tokenizer.encode("ROMEO:")), 12, temperature=0)
    assert greedy == "ROMEO:" + tokenizer.decode(new.tolist())
    assert (out / "samples.txt").read_text().count("--- prompt") == 2
    with pytest.raises(SystemExit, match=r"--tokenizer bytes: .* was trained on --tokenizer bpe tokens"):
        tr.main(["sample", "--checkpoint", checkpoint, "--tokenizer", "bytes"])


def test_a_checkpoint_from_before_the_tokenizer_setting_resumes_and_samples_as_bytes(corpus, tmp_path):
    out = tmp_path / "run"
    tr.main(args(corpus, out, "--max-steps", "4", "--stop-at", "2"))
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    for key in ("tokenizer", "vocab_size"):
        del checkpoint["extra"]["config"][key]
    del checkpoint["extra"]["tokenizer_sha256"]
    torch.save(checkpoint, out / "checkpoint.pt")
    assert tr.main(args(corpus, out, "--resume", "--stop-at", "3", "--tokenizer", "bytes"))["step"] == 3
    assert tr.main(["sample", "--checkpoint", str(out / "checkpoint.pt"), "--max-new-tokens", "5"]).startswith("ROMEO")


def test_the_course_step_equals_the_step_with_pytorchs_parts():
    """training_step with cross_entropy and gradient_clipping, then AdamW, against F.cross_entropy,
    clip_grad_norm_ and torch.optim.AdamW on the built-in ReferenceLM of the same weights: bench's two loops.

    Compared where the comparison is well-conditioned, so it holds on any CPU and thread count: the loss, the norm
    and the clipped gradients of one step (float32 sums in another order: relative differences of about 1e-6), then
    three AdamW updates of the same weights with the same gradients (elementwise arithmetic: a few ulps). Parameters
    after several steps of each loop are not compared: Adam divides each gradient by its own running magnitude, so
    where a gradient is near 0 a rounding-level difference becomes a step of size lr."""
    torch.manual_seed(0)
    config = tr.TrainConfig(d_model=32, num_layers=2, num_heads=4, context_length=16)
    ours = tr.build_model(config)
    reference = ReferenceLM(ours)
    inputs, targets = torch.randint(256, (2, 4, 16)).unbind(0)
    torch_loss = lambda logits, y: F.cross_entropy(logits.flatten(0, 1), y.flatten())  # noqa: E731
    steps = []
    for model, optimizer_class, loss_fn, clip_fn in [
            (ours, AdamW, tr.cross_entropy, tr.gradient_clipping),
            (reference, torch.optim.AdamW, torch_loss, torch.nn.utils.clip_grad_norm_)]:
        optimizer = optimizer_class(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
        loss, norm = tr.training_step(model, optimizer, inputs, targets, 1e-2, 0.5, loss_fn=loss_fn, clip_fn=clip_fn)
        steps.append((loss, norm, {name.removeprefix("weights."): p.grad for name, p in model.named_parameters()}))
    (loss, norm, grads), (ref_loss, ref_norm, ref_grads) = steps
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
    torch.testing.assert_close(norm, ref_norm, rtol=1e-5, atol=0)
    assert norm > 0.5  # the clipping acted
    for name, grad in grads.items():  # clipped to a norm of 0.5 over about 60k weights
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-4, atol=1e-7, msg=name)

    weights = {name: p.detach().clone() for name, p in ours.named_parameters()}
    updated = []
    for optimizer_class in (AdamW, torch.optim.AdamW):
        params = {name: torch.nn.Parameter(w.clone()) for name, w in weights.items()}
        optimizer = optimizer_class(params.values(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
        for step in range(3):  # the same gradients for both: the step's, scaled differently each time
            for name, p in params.items():
                p.grad = grads[name] * (1 + step)
            optimizer.step()
        updated.append(params)
    for name, p in updated[0].items():
        assert not torch.equal(p, weights[name]) or not grads[name].any(), name
        torch.testing.assert_close(p, updated[1][name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("tokens", [[], BPE], ids=["bytes", "bpe"])
def test_two_processes_under_torchrun_see_the_losses_of_one_with_the_same_global_batch(corpus, tmp_path, tokens):
    """With BPE, rank 0 alone trains the tokenizer and encodes the texts; the other waits for them."""
    one, two = tmp_path / "one", tmp_path / "two"
    flags = args(corpus, two, "--max-steps", "6", *tokens)
    tr.main(args(corpus, one, "--max-steps", "6", *tokens))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "transformer_from_scratch.train", *flags], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 process(es) on cpu" in done.stderr and done.stderr.count("TransformerLM:") == 1  # rank 0 alone reports
    for a, b in zip(rows(one), rows(two), strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
        assert (a["val_loss"] is None) == (b["val_loss"] is None)
        assert a["val_loss"] is None or a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)
    for name, tensor in weights(one).items():
        assert torch.allclose(tensor, weights(two)[name], atol=1e-5), name


# ---------------------------------------------------------------- what the programs say

@pytest.mark.parametrize("where, tokens, expected", [
    ("build/train", [], "make train TRAIN_ARGS=--resume"),
    ("runs/bpe run", BPE,
     "make train TRAIN_ARGS=\"--resume --out-dir 'runs/bpe run' --tokenizer bpe --vocab-size 300\""),
], ids=["default", "bpe-elsewhere"])
def test_the_stop_message_gives_the_command_that_resumes_this_run(corpus, tmp_path, monkeypatch, capsys, where, tokens,
                                                                   expected):
    """The command printed when a run stops resumes that run: its out-dir and tokenizer, and no other flag needed
    (the checkpoint holds the rest). Run as make's recipe would, from the words inside TRAIN_ARGS."""
    monkeypatch.chdir(tmp_path)
    tr.main(args(corpus, Path(where), "--max-steps", "5", "--stop-at", "2", *tokens))
    err = capsys.readouterr().err
    assert f"stopped after step 2 of 5: checkpoint saved to {Path(where) / 'checkpoint.pt'}; go on with `{expected}`" \
        in err
    inner = expected.partition("TRAIN_ARGS=")[2]
    flags = shlex.split(shlex.split(inner)[0] if inner.startswith('"') else inner)
    assert tr.main([*flags, "--no-progress"])["step"] == 5  # the checkpoint's settings: its corpus, its tiny model
    assert "learning a vocabulary" not in capsys.readouterr().err
    sample_hint = "make sample" if where == "build/train" else f"make sample SAMPLE_ARGS=\"--checkpoint '{where}"
    tr.main([*flags, "--no-progress"])
    assert f"already finished at step 5: sample from it with `{sample_hint}" in capsys.readouterr().out


def test_bpe_says_what_it_does_before_each_long_step_and_its_time_after(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    tr.main(args(corpus, out, "--max-steps", "4", "--stop-at", "2", *BPE))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("BPE: ")]
    starts = [f"BPE: learning a vocabulary of 300 (train_bpe) from {corpus[0]} (20 KB)", f"BPE: encoding {corpus[0]} (",
              f"BPE: encoding {corpus[1]} ("]
    assert len(lines) == 3 and all(line.startswith(start) for line, start in zip(lines, starts)), lines
    assert all(re.search(r" \.\.\. \d+\.\d s$", line) for line in lines), lines
    assert f"into {out / 'vocab.json'} and merges.txt" in lines[0] and f"into {out / 'train_tokens.npy'}" in lines[1]
    tr.main(args(corpus, out, "--resume"))  # the tokenizer and the token files are reused: nothing to say
    assert "BPE: " not in capsys.readouterr().err


def test_sample_prints_a_header_and_streams_the_text_as_it_is_drawn(corpus, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    tr.main(args(corpus, out, "--max-steps", "6", "--stop-at", "3"))
    capsys.readouterr()
    writes = []
    monkeypatch.setattr(sample, "_write", lambda text: writes.append(text))
    text = tr.main(["sample", "--checkpoint", str(out / "checkpoint.pt"), "--prompt", "ROMEO:", "--max-new-tokens",
                    "25", "--temperature", "0.9", "--top-k", "20", "--seed", "2"])
    err = capsys.readouterr().err
    assert f"{out / 'checkpoint.pt'}: step 3 of 6, TransformerLM" in err
    assert "bytes tokens) on cpu | 25 new tokens, temperature 0.9, top_k 20, top_p None, seed 2" in err
    assert "".join(writes) == text + "\n" and writes[0] == "ROMEO:"
    assert len(writes) > 10  # piece by piece as generate picks them, not the whole text at the end
    greedy = tr.main(["sample", "--checkpoint", str(out / "checkpoint.pt"), "--max-new-tokens", "3",
                      "--temperature", "0"])
    assert greedy.startswith("ROMEO:\n") and "3 new tokens, greedy (temperature 0)" in capsys.readouterr().err


def test_the_stream_shows_a_character_once_all_its_bytes_have_come():
    pieces = []
    stream = sample._Stream(ByteTokenizer(), pieces.append)
    ids = list("a é€😀 b".encode())
    for i in ids:
        stream(i)
    stream.finish(ByteTokenizer().decode(ids))
    assert "".join(pieces) == "a é€😀 b" and "\ufffd" not in "".join(pieces)
    assert pieces[:3] == ["a", " ", "é"]  # é's two bytes shown together, after its second


@pytest.mark.parametrize("path, hint", [
    ("build/train/checkpoint.pt", "run `make train` first"),
    ("elsewhere/checkpoint.pt", "run `make train TRAIN_ARGS=\"--out-dir elsewhere\"` first"),
])
def test_sample_without_a_checkpoint_says_to_train_first(tmp_path, monkeypatch, path, hint):
    monkeypatch.chdir(tmp_path)
    flags = [] if path == "build/train/checkpoint.pt" else ["--checkpoint", path]
    with pytest.raises(SystemExit, match=rf"--checkpoint: no checkpoint at {path}: {re.escape(hint)}.*or pass "
                                         r"--checkpoint PATH") as error:
        tr.main(["sample", *flags])
    assert "\n" not in str(error.value)


def test_sample_runs_as_a_module_of_its_own_and_as_train_sample(corpus, tmp_path):
    out = tmp_path / "run"
    tr.main(args(corpus, out, "--max-steps", "3"))
    flags = ["--checkpoint", str(out / "checkpoint.pt"), "--max-new-tokens", "8", "--temperature", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = [subprocess.run([sys.executable, "-m", *module, *flags], env=env, capture_output=True, text=True,
                           timeout=120) for module in (["transformer_from_scratch.train", "sample"],
                                                       ["transformer_from_scratch.sample"])]
    assert [d.returncode for d in done] == [0, 0], done[0].stderr[-2000:] + done[1].stderr[-2000:]
    assert done[0].stdout == done[1].stdout and done[0].stdout.startswith("ROMEO:\n")

"""A `make train` run's settings: `TrainConfig`, its checks, its --config file and flags, the model and the device it
names, and the checkpoint that records it (read once, by --resume and by `sample`).

`TrainConfig`'s defaults are `make train`'s run and the only defaults: a --config FILE.json names only the settings it
changes (as the package's configs/ do) and a flag (--d-model 64, --no-fused, ...) any one of them. The settings in
OPERATIONAL do not change what is trained: a resumed run may take other values of them.
"""

import argparse
import dataclasses
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from transformer_from_scratch.swiglu import swiglu_hidden_size
from transformer_from_scratch.training import GPT2StyleLM
from transformer_from_scratch.training import _check_fits  # load_checkpoint's check that the weights fit the model
from transformer_from_scratch.transformer_lm import TransformerLM

CONFIGS = Path(__file__).parent / "configs"  # example --config files; each names only the settings it changes
VOCAB_SIZE = 256  # tokenize_file's bytes
MODELS = ("transformer_lm", "gpt2_style")
TOKENIZERS = ("bytes", "bpe")
DEFAULT_VOCAB_SIZE = {"bytes": VOCAB_SIZE, "bpe": 2048}  # what --vocab-size none (the default) means
FORMAT = "transformer_from_scratch.train/1"  # marks a checkpoint of this script
CHECKPOINT = "checkpoint.pt"  # in --out-dir


@dataclasses.dataclass
class TrainConfig:
    """Everything that defines a run. Its defaults are `make train`'s run (the README gives its measured time) and the
    only defaults: a config file names only the settings it changes (tests/test_train.py checks that none repeats one).
    """

    train_data: str = "notebooks/data/shakespeare/train.txt"  # a UTF-8 text file
    val_data: str = "notebooks/data/shakespeare/heldout.txt"  # the held-out text of the validation loss
    out_dir: str = "build/train"                    # checkpoint.pt, metrics.jsonl, loss_curve.png, samples.txt
    tokenizer: str = "bytes"                        # the text's bytes; or "bpe", train_bpe's on train_data
    vocab_size: int | None = None                   # None: 256 for bytes (the only size), 2048 for bpe
    model: str = "transformer_lm"                   # or "gpt2_style": notebook 11's GPT2StyleLM baseline
    context_length: int = 128                       # the model's longest sequence
    d_model: int = 128
    num_layers: int = 4
    num_heads: int = 4
    d_ff: int | None = None                         # None: swiglu_hidden_size(d_model) (4·d_model for gpt2_style)
    rope_theta: float = 10000.0
    fused: bool = True                              # attention by F.scaled_dot_product_attention (same logits)
    seq_len: int | None = None                      # the training windows' length; None: context_length
    batch_size: int = 32                            # windows per step, over all processes together
    max_steps: int = 1200
    max_lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 40                          # the cosine runs from here to max_steps
    betas: list[float] = dataclasses.field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 100
    eval_batches: int = 8                           # the same windows of val_data at every evaluation
    checkpoint_every: int = 200
    log_every: int = 10                             # a metrics row holds the mean training loss since the last
    sample_prompts: list[str] = dataclasses.field(default_factory=lambda: ["ROMEO:\n", "KING HENRY:\nWhat"])
    sample_tokens: int = 300
    temperature: float = 0.8
    top_k: int | None = None
    top_p: float | None = 0.95
    device: str = "auto"                            # auto: cuda, then mps, then cpu; or cpu, cuda, cuda:N, mps
    amp: bool = True                                # bfloat16 autocast on CUDA (ignored elsewhere)


# Settings that do not change what is trained: a resumed run may take other values of these.
OPERATIONAL = {"out_dir", "eval_every", "eval_batches", "checkpoint_every", "log_every", "sample_prompts",
               "sample_tokens", "temperature", "top_k", "top_p", "device", "amp"}
FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def setting_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# ---------------------------------------------------------------- the configuration

def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """The settings of a JSON config file, or SystemExit naming the file and what is wrong with it."""
    try:
        values = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise SystemExit(f"--config: cannot read {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise SystemExit(f"--config: {path} is not valid JSON: {error}") from None
    if not isinstance(values, dict):
        raise SystemExit(f"--config: {path} must hold a JSON object of settings, got {type(values).__name__}")
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise SystemExit(f"--config: {path} has unknown settings {unknown}; known: {', '.join(FIELDS)}")
    return values


def check_config(config: TrainConfig) -> None:
    """Every setting in range, or SystemExit with one line that names the flag and its value."""
    for name, field in FIELDS.items():
        value, kind = getattr(config, name), field.type
        optional = kind in (int | None, float | None)
        base = {int | None: int, float | None: float}.get(kind, kind)
        if optional and value is None:
            continue
        if base is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise SystemExit(f"{setting_flag(name)} must be an integer, got {value!r}")
        if base is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise SystemExit(f"{setting_flag(name)} must be a number, got {value!r}")
        if base in (str, bool) and not isinstance(value, base):
            raise SystemExit(f"{setting_flag(name)} must be a {base.__name__}, got {value!r}")
    at_least = dict(context_length=1, d_model=1, num_layers=1, num_heads=1, d_ff=1, seq_len=1, batch_size=1,
                    max_steps=1, warmup_steps=0, eval_every=1, eval_batches=1, checkpoint_every=1, log_every=1,
                    sample_tokens=0, top_k=1)
    for name, low in at_least.items():
        value = getattr(config, name)
        if value is not None and value < low:
            raise SystemExit(f"{setting_flag(name)} must be >= {low}, got {value}")
    c = config
    problems = [
        (c.model not in MODELS, f"--model must be one of {', '.join(MODELS)}, got {c.model!r}"),
        (c.tokenizer not in TOKENIZERS, f"--tokenizer must be one of {', '.join(TOKENIZERS)}, got {c.tokenizer!r}"),
        (c.tokenizer == "bytes" and c.vocab_size not in (None, VOCAB_SIZE),
         f"--vocab-size {c.vocab_size} needs --tokenizer bpe: bytes have a vocabulary of {VOCAB_SIZE}"),
        (c.tokenizer == "bpe" and c.vocab_size is not None and not VOCAB_SIZE < c.vocab_size <= 1 << 32,
         f"--vocab-size must lie in ({VOCAB_SIZE}, 2**32] for --tokenizer bpe (256 bytes + merges), "
         f"got {c.vocab_size}"),
        (c.d_model % c.num_heads != 0, f"--num-heads {c.num_heads} must divide --d-model {c.d_model}"),
        (c.seq_len is not None and c.seq_len > c.context_length,
         f"--seq-len {c.seq_len} is longer than the model's --context-length {c.context_length}"),
        (c.warmup_steps >= c.max_steps, f"--warmup-steps {c.warmup_steps} must be < --max-steps {c.max_steps}"),
        (not 0 <= c.min_lr <= c.max_lr, f"--min-lr and --max-lr need 0 <= min <= max, got {c.min_lr} and {c.max_lr}"),
        (not isinstance(c.betas, list) or len(c.betas) != 2
         or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in c.betas),
         f"--betas must be two numbers in [0, 1), got {c.betas}"),
        (not c.eps >= 0, f"--eps must be >= 0, got {c.eps}"),
        (not c.weight_decay >= 0, f"--weight-decay must be >= 0, got {c.weight_decay}"),
        (not c.grad_clip > 0, f"--grad-clip must be > 0, got {c.grad_clip}"),
        (not c.temperature >= 0, f"--temperature must be >= 0, got {c.temperature}"),
        (c.top_p is not None and not 0 < c.top_p <= 1, f"--top-p must lie in (0, 1], got {c.top_p}"),
        (not isinstance(c.sample_prompts, list) or not all(isinstance(p, str) and p for p in c.sample_prompts),
         f"--sample-prompts must be non-empty strings, got {c.sample_prompts!r}"),
    ]
    for wrong, message in problems:
        if wrong:
            raise SystemExit(message)


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """auto -> cuda (this process's GPU under torchrun), else mps, else cpu; a device that is not here -> SystemExit."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", name):
        raise SystemExit(f"--device {name!r} is not one of auto, cpu, cuda, cuda:N, mps")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SystemExit(f"--device {name}: CUDA is not available here (torch {torch.__version__})")
        index = int(name.split(":")[1]) if ":" in name else local_rank
        if index >= torch.cuda.device_count():
            raise SystemExit(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return torch.device("cuda", index)
    if name == "mps" and not torch.backends.mps.is_available():
        raise SystemExit("--device mps: Apple's MPS is not available here")
    return torch.device(name)


def model_vocab_size(config: TrainConfig) -> int:
    """The model's vocabulary: config.vocab_size, or the tokenizer's default where it is None."""
    return DEFAULT_VOCAB_SIZE.get(config.tokenizer, VOCAB_SIZE) if config.vocab_size is None else config.vocab_size


def build_model(config: TrainConfig, device: torch.device | str = "cpu") -> nn.Module:
    """The configured model, initialised from torch's global generator (seed it first)."""
    sizes = dict(vocab_size=model_vocab_size(config), context_length=config.context_length, d_model=config.d_model,
                 num_layers=config.num_layers, num_heads=config.num_heads)
    if config.model == "gpt2_style":
        return GPT2StyleLM(**sizes, d_ff=config.d_ff or 4 * config.d_model, device=device)
    return TransformerLM(**sizes, d_ff=config.d_ff or swiglu_hidden_size(config.d_model),
                         rope_theta=config.rope_theta, device=device, fused=config.fused)


def optional(kind: type) -> Callable[[str], Any]:
    """An argparse type that reads "none" or "null" as None, else `kind`."""
    def parse(text: str):
        return None if text.lower() in ("none", "null") else kind(text)
    parse.__name__ = kind.__name__
    return parse


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field (--d-model, --fused/--no-fused, --betas B1 B2, ...), absent unless given."""
    settings = parser.add_argument_group("settings (each replaces the config file's)")
    for name, field in FIELDS.items():
        kwargs: dict[str, Any] = dict(dest=name, default=argparse.SUPPRESS)
        if field.type is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif name == "betas":
            kwargs.update(type=float, nargs=2, metavar=("BETA1", "BETA2"))
        elif name == "sample_prompts":
            kwargs.update(nargs="+", metavar="PROMPT")
        else:
            kwargs["type"] = {int | None: optional(int), float | None: optional(float)}.get(field.type, field.type)
        settings.add_argument(setting_flag(name), **kwargs)


# ---------------------------------------------------------------- reading a checkpoint, once

def load_checkpoint_file(path: Path, verb: str) -> Any:
    """torch.load of a --resume checkpoint onto the CPU (weights only), or SystemExit: no file (`verb` without
    --resume first), or one torch cannot read. make train's and make finetune's; each then checks its own format."""
    if not path.is_file():
        raise SystemExit(f"--resume: no checkpoint at {path} ({verb} without --resume first, or give its --out-dir)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated zip, a file torch.save never wrote, a pickle with code in it
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise SystemExit(f"{path} is not a readable checkpoint (truncated or not written by torch.save): "
                         f"{first}") from None


def read_run_checkpoint(path: Path) -> dict:
    """A checkpoint of this script, read onto the CPU, or SystemExit naming what does not fit.

    The only torch.load of a run or a sampling session: the weights, the optimizer's state and the extra entries are
    all taken from the dict it returns.
    """
    checkpoint = load_checkpoint_file(path, "train")
    extra = checkpoint.get("extra") if isinstance(checkpoint, dict) else None
    if not isinstance(extra, dict) or extra.get("format") != FORMAT:
        raise SystemExit(f"{path} is not a checkpoint of transformer_from_scratch.train: it has no "
                         f"extra['format'] == {FORMAT!r} (a save_checkpoint of another script?)")
    missing = [key for key in ("model", "optimizer", "iteration") if key not in checkpoint]
    if missing:
        raise SystemExit(f"{path} is not a checkpoint of save_checkpoint, it lacks {missing}")
    return checkpoint


def load_state(checkpoint: dict, model: nn.Module, optimizer: torch.optim.Optimizer | None, flag: str) -> None:
    """What load_checkpoint does, on a checkpoint already read: its weights into `model` (after load_checkpoint's own
    check of their names and shapes) and, unless None, its state into `optimizer`. SystemExit "flag: ..." if not."""
    try:
        _check_fits(checkpoint["model"], model)
        model.load_state_dict(checkpoint["model"])
        if optimizer is not None:
            optimizer.load_state_dict(checkpoint["optimizer"])
    except ValueError as error:
        raise SystemExit(f"{flag}: {error}") from None


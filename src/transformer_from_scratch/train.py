"""`make train`: train TransformerLM on Shakespeare's plays with notebook 11's parts; `make sample`: sample from it.

    python -m transformer_from_scratch.train [--config FILE.json] [--FIELD VALUE ...] [--resume] [--stop-at N]
    python -m transformer_from_scratch.train sample --checkpoint build/train/checkpoint.pt --prompt "ROMEO:"
    torchrun --nproc_per_node=N -m transformer_from_scratch.train [...]     # DistributedDataParallel

The loop is the course's own: `TransformerLM` (shape checks off), `cross_entropy`, `AdamW`, `lr_cosine_schedule`,
`gradient_clipping`, `get_batch` on a memory-mapped token file and `save_checkpoint`; a checkpoint is read once and
put back as `load_checkpoint` does. The tokens are the text's bytes (`tokenize_file`, --tokenizer bytes, the default)
or notebook 13's byte-level BPE (--tokenizer bpe --vocab-size N): `train_bpe` learns it from the training text once,
into OUT_DIR/vocab.json and merges.txt, which --resume and `sample` reuse, and both texts are encoded once into
OUT_DIR/train_tokens.npy and val_tokens.npy. The run's settings are a `TrainConfig`, whose defaults, the only
ones, are `make train`'s run; --config FILE.json replaces any of them (a file names only what it changes, as the
package's configs/ do) and a flag (--d-model 64, --no-fused, ...) any one of them.

Written to --out-dir (build/train): checkpoint.pt (every --checkpoint-every steps, at the end and on Ctrl-C or
SIGTERM: the step in flight finishes, the checkpoint is saved, the run exits), metrics.jsonl (one JSON object per
logged step: step, tokens, train_loss, val_loss on the held-out text every --eval-every steps (nats per token),
val_loss_per_byte (the same in nats per byte: val_loss × the held-out text's tokens / its bytes, which compares
tokenizers; equal to val_loss for bytes), lr, grad_norm, tokens_per_s, elapsed_s), and at the end loss_curve.png
and samples.txt. --resume goes on from checkpoint.pt with the model, the optimizer, the batch generator and the
metrics restored (and a BPE run's tokenizer files, checked against the checksum the checkpoint recorded): on the CPU,
a run stopped at any step and resumed has the losses, bit for bit, of one that never stopped.

Under torchrun every process draws the same global batch of windows from the same generator and trains on its own
slice of it, so N processes see the batches one process would (their DistributedDataParallel gradients average the
slices); rank 0 alone writes. The device is CUDA, else Apple's MPS, else the CPU (--device to choose); on CUDA the
forward pass runs in bfloat16 autocast (--no-amp: float32).

How a run goes: train() checks the settings, finds the device and the data, and joins the torchrun processes;
set_up() builds (or restores) the model, the optimizer and the batch generator into a Run; train_loop() repeats
take_step(), evaluate() and the metrics row, and save(), until the last step or a stop.
"""

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from transformer_from_scratch.shapes import shape_checks
from transformer_from_scratch.swiglu import swiglu_hidden_size
from transformer_from_scratch.tokenizer import Tokenizer, train_bpe
from transformer_from_scratch.training import (AdamW, GPT2StyleLM, cross_entropy, get_batch, gradient_clipping,
                                               lr_cosine_schedule, save_checkpoint, tokenize_file)
from transformer_from_scratch.training import _check_fits  # load_checkpoint's check that the weights fit the model
from transformer_from_scratch.transformer_lm import TransformerLM, generate

CONFIGS = Path(__file__).parent / "configs"  # example --config files; each names only the settings it changes
VOCAB_SIZE = 256  # tokenize_file's bytes
MODELS = ("transformer_lm", "gpt2_style")
TOKENIZERS = ("bytes", "bpe")
DEFAULT_VOCAB_SIZE = {"bytes": VOCAB_SIZE, "bpe": 2048}  # what --vocab-size none (the default) means
FORMAT = "transformer_from_scratch.train/1"  # marks a checkpoint of this script
CHECKPOINT, METRICS, CURVE, SAMPLES = "checkpoint.pt", "metrics.jsonl", "loss_curve.png", "samples.txt"
VOCAB, MERGES = "vocab.json", "merges.txt"  # --tokenizer bpe: the tokenizer, beside the checkpoint (Tokenizer.save)
TOKEN_FILES = {"training": "train_tokens.npy", "held-out": "val_tokens.npy"}  # --tokenizer bpe: the encoded texts


@dataclasses.dataclass
class TrainConfig:
    """Everything that defines a run. Its defaults are `make train`'s run (about 6 min on 2 free CPU cores) and the
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


def _flag(name: str) -> str:
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
            raise SystemExit(f"{_flag(name)} must be an integer, got {value!r}")
        if base is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise SystemExit(f"{_flag(name)} must be a number, got {value!r}")
        if base in (str, bool) and not isinstance(value, base):
            raise SystemExit(f"{_flag(name)} must be a {base.__name__}, got {value!r}")
    at_least = dict(context_length=1, d_model=1, num_layers=1, num_heads=1, d_ff=1, seq_len=1, batch_size=1,
                    max_steps=1, warmup_steps=0, eval_every=1, eval_batches=1, checkpoint_every=1, log_every=1,
                    sample_tokens=0, top_k=1)
    for name, low in at_least.items():
        value = getattr(config, name)
        if value is not None and value < low:
            raise SystemExit(f"{_flag(name)} must be >= {low}, got {value}")
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


# ---------------------------------------------------------------- one step

def training_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: Tensor, targets: Tensor, lr: float,
                  grad_clip: float, *, loss_fn: Callable[[Tensor, Tensor], Tensor] = cross_entropy,
                  clip_fn: Callable[..., Tensor] = gradient_clipping,
                  autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
                  ) -> tuple[Tensor, Tensor]:
    """Set lr, compute the loss, its gradients, and clip them; return (loss, gradient norm before clipping).

    The update itself, optimizer.step(), is the caller's, after it has seen that both are finite.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    with autocast():
        logits = model(inputs)
    loss = loss_fn(logits, targets)  # cross_entropy computes bfloat16 logits in float32
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    return loss.detach(), clip_fn(model.parameters(), grad_clip)


# ---------------------------------------------------------------- reading a checkpoint, once

def _read_run_checkpoint(path: Path) -> dict:
    """A checkpoint of this script, read onto the CPU, or SystemExit naming what does not fit.

    The only torch.load of a run or a sampling session: the weights, the optimizer's state and the extra entries are
    all taken from the dict it returns.
    """
    if not path.is_file():
        raise SystemExit(f"--resume: no checkpoint at {path} (train without --resume first, or give its --out-dir)")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated zip, a file torch.save never wrote, a pickle with code in it
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise SystemExit(f"{path} is not a readable checkpoint (truncated or not written by torch.save): "
                         f"{first}") from None
    extra = checkpoint.get("extra") if isinstance(checkpoint, dict) else None
    if not isinstance(extra, dict) or extra.get("format") != FORMAT:
        raise SystemExit(f"{path} is not a checkpoint of transformer_from_scratch.train: it has no "
                         f"extra['format'] == {FORMAT!r} (a save_checkpoint of another script?)")
    missing = [key for key in ("model", "optimizer", "iteration") if key not in checkpoint]
    if missing:
        raise SystemExit(f"{path} is not a checkpoint of save_checkpoint, it lacks {missing}")
    return checkpoint


def _resumed_config(checkpoint: dict, requested: dict[str, Any], path: Path) -> TrainConfig:
    """The checkpoint's config, with the operational settings asked for now; SystemExit if a training one differs."""
    saved = {"tokenizer": "bytes", "vocab_size": VOCAB_SIZE,  # a checkpoint from before --tokenizer: bytes
             **checkpoint["extra"]["config"]}
    if requested.get("vocab_size", 0) is None:  # --vocab-size none: the tokenizer's default, as a new run takes it
        tokenizer = requested.get("tokenizer", saved["tokenizer"])
        requested = dict(requested, vocab_size=DEFAULT_VOCAB_SIZE.get(tokenizer, VOCAB_SIZE))
    unknown = sorted(set(saved) - set(FIELDS))
    if unknown:
        raise SystemExit(f"{path}: its config has settings this version does not know: {unknown}")
    differ = [f"{_flag(k)} {requested[k]!r} (the checkpoint's: {saved.get(k)!r})" for k in sorted(requested)
              if k not in OPERATIONAL and requested[k] != saved.get(k)]
    if differ:
        raise SystemExit(f"--resume continues the run in {path} as it was configured; these settings differ: "
                         + "; ".join(differ))
    return TrainConfig(**{**saved, **{k: v for k, v in requested.items() if k in OPERATIONAL}})


def _load_state(checkpoint: dict, model: nn.Module, optimizer: torch.optim.Optimizer | None, flag: str) -> None:
    """What load_checkpoint does, on a checkpoint already read: its weights into `model` (after load_checkpoint's own
    check of their names and shapes) and, unless None, its state into `optimizer`. SystemExit "flag: ..." if not."""
    try:
        _check_fits(checkpoint["model"], model)
        model.load_state_dict(checkpoint["model"])
        if optimizer is not None:
            optimizer.load_state_dict(checkpoint["optimizer"])
    except ValueError as error:
        raise SystemExit(f"{flag}: {error}") from None


# ---------------------------------------------------------------- the run: set up

@dataclasses.dataclass
class _Processes:
    """This process's place under torchrun (its environment variables), or the one process of a plain run."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_environment(cls) -> "_Processes":
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                   int(os.environ.get("LOCAL_RANK", 0)))

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        """Wait here until every process has come here (nothing without torchrun)."""
        if self.distributed:
            dist.barrier()

    def sum(self, values: Tensor) -> Tensor:
        """The sum over the processes (all_reduce, in place), every process getting it; `values` alone without."""
        if self.distributed:
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values


@contextlib.contextmanager
def _process_group(procs: _Processes, device: torch.device) -> Iterator[None]:
    """Under torchrun: join the process group that the all-reduces go through, and leave it together."""
    if not procs.distributed:
        yield
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        yield
        # Rank 0 still writes the curve and the samples. A process that tore its process group down meanwhile
        # could abort in gloo (SIGABRT, "terminate called without an active exception"): all leave together.
        dist.barrier()
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _stop_requests() -> Iterator[dict]:
    """SIGINT (Ctrl-C) and SIGTERM set flag["stop"]: the loop finishes its step, saves and exits. A second signal
    gets the previous handler (Ctrl-C twice stops at once, without saving)."""
    flag = {"stop": False}
    names = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}
    previous = {sig: signal.getsignal(sig) for sig in names}

    def handler(sig, frame):
        flag["stop"] = True
        for other, old in previous.items():
            signal.signal(other, old)
        print(f"\n{names[sig]}: finishing this step, saving the checkpoint, then stopping "
              f"(send it again to stop at once, without saving)", file=sys.stderr, flush=True)

    for sig in names:
        signal.signal(sig, handler)
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class ByteTokenizer:
    """tokenize_file's tokens, a text's UTF-8 bytes (ids 0-255), with the methods of Tokenizer that a run uses."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def __len__(self) -> int:
        return VOCAB_SIZE


@dataclasses.dataclass
class Data:
    """A run's tokenizer and its two token files, memory-mapped."""

    tokenizer: ByteTokenizer | Tokenizer
    train_tokens: np.ndarray
    val_tokens: np.ndarray
    val_bytes: int                    # the held-out text's size in bytes
    digest: str | None = None         # bpe: the sha256 of vocab.json and merges.txt, kept in the checkpoint

    @property
    def tokens_per_byte(self) -> float:
        """The held-out text's tokens per byte (1.0 for bytes): a loss per token times this is a loss per byte.
        The evaluation's windows are drawn uniformly from the held-out text, so they have its ratio on average."""
        return len(self.val_tokens) / self.val_bytes


def _text_file(path: str, what: str) -> Path:
    """The path of a corpus file, or SystemExit naming its flag."""
    if not Path(path).is_file():
        flag = "--train-data" if what == "training" else "--val-data"
        raise SystemExit(f"{flag}: no {what} text at {path} (run from the repository root, or give the path)")
    return Path(path)


def _enough(tokens: np.ndarray, path: str, what: str, unit: str, seq_len: int) -> np.ndarray:
    """`tokens`, or SystemExit if the file holds less than one training window and its target."""
    if len(tokens) < seq_len + 1:
        flag = "--train-data" if what == "training" else "--val-data"
        raise SystemExit(f"{flag}: {path} has {len(tokens)} {unit}, fewer than one window of --seq-len {seq_len} "
                         f"and its target ({seq_len + 1})")
    return tokens


def _tokens(path: str, what: str, seq_len: int) -> np.ndarray:
    """The memory-mapped bytes of a corpus file, or SystemExit naming it."""
    _text_file(path, what)
    try:
        tokens = tokenize_file(path)
    except (OSError, ValueError) as error:
        raise SystemExit(f"{'--train-data' if what == 'training' else '--val-data'}: {error}") from None
    return _enough(tokens, path, what, "bytes", seq_len)


def _digest(*paths: Path) -> str:
    """The sha256 of the files' contents, one after the other."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _partial(path: Path) -> Path:
    """A temporary name beside `path`, of this process: written, then renamed to `path` (os.replace)."""
    return path.with_name(f"{path.name}.{os.getpid()}.partial")


def _train_tokenizer(config: TrainConfig, folder: Path) -> None:
    """train_bpe on the training text, written to folder/vocab.json and merges.txt (each renamed into place)."""
    vocab, merges = train_bpe(config.train_data, model_vocab_size(config))
    if len(vocab) != model_vocab_size(config):
        raise SystemExit(f"--vocab-size {config.vocab_size}: {config.train_data} gives only {len(merges)} merges, "
                         f"a vocabulary of {len(vocab)}; ask for that many or fewer")
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / VOCAB, folder / MERGES]
    Tokenizer(vocab, merges).save(*map(_partial, paths))
    for path in paths:
        os.replace(_partial(path), path)


def load_tokenizer(config: TrainConfig, folder: Path, digest: str | None, flag: str) -> ByteTokenizer | Tokenizer:
    """The run's tokenizer: bytes, or the BPE of folder/vocab.json and merges.txt, which must be the files of
    `digest` (the checkpoint's) where it is given and hold config's vocabulary; SystemExit naming what does not fit."""
    if config.tokenizer == "bytes":
        return ByteTokenizer()
    paths = [folder / VOCAB, folder / MERGES]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise SystemExit(f"{flag}: the run's BPE tokenizer is missing: no {' and no '.join(missing)} (written "
                         f"beside the checkpoint when the run started)")
    if digest is not None and _digest(*paths) != digest:
        raise SystemExit(f"{flag}: {paths[0]} and {paths[1]} are not the tokenizer the checkpoint was trained "
                         f"with (their sha256 differs from the one it recorded)")
    tokenizer = Tokenizer.from_files(*paths)
    if len(tokenizer) != model_vocab_size(config):
        raise SystemExit(f"{flag}: {paths[0]} holds {len(tokenizer)} tokens, the run's --vocab-size is "
                         f"{model_vocab_size(config)}")
    return tokenizer


def _encode_file(tokenizer: Tokenizer, text_path: Path, token_path: Path) -> None:
    """The ids of a text file, written once as a .npy (uint16 for a vocabulary of up to 65,536, else uint32) to a
    temporary file then renamed, as tokenize_file does; written again only when it is older than the text or the
    tokenizer's files."""
    newest = max(path.stat().st_mtime_ns for path in (text_path, token_path.parent / VOCAB, token_path.parent / MERGES))
    if token_path.is_file() and token_path.stat().st_mtime_ns >= newest:
        return
    dtype = np.uint16 if len(tokenizer) <= 1 << 16 else np.uint32
    ids = np.array(tokenizer.encode(text_path.read_text(encoding="utf-8")), dtype=dtype)
    with open(_partial(token_path), "wb") as file:
        np.save(file, ids)
    os.replace(_partial(token_path), token_path)


def load_data(config: TrainConfig, procs: _Processes, digest: str | None) -> Data:
    """The tokenizer and the memory-mapped tokens of the training and held-out texts, or SystemExit naming what is
    missing. bytes: tokenize_file's, in every process. bpe: rank 0 trains the tokenizer, unless `digest` (a resumed
    run's) names the one in out_dir, and encodes the texts once into out_dir; the other processes wait for it."""
    seq_len = config.seq_len or config.context_length
    texts = {what: _text_file(path, what) for what, path in (("training", config.train_data),
                                                              ("held-out", config.val_data))}
    val_bytes = texts["held-out"].stat().st_size
    if config.tokenizer == "bytes":
        return Data(ByteTokenizer(), _tokens(config.train_data, "training", seq_len),
                    _tokens(config.val_data, "held-out", seq_len), val_bytes)
    out_dir = Path(config.out_dir)
    flag = "--resume" if digest is not None else "--tokenizer bpe"
    if procs.rank == 0:
        if digest is None:
            _train_tokenizer(config, out_dir)
        tokenizer = load_tokenizer(config, out_dir, digest, flag)
        for what, path in texts.items():
            _encode_file(tokenizer, path, out_dir / TOKEN_FILES[what])
    procs.barrier()  # the others read what rank 0 wrote
    if procs.rank != 0:
        tokenizer = load_tokenizer(config, out_dir, digest, flag)
    tokens = {what: _enough(np.load(out_dir / TOKEN_FILES[what], mmap_mode="r"), str(path), what, "tokens", seq_len)
              for what, path in texts.items()}
    return Data(tokenizer, tokens["training"], tokens["held-out"], val_bytes, _digest(out_dir / VOCAB,
                                                                                       out_dir / MERGES))


def train(config: TrainConfig, *, resume: bool = False, requested: dict[str, Any] | None = None,
          stop_at: int | None = None, overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
    """Run (or, with resume, go on with) the training run of `config`; return a summary of where it stopped.

    requested: the settings given explicitly (config file and flags): with resume, the training ones must equal the
    checkpoint's. stop_at: stop after that step as Ctrl-C would (save, exit), for tests and short sessions.
    Raises SystemExit with a one-line message for bad settings, a missing corpus, an unusable checkpoint, a loss
    that is not finite.
    """
    checkpoint_path = Path(config.out_dir) / CHECKPOINT
    checkpoint = None
    if resume:
        checkpoint = _read_run_checkpoint(checkpoint_path)
        config = _resumed_config(checkpoint, requested or {}, checkpoint_path)
    elif checkpoint_path.exists() and not overwrite:
        raise SystemExit(f"{checkpoint_path} exists: --resume to go on with it, --overwrite to start again, or "
                         f"another --out-dir")
    check_config(config)
    config = dataclasses.replace(config, vocab_size=model_vocab_size(config))  # the checkpoint records the size
    if stop_at is not None and stop_at < 1:
        raise SystemExit(f"--stop-at must be >= 1, got {stop_at}")
    procs = _Processes.from_environment()
    if config.batch_size % procs.world:
        raise SystemExit(f"--batch-size {config.batch_size} must be divisible by the {procs.world} processes")
    device = resolve_device(config.device, procs.local_rank)
    digest = checkpoint["extra"].get("tokenizer_sha256") if checkpoint is not None else None
    if checkpoint is not None and config.tokenizer == "bpe" and digest is None:
        raise SystemExit(f"--resume: {checkpoint_path} records no tokenizer, its run cannot be a --tokenizer bpe one")
    with _process_group(procs, device), shape_checks(False):
        data = load_data(config, procs, digest)
        run = set_up(config, checkpoint, procs, device, data)
        return train_loop(run, stop_at, progress)


@dataclasses.dataclass
class Run:
    """A run in progress: what set_up() builds, and what the loop's functions read and advance."""

    config: TrainConfig
    procs: _Processes
    device: torch.device
    model: nn.Module                  # evaluated, saved and sampled
    trained: nn.Module                # what a step calls: the model, or DistributedDataParallel around it
    optimizer: torch.optim.Optimizer
    batches: torch.Generator          # draws the training windows; saved, so that a resumed run draws the same ones
    data: Data                        # the tokenizer and the tokens
    amp: bool                         # the forward pass in bfloat16 autocast (CUDA only)
    step: int = 0                     # the steps done
    elapsed_s: float = 0.0            # seconds of training so far, those before a resume included
    pending: list[float] = dataclasses.field(default_factory=list)  # the training losses since the last metrics row
    last_saved: int | None = None     # the step of the checkpoint on disk, named when a loss is not finite

    @property
    def lead(self) -> bool:
        """Rank 0, the one process that writes and prints."""
        return self.procs.rank == 0

    @property
    def seq_len(self) -> int:
        return self.config.seq_len or self.config.context_length

    @property
    def tokens_per_step(self) -> int:
        return self.config.batch_size * self.seq_len

    @property
    def out_dir(self) -> Path:
        return Path(self.config.out_dir)

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.amp else contextlib.nullcontext()


def set_up(config: TrainConfig, checkpoint: dict | None, procs: _Processes, device: torch.device, data: Data) -> Run:
    """The model, the optimizer and the batch generator, seeded from config.seed, or, given the checkpoint of a run
    (already read), restored to go on exactly where it stopped; metrics.jsonl cut back to the same step."""
    torch.manual_seed(config.seed)
    model = build_model(config, device)
    optimizer = AdamW(model.parameters(), lr=config.max_lr, betas=tuple(config.betas), eps=config.eps,
                      weight_decay=config.weight_decay)
    amp = config.amp and device.type == "cuda" and torch.cuda.is_bf16_supported()
    run = Run(config, procs, device, model, model, optimizer, torch.Generator().manual_seed(config.seed), data, amp)
    if checkpoint is not None:
        _restore(run, checkpoint)
    if procs.distributed:
        run.trained = nn.parallel.DistributedDataParallel(model)  # after the restore: it copies rank 0's weights
    if run.lead:
        _keep_metrics_up_to(run.step, run.out_dir / METRICS)
    return run


def _restore(run: Run, checkpoint: dict) -> None:
    """Everything a resumed run needs to be bit for bit the run that never stopped: weights, optimizer moments, the
    step, the batch generator, torch's global generator, the clock and the losses not yet logged."""
    _load_state(checkpoint, run.model, run.optimizer, "--resume")
    extra = checkpoint["extra"]
    run.step = run.last_saved = checkpoint["iteration"]
    run.batches.set_state(extra["batches"])
    torch.set_rng_state(extra["torch_rng"])
    run.elapsed_s, run.pending = extra["elapsed_s"], list(extra["pending_losses"])


def _keep_metrics_up_to(step: int, metrics_path: Path) -> None:
    """Keep the metrics rows of steps up to `step` (none for a new run): rows that a run killed after its last
    checkpoint logged are logged again when it resumes."""
    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    kept = [line for line in _read_lines(metrics_path) if json.loads(line)["step"] <= step] if step else []
    metrics_path.write_text("".join(kept))


# ---------------------------------------------------------------- the run: one step, evaluate, save, log

@dataclasses.dataclass
class StepResult:
    """What take_step() reports of a step."""

    lr: float
    loss: float          # the mean over the processes, as is the gradient norm
    grad_norm: float
    stop: bool           # a process was asked to stop (Ctrl-C, SIGTERM): all stop after this step


def draw_batch(run: Run, tokens: np.ndarray, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """The global batch of windows from `generator`, which every process holds in the same state; this process's
    rows of it, on its device. So N processes train on the batches one process would."""
    x, y = get_batch(tokens, run.config.batch_size, run.seq_len, "cpu", generator=generator)
    rows = run.config.batch_size // run.procs.world
    mine = slice(run.procs.rank * rows, (run.procs.rank + 1) * rows)
    return x[mine].to(run.device, non_blocking=True), y[mine].to(run.device, non_blocking=True)


def take_step(run: Run, requests: dict[str, bool]) -> StepResult:
    """Step run.step + 1: the scheduled lr, a batch, training_step, then the update if the loss and the gradient
    norm are finite (else SystemExit before it, the last checkpoint kept). `requests` is _stop_requests' flag."""
    config = run.config
    # The schedule at the step's number, 1 … max_steps: no update at lr 0, the last one at min_lr.
    lr = lr_cosine_schedule(run.step + 1, config.max_lr, config.min_lr, config.warmup_steps, config.max_steps)
    x, y = draw_batch(run, run.data.train_tokens, run.batches)
    loss, norm = training_step(run.trained, run.optimizer, x, y, lr, config.grad_clip, autocast=run.autocast)
    # One all-reduce and one read-back per step: the mean loss and norm, and whether any process was asked to stop.
    votes = torch.stack([loss.float(), norm.float().to(loss.device),
                         torch.tensor(float(requests["stop"]), device=loss.device)])
    loss_value, norm_value, stops = (run.procs.sum(votes) / run.procs.world).tolist()
    run.step += 1
    if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
        _stop_not_finite(run, loss_value, norm_value)
    run.optimizer.step()
    run.pending.append(loss_value)
    return StepResult(lr, loss_value, norm_value, stop=stops > 0)


def _stop_not_finite(run: Run, loss: float, norm: float) -> None:
    """SystemExit naming the value that is not finite and the checkpoint that is kept, the last good one."""
    kept = (f"the last good checkpoint, of step {run.last_saved}, is kept at {run.out_dir / CHECKPOINT}"
            if run.last_saved is not None else "no checkpoint was saved yet")
    what = "loss" if not math.isfinite(loss) else "gradient norm"
    raise SystemExit(f"the {what} is {loss if what == 'loss' else norm} at step {run.step} (loss {loss}, gradient "
                     f"norm {norm}): stopped before the update; {kept}. Try a lower --max-lr.")


@torch.no_grad()
def evaluate(run: Run) -> float:
    """The mean loss on config.eval_batches batches of the held-out text, averaged over the processes. The windows
    come from a generator of their own, seeded the same at every evaluation: the same windows every time."""
    windows = torch.Generator().manual_seed(run.config.seed + 1)
    total = torch.zeros((), device=run.device)
    for _ in range(run.config.eval_batches):
        x, y = draw_batch(run, run.data.val_tokens, windows)
        with run.autocast():
            logits = run.model(x)
        total += cross_entropy(logits, y)
    return run.procs.sum(total / run.config.eval_batches).item() / run.procs.world


def save(run: Run) -> None:
    """Rank 0 writes checkpoint.pt: save_checkpoint's weights, optimizer state and step, and in `extra` the rest of
    an exact resume (the generators, the clock, the losses not yet logged) with the config and this script's mark."""
    if run.lead:
        extra = dict(format=FORMAT, config=dataclasses.asdict(run.config), batches=run.batches.get_state(),
                     torch_rng=torch.get_rng_state(), elapsed_s=run.elapsed_s, pending_losses=list(run.pending),
                     tokenizer_sha256=run.data.digest)
        save_checkpoint(run.model, run.optimizer, run.step, run.out_dir / CHECKPOINT, extra=extra)
    run.last_saved = run.step


def per_byte(run: Run, loss: float | None) -> float | None:
    """A loss per token as a loss per byte of the held-out text (the same number for bytes)."""
    return None if loss is None else loss * run.data.tokens_per_byte


def write_metrics_row(run: Run, step: StepResult, val_loss: float | None, tokens_per_s: float) -> None:
    """Rank 0 appends a row to metrics.jsonl; its train_loss is the mean of the losses since the last row."""
    row = dict(step=run.step, tokens=run.step * run.tokens_per_step, train_loss=sum(run.pending) / len(run.pending),
               val_loss=val_loss, val_loss_per_byte=per_byte(run, val_loss), lr=step.lr, grad_norm=step.grad_norm,
               tokens_per_s=round(tokens_per_s, 1),
               elapsed_s=round(run.elapsed_s, 2))
    if run.lead:
        with (run.out_dir / METRICS).open("a", encoding="utf-8") as file:
            file.write(json.dumps(row) + "\n")
    run.pending = []


# ---------------------------------------------------------------- the run: the loop

def train_loop(run: Run, stop_at: int | None, progress: bool) -> dict[str, Any]:
    """From run.step to config.max_steps: take a step; every eval_every steps (and at the last) evaluate, every
    log_every steps (and when evaluating) log; every checkpoint_every steps (at the last, and when stopped) save.
    Stops after the step in flight on Ctrl-C, SIGTERM or at stop_at. Returns train()'s summary."""
    config = run.config
    if run.step >= config.max_steps:
        if run.lead:
            print(f"the run in {run.out_dir} already finished at step {run.step}: sample from it with `make sample`")
        return dict(step=run.step, stopped=False, val_loss=None, val_loss_per_byte=None)
    if run.lead:
        _announce(run)
    bar = _ProgressBar(run, show=run.lead and progress)
    clock_zero = time.perf_counter() - run.elapsed_s      # the clock goes on from the checkpoint's
    row_step, row_time = run.step, time.perf_counter()    # the last metrics row's, for the throughput
    val_loss = None
    with _stop_requests() as requests, bar:
        while run.step < config.max_steps:
            step_began = time.perf_counter()
            step = take_step(run, requests)
            run.elapsed_s = time.perf_counter() - clock_zero
            bar.show(step, val_loss, seconds=time.perf_counter() - step_began)
            evaluating = run.step % config.eval_every == 0 or run.step == config.max_steps
            if evaluating:
                val_loss = evaluate(run)
            if evaluating or run.step % config.log_every == 0:
                tokens_per_s = (run.step - row_step) * run.tokens_per_step / (time.perf_counter() - row_time)
                write_metrics_row(run, step, val_loss if evaluating else None, tokens_per_s)
                row_step, row_time = run.step, time.perf_counter()
            stop = step.stop or run.step == stop_at
            if stop or run.step % config.checkpoint_every == 0 or run.step == config.max_steps:
                save(run)
            if stop:
                break
    run.elapsed_s = time.perf_counter() - clock_zero
    return _finish(run, val_loss)


def _announce(run: Run) -> None:
    """One line on stderr: the model, the processes, the device, the steps to go and where the run writes."""
    parameters = sum(p.numel() for p in run.model.parameters())
    print(f"{type(run.model).__name__}: {parameters:,} parameters | {run.procs.world} process(es) on {run.device} "
          f"{'(bfloat16 autocast)' if run.amp else '(float32)'} | {run.tokens_per_step:,} tokens per step | steps "
          f"{run.step} -> {run.config.max_steps} | {_tokens_in_words(run)} | writing to {run.out_dir}",
          file=sys.stderr, flush=True)


def _tokens_in_words(run: Run) -> str:
    if run.config.tokenizer == "bytes":
        return "tokens: bytes"
    return (f"tokens: BPE of {len(run.data.tokenizer):,} ({1 / run.data.tokens_per_byte:.2f} bytes per token in "
            f"the held-out text)")


class _ProgressBar:
    """Rank 0's tqdm bar: the step, and after it the loss, the lr, the tokens per second and the last held-out loss."""

    def __init__(self, run: Run, show: bool):
        from tqdm.auto import tqdm

        self.tokens_per_step, self.step_seconds = run.tokens_per_step, None  # a moving average of a step's time
        self.bar = tqdm(total=run.config.max_steps, initial=run.step, unit="step", disable=not show, smoothing=0.1,
                        dynamic_ncols=True, mininterval=1.0)

    def show(self, step: StepResult, val_loss: float | None, seconds: float) -> None:
        self.step_seconds = seconds if self.step_seconds is None else 0.9 * self.step_seconds + 0.1 * seconds
        self.bar.set_postfix_str(f"loss {step.loss:.3f}, lr {step.lr:.2e}, "
                                 f"{self.tokens_per_step / self.step_seconds:,.0f} tok/s"
                                 + (f", val {val_loss:.3f}" if val_loss is not None else ""), refresh=False)
        self.bar.update(1)

    def __enter__(self) -> "_ProgressBar":
        return self

    def __exit__(self, *error) -> None:
        self.bar.close()


def _finish(run: Run, val_loss: float | None) -> dict[str, Any]:
    """Stopped early: say how to go on. Done: rank 0 draws the loss curve, writes the samples and prints them.
    Returns train()'s summary."""
    checkpoint_path = run.out_dir / CHECKPOINT
    if run.step < run.config.max_steps:
        if run.lead:
            print(f"stopped after step {run.step} of {run.config.max_steps}: checkpoint saved to {checkpoint_path}; "
                  f"go on with `make train TRAIN_ARGS=--resume` (or the same command with --resume)", file=sys.stderr)
        return dict(step=run.step, stopped=True, val_loss=val_loss, val_loss_per_byte=per_byte(run, val_loss))
    if run.lead:
        write_loss_curve(run.out_dir / METRICS, run.out_dir / CURVE, len(run.data.tokenizer), run.config.tokenizer)
        samples = write_samples(run.model, run.data.tokenizer, run.config, run.device, run.out_dir / SAMPLES)
        loss = (f"{val_loss:.3f} nats per byte" if run.config.tokenizer == "bytes" else
                f"{val_loss:.3f} nats per token, {per_byte(run, val_loss):.3f} nats per byte "
                f"({1 / run.data.tokens_per_byte:.2f} bytes per token)")
        print(f"held-out loss {loss} after {run.step} steps "
              f"({run.step * run.tokens_per_step:,} tokens) in {run.elapsed_s / 60:.1f} min | {checkpoint_path}, "
              f"{METRICS}, {CURVE}, {SAMPLES}\n\n{samples}")
    return dict(step=run.step, stopped=False, val_loss=val_loss, val_loss_per_byte=per_byte(run, val_loss),
                elapsed_s=run.elapsed_s)


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        return []
    return [line + "\n" for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ---------------------------------------------------------------- what a run leaves behind

def write_loss_curve(metrics_path: Path, out: Path, vocab_size: int = VOCAB_SIZE, tokenizer: str = "bytes") -> None:
    """The training and held-out losses of metrics.jsonl against the tokens seen, as a PNG (BPE: per token, and the
    held-out loss per byte too)."""
    from matplotlib.figure import Figure

    rows = [json.loads(line) for line in _read_lines(metrics_path)]
    val = [r for r in rows if r["val_loss"] is not None]
    fig = Figure(figsize=(8, 4), layout="constrained")
    ax = fig.subplots()
    ax.plot([r["tokens"] for r in rows], [r["train_loss"] for r in rows], alpha=0.6, label="training loss")
    ax.plot([r["tokens"] for r in val], [r["val_loss"] for r in val], "o-", label="held-out loss")
    ax.axhline(math.log(vocab_size), color="gray", linestyle="--", label=f"uniform model, ln {vocab_size}")
    unit = "byte" if tokenizer == "bytes" else "token"
    if tokenizer != "bytes":
        ax.plot([r["tokens"] for r in val], [r["val_loss_per_byte"] for r in val], "s-",
                label="held-out loss per byte")
    ax.set_xlabel("tokens seen (bytes)" if tokenizer == "bytes" else "tokens seen (BPE tokens)")
    ax.set_ylabel(f"cross-entropy (nats per {unit})")
    ax.legend()
    if val:
        ax.set_title(f"Held-out loss {val[-1]['val_loss']:.2f} nats per {unit} after {val[-1]['tokens']:,} tokens"
                     + ("" if tokenizer == "bytes" else f" ({val[-1]['val_loss_per_byte']:.2f} per byte)"))
    fig.savefig(out, dpi=110)


def sample_text(model: nn.Module, tokenizer: ByteTokenizer | Tokenizer, prompt: str, max_new_tokens: int, *,
                temperature: float, top_k: int | None, top_p: float | None, seed: int) -> str:
    """The prompt and the model's continuation of it (the prompt encoded and the new ids decoded with the run's
    tokenizer), drawn with a generator seeded on the model's device."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    ids = torch.tensor(tokenizer.encode(prompt), dtype=torch.long, device=device)
    with shape_checks(False):
        new = generate(model, ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                       generator=generator)
    return prompt + tokenizer.decode(new.tolist())


def write_samples(model: nn.Module, tokenizer: ByteTokenizer | Tokenizer, config: TrainConfig, device: torch.device,
                  out: Path) -> str:
    """One sample per configured prompt, the i-th drawn with seed config.seed + i, written to `out`; returns it."""
    settings = f"temperature {config.temperature}, top_k {config.top_k}, top_p {config.top_p}"
    texts = [f"--- prompt {prompt!r} ({settings}, seed {config.seed + i})\n"
             + sample_text(model, tokenizer, prompt, config.sample_tokens, temperature=config.temperature,
                           top_k=config.top_k, top_p=config.top_p, seed=config.seed + i)
             for i, prompt in enumerate(config.sample_prompts)]
    text = "\n\n".join(texts) + "\n"
    out.write_text(text, encoding="utf-8")
    return text


def load_for_sampling(path: str | os.PathLike, device: torch.device
                      ) -> tuple[nn.Module, TrainConfig, ByteTokenizer | Tokenizer]:
    """The model of a make-train checkpoint, its weights loaded, on `device`, and its tokenizer (bpe: the files
    beside it); SystemExit naming what does not fit."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"--checkpoint: no checkpoint at {path}")
    checkpoint = _read_run_checkpoint(path)  # read once: its config builds the model, its weights fill it
    config = TrainConfig(**{k: v for k, v in checkpoint["extra"]["config"].items() if k in FIELDS})
    tokenizer = load_tokenizer(config, path.parent, checkpoint["extra"].get("tokenizer_sha256"),
                               f"--checkpoint {path}")
    model = build_model(config, device)
    _load_state(checkpoint, model, None, f"--checkpoint {path}")
    return model.eval(), config, tokenizer


# ---------------------------------------------------------------- the command line

def _optional(kind: type) -> Callable[[str], Any]:
    def parse(text: str):
        return None if text.lower() in ("none", "null") else kind(text)
    parse.__name__ = kind.__name__
    return parse


def _train_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m transformer_from_scratch.train",
                                     description=__doc__.split("\n\n")[0].strip("` "),
                                     epilog="`python -m transformer_from_scratch.train sample --help`: sampling.")
    parser.add_argument("--config", type=Path, default=None,
                        help="a JSON file of the settings to change (default: none, TrainConfig's defaults; "
                             "examples in the package's configs/)")
    parser.add_argument("--resume", action="store_true", help="go on from OUT_DIR/checkpoint.pt")
    parser.add_argument("--overwrite", action="store_true", help="start again over an existing checkpoint")
    parser.add_argument("--stop-at", type=int, default=None, help="stop after this step as Ctrl-C would (save, exit)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
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
            kwargs["type"] = {int | None: _optional(int), float | None: _optional(float)}.get(field.type, field.type)
        settings.add_argument(_flag(name), **kwargs)
    return parser


def _sample_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m transformer_from_scratch.train sample",
                                     description="Continue a prompt with the model of a make-train checkpoint.")
    parser.add_argument("--checkpoint", type=Path, default=Path("build/train") / CHECKPOINT)
    parser.add_argument("--prompt", default="ROMEO:\n", help="the text to continue (encoded with the run's tokenizer)")
    parser.add_argument("--tokenizer", choices=TOKENIZERS, default=None,
                        help="the checkpoint's (the default): bytes, or bpe with the vocab.json and merges.txt "
                             "beside it; another is refused")
    parser.add_argument("--max-new-tokens", type=int, default=500)
    parser.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    parser.add_argument("--top-k", type=_optional(int), default=None)
    parser.add_argument("--top-p", type=_optional(float), default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    return parser


def sample_main(argv: list[str]) -> str:
    """`... train sample`: print (and return) the continuation of --prompt."""
    args = _sample_parser().parse_args(argv)
    if not args.prompt:
        raise SystemExit("--prompt must hold at least one character")
    if args.max_new_tokens < 0:
        raise SystemExit(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    model, config, tokenizer = load_for_sampling(args.checkpoint, resolve_device(args.device))
    if args.tokenizer not in (None, config.tokenizer):
        raise SystemExit(f"--tokenizer {args.tokenizer}: {args.checkpoint} was trained on --tokenizer "
                         f"{config.tokenizer} tokens, which sample uses")
    try:
        text = sample_text(model, tokenizer, args.prompt, args.max_new_tokens, temperature=args.temperature,
                           top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    except ValueError as error:  # a sampling setting out of range
        raise SystemExit(str(error)) from None
    print(text)
    return text


def main(argv: list[str] | None = None) -> dict[str, Any] | str:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sample"]:
        return sample_main(argv[1:])
    args = _train_parser().parse_args(argv)
    flags = {name: getattr(args, name) for name in FIELDS if hasattr(args, name)}
    requested = {**(read_config_file(args.config) if args.config else {}), **flags}  # a flag replaces the file's
    return train(TrainConfig(**requested), resume=args.resume, requested=requested, stop_at=args.stop_at,
                 overwrite=args.overwrite, progress=args.progress)


if __name__ == "__main__":
    main()

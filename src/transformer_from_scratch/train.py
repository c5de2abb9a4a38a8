"""`make train`: train TransformerLM on Shakespeare's plays with notebook 11's parts; `make sample`: sample from it.

    python -m transformer_from_scratch.train [--config FILE.json] [--FIELD VALUE ...] [--resume] [--stop-at N]
    python -m transformer_from_scratch.train sample --checkpoint build/train/checkpoint.pt --prompt "ROMEO:"
    torchrun --nproc_per_node=N -m transformer_from_scratch.train [...]     # DistributedDataParallel

The loop is the course's own: `TransformerLM` (shape checks off), `cross_entropy`, `AdamW`, `lr_cosine_schedule`,
`gradient_clipping`, `get_batch` on a memory-mapped byte file (`tokenize_file`) and `save_checkpoint` /
`load_checkpoint`. The run's settings are a `TrainConfig`: the defaults are configs/shakespeare.json, inside the
package; --config FILE.json replaces any of them and a flag (--d-model 64, --no-fused, ...) any one of them.

Written to --out-dir (build/train): checkpoint.pt (every --checkpoint-every steps, at the end and on Ctrl-C or
SIGTERM: the step in flight finishes, the checkpoint is saved, the run exits), metrics.jsonl (one JSON object per
logged step: step, tokens, train_loss, val_loss on the held-out text every --eval-every steps, lr, grad_norm,
tokens_per_s, elapsed_s), and at the end loss_curve.png and samples.txt. --resume goes on from checkpoint.pt with
the model, the optimizer, the batch generator and the metrics restored: on the CPU, a run stopped at any step and
resumed has the losses, bit for bit, of one that never stopped.

Under torchrun every process draws the same global batch of windows from the same generator and trains on its own
slice of it, so N processes see the batches one process would (their DistributedDataParallel gradients average the
slices); rank 0 alone writes. The device is CUDA, else Apple's MPS, else the CPU (--device to choose); on CUDA the
forward pass runs in bfloat16 autocast (--no-amp: float32).
"""

import argparse
import contextlib
import dataclasses
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
from transformer_from_scratch.training import (AdamW, GPT2StyleLM, cross_entropy, get_batch, gradient_clipping,
                                               load_checkpoint, lr_cosine_schedule, save_checkpoint, tokenize_file)
from transformer_from_scratch.transformer_lm import TransformerLM, generate

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "shakespeare.json"
VOCAB_SIZE = 256  # tokenize_file's bytes
MODELS = ("transformer_lm", "gpt2_style")
FORMAT = "transformer_from_scratch.train/1"  # marks a checkpoint of this script
CHECKPOINT, METRICS, CURVE, SAMPLES = "checkpoint.pt", "metrics.jsonl", "loss_curve.png", "samples.txt"


@dataclasses.dataclass
class TrainConfig:
    """Everything that defines a run. The defaults equal configs/shakespeare.json (about 6 min on 2 free CPU cores)."""

    train_data: str = "notebooks/data/shakespeare/train.txt"  # a UTF-8 text file; its bytes are the tokens
    val_data: str = "notebooks/data/shakespeare/heldout.txt"  # the held-out text of the validation loss
    out_dir: str = "build/train"                    # checkpoint.pt, metrics.jsonl, loss_curve.png, samples.txt
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


def build_model(config: TrainConfig, device: torch.device | str = "cpu") -> nn.Module:
    """The configured model, initialised from torch's global generator (seed it first)."""
    sizes = dict(vocab_size=VOCAB_SIZE, context_length=config.context_length, d_model=config.d_model,
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


# ---------------------------------------------------------------- the run

@dataclasses.dataclass
class _Processes:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def sum(self, values: Tensor) -> Tensor:
        if self.distributed:
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values


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


def _read_run_checkpoint(path: Path) -> dict:
    """A checkpoint of this script, read onto the CPU, or SystemExit naming what does not fit."""
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
    return checkpoint


def _resumed_config(checkpoint: dict, requested: dict[str, Any], path: Path) -> TrainConfig:
    """The checkpoint's config, with the operational settings asked for now; SystemExit if a training one differs."""
    saved = checkpoint["extra"]["config"]
    unknown = sorted(set(saved) - set(FIELDS))
    if unknown:
        raise SystemExit(f"{path}: its config has settings this version does not know: {unknown}")
    differ = [f"{_flag(k)} {requested[k]!r} (the checkpoint's: {saved.get(k)!r})" for k in sorted(requested)
              if k not in OPERATIONAL and requested[k] != saved.get(k)]
    if differ:
        raise SystemExit(f"--resume continues the run in {path} as it was configured; these settings differ: "
                         + "; ".join(differ))
    return TrainConfig(**{**saved, **{k: v for k, v in requested.items() if k in OPERATIONAL}})


def _tokens(path: str, what: str, seq_len: int) -> np.ndarray:
    """The memory-mapped bytes of a corpus file, or SystemExit naming it."""
    flag = "--train-data" if what == "training" else "--val-data"
    if not Path(path).is_file():
        raise SystemExit(f"{flag}: no {what} text at {path} (run from the repository root, or give the path)")
    try:
        tokens = tokenize_file(path)
    except (OSError, ValueError) as error:
        raise SystemExit(f"{flag}: {error}") from None
    if len(tokens) < seq_len + 1:
        raise SystemExit(f"{flag}: {path} has {len(tokens)} bytes, fewer than one window of --seq-len {seq_len} "
                         f"and its target ({seq_len + 1})")
    return tokens


def train(config: TrainConfig, *, resume: bool = False, requested: dict[str, Any] | None = None,
          stop_at: int | None = None, overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
    """Run (or, with resume, go on with) the training run of `config`; return a summary of where it stopped.

    requested: the settings given explicitly (config file and flags): with resume, the training ones must equal the
    checkpoint's. stop_at: stop after that step as Ctrl-C would (save, exit), for tests and short sessions.
    Raises SystemExit with a one-line message for bad settings, a missing corpus, an unusable checkpoint, a loss
    that is not finite.
    """
    out_dir = Path(config.out_dir)
    checkpoint_path = out_dir / CHECKPOINT
    checkpoint = None
    if resume:
        checkpoint = _read_run_checkpoint(checkpoint_path)
        config = _resumed_config(checkpoint, requested or {}, checkpoint_path)
    elif checkpoint_path.exists() and not overwrite:
        raise SystemExit(f"{checkpoint_path} exists: --resume to go on with it, --overwrite to start again, or "
                         f"another --out-dir")
    check_config(config)
    if stop_at is not None and stop_at < 1:
        raise SystemExit(f"--stop-at must be >= 1, got {stop_at}")
    procs = _Processes(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                       int(os.environ.get("LOCAL_RANK", 0)))
    if config.batch_size % procs.world:
        raise SystemExit(f"--batch-size {config.batch_size} must be divisible by the {procs.world} processes")
    device = resolve_device(config.device, procs.local_rank)
    seq_len = config.seq_len or config.context_length
    train_tokens = _tokens(config.train_data, "training", seq_len)
    val_tokens = _tokens(config.val_data, "held-out", seq_len)
    if procs.distributed:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        with shape_checks(False):
            result = _run(config, checkpoint, device, procs, train_tokens, val_tokens, seq_len, stop_at, progress)
        if procs.distributed:
            # Rank 0 still writes the curve and the samples. A process that tore its process group down meanwhile
            # could abort in gloo (SIGABRT, "terminate called without an active exception"): all leave together.
            dist.barrier()
        return result
    finally:
        if procs.distributed:
            dist.destroy_process_group()


def _run(config: TrainConfig, checkpoint: dict | None, device: torch.device, procs: _Processes,
         train_tokens: np.ndarray, val_tokens: np.ndarray, seq_len: int, stop_at: int | None,
         progress: bool) -> dict[str, Any]:
    from tqdm.auto import tqdm

    out_dir = Path(config.out_dir)
    checkpoint_path, metrics_path = out_dir / CHECKPOINT, out_dir / METRICS
    lead = procs.rank == 0
    torch.manual_seed(config.seed)
    model = build_model(config, device)
    optimizer = AdamW(model.parameters(), lr=config.max_lr, betas=tuple(config.betas), eps=config.eps,
                      weight_decay=config.weight_decay)
    batches = torch.Generator().manual_seed(config.seed)
    start, elapsed_before, pending = 0, 0.0, []
    if checkpoint is not None:
        try:
            start = load_checkpoint(checkpoint_path, model, optimizer)
        except ValueError as error:
            raise SystemExit(f"--resume: {error}") from None
        extra = checkpoint["extra"]
        batches.set_state(extra["batches"])
        torch.set_rng_state(extra["torch_rng"])
        elapsed_before, pending = extra["elapsed_s"], list(extra["pending_losses"])
    trained = nn.parallel.DistributedDataParallel(model) if procs.distributed else model
    amp = config.amp and device.type == "cuda" and torch.cuda.is_bf16_supported()
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if amp else contextlib.nullcontext
    local = config.batch_size // procs.world
    rows = slice(procs.rank * local, (procs.rank + 1) * local)
    tokens_per_step = config.batch_size * seq_len

    def batch(tokens: np.ndarray, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """The global batch from the shared generator; this process keeps its rows."""
        x, y = get_batch(tokens, config.batch_size, seq_len, "cpu", generator=generator)
        return x[rows].to(device, non_blocking=True), y[rows].to(device, non_blocking=True)

    @torch.no_grad()
    def validation_loss() -> float:
        windows = torch.Generator().manual_seed(config.seed + 1)  # the same windows every time
        total = torch.zeros((), device=device)
        for _ in range(config.eval_batches):
            x, y = batch(val_tokens, windows)
            with autocast():
                logits = model(x)
            total += cross_entropy(logits, y)
        return procs.sum(total / config.eval_batches).item() / procs.world

    def save(step: int, elapsed: float) -> None:
        if lead:
            extra = dict(format=FORMAT, config=dataclasses.asdict(config), batches=batches.get_state(),
                         torch_rng=torch.get_rng_state(), elapsed_s=elapsed, pending_losses=list(pending))
            save_checkpoint(model, optimizer, step, checkpoint_path, extra=extra)

    if lead:
        out_dir.mkdir(parents=True, exist_ok=True)
        kept = [line for line in _read_lines(metrics_path) if json.loads(line)["step"] <= start] if start else []
        metrics_path.write_text("".join(kept))
    if start >= config.max_steps:
        if lead:
            print(f"the run in {out_dir} already finished at step {start}: sample from it with `make sample`")
        return dict(step=start, stopped=False, val_loss=None)
    parameters = sum(p.numel() for p in model.parameters())
    if lead:
        print(f"{type(model).__name__}: {parameters:,} parameters | {procs.world} process(es) on {device} "
              f"{'(bfloat16 autocast)' if amp else '(float32)'} | {tokens_per_step:,} tokens per step | steps "
              f"{start} -> {config.max_steps} | writing to {out_dir}", file=sys.stderr, flush=True)
    bar = tqdm(total=config.max_steps, initial=start, unit="step", disable=not (lead and progress), smoothing=0.1,
               dynamic_ncols=True, mininterval=1.0)
    began, log_began, log_tokens, val_loss, step = time.perf_counter(), time.perf_counter(), 0, None, start
    step_seconds = None  # a moving average, for the progress bar
    last_saved = start if checkpoint is not None else None
    with _stop_requests() as requests, bar:
        for it in range(start, config.max_steps):
            step_began = time.perf_counter()
            # The schedule at the step's number, 1 … max_steps: no update at lr 0, the last one at min_lr.
            lr = lr_cosine_schedule(it + 1, config.max_lr, config.min_lr, config.warmup_steps, config.max_steps)
            x, y = batch(train_tokens, batches)
            loss, norm = training_step(trained, optimizer, x, y, lr, config.grad_clip, autocast=autocast)
            votes = torch.stack([loss.float(), norm.float().to(loss.device),
                                 torch.tensor(float(requests["stop"]), device=loss.device)])
            loss_value, norm_value, stops = (procs.sum(votes) / procs.world).tolist()
            step = it + 1
            if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
                kept = (f"the last good checkpoint, of step {last_saved}, is kept at {checkpoint_path}"
                        if last_saved is not None else "no checkpoint was saved yet")
                what = "loss" if not math.isfinite(loss_value) else "gradient norm"
                raise SystemExit(f"the {what} is {loss_value if what == 'loss' else norm_value} at step {step} (loss "
                                 f"{loss_value}, gradient norm {norm_value}): stopped before the update; {kept}. "
                                 f"Try a lower --max-lr.")
            optimizer.step()
            pending.append(loss_value)
            log_tokens += tokens_per_step
            elapsed = elapsed_before + time.perf_counter() - began
            seconds = time.perf_counter() - step_began
            step_seconds = seconds if step_seconds is None else 0.9 * step_seconds + 0.1 * seconds
            bar.set_postfix_str(f"loss {loss_value:.3f}, lr {lr:.2e}, {tokens_per_step / step_seconds:,.0f} tok/s"
                                + (f", val {val_loss:.3f}" if val_loss is not None else ""), refresh=False)
            evaluate = step % config.eval_every == 0 or step == config.max_steps
            if evaluate or step % config.log_every == 0:
                if evaluate:
                    val_loss = validation_loss()
                row = dict(step=step, tokens=step * tokens_per_step, train_loss=sum(pending) / len(pending),
                           val_loss=val_loss if evaluate else None, lr=lr, grad_norm=norm_value,
                           tokens_per_s=round(log_tokens / (time.perf_counter() - log_began), 1),
                           elapsed_s=round(elapsed, 2))
                if lead:
                    with metrics_path.open("a", encoding="utf-8") as file:
                        file.write(json.dumps(row) + "\n")
                pending, log_began, log_tokens = [], time.perf_counter(), 0
            bar.update(1)
            stop = stops > 0 or step == stop_at
            if stop or step % config.checkpoint_every == 0 or step == config.max_steps:
                save(step, elapsed)
                last_saved = step
            if stop:
                break
    if step < config.max_steps:
        if lead:
            print(f"stopped after step {step} of {config.max_steps}: checkpoint saved to {checkpoint_path}; go on "
                  f"with `make train TRAIN_ARGS=--resume` (or the same command with --resume)", file=sys.stderr)
        return dict(step=step, stopped=True, val_loss=val_loss)
    elapsed = elapsed_before + time.perf_counter() - began
    if lead:
        write_loss_curve(metrics_path, out_dir / CURVE)
        samples = write_samples(model, config, device, out_dir / SAMPLES)
        print(f"held-out loss {val_loss:.3f} nats per byte after {step} steps ({step * tokens_per_step:,} tokens) in "
              f"{elapsed / 60:.1f} min | {out_dir / CHECKPOINT}, {METRICS}, {CURVE}, {SAMPLES}\n\n{samples}")
    return dict(step=step, stopped=False, val_loss=val_loss, elapsed_s=elapsed)


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        return []
    return [line + "\n" for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ---------------------------------------------------------------- what a run leaves behind

def write_loss_curve(metrics_path: Path, out: Path) -> None:
    """The training and held-out losses of metrics.jsonl against the tokens seen, as a PNG."""
    from matplotlib.figure import Figure

    rows = [json.loads(line) for line in _read_lines(metrics_path)]
    val = [r for r in rows if r["val_loss"] is not None]
    fig = Figure(figsize=(8, 4), layout="constrained")
    ax = fig.subplots()
    ax.plot([r["tokens"] for r in rows], [r["train_loss"] for r in rows], alpha=0.6, label="training loss")
    ax.plot([r["tokens"] for r in val], [r["val_loss"] for r in val], "o-", label="held-out loss")
    ax.axhline(math.log(VOCAB_SIZE), color="gray", linestyle="--", label="uniform model, ln 256")
    ax.set_xlabel("tokens seen (bytes)")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.legend()
    if val:
        ax.set_title(f"Held-out loss {val[-1]['val_loss']:.2f} nats per byte after {val[-1]['tokens']:,} tokens")
    fig.savefig(out, dpi=110)


def encode(text: str) -> Tensor:
    """A text's UTF-8 bytes as token ids (tokenize_file's tokens)."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode(ids: Tensor) -> str:
    return bytes(ids.tolist()).decode("utf-8", errors="replace")


def sample_text(model: nn.Module, prompt: str, max_new_tokens: int, *, temperature: float, top_k: int | None,
                top_p: float | None, seed: int) -> str:
    """The prompt and the model's continuation of it, drawn with a generator seeded on the model's device."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    with shape_checks(False):
        new = generate(model, encode(prompt).to(device), max_new_tokens, temperature=temperature, top_k=top_k,
                       top_p=top_p, generator=generator)
    return prompt + decode(new)


def write_samples(model: nn.Module, config: TrainConfig, device: torch.device, out: Path) -> str:
    """One sample per configured prompt, the i-th drawn with seed config.seed + i, written to `out`; returns it."""
    settings = f"temperature {config.temperature}, top_k {config.top_k}, top_p {config.top_p}"
    texts = [f"--- prompt {prompt!r} ({settings}, seed {config.seed + i})\n"
             + sample_text(model, prompt, config.sample_tokens, temperature=config.temperature, top_k=config.top_k,
                           top_p=config.top_p, seed=config.seed + i)
             for i, prompt in enumerate(config.sample_prompts)]
    text = "\n\n".join(texts) + "\n"
    out.write_text(text, encoding="utf-8")
    return text


def load_for_sampling(path: str | os.PathLike, device: torch.device) -> tuple[nn.Module, TrainConfig]:
    """The model of a make-train checkpoint, its weights loaded, on `device`; SystemExit naming what does not fit."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"--checkpoint: no checkpoint at {path}")
    checkpoint = _read_run_checkpoint(path)
    config = TrainConfig(**{k: v for k, v in checkpoint["extra"]["config"].items() if k in FIELDS})
    model = build_model(config, device)
    try:
        load_checkpoint(path, model)
    except ValueError as error:
        raise SystemExit(f"--checkpoint {path}: {error}") from None
    return model.eval(), config


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
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                        help="a JSON file of settings (default: the package's configs/shakespeare.json)")
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
    parser.add_argument("--prompt", default="ROMEO:\n", help="the text to continue (its UTF-8 bytes are the tokens)")
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
    model, _ = load_for_sampling(args.checkpoint, resolve_device(args.device))
    try:
        text = sample_text(model, args.prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                           top_p=args.top_p, seed=args.seed)
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
    from_file = read_config_file(args.config)
    config = TrainConfig(**{**from_file, **flags})
    requested = {**(from_file if args.config != DEFAULT_CONFIG else {}), **flags}
    return train(config, resume=args.resume, requested=requested, stop_at=args.stop_at, overwrite=args.overwrite,
                 progress=args.progress)


if __name__ == "__main__":
    main()

"""`make train`: train TransformerLM on Shakespeare's plays with notebook 11's parts; `make sample`: sample from it.

    python -m transformer_from_scratch.train [--config FILE.json] [--FIELD VALUE ...] [--resume] [--stop-at N]
    python -m transformer_from_scratch.train sample --checkpoint build/train/checkpoint.pt --prompt "ROMEO:"
    torchrun --nproc_per_node=N -m transformer_from_scratch.train [...]     # DistributedDataParallel

The program, in the order it runs: main() reads the settings (a `TrainConfig`, config.py: its defaults are
`make train`'s run; --config FILE.json and the flags replace any of them); train() checks them, finds the device
and the tokens (data.py: the text's bytes, or notebook 13's BPE trained once into OUT_DIR) and joins the torchrun
processes; set_up() builds (or, with --resume, restores) the model, the optimizer and the batch generator into a
Run; train_loop() repeats take_step(), evaluate(), the metrics row and save() until the last step or a stop; at
the end the loss curve and the samples (sample.py, which is also `... train sample`). The loop is the course's own:
`TransformerLM` (shape checks off), `cross_entropy`, `AdamW`, `lr_cosine_schedule`, `gradient_clipping`,
`get_batch` on the memory-mapped tokens and `save_checkpoint`; a checkpoint is read once and put back as
`load_checkpoint` does.

Written to --out-dir (build/train): checkpoint.pt (every --checkpoint-every steps, at the end and on Ctrl-C or
SIGTERM: the step in flight finishes, the checkpoint is saved, the run exits, printing the command that resumes it),
metrics.jsonl (one JSON object per logged step: step, tokens, train_loss, val_loss on the held-out text every
--eval-every steps (nats per token), val_loss_per_byte (the same in nats per byte: val_loss × the held-out text's
tokens / its bytes, which compares tokenizers; equal to val_loss for bytes), lr, grad_norm, tokens_per_s,
elapsed_s), and at the end loss_curve.png and samples.txt. --resume goes on from checkpoint.pt with the model, the
optimizer, the batch generator and the metrics restored (and a BPE run's tokenizer files, checked against the
checksum the checkpoint recorded): on the CPU, a run stopped at any step and resumed has the losses, bit for bit, of
one that never stopped.

Under torchrun every process draws the same global batch of windows from the same generator and trains on its own
slice of it, so N processes see the batches one process would (their DistributedDataParallel gradients average the
slices); rank 0 alone writes. The device is CUDA, else Apple's MPS, else the CPU (--device to choose); on CUDA the
forward pass runs in bfloat16 autocast (--no-amp: float32).
"""

from __future__ import annotations  # train() and train_loop() come first and name Run, defined below

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shlex
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

from transformer_from_scratch import sample
# The "noqa: F401" names are not used here: they are where callers of train.py (the tests, the benchmark) find them.
from transformer_from_scratch.config import (CHECKPOINT, CONFIGS, DEFAULT_VOCAB_SIZE, FIELDS, FORMAT,  # noqa: F401
                                             OPERATIONAL, VOCAB_SIZE, TrainConfig, add_setting_flags, build_model,
                                             check_config, load_state, model_vocab_size, read_config_file,
                                             read_run_checkpoint, resolve_device, setting_flag)
from transformer_from_scratch.data import Data, load_data
from transformer_from_scratch.sample import load_for_sampling, sample_text, write_samples  # noqa: F401
from transformer_from_scratch.shapes import shape_checks
from transformer_from_scratch.training import (AdamW, cross_entropy, get_batch, gradient_clipping,
                                               lr_cosine_schedule, save_checkpoint)
from transformer_from_scratch.transformer_lm import generate  # noqa: F401

METRICS, CURVE, SAMPLES = "metrics.jsonl", "loss_curve.png", "samples.txt"


# ---------------------------------------------------------------- the program

def main(argv: list[str] | None = None) -> dict[str, Any] | str:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sample"]:
        return sample.main(argv[1:])
    args = _train_parser().parse_args(argv)
    flags = {name: getattr(args, name) for name in FIELDS if hasattr(args, name)}
    requested = {**(read_config_file(args.config) if args.config else {}), **flags}  # a flag replaces the file's
    return train(TrainConfig(**requested), resume=args.resume, requested=requested, stop_at=args.stop_at,
                 overwrite=args.overwrite, progress=args.progress)


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
        checkpoint = read_run_checkpoint(checkpoint_path)
        config = _resumed_config(checkpoint, requested or {}, checkpoint_path)
    elif checkpoint_path.exists() and not overwrite:
        raise SystemExit(f"{checkpoint_path} exists: --resume to go on with it, --overwrite to start again, or "
                         f"another --out-dir")
    check_config(config)
    config = dataclasses.replace(config, vocab_size=model_vocab_size(config))  # the checkpoint records the size
    procs, device = start_processes(config.batch_size, stop_at, config.device)
    digest = checkpoint["extra"].get("tokenizer_sha256") if checkpoint is not None else None
    if checkpoint is not None and config.tokenizer == "bpe" and digest is None:
        raise SystemExit(f"--resume: {checkpoint_path} records no tokenizer, its run cannot be a --tokenizer bpe one")
    with _process_group(procs, device), shape_checks(False):
        data = load_data(config, procs, digest)
        run = set_up(config, checkpoint, procs, device, data)
        return train_loop(run, stop_at, progress)


def train_loop(run: Run, stop_at: int | None, progress: bool) -> dict[str, Any]:
    """From run.step to config.max_steps: take a step; every eval_every steps (and at the last) evaluate, every
    log_every steps (and when evaluating) log; every checkpoint_every steps (at the last, and when stopped) save.
    Stops after the step in flight on Ctrl-C, SIGTERM or at stop_at. Returns train()'s summary."""
    config = run.config
    if run.step >= config.max_steps:
        if run.lead:
            print(f"the run in {run.out_dir} already finished at step {run.step}: sample from it with "
                  f"`{sample_command(run.config)}`")
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


def _resumed_config(checkpoint: dict, requested: dict[str, Any], path: Path) -> TrainConfig:
    """The checkpoint's config, with the operational settings asked for now; SystemExit if a training one differs."""
    saved = {"tokenizer": "bytes", "vocab_size": VOCAB_SIZE,  # a checkpoint from before --tokenizer: bytes
             **checkpoint["extra"]["config"]}
    if requested.get("vocab_size", 0) is None:  # --vocab-size none: the tokenizer's default, as a new run takes it
        tokenizer = requested.get("tokenizer", saved["tokenizer"])
        requested = dict(requested, vocab_size=DEFAULT_VOCAB_SIZE.get(tokenizer, VOCAB_SIZE))
    return TrainConfig(**resumed_settings(saved, requested, FIELDS, OPERATIONAL, "the run", path))


def resumed_settings(saved: dict[str, Any], requested: dict[str, Any], known, operational, what: str,
                     path: Path) -> dict[str, Any]:
    """A checkpoint's `saved` settings with the `operational` ones `requested` now (make train's and make finetune's
    --resume); SystemExit for a saved name not in `known`, and for each other requested setting that differs."""
    unknown = sorted(set(saved) - set(known))
    if unknown:
        raise SystemExit(f"{path}: its settings hold names this version does not know: {unknown}")
    differ = [f"{setting_flag(k)} {requested[k]!r} (the checkpoint's: {saved.get(k)!r})" for k in sorted(requested)
              if k not in operational and requested[k] != saved.get(k)]
    if differ:
        raise SystemExit(f"--resume continues {what} in {path} as it was set up; these settings differ: "
                         + "; ".join(differ))
    return {**saved, **{k: v for k, v in requested.items() if k in operational}}


def start_processes(batch_size: int, stop_at: int | None, device: str) -> tuple[_Processes, torch.device]:
    """This process's place under torchrun and its device; SystemExit for a --stop-at below 1 or a batch that the
    processes cannot share evenly."""
    if stop_at is not None and stop_at < 1:
        raise SystemExit(f"--stop-at must be >= 1, got {stop_at}")
    procs = _Processes.from_environment()
    if batch_size % procs.world:
        raise SystemExit(f"--batch-size {batch_size} must be divisible by the {procs.world} processes")
    return procs, resolve_device(device, procs.local_rank)


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
    load_state(checkpoint, run.model, run.optimizer, "--resume")
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


# ---------------------------------------------------------------- the run: what it says and leaves behind

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
                  f"go on with `{resume_command(run.config)}`" + (" (the same flags after your torchrun command)"
                                                                  if run.procs.distributed else ""), file=sys.stderr)
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


def _make(target: str, variable: str, flags: list[str]) -> str:
    """`make TARGET VARIABLE="FLAGS"`, each flag quoted for the shell that make's recipe runs."""
    words = " ".join(shlex.quote(flag) for flag in flags)
    return f"make {target}" + (f" {variable}={words}" if len(flags) == 1 and words == flags[0] else
                               f' {variable}="{words}"' if flags else "")


def resume_command(config: TrainConfig) -> str:
    """The command that goes on with the run of `config`: --resume, the run's --out-dir (unless make train's) and its
    tokenizer. Every other setting comes from the checkpoint (a flag that differs is refused, one that is the same
    is taken), so these are all the flags it needs."""
    flags = ["--resume"]
    if Path(config.out_dir) != Path(FIELDS["out_dir"].default):
        flags += ["--out-dir", config.out_dir]
    if config.tokenizer != FIELDS["tokenizer"].default:
        flags += ["--tokenizer", config.tokenizer]
        if config.vocab_size not in (None, DEFAULT_VOCAB_SIZE.get(config.tokenizer)):
            flags += ["--vocab-size", str(config.vocab_size)]
    return _make("train", "TRAIN_ARGS", flags)


def sample_command(config: TrainConfig) -> str:
    """make sample, with the run's checkpoint unless it is the default one."""
    path = Path(config.out_dir) / CHECKPOINT
    return _make("sample", "SAMPLE_ARGS", [] if path == sample.DEFAULT_CHECKPOINT else ["--checkpoint", str(path)])


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


# ---------------------------------------------------------------- the command line

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
    add_setting_flags(parser)
    return parser


if __name__ == "__main__":
    main()

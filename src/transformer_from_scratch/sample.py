"""`make sample`: continue a prompt with the model of a `make train` checkpoint.

    python -m transformer_from_scratch.train sample --checkpoint build/train/checkpoint.pt --prompt "ROMEO:"
    python -m transformer_from_scratch.sample --checkpoint build/train/checkpoint.pt --prompt "ROMEO:"   # the same

The checkpoint holds its run's config, so the model is rebuilt as it was trained and the prompt is encoded (and the
continuation decoded) with the run's tokenizer: bytes, or the BPE files beside the checkpoint. A header on stderr
names the checkpoint, its step and the sampling settings; the text goes to stdout as it is drawn (through
`generate`'s on_token), so a long sample shows from its first token. The end of a run (`train.py`) writes its
samples.txt with the same `sample_text`.
"""

import argparse
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from transformer_from_scratch.config import (CHECKPOINT, FIELDS, TOKENIZERS, TrainConfig, build_model, load_state,
                                             optional, read_run_checkpoint, resolve_device)
from transformer_from_scratch.data import ByteTokenizer, load_tokenizer
from transformer_from_scratch.shapes import shape_checks
from transformer_from_scratch.tokenizer import Tokenizer
from transformer_from_scratch.transformer_lm import generate

DEFAULT_CHECKPOINT = Path("build/train") / CHECKPOINT  # make train's default --out-dir


class _Stream:
    """Text for on_text as the ids come: after each id, the part of the decoded text that no later id can change
    (a text that ends in U+FFFD may be a character whose bytes are still coming, so it waits for the next id).
    What it passes on, joined, is tokenizer.decode(all the ids), once finish() has passed on the rest."""

    def __init__(self, tokenizer, on_text: Callable[[str], None]):
        self.tokenizer, self.on_text, self.ids, self.shown = tokenizer, on_text, [], ""

    def __call__(self, token_id: int) -> None:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids)
        if not text.endswith("\ufffd"):
            self._show(text)

    def _show(self, text: str) -> None:
        if text.startswith(self.shown) and len(text) > len(self.shown):
            self.on_text(text[len(self.shown):])
            self.shown = text

    def finish(self, text: str) -> None:
        self._show(text)


def _streams() -> bool:
    """Whether this version of notebook 10's generate takes on_token (called with each new id as it is picked)."""
    return "on_token" in inspect.signature(generate).parameters


def sample_text(model: nn.Module, tokenizer: ByteTokenizer | Tokenizer, prompt: str, max_new_tokens: int, *,
                temperature: float, top_k: int | None, top_p: float | None, seed: int,
                on_text: Callable[[str], None] | None = None) -> str:
    """The prompt and the model's continuation of it (the prompt encoded and the new ids decoded with the run's
    tokenizer), drawn with a generator seeded on the model's device. on_text, if given, receives the continuation
    piece by piece as it is drawn (all of it at the end where generate has no on_token)."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    ids = torch.tensor(tokenizer.encode(prompt), dtype=torch.long, device=device)
    stream = None if on_text is None else _Stream(tokenizer, on_text)
    options = {} if stream is None or not _streams() else dict(on_token=stream)
    with shape_checks(False):
        new = generate(model, ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                       generator=generator, **options)
    text = tokenizer.decode(new.tolist())
    if stream is not None:
        stream.finish(text)
    return prompt + text


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


def _no_checkpoint(path: Path) -> str:
    """The error for a --checkpoint that is not there: how to make one, or to name another."""
    if path == DEFAULT_CHECKPOINT:
        train = "`make train` first (a short run: make train TRAIN_ARGS=\"--max-steps 100\")"
    else:
        train = f"`make train TRAIN_ARGS=\"--out-dir {path.parent}\"` first"
    return f"--checkpoint: no checkpoint at {path}: run {train}, or pass --checkpoint PATH of a run's {CHECKPOINT}"


def _load(path: str | os.PathLike, device: torch.device
          ) -> tuple[nn.Module, TrainConfig, ByteTokenizer | Tokenizer, int]:
    """load_for_sampling's model, config and tokenizer, and the step the checkpoint was saved at."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(_no_checkpoint(path))
    checkpoint = read_run_checkpoint(path)  # read once: its config builds the model, its weights fill it
    config = TrainConfig(**{k: v for k, v in checkpoint["extra"]["config"].items() if k in FIELDS})
    tokenizer = load_tokenizer(config, path.parent, checkpoint["extra"].get("tokenizer_sha256"),
                               f"--checkpoint {path}")
    model = build_model(config, device)
    load_state(checkpoint, model, None, f"--checkpoint {path}")
    return model.eval(), config, tokenizer, checkpoint["iteration"]


def load_for_sampling(path: str | os.PathLike, device: torch.device
                      ) -> tuple[nn.Module, TrainConfig, ByteTokenizer | Tokenizer]:
    """The model of a make-train checkpoint, its weights loaded, on `device`, and its tokenizer (bpe: the files
    beside it); SystemExit naming what does not fit."""
    return _load(path, device)[:3]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m transformer_from_scratch.train sample",
                                     description="Continue a prompt with the model of a make-train checkpoint.")
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--prompt", default="ROMEO:\n", help="the text to continue (encoded with the run's tokenizer)")
    parser.add_argument("--tokenizer", choices=TOKENIZERS, default=None,
                        help="the checkpoint's (the default): bytes, or bpe with the vocab.json and merges.txt "
                             "beside it; another is refused")
    parser.add_argument("--max-new-tokens", type=int, default=500)
    parser.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    parser.add_argument("--top-k", type=optional(int), default=None)
    parser.add_argument("--top-p", type=optional(float), default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    return parser


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> str:
    """`... train sample`: print the continuation of --prompt as it is drawn (after a header on stderr); return the
    prompt and the continuation."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if not args.prompt:
        raise SystemExit("--prompt must hold at least one character")
    if args.max_new_tokens < 0:
        raise SystemExit(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    model, config, tokenizer, step = _load(args.checkpoint, resolve_device(args.device))
    if args.tokenizer not in (None, config.tokenizer):
        raise SystemExit(f"--tokenizer {args.tokenizer}: {args.checkpoint} was trained on --tokenizer "
                         f"{config.tokenizer} tokens, which sample uses")
    device = next(model.parameters()).device
    print(f"{args.checkpoint}: step {step} of {config.max_steps}, {type(model).__name__} "
          f"({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, {config.tokenizer} tokens) on "
          f"{device} | {args.max_new_tokens} new tokens, "
          + ("greedy (temperature 0)" if args.temperature == 0 else
             f"temperature {args.temperature}, top_k {args.top_k}, top_p {args.top_p}, seed {args.seed}"),
          file=sys.stderr, flush=True)
    shown = _Prompted(args.prompt)  # generate checks the settings first: a refused one prints nothing on stdout
    try:
        text = sample_text(model, tokenizer, args.prompt, args.max_new_tokens, temperature=args.temperature,
                           top_k=args.top_k, top_p=args.top_p, seed=args.seed, on_text=shown)
    except ValueError as error:  # a sampling setting out of range
        raise SystemExit(str(error)) from None
    shown("")  # the prompt, if no piece came
    _write("\n")
    return text


class _Prompted:
    """on_text for main: the prompt written before the first piece (or at the end, if nothing came)."""

    def __init__(self, prompt: str):
        self.prompt = prompt

    def __call__(self, piece: str) -> None:
        if self.prompt is not None:
            _write(self.prompt)
            self.prompt = None
        if piece:
            _write(piece)


if __name__ == "__main__":
    main()

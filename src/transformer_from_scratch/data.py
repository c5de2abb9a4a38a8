"""A `make train` run's tokens: its tokenizer and the memory-mapped token files of the training and held-out texts.

--tokenizer bytes (the default): the text's UTF-8 bytes, `tokenize_file`'s (ids 0-255), in every process.
--tokenizer bpe: notebook 13's byte-level BPE. `train_bpe` learns it from the training text once, into
OUT_DIR/vocab.json and merges.txt (which --resume and `sample` reuse, checked against the sha256 the checkpoint
recorded), and both texts are encoded once into OUT_DIR/train_tokens.npy and val_tokens.npy (rewritten only when
older than the text or the tokenizer). Under torchrun rank 0 does both while the others wait. Each long step says
what it does on stderr before it starts, and its time after.
"""

import contextlib
import dataclasses
import hashlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from transformer_from_scratch.config import VOCAB_SIZE, TrainConfig, model_vocab_size
from transformer_from_scratch.tokenizer import Tokenizer, train_bpe
from transformer_from_scratch.training import tokenize_file

VOCAB, MERGES = "vocab.json", "merges.txt"  # --tokenizer bpe: the tokenizer, beside the checkpoint (Tokenizer.save)
TOKEN_FILES = {"training": "train_tokens.npy", "held-out": "val_tokens.npy"}  # --tokenizer bpe: the encoded texts


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


@contextlib.contextmanager
def saying(doing: str) -> Iterator[None]:
    """On stderr, `doing` before a long step, then its time on the same line (on an error: the line ends there)."""
    print(f"{doing} ...", end="", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        yield
    except BaseException:
        print(file=sys.stderr, flush=True)
        raise
    print(f" {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)


def _size(path: Path) -> str:
    size = path.stat().st_size
    return f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} KB"


def _train_tokenizer(config: TrainConfig, folder: Path) -> None:
    """train_bpe on the training text, written to folder/vocab.json and merges.txt (each renamed into place)."""
    text = Path(config.train_data)
    with saying(f"BPE: learning a vocabulary of {model_vocab_size(config):,} (train_bpe) from {text} "
                f"({_size(text)}) into {folder / VOCAB} and {MERGES}"):
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
    with saying(f"BPE: encoding {text_path} ({_size(text_path)}) into {token_path}"):
        ids = np.array(tokenizer.encode(text_path.read_text(encoding="utf-8")), dtype=dtype)
        with open(_partial(token_path), "wb") as file:
            np.save(file, ids)
        os.replace(_partial(token_path), token_path)


def load_data(config: TrainConfig, procs, digest: str | None) -> Data:
    """The tokenizer and the memory-mapped tokens of the training and held-out texts, or SystemExit naming what is
    missing. bytes: tokenize_file's, in every process. bpe: rank 0 trains the tokenizer, unless `digest` (a resumed
    run's) names the one in out_dir, and encodes the texts once into out_dir; the other processes wait for it (`procs`:
    this process's .rank, and .barrier(), which waits for the others; train's _Processes)."""
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


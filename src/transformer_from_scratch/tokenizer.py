# Generated from notebooks/13_tokenizer.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: e519bb5797197c8b40c9ebb28d2fd1799c637d6c8a2dc438245b425c264d2d65

import heapq
import json
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from multiprocessing import Pool
from pathlib import Path

import regex

# GPT-2's pre-tokenizer: a contraction, an optional space then letters, then digits, then other symbols; white space
# that is not followed by a non-space; any other white space.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Where a text may be cut without changing its pre-tokens: after a line break between two non-spaces.
SAFE_CUT = r"(?<=\S)\n(?=\S)"
CHUNK_BYTES = 1 << 20  # _pretoken_counts counts a file in one process per MiB, at most one per core


def _split_on_special(text: str, special_tokens: Iterable[str] = ()) -> list[str]:
    """`text` cut around every special token, which stands alone; where two overlap, the longest wins.
    Joining the pieces gives `text` back; there are no empty pieces."""
    specials = sorted(set(special_tokens), key=len, reverse=True)
    if not specials:
        return [text] if text else []
    return [piece for piece in regex.split("(" + "|".join(map(regex.escape, specials)) + ")", text) if piece]


def _count_pretokens(text: str, special_tokens: Iterable[str] = (), pattern: str = GPT2_PATTERN) -> Counter:
    """How often each pre-token of `text` occurs (a Counter of str); the special tokens are left out."""
    specials, compiled, counts = set(special_tokens), regex.compile(pattern), Counter()
    for piece in _split_on_special(text, specials):
        if piece not in specials:
            counts.update(match.group() for match in compiled.finditer(piece))
    return counts


def _chunk_bounds(path: Path, parts: int, special_tokens: list[str]) -> list[int]:
    """Byte offsets that cut the file into about `parts` pieces, each cut at a special token or, in a file without
    any, just after a line break between two printable ASCII characters: cuts that change no pre-token."""
    size, bounds = path.stat().st_size, [0]
    marks = [token.encode("utf-8") for token in special_tokens]
    with open(path, "rb") as file:
        for part in range(1, parts):
            file.seek(max(part * size // parts, bounds[-1]))
            window = file.read(CHUNK_BYTES)
            found = [i for i in (window.find(mark) for mark in marks) if i >= 0]
            if not found:
                line = regex.search(rb"(?<=[\x21-\x7e])\n(?=[\x21-\x7e])", window)
                found = [line.end()] if line else []
            if found:
                bounds.append(file.tell() - len(window) + min(found))
    return sorted(set(bounds + [size]))


def _count_chunk(job: tuple[str, int, int, list[str], str]) -> Counter:
    """_count_pretokens of the bytes start … end of a file (one worker's piece)."""
    path, start, end, special_tokens, pattern = job
    with open(path, "rb") as file:
        file.seek(start)
        return _count_pretokens(file.read(end - start).decode("utf-8"), special_tokens, pattern)


def _pretoken_counts(input_path: str | os.PathLike, special_tokens: Iterable[str] = (), *,
                     processes: int | None = None, pattern: str = GPT2_PATTERN) -> Counter:
    """_count_pretokens of a UTF-8 file, in parallel: `processes` workers (None: one per MiB, at most one per core;
    1: this process), each counting a piece of the file cut where no pre-token changes (see _chunk_bounds)."""
    path, specials = Path(input_path), list(special_tokens)
    if not path.is_file():
        raise FileNotFoundError(f"train_bpe: no text file at {path}")
    size = path.stat().st_size
    if processes is None:
        processes = max(1, min(os.cpu_count() or 1, size // CHUNK_BYTES))
    if processes < 1:
        raise ValueError(f"train_bpe: processes must be >= 1 or None, got {processes}")
    bounds = _chunk_bounds(path, processes, specials)
    jobs = [(str(path), start, end, specials, pattern) for start, end in zip(bounds, bounds[1:])]
    if len(jobs) == 1:
        return _count_chunk(jobs[0])
    with Pool(min(processes, len(jobs))) as pool:
        return sum(pool.map(_count_chunk, jobs), Counter())


class _Greater:
    """A pair that sorts before the pairs smaller than it: in the min-heap, the lexicographically greater pair of
    equal count comes out first."""
    __slots__ = ("pair",)

    def __init__(self, pair: tuple[bytes, bytes]) -> None:
        self.pair = pair

    def __lt__(self, other: "_Greater") -> bool:
        return self.pair > other.pair


def _merge_word(word: list[bytes], pair: tuple[bytes, bytes]) -> list[bytes]:
    """`word` with every occurrence of `pair` merged into one token, left to right, without overlaps."""
    merged, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            merged.append(pair[0] + pair[1])
            i += 2
        else:
            merged.append(word[i])
            i += 1
    return merged


def _learn_merges(word_counts: dict[str, int], num_merges: int) -> list[tuple[bytes, bytes]]:
    """Up to `num_merges` merges, the most frequent pair first (ties: the greater pair), over pre-tokens counted
    `word_counts`; pair counts are kept up to date for the words each merge touches, not counted again."""
    words = [[bytes([b]) for b in word.encode("utf-8")] for word in word_counts]
    freqs = list(word_counts.values())
    pairs, where = Counter(), defaultdict(set)  # pair -> its count; pair -> the indices of the words that hold it
    for i, word in enumerate(words):
        for pair in zip(word, word[1:]):
            pairs[pair] += freqs[i]
            where[pair].add(i)
    heap = [(-count, _Greater(pair)) for pair, count in pairs.items()]
    heapq.heapify(heap)
    merges = []
    while heap and len(merges) < num_merges:
        count, best = heapq.heappop(heap)
        pair = best.pair
        if pairs[pair] != -count:  # a stale entry: the count changed after it was pushed
            continue
        merges.append(pair)
        changed = set()
        for i in where.pop(pair):
            old, new = words[i], _merge_word(words[i], pair)
            for p in zip(old, old[1:]):
                pairs[p] -= freqs[i]
            for p in zip(new, new[1:]):
                pairs[p] += freqs[i]
                where[p].add(i)
            before, after = Counter(zip(old, old[1:])), Counter(zip(new, new[1:]))
            changed |= {p for p in before.keys() | after.keys() if before[p] != after[p]}  # fewer or more, not gone
            words[i] = new
        del pairs[pair]
        for p in changed - {pair}:
            if pairs[p] > 0:
                heapq.heappush(heap, (-pairs[p], _Greater(p)))
    return merges


def train_bpe(input_path: str | os.PathLike, vocab_size: int, special_tokens: Iterable[str] = (), *,
              processes: int | None = None, pattern: str = GPT2_PATTERN
              ) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """A byte-level BPE vocabulary of `vocab_size` tokens learnt from the UTF-8 text file `input_path`.

    Returns (vocab, merges). vocab maps ids 0 … vocab_size-1 to bytes: ids 0-255 the single bytes (id = byte value,
    as notebook 11's tokens), then one token per merge in the order learnt, then the special tokens. merges are the
    pairs merged, in order. A text too short for that many merges gives fewer (the ids stay dense). Merges never
    cross a pre-token (GPT-2's pattern) nor a special token (the text is split on them; they are not counted).
    Raises ValueError for a vocab_size below 256 + the special tokens, FileNotFoundError for a missing file.
    """
    specials = list(dict.fromkeys(special_tokens))
    if not isinstance(vocab_size, int) or vocab_size < 256 + len(specials):
        raise ValueError(f"train_bpe: vocab_size={vocab_size!r} is below 256 bytes + {len(specials)} special tokens")
    counts = _pretoken_counts(input_path, specials, processes=processes, pattern=pattern)
    merges = _learn_merges(counts, vocab_size - 256 - len(specials))
    tokens = [bytes([b]) for b in range(256)] + [a + b for a, b in merges] + [s.encode("utf-8") for s in specials]
    return dict(enumerate(tokens)), merges


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for every byte, as its vocab.json and merges.txt (and GGUF files) write tokens:
    the printable Latin-1 bytes stand for themselves; the others, in order, for the characters from U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(others)}}


def _check_text(text: object, what: str) -> str:
    """`text` if it is a str; else TypeError, naming `what` took it."""
    if not isinstance(text, str):
        raise TypeError(f"{what} takes a str, got {type(text).__name__}: {text!r:.60}")
    return text


_LAST_CUT = regex.compile("(?r)" + SAFE_CUT)  # (?r) searches from the end: the last cut comes first


def _safe_cut(text: str, special_tokens: list[str]) -> int:
    """How much of `text` can be encoded on its own: up to its last line break between two non-spaces that no
    special token spans (0 if there is none). Only a special token holding a line break could span one."""
    broken = [token for token in special_tokens if "\n" in token]
    spans = [m.span() for m in regex.finditer("|".join(map(regex.escape, broken)), text)] if broken else []
    cut = _LAST_CUT.search(text)
    while cut and any(start < cut.end() < end for start, end in spans):
        cut = _LAST_CUT.search(text, 0, cut.start())
    return cut.end() if cut else 0


def _check_ids(ids: Iterable[int], vocab: dict[int, bytes]) -> list[int]:
    """The ids as a list of int; ValueError for one outside the vocabulary."""
    ids = [int(i) for i in ids]
    for i in ids:
        if i not in vocab:
            raise ValueError(f"Tokenizer.decode: id {i} is not in the vocabulary (ids 0 … {len(vocab) - 1})")
    return ids


def _read_gpt2_files(vocab_filepath: str | os.PathLike, merges_filepath: str | os.PathLike
                     ) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """The vocabulary and merges that Tokenizer.save wrote (GPT-2's format)."""
    byte_of = {char: b for b, char in bytes_to_unicode().items()}
    decode = lambda text: bytes(byte_of[char] for char in text)  # noqa: E731
    vocab = {i: decode(token) for token, i in json.loads(Path(vocab_filepath).read_text("utf-8")).items()}
    lines = Path(merges_filepath).read_text("utf-8").splitlines()
    return vocab, [tuple(map(decode, line.split(" "))) for line in lines if line and not line.startswith("#version")]


def _write_gpt2_files(vocab: dict[int, bytes], merges: list[tuple[bytes, bytes]], vocab_filepath: str | os.PathLike,
                      merges_filepath: str | os.PathLike) -> None:
    """Tokenizer.save's files: see there."""
    char = bytes_to_unicode()
    text = lambda token: "".join(char[b] for b in token)  # noqa: E731
    written = {text(token): i for i, token in sorted(vocab.items())}
    if len(written) < len(vocab):
        raise ValueError("Tokenizer.save: two ids hold the same bytes, which vocab.json cannot write")
    Path(vocab_filepath).write_text(json.dumps(written, ensure_ascii=False, indent=0), "utf-8")
    lines = ["#version: 0.2", *(f"{text(a)} {text(b)}" for a, b in merges)]
    Path(merges_filepath).write_text("\n".join(lines) + "\n", "utf-8")


class _Vocabulary:
    """What a Tokenizer holds (given): the vocabulary, the merges and their ranks, the special tokens, the lookups
    built from them, and GPT-2's two files that store them."""

    def __init__(self, vocab: dict[int, bytes], merges: list[tuple[bytes, bytes]],
                 special_tokens: list[str] | None = None, *, pattern: str = GPT2_PATTERN) -> None:
        self.vocab, self.merges = dict(vocab), list(merges)
        unique = list(dict.fromkeys(special_tokens or []))
        self.special_tokens = sorted(unique, key=len, reverse=True)  # the longest first
        for token in unique:  # one missing from the vocabulary gets the next id, in the order given
            if token.encode("utf-8") not in self.vocab.values():
                self.vocab[max(self.vocab, default=-1) + 1] = token.encode("utf-8")
        self.ids = {token: i for i, token in sorted(self.vocab.items(), reverse=True)}  # of two ids, the lower
        self.special_ids = {token: self.ids[token.encode("utf-8")] for token in self.special_tokens}
        self.ranks = {pair: rank for rank, pair in reversed(list(enumerate(self.merges)))}  # a repeat: its first
        self.pattern = regex.compile(pattern)
        self._cache: dict[str, list[int]] = {}

    @classmethod
    def from_files(cls, vocab_filepath: str | os.PathLike, merges_filepath: str | os.PathLike,
                   special_tokens: list[str] | None = None) -> "Tokenizer":
        """A tokenizer from GPT-2's two files (see save)."""
        return cls(*_read_gpt2_files(vocab_filepath, merges_filepath), special_tokens)

    def save(self, vocab_filepath: str | os.PathLike, merges_filepath: str | os.PathLike) -> None:
        """GPT-2's format, which Hugging Face's tokenizers reads too: vocab.json maps each token, written with
        bytes_to_unicode's characters, to its id; merges.txt has a version line, then one merge per line, the two
        tokens written the same way and separated by a space, in the order learnt."""
        _write_gpt2_files(self.vocab, self.merges, vocab_filepath, merges_filepath)

    def _ids_of(self, pretoken: str) -> list[int]:
        """self._merge's ids of a pre-token, remembered: a text repeats its words (at most 65,536 at a time)."""
        if pretoken not in self._cache:
            if len(self._cache) >= 1 << 16:
                self._cache.clear()
            self._cache[pretoken] = self._merge(pretoken)
        return self._cache[pretoken]

    def __len__(self) -> int:
        return len(self.vocab)


class Tokenizer(_Vocabulary):
    """Byte-level BPE: text <-> ids with a vocabulary and merges (train_bpe's, or a real model's); __init__,
    from_files and save are _Vocabulary's (a special token missing from the vocabulary gets the next id)."""

    def _merge(self, pretoken: str) -> list[int]:
        """The ids of one pre-token: its bytes, merged by rank (the earliest-learnt pair present first, every
        occurrence) until no learnt pair is left."""
        parts = [bytes([b]) for b in pretoken.encode("utf-8")]
        while learnt := [pair for pair in zip(parts, parts[1:]) if pair in self.ranks]:
            parts = _merge_word(parts, min(learnt, key=self.ranks.__getitem__))
        return [self.ids[part] for part in parts]

    def encode(self, text: str) -> list[int]:
        """The ids of `text`: each special token one id (the longest where they overlap); the rest, pre-token by
        pre-token (GPT-2's pattern), the ids of _merge (remembered by self._ids_of)."""
        _check_text(text, "Tokenizer.encode")
        ids = []
        for piece in _split_on_special(text, self.special_tokens):
            if piece in self.special_ids:
                ids.append(self.special_ids[piece])
            else:
                ids += [i for pretoken in self.pattern.findall(piece) for i in self._ids_of(pretoken)]
        return ids

    def encode_iterable(self, iterable: Iterable[str]) -> Iterator[int]:
        """The ids of the concatenated strings (a file's lines), lazily: text is held only back to its last safe cut
        (_safe_cut), where cutting changes no pre-token, so the ids are those of encode on the whole."""
        buffer = ""
        for chunk in iterable:
            buffer += _check_text(chunk, "Tokenizer.encode_iterable")
            cut = _safe_cut(buffer, self.special_tokens)
            if cut:
                yield from self.encode(buffer[:cut])
                buffer = buffer[cut:]
        if buffer:
            yield from self.encode(buffer)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`: their bytes joined, decoded as UTF-8, bytes that are not UTF-8 as U+FFFD."""
        ids = _check_ids(ids, self.vocab)
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")

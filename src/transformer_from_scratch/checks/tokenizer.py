"""The checks of notebook 13 (the tokenizer): ``check_train_bpe`` and ``check_tokenizer``.

Each compares the learner's function or class with the course's (``transformer_from_scratch.tokenizer``) on small
crafted texts, and, when they differ, computes the classic mistakes one by one and names the first the learner's
result matches. The mistaken versions of the notebook's steps live here too, for the step checks
(``checks/steps/tokenizer.py``) to share: ``split_pieces``, ``pretoken_counts``, ``bpe_merges``, ``merge_pieces``.
"""

from __future__ import annotations

import heapq
import inspect
import re
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from .. import tokenizer as course
from ._harness import attempt, call, crashed, describe, fail, passed, refuses

EOT = "<|endoftext|>"
EOT2 = EOT + EOT  # a special token that overlaps EOT: where both match, the longer one wins
Pair = tuple[bytes, bytes]


# ----------------------------------------------------------------------------- the steps, right or with a mistake

def split_pieces(text: str, specials: list[str], mistake: str | None = None) -> list[str]:
    """split_on_special: ``text`` cut around each special token, the longest first; or with a named mistake."""
    order = sorted(specials, key=len, reverse=mistake != "shortest_first")
    if not order:
        if mistake == "empty_pattern":  # re.split("()", text): an empty pattern matches between every character
            return [piece for piece in re.split("()", text) if piece]
        return [text] if text or mistake == "empty_kept" else []
    escaped = order if mistake in ("unescaped", "unescaped_dropped") else [re.escape(s) for s in order]
    alternation = "|".join(escaped)
    pieces = re.split(alternation if mistake in ("dropped", "unescaped_dropped") else f"({alternation})", text)
    return pieces if mistake == "empty_kept" else [piece for piece in pieces if piece]


def pretoken_counts(text: str, specials: list[str], mistake: str | None = None) -> Counter:
    """count_pretokens: GPT-2's pre-tokens of the pieces between the special tokens, counted; or with a mistake."""
    find = course.regex.compile(course.GPT2_PATTERN).findall
    pieces = split_pieces(text, specials)
    plain = [piece for piece in pieces if piece not in specials]
    if mistake == "not_split":
        return Counter(find(text))
    if mistake == "removed_joined":
        return Counter(find("".join(plain)))
    if mistake == "specials_pretokenized":
        return Counter(token for piece in pieces for token in find(piece))
    if mistake == "specials_counted":
        return Counter(token for piece in pieces for token in ([piece] if piece in specials else find(piece)))
    if mistake == "str_split":
        return Counter(word for piece in plain for word in piece.split())
    if mistake == "chars":
        return Counter(char for piece in plain for char in piece)
    counts = Counter(token for piece in plain for token in find(piece))
    return Counter(dict.fromkeys(counts, 1)) if mistake == "ones" else counts


def merge_pieces(word: list[bytes], pair: Pair, mistake: str | None = None) -> list[bytes]:
    """merge_word: every occurrence of ``pair`` merged, left to right, without overlaps; or with a named mistake."""
    if mistake == "right_to_left":
        return _right_to_left(word, pair)
    merged, i, done = [], 0, False
    while i < len(word):
        here = tuple(word[i:i + 2])
        hit = here == pair or (mistake == "unordered" and here == pair[::-1]) or \
            (mistake == "first_half" and len(here) == 2 and here[0] == pair[0])
        if len(here) == 2 and not done and hit:
            merged.append(here[0] + here[1])
            i += 2
            done = mistake == "first_only"
        else:
            merged.append(word[i])
            i += 1
    return merged


def _right_to_left(word: list[bytes], pair: Pair) -> list[bytes]:
    merged, i = [], len(word) - 1
    while i >= 0:
        if i >= 1 and (word[i - 1], word[i]) == pair:
            merged.insert(0, word[i - 1] + word[i])
            i -= 2
        else:
            merged.insert(0, word[i])
            i -= 1
    return merged


def bpe_merges(word_counts: dict[str, int], num_merges: int, mistake: str | None = None) -> list[Pair]:
    """naive_merges: recount every pair (weighted by its word's count) before each merge, the most frequent first,
    ties to the greater pair, stopping when no pair is left; or with a named mistake."""
    if mistake == "chars":
        words = [[char.encode("utf-8") for char in word] for word in word_counts]
    else:
        words = [[bytes([b]) for b in word.encode("utf-8")] for word in word_counts]
    counts = [1 if mistake == "unweighted" else count for count in word_counts.values()]
    if mistake == "across":  # the words written one after another, each as often as it is counted
        words, counts = [[piece for word, n in zip(words, counts) for _ in range(n) for piece in word]], [1]
    merges: list[Pair] = []
    for _ in range(num_merges):
        pairs: Counter = Counter()
        for word, count in zip(words, counts):
            for pair in set(zip(word, word[1:])) if mistake == "once_per_word" else zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        if mistake == "first_seen":
            best = max(pairs, key=pairs.__getitem__)
        elif mistake == "smaller":
            best = min(p for p in pairs if pairs[p] == max(pairs.values()))
        else:
            best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        if mistake != "not_stored":
            words = [merge_pieces(word, best) for word in words]
    return merges


def incremental_merges(word_counts: dict[str, int], num_merges: int, mistake: str | None = None,
                       chosen: list[int] | None = None) -> list[Pair]:
    """_learn_merges: pair counts and the index pair -> pre-tokens kept up to date, a lazy heap for the top pair;
    or with one of its bookkeeping mistakes (INCREMENTAL_MISTAKES). ``chosen`` receives the count each merge was
    chosen with."""
    words = [[bytes([b]) for b in word.encode("utf-8")] for word in word_counts]
    freqs = list(word_counts.values())
    pairs: Counter = Counter()
    where: defaultdict = defaultdict(set)
    for i, word in enumerate(words):
        for pair in zip(word, word[1:]):
            pairs[pair] += freqs[i]
            where[pair].add(i)
    heap = [(-count, course._Greater(pair)) for pair, count in pairs.items()]
    heapq.heapify(heap)
    merges: list[Pair] = []
    while heap and len(merges) < num_merges:
        count, top = heapq.heappop(heap)
        pair = top.pair
        if mistake != "stale_kept" and pairs.get(pair, 0) != -count:
            continue
        merges.append(pair)
        if chosen is not None:
            chosen.append(-count)
        changed = set()
        for i in where.pop(pair, set()):
            old, new = words[i], merge_pieces(words[i], pair)
            weight = 1 if mistake == "updates_unweighted" else freqs[i]
            before, after = Counter(zip(old, old[1:])), Counter(zip(new, new[1:]))
            for p in before:
                pairs[p] -= 0 if mistake == "not_subtracted" else weight * before[p]
            for p in after:
                pairs[p] += weight * after[p]
                if mistake != "not_indexed" or p in before:
                    where[p].add(i)
            rose = mistake == "fallen_not_pushed"
            changed |= {p for p in before.keys() | after.keys() if (after[p] > before[p] if rose else
                                                                      after[p] != before[p])}
            words[i] = new
        pairs.pop(pair, None)
        for p in changed - {pair}:
            if pairs[p] > 0:
                heapq.heappush(heap, (-pairs[p], course._Greater(p)))
    return merges


def recount(word_counts: dict[str, int], merges: list[Pair]) -> Counter:
    """The pair counts, counted from scratch, on the pre-tokens after ``merges``: the truth a trainer's kept counts
    must equal."""
    pairs: Counter = Counter()
    for word, count in word_counts.items():
        tokens = [bytes([b]) for b in word.encode("utf-8")]
        for pair in merges:
            tokens = merge_pieces(tokens, pair)
        for pair in zip(tokens, tokens[1:]):
            pairs[pair] += count
    return pairs


# ------------------------------------------------------------------------------------------------- helpers

def same_as(out: Any, expected: Any, mistaken: Callable[[str], Any], mistakes: dict[str, tuple[str, str]],
            what: str, otherwise: str | None = None) -> None:
    """Fail with the first of ``mistakes`` (name -> (mistake, fix)) whose result ``mistaken(name)`` differs from
    ``expected`` and equals ``out``; when ``out`` matches none, with "<what> returned <out>" and the fix
    ``otherwise`` if given (else the caller's own verdict follows). Nothing when ``out`` is ``expected``."""
    if out == expected:
        return
    for name, (mistake, fix) in mistakes.items():
        wrong = mistaken(name)
        if wrong != expected and wrong == out:
            fail(mistake, fix, f"on {what}: yours matches that mistake ({short(out)})")
    if otherwise is not None:
        fail(f"{what} returned {short(out)}", otherwise)


def short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _kinds(values: Iterable[Any]) -> str:
    return ", ".join(sorted({type(value).__name__ for value in values})) or "nothing"


# --------------------------------------------------------------------------------------------------- train_bpe

# Crafted texts: the handout's words (whose first merges tie: ('e','s') and ('s','t') both 9), a special token in the
# middle between punctuation and letters, multi-byte characters, digits, contractions and runs of white space.
TRAIN_TEXTS = [
    ("low low low low low lower lower widest widest widest newest newest newest newest newest newest.<|endoftext|>"
     "Newer café, naïve café; 北京北京 🙂🙂 it's 2024 and 2024\n\n  spaced   out\n" + EOT + "low" + EOT + "!!"),
    "aaa bbb aaa bbb abab baba <|endoftext|> a<|endoftext|>b ab" + EOT + "ba\n",
]
SPECIALS = [EOT, "<|pad|>"]  # <|pad|> is in no text: a special token is in the vocab whether it occurs or not


def _train_reference(text: str, vocab_size: int, specials: list[str], folder: str
                     ) -> tuple[dict[int, bytes], list[Pair]]:
    path = Path(folder) / "reference.txt"
    path.write_text(text, encoding="utf-8")
    return course.train_bpe(path, vocab_size, specials, processes=1)


def _counts_of(text: str, specials: list[str], mistake: str | None) -> Counter:
    """Pre-token counts for training with one of train_bpe's mistakes in how the text is cut."""
    if mistake == "whole_pieces":  # the pieces between special tokens, never pre-tokenized
        return Counter(piece for piece in split_pieces(text, specials) if piece not in specials)
    return pretoken_counts(text, specials, mistake)


TRAIN_MISTAKES: dict[str, tuple[str, str]] = {
    "not_split": ("the special tokens are trained on: their text is pre-tokenized and counted (the text not split on "
                  "them first, or their pieces not skipped), so merges are learnt inside <|endoftext|>",
                  "split the text on the special tokens first and count the pre-tokens of the pieces between them "
                  "only: a special token enters the vocab whole, after the merges"),
    "specials_pretokenized": ("the special tokens are trained on: their text is pre-tokenized and counted (the text not "
                              "split on them first, or their pieces not skipped), so merges are learnt inside "
                              "<|endoftext|>", "split the text on the special tokens first and count the pre-tokens of "
                              "the pieces between them only: a special token enters the vocab whole, after the merges"),
    "specials_counted": ("the special tokens are counted as words, so merges are learnt inside <|endoftext|>",
                         "leave the special tokens out of the counts: they enter the vocab whole, after the merges"),
    "removed_joined": ("the special tokens are deleted and the text around them joined: merges cross where they stood",
                       "split the text at each special token and count the pieces between them apart"),
    "whole_pieces": ("merges cross pre-tokens: the text is not pre-tokenized with GPT-2's pattern, so a word merges with "
                     "the space or punctuation around it", "count the pre-tokens of each piece (GPT-2's pattern, the "
                     "package regex) and merge only inside a pre-token"),
    "str_split": ("the pre-tokens are the text split on white space (str.split), not GPT-2's pattern: the spaces are "
                  "lost", "pre-tokenize with GPT-2's pattern: the leading space belongs to the word (' low')"),
    "smaller": ("ties between equally frequent pairs go to the smaller pair",
                "break ties towards the lexicographically greater pair: of two pairs with the top count, the greater "
                "(compared as tuples of bytes) is merged"),
    "first_seen": ("ties between equally frequent pairs go to the first pair counted",
                   "break ties towards the lexicographically greater pair, whatever order the pairs were "
                   "counted in: the count decides first, the pair itself second"),
    "unweighted": ("each pre-token's pairs are counted once, not as often as the pre-token occurs",
                   "add each pre-token's count to every pair in it"),
}


def _train_variant(text: str, vocab_size: int, specials: list[str], mistake: str) -> list[Pair]:
    counting = mistake if mistake in ("not_split", "specials_pretokenized", "specials_counted", "removed_joined",
                                      "whole_pieces", "str_split") else None
    counts = _counts_of(text, specials, counting)
    return bpe_merges(counts, vocab_size - 256 - len(specials), mistake if counting is None else None)


def _one_process(impl: Callable[..., Any]) -> dict[str, int]:
    """``processes=1`` for a train_bpe that takes it (no pool of workers for a few bytes), else nothing."""
    try:
        return {"processes": 1} if "processes" in inspect.signature(impl).parameters else {}
    except (TypeError, ValueError):  # no signature to read
        return {}


def _train(impl: Callable[..., Any], path: Path, vocab_size: int, specials: list[str]) -> tuple[Any, Any, str]:
    what = f"train_bpe({path.name!r}, vocab_size={vocab_size}, special_tokens={specials!r})"
    out = call(what, impl, str(path), vocab_size, list(specials), **_one_process(impl))
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        fail(f"{what} returned {describe(out)}, not the pair (vocab, merges)", "return both: vocab, merges")
    vocab, merges = out
    if not isinstance(vocab, dict):
        fail(f"{what} returned a vocab that is {describe(vocab)}, not a dict", "vocab maps each id (int) to its "
             "token (bytes)")
    if not isinstance(merges, (list, tuple)):
        fail(f"{what} returned merges that are {describe(merges)}, not a list", "merges is a list of (bytes, bytes) "
             "pairs, in the order they were learnt")
    return vocab, list(merges), what


def _check_types(vocab: dict, merges: list, what: str) -> None:
    values = list(vocab.values())
    if any(isinstance(v, str) for v in values):
        fail(f"{what}: the vocab's tokens are str, not bytes", "keep every token as bytes: the 256 single bytes, a "
             "merge's two tokens joined, a special token's UTF-8 encoding")
    if not all(isinstance(v, bytes) for v in values):
        fail(f"{what}: the vocab's tokens are {_kinds(values)}, not bytes", "map each id to its token as bytes")
    if not all(isinstance(i, int) for i in vocab):
        fail(f"{what}: the vocab's keys are {_kinds(vocab)}, not ids (int)", "map each id (an int) to its token")
    if any(isinstance(m, bytes) for m in merges):
        fail(f"{what}: merges holds the merged tokens, not the pairs", "record each merge as the pair of tokens "
             "that was merged, not the token it made")
    if any(isinstance(m, (tuple, list)) and any(isinstance(part, str) for part in m) for m in merges) or \
            any(isinstance(m, str) for m in merges):
        fail(f"{what}: the merges are str, not bytes", "keep each merge as a pair of bytes, (b'l', b'ow'): the "
             "tokens are bytes from the start, a pre-token's UTF-8 bytes one by one")
    if not all(isinstance(m, (tuple, list)) and len(m) == 2 and all(isinstance(p, bytes) for p in m) for m in merges):
        fail(f"{what}: the merges are {_kinds(merges)}, not pairs of bytes", "merges is a list of (bytes, bytes)")


def _check_vocab(vocab: dict, specials: list[str], vocab_size: int, what: str) -> None:
    """Dense ids, in the course's order, the special tokens there, ``vocab_size`` tokens."""
    ids = sorted(vocab)
    byte_tokens = {bytes([b]) for b in range(256)}
    missing = [s for s in specials if s.encode("utf-8") not in vocab.values()]
    if missing:
        fail(f"{what}: the special token {missing[0]!r} is not in the vocab", "add every special token to the vocab "
             "(as its UTF-8 bytes), after the merges, whether or not the text holds it")
    if not byte_tokens <= set(vocab.values()):
        fail(f"{what}: some of the 256 single bytes are missing from the vocab", "start the vocab with every byte: "
             "id b holds the single byte of value b, for b in 0 … 255")
    if ids != list(range(len(ids))):
        fail(f"{what}: the vocab's ids are not 0 … {len(ids) - 1} (they run {ids[0]} … {ids[-1]}"
             f"{' with gaps' if ids[-1] - ids[0] + 1 != len(ids) else ''})", "number the tokens densely from 0: the "
             "ids index the embedding's rows")
    if len(vocab) != vocab_size:
        fail(f"{what}: the vocab has {len(vocab)} tokens, not vocab_size = {vocab_size}", "256 bytes + one token per "
             "merge (vocab_size − 256 − len(special_tokens) merges) + the special tokens")
    if [vocab[i] for i in range(256)] != [bytes([b]) for b in range(256)]:
        first = [vocab[i] for i in range(len(specials))]
        if first == [s.encode("utf-8") for s in specials]:
            fail(f"{what}: the special tokens come first in the vocab", "ids 0 … 255 are the single bytes (id = the "
                 "byte's value, as notebook 11's tokens), then one id per merge, then the special tokens")
        fail(f"{what}: ids 0 … 255 are not the single bytes in order", "id b holds the single byte of value b, for "
             "b in 0 … 255")


def _check_merges(out: list[Pair], expected: list[Pair], text: str, vocab_size: int, specials: list[str],
                  what: str) -> None:
    if out == expected:
        return
    wanted = vocab_size - 256 - len(specials)
    if len(out) > len(expected) and len(expected) < wanted:
        fail(f"{what}: {len(out)} merges where the text has pairs for only {len(expected)}: training does not stop "
             "when no pair is left", "stop when no pre-token has two tokens left: the vocab is then smaller than "
             "vocab_size (its ids stay dense)")
    if len(expected) == wanted and len(out) == wanted + len(specials):
        fail(f"{what}: {len(out)} merges for vocab_size={vocab_size}: the special tokens are not counted in "
             "vocab_size", "make vocab_size − 256 − len(special_tokens) merges: the special tokens are part of the "
             "vocab's size")
    if len(expected) == wanted and abs(len(out) - wanted) == 1:
        fail(f"{what}: {len(out)} merges for vocab_size={vocab_size} (one too {'many' if len(out) > wanted else 'few'})",
             "make exactly vocab_size − 256 − len(special_tokens) merges, so that the vocab has vocab_size tokens")
    same_as(out, expected, lambda m: _train_variant(text, vocab_size, specials, m), TRAIN_MISTAKES, what)
    _diagnose_incremental(out, expected, _counts_of(text, specials, None), vocab_size - 256 - len(specials), what)
    step = next(i for i, (a, b) in enumerate(zip(out + [None] * len(expected), expected + [None] * len(out)))
                if a != b)
    fail(f"{what}: merge {step} is {out[step] if step < len(out) else 'missing'!r}, expected "
         f"{expected[step] if step < len(expected) else 'none'!r}", "count each pair of adjacent tokens inside each "
         "pre-token, weighted by the pre-token's count; merge the most frequent (ties: the greater pair) everywhere; "
         "repeat", f"the first {step} merges agree")


_STALE = "the pair's current count"
INCREMENTAL_MISTAKES: dict[str, tuple[str, str]] = {
    "not_subtracted": ("merge {k} chose {x!r} with count {c}, but after merge {before} that pair occurs {n} times: the "
                       "pairs that a merge destroys were not subtracted", "in each pre-token a merge changes, take the "
                       "pre-token's count off every pair of its old tokens before adding it to the pairs of the new "
                       "ones"),
    "stale_kept": ("merge {k} chose {x!r} from a stale heap entry (count {c}), but after merge {before} that pair "
                   "occurs {n} times: a popped entry whose count is out of date was not skipped", "compare a popped "
                   "entry's count with " + _STALE + " and drop it when they differ: a pair whose count changed has "
                   "a newer entry"),
    "fallen_not_pushed": ("pair {y!r} (count {m} after merge {before}) was never chosen, merge {k} took {x!r} (count "
                          "{n}): a pair whose count fell was not pushed again, so its only entry is stale and skipped",
                          "push a fresh entry for every pair whose count changed, down as well as up (if it is still "
                          "above zero)"),
    "not_indexed": ("pair {y!r} (count {m} after merge {before}) was never chosen: the pairs created by a merge were "
                    "not added to the index of the pre-tokens that hold them, so merging such a pair changed no "
                    "pre-token", "when a merge's new tokens make a pair, record that this pre-token holds it, as for "
                    "the pairs counted at the start"),
    "updates_unweighted": ("merge {k} chose {x!r} with count {c}, but after merge {before} that pair occurs {n} times: "
                           "the count updates were not multiplied by how often each pre-token occurs", "a pre-token "
                           "that occurs c times changes each of its pairs' counts by c, when it is merged as at the "
                           "start"),
}


def _diagnose_incremental(out: list[Pair], expected: list[Pair], word_counts: dict[str, int], num_merges: int,
                          what: str) -> None:
    """Where the merges first differ, recount the pairs from scratch (the truth) on the pre-tokens merged so far and
    compare with what the learner's choice implies: name the bookkeeping mistake of the incremental trainer whose
    first wrong merge is the learner's, else say how the learner's choice and the truth differ."""
    step = next((i for i, (a, b) in enumerate(zip(out, expected)) if a != b), None)
    if step is None:
        return
    truth = recount(word_counts, expected[:step])
    x, y = out[step], expected[step]
    numbers = {"k": step, "before": step - 1, "x": x, "y": y, "n": truth[x], "m": truth[y]}
    evidence = (f"on {what}: merges 0 … {step - 1} agree; counted from scratch after them, {y!r} is the most "
                "frequent pair")
    for name, (mistake, fix) in INCREMENTAL_MISTAKES.items():
        chosen: list[int] = []
        wrong = incremental_merges(word_counts, num_merges, name, chosen)
        if wrong[:step + 1] == out[:step + 1]:
            fail(mistake.format(c=chosen[step], **numbers), fix, evidence)
    if x in out[:step]:
        fail(f"merge {step} repeats merge {out.index(x)}, {x!r}, which no pre-token holds any more: a heap entry "
             "that is out of date was chosen", "skip a popped entry whose count differs from " + _STALE +
             " (a merged pair has none)", evidence)
    if truth[x] < truth[y]:
        fail(f"merge {step} chose {x!r}, which occurs {truth[x]} times after merge {step - 1}, while {y!r} occurs "
             f"{truth[y]} times: the pair counts kept between merges are out of date", "after each merge the kept "
             "counts must equal a count from scratch: subtract the old pairs and add the new ones (weighted by the "
             "pre-token's count) and push every changed count; compare with your naive trainer of Step 4",
             evidence)


def _check_too_small(impl: Callable[..., Any], path: Path) -> None:
    what = f"train_bpe({path.name!r}, vocab_size=256, special_tokens=[{EOT!r}])"
    refuses(what, lambda: impl(str(path), 256, [EOT], **_one_process(impl)), ValueError,
            "256 bytes and a special token do not fit in 256 ids", "check vocab_size first: raise ValueError when it "
            "is below 256 + len(special_tokens), naming the value")


def check_train_bpe(train_bpe: Callable[..., Any]) -> None:
    """Check the learner's ``train_bpe(input_path, vocab_size, special_tokens)`` against the course's on small UTF-8
    files (``processes=1`` is passed if the signature has it): the handout's words (ties), a special token in the
    middle next to punctuation and letters, multi-byte characters, digits, runs of white space; two special tokens,
    one absent from the text; a text that runs out of pairs; a vocab_size too small.

    Mistakes it recognises: the vocab's tokens as str; merges as str or as the merged tokens; a special token missing
    from the vocab; ids not dense from 0; the special tokens first; vocab_size not counting the special tokens, or
    one merge too many or too few; not stopping when no pair is left; the special tokens trained on (the text not
    split on them, their pieces pre-tokenized, or counted as words); the special tokens deleted and the text around
    them joined; merges across pre-tokens (no pre-tokenization, or str.split); ties to the smaller pair or to the first
    counted; counts not weighted; no ValueError for a vocab_size below 256 + the special tokens. Where the merges
    first differ, the pairs are counted again from scratch on the pre-tokens merged so far, to name the incremental
    trainer's bookkeeping mistake: a merge's old pairs not subtracted; a stale heap entry not skipped; a pair whose
    count fell not pushed again; the pairs a merge creates not added to the index; updates not weighted by the
    pre-token's count (else: the merge repeats an earlier one, or the counts kept are out of date).
    """
    if not callable(train_bpe):
        fail(f"check_train_bpe got {describe(train_bpe)}, not a function", "pass the function itself: "
             "check_train_bpe(train_bpe)")
    with tempfile.TemporaryDirectory() as folder:
        cases = [(TRAIN_TEXTS[0], 256 + 30 + len(SPECIALS), SPECIALS), (TRAIN_TEXTS[1], 256 + 12 + 1, [EOT]),
                 ("ab ab", 256 + 10 + 1, [EOT])]  # the last runs out of pairs after 2 merges
        for n, (text, vocab_size, specials) in enumerate(cases):
            path = Path(folder) / f"text{n}.txt"
            path.write_text(text, encoding="utf-8")
            vocab, merges, what = _train(train_bpe, path, vocab_size, specials)
            _check_types(vocab, merges, what)
            merges = [tuple(m) for m in merges]
            ref_vocab, ref_merges = _train_reference(text, vocab_size, specials, folder)
            _check_merges(merges, ref_merges, text, vocab_size, specials, what)
            _check_vocab(vocab, specials, len(ref_vocab), what)
            if vocab != ref_vocab:
                wrong = next(i for i in sorted(ref_vocab) if vocab.get(i) != ref_vocab[i])
                fail(f"{what}: id {wrong} holds {vocab.get(wrong)!r}, expected {ref_vocab[wrong]!r}",
                     "ids 0 … 255 the single bytes, then one id per merge (its two tokens joined) in the order learnt, "
                     "then the "
                     "special tokens in the order given")
        _check_too_small(train_bpe, path)
    passed("check_train_bpe: the course's vocab and merges on texts with ties, multi-byte characters, special tokens "
           "and pre-token boundaries; dense ids in order; stops when no pair is left; ValueError when too small")


# --------------------------------------------------------------------------------------------------- Tokenizer

CORPUS = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n\nAll:\nSpeak, speak.\n\n\n"
          "First Citizen:\nYou are all resolved rather to die than to famish?\n\n\nAll:\nResolved. resolved.\n\n\n"
          "def encode(self, text: str) -> list[int]:\n    return [self.ids[t] for t in text]  # 42, 1024, 3.14\n\n\n"
          "Café, naïve, façade; 北京北京北京; emoji 🙂🙂🙂 and 👍🏽!\n\n\n") * 3 + EOT + "The end.\n"
TEXTS = [
    "", "Hello, world! It's 2024: 12345 + 0.5 = ?", "  leading and trailing  \t\n  ", "café naïve 北京 🙂👍🏽 ŋ",
    "def f(x):\n\treturn x**2  # square\n\n\n\nprint(f(3))", "You are all resolved rather to die than to famish?",
    "Before we proceed any further, hear me speak: resolved, resolved!", f"Speak{EOT}speak{EOT2}{EOT}{EOT}{EOT}. {EOT}",
    f"{EOT}{EOT}", "All:\nSpeak, speak.\n\n\nFirst Citizen:\n", f"The end.{EOT}\n\n{EOT} {EOT}Act II",
]
TOKENIZER_SPECIALS = [EOT, EOT2]  # EOT2 is not in the trained vocab: it gets the next id
LINES = ["First Citizen:\n", "\n", "\n", "\n", "All:\n", "Speak, speak.\n", "\n", "\n", "\n", "You are all resolved.\n"]


def encode_variant(text: str, reference: course.Tokenizer, mistake: str) -> list[int]:
    """The ids of ``text`` with one of encode's classic mistakes (``reference``: the course's tokenizer, for its ids,
    merges and special tokens)."""
    specials = [] if mistake == "specials_ignored" else reference.special_tokens
    find = course.regex.compile(course.GPT2_PATTERN).findall
    out = []
    for piece in split_pieces(text, specials, "shortest_first" if mistake == "shortest_first" else None):
        if piece in specials:
            out.append(reference.ids[piece.encode("utf-8")])
            continue
        if mistake == "blank_dropped" and not piece.strip():
            continue
        for pretoken in find(piece):
            parts = encode_parts(pretoken, reference.ranks, "position" if mistake == "position" else None)
            out += [reference.ids[part] for part in parts]
    return out


def encode_parts(pretoken: str, ranks: dict[Pair, int], mistake: str | None = None) -> list[bytes]:
    """encode_pretoken: the bytes of ``pretoken`` merged by rank, the lowest first, until no ranked pair is left; or
    with a named mistake."""
    if mistake == "chars":
        parts = [char.encode("utf-8") for char in pretoken]
    else:
        parts = [bytes([b]) for b in pretoken.encode("utf-8")]
    if mistake == "one_pass":
        for pair in sorted({p for p in zip(parts, parts[1:]) if p in ranks}, key=ranks.__getitem__):
            parts = merge_pieces(parts, pair)
        return parts
    while len(parts) > 1:
        present = [(ranks[p], i, p) for i, p in enumerate(zip(parts, parts[1:])) if p in ranks]
        if not present:
            break
        if mistake == "position":
            _, i, pair = min(present, key=lambda r: r[1])
            parts = parts[:i] + [pair[0] + pair[1]] + parts[i + 2:]
        else:
            _, _, pair = (max if mistake == "highest" else min)(present)
            parts = merge_pieces(parts, pair)
        if mistake == "first_merge":
            break
    return parts


class _ReadTooFar(Exception):
    """Raised by the check's endless iterable when encode_iterable reads far ahead of the ids pulled."""


def _endless_lines(read: list[int], limit: int) -> Iterator[str]:
    """Lines without end; raises _ReadTooFar once ``limit`` lines have been read."""
    n = 0
    while True:
        if n >= limit:
            raise _ReadTooFar(f"encode_iterable read {limit} lines to give the first ids")
        read[0] = n = n + 1
        yield LINES[n % len(LINES)] if n % 3 else f"Line {n}: speak, speak.\n"


def _trained(folder: str) -> tuple[dict[int, bytes], list[Pair]]:
    return _train_reference(CORPUS, 256 + 1 + 150, [EOT], folder)


def _construct(impl: type, vocab: dict[int, bytes], merges: list[Pair], specials: list[str] | None) -> Any:
    shown = "" if specials is None else f", special_tokens={specials!r}"
    return call(f"Tokenizer(vocab, merges{shown})", impl, dict(vocab), list(merges),
                *([] if specials is None else [list(specials)]))


def _encode(tokenizer: Any, text: Any) -> tuple[list[int], str]:
    what = f"Tokenizer.encode({short(text, 60)})"
    out = call(what, tokenizer.encode, text)
    if not isinstance(out, list) or not all(isinstance(i, int) for i in out):
        fail(f"{what} returned {describe(out)} of {_kinds(out) if isinstance(out, (list, tuple)) else '?'}, not a "
             "list of int", "return the ids as a list of int")
    return out, what


ENCODE_MISTAKES = {
    "position": ("the merges are applied in position order (the leftmost learnt pair first), not by rank",
                 "in each pre-token, merge the pair learnt earliest (lowest rank) first, wherever it is, as training "
                 "did; repeat until no learnt pair is left"),
    "specials_ignored": ("the special tokens are split into bytes like text", "split the text on the special tokens "
                         "first and give each its own id"),
    "shortest_first": ("where special tokens overlap, the shorter one is matched first",
                       "match the longest special token first (sort them by length, longest first)"),
    "blank_dropped": ("a piece of white space alone between two special tokens is dropped, so decode(encode(text)) "
                      "loses it ('\\n\\n' between two <|endoftext|>)", "encode every piece that is not a special "
                      "token, white space too: it is text like any other"),
}


def _check_encode(tokenizer: Any, reference: course.Tokenizer) -> None:
    for text in TEXTS:
        out, what = _encode(tokenizer, text)
        expected = reference.encode(text)
        same_as(out, expected, lambda m: encode_variant(text, reference, m), ENCODE_MISTAKES, what)
        if out != expected:
            at = next(i for i, (a, b) in enumerate(zip(out + [-1], expected + [-1])) if a != b)
            fail(f"{what} differs from the expected ids from position {at} on", "split on the special tokens (the "
                 "longest first), pre-tokenize each piece with GPT-2's pattern, merge each pre-token's bytes by rank, "
                 "look up the ids", f"yours {short(out[at:at + 8])}, expected {short(expected[at:at + 8])}")


def _check_decode(tokenizer: Any, reference: course.Tokenizer) -> None:
    for text in TEXTS:
        ids = reference.encode(text)
        what = f"Tokenizer.decode(the ids of {short(text, 60)})"
        out = call(what, tokenizer.decode, ids)
        if out != text:
            per_token = "".join(reference.vocab[i].decode("utf-8", errors="replace") for i in ids)
            if out == per_token:
                fail(f"{what}: each token is decoded on its own, so a character split between two tokens becomes "
                     "U+FFFD", "join the bytes of all the ids first, then decode UTF-8 once")
            fail(f"{what} does not give the text back", "join the bytes of the ids (vocab[i]) and decode them as "
                 "UTF-8", f"yours {short(out)}, expected {short(text)}")
    e_acute = "é".encode("utf-8")
    cases = [([e_acute[0]], "\ufffd", "one byte of é"), ([e_acute[0], e_acute[1], e_acute[1]], "é\ufffd",
                                                          "é and a stray continuation byte")]
    for ids, expected, name in cases:
        what = f"Tokenizer.decode({ids}) ({name})"
        out, error = attempt(what, tokenizer.decode, ids)
        if isinstance(error, UnicodeDecodeError):
            fail(f"{what} raises UnicodeDecodeError: bytes that are not valid UTF-8 are not replaced",
                 "decode with errors='replace', so that bad bytes become U+FFFD (�)")
        if error is not None:
            crashed(what, error)
        if out != expected:
            fail(f"{what} returned {out!r}, expected {expected!r}", "decode the joined bytes once with "
                 "errors='replace': each invalid byte becomes U+FFFD")


def _check_bad_input(tokenizer: Any, size: int) -> None:
    for bad in (42, b"bytes"):
        refuses(f"Tokenizer.encode({bad!r})", lambda: tokenizer.encode(bad), TypeError,
                f"a {type(bad).__name__} is encoded as if it were text", "check isinstance(text, str) first and raise "
                "TypeError naming the type")
    for bad in (size + 3, -1):
        refuses(f"Tokenizer.decode([{bad}]) (the vocab has ids 0 … {size - 1})", lambda: tokenizer.decode([bad]),
                ValueError, "an id outside the vocab is decoded" + (" (a negative index picks from the end of a list)"
                                                                    if bad < 0 else ""),
                "check that each id is in the vocab and raise ValueError naming it", shown=repr)


def _check_special_appended(tokenizer: Any, size: int) -> None:
    """The special token missing from the vocab is appended with the next id: decode gives it back (encode's ids of
    the texts that hold it are checked with the others)."""
    what = f"Tokenizer.decode([{size}]) with {EOT2!r} a special token missing from the vocab of {size} ids"
    back, error = attempt(what, tokenizer.decode, [size])
    if error is not None and not isinstance(error, (KeyError, ValueError, IndexError)):
        crashed(what, error)
    if back != EOT2:
        fail(f"{what} " + (f"raised {type(error).__name__}" if error is not None else f"returned {short(back)}") +
             f": a special token missing from the vocab is not appended with the next id", "append each special "
             f"token missing from the vocab with the next free id (here {size}), in the vocab that decode reads too")


def _check_iterable(tokenizer: Any, reference: course.Tokenizer) -> None:
    what = f"Tokenizer.encode_iterable(a list of {len(LINES)} lines with runs of '\\n')"
    out = call(what, tokenizer.encode_iterable, list(LINES))
    if isinstance(out, (str, bytes)) or not isinstance(out, Iterable):
        fail(f"{what} returned {describe(out)}, not an iterator of ids", "yield the ids one by one")
    got = call(what, list, out)
    expected = reference.encode("".join(LINES))
    if got != expected:
        per_line = [i for line in LINES for i in reference.encode(line)]
        if got == per_line:
            fail(f"{what}: each line is encoded on its own, so a run of line breaks across lines ('\\n\\n\\n') is not "
                 "the pre-tokens of the whole text", "hold the text back to the last line break between two "
                 "non-spaces and encode up to there: a cut there changes no pre-token")
        fail(f"{what} differs from encode of the joined text", "encode_iterable yields the ids of the "
             "concatenated strings, exactly encode's")
    read, limit = [0], 400
    what = "next(iter(Tokenizer.encode_iterable(endless lines)))"
    iterator, error = attempt(what, lambda: iter(tokenizer.encode_iterable(_endless_lines(read, limit))))
    if error is None:
        first, error = attempt(what, next, iterator)
    if isinstance(error, _ReadTooFar) or (error is None and isinstance(first, int) and read[0] >= limit):
        fail("encode_iterable is not lazy: it reads the whole iterable (a file that does not fit in memory) before "
             "giving the first id", "make it a generator: encode the text read so far up to a safe cut and yield "
             "those ids before reading on")
    if error is not None:
        crashed(what, error)
    if isinstance(tokenizer.encode_iterable(["a"]), list):
        fail("encode_iterable returns a list: it holds every id at once", "yield the ids (a generator), so that a "
             "file larger than memory can be encoded")


# GPT-2's pattern with each digit a pre-token of its own, as SmolLM2's (notebook 14): a Tokenizer built with it must
# pre-tokenize with it
DIGITS_PATTERN = course.GPT2_PATTERN.replace(r" ?\p{N}+", r"\p{N}")
DIGIT_TEXTS = ["Hello, world! It's 2024: 12345 + 0.5 = ?", "return 42, 1024 and 3.14"]


def _check_own_pattern(impl: type, vocab: dict[int, bytes], merges: list[Pair]) -> None:
    what = "Tokenizer(vocab, merges, [EOT], pattern=<GPT-2's with each digit alone>)"
    tokenizer = call(what, impl, dict(vocab), list(merges), [EOT], pattern=DIGITS_PATTERN)
    reference = course.Tokenizer(vocab, merges, [EOT], pattern=DIGITS_PATTERN)
    gpt2 = course.Tokenizer(vocab, merges, [EOT])
    for text in DIGIT_TEXTS:
        out, shown = _encode(tokenizer, text)
        expected = reference.encode(text)
        if out == expected:
            continue
        if out == gpt2.encode(text):
            fail("encode ignores the tokenizer's own pattern: it pre-tokenizes with GPT-2's, so a tokenizer built with "
                 "another (here each digit alone, as SmolLM2's) cuts numbers as GPT-2 does", "pre-tokenize with the "
                 "pattern the tokenizer was built with, which it holds", f"on {shown} of {what}")
        fail(f"{shown} differs from the expected ids with a pattern that splits every digit", "pre-tokenize with "
             "the tokenizer's own pattern, then merge each pre-token by rank", f"yours {short(out)}, expected "
             f"{short(expected)}")


def _check_split_function(impl: type) -> None:
    """The learner's _split_on_special, called by name in encode, on overlapping special tokens given shortest first:
    Tokenizer hands it the tokens sorted, train_bpe does not, so encode alone cannot show the mistake."""
    encode = getattr(impl, "encode", None)
    code, names = getattr(encode, "__code__", None), getattr(encode, "__globals__", {})
    if code is None or "_split_on_special" not in code.co_names or not callable(names.get("_split_on_special")):
        return
    text, order = f"one{EOT2}two{EOT}three", [EOT, EOT2]
    what = f"_split_on_special({text!r}, {order!r})"
    out = call(what, names["_split_on_special"], text, list(order))
    expected = split_pieces(text, order)
    if out == split_pieces(text, order, "shortest_first"):
        fail("_split_on_special tries the special tokens in the order given, so a shorter one that overlaps a longer "
             "one wins where it comes first", "order them longest first inside the function: encode's are sorted, "
             "but train_bpe passes them as the caller gave them", f"{what} returned {short(out)}")
    if out != expected:
        fail(f"{what} returned {short(out)}, expected {short(expected)}", "cut around every special token, the "
             "longest first where two overlap, and keep each as a piece of its own")


def check_tokenizer(Tokenizer: type) -> None:  # noqa: N803 - the learner's class
    """Check the learner's ``Tokenizer(vocab, merges, special_tokens=None)`` with a vocab and merges trained by the
    course's train_bpe on a small text, and the special tokens <|endoftext|> and <|endoftext|><|endoftext|> (which
    overlap; the second is not in the vocab, so it is appended with the next id).

    Checked: encode equals the course's on tricky texts (the empty string, unicode, emoji, code, runs of white space,
    numbers, special tokens side by side and overlapping); decode gives each text back and turns bad UTF-8 into
    U+FFFD; encode_iterable equals encode of the joined lines and is lazy; a TypeError for a text that is not a str;
    a ValueError for an id outside the vocab.

    Mistakes it recognises: merges applied in position order, not by rank; special tokens split into bytes; the
    shorter of two overlapping special tokens matched first; a special token missing from the vocab not appended (or
    not at the next id); decode token by token (U+FFFD in the middle of a character) or with errors='strict';
    encode_iterable encoding line by line (differs on '\\n\\n\\n') or reading everything first (returning a list);
    white space alone between two special tokens dropped; encode pre-tokenizing with GPT-2's pattern whatever the
    tokenizer's own (a Tokenizer built with pattern= that splits every digit); the _split_on_special that encode calls
    not putting the longest special token first when given the shortest first (Tokenizer sorts them, train_bpe not).
    """
    if not inspect.isclass(Tokenizer):
        name = type(Tokenizer).__name__
        fail(f"check_tokenizer got {describe(Tokenizer)}, not the class", f"pass the class itself: "
             f"check_tokenizer({name if hasattr(Tokenizer, 'encode') else 'Tokenizer'})")
    with tempfile.TemporaryDirectory() as folder:
        vocab, merges = _trained(folder)
    reference = course.Tokenizer(vocab, merges, TOKENIZER_SPECIALS)
    tokenizer = _construct(Tokenizer, vocab, merges, TOKENIZER_SPECIALS)
    _check_special_appended(tokenizer, len(vocab))
    _check_encode(tokenizer, reference)
    _check_decode(tokenizer, reference)
    _check_iterable(tokenizer, reference)
    _check_bad_input(tokenizer, len(vocab) + 1)
    _check_own_pattern(Tokenizer, vocab, merges)
    _check_split_function(Tokenizer)
    plain = _construct(Tokenizer, vocab, merges, None)
    out, what = _encode(plain, EOT)
    if out != course.Tokenizer(vocab, merges).encode(EOT):
        fail(f"{what} without special tokens does not encode <|endoftext|> as text",
             "with special_tokens=None there are none: every text is pre-tokenized and merged")
    passed("check_tokenizer: encode as the course's on unicode, emoji, code, white space and overlapping special "
           "tokens (a missing one appended); decode round trips, bad UTF-8 → U+FFFD; encode_iterable lazy and equal "
           "to encode; TypeError and ValueError on bad input")

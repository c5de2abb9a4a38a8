"""Self-checks for the exercises of notebook 13 (tokenizer): the first merges of the CS336 handout's toy corpus, a
pre-tokenizer that splits numbers into groups of at most three digits (Llama 3's), and how many bytes of the held-out
plays a context of 256 tokens holds with the 16,384-token vocabulary.

The contract is the step checks' (``transformer_from_scratch.checks.steps``): right, one line starting with ✓ that
says what was checked, never the answer; wrong, an ``AssertionError`` whose first line names the mistake and the
principle to fix it, never the code. The answers are computed here, out of the learner's view.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from typing import Any

import regex

from ..._project import repo_root
from ...tokenizer import GPT2_PATTERN, Tokenizer, _count_pretokens, _learn_merges
from .._harness import describe, fail, passed

Pair = tuple[bytes, bytes]

# ---------------------------------------------------------------------------------------------------------
# Exercise 1 · the first four merges of the handout's toy corpus
# ---------------------------------------------------------------------------------------------------------

TOY = "low low low low low lower lower widest widest widest newest newest newest newest newest newest"


def _merges_by(word_counts: dict[str, int], n: int, choose) -> list[Pair]:
    """n merges, recounting each time, the pair picked by choose(pairs: Counter)."""
    words = {w: [bytes([b]) for b in w.encode("utf-8")] for w in word_counts}
    merges = []
    for _ in range(n):
        pairs = Counter()
        for w, tokens in words.items():
            for pair in zip(tokens, tokens[1:]):
                pairs[pair] += word_counts[w]
        if not pairs:
            break
        best = choose(pairs)
        merges.append(best)
        for w, tokens in words.items():
            merged, i = [], 0
            while i < len(tokens):
                if i + 1 < len(tokens) and (tokens[i], tokens[i + 1]) == best:
                    merged.append(tokens[i] + tokens[i + 1])
                    i += 2
                else:
                    merged.append(tokens[i])
                    i += 1
            words[w] = merged
    return merges


def _is_pair_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(
        isinstance(p, tuple) and len(p) == 2 and all(isinstance(t, bytes) for t in p) for p in value)


def check_first_merges(first_merges: Any) -> None:
    """Check exercise 1: ``first_merges``, the first four merges of the CS336 handout's toy corpus with GPT-2's
    pre-tokens, as a list of pairs of bytes. The answer is trained here.

    Mistakes it recognises: not pairs of bytes (str); fewer or more than four; ties broken towards the smaller pair
    or the first pair seen; pairs counted across pre-tokens (the whole text as one word); whitespace-split words
    without GPT-2's leading space; a merge's tokens written as one token (the pair's two parts lost)."""
    counts = _count_pretokens(TOY)
    right = _learn_merges(counts, 4)
    if isinstance(first_merges, (list, tuple)) and first_merges and all(
            isinstance(p, tuple) and len(p) == 2 and all(isinstance(t, str) for t in p) for p in first_merges):
        fail("first_merges holds str, not bytes: the tokens of a byte-level BPE are bytes",
             'write each token as a bytes literal, b"s" rather than "s"')
    if not _is_pair_list(first_merges):
        fail(f"first_merges is {describe(first_merges)}, not a list of pairs of bytes",
             "write a list of four (bytes, bytes) tuples, each a merge's two tokens")
    first_merges = [tuple(p) for p in first_merges]
    if len(first_merges) != 4:
        fail(f"first_merges holds {len(first_merges)} merges, not 4", "write the first four merges, in order")
    if first_merges == right:
        passed("first_merges: the four most frequent pairs in turn over GPT-2's pre-tokens of the toy corpus, ties to "
               "the greater pair (trained out of view)")
        return
    variants = [
        (_merges_by(counts, 4, lambda pairs: min(pairs, key=lambda p: (-pairs[p], p))),
         "ties go to the smaller pair here", "among equally frequent pairs, the lexicographically greater pair wins"),
        (_merges_by(counts, 4, lambda pairs: max(pairs, key=pairs.get)),
         "ties go to the first pair seen", "among equally frequent pairs, the lexicographically greater pair wins, "
         "whatever the order of the text"),
        (_merges_by({TOY: 1}, 4, lambda pairs: max(pairs, key=lambda p: (pairs[p], p))),
         "pairs are counted across pre-tokens", "merges never cross a pre-token: count the pairs inside each "
         "pre-token (a word with its leading space), weighted by its count"),
        (_merges_by(Counter(TOY.split()), 4, lambda pairs: max(pairs, key=lambda p: (pairs[p], p))),
         "the words are split on spaces, without GPT-2's leading space",
         'GPT-2\'s pre-tokens keep the space before a word (" low"), which changes the counts'),
    ]
    for wrong, mistake, fix in variants:
        if first_merges == wrong and wrong != right:
            fail(mistake, fix)
    for i, (mine, theirs) in enumerate(zip(first_merges, right)):
        if mine != theirs:
            fail(f"merge {i + 1} of first_merges is not the most frequent pair at that point",
                 "count the pairs inside the pre-tokens again after each merge, weighted by the pre-tokens' counts; "
                 "ties to the greater pair")
    raise AssertionError("unreachable")  # pragma: no cover


# ---------------------------------------------------------------------------------------------------------
# Exercise 2 · digits in groups of one to three, no space attached
# ---------------------------------------------------------------------------------------------------------

_NUMBERS = ["in 1599, 1234567 ducats", "12", "Act 3, scene 12!", "a 1000000 b", "x12345y", "  42  ", "٣٤٥٦ and ½"]
_OTHERS = ["Don't we'll they're", "  spaces   \n\n tabs\t end  ", "naïve café, 東京 🎉", "KING HENRY:\nOnce more"]


def check_digits3_pattern(pattern: Any) -> None:
    """Check exercise 2: ``pattern``, GPT-2's pre-tokenizer with its digits in groups of one to three (from the left,
    no space attached: Llama 3's ``\\p{N}{1,3}``), and everything else as GPT-2's. It is compared with the rule on
    numbers, words and spaces (the expected pre-tokens are GPT-2's, with the numbers cut here, out of view).

    Mistakes it recognises: not a pattern that compiles; digits still in one run; one digit at a time; a space still
    attached to a number; exactly three digits (the rest lost); words, spaces or punctuation changed."""
    if not isinstance(pattern, str):
        fail(f"the pattern is {describe(pattern)}, not a str", "write the regular expression as a string")
    try:
        compiled = regex.compile(pattern)
    except regex.error as error:
        fail(f"the pattern does not compile ({error})", "start from GPT2_PATTERN and change only its digits")
    for text in _OTHERS:
        if compiled.findall(text) != regex.findall(GPT2_PATTERN, text):
            fail(f"the pattern cuts {text!r} differently from GPT-2's", "change only the alternative for digits: "
                 "words, spaces and punctuation stay as GPT-2 cuts them")
    for text in _NUMBERS:
        mine = compiled.findall(text)
        right = regex.findall(GPT2_PATTERN.replace(r" ?\p{N}+", r"\p{N}{1,3}"), text)  # Llama 3's digits
        if mine == right:
            continue
        if "".join(mine) != text:
            fail(f"the pattern loses characters of {text!r}", "a digit that does not fill a group of three must still "
                 "be a pre-token: one to three digits")
        if mine == regex.findall(GPT2_PATTERN, text):
            fail(f"the pattern keeps the digits of {text!r} in one run", "a number is cut into groups of one to three "
                 "digits")
        if any(len(t) == 1 and t.isdigit() for t in mine) and all(len(t) <= 1 for t in mine if t.isdigit()):
            fail(f"the pattern cuts {text!r} one digit at a time", "take up to three digits at a time, from the left")
        if any(t[:1] == " " and t[1:].isdigit() for t in mine):
            fail(f"a space stays attached to a number in {text!r}", "Llama 3's digits take no space: the space before "
                 "a number becomes a pre-token of its own")
        fail(f"the pattern cuts {text!r} into {mine}, not into groups of at most three digits from the left",
             "replace GPT-2's optional space and run of digits by one to three digits")
    passed("the pattern: numbers in groups of one to three digits from the left, no space attached; words, spaces "
           "and punctuation as GPT-2's")


# ---------------------------------------------------------------------------------------------------------
# Exercise 3 · how many bytes a context of 256 tokens holds at 16,384 tokens
# ---------------------------------------------------------------------------------------------------------

_CONTEXT = 256


@functools.cache
def _bytes_per_token_16k() -> float:
    """The held-out plays' bytes per token with the stored 16,384-token BPE (notebook 13's See it)."""
    data = repo_root() / "notebooks" / "data" / "shakespeare"
    merges = [tuple(bytes.fromhex(t) for t in line.split())
              for line in (data / "bpe_merges_16k.txt").read_text(encoding="ascii").splitlines()
              if not line.startswith("#")]
    tokenizer = Tokenizer({b: bytes([b]) for b in range(256)} | {256 + k: a + b for k, (a, b) in enumerate(merges)},
                          merges)
    text = (data / "heldout.txt").read_text(encoding="utf-8")
    counts = _count_pretokens(text)
    tokens = sum(count * len(tokenizer._merge(pretoken)) for pretoken, count in counts.items())
    return len(text.encode("utf-8")) / tokens


def check_context_bytes(context_bytes_16k: Any) -> None:
    """Check exercise 3: ``context_bytes_16k``, about how many bytes of the held-out plays a context of 256 tokens
    holds with the 16,384-token vocabulary (to 1 %). The answer is computed here from the stored merges.

    Mistakes it recognises: the 256 bytes of the byte-level model; 256 divided by the bytes per token; the tokens per
    byte; the vocabulary size in place of the context."""
    if not (isinstance(context_bytes_16k, (int, float)) and not isinstance(context_bytes_16k, bool)
            and math.isfinite(context_bytes_16k)):
        fail(f"context_bytes_16k is {describe(context_bytes_16k)}, not a number", "write the bytes as a Python number")
    per_token = _bytes_per_token_16k()
    right = _CONTEXT * per_token
    near = lambda a, b: math.isclose(a, b, rel_tol=0.01)  # noqa: E731
    if near(context_bytes_16k, right):
        passed("context_bytes_16k: 256 tokens times the held-out plays' bytes per token at 16,384 tokens (encoded "
               "out of view)")
        return
    mistakes = [
        (_CONTEXT, "context_bytes_16k is the byte-level model's 256 bytes: with merges, each token holds several",
         "multiply the 256 tokens by the bytes per token of the 16,384-token vocabulary"),
        (_CONTEXT / per_token, "context_bytes_16k divides by the bytes per token",
         "a context of 256 tokens holds 256 × (bytes per token) bytes"),
        (16_384 * per_token, "context_bytes_16k uses the vocabulary size, not the context of 256 tokens",
         "the context holds 256 tokens, whatever the vocabulary size"),
    ]
    for wrong, mistake, fix in mistakes:
        if near(context_bytes_16k, wrong):
            fail(mistake, fix)
    side = "more" if context_bytes_16k > right else "fewer"
    fail(f"context_bytes_16k is {side} bytes than a context of 256 tokens holds at 16,384 tokens",
         "multiply the 256 tokens by the bytes per token that See it measured at 16,384")

"""Self-checks for the steps of notebook 13 (the tokenizer): cutting a text around its special tokens, counting its
pre-tokens, merging one pair in a word, the naive trainer that recounts every pair before each merge, and encoding
one pre-token by the merges' ranks."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Callable

from .._harness import attempt, call, crashed, describe, fail, passed
from ..tokenizer import (EOT, EOT2, Pair, bpe_merges, encode_parts, merge_pieces, pretoken_counts, same_as, short,
                         split_pieces)

# ---------------------------------------------------------------------------------------------------------
# Step 1 · cutting the text around the special tokens
# ---------------------------------------------------------------------------------------------------------

_ESCAPE = ("escape each special token (re.escape / regex.escape) before joining them with '|': '|' is regex "
           "alternation, so '<|endoftext|>' unescaped means '<' or 'endoftext' or '>'")
SPLIT_MISTAKES = {
    "unescaped": ("the special tokens are not escaped: '|' is read as regex alternation, so the text is cut at every "
                  "'<', 'endoftext' and '>'", _ESCAPE),
    "unescaped_dropped": ("the special tokens are not escaped ('|' read as regex alternation) and are dropped: the text "
                          "is cut at every '<', 'endoftext' and '>'", _ESCAPE + ", inside a capturing group (…)"),
    "dropped": ("the special tokens are dropped: they must stay in the list, each as its own piece (training leaves "
                "them out later, encoding gives each its id)", "keep what the split matches: a split whose pattern is "
                "one capturing group puts each match in the list, between the pieces"),
    "shortest_first": ("where special tokens overlap, a shorter one is matched first (the tokens are tried shortest "
                       "first, or in the order of the list)", "sort the special tokens longest first before joining "
                       "them: the alternation takes the first that matches"),
    "empty_kept": ("empty pieces are kept (between two special tokens side by side, at the ends, or for an empty "
                   "text)", "leave out the empty strings: every piece holds text"),
    "empty_pattern": ("with no special tokens the pattern is empty, and an empty pattern matches between every "
                      "character: the text is cut into characters", "with no special tokens return [text] (or [] for "
                      "an empty text) without splitting"),
}
SPLIT_CASES = [
    (f"Hello, world!{EOT}if a < b or c > d: x |= 1{EOT}", [EOT]),
    (f"{EOT}one{EOT2}two{EOT}{EOT}{EOT}", [EOT, EOT2]),
    (f"{EOT}one{EOT2}two{EOT}{EOT}{EOT}", [EOT2, EOT]),
    ("no special tokens here", []),
    ("", []),
    ("text without them", [EOT]),
    ("", [EOT]),
]


def _expect_list(what: str, out: Any, kind: type, fix: str) -> list:
    if not isinstance(out, (list, tuple)):
        fail(f"{what} returned {describe(out)}, not a list", fix)
    wrong = [piece for piece in out if not isinstance(piece, kind)]
    if wrong:
        fail(f"{what} returned a list holding {describe(wrong[0])}, not only {kind.__name__}", fix)
    return list(out)


def check_split_on_special(split_on_special: Callable[[str, list[str]], list[str]]) -> None:
    """Check ``split_on_special(text, special_tokens)``: the pieces of ``text`` in order, each special token its own
    piece, the longest first where two overlap, no empty pieces; joining them gives the text back. No special tokens:
    [text] ([] for "").

    Mistakes it recognises: the special tokens not escaped ('|' read as alternation), also with the tokens dropped;
    the special tokens dropped; a shorter overlapping token matched first (shortest first, or the list's order);
    empty pieces kept; with no special tokens, the text cut into characters (an empty pattern).
    """
    for text, specials in SPLIT_CASES:
        what = f"split_on_special({text!r}, {specials!r})"
        out = _expect_list(what, call(what, split_on_special, text, list(specials)), str,
                           "return a list of str: the pieces of the text in order")
        expected = split_pieces(text, specials)
        same_as(out, expected, lambda m: split_pieces(text, specials, m), SPLIT_MISTAKES, what)
        if out == expected:
            continue
        if "".join(out) != text:
            fail(f"{what}: the pieces do not join back to the text", "cut the text without losing or adding "
                 "anything: ''.join(pieces) == text", f"yours: {short(out)}")
        if "" in out:
            fail(f"{what} returns empty pieces", "leave out the empty strings", f"yours: {short(out)}")
        fail(f"{what} cuts the text elsewhere than around the special tokens", "cut before and after each special "
             "token (the longest first), and nowhere else", f"yours: {short(out)}")
    passed("split_on_special: special tokens kept as their own pieces, escaped, the longest first where they "
           "overlap; no empty pieces; no special tokens, one piece")


# ---------------------------------------------------------------------------------------------------------
# Step 2 · counting the pre-tokens
# ---------------------------------------------------------------------------------------------------------

PRETOKEN_MISTAKES = {
    "specials_counted": ("the special tokens are counted as pre-tokens", "leave them out: they are not text to learn "
                         "merges from (count only the pieces that are not special tokens)"),
    "specials_pretokenized": ("the special tokens are pre-tokenized and counted like the text ('<|', 'endoftext', "
                              "'|>')", "skip the pieces that are special tokens: count only the pieces between them"),
    "not_split": ("the text is not split on the special tokens first: pre-tokens cross them ('.<|' fuses the "
                  "punctuation before <|endoftext|> with its start)", "split the text on the special tokens first "
                  "(Step 1), then pre-tokenize each piece between them on its own"),
    "removed_joined": ("the special tokens are deleted and the text around them joined: a pre-token crosses where one "
                       "stood ('hat' and 'the' become 'hatthe')", "pre-tokenize each piece between the special tokens "
                       "on its own, never their concatenation"),
    "str_split": ("the words are split on white space (str.split), not with GPT-2's pattern: the spaces are lost",
                  "find the pre-tokens with GPT-2's pattern (regex.finditer): the leading space belongs to the word "
                  "(' the')"),
    "chars": ("single characters are counted, not pre-tokens", "count GPT-2's pre-tokens: the matches of its "
              "pattern in each piece"),
    "ones": ("every pre-token is counted once (a set), not as often as it occurs", "count each occurrence: "
             "a pre-token found n times has the count n"),
}
PRETOKEN_CASES = [
    (f"Hello, world! The cat's hat{EOT}the cats  sat on 2024 mats.{EOT}\n\nHello again, world!", [EOT]),
    (f"It's 3 o'clock{EOT}", []),  # no special tokens: <|endoftext|> is text like any other
    ("", [EOT]),
]


def check_count_pretokens(count_pretokens: Callable[[str, list[str]], dict[str, int]]) -> None:
    """Check ``count_pretokens(text, special_tokens)``: GPT-2's pre-tokens (the package ``regex``) of the pieces of
    ``text`` between its special tokens, counted (a dict or Counter of str).

    Mistakes it recognises: the special tokens counted, whole or pre-tokenized; the text not split on the special
    tokens first (a pre-token crossing one); the special tokens deleted and the text joined; str.split instead of the
    pattern; characters counted; counts of 1 (a set); Python's ``re`` instead of ``regex`` (\\p{L} not understood).
    """
    for text, specials in PRETOKEN_CASES:
        what = f"count_pretokens({short(text, 70)}, {specials!r})"
        out, error = attempt(what, count_pretokens, text, list(specials))
        if isinstance(error, re.error) and "\\p" in str(error):
            fail(f"{what} uses Python's re, which does not know \\p{{L}} (a letter) or \\p{{N}} (a digit)",
                 "import regex (the package) and use regex.finditer with GPT-2's pattern")
        if error is not None:
            crashed(what, error)
        if not isinstance(out, dict):
            fail(f"{what} returned {describe(out)}, not a dict", "count the pre-tokens: a dict (or Counter) from each "
                 "pre-token to how often it occurs")
        out = Counter({key: value for key, value in out.items() if value})
        expected = pretoken_counts(text, specials)
        same_as(out, expected, lambda m: pretoken_counts(text, specials, m), PRETOKEN_MISTAKES, what)
        if out != expected:
            key = next(k for k in sorted(set(out) | set(expected), key=repr) if out.get(k, 0) != expected.get(k, 0))
            fail(f"{what} counts {key!r} {out.get(key, 0)} times, expected {expected.get(key, 0)}", "split on the "
                 "special tokens, skip them, find GPT-2's pre-tokens of each other piece and count them")
    passed("count_pretokens: GPT-2's pre-tokens between the special tokens (left out), counted; none cross a special "
           "token")


# ---------------------------------------------------------------------------------------------------------
# Step 3 · merging one pair in a word
# ---------------------------------------------------------------------------------------------------------

def _b(*tokens: str) -> list[bytes]:
    return [token.encode("latin-1") for token in tokens]


E_ACUTE = "é".encode("utf-8")
MERGE_CASES = [
    (_b("a", "a", "a"), (b"a", b"a")), (_b("a", "a", "a", "a"), (b"a", b"a")),
    (_b("l", "o", "w", " ", "l", "o"), (b"l", b"o")), (_b("b", "a", "b", "a"), (b"a", b"b")),
    (_b("b", "a"), (b"a", b"b")), ([E_ACUTE[:1], E_ACUTE[1:], b"t", E_ACUTE[:1], E_ACUTE[1:]], (E_ACUTE[:1], E_ACUTE[1:])),
    (_b("x", "y"), (b"y", b"z")), ([], (b"a", b"b")), (_b("a"), (b"a", b"a")), (_b("a", "c", "a", "b"), (b"a", b"b")),
]
MERGE_MISTAKES = {
    "right_to_left": ("the occurrences are merged from the right: [a, a, a] with (a, a) gives [a, aa]",
                      "scan from the left: [a, a, a] with (a, a) is [aa, a]"),
    "first_only": ("only the first occurrence of the pair is merged", "merge every occurrence: keep scanning after a "
                   "merge"),
    "first_half": ("only the pair's first token is compared: an occurrence of pair[0] is merged with whatever "
                   "follows it", "merge two neighbours only where both match, the first with the pair's first token "
                   "and the second with its second"),
    "unordered": ("the pair's order is ignored: (b, a) is merged as if it were (a, b)", "a pair is ordered: merge two "
                  "neighbours only where the first is the pair's first token and the second its second"),
}


def check_merge_word(merge_word: Callable[[list[bytes], Pair], list[bytes]]) -> None:
    """Check ``merge_word(word, pair)``: the list of bytes ``word`` with every occurrence of ``pair`` replaced by the
    one token pair[0] + pair[1], left to right and without overlaps ([a, a, a] with (a, a) is [aa, a]); the caller's
    list unchanged.

    Mistakes it recognises: overlapping merges (a token used twice: [aa, aa]); merging from the right ([a, aa]); only
    the first occurrence; the pair's order ignored; only the pair's first token compared; str instead of bytes; the
    merged token kept as the pair (a tuple); the caller's list changed in place.
    """
    for word, pair in MERGE_CASES:
        what = f"merge_word({word!r}, {pair!r})"
        given = list(word)
        out = call(what, merge_word, given, pair)
        if given != word:
            fail(f"{what} changes the caller's list in place (it is now {short(given)})", "build and return a new "
                 "list: the trainer merges each word again from its current tokens, and the caller still needs them")
        if isinstance(out, (list, tuple)) and any(isinstance(piece, str) for piece in out) or isinstance(out, str):
            fail(f"{what} returned str, not bytes ({short(out)})", "keep every token as bytes: the merged token is "
                 "the two tokens' bytes joined")
        if isinstance(out, (list, tuple)) and any(isinstance(piece, (tuple, list)) for piece in out):
            fail(f"{what} puts the pair itself in the word, not the merged token ({short(out)})", "replace the two "
                 "tokens by one token, their bytes joined")
        out = _expect_list(what, out, bytes, "return a list of bytes: the word's tokens after the merge")
        expected = merge_pieces(word, pair)
        if out != expected and b"".join(out) != b"".join(word) and out.count(pair[0] + pair[1]) > \
                expected.count(pair[0] + pair[1]):
            fail(f"{what}: the merges overlap: a token is used in two merges ([a, a, a] with (a, a) gives [aa, aa])",
                 "a token merged once is used up: the scan goes on after the pair, so [a, a, a] with (a, a) is "
                 "[aa, a]", f"yours: {short(out)}")
        same_as(out, expected, lambda m: merge_pieces(word, pair, m), MERGE_MISTAKES, what, "scan left to right: "
                "where two neighbours form the pair they become one token and the scan moves past both; every other "
                "token stays as it is")
    passed("merge_word: every occurrence merged, left to right without overlaps, in the pair's order, as bytes; the "
           "word given left unchanged")


# ---------------------------------------------------------------------------------------------------------
# Step 4 · the naive trainer
# ---------------------------------------------------------------------------------------------------------

HANDOUT = {"low": 5, "lower": 2, "widest": 3, "newest": 6}
NAIVE_CASES = [(HANDOUT, 6), ({"abab": 2, "xy": 3}, 2),  # abab: a pair twice in a word
               ({"bc": 1, "ab": 1, "cd": 1}, 3), ({"ab": 5, "cd": 1, "ecd": 1}, 2),
               ({"ab": 2, "ba": 2}, 3), ({"é": 3, "née": 2}, 3), ({"ab": 2, "c": 5}, 4), ({"xyz": 3}, 0)]
NAIVE_MISTAKES = {
    "smaller": ("ties between equally frequent pairs go to the smaller pair",
                "break ties towards the lexicographically greater pair: of two pairs with the top count, the greater "
                "(compared as tuples of bytes) is merged"),
    "first_seen": ("ties between equally frequent pairs go to the first pair counted",
                   "break ties towards the lexicographically greater pair, whatever order the pairs were "
                   "counted in: the count decides first, the pair itself second"),
    "unweighted": ("each word's pairs are counted once, not as often as the word occurs",
                   "add the word's count to every pair in it"),
    "chars": ("the words are split into characters, not bytes: a non-ASCII character such as é is two bytes",
              "start each word as its UTF-8 bytes, one token per byte, not per character"),
    "once_per_word": ("a pair that occurs twice in a word is counted once for that word", "count every occurrence "
                      "of a pair in a word, each weighted by the word's count"),
    "not_stored": ("the words are not updated after a merge, so the same pair is chosen again", "keep each word as its "
                   "merged tokens: the next round counts the pairs of the merged words"),
    "across": ("pairs are counted across words (the words written one after the other)",
               "count the pairs inside each word only: a merge never crosses a word's end"),
}


def _occurs(word_counts: dict[str, int], merges: list[Pair]) -> int | None:
    """The first merge whose pair is in no word at that point (counted across words), or None."""
    words = [[bytes([b]) for b in word.encode("utf-8")] for word in word_counts]
    for i, pair in enumerate(merges):
        if not any(pair in zip(word, word[1:]) for word in words):
            return i
        words = [merge_pieces(word, pair) for word in words]
    return None


def check_naive_merges(naive_merges: Callable[[dict[str, int], int], list[Pair]]) -> None:
    """Check ``naive_merges(word_counts, num_merges)``: up to ``num_merges`` merges, each the most frequent pair of
    adjacent tokens over all the words (weighted by each word's count) counted afresh, ties to the lexicographically
    greater pair, as (bytes, bytes); fewer when no pair is left. The handout's example among the cases.

    Mistakes it recognises: ties to the smaller pair or to the first counted; counts not weighted; a pair counted once
    per word; the words not updated after a merge; characters instead of bytes; pairs counted across words; pairs as
    str or as the merged token; not stopping when no pair is left (an error or extra merges); one merge too many or
    too few.
    """
    for word_counts, num_merges in NAIVE_CASES:
        what = f"naive_merges({word_counts!r}, num_merges={num_merges})"
        expected = bpe_merges(word_counts, num_merges)
        out, error = attempt(what, naive_merges, dict(word_counts), num_merges)
        if error is not None and len(expected) < num_merges and isinstance(error, (ValueError, IndexError, KeyError)):
            fail(f"{what} raises {type(error).__name__} ({str(error).strip()}) once no pair is left to merge",
                 "stop early when no word has two tokens left: return the merges made so far")
        if error is not None:
            crashed(what, error)
        if not isinstance(out, (list, tuple)):
            fail(f"{what} returned {describe(out)}, not a list of pairs", "return the merges in order: a list of "
                 "(bytes, bytes)")
        if any(isinstance(m, bytes) for m in out):
            fail(f"{what} returns the merged tokens, not the pairs ({short(out)})", "record each merge as the pair "
                 "(a, b) that was merged: encoding needs both halves")
        if any(isinstance(m, str) or isinstance(m, (tuple, list)) and any(isinstance(p, str) for p in m) for m in out):
            fail(f"{what} returns str, not bytes ({short(out)})", "keep the tokens as bytes from the start: "
                 "a word's UTF-8 bytes, one token each, joined when merged")
        if not all(isinstance(m, (tuple, list)) and len(m) == 2 and all(isinstance(p, bytes) for p in m) for m in out):
            fail(f"{what} returned {short(out)}, not a list of (bytes, bytes) pairs", "append each merge as the "
                 "tuple (a, b)")
        out = [tuple(m) for m in out]
        if len(out) > len(expected) and len(expected) < num_merges:
            fail(f"{what} makes {len(out)} merges where the words hold pairs for only {len(expected)}: it does not "
                 "stop when no pair is left", "stop early when no word has two tokens left")
        same_as(out, expected, lambda m: bpe_merges(word_counts, num_merges, m), NAIVE_MISTAKES, what)
        if len(out) != len(expected):
            fail(f"{what} made {len(out)} merges, not {num_merges}" + (": one too many" if len(out) == num_merges + 1
                                                                        else ": one too few" if len(out) == num_merges - 1
                                                                        else ""), "make exactly num_merges merges "
                 "(fewer only when no pair is left)")
        crossing = _occurs(word_counts, out)
        if crossing is not None:
            fail(*NAIVE_MISTAKES["across"], f"on {what}: merge {crossing}, {out[crossing]!r}, is in no word")
        if out != expected:
            step = next(i for i, (a, b) in enumerate(zip(out, expected)) if a != b)
            fail(f"{what}: merge {step} is {out[step]!r}, expected {expected[step]!r}", "before each merge count "
                 "every adjacent pair in every word (weighted by the word's count), merge the most frequent "
                 "(ties: the greater pair) in every word, repeat", f"the first {step} merges agree")
    passed("naive_merges: the most frequent pair each time (weighted, ties to the greater pair), as (bytes, bytes); "
           "stops when no pair is left (the handout's example among the cases)")


# ---------------------------------------------------------------------------------------------------------
# Step 5 · encoding one pre-token by rank
# ---------------------------------------------------------------------------------------------------------

def _ranks(*merges: tuple[bytes, bytes]) -> dict[Pair, int]:
    return {pair: rank for rank, pair in enumerate(merges)}


ENCODE_CASES = [
    ("abcd", _ranks((b"b", b"c"), (b"a", b"b"), (b"c", b"d"), (b"ab", b"c"))),
    ("abcd", _ranks((b"a", b"b"), (b"c", b"d"), (b"ab", b"cd"))),
    ("é", {}), ("été", _ranks((E_ACUTE[1:], b"t"), (E_ACUTE[:1], E_ACUTE[1:]))), ("x", _ranks((b"x", b"x"))),
    (" the theme", _ranks((b"t", b"h"), (b"th", b"e"), (b" ", b"the"), (b"e", b"m"), (b"the", b"me"))),
]
ENCODE_PRETOKEN_MISTAKES = {
    "position": ("the merges are applied in position order (the leftmost known pair first), not by rank",
                 "merge the pair with the lowest rank first, wherever it is, as training did"),
    "highest": ("the pair with the highest rank is merged first", "the lowest rank was learnt first: merge the present "
                "pair of lowest rank first"),
    "first_merge": ("only the first merge is made", "repeat: after each merge look again for the lowest-ranked pair, "
                    "until none is left"),
    "one_pass": ("only the pairs present at the start are merged: the pairs that the merges make are never looked up",
                 "after each merge look again for the lowest-ranked pair among the new pairs, until none is left"),
    "chars": ("the pre-token is split into characters, not bytes: é is two bytes", "start from the pre-token's "
              "UTF-8 bytes, one token per byte"),
}


def check_encode_pretoken(encode_pretoken: Callable[[str, dict[Pair, int]], list[bytes]]) -> None:
    """Check ``encode_pretoken(pretoken, ranks)``: the bytes of ``pretoken`` merged by rank (the lowest-ranked pair
    present first, all its occurrences, repeated until no ranked pair is left), as a list of bytes.

    Mistakes it recognises: merges in position order (leftmost first) instead of by rank; the highest rank first;
    stopping after the first merge; one pass over the pairs present at the start; characters instead of bytes; str
    tokens.
    """
    for pretoken, ranks in ENCODE_CASES:
        what = f"encode_pretoken({pretoken!r}, ranks={short(ranks, 120)})"
        out = call(what, encode_pretoken, pretoken, dict(ranks))
        if isinstance(out, (list, tuple)) and any(isinstance(piece, str) for piece in out):
            fail(f"{what} returned str pieces, not bytes ({short(out)})", "work on the pre-token's UTF-8 "
                 "bytes, one token each, joined when merged")
        out = _expect_list(what, out, bytes, "return the pre-token's pieces after merging: a list of bytes")
        expected = encode_parts(pretoken, ranks)
        same_as(out, expected, lambda m: encode_parts(pretoken, ranks, m), ENCODE_PRETOKEN_MISTAKES, what,
                "start from the bytes; repeatedly merge (every occurrence of) the ranked pair with the lowest rank, "
                "until no adjacent pair is ranked")
    passed("encode_pretoken: bytes merged by rank (lowest first, repeated until no ranked pair is left), non-ASCII "
           "as bytes")

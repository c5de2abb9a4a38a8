"""The step checks of notebook 13 pass the right steps and name each planted mistake on their first line."""

import re
from collections import Counter

import regex

from transformer_from_scratch.checks.steps.tokenizer import (check_count_pretokens, check_encode_pretoken,
                                                             check_merge_word, check_naive_merges,
                                                             check_split_on_special)
from mutants import assert_own_verdict, assert_phrases_distinct, assert_random_state_kept, each_mistake_of

PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


# --- the right steps, as the notebook writes them ------------------------------------------------------------

def split_on_special(text, special_tokens, *, escape=True, keep=True, longest=True, drop_empty=True, guard=True):
    if guard and not special_tokens:
        return [text] if text else []
    tokens = sorted(special_tokens, key=len, reverse=True) if longest else list(special_tokens)
    pattern = "|".join(regex.escape(t) if escape else t for t in tokens)
    pieces = re.split(f"({pattern})" if keep else pattern, text)
    return [p for p in pieces if p] if drop_empty else pieces


def count_pretokens(text, special_tokens, *, split=True, skip=True, find=None, joined=False, ones=False):
    find = find or (lambda piece: regex.findall(PAT, piece))
    pieces = split_on_special(text, special_tokens) if split else [text]
    plain = [p for p in pieces if not skip or p not in special_tokens]
    counts = Counter(t for piece in (["".join(plain)] if joined else plain) for t in find(piece))
    return dict.fromkeys(counts, 1) if ones else dict(counts)


def merge_word(word, pair, *, step=2, first_only=False, ordered=True, as_str=False, as_pair=False, in_place=False,
               first_half=False):
    out, i, merged = [], 0, False
    while i < len(word):
        here = tuple(word[i:i + 2])
        matches = here == pair or not ordered and here == pair[::-1] or first_half and here[:1] == pair[:1]
        if len(here) == 2 and not (first_only and merged) and matches:
            out.append(here if as_pair else (here[0] + here[1]).decode("latin-1") if as_str else here[0] + here[1])
            i += step
            merged = True
        else:
            out.append(word[i])
            i += 1
    if step == 1 and merged:  # the overlapping variant: the token after the last merge is used twice
        out = [t for t in out if len(t) > 1] or out
    if in_place:
        word[:] = out
        return word
    return out


def naive_merges(word_counts, num_merges, *, tie="greater", weighted=True, across=False, chars=False, result="pair",
                 stop=True, extra=0, once=False, store=True):
    words = [[c.encode() for c in w] if chars else [bytes([b]) for b in w.encode("utf-8")] for w in word_counts]
    counts = [c if weighted else 1 for c in word_counts.values()]
    if across:
        words, counts = [[t for w in words for t in w]], [1]
    merges = []
    for _ in range(num_merges + extra):
        pairs = Counter()
        for w, c in zip(words, counts):
            for p in set(zip(w, w[1:])) if once else zip(w, w[1:]):
                pairs[p] += c
        if not pairs and stop:
            break
        top = max(pairs.values()) if pairs or not stop else None  # max() of nothing: ValueError, when not stopping
        tied = [p for p in pairs if pairs[p] == top]
        best = {"greater": max, "smaller": min, "first": lambda t: t[0]}[tie](tied)
        merges.append(best)
        if store:
            words = [merge_word(w, best) for w in words]
    shown = {"pair": lambda p: p, "str": lambda p: (p[0].decode("latin-1"), p[1].decode("latin-1")),
             "token": lambda p: p[0] + p[1]}[result]
    return [shown(p) for p in merges]


def encode_pretoken(pretoken, ranks, *, order="rank", repeat=True, chars=False, once=False):
    parts = [c.encode() for c in pretoken] if chars else [bytes([b]) for b in pretoken.encode("utf-8")]
    if once:  # the pairs present at the start, merged in rank order, never looked up again
        for pair in sorted({p for p in zip(parts, parts[1:]) if p in ranks}, key=ranks.get):
            parts = merge_word(parts, pair)
        return parts
    while True:
        present = [(ranks[p], i, p) for i, p in enumerate(zip(parts, parts[1:])) if p in ranks]
        if not present:
            return parts
        pick = {"rank": min, "highest": max, "position": lambda r: min(r, key=lambda x: x[1])}[order](present)
        parts = merge_word(parts, pick[2]) if order != "position" else \
            parts[:pick[1]] + [pick[2][0] + pick[2][1]] + parts[pick[1] + 2:]
        if not repeat:
            return parts


def variant(fn, **knobs):
    return lambda *args: fn(*args, **knobs)


# --- the mistakes ------------------------------------------------------------------------------------------------

def _split_into_characters(text, special_tokens):
    return split_on_special(text, special_tokens, guard=False)  # re.split("()", text)


SPLIT_MUTANTS = [
    (variant(split_on_special, escape=False), "not escaped: '|' is read"),
    (variant(split_on_special, escape=False, keep=False), "are not escaped ('|' read as regex alternation) and are dropped"),
    (variant(split_on_special, keep=False), "special tokens are dropped"),
    (variant(split_on_special, longest=False), "a shorter one is matched first"),
    (variant(split_on_special, drop_empty=False), "empty pieces are kept"),
    (_split_into_characters, "cut into characters"),
    (lambda text, special_tokens: split_on_special(text, special_tokens) or [text], "empty pieces are kept"),  # [""]
]


def _with_re(text, special_tokens):
    return count_pretokens(text, special_tokens, find=lambda piece: re.findall(PAT, piece))


def _specials_whole(text, special_tokens):
    counts = Counter(count_pretokens(text, special_tokens))
    counts.update(p for p in split_on_special(text, special_tokens) if p in special_tokens)
    return dict(counts)


PRETOKEN_MUTANTS = [
    (_specials_whole, "counted as pre-tokens"),
    (variant(count_pretokens, skip=False), "pre-tokenized and counted like the text"),
    (variant(count_pretokens, split=False), "not split on the special tokens first"),
    (variant(count_pretokens, joined=True), "deleted and the text around them joined"),
    (variant(count_pretokens, find=str.split), "split on white space (str.split)"),
    (variant(count_pretokens, find=list), "single characters are counted"),
    (variant(count_pretokens, ones=True), "counted once (a set)"),
    (_with_re, "uses Python's re"),
    (lambda text, special_tokens: list(count_pretokens(text, special_tokens)), "not a dict"),
]


def _merged_from_the_right(word, pair):
    """The mirror image of merge_word: each token and the word reversed, merged from the left, reversed back."""
    mirrored = merge_word([t[::-1] for t in word[::-1]], (pair[1][::-1], pair[0][::-1]))
    return [t[::-1] for t in mirrored[::-1]]


MERGE_MUTANTS = [
    (variant(merge_word, step=1), "the merges overlap"),
    (_merged_from_the_right, "merged from the right"),
    (variant(merge_word, first_only=True), "only the first occurrence"),
    (variant(merge_word, ordered=False), "order is ignored"),
    (variant(merge_word, first_half=True), "only the pair's first token is compared"),
    (variant(merge_word, as_str=True), "returned str, not bytes"),
    (variant(merge_word, as_pair=True), "the pair itself"),
    (variant(merge_word, in_place=True), "changes the caller's list in place"),
]
NAIVE_MUTANTS = [
    (variant(naive_merges, tie="smaller"), "go to the smaller pair"),
    (variant(naive_merges, tie="first"), "go to the first pair counted"),
    (variant(naive_merges, weighted=False), "counted once, not as often as the word occurs"),
    (variant(naive_merges, chars=True), "split into characters, not bytes"),
    (variant(naive_merges, across=True), "counted across words"),
    (variant(naive_merges, once=True), "counted once for that word"),
    (variant(naive_merges, store=False), "the words are not updated after a merge"),
    (variant(naive_merges, result="str"), "returns str, not bytes"),
    (variant(naive_merges, result="token"), "the merged tokens, not the pairs"),
    (variant(naive_merges, stop=False), "once no pair is left"),
    (variant(naive_merges, extra=1), "one too many"),
    (lambda word_counts, num_merges: naive_merges(word_counts, max(num_merges - 1, 0)), "one too few"),
]


def _repeats(word_counts, num_merges):
    """Not stopping without an error: once no pair is left, the last merge again."""
    merges = naive_merges(word_counts, num_merges)
    return merges + merges[-1:] * (num_merges - len(merges))


NAIVE_MUTANTS.append((_repeats, "does not stop when no pair is left"))

ENCODE_MUTANTS = [
    (variant(encode_pretoken, order="position"), "position order"),
    (variant(encode_pretoken, order="highest"), "highest rank is merged first"),
    (variant(encode_pretoken, repeat=False), "only the first merge is made"),
    (variant(encode_pretoken, once=True), "only the pairs present at the start"),
    (variant(encode_pretoken, chars=True), "split into characters, not bytes"),
    (lambda pretoken, ranks: [p.decode("latin-1") for p in encode_pretoken(pretoken, ranks)], "str pieces"),
]

RIGHT = [(check_split_on_special, split_on_special), (check_count_pretokens, count_pretokens),
         (check_merge_word, merge_word), (check_naive_merges, naive_merges), (check_encode_pretoken, encode_pretoken)]
ALL = [(check_split_on_special, SPLIT_MUTANTS), (check_count_pretokens, PRETOKEN_MUTANTS),
       (check_merge_word, MERGE_MUTANTS), (check_naive_merges, NAIVE_MUTANTS), (check_encode_pretoken, ENCODE_MUTANTS)]


def test_the_right_steps_pass_with_one_line(capsys):
    for check, step in RIGHT:
        check(step)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * len(RIGHT), lines
    assert not any("b'" in line or "[" in line for line in lines), lines  # what was checked, never the answer


@each_mistake_of(ALL)
def test_each_mistake_is_named(check, mutant, phrase):
    """Two ways to make one mistake (an empty piece kept) share its phrase; every other phrase is the mutant's own."""
    mutants = next(m for c, m in ALL if c is check)
    assert_own_verdict(check, mutant, phrase, [(m, p) for m, p in mutants if p != phrase])


def test_the_phrases_are_distinct():
    for _, mutants in ALL:
        assert_phrases_distinct(list({phrase: (mutant, phrase) for mutant, phrase in mutants}.values()))


def test_the_checks_keep_the_random_state():
    for check, step in RIGHT:
        assert_random_state_kept(check, step)


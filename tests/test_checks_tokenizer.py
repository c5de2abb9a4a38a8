"""check_train_bpe and check_tokenizer pass the right implementations (the course's, and a learner's naive trainer
built from notebook 13's steps) and name each classic mistake, planted here as a small change of either."""

import heapq
import types
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import regex

from transformer_from_scratch import tokenizer as course
from transformer_from_scratch.checks import check_tokenizer, check_train_bpe
from transformer_from_scratch.tokenizer import GPT2_PATTERN, Tokenizer, train_bpe
from mutants import assert_own_verdict, assert_phrases_distinct, assert_random_state_kept
from test_steps_tokenizer import count_pretokens, naive_merges, split_on_special

EOT = "<|endoftext|>"


# --- train_bpe: a learner's, from the steps ------------------------------------------------------------------

def learners_train_bpe(input_path, vocab_size, special_tokens, *, counting=None, tie="greater", weighted=True,
                       count_specials=True, order="bytes", start=0, specials=True, vocab_as="bytes", merges_as="pair",
                       check=True, stop=True, extra=0):
    if check and vocab_size < 256 + len(special_tokens):
        raise ValueError(f"vocab_size={vocab_size} is below 256 + {len(special_tokens)} special tokens")
    text = Path(input_path).read_text(encoding="utf-8")
    counts = (counting or count_pretokens)(text, special_tokens)
    num_merges = vocab_size - 256 - (len(special_tokens) if count_specials else 0) + extra
    merges = naive_merges(counts, num_merges, tie=tie, weighted=weighted, stop=stop)
    tokens = [bytes([b]) for b in range(256)] + [a + b for a, b in merges]
    specials_bytes = [s.encode("utf-8") for s in special_tokens] if specials else []
    tokens = specials_bytes + tokens if order == "specials first" else tokens + specials_bytes
    vocab = {start + i: t.decode("latin-1") if vocab_as == "str" else t for i, t in enumerate(tokens)}
    shown = {"pair": lambda p: p, "str": lambda p: (p[0].decode("latin-1"), p[1].decode("latin-1")),
             "token": lambda p: p[0] + p[1]}[merges_as]
    return vocab, [shown(p) for p in merges]


def trainer(**knobs):
    return lambda input_path, vocab_size, special_tokens: learners_train_bpe(input_path, vocab_size, special_tokens,
                                                                             **knobs)


def _no_pretokens(text, special_tokens):
    """The pieces between the special tokens, counted whole: no pre-tokenization."""
    pieces = [p for p in split_on_special(text, special_tokens) if p not in special_tokens]
    return {p: pieces.count(p) for p in dict.fromkeys(pieces)}


def _specials_as_words(text, special_tokens):
    counts = count_pretokens(text, special_tokens)
    for piece in split_on_special(text, special_tokens):
        if piece in special_tokens:
            counts[piece] = counts.get(piece, 0) + 1
    return counts


def _repeats_the_last(input_path, vocab_size, special_tokens):
    """Not stopping: once no pair is left, the last merge again until the size is reached."""
    vocab, merges = learners_train_bpe(input_path, vocab_size, special_tokens)
    merges += merges[-1:] * (vocab_size - len(vocab))
    return vocab, merges


TRAIN_MUTANTS = [
    (trainer(vocab_as="str"), "the vocab's tokens are str"),
    (trainer(merges_as="str"), "the merges are str"),
    (trainer(merges_as="token"), "merges holds the merged tokens"),
    (trainer(specials=False), "is not in the vocab"),
    (trainer(start=1), "the vocab's ids are not 0"),
    (trainer(order="specials first"), "the special tokens come first"),
    (trainer(count_specials=False), "not counted in vocab_size"),
    (trainer(extra=1), "(one too many)"),
    (trainer(extra=-1), "(one too few)"),
    (_repeats_the_last, "does not stop when no pair is left"),
    (trainer(counting=lambda text, special_tokens: count_pretokens(text, special_tokens, split=False)),
     "the special tokens are trained on"),
    (trainer(counting=lambda text, special_tokens: count_pretokens(text, special_tokens, skip=False)),
     "the special tokens are trained on"),
    (trainer(counting=_specials_as_words), "counted as words"),
    (trainer(counting=lambda text, special_tokens: count_pretokens(text, special_tokens, joined=True)),
     "deleted and the text around them joined"),
    (trainer(counting=_no_pretokens), "merges cross pre-tokens"),
    (trainer(counting=lambda text, special_tokens: count_pretokens(text, special_tokens, find=str.split)),
     "(str.split)"),
    (trainer(tie="smaller"), "go to the smaller pair"),
    (trainer(tie="first"), "go to the first pair counted"),
    (trainer(weighted=False), "counted once, not as often"),
    (trainer(check=False), "do not fit in 256 ids"),
]


def _raises_type_error(input_path, vocab_size, special_tokens):
    if vocab_size < 256 + len(special_tokens):
        raise TypeError("too small")
    return learners_train_bpe(input_path, vocab_size, special_tokens)


TRAIN_MUTANTS.append((_raises_type_error, "raised TypeError (too small), not ValueError"))


# --- train_bpe: the incremental trainer with one bookkeeping mistake -----------------------------------------------

def learn_merges(word_counts, num_merges, *, subtract=True, skip_stale=True, push_fallen=True, index_new=True,
                 weighted_updates=True):
    """The lazy-heap trainer of the final class, with a knob for each bookkeeping step a learner may forget."""
    words = [[bytes([b]) for b in w.encode("utf-8")] for w in word_counts]
    freqs = list(word_counts.values())
    pairs, holders = Counter(), defaultdict(set)
    for i, w in enumerate(words):
        for p in zip(w, w[1:]):
            pairs[p] += freqs[i]
            holders[p].add(i)
    heap = [(-n, course._Greater(p)) for p, n in pairs.items()]
    heapq.heapify(heap)
    merges = []
    while heap and len(merges) < num_merges:
        negative, entry = heapq.heappop(heap)
        best = entry.pair
        if skip_stale and pairs[best] != -negative:
            continue
        merges.append(best)
        touched = set()
        for i in holders.pop(best, set()):
            old = words[i]
            new = course._merge_word(old, best)
            by = freqs[i] if weighted_updates else 1
            if subtract:
                for p in zip(old, old[1:]):
                    pairs[p] -= by
            old_pairs = set(zip(old, old[1:]))
            for p in zip(new, new[1:]):
                pairs[p] += by
                if index_new or p in old_pairs:
                    holders[p].add(i)
            was, now = Counter(zip(old, old[1:])), Counter(zip(new, new[1:]))
            touched |= {p for p in was | now if now[p] > was[p] or (push_fallen and now[p] != was[p])}
            words[i] = new
        pairs.pop(best, None)
        for p in touched - {best}:
            if pairs[p] > 0:
                heapq.heappush(heap, (-pairs[p], course._Greater(p)))
    return merges


def incremental(**knobs):
    def train(input_path, vocab_size, special_tokens):
        counts = course._pretoken_counts(input_path, special_tokens, processes=1)
        merges = learn_merges(counts, vocab_size - 256 - len(special_tokens), **knobs)
        tokens = [bytes([b]) for b in range(256)] + [a + b for a, b in merges] + [t.encode() for t in special_tokens]
        return dict(enumerate(tokens)), merges
    return train


TRAIN_MUTANTS += [
    (incremental(subtract=False), "the pairs that a merge destroys were not subtracted"),
    (incremental(skip_stale=False), "a popped entry whose count is out of date was not skipped"),
    (incremental(push_fallen=False), "a pair whose count fell was not pushed again"),
    (incremental(index_new=False), "the pairs created by a merge were not added to the index"),
    (incremental(weighted_updates=False), "updates were not multiplied by how often each pre-token occurs"),
]


# --- Tokenizer: the course's with one mistake ------------------------------------------------------------------

class PositionOrder(Tokenizer):
    def _merge(self, pretoken):
        parts = [bytes([b]) for b in pretoken.encode("utf-8")]
        while True:
            known = [i for i, pair in enumerate(zip(parts, parts[1:])) if pair in self.ranks]
            if not known:
                return [self.ids[p] for p in parts]
            i = known[0]
            parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]


class SpecialsAsText(Tokenizer):
    def encode(self, text):
        if not isinstance(text, str):
            raise TypeError(type(text).__name__)
        return [i for pretoken in self.pattern.findall(text) for i in self._merge(pretoken)]


class ShortestFirst(Tokenizer):
    def encode(self, text):
        if not isinstance(text, str):
            raise TypeError(type(text).__name__)
        shortest = sorted(self.special_tokens, key=len)
        ids = []
        for piece in regex.split("(" + "|".join(map(regex.escape, shortest)) + ")", text):
            ids += [self.special_ids[piece]] if piece in self.special_ids else \
                [i for pretoken in self.pattern.findall(piece) for i in self._merge(pretoken)]
        return ids


class NotAppended(Tokenizer):
    def __init__(self, vocab, merges, special_tokens=None):
        known = set(vocab.values())
        super().__init__(vocab, merges, [s for s in special_tokens or [] if s.encode("utf-8") in known])


class DecodePerToken(Tokenizer):
    def decode(self, ids):
        return "".join(self.vocab[i].decode("utf-8", errors="replace") for i in ids)


class DecodeStrict(Tokenizer):
    def decode(self, ids):
        return b"".join(self.vocab[i] for i in ids).decode("utf-8")


class LineByLine(Tokenizer):
    def encode_iterable(self, iterable):
        for line in iterable:
            yield from self.encode(line)


class ReturnsAList(Tokenizer):
    def encode_iterable(self, iterable):
        return self.encode("".join(iterable))


class ReadsAllFirst(Tokenizer):
    def encode_iterable(self, iterable):
        yield from self.encode("".join(iterable))


class NoTypeError(Tokenizer):
    def encode(self, text):
        return super().encode(text.decode("utf-8") if isinstance(text, bytes) else str(text))


class KeyErrorOnDecode(Tokenizer):
    def decode(self, ids):
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")


class ListIndexedDecode(Tokenizer):
    """Refuses the ids past the end, but a negative id indexes the list from its end."""

    def decode(self, ids):
        table = [self.vocab[i] for i in range(len(self.vocab))]
        if any(i >= len(table) for i in ids):
            raise ValueError("id past the end")
        return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")


class OwnPatternIgnored(Tokenizer):
    def encode(self, text):
        if not isinstance(text, str):
            raise TypeError(type(text).__name__)
        ids = []
        for piece in course._split_on_special(text, self.special_tokens):
            ids += [self.special_ids[piece]] if piece in self.special_ids else \
                [i for pretoken in regex.findall(GPT2_PATTERN, piece) for i in self._ids_of(pretoken)]
        return ids


class BlankDropped(Tokenizer):
    def encode(self, text):
        if not isinstance(text, str):
            raise TypeError(type(text).__name__)
        ids = []
        for piece in course._split_on_special(text, self.special_tokens):
            if piece in self.special_ids:
                ids.append(self.special_ids[piece])
            elif piece.strip():
                ids += [i for pretoken in self.pattern.findall(piece) for i in self._ids_of(pretoken)]
        return ids


def _split_in_given_order(text, special_tokens):
    """_split_on_special without the sort: the tokens tried in the order given."""
    if not special_tokens:
        return [text] if text else []
    return [p for p in regex.split("(" + "|".join(map(regex.escape, special_tokens)) + ")", text) if p]


class SplitNotSorted(Tokenizer):
    """The course's encode, calling a _split_on_special that does not sort: Tokenizer's sorted tokens hide it."""
    encode = types.FunctionType(Tokenizer.encode.__code__, {**vars(course), "_split_on_special": _split_in_given_order},
                                "encode", Tokenizer.encode.__defaults__, Tokenizer.encode.__closure__)


TOKENIZER_MUTANTS = [
    (PositionOrder, "position order"),
    (SpecialsAsText, "split into bytes like text"),
    (ShortestFirst, "the shorter one is matched first"),
    (NotAppended, "missing from the vocab is not appended"),
    (DecodePerToken, "each token is decoded on its own"),
    (DecodeStrict, "raises UnicodeDecodeError"),
    (LineByLine, "each line is encoded on its own"),
    (ReturnsAList, "is not lazy"),
    (ReadsAllFirst, "is not lazy"),
    (NoTypeError, "a int is encoded as if it were text"),
    (KeyErrorOnDecode, "raised KeyError (411), not ValueError"),
    (ListIndexedDecode, "an id outside the vocab is decoded"),
    (OwnPatternIgnored, "encode ignores the tokenizer's own pattern"),
    (SplitNotSorted, "_split_on_special tries the special tokens in the order given"),
    (BlankDropped, "a piece of white space alone between two special tokens is dropped"),
]


# --- the tests -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("check, right", [(check_train_bpe, train_bpe), (check_train_bpe, learners_train_bpe),
                                          (check_tokenizer, Tokenizer)], ids=["course", "learner", "Tokenizer"])
def test_the_right_ones_pass_with_one_line(check, right, capsys):
    check(right)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("✓ "), lines


@pytest.mark.parametrize("mutant, phrase", TRAIN_MUTANTS, ids=[p for _, p in TRAIN_MUTANTS])
def test_each_train_bpe_mistake_is_named(mutant, phrase):
    assert_own_verdict(check_train_bpe, mutant, phrase, [(m, p) for m, p in TRAIN_MUTANTS if p != phrase])


@pytest.mark.parametrize("mutant, phrase", TOKENIZER_MUTANTS, ids=[m.__name__ for m, _ in TOKENIZER_MUTANTS])
def test_each_tokenizer_mistake_is_named(mutant, phrase):
    assert_own_verdict(check_tokenizer, mutant, phrase, [(m, p) for m, p in TOKENIZER_MUTANTS if p != phrase])


def test_the_phrases_are_distinct():
    """One phrase per mistake; two ways to make the same mistake share it."""
    for mutants in (TRAIN_MUTANTS, TOKENIZER_MUTANTS):
        assert_phrases_distinct(list({phrase: (mutant, phrase) for mutant, phrase in mutants}.values()))


def test_the_checks_keep_the_random_state():
    assert_random_state_kept(check_train_bpe, train_bpe)
    assert_random_state_kept(check_tokenizer, Tokenizer)


def test_an_object_instead_of_the_class_is_named():
    tokenizer = Tokenizer({i: bytes([i]) for i in range(256)}, [])
    with pytest.raises(AssertionError, match=r"^check_tokenizer got a Tokenizer, not the class: pass the class itself"):
        check_tokenizer(tokenizer)


def test_a_learner_with_processes_gets_one():
    """A train_bpe that takes processes is called with processes=1 (no pool for a few bytes)."""
    seen = []

    def with_processes(input_path, vocab_size, special_tokens, processes=None):
        seen.append(processes)
        return train_bpe(input_path, vocab_size, special_tokens, processes=processes)

    check_train_bpe(with_processes)
    assert set(seen) == {1}


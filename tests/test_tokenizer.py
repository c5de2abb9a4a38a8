"""The tokenizer (notebook 13): train_bpe against a naive trainer written here and against cases worked out by hand
(the handout's), its parallel counting, and Tokenizer's encode against Hugging Face's tokenizers on the same files."""

from collections import Counter
from pathlib import Path

import pytest
import regex
from tokenizers import Tokenizer as HFTokenizer, models, pre_tokenizers

from transformer_from_scratch.tokenizer import Tokenizer, _chunk_bounds, _learn_merges, _pretoken_counts, train_bpe

EOT = "<|endoftext|>"
GPT2 = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
DATA = Path(__file__).parents[1] / "notebooks" / "data" / "shakespeare"
HANDOUT = "low low low low low lower lower widest widest widest newest newest newest newest newest newest"
TRICKY = ["", "Hello, world! It's 2024; 3.14159 and 1,000,000.", "café naïve façade 北京 Ελληνικά ŋ",
          "emoji 🙂👍🏽🏳️‍🌈 and more 🙂", "def f(x):\n\treturn x ** 2  # square\n", "   \n\n\n\t  spaces   ",
          f"a{EOT}b{EOT}{EOT}{EOT}c{EOT}", f"{EOT}{EOT}", "don't you'll we've I'm they're", "\r\n\r\n x \u00a0y"]


# --- an independent trainer: every pair recounted before each merge ---------------------------------------------

def naive_train(text: str, vocab_size: int, specials: list[str], pattern: str = GPT2):
    pieces = regex.split("|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True)), text) \
        if specials else [text]
    words = Counter(tuple(bytes([b]) for b in m.encode("utf-8")) for p in pieces for m in regex.findall(pattern, p))
    merges = []
    while len(merges) < vocab_size - 256 - len(specials):
        pairs = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = max(pairs, key=lambda pair: (pairs[pair], pair))
        merges.append(best)
        merged = Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if word[i:i + 2] == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


def write(folder: Path, text: str, name: str = "text.txt") -> Path:
    path = folder / name
    path.write_bytes(text.encode("utf-8"))
    return path


SMALL_TEXTS = [
    HANDOUT,
    f"{HANDOUT}.{EOT}Newer café, naïve café; 北京北京 🙂🙂 it's 2024 and 2024\n\n  spaced   out\n{EOT}low",
    "the cat sat on the mat. the mat sat on the cat! " * 5 + "<|endoftext|>the end",
    "aaaa aaa aa a abab baba " * 3,
]


@pytest.mark.parametrize("text", SMALL_TEXTS, ids=range(len(SMALL_TEXTS)))
def test_train_bpe_equals_a_naive_trainer(tmp_path, text):
    vocab_size = 256 + 1 + 40
    _, merges = train_bpe(write(tmp_path, text), vocab_size, [EOT], processes=1)
    assert merges == naive_train(text, vocab_size, [EOT])


# Pre-tokens on lines of their own: ab 3 times, cacbbcb, bcbc 5 times, b 3 times, abbbaaab.
STALE = "\n".join(["ab"] * 3 + ["cacbbcb"] + ["bcbc"] * 5 + ["b"] * 3 + ["abbbaaab"]) + "\n"


def test_a_pair_whose_count_drops_in_a_word_stays_a_candidate(tmp_path):
    assert _learn_merges({"ab": 3, "cacbbcb": 1, "bcbc": 5, "b": 3, "abbbaaab": 1}, 10) == \
        naive_train(STALE, 266, [])
    _, merges = train_bpe(write(tmp_path, STALE), 266, [], processes=1)
    assert merges == naive_train(STALE, 266, [])


def test_the_handouts_example_by_hand(tmp_path):
    """§2.4's example, pre-tokenized on white space only: {low: 5, lower: 2, widest: 3, newest: 6}. 'es' and 'st' both
    count 9 (widest 3 + newest 6): the greater pair ('s', 't') wins; then 'e st' 9, 'o w' 7, 'l ow' 7, 'w est' 9 …"""
    vocab, merges = train_bpe(write(tmp_path, HANDOUT), 256 + 6 + 1, [EOT], processes=1, pattern=r"\S+")
    assert merges == [(b"s", b"t"), (b"e", b"st"), (b"o", b"w"), (b"l", b"ow"), (b"w", b"est"), (b"n", b"e")]
    assert [vocab[256 + i] for i in range(6)] == [b"st", b"est", b"ow", b"low", b"west", b"ne"]
    assert vocab[262] == EOT.encode()


def test_ties_go_to_the_greater_pair(tmp_path):
    _, merges = train_bpe(write(tmp_path, "ab ba"), 257, [], processes=1, pattern=r"\S+")
    assert merges == [(b"b", b"a")]  # both count 1; (b'b', b'a') > (b'a', b'b')
    _, merges = train_bpe(write(tmp_path, "é zz"), 257, [], processes=1, pattern=r"\S+")
    assert merges == [("é".encode()[:1], "é".encode()[1:])]  # b'\xc3' > b'z': bytes compare by value


def test_the_vocab_is_dense_and_in_order(tmp_path):
    text = SMALL_TEXTS[1]
    vocab, merges = train_bpe(write(tmp_path, text), 256 + 30 + 2, [EOT, "<|pad|>"], processes=1)
    assert sorted(vocab) == list(range(256 + 30 + 2))
    assert [vocab[i] for i in range(256)] == [bytes([b]) for b in range(256)]
    assert [vocab[256 + i] for i in range(30)] == [a + b for a, b in merges]
    assert [vocab[286], vocab[287]] == [EOT.encode(), b"<|pad|>"]


def test_merges_never_cross_a_pretoken_or_a_special_token(tmp_path):
    """The letters of <|endoftext|> (e, n, d, o, f, t, x) and its punctuation are in no other text: no merge holds
    them. Every merged token lies inside one pre-token."""
    text = f"ab, ab; ab ab!{EOT}ab  ab{EOT}{EOT}ab?\n\nab ab\n" * 4
    _, merges = train_bpe(write(tmp_path, text), 256 + 1 + 40, [EOT], processes=1)
    assert merges
    assert all(not set(a + b) & set(b"<|endoftx>") for a, b in merges)
    pretokens = {m.encode() for p in regex.split(regex.escape(EOT), text) for m in regex.findall(GPT2, p)}
    assert all(any(a + b in p for p in pretokens) for a, b in merges)


def test_fewer_merges_when_the_text_runs_out_of_pairs(tmp_path):
    vocab, merges = train_bpe(write(tmp_path, "ab ab"), 300, [EOT], processes=1)
    assert merges == [(b"a", b"b"), (b" ", b"ab")]
    assert sorted(vocab) == list(range(259)) and vocab[258] == EOT.encode()


# --- parallel counting ---------------------------------------------------------------------------------------------

def test_counting_in_parallel_equals_one_process(tmp_path):
    text = (DATA / "heldout.txt").read_text(encoding="utf-8")[:200_000]
    paragraphs = text.split("\n\n")
    with_specials = EOT.join("\n\n".join(paragraphs[i:i + 7]) for i in range(0, len(paragraphs), 7))
    for name, text, specials in [("plain", text, []), ("plain", text, [EOT]), ("special", with_specials, [EOT])]:
        path = write(tmp_path, text, f"{name}.txt")
        pieces = regex.split(regex.escape(EOT), text) if specials else [text]
        one = _pretoken_counts(path, specials, processes=1)
        assert one == Counter(m for p in pieces for m in regex.findall(GPT2, p))
        for processes in (2, 3):
            assert _pretoken_counts(path, specials, processes=processes) == one, (name, specials, processes)


@pytest.mark.parametrize("specials", [[], [EOT]])
def test_chunk_bounds_cut_only_where_no_pretoken_changes(tmp_path, specials):
    """Multi-byte characters everywhere: every cut is at a special token or after a line break between two printable
    ASCII characters, never inside a character."""
    line = "é北🙂 ŋ naïve 北京 x\nY 🙂🙂 é, ü.\n"
    text = (line * 40 + (EOT if specials else "")) * 30
    path = write(tmp_path, text)
    data = path.read_bytes()
    for parts in (2, 3, 5, 7):
        bounds = _chunk_bounds(path, parts, specials)
        assert bounds[0] == 0 and bounds[-1] == len(data) and bounds == sorted(set(bounds))
        assert len(bounds) > 2
        for b in bounds[1:-1]:
            assert not 0x80 <= data[b] <= 0xBF, b  # not a UTF-8 continuation byte
            at_special = any(data[b:].startswith(s.encode()) for s in specials)
            after_break = data[b - 1:b] == b"\n" and not data[b - 2:b - 1].isspace() and not data[b:b + 1].isspace()
            assert at_special or after_break, (b, data[b - 5:b + 5])
    assert _pretoken_counts(path, specials, processes=3) == _pretoken_counts(path, specials, processes=1)


# --- Tokenizer -----------------------------------------------------------------------------------------------------

SPECIALS = [EOT, EOT + EOT]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A vocab of 2,048 from the held-out play, saved in GPT-2's format, with Hugging Face's tokenizer on the same
    files (the two special tokens added: the doubled one is not in the vocab)."""
    folder = tmp_path_factory.mktemp("bpe")
    vocab, merges = train_bpe(DATA / "heldout.txt", 2048, [EOT], processes=1)
    tokenizer = Tokenizer(vocab, merges, SPECIALS)
    Tokenizer(vocab, merges).save(folder / "vocab.json", folder / "merges.txt")
    hf = HFTokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.add_special_tokens(SPECIALS)
    return tokenizer, hf, folder, vocab, merges


def test_encode_equals_hugging_face_on_the_play(trained):
    tokenizer, hf, *_ = trained
    text = (DATA / "heldout.txt").read_text(encoding="utf-8")
    assert tokenizer.encode(text) == hf.encode(text).ids


@pytest.mark.parametrize("text", TRICKY, ids=range(len(TRICKY)))
def test_encode_equals_hugging_face_on_tricky_texts(trained, text):
    tokenizer, hf, *_ = trained
    assert tokenizer.encode(text) == hf.encode(text).ids


@pytest.mark.parametrize("text", TRICKY, ids=range(len(TRICKY)))
def test_decode_gives_the_text_back(trained, text):
    tokenizer, *_ = trained
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_save_and_from_files_round_trip(trained, tmp_path):
    tokenizer, _, folder, vocab, merges = trained
    loaded = Tokenizer.from_files(folder / "vocab.json", folder / "merges.txt", SPECIALS)
    assert loaded.vocab == tokenizer.vocab and loaded.merges == merges
    for text in TRICKY:
        assert loaded.encode(text) == tokenizer.encode(text)
    loaded.save(tmp_path / "v.json", tmp_path / "m.txt")
    assert (tmp_path / "m.txt").read_text("utf-8") == (folder / "merges.txt").read_text("utf-8")


def test_encode_iterable_equals_encode_on_a_file(trained):
    tokenizer, *_ = trained
    with open(DATA / "heldout.txt", encoding="utf-8") as file:
        ids = list(tokenizer.encode_iterable(file))
    assert ids == tokenizer.encode((DATA / "heldout.txt").read_text(encoding="utf-8"))
    lines = ["First:\n", "\n", "\n", "\n", "Speak.\n", f"{EOT}\n", "\n", "\n", "  x\n"]
    assert list(tokenizer.encode_iterable(lines)) == tokenizer.encode("".join(lines))
    chunks = ["ab<|endo", "ftext|><|endoftext", "|>cd\n", "ef"]  # special tokens cut between the strings
    assert list(tokenizer.encode_iterable(chunks)) == tokenizer.encode("".join(chunks))


def test_encode_iterable_is_lazy(trained):
    tokenizer, *_ = trained
    read = []

    def lines():
        for n in range(10**9):
            if n > 10:
                raise AssertionError("read ahead")
            read.append(n)
            yield f"line {n}: speak, speak.\n"

    ids = tokenizer.encode_iterable(lines())
    assert [next(ids) for _ in range(3)] == tokenizer.encode("line 0: speak")[:3]
    assert len(read) <= 2


def test_decode_replaces_bad_utf8(trained):
    tokenizer, *_ = trained
    e_acute = "é".encode()
    assert tokenizer.decode([e_acute[0]]) == "\ufffd"
    assert tokenizer.decode([e_acute[0], e_acute[1], e_acute[1]]) == "é\ufffd"
    assert tokenizer.decode([0xFF, ord("a")]) == "\ufffda"


def test_a_missing_special_token_gets_the_next_id(trained):
    tokenizer, _, _, vocab, _ = trained
    assert len(tokenizer) == len(vocab) + 1
    assert tokenizer.encode(EOT + EOT) == [len(vocab)]
    assert tokenizer.encode(EOT) == [len(vocab) - 1]  # in the vocab already, as train_bpe put it
    assert tokenizer.decode([len(vocab)]) == EOT + EOT


def test_the_longest_special_token_matches_first(trained):
    tokenizer, _, _, vocab, _ = trained
    eot, both = len(vocab) - 1, len(vocab)
    assert tokenizer.encode(EOT * 3) == [both, eot]
    assert tokenizer.encode(f"x{EOT * 4}y")[1:-1] == [both, both]
    without = Tokenizer(vocab, [], [EOT])
    assert without.encode(EOT * 2) == [eot, eot]


def test_no_special_tokens_means_plain_text(trained):
    _, _, _, vocab, merges = trained
    plain = Tokenizer(vocab, merges)
    assert len(plain.encode(EOT)) > 1 and plain.decode(plain.encode(EOT)) == EOT


def test_several_missing_special_tokens_get_ids_in_the_order_given(trained):
    _, _, folder, vocab, merges = trained
    ours = Tokenizer(vocab, merges, ["<a>", "<bbbb>"])
    hf = HFTokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.add_special_tokens(["<a>", "<bbbb>"])
    assert ours.encode("<a><bbbb>") == hf.encode("<a><bbbb>").ids == [len(vocab), len(vocab) + 1]


# --- bad input -----------------------------------------------------------------------------------------------------

def test_a_vocab_size_below_the_bytes_and_specials_is_refused(tmp_path):
    path = write(tmp_path, "ab ab")
    with pytest.raises(ValueError, match=r"vocab_size=256\b"):
        train_bpe(path, 256, [EOT])
    with pytest.raises(ValueError, match=r"vocab_size=100\b"):
        train_bpe(path, 100, [])
    train_bpe(path, 257, [EOT])  # exactly the bytes and the special token: no merge


def test_a_missing_file_is_named(tmp_path):
    missing = tmp_path / "no such file.txt"
    with pytest.raises(FileNotFoundError, match=regex.escape(str(missing))):
        train_bpe(missing, 300, [])


def test_decode_refuses_an_id_outside_the_vocab(trained):
    tokenizer, *_ = trained
    for bad in (len(tokenizer), 10**6, -1):
        with pytest.raises(ValueError, match=rf" {bad}\b"):
            tokenizer.decode([5, bad])


def test_encode_refuses_what_is_not_a_str(trained):
    tokenizer, *_ = trained
    for bad, name in [(b"bytes", "bytes"), (42, "int"), (None, "NoneType"), (["a"], "list")]:
        with pytest.raises(TypeError, match=name):
            tokenizer.encode(bad)
    with pytest.raises(TypeError, match="bytes"):
        list(tokenizer.encode_iterable(["ok\n", b"not ok"]))

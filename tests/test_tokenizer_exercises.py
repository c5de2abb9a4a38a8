"""The exercise self-checks of notebook 13 pass the right answers with one line that does not print the answer, and
name each planted mistake on their first line."""

import pytest

from transformer_from_scratch.checks.steps.tokenizer_exercises import (_bytes_per_token_16k, check_context_bytes,
                                                                        check_digits3_pattern, check_first_merges)
from transformer_from_scratch.tokenizer import GPT2_PATTERN
from mutants import assert_own_verdict, assert_phrases_distinct

# --- Exercise 1 · the first four merges of the handout's toy corpus -----------------------------------------------

FIRST = [(b"s", b"t"), (b"e", b"st"), (b"o", b"w"), (b"l", b"ow")]

MERGE_MUTANTS = [
    ([("s", "t"), ("e", "st"), ("o", "w"), ("l", "ow")], "holds str, not bytes"),
    (FIRST[:3], "holds 3 merges, not 4"),
    ([(b"e", b"s"), (b"es", b"t"), (b"l", b"o"), (b"lo", b"w")], "ties go to the smaller pair"),
    ([(b"s", b"t"), (b"e", b"st"), (b"est", b" "), (b"o", b"w")], "counted across pre-tokens"),
    ([(b"s", b"t"), (b"e", b"st"), (b"o", b"w"), (b"l", b"ow")][:2] + [(b"l", b"o"), (b"lo", b"w")],
     "merge 3 of first_merges"),
    ("st est ow low", "not a list of pairs of bytes"),
]

# --- Exercise 2 · digits in groups of three -----------------------------------------------------------------------

RIGHT_PATTERN = GPT2_PATTERN.replace(r" ?\p{N}+", r"\p{N}{1,3}")

PATTERN_MUTANTS = [
    (GPT2_PATTERN, "keeps the digits of"),
    (GPT2_PATTERN.replace(r" ?\p{N}+", r"\p{N}"), "one digit at a time"),
    (GPT2_PATTERN.replace(r" ?\p{N}+", r" ?\p{N}{1,3}"), "a space stays attached"),
    (GPT2_PATTERN.replace(r" ?\p{N}+", r"\p{N}{3}"), "loses characters"),
    (GPT2_PATTERN.replace(r"\s+(?!\S)|", "").replace(r" ?\p{N}+", r"\p{N}{1,3}"), "differently from GPT-2's"),
    (RIGHT_PATTERN + "(", "does not compile"),
    (3, "not a str"),
]

# --- Exercise 3 · the bytes a context of 256 tokens holds ---------------------------------------------------------

PER_TOKEN = _bytes_per_token_16k()
CONTEXT_MUTANTS = [
    (256, "the byte-level model's 256 bytes"),
    (256 / PER_TOKEN, "divides by the bytes per token"),
    (16_384 * PER_TOKEN, "uses the vocabulary size"),
    (1.2 * 256 * PER_TOKEN, "is more bytes than"),
    (0.8 * 256 * PER_TOKEN, "is fewer bytes than"),
    ("900", "not a number"),
]

ALL = [(check_first_merges, FIRST, MERGE_MUTANTS),
       (check_digits3_pattern, RIGHT_PATTERN, PATTERN_MUTANTS),
       (check_context_bytes, 256 * PER_TOKEN, CONTEXT_MUTANTS)]
CASES = [(check, m, p, mutants) for check, _, mutants in ALL for m, p in mutants]


def test_the_right_answers_pass_with_one_line_that_keeps_the_answer(capsys):
    check_context_bytes(round(256 * PER_TOKEN))  # a rounded answer is as right
    for check, right, _ in ALL:
        check(right)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * (len(ALL) + 1), lines
    answers = [f"{256 * PER_TOKEN:.0f}", f"{PER_TOKEN:.2f}", "b'st'", r"\p{N}{1,3}"]
    assert not any(answer in line for line in lines for answer in answers), lines


@pytest.mark.parametrize("check, mutant, phrase, mutants", CASES, ids=[f"{i}: {c[2]}" for i, c in enumerate(CASES)])
def test_each_mistake_is_named(check, mutant, phrase, mutants):
    first = assert_own_verdict(check, mutant, phrase, mutants)
    assert r"\p{N}{1,3}" not in first, first  # the principle, not the code


def test_the_phrases_are_distinct():
    for _, _, mutants in ALL:
        assert_phrases_distinct(mutants)

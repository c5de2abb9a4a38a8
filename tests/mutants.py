"""What every learner check's mutation tests assert, in one place (tests/test_checks_*.py use it).

A check is called with a planted mistake (a "mutant"); its verdict's first line must carry that mistake's
own phrase and no other mutant's. A check must also leave the caller's random state as it found it.
"""

from typing import Any, Callable, Iterable

import pytest
import torch


def assert_phrases_distinct(mutants: Iterable[tuple[Any, str]]) -> None:
    """Each (mutant, phrase) pair has a phrase of its own."""
    phrases = [phrase for _, phrase in mutants]
    assert len(set(phrases)) == len(phrases)


def assert_own_verdict(check: Callable[[Any], None], mutant: Any, phrase: str,
                       mutants: Iterable[tuple[Any, str]] = (), *, exclusive: bool = True,
                       except_within: bool = False) -> str:
    """``check(mutant)`` fails; its first line holds ``phrase`` and, if ``exclusive``, no other mutant's
    phrase (with ``except_within``, a phrase that is part of this one's is allowed)."""
    with pytest.raises(AssertionError) as error:
        check(mutant)
    first = str(error.value).splitlines()[0]
    assert phrase in first, first
    if exclusive:
        for other_mutant, other in mutants:
            if other_mutant is not mutant and not (except_within and other in phrase):
                assert other not in first, f"{first!r} also names {other!r}"
    return first


def assert_random_state_kept(check: Callable[[Any], None], impl: Any) -> None:
    """Running the check does not move torch's global random generator."""
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    check(impl)
    assert torch.equal(torch.rand(3), expected)


def each_mistake_of(table: list[tuple[Callable[[Any], None], list[tuple[Any, str]]]]):
    """``pytest.mark.parametrize("check, mutant, phrase", ...)`` over a table of several checks and their mutants,
    [(check, [(mutant, phrase), ...]), ...], each case named "<check>: <phrase>"."""
    cases = [(check, mutant, phrase) for check, mutants in table for mutant, phrase in mutants]
    return pytest.mark.parametrize("check, mutant, phrase", cases, ids=[f"{c.__name__}: {p}" for c, _, p in cases])


def assert_named_in(table: list[tuple[Callable[[Any], None], list[tuple[Any, str]]]], check: Callable[[Any], None],
                    mutant: Any, phrase: str) -> None:
    """assert_own_verdict against the other mutants of the same check in the table."""
    assert_own_verdict(check, mutant, phrase, next(m for c, m in table if c is check))

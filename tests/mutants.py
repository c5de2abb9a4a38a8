"""What every learner check's mutation tests assert, in one place (tests/test_checks_*.py, tests/test_steps_*.py and
tests/test_mistakes.py use it).

A check is called with a planted mistake (a "mutant"); its verdict's first line must carry that mistake's
own phrase and no other mutant's. A check must also leave the caller's random state as it found it.
"""

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import pytest
import torch

# A student notebook's Linear: the learner's own, from notebook 01 (my_transformer exports it), not the course's. A
# check that builds models for the learner's code must build them of this class when that code sees it (the source
# of a cell, for exec with torch and nn imported).
LEARNERS_LINEAR = """
class Linear(nn.Module):  # the learner's own, from notebook 01 (my_transformer's), not the course's
    def __init__(self, in_features, out_features, device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.randn(out_features, in_features, device=device, dtype=dtype))

    def forward(self, x):
        return x @ self.weight.T
"""


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


# AdamW's update rule, wrong in one way each: (the mistake's key, the phrase its verdict carries). Planted in the
# optimizer (tests/test_checks_training.py) and in the step's function (tests/test_steps_training.py), each test
# module turning the keys into mutants with its own _adamw.
ADAMW_MISTAKES = [
    ("l2", "Adam with L2 regularisation"),
    ("no_bias", "there is no bias correction"),
    ("no_v_hat", "v is not bias-corrected"),
    ("t0", "counts the steps from 0"),
    ("inside", "ε is inside the square root"),
    ("alpha_t", "uses the bias-corrected α_t instead of α"),
    ("no_decay", "weight_decay is ignored"),
    ("swapped", "β1 and β2 are swapped"),
    ("no_sqrt", "divides by v + ε"),
    ("v_of_g", "v averages g, not g²"),
]


# ----------------------------------------------------------------------------------- the catalogues of mistakes

@dataclass(frozen=True)
class Catalogue:
    """One check's planted mistakes, which tests/test_mistakes.py runs (each named, the phrases distinct, the
    random state kept) for every module listed in its ``MODULES``: a test module joins by defining
    ``CATALOGUES = [Catalogue(...), ...]`` and adding its name there.

    ``mutants``: (mutant, phrase) pairs; each mutant's verdict's first line holds its phrase and, if ``exclusive``,
    no phrase of ``against`` (default: ``mutants``) but its own (with ``except_within``, a phrase that is part of
    its own is allowed). ``distinct``: "equal", no two mistakes share a phrase (but those in ``shared``, two
    plantings of one mistake); "within", no phrase is a part of another mistake's; "none", not checked. ``right``:
    the right implementation, on which the check must leave torch's random state as it was (None: not run here).
    ``first_line``: a further assertion on each verdict's first line. ``ids``: the cases' names (default: the
    phrases)."""

    check: Callable[[Any], None]
    mutants: Sequence[tuple[Any, str]]
    right: Any = None
    exclusive: bool = True
    except_within: bool = False
    against: Sequence[tuple[Any, str]] | None = None
    distinct: str = "equal"
    shared: frozenset[str] = frozenset()
    first_line: Callable[[str], None] | None = None
    ids: Sequence[str] | None = None


def assert_catalogue_named(catalogue: Catalogue, mutant: Any, phrase: str) -> str:
    """The mutant's verdict names its mistake (assert_own_verdict with the catalogue's settings)."""
    against = catalogue.mutants if catalogue.against is None else catalogue.against
    first = assert_own_verdict(catalogue.check, mutant, phrase, [(m, p) for m, p in against if p != phrase],
                               exclusive=catalogue.exclusive, except_within=catalogue.except_within)
    if catalogue.first_line is not None:
        catalogue.first_line(first)
    return first


def assert_catalogue_distinct(catalogue: Catalogue) -> None:
    """The catalogue's phrases are distinct, as its ``distinct`` says."""
    phrases = [phrase for _, phrase in catalogue.mutants]
    if catalogue.distinct == "none":
        return
    if catalogue.distinct == "within":  # two plantings of one mistake may share its phrase
        unique = set(phrases)
        for phrase in unique:
            assert not any(phrase != other and phrase in other for other in unique), phrase
        return
    own = [phrase for phrase in phrases if phrase not in catalogue.shared]
    assert len(set(own)) == len(own), [phrase for phrase in own if own.count(phrase) > 1]

"""Each learner check's planted mistakes, once, parametrised over the test modules that plant them (as
tests/test_checks_generic.py does for the generic mistakes): every mistake named with its own phrase, the phrases
distinct, and the caller's random state kept.

A test module of a check (``tests/test_checks_<module>.py``, ``tests/test_steps_<module>.py``, an exercise's) plants
its mistakes and lists them in ``CATALOGUES`` (``mutants.Catalogue``: the check, its (mutant, phrase) pairs, the
right implementation); it joins by adding its name to ``MODULES`` below. Tests of a mistake that need more than its
phrase stay in their module.
"""

from __future__ import annotations

import importlib

import pytest

from mutants import assert_catalogue_distinct, assert_catalogue_named, assert_random_state_kept

MODULES = [
    "test_checks_linear",
    "test_checks_embedding",
    "test_checks_softmax",
    "test_checks_rmsnorm",
    "test_checks_rope",
    "test_checks_swiglu",
    "test_checks_multihead_attention",
    "test_checks_transformer_block",
    "test_checks_transformer_lm",
    "test_checks_training",
    "test_checks_kv_cache",
    "test_steps_linear",
    "test_steps_embedding",
    "test_steps_softmax",
    "test_steps_rmsnorm",
    "test_steps_attention",
    "test_steps_rope",
    "test_steps_swiglu",
    "test_steps_multihead_attention",
    "test_steps_transformer_block",
    "test_steps_transformer_lm",
    "test_steps_training",
    "test_steps_kv_cache",
    "test_checks_finetune", "test_steps_finetune",
    "test_checks_fast_decode", "test_steps_fast_decode",
    "test_kv_cache_exercises",
]
CATALOGUES = {name: importlib.import_module(name).CATALOGUES for name in MODULES}


def _mistakes() -> list:
    cases = []
    for name, catalogues in CATALOGUES.items():
        for catalogue in catalogues:
            ids = catalogue.ids or [phrase for _, phrase in catalogue.mutants]
            cases += [pytest.param(catalogue, mutant, phrase, id=f"{name}: {catalogue.check.__name__}: {case}")
                      for (mutant, phrase), case in zip(catalogue.mutants, ids)]
    return cases


@pytest.mark.parametrize("catalogue, mutant, phrase", _mistakes())
def test_each_mistake_is_named(catalogue, mutant, phrase, capsys):
    assert_catalogue_named(catalogue, mutant, phrase)
    assert "✓" not in capsys.readouterr().out  # no pass line for a wrong implementation


@pytest.mark.parametrize("name", [name for name, catalogues in CATALOGUES.items()
                                  if any(catalogue.distinct != "none" for catalogue in catalogues)])
def test_the_phrases_are_distinct(name):
    for catalogue in CATALOGUES[name]:
        assert_catalogue_distinct(catalogue)


@pytest.mark.parametrize("name", [name for name, catalogues in CATALOGUES.items()
                                  if any(catalogue.right is not None for catalogue in catalogues)])
def test_the_checks_keep_the_random_state(name):
    for catalogue in CATALOGUES[name]:
        if catalogue.right is not None:
            assert_random_state_kept(catalogue.check, catalogue.right)

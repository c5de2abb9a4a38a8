"""generate's on_token hook (notebook 10): the course's generate reports each id as it is picked, eos_id included, and
check_generate names each way of getting that wrong, planted here as a generate that wraps the course's."""

import functools

import pytest
import torch

from transformer_from_scratch import generate
from transformer_from_scratch.checks import check_generate
from transformer_from_scratch.transformer_lm import TransformerLM
from mutants import assert_own_verdict, assert_phrases_distinct


def _model():
    torch.manual_seed(0)
    return TransformerLM(vocab_size=20, context_length=8, d_model=16, num_layers=2, num_heads=2, d_ff=32,
                         rope_theta=10000.0).eval()


@pytest.mark.parametrize("use_cache", [True, False])
def test_on_token_sees_each_id_as_it_is_picked(use_cache):
    model, events = _model(), []
    handle = model.register_forward_pre_hook(lambda module, args: events.append("model"))
    new = generate(model, torch.tensor([1, 2, 3]), 12, temperature=0, use_cache=use_cache, on_token=events.append)
    handle.remove()
    ids = [event for event in events if event != "model"]
    assert ids == new.tolist() and all(type(i) is int for i in ids)
    assert events == [x for i in ids for x in ("model", i)]  # each id before the next call of the model


def test_on_token_is_told_of_eos_id_which_ends_the_ids():
    model, prompt = _model(), torch.tensor([4, 5])
    free = generate(model, prompt, 6, temperature=0).tolist()
    seen = []
    new = generate(model, prompt, 6, temperature=0, eos_id=free[2], on_token=seen.append).tolist()
    assert new == free[:free.index(free[2]) + 1] == seen


def _wrapped(mode):
    def wrong(model, prompt_ids, max_new_tokens, *, on_token=None, **kwargs):
        seen = []
        new = generate(model, prompt_ids, max_new_tokens, on_token=seen.append, **kwargs)
        if mode == "late" and on_token is not None:
            for i in seen:
                on_token(i)
        return new

    def during(model, prompt_ids, max_new_tokens, *, on_token=None, eos_id=None, **kwargs):
        def report(i):
            if on_token is None:
                return
            if mode == "tensor":
                on_token(torch.tensor(i))
            elif mode == "no eos" and i == eos_id:
                return
            elif mode == "twice":
                on_token(i)
                on_token(i)
            else:
                on_token(i)
        return generate(model, prompt_ids, max_new_tokens, eos_id=eos_id, on_token=report, **kwargs)

    # the course signature (use_cache, on_token, ...), so that the check reaches the hook
    return functools.wraps(generate)(wrong if mode in ("late", "never") else during)


MUTANTS = [
    (_wrapped("never"), "generate never calls on_token"),
    (_wrapped("late"), "on_token is called late"),
    (_wrapped("tensor"), "not the id as a Python int"),
    (_wrapped("no eos"), "on_token is not told of eos_id"),
    (_wrapped("twice"), "not the ids generate returns"),
]


@pytest.mark.parametrize("mutant, phrase", MUTANTS, ids=[p for _, p in MUTANTS])
def test_check_generate_names_each_on_token_mistake(mutant, phrase):
    assert_own_verdict(check_generate, mutant, phrase, MUTANTS)


def test_the_phrases_are_distinct():
    assert_phrases_distinct(MUTANTS)

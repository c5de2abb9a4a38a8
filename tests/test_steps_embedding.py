"""The step checks of notebook 02 pass the right steps and name each planted mistake on their first line."""

import pytest
import torch
import torch.nn.functional as F

from transformer_from_scratch.checks.steps.embedding import (
    check_init_table,
    check_lookup,
    check_one_hot_lookup,
    check_refuse_out_of_range,
)
from mutants import Catalogue


def lookup(table, ids):
    rows = torch.index_select(table, 0, ids.reshape(-1))
    return rows.reshape(*ids.shape, table.shape[-1])


def lookup_by_indexing(table, ids):
    return table[ids.reshape(-1)].reshape(*ids.shape, table.shape[1])


def one_hot_lookup(table, ids):
    return F.one_hot(ids, table.shape[0]).to(table.dtype) @ table


def one_hot_einsum(table, ids):
    one_hot = (ids[..., None] == torch.arange(table.shape[0])).to(table.dtype)
    return torch.einsum("...v,vd->...d", one_hot, table)


def refuse_out_of_range(ids, num_embeddings):
    if ids.numel() > 0:
        low, high = ids.min().item(), ids.max().item()
        if low < 0 or high >= num_embeddings:
            raise ValueError(f"ids must be in [0, {num_embeddings - 1}], got ids from {low} to {high}")


def init_table(num_embeddings, embedding_dim, generator=None):
    table = torch.empty(num_embeddings, embedding_dim)
    torch.nn.init.trunc_normal_(table, mean=0.0, std=1.0, a=-3.0, b=3.0, generator=generator)
    return table


# --- lookup -------------------------------------------------------------------------------------------------

def columns_transposed(table, ids):
    return table.T[ids.reshape(-1)].reshape(*ids.shape, table.shape[0])


def columns_sliced(table, ids):
    return table[:, ids]


def flat_rows(table, ids):
    return table[ids.reshape(-1)]


def plain_indexing(table, ids):
    return table[ids]


def minus_one(table, ids):
    return table[ids.reshape(-1)].reshape(*ids.shape, -1)


LOOKUP_MUTANTS = [
    (columns_transposed, "columns of the table (table.T[ids])"),
    (columns_sliced, "columns of the table (table[:, ids])"),
    (flat_rows, "the ids' leading shape is lost"),
    (plain_indexing, "a view of the table, not a copy"),
    (minus_one, "reshape(..., -1) cannot work out the row length"),
    (lambda table, ids: F.embedding(ids, table), "calls PyTorch's own F.embedding"),
]


# --- one_hot_lookup -----------------------------------------------------------------------------------------

ONE_HOT_MUTANTS = [
    (lambda table, ids: F.one_hot(ids, table.shape[0]) @ table, "not in the table's dtype"),
    (lambda table, ids: F.one_hot(ids, table.shape[0]).float() @ table, "not in the table's dtype"),
    (lambda table, ids: F.one_hot(ids).to(table.dtype) @ table, "without num_classes"),
    (lambda table, ids: table.T @ F.one_hot(ids, table.shape[0]).to(table.dtype).T, "the other way round"),
    (lookup, "looks the rows up directly"),
]


# --- refuse_out_of_range ------------------------------------------------------------------------------------

def _range(low_ok=lambda low: low >= 0, high_ok=lambda high, n: high < n, empty_ok=True, error=ValueError,
           message=None):
    """refuse_out_of_range with one thing changed (a mistake)."""
    def wrong(ids, num_embeddings):
        if ids.numel() == 0 and empty_ok:
            return
        low, high = torch.aminmax(ids)
        low, high = int(low), int(high)
        if not low_ok(low) or not high_ok(high, num_embeddings):
            text = message or f"ids must be in [0, {num_embeddings - 1}], got ids from {low} to {high}"
            raise error(text)
    return wrong


def asserts(ids, num_embeddings):
    assert ids.numel() == 0 or (ids.min() >= 0 and ids.max() < num_embeddings), "id out of range"


RANGE_MUTANTS = [
    (_range(high_ok=lambda high, n: high <= n), "an id equal to num_embeddings"),
    (_range(high_ok=lambda high, n: high < n - 1), "refuses the largest valid id"),
    (_range(low_ok=lambda low: low > 0), "refuses id 0"),
    (_range(low_ok=lambda low: True), "negative ids are let through"),
    (_range(empty_ok=False), "crashes on empty ids"),
    (asserts, "raises AssertionError, not ValueError"),
    (_range(error=IndexError), "raises IndexError, not ValueError"),
    (_range(message="token id out of range"), "the error message does not name"),
]


# --- init_table ---------------------------------------------------------------------------------------------

def _init(transposed=False, **changes):
    """init_table with some of trunc_normal_'s arguments changed (a mistake), or the shape transposed."""
    def wrong(num_embeddings, embedding_dim, generator=None):
        shape = (embedding_dim, num_embeddings) if transposed else (num_embeddings, embedding_dim)
        kwargs = dict(mean=0.0, std=1.0, a=-3.0, b=3.0, generator=generator)
        kwargs.update(changes)
        return torch.nn.init.trunc_normal_(torch.empty(*shape), **kwargs)
    return wrong


def never_filled(num_embeddings, embedding_dim, generator=None):
    return torch.full((num_embeddings, embedding_dim), float("nan"))  # what torch.empty may hold


def uncut(num_embeddings, embedding_dim, generator=None):
    return torch.randn(num_embeddings, embedding_dim, generator=generator)


def not_centred(num_embeddings, embedding_dim, generator=None):
    return init_table(num_embeddings, embedding_dim, generator) + 0.1


INIT_MUTANTS = [
    (_init(transposed=True), "the transpose of the table"),
    (never_filled, "as torch.empty made it"),
    (lambda v, d, generator=None: torch.zeros(v, d), "as torch.empty made it"),
    (uncut, "so nothing was cut"),
    (_init(a=-2.0, b=2.0), "cut at ±2"),
    (_init(std=0.02, a=-0.06, b=0.06), "not about 1"),  # GPT-2's std
    (lambda v, d, generator=None: init_table(v, d, generator) * (2 / (v + d)) ** 0.5, "not about 1"),  # Linear's σ
    (not_centred, "not 0"),
    (_init(generator=None), "the generator is ignored"),
]


def test_the_right_steps_pass_with_one_line(capsys):
    check_lookup(lookup)
    check_lookup(lookup_by_indexing)
    check_one_hot_lookup(one_hot_lookup)
    check_one_hot_lookup(one_hot_einsum)
    check_refuse_out_of_range(refuse_out_of_range)
    check_init_table(init_table)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * 6, lines


def test_a_crash_is_reported_with_its_cause():
    def crashes(table, ids):
        return torch.stack([table[i] for i in ids.reshape(-1)]).reshape(*ids.shape, table.shape[1])  # no empty ids
    with pytest.raises(AssertionError, match=r"^lookup\(.*\(0,\)\) raised RuntimeError"):
        check_lookup(crashes)


CATALOGUES = [Catalogue(check_lookup, LOOKUP_MUTANTS, right=lookup),
              Catalogue(check_one_hot_lookup, ONE_HOT_MUTANTS, right=one_hot_lookup, exclusive=False, distinct="none",
                        ids=[f"{i}: {p}" for i, (_, p) in enumerate(ONE_HOT_MUTANTS)]),
              Catalogue(check_refuse_out_of_range, RANGE_MUTANTS),
              Catalogue(check_init_table, INIT_MUTANTS, right=init_table, exclusive=False, distinct="none",
                        ids=[f"{i}: {p}" for i, (_, p) in enumerate(INIT_MUTANTS)])]

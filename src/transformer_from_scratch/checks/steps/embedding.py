"""Self-checks for the steps of notebook 02 (Embedding): a lookup of any shape, the one-hot view, the range check,
the table's initialisation."""

from __future__ import annotations

import re
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .._harness import (TRUNCATED_STD as _TRUNCATED_STD, BuiltinSpy, attempt, call, crashed, diagnose, expect_tensor,
                        fail, first_line, generator, passed, truncated_std)

_NO_EMBEDDING = {F.embedding: "F.embedding", torch.embedding: "torch.embedding"}
_CUT_AT_2_STD = truncated_std(2.0)  # 0.8796, trunc_normal_'s default cut


def _shape(shape: tuple[int, ...]) -> str:
    return "()" if not shape else f"({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''})"


def check_lookup(lookup: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Check ``lookup(table, ids)``: row ``ids[...]`` of the (V, d) table for every id, (...) -> (..., d), a copy.

    Ids of shape (4,) on a square table first (it hides a lookup of columns from the shapes), then (5,), (2, 4),
    (2, 3, 2), (1,), () and the empty (0,) and (2, 0) on a 7 x 3 table. Mistakes it recognises: columns looked up
    instead of rows; the ids' leading shape lost (the rows returned as (N, d)); a 0-d id answered with a view of the
    table (plain indexing with a 0-d tensor), not a copy; reshape(..., -1), which cannot work out the row length when
    there are no ids; F.embedding used (the built-in this notebook builds).
    """
    gen = generator(0)
    fix = "flatten the ids, gather those rows of the table, reshape to the ids' shape followed by d"
    cases = [((4, 4), (4,)), ((7, 3), (5,)), ((7, 3), (2, 4)), ((7, 3), (2, 3, 2)), ((7, 3), (1,)), ((7, 3), ()),
             ((7, 3), (0,)), ((7, 3), (2, 0))]
    for (V, d), shape in cases:
        table = torch.randn(V, d, generator=gen, dtype=torch.float64)
        ids = torch.randint(0, V, shape, generator=gen)
        if len(shape) == 1 and shape[0] >= 4:
            ids[0], ids[1], ids[-1] = V - 1, 0, ids[2]  # both ends of the range, and a repeated id
        what = f"lookup(table of shape {(V, d)}, ids of shape {_shape(shape)})"
        with BuiltinSpy(_NO_EMBEDDING) as spy:
            out, error = attempt(what, lookup, table, ids)
        if spy.used:
            fail(f"{what} calls PyTorch's own {spy.used[0]}, the built-in this notebook builds",
                 "gather the rows yourself: index the table with the ids (or torch.index_select)")
        if error is not None:
            if isinstance(error, IndexError) and "out of bounds" in str(error) and f"size {d}" in str(error):
                fail("lookup reads columns of the table (table[:, ids] or table.T[ids]) instead of rows",
                     "the table has one row per token: index its first dimension",
                     f"{what}: {type(error).__name__}: {first_line(error)}")
            if ids.numel() == 0 and "-1" in str(error):
                fail(f"{what} fails: reshape(..., -1) cannot work out the row length when there are no ids",
                     "reshape to the ids' shape followed by table.shape[-1], the row length, not -1",
                     f"{type(error).__name__}: {first_line(error)}")
            crashed(what, error)
        expected = table[ids.reshape(-1)].reshape(*shape, d)
        if isinstance(out, torch.Tensor) and len(shape) != 1 and tuple(out.shape) == (ids.numel(), d) \
                and torch.equal(out, expected.reshape(-1, d)):
            fail(f"{what} returned shape {tuple(out.shape)}, expected {tuple(expected.shape)}: the ids' leading "
                 "shape is lost", "reshape the gathered (N, d) rows to the ids' shape followed by d")
        out = expect_tensor(what, out, expected.shape, fix, dtype=table.dtype)
        diagnose(what, out, expected, [
            (lambda: table.T[ids], "lookup reads columns of the table (table.T[ids]) instead of rows",
             "the table has one row per token: index its first dimension"),
            (lambda: table[:, ids], "lookup reads columns of the table (table[:, ids]) instead of rows",
             "the table has one row per token: index its first dimension"),
        ], fix)
        if out.numel() and out.untyped_storage().data_ptr() == table.untyped_storage().data_ptr():
            if ids.ndim == 0:
                fail(f"{what} returns a view of the table, not a copy: writing into the result would change the "
                     "table (a 0-d tensor of ids in square brackets acts like a Python int)",
                     "flatten the ids to one dimension before gathering (a gather with a 1-D tensor of ids always "
                     "copies), then reshape")
            fail(f"{what} returns a view of the table, not a copy", "gather the rows with a 1-D tensor of ids")
    passed("lookup: rows, not columns, for ids of shape (), (1,), (5,), (2, 4), (2, 3, 2) and empty ones; "
           "always a copy")


def check_one_hot_lookup(one_hot_lookup: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Check ``one_hot_lookup(table, ids)``: the ids as one-hot rows, in the table's dtype, times the (V, d) table.

    The result must equal the lookup bit for bit, for ids of shape (5,), (2, 3) and (), float64 and float32 tables; and
    since a product with one-hot rows multiplies *every* row of the table (by 0 or 1), a NaN in a row that no id uses
    must reach every output (0 · NaN = NaN). Mistakes it recognises: the one-hot rows left as integers (or in another
    dtype than the table's), which the matrix product refuses; num_classes left out of F.one_hot (it then guesses V
    from the largest id in the batch); the product taken the other way round (the result transposed, (d, N)); rows
    looked up directly, with no product at all.
    """
    gen = generator(0)
    V, d = 6, 4
    cases = [(torch.float64, torch.tensor([5, 0, 2, 2, 1])),      # holds V - 1: F.one_hot without num_classes fits
             (torch.float64, torch.tensor([[0, 2, 1], [2, 2, 0]])),  # largest id 2: without num_classes it does not
             (torch.float64, torch.tensor(3)),
             (torch.float32, torch.tensor([1, 4, 4]))]
    for dtype, ids in cases:
        table = torch.randn(V, d, generator=gen, dtype=dtype)
        what = f"one_hot_lookup(a {dtype} table of shape {(V, d)}, ids of shape {_shape(tuple(ids.shape))})"
        out, error = attempt(what, one_hot_lookup, table, ids)
        if error is not None:
            message = str(error)
            if isinstance(error, RuntimeError) and ("dtype" in message or "scalar type" in message):
                fail("the one-hot rows are not in the table's dtype (F.one_hot returns int64), and a matrix product "
                     "needs both sides in one dtype", "convert them with .to(table.dtype) before multiplying",
                     f"{what}: {type(error).__name__}: {first_line(error)}")
            if isinstance(error, RuntimeError) and "cannot be multiplied" in message and int(ids.max()) < V - 1:
                fail("F.one_hot is called without num_classes, so it makes max(ids) + 1 columns instead of V",
                     "pass num_classes=table.shape[0]: a batch need not contain the last token of the vocabulary",
                     f"{what} with largest id {int(ids.max())}: {type(error).__name__}: {first_line(error)}")
            crashed(what, error)
        expected = table[ids.reshape(-1)].reshape(*ids.shape, d)
        if ids.ndim == 1 and isinstance(out, torch.Tensor) and tuple(out.shape) == (d, len(ids)) and \
                torch.allclose(out, expected.T):
            fail(f"{what} returned shape {tuple(out.shape)}, the transpose of the rows: the product is taken the "
                 "other way round", "one-hot rows on the left: (..., V) @ (V, d) -> (..., d)")
        out = expect_tensor(what, out, expected.shape, "one-hot rows (..., V) times the table (V, d) give (..., d)",
                            dtype=dtype)
        if not torch.equal(out, expected):
            diagnose(what, out, expected, [], "multiply the one-hot rows, in the table's dtype, by the table")
            fail(f"{what} is close to the looked-up rows but not equal bit for bit",
                 "multiply the one-hot rows by the table itself: 1 · row + 0 · every other row is exact")
    table = torch.randn(V, d, generator=gen, dtype=torch.float64)
    table[3] = float("nan")  # a row that no id below uses
    ids = torch.tensor([0, 5, 1])
    out, error = attempt("one_hot_lookup", one_hot_lookup, table, ids)
    if error is None and isinstance(out, torch.Tensor) and not torch.isnan(out).any():
        fail("one_hot_lookup looks the rows up directly, with no one-hot product: a NaN in an unused row of the table "
             "reaches no output", "build the one-hot rows of the ids and multiply them by the table: the product "
             "multiplies every row, the unused ones by 0 (and 0 · NaN is NaN)",
             f"ids {ids.tolist()}, NaN in row 3 only")
    passed("one_hot_lookup: one-hot rows times the table, equal bit for bit to the lookup for ids of shape (5,), (2, "
           "3) "
           "and (), float64 and float32; it multiplies every row of the table")


def check_refuse_out_of_range(refuse_out_of_range: Callable[[torch.Tensor, int], Any]) -> None:
    """Check ``refuse_out_of_range(ids, num_embeddings)``: nothing happens for ids in [0, num_embeddings); otherwise a
    ValueError whose message names the smallest and the largest id and the valid range. Empty ids pass.

    Mistakes it recognises: an id equal to num_embeddings let through (``> num_embeddings`` where ``>=`` is meant);
    a valid id refused (id 0, or the largest, num_embeddings - 1); negative ids let through; a crash on empty ids (the
    min and max of nothing); another exception than ValueError (an ``assert``, an IndexError); a message that does
    not name the smallest and largest id and the valid range.
    """
    V = 10
    what = lambda ids: f"refuse_out_of_range(ids {ids}, num_embeddings={V})"  # noqa: E731
    outcome = lambda ids: attempt(what(ids), refuse_out_of_range, torch.tensor(ids), V)  # noqa: E731
    for ids, refused in [([[3, 4], [5, 5]], "ids well inside the valid range"), ([0, 5], "id 0, a valid id"),
                         ([9, 5], f"the largest valid id, num_embeddings - 1 = {V - 1}")]:
        _, error = outcome(ids)
        if isinstance(error, ValueError):
            fail(f"refuse_out_of_range refuses {refused}", "valid ids are 0 ... num_embeddings - 1: refuse an id "
                 "< 0 or >= num_embeddings", f"{what(ids)}: ValueError: {first_line(error)}")
        if error is not None:
            crashed(what(ids), error)
    for shape in [(0,), (2, 0)]:
        _, error = attempt(f"refuse_out_of_range(empty ids of shape {shape}, num_embeddings={V})",
                            refuse_out_of_range, torch.empty(shape, dtype=torch.long), V)
        if error is not None:
            fail(f"refuse_out_of_range crashes on empty ids of shape {shape} ({type(error).__name__}: "
                 f"{first_line(error)})", "check only when ids.numel() > 0: the min and max of nothing are undefined")
    for ids, mistake in [([3, 10], f"an id equal to num_embeddings ({V}) is let through, but valid ids stop at "
                          f"{V - 1} (> where >= is meant)"),
                         ([-1, 4], "negative ids are let through (plain indexing would read -1 as the last row)")]:
        _, error = outcome(ids)
        if error is None:
            fail(mistake, "raise a ValueError when the smallest id is < 0 or the largest is >= num_embeddings",
                 f"{what(ids)} raised nothing")
        if not isinstance(error, ValueError):
            fail(f"refuse_out_of_range raises {type(error).__name__}, not ValueError"
                 + (" (an assert: switched off by python -O, and its message is for programmers)"
                    if isinstance(error, AssertionError) else ""),
                 "raise ValueError(...) yourself: a wrong value of an argument is a ValueError",
                 f"{what(ids)}: {type(error).__name__}: {first_line(error)}")
    ids = [[3, -4], [12, 7]]
    _, error = outcome(ids)
    if not isinstance(error, ValueError):
        fail(f"{what(ids)} raises no ValueError, though -4 and 12 lie outside [0, {V - 1}]",
             "compare the smallest id with 0 and the largest with num_embeddings",
             "raised nothing" if error is None else f"{type(error).__name__}: {first_line(error)}")
    message = str(error)
    missing = [name for name, pattern in [("the smallest id (-4)", r"(?<![\d.])-4(?![\d.])"),
                                          ("the largest id (12)", r"(?<![\d.-])12(?![\d.])"),
                                          (f"the valid range (0 to {V - 1})", r"(?<![\d.-])(9|10)(?![\d.])")]
               if not re.search(pattern, message)]
    if missing:
        fail(f"the error message does not name {' or '.join(missing)}",
             "say what was found and what is allowed (an f-string): the smallest and largest id, and 0 ... "
             "num_embeddings - 1", f"{what(ids)} says: {message!r}")
    passed("refuse_out_of_range: ids 0 ... num_embeddings - 1 pass, and empty ids; -1 and num_embeddings raise a "
           "ValueError that names the smallest and largest id and the range")


def _draw(init_table: Callable[..., torch.Tensor], V: int, d: int, seed: int, global_seed: int = 1) -> torch.Tensor:
    """The learner's table drawn with a generator seeded ``seed`` while torch's global generator is seeded
    ``global_seed`` (so a draw that ignores the generator changes with it); the global state is put back after."""
    what = f"init_table({V}, {d}, generator=...)"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(global_seed)
        out = call(what, init_table, V, d, generator=generator(seed))
    if isinstance(out, torch.Tensor) and tuple(out.shape) == (d, V):
        fail(f"{what} returned shape {(d, V)}, the transpose of the table",
             "an embedding table has one row per token: (num_embeddings, embedding_dim), unlike Linear's (d_out, d_in)")
    return expect_tensor(what, out, (V, d), "a table of shape (num_embeddings, embedding_dim), filled in place")


def check_init_table(init_table: Callable[..., torch.Tensor]) -> None:
    """Check ``init_table(num_embeddings, embedding_dim, generator=None)``: a new table drawn from N(0, 1) cut at ±3.

    Measured on a 1024 × 256 draw: the shape, the mean, the standard deviation (0.987 after the cut), that every entry
    lies within ±3 and some come close to it, that the generator decides the draw. Mistakes it recognises: the shape
    transposed; the tensor left as torch.empty made it (never filled); no cut (torch.randn, normal_); trunc_normal_'s
    default cut at ±2; a std other than 1 (Linear's sqrt(2 / (d_in + d_out)), 1/sqrt(d), GPT-2's 0.02); the generator
    ignored.
    """
    V, d = 1024, 256
    what = f"init_table({V}, {d})"
    w = _draw(init_table, V, d, seed=0).detach().double()
    use = "fill it with torch.nn.init.trunc_normal_, mean 0, std 1, cut at a=-3, b=3"
    if not torch.isfinite(w).all() or w.abs().max() > 1e3 or w.std() < 1e-3:
        fail(f"{what} returns the tensor as torch.empty made it: its values are whatever was in memory (here "
             f"{'not finite' if not torch.isfinite(w).all() else f'std {w.std():.3g}'})", use)
    mean, std, largest = w.mean().item(), w.std().item(), w.abs().max().item()
    if abs(std - _TRUNCATED_STD) > 0.05 and abs(std - _CUT_AT_2_STD) > 0.02:
        scale = std / _TRUNCATED_STD
        fail(f"{what} has a standard deviation of {std:.4g}, not about 1 (std ≈ {scale:.3g} before the cut): the "
             "table's entries are the first activations of the model, so they start at size about 1",
             "draw with std=1 (not Linear's σ, not 1/sqrt(d), not GPT-2's 0.02)")
    if abs(mean) > 0.02:
        fail(f"{what} has mean {mean:.3g}, not 0", "draw with mean 0")
    if largest > 3 + 1e-6:
        beyond = int((w.abs() > 3 + 1e-6).sum())
        fail(f"{what}: {beyond} entries lie beyond ±3 (the largest {largest:.2f}), so nothing was cut",
             f"torch.randn and normal_ have no cut: {use}")
    if largest <= 2 + 1e-6:
        fail(f"{what} is cut at ±2 (trunc_normal_'s default a=-2, b=2), which leaves a std of {std:.3f}, not 0.987",
             "pass the cut explicitly: a=-3, b=3")
    if abs(std - _TRUNCATED_STD) > 0.01 or largest < 2.9:
        fail(f"{what} does not have the statistics of N(0, 1) cut at ±3 (std {std:.4f}, expected 0.987; largest "
             f"|entry| {largest:.3f}, expected just under 3)", use)
    again = _draw(init_table, V, d, seed=0, global_seed=2)
    if not torch.equal(again.detach().double(), w):
        fail(f"{what} gives a different table for the same generator: the generator is ignored",
             "pass generator=generator on to trunc_normal_, so that a seeded generator decides the draw")
    passed("init_table: a (num_embeddings, embedding_dim) table, N(0, 1) cut at ±3 (measured std 0.987), drawn from "
           "the generator given")

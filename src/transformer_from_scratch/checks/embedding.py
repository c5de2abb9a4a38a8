"""``check_embedding``: the learner's ``Embedding`` (notebook 02) against ``F.embedding``, with a diagnosis."""

from __future__ import annotations

import math
import warnings
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ._harness import (
    TRUNCATED_STD,
    BuiltinSpy,
    attempt,
    call,
    check_device_and_dtype,
    check_initialised,
    check_parameters,
    check_signature,
    close,
    construct,
    describe,
    expect_tensor,
    fail,
    first_line,
    generator,
    passed,
    refuse_builtins,
    truncated_std,
)

NAME = "Embedding"
SIGNATURE = ("num_embeddings", "embedding_dim", "device", "dtype")
# Non-square on purpose: a table stored transposed, (d, V), then shows in its shape.
V, D = 11, 6
# Leading shapes of the ids: the first one holds both ends of the valid range, 0 and V - 1.
LEADING_SHAPES = [(7,), (), (1,), (2, 5), (2, 3, 4)]
INIT_SIZE = (512, 64)  # 32,768 entries: the std to about ±0.004, and some entries within 0.1 of the cut


RIGHT_STD = TRUNCATED_STD  # 0.9866
DEFAULT_CUT_STD = truncated_std(2.0)  # 0.8796: trunc_normal_'s default a=-2, b=2 on N(0, 1)


def _fmt(shape: tuple[int, ...]) -> str:
    return "()" if not shape else f"({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''})"


def _check_structure(impl: Callable[..., nn.Module]) -> None:
    """No nn.Embedding inside; one parameter ``weight`` of shape (V, D), no bias, no extras."""
    module = construct(NAME, impl, V, D)
    inside = [key or "the class itself" for key, m in module.named_modules() if isinstance(m, nn.Embedding)]
    if inside:
        fail(f"{NAME} uses torch.nn.Embedding inside ({', '.join(inside)}), the built-in this notebook rebuilds",
             "create the table yourself as one nn.Parameter named weight and index it in forward")
    biases = [key for key, _ in module.named_parameters() if key.split(".")[-1] == "bias"]
    if biases:
        fail(f"{NAME} has a bias ({', '.join(biases)}), but the recipe has no biases anywhere",
             "remove it: the output is the looked-up row itself, nothing added")
    weight = dict(module.named_parameters()).get("weight")
    if weight is not None and tuple(weight.shape) == (D, V):
        fail(f"{NAME}.weight is stored transposed, shape (embedding_dim, num_embeddings) = {(D, V)}",
             "an embedding table has one row per token, shape (num_embeddings, embedding_dim), "
             "as in nn.Embedding and the course's checkpoints (unlike Linear's (d_out, d_in))")
    if weight is not None and tuple(weight.shape) != (V, D):
        fail(f"{NAME}({V}, {D}).weight has shape {tuple(weight.shape)}, "
             f"expected (num_embeddings, embedding_dim) = {(V, D)}", "one row of embedding_dim numbers per token id")
    check_parameters(module, {"weight": (V, D)}, NAME)


def _check_init(impl: Callable[..., nn.Module]) -> None:
    """The table's statistics: N(0, 1) truncated at [-3, 3], so std 0.9866 and largest |entry| just under 3."""
    vocab, d = INIT_SIZE
    check_initialised(NAME, lambda: impl(50, 8), "fill it in place with the recipe's draw, N(0, 1) truncated at ±3")
    torch.manual_seed(0)  # inside check_embedding's fork_rng: the same table every time
    module = construct(NAME, impl, vocab, d)
    w = module.weight.detach().double().cpu()
    evidence = "found mean {:+.4f}, std {:.4f}, largest |entry| {:.3f}; expected 0, {:.4f}, just under 3".format(
        w.mean().item(), w.std().item(), w.abs().max().item(), RIGHT_STD) if torch.isfinite(w).all() else ""
    use = "the recipe's draw, N(0, 1) truncated at ±3 (trunc_normal_'s cut a, b is in weight units)"
    if not torch.isfinite(w).all() or w.std().item() == 0:
        fail(f"{NAME}'s weight is constant (all {w.flatten()[0].item():g}), not drawn" if torch.isfinite(w).all()
             else f"{NAME}'s weight holds inf or NaN, so it is not initialised",
             f"draw it in reset_parameters with {use}", evidence or "it holds inf or NaN")
    mean, std, largest = w.mean().item(), w.std().item(), w.abs().max().item()
    for sigma, mistake in [(1 / math.sqrt(d), "std 1/sqrt(d_model) (a scaled init)"),
                           (math.sqrt(2 / (vocab + d)), "Linear's std sqrt(2 / (d_in + d_out)) (xavier_normal_)")]:
        if abs(std / sigma - 1) < 0.1 or abs(std / (sigma * RIGHT_STD) - 1) < 0.1:
            fail(f"{NAME} starts with the wrong scale, {mistake}: the table's entries are the first activations, "
                 "so they start at size about 1", f"use std=1: {use}", evidence)
    if largest > 3.0 + 1e-6:
        fail(f"{NAME}'s init is not truncated (an entry of {largest:.2f} lies beyond ±3)",
             f"torch.randn / nn.init.normal_ have no cut: use {use}", evidence)
    if largest <= 2.0 + 1e-6 and abs(std - DEFAULT_CUT_STD) < 0.03:
        fail(f"{NAME}'s init is cut at ±2 (trunc_normal_'s default a=-2, b=2), which leaves std {DEFAULT_CUT_STD:.3f}",
             f"pass the cut explicitly: {use}", evidence)
    if abs(mean) > 0.03 or abs(std - RIGHT_STD) > 0.02 or largest < 2.9:
        fail(f"{NAME}'s init does not have the statistics of N(0, 1) truncated at [-3, 3]", f"use {use}", evidence)


def _ids(shape: tuple[int, ...], vocab: int, gen: torch.Generator) -> torch.Tensor:
    ids = torch.randint(0, vocab, shape, generator=gen)
    if shape == LEADING_SHAPES[0]:
        ids[0], ids[1], ids[-1] = vocab - 1, 0, ids[2]  # both ends of the range, and a repeated id
    return ids


def _check_not_builtin(impl: Callable[..., nn.Module]) -> None:
    module = construct(NAME, impl, V, D)
    with BuiltinSpy({F.embedding: "F.embedding", torch.embedding: "torch.embedding"}) as spy:
        attempt(f"{NAME}.forward", module, torch.tensor([[1, 4], [4, 0]]))  # a crash is diagnosed later, by shape
    refuse_builtins(f"{NAME}.forward", spy, "index the table yourself: indexing its first dimension with the ids "
                    "gathers one row per id")


def _refuses_valid_ids(module: nn.Module, vocab: int) -> None:
    """A ValueError for an end of the valid range, when an id in the middle works: an off-by-one."""
    _, control = attempt(f"{NAME}.forward", module, torch.tensor([vocab // 2]))
    if control is not None:
        return
    for valid, end in [(vocab - 1, "the largest valid id, num_embeddings - 1"), (0, "id 0")]:
        _, error = attempt(f"{NAME}.forward", module, torch.tensor([valid]))
        if isinstance(error, ValueError):
            fail(f"{NAME} refuses {end} = {valid} (an off-by-one in the range check)",
                 "valid ids are 0 ... num_embeddings - 1: refuse id < 0 or id >= num_embeddings",
                 f"ValueError: {first_line(error)}")


def _check_forward(impl: Callable[..., nn.Module]) -> None:
    """Every leading shape, float32, float64 and bfloat16, non-square and square tables, against F.embedding."""
    gen = generator(1)
    for vocab, d in [(V, D), (8, 8)]:
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            module = construct(NAME, impl, vocab, d, dtype=dtype)
            weight = module.weight.detach()
            results = []
            for shape in LEADING_SHAPES:
                ids = _ids(shape, vocab, gen)
                out, error = attempt(f"{NAME}({vocab}, {d})(ids of shape {_fmt(shape)})", module, ids)
                results.append((shape, ids, out, error))
            _diagnose_shapes(module, vocab, d, results)
            for shape, ids, out, _ in results:
                _diagnose_values(vocab, d, dtype, weight, shape, ids, out)


def _diagnose_shapes(module: nn.Module, vocab: int, d: int, results: list) -> None:
    broken = [(shape, out, error) for shape, _, out, error in results
              if error is not None or not isinstance(out, torch.Tensor) or out.shape != (*shape, d)]
    if not broken:
        return
    if any(isinstance(error, ValueError) for _, _, error in broken):
        _refuses_valid_ids(module, vocab)
    shape, ids, out, error = results[0]
    # weight[:, ids] or weight.T[ids] on a non-square table: an id >= embedding_dim is out of bounds
    columns = isinstance(error, IndexError) and vocab != d and "out of bounds for dimension" in str(error) \
        and f"with size {d}" in str(error)
    if columns or (error is None and isinstance(out, torch.Tensor) and out.shape == (d, *shape)
                   and close(out, module.weight.detach()[ids].movedim(-1, 0))):
        found = f"raised IndexError: {first_line(error)}" if columns else f"gave shape {tuple(out.shape)}"
        fail(f"{NAME}.forward looks up columns (weight[:, ids]) instead of rows",
             "the table has one row per token: index its first dimension with the ids",
             f"ids of shape {_fmt(shape)} with values up to {vocab - 1} {found}")
    if len(broken) == len(results):
        what = f"{NAME}({vocab}, {d})(ids of shape {_fmt(shape)})"
        if error is not None:  # crashes on every shape: report the first crash in full
            call(what, module, ids)
        expect_tensor(what, out, returns="return the looked-up rows, one tensor of shape (*token_ids.shape, "
                      "embedding_dim)")
        fail(f"{NAME}({vocab}, {d}) returned {describe(out)} for ids of shape {_fmt(shape)}, expected shape "
             f"{(*shape, d)}", "one row of embedding_dim numbers per id: (...) in, (..., embedding_dim) out")
    works = [_fmt(shape) for shape, _, out, error in results if all(shape != b[0] for b in broken)]
    lines = [f"ids {_fmt(s)}: " + (f"raised {type(e).__name__}: {first_line(e)}" if e is not None
                                   else f"returned {describe(o)}, expected shape {(*s, d)}") for s, o, e in broken]
    fail(f"{NAME} handles ids of shape {', '.join(works)} but not {', '.join(_fmt(b[0]) for b in broken)}",
         "accept any leading shape: flatten the ids, gather the rows, reshape to (*token_ids.shape, embedding_dim)",
         "\n".join(lines))


def _diagnose_values(vocab: int, d: int, dtype: torch.dtype, weight: torch.Tensor, shape: tuple[int, ...],
                     ids: torch.Tensor, out: torch.Tensor) -> None:
    expected = F.embedding(ids, weight)
    where = f"{NAME}({vocab}, {d}, dtype={dtype}) on ids of shape {_fmt(shape)}"
    expect_tensor(where, out)
    if close(out, expected):
        if out.dtype != dtype:
            fail(f"{where} returns {out.dtype}: the output must keep the table's dtype",
                 "return the gathered rows as they are (no .float(), no .to(...))")
        return
    if close(out, expected * math.sqrt(d)):
        fail(f"{NAME}.forward multiplies the rows by sqrt(d_model) (the original Transformer paper's scaling), "
             "which the course's recipe does not use", "return the rows unscaled, as the table holds them")
    if vocab == d and close(out, F.embedding(ids, weight.T)):
        fail(f"{NAME}.forward reads columns of the table (weight.T[ids] or weight[:, ids]) instead of rows; "
             f"{vocab} x {d} is square, so only the values show it",
             "the table has one row per token: index its first dimension")
    error = (out.double() - expected.double()).abs().max().item()
    fail(f"{where} differs from F.embedding(ids, weight) by up to {error:.3g}",
         "return row token_ids[...] of weight for every id, nothing added, nothing scaled")


def _check_integer_dtypes(impl: Callable[..., nn.Module]) -> None:
    """Ids of every other integer dtype give the same rows as int64 ids (uint8 is not a mask)."""
    module = construct(NAME, impl, V, D)
    ids = torch.tensor([1, 1, 10, 3, 2, 9, 8, 7, 5, 6, 4])  # V = 11 ids, none 0: as a mask they select every row
    expected = F.embedding(ids, module.weight.detach())
    # int32 first (the common one), then uint8, where plain indexing goes wrong first
    for dtype in (torch.int32, torch.uint8, torch.int16, torch.int8, torch.uint16, torch.uint32, torch.uint64):
        with warnings.catch_warnings():  # indexing with uint8 warns that it is a (deprecated) mask: our verdict says so
            warnings.simplefilter("ignore")
            out, error = attempt(f"{NAME}.forward on {dtype} ids", module, ids.to(dtype))
        if error is None and close(out, expected):
            continue
        as_mask = error is None and close(out, module.weight.detach())
        if dtype == torch.uint8 and (as_mask or (error is not None and "mask" in str(error))):
            fail(f"{NAME} takes uint8 ids as a mask (in square brackets a uint8 tensor selects rows where it is "
                 "nonzero)", "convert the ids with token_ids.long() before indexing",
                 f"ids {ids.tolist()} as uint8 gave " + (describe(out) if error is None else first_line(error)))
        found = f"raised {type(error).__name__}: {first_line(error)}" if error is not None else \
            f"returned {describe(out)}, not the rows int64 ids give"
        fail(f"{NAME} does not accept {dtype} ids ({found})",
             "every integer dtype holds token ids: convert them with token_ids.long() before the lookup")


def _check_bool_refused(impl: Callable[..., nn.Module]) -> None:
    module = construct(NAME, impl, V, D)
    out, error = attempt(f"{NAME}.forward on bool ids", module, torch.arange(V) % 2 == 0)
    if error is None:
        fail(f"{NAME} accepts a bool tensor as ids (it returned {describe(out)}): a bool tensor is a mask",
             "raise a TypeError for ids that are not of an integer dtype (bool included)")


def _check_out_of_range(impl: Callable[..., nn.Module]) -> None:
    """Negative ids and ids >= num_embeddings raise ValueError (the course's decision, see the docstring)."""
    module = construct(NAME, impl, V, D)
    for ids, mistake, fix in [
        ([2, -1], "negative ids wrap around silently (-1 reads the last row, a real token's vector)",
         "check the ids and raise a ValueError when any is < 0"),
        ([3, V], f"an id >= num_embeddings is not refused (id {V} with num_embeddings={V})",
         "check the ids and raise a ValueError when any is >= num_embeddings: on a GPU, an id past the end "
         "is an unreadable device-side assert"),
    ]:
        out, error = attempt(f"{NAME}.forward on ids {ids}", module, torch.tensor(ids))
        if isinstance(error, ValueError):
            continue
        if error is None:
            fail(f"{NAME}: {mistake}", fix, f"ids {ids} returned {describe(out)}, no error")
        fail(f"{NAME}: out-of-range ids {ids} raise {type(error).__name__} from inside PyTorch, not the ValueError "
             "the docstring promises", fix.replace("check the ids and ", "check them yourself first and "),
             f"{type(error).__name__}: {first_line(error)}")


def _check_empty(impl: Callable[..., nn.Module]) -> None:
    module = construct(NAME, impl, V, D)
    for shape in [(0,), (2, 0)]:
        out, error = attempt(f"{NAME}.forward on empty ids", module, torch.empty(shape, dtype=torch.long))
        if error is not None:
            fail(f"{NAME} crashes on empty ids of shape {_fmt(shape)} ({type(error).__name__}: {first_line(error)})",
                 "skip the range check when token_ids.numel() == 0 (min and max of nothing are undefined)")
        if not isinstance(out, torch.Tensor) or out.shape != (*shape, D):
            fail(f"{NAME} returned {describe(out)} for empty ids of shape {_fmt(shape)}, expected shape {(*shape, D)}",
                 "reshape the gathered rows to (*token_ids.shape, embedding_dim)")


def _check_gradient(impl: Callable[..., nn.Module]) -> None:
    """weight.grad equals the one-hot rule: each looked-up row sums the upstream rows of its ids."""
    module = construct(NAME, impl, V, D, dtype=torch.float64)
    ids = torch.tensor([[3, 1, 3], [3, 0, 7]])  # 3 three times; 1, 0, 7 once; the other rows never
    upstream = torch.randn(2, 3, D, generator=generator(2), dtype=torch.float64)
    out = call(f"{NAME}.forward", module, ids)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        fail(f"No gradient reaches {NAME}.weight: the output is cut off from the table",
             "return the rows of the weight itself, so that autograd sees the lookup: no .detach(), no .data, no "
             "torch.no_grad(), no new tensor from its values")
    call("backward through your output", (out * upstream).sum().backward)
    grad = module.weight.grad
    expected = torch.zeros(V, D, dtype=torch.float64).index_add_(0, ids.flatten(), upstream.reshape(-1, D))
    if grad is None:
        fail(f"No gradient reaches {NAME}.weight", "the output must be computed from self.weight itself")
    if close(grad, expected):
        return
    unused = torch.ones(V, dtype=torch.bool)
    unused[ids.flatten()] = False
    evidence = f"rows looked up: {sorted(set(ids.flatten().tolist()))} (id 3 three times)"
    if grad.shape == expected.shape and grad[unused].abs().max().item() > 0:
        fail(f"A gradient reaches rows of {NAME}.weight that were not looked up",
             "only the rows of the ids in the batch may get a gradient (the one-hot view: OH(t)^T G)", evidence)
    singles = torch.tensor([0, 1, 7])
    if grad.shape == expected.shape and close(grad[singles], expected[singles]):
        fail(f"Repeated ids do not add up their gradients in {NAME}.weight (id 3, looked up three times, "
             "does not get the sum of its three upstream rows)",
             "accumulate: index_add_ (or let autograd differentiate weight[ids]), never grad[ids] = G", evidence)
    fail(f"{NAME}.weight.grad differs from the one-hot rule (each row sums the upstream rows of its ids)",
         "let autograd differentiate the lookup weight[ids]", evidence)


def check_embedding(impl: Callable[..., nn.Module]) -> None:
    """Check a learner's ``Embedding`` class against ``F.embedding`` and the course's specification.

    What it checks, in this order: the signature ``(num_embeddings, embedding_dim, device=None,
    dtype=None)``; one parameter ``weight`` of shape (num_embeddings, embedding_dim) and nothing else;
    ``device`` and ``dtype`` honoured; the init's statistics on a 512 x 64 table (mean 0, std 0.9866,
    cut at ±3); that ``F.embedding`` / ``torch.embedding`` are not called (watched for during one call, under any
    name); the output against ``F.embedding`` for ids of shape (7,), (), (1,),
    (2, 5), (2, 3, 4), float32, float64 and bfloat16 tables, 11 x 6 and 8 x 8; ids of every integer
    dtype (int32, uint8, int16, int8, uint16, uint32, uint64 against int64); a bool tensor refused; a
    ValueError for ids out of range; empty ids; the gradient of the table (float64, repeated ids).

    Out-of-range ids: the contract (CONTRACT.md) asks for a ``ValueError`` for an id outside [0, num_embeddings),
    and plain indexing reads row V - 1 for the id -1 without a word. So this check counts a silent wrap-around as a
    failure, and asks for a ``ValueError`` for ids < 0 and >= num_embeddings alike (PyTorch's own IndexError for a
    too-large id on the CPU is a device-side assert on a GPU).

    Mistakes it recognises by name:

    * the class is, or holds, an ``nn.Embedding``; or forward calls ``F.embedding`` / ``torch.embedding``
    * the weight stored transposed, (embedding_dim, num_embeddings); a bias or another extra parameter
    * ``device`` or ``dtype`` ignored
    * the wrong init: std 1/sqrt(d_model); Linear's std sqrt(2 / (d_in + d_out)); no truncation
      (``randn``); ``trunc_normal_`` with its default cut a=-2, b=2 (std 0.88 instead of 0.987);
      not initialised at all
    * only some leading shapes of the ids handled (e.g. (seq,) but not (batch, seq) or ())
    * columns looked up instead of rows; rows scaled by sqrt(d_model); the output's dtype changed
    * int32 (or another integer dtype) refused; uint8 ids taken as a mask; a bool tensor accepted as ids
    * negative ids wrapping around silently; an id >= num_embeddings not refused; an off-by-one in the
      range check (refusing id num_embeddings - 1); empty ids crashing the range check
    * no gradient reaching the weight; a gradient on rows that were not looked up; repeated ids not
      adding up their gradients
    """
    check_signature(impl, SIGNATURE, NAME)
    with torch.random.fork_rng(devices=[]):  # the same tables every time; the caller's random state is kept
        torch.manual_seed(0)
        _check_structure(impl)
        check_device_and_dtype(lambda **kwargs: impl(V, D, **kwargs), NAME)
        _check_init(impl)
        _check_not_builtin(impl)
        _check_forward(impl)
        _check_integer_dtypes(impl)
        _check_out_of_range(impl)
        _check_bool_refused(impl)
        _check_empty(impl)
        _check_gradient(impl)
    passed("check_embedding: weight (V, d) drawn from N(0, 1) cut at ±3, device/dtype, equal to F.embedding for "
           "ids (), (7,), (2, 5), (2, 3, 4) of every integer dtype, errors for bad ids, gradients")

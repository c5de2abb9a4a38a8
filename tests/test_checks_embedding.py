"""check_embedding: the reference passes with one line; every named mistake, planted in a small wrong class
written here, fails with its own first line."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_from_scratch import Embedding
from transformer_from_scratch.checks import check_embedding
from mutants import Catalogue


def integer(ids: torch.Tensor) -> torch.Tensor:
    """The ids as int64, after refusing a bool or float tensor (written here, independent of the package)."""
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise TypeError(f"integer ids expected, got {ids.dtype}")
    return ids.long()


def in_range(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """The ids as int64 after the course's checks: integers in [0, vocab)."""
    ids = integer(ids)
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"ids must be in [0, {vocab - 1}]")
    return ids


class Good(nn.Module):
    """A small right Embedding; every mutant below changes one thing."""

    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.trunc_normal_(self.weight, 0.0, 1.0, -3.0, 3.0)

    def forward(self, token_ids):
        ids = in_range(token_ids, self.num_embeddings)
        return self.weight[ids.reshape(-1)].reshape(*ids.shape, self.embedding_dim)


# --- structure ---------------------------------------------------------------------------------------------

class HoldsNnEmbedding(nn.Module):
    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        super().__init__()
        self.table = nn.Embedding(num_embeddings, embedding_dim, device=device, dtype=dtype)

    def forward(self, token_ids):
        return self.table(token_ids)


class IsNnEmbedding(nn.Embedding):
    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        super().__init__(num_embeddings, embedding_dim, device=device, dtype=dtype)


class CallsFEmbedding(Good):
    def forward(self, token_ids):
        return F.embedding(in_range(token_ids, self.num_embeddings), self.weight)


class Transposed(Good):
    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        nn.Module.__init__(self)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = nn.Parameter(torch.empty(embedding_dim, num_embeddings, device=device, dtype=dtype))
        self.reset_parameters()

    def forward(self, token_ids):
        return self.weight.T[in_range(token_ids, self.num_embeddings)]


class WithBias(Good):
    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        super().__init__(num_embeddings, embedding_dim, device, dtype)
        self.bias = nn.Parameter(torch.zeros(embedding_dim, device=device, dtype=dtype))


class ExtraScale(Good):
    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        super().__init__(num_embeddings, embedding_dim, device, dtype)
        self.scale = nn.Parameter(torch.ones((), device=device, dtype=dtype))


class IgnoresDtype(Good):
    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        super().__init__(num_embeddings, embedding_dim, device=device)


class IgnoresDevice(Good):
    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        super().__init__(num_embeddings, embedding_dim, dtype=dtype)


# --- initialisation ----------------------------------------------------------------------------------------

class StdOneOverSqrtD(Good):
    def reset_parameters(self):
        std = 1 / math.sqrt(self.embedding_dim)
        nn.init.trunc_normal_(self.weight, 0.0, std, -3 * std, 3 * std)


class LinearStd(Good):
    def reset_parameters(self):
        std = math.sqrt(2 / (self.num_embeddings + self.embedding_dim))
        nn.init.trunc_normal_(self.weight, 0.0, std, -3 * std, 3 * std)


class NotTruncated(Good):
    def reset_parameters(self):
        nn.init.normal_(self.weight)


class DefaultCut(Good):
    def reset_parameters(self):
        nn.init.trunc_normal_(self.weight)  # a=-2, b=2


class Zeros(Good):
    def reset_parameters(self):
        nn.init.zeros_(self.weight)


class NeverFilled(Good):
    def reset_parameters(self):
        pass  # the table stays as torch.empty made it


# --- forward -----------------------------------------------------------------------------------------------

class OnlyBatchSeq(Good):
    def forward(self, token_ids):
        batch, seq = token_ids.shape
        return self.weight[in_range(token_ids, self.num_embeddings).reshape(-1)].reshape(batch, seq, -1)


class IndexSelect(Good):
    def forward(self, token_ids):
        return torch.index_select(self.weight, 0, in_range(token_ids, self.num_embeddings))


class Columns(Good):
    def forward(self, token_ids):
        return self.weight[:, in_range(token_ids, self.num_embeddings)]


class ScaledBySqrtD(Good):
    def forward(self, token_ids):
        return super().forward(token_ids) * math.sqrt(self.embedding_dim)


class CastsToFloat32(Good):
    def forward(self, token_ids):
        return super().forward(token_ids).float()


class OneHotInt64Only(Good):
    def forward(self, token_ids):
        if token_ids.numel() and (token_ids.min() < 0 or token_ids.max() >= self.num_embeddings):
            raise ValueError("out of range")
        return F.one_hot(token_ids, self.num_embeddings).to(self.weight.dtype) @ self.weight


class Uint8AsMask(Good):
    def forward(self, token_ids):
        if token_ids.numel() and (token_ids.min() < 0 or token_ids.max() >= self.num_embeddings):
            raise ValueError("out of range")
        return self.weight[token_ids.reshape(-1)].reshape(*token_ids.shape, self.embedding_dim)


class BoolAccepted(Good):
    def forward(self, token_ids):
        ids = token_ids.long()
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.num_embeddings):
            raise ValueError("out of range")
        return self.weight[ids]


# --- ids out of range --------------------------------------------------------------------------------------

class NoRangeCheck(Good):
    def forward(self, token_ids):
        return self.weight[integer(token_ids)]


class OnlyNegativeCheck(Good):
    def forward(self, token_ids):
        ids = integer(token_ids)
        if ids.numel() and ids.min() < 0:
            raise ValueError("negative id")
        return self.weight[ids]


class ClampsLargeIds(Good):
    def forward(self, token_ids):
        ids = integer(token_ids)
        if ids.numel() and ids.min() < 0:
            raise ValueError("negative id")
        return self.weight[ids.clamp(max=self.num_embeddings - 1)]


class OffByOne(Good):
    def forward(self, token_ids):
        ids = integer(token_ids)
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.num_embeddings - 1):
            raise ValueError("out of range")
        return self.weight[ids]


class EmptyCrashes(Good):
    def forward(self, token_ids):
        ids = integer(token_ids)
        if ids.min() < 0 or ids.max() >= self.num_embeddings:
            raise ValueError("out of range")
        return self.weight[ids]


# --- gradients ---------------------------------------------------------------------------------------------

class Detached(Good):
    def forward(self, token_ids):
        return self.weight.detach()[in_range(token_ids, self.num_embeddings)]


class _Lookup(torch.autograd.Function):
    """weight[ids] with a hand-written backward; ``mode`` plants a mistake in it."""

    @staticmethod
    def forward(ctx, weight, ids, mode):
        ctx.save_for_backward(ids)
        ctx.shape, ctx.mode = weight.shape, mode
        return weight[ids]

    @staticmethod
    def backward(ctx, grad_out):
        (ids,) = ctx.saved_tensors
        grad = grad_out.new_zeros(ctx.shape)
        if ctx.mode == "overwrite":
            grad[ids.reshape(-1)] = grad_out.reshape(-1, ctx.shape[1])  # one write per row wins
        else:
            grad.index_add_(0, ids.reshape(-1), grad_out.reshape(-1, ctx.shape[1]))
            grad += 1e-3  # leaks onto every row
        return grad, None, None


class RepeatsOverwrite(Good):
    def forward(self, token_ids):
        return _Lookup.apply(self.weight, in_range(token_ids, self.num_embeddings), "overwrite")


class GradientOnEveryRow(Good):
    def forward(self, token_ids):
        return _Lookup.apply(self.weight, in_range(token_ids, self.num_embeddings), "leak")


def wrong_signature_class():
    class Swapped(Good):
        def __init__(self, embedding_dim, num_embeddings, device=None, dtype=None):
            super().__init__(num_embeddings, embedding_dim, device, dtype)
    return Swapped


MUTANTS = [
    (HoldsNnEmbedding, "uses torch.nn.Embedding inside"),
    (IsNnEmbedding, "uses torch.nn.Embedding inside"),
    (CallsFEmbedding, "calls PyTorch's own F.embedding"),
    (Transposed, "stored transposed"),
    (WithBias, "has a bias"),
    (ExtraScale, "parameters are named"),
    (IgnoresDtype, "ignores its dtype"),
    (IgnoresDevice, "ignores its device"),
    (StdOneOverSqrtD, "std 1/sqrt(d_model)"),
    (LinearStd, "Linear's std"),
    (NotTruncated, "not truncated"),
    (DefaultCut, "cut at ±2"),
    (Zeros, "constant (all 0), not drawn"),
    (NeverFilled, "never initialised: it holds whatever torch.empty left"),
    (OnlyBatchSeq, "handles ids of shape (2, 5) but not (7,), (), (1,), (2, 3, 4)"),
    (IndexSelect, "handles ids of shape (7,), (1,) but not (), (2, 5), (2, 3, 4)"),
    (Columns, "looks up columns"),
    (ScaledBySqrtD, "multiplies the rows by sqrt(d_model)"),
    (CastsToFloat32, "must keep the table's dtype"),
    (OneHotInt64Only, "does not accept torch.int32 ids"),
    (Uint8AsMask, "takes uint8 ids as a mask"),
    (BoolAccepted, "accepts a bool tensor"),
    (NoRangeCheck, "negative ids wrap around silently"),
    (OnlyNegativeCheck, "from inside PyTorch"),
    (ClampsLargeIds, "id >= num_embeddings is not refused"),
    (OffByOne, "refuses the largest valid id"),
    (EmptyCrashes, "crashes on empty ids"),
    (Detached, "No gradient reaches"),
    (RepeatsOverwrite, "Repeated ids do not add up"),
    (GradientOnEveryRow, "rows of Embedding.weight that were not looked up"),
    (wrong_signature_class(), "signature is (embedding_dim, num_embeddings"),
]


def test_the_reference_passes_with_one_line(capsys):
    assert check_embedding(Embedding) is None
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("✓ check_embedding:")


def test_the_test_files_own_right_class_passes(capsys):
    check_embedding(Good)  # the mutants below differ from it in one place each
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_the_builtins_are_restored_even_when_the_check_fails():
    before = (F.embedding, torch.embedding)
    with pytest.raises(AssertionError):
        check_embedding(CallsFEmbedding)
    assert (F.embedding, torch.embedding) == before


CATALOGUES = [Catalogue(check_embedding, MUTANTS, right=Embedding, exclusive=False,
                        shared=frozenset({"uses torch.nn.Embedding inside"}),  # two plantings of one mistake
                        ids=[m.__name__ for m, _ in MUTANTS])]

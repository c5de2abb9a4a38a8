# Generated from notebooks/02_embedding.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: 765b1ac0548451a7c984cf2bfa04d4262921e5f0f8aa5fe9bab4b1f60fcadfba

import torch
from jaxtyping import Float, Shaped
from torch import Tensor, nn

# Every integer dtype can hold token ids; bool is not one of them (a bool tensor in square brackets is a mask). The rule
# lives in shapes.is_integer_dtype, which every module that takes ids or positions asks.
from transformer_from_scratch.shapes import is_integer_dtype, shape_checked


def _checked_ids(token_ids: Tensor, num_embeddings: int) -> Tensor:
    """token_ids as int64, after checking that they are integers in [0, num_embeddings).

    Raises TypeError for a tensor of another dtype (float, bool). Raises ValueError when an id is < 0 or
    >= num_embeddings, naming the smallest and largest id found and the valid range. Empty ids pass.
    """
    if not is_integer_dtype(token_ids.dtype):
        hint = "; a bool tensor would act as a mask, not as ids" if token_ids.dtype == torch.bool else ""
        raise TypeError(
            f"Embedding expects integer token ids (e.g. torch.long), got a tensor of dtype {token_ids.dtype}{hint}"
        )
    ids = token_ids.long()  # int64 holds every id, and int64 in square brackets always means "ids"
    if torch.compiler.is_compiling():  # a branch on the ids' values would break the graph
        return ids
    if ids.numel() > 0:
        low, high = torch.stack(torch.aminmax(ids)).tolist()  # one read-back from the device
        if low < 0 or high >= num_embeddings:
            n_bad = int(((ids < 0) | (ids >= num_embeddings)).sum())
            raise ValueError(
                f"token ids must be in [0, {num_embeddings - 1}] (num_embeddings={num_embeddings}), "
                f"got ids from {low} to {high}: {n_bad} of {ids.numel()} out of range"
            )
    return ids


class Embedding(nn.Module):
    """A learned lookup table: token ids of any shape (...) -> vectors of shape (..., embedding_dim).

    Equivalent to multiplying one-hot rows by the table, computed as a gather (no FLOPs). The table is
    the parameter `weight`, of shape (num_embeddings, embedding_dim) like torch.nn.Embedding's, drawn
    from N(0, 1) truncated at [-3, 3].

    Args:
        num_embeddings: vocabulary size V; valid token ids are 0 ... V - 1.
        embedding_dim: size d_model of each vector.
        device, dtype: where and in which dtype to create the weight (default: torch's defaults).

    Raises (in forward):
        TypeError: the ids are not an integer tensor (float, bool, or not a tensor at all).
        ValueError: an id is negative or >= num_embeddings. Checking reads the ids' min and max back
            from the device, one synchronisation per call: the price of a clear error instead of
            PyTorch's asynchronous CUDA device-side assert.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, device=None, dtype=None) -> None:
        super().__init__()
        if num_embeddings < 1 or embedding_dim < 1:
            raise ValueError(
                f"Embedding needs positive sizes, got num_embeddings={num_embeddings}, embedding_dim={embedding_dim}"
            )
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw every entry of the table from N(0, 1) truncated at [-3, 3]."""
        nn.init.trunc_normal_(self.weight, mean=0.0, std=1.0, a=-3.0, b=3.0)

    @shape_checked
    def forward(self, token_ids: Shaped[Tensor, "*batch"]) -> Float[Tensor, "*batch d_model"]:
        """Row token_ids[...] of the table for every id, as a copy: (...) -> (..., embedding_dim)."""
        ids = _checked_ids(token_ids, self.num_embeddings)
        rows = torch.index_select(self.weight, 0, ids.reshape(-1))  # one row per token: (N, d_model), a copy
        return rows.reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"num_embeddings={self.num_embeddings}, embedding_dim={self.embedding_dim}"

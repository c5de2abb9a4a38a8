"""check_multihead_self_attention passes the reference and names each classic mistake, planted here as a small
wrong MultiHeadSelfAttention."""

import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from transformer_from_scratch import Linear, MultiHeadSelfAttention, RotaryPositionalEmbedding, scaled_dot_product_attention
from transformer_from_scratch.checks import check_multihead_self_attention
from mutants import Catalogue


class Steps(MultiHeadSelfAttention):
    """The reference computation, one step per method, so that each mutant below changes exactly one step."""

    def __init__(self, d_model, num_heads, max_seq_len=None, theta=None, device=None, dtype=None, *, fused=False):
        super().__init__(d_model, num_heads, max_seq_len, theta, device=device, dtype=dtype, fused=fused)
        self.setup()

    def setup(self):
        """A hook for the mutants that change what __init__ creates."""

    def split(self, t):
        return rearrange(t, "... s (h d) -> ... h s d", h=self.num_heads)

    def merge(self, t):
        return rearrange(t, "... h s d -> ... s (h d)")

    def positions(self, token_positions, seq):
        positions = torch.arange(seq) if token_positions is None else token_positions
        return positions.unsqueeze(-2)

    def rotate(self, q, k, v, token_positions):
        if self.rope is None:
            return q, k, v
        return self.rotated(q, k, v, self.positions(token_positions, q.shape[-2]))

    def rotated(self, q, k, v, positions):
        return self.rope(q, positions), self.rope(k, positions), v

    def mask(self, seq):
        return torch.tril(torch.ones(seq, seq, dtype=torch.bool))

    def attend(self, q, k, v):
        return scaled_dot_product_attention(q, k, v, self.mask(q.shape[-2]))

    def project(self, x):
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def finish(self, merged):
        return self.output_proj(merged)

    def forward(self, x, token_positions=None):
        q, k, v = (self.split(t) for t in self.project(x))
        q, k, v = self.rotate(q, k, v, token_positions)
        return self.finish(self.merge(self.attend(q, k, v)))


# --- splitting and merging the heads -------------------------------------------------------------------------

class SplitNoTranspose(Steps):
    def split(self, t):
        *lead, seq, d = t.shape
        return t.reshape(*lead, self.num_heads, seq, d // self.num_heads)

    def merge(self, t):
        *lead, h, seq, d_k = t.shape
        return t.reshape(*lead, seq, h * d_k)


class SplitNoTransposeMergeRight(SplitNoTranspose):
    merge = Steps.merge


class MergeNoTranspose(Steps):
    merge = SplitNoTranspose.merge


class Strided(Steps):
    def split(self, t):
        return rearrange(t, "... s (d h) -> ... h s d", h=self.num_heads)

    def merge(self, t):
        return rearrange(t, "... h s d -> ... s (d h)")


# --- the mask and the scale ----------------------------------------------------------------------------------

class NotCausal(Steps):
    def attend(self, q, k, v):
        return scaled_dot_product_attention(q, k, v)


class FlippedMask(Steps):
    def mask(self, seq):
        return torch.triu(torch.ones(seq, seq, dtype=torch.bool))


class DiagonalMasked(Steps):
    def mask(self, seq):
        return torch.tril(torch.ones(seq, seq, dtype=torch.bool), diagonal=-1)


class ScaledByDModel(Steps):
    def attend(self, q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_model)
        scores = scores.masked_fill(~self.mask(q.shape[-2]), float("-inf"))
        return torch.softmax(scores, dim=-1) @ v


class UsesBuiltin(Steps):
    def attend(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# --- RoPE ------------------------------------------------------------------------------------------------------

class RopeOnV(Steps):
    def rotated(self, q, k, v, positions):
        return self.rope(q, positions), self.rope(k, positions), self.rope(v, positions)


class RopeBeforeSplit(Steps):
    def __init__(self, d_model, num_heads, max_seq_len=None, theta=None, device=None, dtype=None):
        super().__init__(d_model, num_heads, max_seq_len, theta, device=device, dtype=dtype)
        self.rope_d_model = None if theta is None else RotaryPositionalEmbedding(theta, d_model, max_seq_len, device)

    def project(self, x):
        q, k, v = super().project(x)
        if self.rope_d_model is not None:
            positions = torch.arange(x.shape[-2]) if self._positions is None else self._positions
            q, k = self.rope_d_model(q, positions), self.rope_d_model(k, positions)
        return q, k, v

    def rotate(self, q, k, v, token_positions):
        return q, k, v

    def forward(self, x, token_positions=None):
        self._positions = token_positions
        return super().forward(x, token_positions)


class RopeNotApplied(Steps):
    def rotated(self, q, k, v, positions):
        return q, k, v


class RopeOnQOnly(Steps):
    def rotated(self, q, k, v, positions):
        return self.rope(q, positions), k, v


class RopeOnKOnly(Steps):
    def rotated(self, q, k, v, positions):
        return q, self.rope(k, positions), v


class PositionsIgnored(Steps):
    def positions(self, token_positions, seq):
        return torch.arange(seq)


class DefaultPositionsFromOne(Steps):
    def positions(self, token_positions, seq):
        positions = torch.arange(1, seq + 1) if token_positions is None else token_positions
        return positions.unsqueeze(-2)


class NoHeadAxis(Steps):
    def positions(self, token_positions, seq):
        return torch.arange(seq) if token_positions is None else token_positions


# --- the projections and the parameters ------------------------------------------------------------------------

class OutputProjNotApplied(Steps):
    def finish(self, merged):
        return merged


class NoOutputProj(Steps):
    def setup(self):
        del self.output_proj

    def finish(self, merged):
        return merged


class SharedProjection(Steps):
    def setup(self):
        self.k_proj = self.q_proj


class FusedQKV(Steps):
    def __init__(self, d_model, num_heads, max_seq_len=None, theta=None, device=None, dtype=None):
        super().__init__(d_model, num_heads, max_seq_len, theta, device=device, dtype=dtype)
        del self.q_proj, self.k_proj, self.v_proj
        self.qkv_proj = Linear(d_model, 3 * d_model, device=device, dtype=dtype)

    def project(self, x):
        return self.qkv_proj(x).chunk(3, dim=-1)


class WithBias(Steps):
    def __init__(self, d_model, num_heads, max_seq_len=None, theta=None, device=None, dtype=None):
        super().__init__(d_model, num_heads, max_seq_len, theta, device=device, dtype=dtype)
        self.q_proj = nn.Linear(d_model, d_model, device=device, dtype=dtype)


class WrongNames(Steps):
    def setup(self):
        self.query = self.q_proj
        del self.q_proj

    def project(self, x):
        return self.query(x), self.k_proj(x), self.v_proj(x)


class WrapsTorchMHA(nn.Module):
    def __init__(self, d_model, num_heads, max_seq_len=None, theta=None, device=None, dtype=None):
        super().__init__()
        self.inner = nn.MultiheadAttention(d_model, num_heads, bias=False, batch_first=True, device=device, dtype=dtype)

    def forward(self, x, token_positions=None):
        return self.inner(x, x, x, need_weights=False)[0]


class RopeTablesSaved(Steps):
    def setup(self):
        if self.rope is not None:
            self.register_buffer("angles", self.rope.cos_table.clone())


class UnfilledOutputProj(Steps):
    def setup(self):  # a new weight that nothing fills
        self.output_proj.weight = nn.Parameter(torch.empty_like(self.output_proj.weight))


class SameInitialWeights(Steps):
    def setup(self):
        with torch.no_grad():
            for name in ("k_proj", "v_proj", "output_proj"):
                getattr(self, name).weight.copy_(self.q_proj.weight)


class ScaledInit(Steps):
    def setup(self):
        with torch.no_grad():
            self.v_proj.weight.mul_(10.0)


class IgnoresDtype(Steps):
    def __init__(self, d_model, num_heads, max_seq_len=None, theta=None, device=None, dtype=None):
        super().__init__(d_model, num_heads, max_seq_len, theta, device=device)


class IgnoresDevice(Steps):
    def __init__(self, d_model, num_heads, max_seq_len=None, theta=None, device=None, dtype=None):
        super().__init__(d_model, num_heads, max_seq_len, theta, dtype=dtype)


class RopeNotOnDevice(Steps):
    def __init__(self, d_model, num_heads, max_seq_len=None, theta=None, device=None, dtype=None):
        super().__init__(d_model, num_heads, max_seq_len, theta, device=device, dtype=dtype)
        if theta is not None:
            self.rope = RotaryPositionalEmbedding(theta, self.d_k, max_seq_len)


class CastsToFloat32(Steps):
    def forward(self, x, token_positions=None):
        return super().forward(x, token_positions).float()


class DetachedInput(Steps):
    def forward(self, x, token_positions=None):
        return super().forward(x.detach(), token_positions)


class WrongSignature(Steps):
    def __init__(self, d_model, n_heads, max_seq_len=None, theta=None, device=None, dtype=None):
        super().__init__(d_model, n_heads, max_seq_len, theta, device=device, dtype=dtype)


class BrokenFused(Steps):
    def attend(self, q, k, v):
        if self.fused:
            return F.scaled_dot_product_attention(q, k, v)  # forgot is_causal=True
        return super().attend(q, k, v)


MUTANTS = {
    "split without transpose": (SplitNoTranspose, "heads are split without the transpose"),
    "merge without transpose": (MergeNoTranspose, "heads are merged without the transpose"),
    "strided heads": (Strided, "every num_heads-th feature"),
    "not causal": (NotCausal, "the attention is not causal"),
    "flipped mask": (FlippedMask, "the causal mask is flipped"),
    "diagonal masked": (DiagonalMasked, "hides the diagonal"),
    "scaled by sqrt(d_model)": (ScaledByDModel, "1/√d_model instead of 1/√d_k"),
    "F.sdpa in the default path": (UsesBuiltin, "calls F.scaled_dot_product_attention, though the default path"),
    "RoPE on V": (RopeOnV, "RoPE is applied to V too"),
    "RoPE before the split": (RopeBeforeSplit, "RoPE is applied before splitting the heads"),
    "RoPE not applied": (RopeNotApplied, "RoPE is not applied"),
    "RoPE on Q only": (RopeOnQOnly, "RoPE is applied to the queries only"),
    "RoPE on K only": (RopeOnKOnly, "RoPE is applied to the keys only"),
    "token_positions ignored": (PositionsIgnored, "token_positions is ignored"),
    "no head axis": (NoHeadAxis, "without a head axis"),
    "default positions from 1": (DefaultPositionsFromOne, "default positions are shifted by one"),
    "output_proj not applied": (OutputProjNotApplied, "output_proj is not applied"),
    "output_proj missing": (NoOutputProj, "has no output_proj"),
    "shared projection": (SharedProjection, "are one and the same Linear"),
    "fused qkv": (FusedQKV, "computes Q, K and V with one projection"),
    "bias": (WithBias, "has a bias (q_proj.bias)"),
    "wrong names": (WrongNames, "parameters are named"),
    "nn.MultiheadAttention": (WrapsTorchMHA, "torch.nn.MultiheadAttention"),
    "RoPE tables saved": (RopeTablesSaved, "saves extra entries in its state dict"),
    "same initial weights": (SameInitialWeights, "start with identical weights"),
    "output_proj never filled": (UnfilledOutputProj, "output_proj.weight is never initialised"),
    "wrong init": (ScaledInit, "initial std"),
    "dtype ignored": (IgnoresDtype, "ignores its dtype argument"),
    "device ignored": (IgnoresDevice, "ignores its device argument"),
    "RoPE not on the device": (RopeNotOnDevice, "creates RoPE's table"),
    "casts to float32": (CastsToFloat32, "returned torch.float32 for a torch.float64 input"),
    "detached input": (DetachedInput, "gradient with respect to the input x"),
    "wrong signature": (WrongSignature, "signature is (d_model, n_heads"),
    "fused path not causal": (BrokenFused, "fused=True) differs from the reference"),
}


def test_reference_passes_with_one_line(capsys):
    assert check_multihead_self_attention(MultiHeadSelfAttention) is None
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("✓ check_multihead_self_attention")


def test_the_step_by_step_base_of_the_mutants_passes(capsys):
    check_multihead_self_attention(Steps)
    assert capsys.readouterr().out.startswith("✓")


def test_splitting_without_the_transpose_is_named_even_when_the_merge_is_right():
    with pytest.raises(AssertionError) as error:
        check_multihead_self_attention(SplitNoTransposeMergeRight)
    assert MUTANTS["split without transpose"][1] in str(error.value).splitlines()[0]


def test_an_instance_instead_of_the_class_is_named():
    with pytest.raises(AssertionError, match="got a MultiHeadSelfAttention object, not the class"):
        check_multihead_self_attention(MultiHeadSelfAttention(12, 3))


CATALOGUES = [Catalogue(check_multihead_self_attention, list(MUTANTS.values()), right=MultiHeadSelfAttention,
                        ids=list(MUTANTS))]

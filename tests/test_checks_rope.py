"""check_rope passes the reference and names each classic mistake, planted here as a small wrong RoPE."""

import pytest
import torch
from torch import nn

from transformer_from_scratch import RotaryPositionalEmbedding
from transformer_from_scratch.checks import check_rope
from mutants import Catalogue, assert_own_verdict


class Rope(nn.Module):
    """A plain RoPE written for these tests, with one knob per classic mistake (all off: it is right)."""

    def __init__(self, theta, d_k, max_seq_len, device=None, *, exponent=lambda k, d: -2 * k / d,
                 table_length=None, register="buffer", angle_dtype=torch.float64, first_position=0):
        super().__init__()
        self.theta = theta
        k = torch.arange(d_k // 2, dtype=angle_dtype)
        positions = torch.arange(first_position, first_position + (table_length or max_seq_len), dtype=angle_dtype)
        angles = positions[:, None] * theta ** exponent(k, d_k)
        cos, sin = angles.cos().float().to(device), angles.sin().float().to(device)
        if register == "parameter":
            self.cos_table, self.sin_table = nn.Parameter(cos), nn.Parameter(sin)
        elif register == "attribute":
            self.cos_table, self.sin_table = cos, sin
        else:
            self.register_buffer("cos_table", cos, persistent=register == "persistent")
            self.register_buffer("sin_table", sin, persistent=register == "persistent")

    def tables(self, x, token_positions):
        return self.cos_table[token_positions].to(x.dtype), self.sin_table[token_positions].to(x.dtype)

    def pairs(self, x):
        return x[..., 0::2], x[..., 1::2]

    def rotate(self, even, odd, cos, sin):
        return even * cos - odd * sin, even * sin + odd * cos

    def write_back(self, even, odd):
        return torch.stack((even, odd), dim=-1).flatten(-2)

    def forward(self, x, token_positions):
        cos, sin = self.tables(x, token_positions)
        return self.write_back(*self.rotate(*self.pairs(x), cos, sin))


class Right(Rope):
    pass


class HalfSplit(Rope):
    def pairs(self, x):
        return x.chunk(2, dim=-1)

    def write_back(self, first, second):
        return torch.cat((first, second), dim=-1)


class WrittenBackHalfSplit(Rope):
    def write_back(self, even, odd):
        return torch.cat((even, odd), dim=-1)


class HalfSplitShifted(HalfSplit):
    """Half-split pairs and, on top of that, the angles of the next position: only the pairing gives it away."""

    def tables(self, x, token_positions):
        return super().tables(x, token_positions + 1)


class MixedLayouts(Rope):
    """Hugging Face's rotate_half, with cos and sin repeated for interleaved pairs."""

    def forward(self, x, token_positions):
        cos, sin = (t.repeat_interleave(2, dim=-1) for t in self.tables(x, token_positions))
        first, second = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-second, first), dim=-1) * sin


class AnglesInFloat32(Rope):
    def __init__(self, theta, d_k, max_seq_len, device=None):
        super().__init__(theta, d_k, max_seq_len, device, angle_dtype=torch.float32)


class TableFromOne(Rope):
    def __init__(self, theta, d_k, max_seq_len, device=None):
        super().__init__(theta, d_k, max_seq_len, device, first_position=1)


class PositionsMinusOne(Rope):
    def tables(self, x, token_positions):  # the angles of position i - 1 (-1 at position 0), computed directly
        d_k = self.cos_table.shape[-1] * 2
        k = torch.arange(d_k // 2, dtype=torch.float64)
        angles = (token_positions - 1).double()[..., None] * self.theta ** (-2 * k / d_k)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


class WrongDirection(Rope):
    def rotate(self, even, odd, cos, sin):
        return even * cos + odd * sin, -even * sin + odd * cos


class ExponentKOverD(Rope):
    def __init__(self, theta, d_k, max_seq_len, device=None):
        super().__init__(theta, d_k, max_seq_len, device, exponent=lambda k, d: -k / d)


class PositiveExponent(Rope):
    def __init__(self, theta, d_k, max_seq_len, device=None):
        super().__init__(theta, d_k, max_seq_len, device, exponent=lambda k, d: 2 * k / d)


class PositionsIgnored(Rope):
    def tables(self, x, token_positions):
        return super().tables(x, torch.arange(x.shape[-2]))


class ThetaIgnored(Rope):
    def __init__(self, theta, d_k, max_seq_len, device=None):
        super().__init__(10000.0, d_k, max_seq_len, device)


class Identity(Rope):
    def forward(self, x, token_positions):
        return x.clone()


class LearnableTables(Rope):
    def __init__(self, theta, d_k, max_seq_len, device=None):
        super().__init__(theta, d_k, max_seq_len, device, register="parameter")


class PersistentBuffers(Rope):
    def __init__(self, theta, d_k, max_seq_len, device=None):
        super().__init__(theta, d_k, max_seq_len, device, register="persistent")


class PlainAttributes(Rope):
    def __init__(self, theta, d_k, max_seq_len, device=None):
        super().__init__(theta, d_k, max_seq_len, device, register="attribute")


class DeviceIgnored(Rope):
    def __init__(self, theta, d_k, max_seq_len, device=None):
        super().__init__(theta, d_k, max_seq_len)


class TablesTooShort(Rope):
    def __init__(self, theta, d_k, max_seq_len, device=None):
        super().__init__(theta, d_k, max_seq_len, device, table_length=64)  # a fixed size, not max_seq_len


class PromotedToFloat32(Rope):
    def tables(self, x, token_positions):
        return self.cos_table[token_positions], self.sin_table[token_positions]


class AnglesInHalfPrecision(Rope):
    def tables(self, x, token_positions):
        k = torch.arange(self.cos_table.shape[-1], dtype=torch.float64)
        angles = (token_positions.double()[..., None] * self.theta ** (-k / self.cos_table.shape[-1])).to(x.dtype)
        return angles.cos(), angles.sin()


class Detached(Rope):
    def forward(self, x, token_positions):
        return super().forward(x.detach(), token_positions)


class RangeRefused(Rope):
    """Converts token_positions itself, which a range of positions (notebooks 08 and 12) does not survive."""

    def tables(self, x, token_positions):
        return super().tables(x, token_positions.long())


class WrongSignature(Rope):
    def __init__(self, d_k, theta, max_seq_len, device=None):
        super().__init__(theta, d_k, max_seq_len, device)


class ComplexWithoutCopy(Rope):
    """One complex multiplication, made safe with .contiguous(): a contiguous view at an odd offset is not copied."""

    def forward(self, x, token_positions):
        compute = torch.promote_types(x.dtype, torch.float32)
        cos, sin = (table[token_positions].to(compute) for table in (self.cos_table, self.sin_table))
        pairs = torch.view_as_complex(x.to(compute).unflatten(-1, (-1, 2)).contiguous())
        return torch.view_as_real(pairs * torch.complex(cos, sin)).flatten(-2).to(x.dtype)


MUTANTS = {
    "half-split pairs": (HalfSplit, "half-split pairs (x[k], x[k + d_k/2])"),
    "mixed layouts": (MixedLayouts, "mixes two layouts"),
    "angles in float32": (AnglesInFloat32, "the angles are computed in float32"),
    "table from position 1": (TableFromOne, "angles of position i + 1"),
    "positions - 1": (PositionsMinusOne, "angles of position i - 1"),
    "written back half-split": (WrittenBackHalfSplit, "written back half-split"),
    "wrong direction": (WrongDirection, "wrong direction"),
    "exponent k/d": (ExponentKOverD, "exponent k/d_k instead of 2k/d_k"),
    "theta^(+2k/d)": (PositiveExponent, "theta^(+2k/d_k)"),
    "positions ignored": (PositionsIgnored, "ignores token_positions"),
    "theta ignored": (ThetaIgnored, "ignores theta"),
    "identity": (Identity, "returns x unchanged"),
    "learnable tables": (LearnableTables, "learnable parameters"),
    "persistent buffers": (PersistentBuffers, "in its state dict"),
    "plain attributes": (PlainAttributes, "plain tensor attributes"),
    "device ignored": (DeviceIgnored, "ignores its device argument"),
    "tables too short": (TablesTooShort, "do not cover every position"),
    "promoted to float32": (PromotedToFloat32, "promoted it"),
    "angles in half precision": (AnglesInHalfPrecision, "angles are rounded to"),
    "detached": (Detached, "no gradient reaches x"),
    "range refused": (RangeRefused, "token_positions=range(7, 12)) fails"),
    "wrong signature": (WrongSignature, "signature is (d_k, theta"),
    "odd offset not copied": (ComplexWithoutCopy, "crashes on x as a contiguous view with an odd storage offset"),
}


@pytest.mark.parametrize("impl", [RotaryPositionalEmbedding, Right], ids=["reference", "test's own"])
def test_right_implementations_pass_with_one_line(impl, capsys):
    assert check_rope(impl) is None
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("✓ check_rope")


def test_tables_recomputed_in_every_call_are_fine():
    class Recomputes(nn.Module):
        def __init__(self, theta, d_k, max_seq_len, device=None):
            super().__init__()
            self.theta, self.d_k = theta, d_k

        def forward(self, x, token_positions):
            k = torch.arange(self.d_k // 2, dtype=torch.float64)
            angles = torch.as_tensor(token_positions).double()[..., None] * self.theta ** (-2 * k / self.d_k)
            cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
            even, odd = x[..., 0::2], x[..., 1::2]
            return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    check_rope(Recomputes)


def test_half_split_pairs_are_named_whatever_their_angles():
    """A half-split RoPE that is also off in its angles matches no variant: the pairs it rotates give it away."""
    assert_own_verdict(check_rope, HalfSplitShifted, "half-split pairs (x[k], x[k + d_k/2])", MUTANTS.values(),
                       except_within=True)


CATALOGUES = [Catalogue(check_rope, list(MUTANTS.values()), right=RotaryPositionalEmbedding, ids=list(MUTANTS))]

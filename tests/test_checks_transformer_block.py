"""check_transformer_block passes the reference and names each classic mistake, planted here as a small wrong
TransformerBlock."""

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from transformer_from_scratch import MultiHeadSelfAttention, SwiGLU, TransformerBlock, scaled_dot_product_attention
from transformer_from_scratch.checks import check_transformer_block
from mutants import Catalogue


class Steps(TransformerBlock):
    """The reference computation, one step per method, so that each mutant below changes exactly one step."""

    def __init__(self, d_model, num_heads, d_ff, max_seq_len, theta, device=None, dtype=None, *, fused=False):
        super().__init__(d_model, num_heads, d_ff, max_seq_len, theta, device=device, dtype=dtype, fused=fused)
        self.setup()

    def setup(self):
        """A hook for the mutants that change what __init__ creates."""

    def first(self, x, token_positions):
        return x + self.attn(self.ln1(x), token_positions)

    def second(self, y, x):
        return y + self.ffn(self.ln2(y))

    def forward(self, x, token_positions=None):
        return self.second(self.first(x, token_positions), x)


# --- the wiring ---------------------------------------------------------------------------------------------------

class PostNorm(Steps):
    def first(self, x, token_positions):
        return self.ln1(x + self.attn(x, token_positions))

    def second(self, y, x):
        return self.ln2(y + self.ffn(y))


class NormOnStream(Steps):
    def first(self, x, token_positions):
        x = self.ln1(x)
        return x + self.attn(x, token_positions)


class NormOnStreamBoth(NormOnStream):
    def second(self, y, x):
        y = self.ln2(y)
        return y + self.ffn(y)


class NormOnStreamSecond(Steps):
    def second(self, y, x):
        y = self.ln2(y)
        return y + self.ffn(y)


class NoAttentionResidual(Steps):
    def first(self, x, token_positions):
        return self.attn(self.ln1(x), token_positions)


class NoFinalAdd(Steps):
    def second(self, y, x):
        return self.ffn(self.ln2(y))


class NoResidualAtAll(NoAttentionResidual, NoFinalAdd):
    pass


class FfnReadsX(Steps):
    def second(self, y, x):
        return y + self.ffn(self.ln2(x))


class SwappedNorms(Steps):
    def first(self, x, token_positions):
        return x + self.attn(self.ln2(x), token_positions)

    def second(self, y, x):
        return y + self.ffn(self.ln1(y))


class Ln1UsedTwice(Steps):
    def second(self, y, x):
        return y + self.ffn(self.ln1(y))


class SharedNormModule(Steps):
    def setup(self):
        self.ln2 = self.ln1


class NoLn2(Steps):
    def second(self, y, x):
        return y + self.ffn(y)


# --- the attention ------------------------------------------------------------------------------------------------

class NonCausalAttention(MultiHeadSelfAttention):
    """Attention whose heads see every key (no mask), RoPE as usual."""

    def forward(self, x, token_positions=None):
        q, k, v = (rearrange(p(x), "... s (h d) -> ... h s d", h=self.num_heads)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        positions = (torch.arange(x.shape[-2]) if token_positions is None else token_positions).unsqueeze(-2)
        q, k = self.rope(q, positions), self.rope(k, positions)
        return self.output_proj(rearrange(scaled_dot_product_attention(q, k, v), "... h s d -> ... s (h d)"))


class FutureOnlyAttention(NonCausalAttention):
    """Each query sees itself and the keys after it: a flipped mask."""

    def forward(self, x, token_positions=None):
        q, k, v = (rearrange(p(x), "... s (h d) -> ... h s d", h=self.num_heads)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        positions = (torch.arange(x.shape[-2]) if token_positions is None else token_positions).unsqueeze(-2)
        q, k = self.rope(q, positions), self.rope(k, positions)
        future = torch.ones(x.shape[-2], x.shape[-2], dtype=torch.bool).triu()
        return self.output_proj(rearrange(scaled_dot_product_attention(q, k, v, future), "... h s d -> ... s (h d)"))


class NotCausal(Steps):
    def setup(self):
        state = self.attn.state_dict()
        self.attn = NonCausalAttention(self.d_model, self.num_heads, self.max_seq_len, self.theta,
                                       device=self.attn.q_proj.weight.device, dtype=self.attn.q_proj.weight.dtype)
        self.attn.load_state_dict(state)


class FutureOnly(NotCausal):
    def setup(self):
        state = self.attn.state_dict()
        self.attn = FutureOnlyAttention(self.d_model, self.num_heads, self.max_seq_len, self.theta,
                                        device=self.attn.q_proj.weight.device, dtype=self.attn.q_proj.weight.dtype)
        self.attn.load_state_dict(state)


class NoRope(Steps):
    def __init__(self, d_model, num_heads, d_ff, max_seq_len, theta, device=None, dtype=None):
        super().__init__(d_model, num_heads, d_ff, max_seq_len, theta, device=device, dtype=dtype)
        self.attn = MultiHeadSelfAttention(d_model, num_heads, device=device, dtype=dtype)

    def first(self, x, token_positions):
        return x + self.attn(self.ln1(x))


class PositionsNotPassed(Steps):
    def first(self, x, token_positions):
        return x + self.attn(self.ln1(x))


class FusedNotPassed(TransformerBlock):
    def __init__(self, d_model, num_heads, d_ff, max_seq_len, theta, device=None, dtype=None, *, fused=False):
        super().__init__(d_model, num_heads, d_ff, max_seq_len, theta, device=device, dtype=dtype)


# --- names, parameters, built-ins ---------------------------------------------------------------------------------

class WrongNames(Steps):
    def setup(self):
        self.attention_norm, self.attention, self.ffn_norm, self.feed_forward = self.ln1, self.attn, self.ln2, self.ffn
        del self.ln1, self.attn, self.ln2, self.ffn

    def forward(self, x, token_positions=None):
        y = x + self.attention(self.attention_norm(x), token_positions)
        return y + self.feed_forward(self.ffn_norm(y))


class ExtraBuffer(Steps):
    def setup(self):
        self.register_buffer("causal_mask", torch.ones(self.max_seq_len, self.max_seq_len).tril())


class WithBias(Steps):
    def setup(self):
        self.out_bias = nn.Parameter(torch.zeros(self.d_model))


class LayerNormInstead(Steps):
    def setup(self):
        self.ln1 = nn.LayerNorm(self.d_model, bias=False, device=self.ln2.weight.device, dtype=self.ln2.weight.dtype)


class FunctionalLayerNorm(Steps):
    def first(self, x, token_positions):
        normed = F.layer_norm(x, (self.d_model,), self.ln1.weight, eps=1e-5)
        return x + self.attn(normed, token_positions)


class TorchRMSNorm(Steps):
    def setup(self):
        self.ln1 = nn.RMSNorm(self.d_model, eps=1e-5, device=self.ln2.weight.device, dtype=self.ln2.weight.dtype)


class WrapsTorchEncoderLayer(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, max_seq_len, theta, device=None, dtype=None):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d_model, num_heads, d_ff, bias=False, norm_first=True,
                                                batch_first=True, device=device, dtype=dtype)

    def forward(self, x, token_positions=None):
        return self.layer(x, is_causal=True, src_mask=nn.Transformer.generate_square_subsequent_mask(x.shape[-2]))


# --- initialisation, device, dtype, gradients, signature ---------------------------------------------------------

class GainsNotOnes(Steps):
    def setup(self):
        with torch.no_grad():
            self.ln2.weight.fill_(0.5)


class ScaledProjection(Steps):
    def setup(self):
        with torch.no_grad():
            self.ffn.w1.weight.mul_(10.0)


class FfnNeverFilled(Steps):
    def setup(self):  # a new weight that nothing fills
        self.ffn.w1.weight = nn.Parameter(torch.empty_like(self.ffn.w1.weight))


class IgnoresDtype(Steps):
    def __init__(self, d_model, num_heads, d_ff, max_seq_len, theta, device=None, dtype=None):
        super().__init__(d_model, num_heads, d_ff, max_seq_len, theta, device=device)


class IgnoresDevice(Steps):
    def __init__(self, d_model, num_heads, d_ff, max_seq_len, theta, device=None, dtype=None):
        super().__init__(d_model, num_heads, d_ff, max_seq_len, theta, dtype=dtype)


class FfnIgnoresDtype(Steps):
    def setup(self):
        self.ffn = SwiGLU(self.d_model, self.d_ff, device=self.ln1.weight.device)


class CastsToFloat32(Steps):
    def forward(self, x, token_positions=None):
        return super().forward(x, token_positions).float()


class DetachedInput(Steps):
    def forward(self, x, token_positions=None):
        return super().forward(x.detach(), token_positions)


class WrongSignature(Steps):
    def __init__(self, d_model, n_heads, d_ff, max_seq_len, theta, device=None, dtype=None):
        super().__init__(d_model, n_heads, d_ff, max_seq_len, theta, device=device, dtype=dtype)


MUTANTS = {
    "post-norm": (PostNorm, "the block is post-norm"),
    "norm on the stream (attention)": (NormOnStream, "applied to the residual stream itself (x = ln1(x)"),
    "norm on the stream (both)": (NormOnStreamBoth, "the norm is applied to the residual stream itself"),
    "norm on the stream (ffn)": (NormOnStreamSecond, "(y = ln2(y) + ffn(ln2(y)))"),
    "no attention residual": (NoAttentionResidual, "the attention sub-layer has no residual connection"),
    "no final add": (NoFinalAdd, "the feed-forward sub-layer has no residual connection"),
    "no residual at all": (NoResidualAtAll, "both residual connections are missing"),
    "ffn reads x": (FfnReadsX, "the feed-forward network reads x instead of y"),
    "ln1/ln2 swapped": (SwappedNorms, "ln1 and ln2 are swapped"),
    "ln1 used twice": (Ln1UsedTwice, "ln1 is used before both sub-layers"),
    "ln1 and ln2 one module": (SharedNormModule, "ln1 and ln2 are one and the same module"),
    "ln2 not applied": (NoLn2, "ln2 is not applied"),
    "not causal": (NotCausal, "the block's attention is not causal"),
    "no RoPE": (NoRope, "the block's attention has no RoPE"),
    "token_positions not passed": (PositionsNotPassed, "token_positions is not passed on to the attention"),
    "fused not passed": (FusedNotPassed, "does not pass fused on to its attention"),
    "wrong names": (WrongNames, "parameters are named"),
    "extra buffer": (ExtraBuffer, "saves extra entries in its state dict"),
    "extra parameter": (WithBias, "expected exactly"),
    "LayerNorm module": (LayerNormInstead, "normalises with torch.nn.LayerNorm"),
    "F.layer_norm": (FunctionalLayerNorm, "calls F.layer_norm"),
    "nn.RMSNorm": (TorchRMSNorm, "contains) torch.nn.RMSNorm"),
    "nn.TransformerEncoderLayer": (WrapsTorchEncoderLayer, "torch.nn.TransformerEncoderLayer"),
    "gains not ones": (GainsNotOnes, "ln2.weight does not start at ones"),
    "projection init": (ScaledProjection, "ffn.w1.weight's initial std"),
    "dtype ignored": (IgnoresDtype, "ignores its dtype argument"),
    "ffn ignores dtype": (FfnIgnoresDtype, "ignores its dtype argument (ffn.w1.weight"),
    "device ignored": (IgnoresDevice, "ignores its device argument"),
    "casts to float32": (CastsToFloat32, "returned torch.float32 for a torch.float64 input"),
    "detached input": (DetachedInput, "gradient with respect to the input x"),
    "wrong signature": (WrongSignature, "signature is (d_model, n_heads"),
    "ffn.w1 never filled": (FfnNeverFilled, "TransformerBlock.ffn.w1.weight is never initialised"),
}


def test_reference_passes_with_one_line(capsys):
    assert check_transformer_block(TransformerBlock) is None
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("✓ check_transformer_block")


def test_the_step_by_step_base_of_the_mutants_passes(capsys):
    check_transformer_block(Steps)
    assert capsys.readouterr().out.startswith("✓")


def test_a_block_without_fused_passes_too(capsys):
    class NoFused(Steps):
        def __init__(self, d_model, num_heads, d_ff, max_seq_len, theta, device=None, dtype=None):
            super().__init__(d_model, num_heads, d_ff, max_seq_len, theta, device=device, dtype=dtype)

    check_transformer_block(NoFused)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize("mutant, named", [(PostNorm, "post-norm"), (NoFinalAdd, "final add is missing"),
                                           (NormOnStream, "residual stream itself"), (SwappedNorms, "swapped"),
                                           (FfnReadsX, "reads x instead of y"), (NotCausal, "not causal")])
def test_the_classic_mistakes_are_named_by_what_they_are(mutant, named):
    with pytest.raises(AssertionError) as error:
        check_transformer_block(mutant)
    assert named in str(error.value).splitlines()[0]


def test_attention_that_sees_the_future_in_another_way_is_found_by_the_causality_property():
    with pytest.raises(AssertionError) as error:
        check_transformer_block(FutureOnly)
    lines = str(error.value).splitlines()
    assert "the block's attention is not causal" in lines[0]
    assert "changing later tokens changed an earlier output" in lines[1]


def test_an_instance_instead_of_the_class_is_named():
    with pytest.raises(AssertionError, match="got a TransformerBlock object, not the class"):
        check_transformer_block(TransformerBlock(12, 3, 16, 16, 10000.0))


CATALOGUES = [Catalogue(check_transformer_block, list(MUTANTS.values()), right=TransformerBlock, exclusive=False,
                        ids=list(MUTANTS))]

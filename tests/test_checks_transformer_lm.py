"""check_transformer_lm passes the reference and names each classic mistake, planted here as a small wrong
TransformerLM."""

import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from transformer_from_scratch import Linear, RMSNorm, TransformerLM, scaled_dot_product_attention, softmax
from transformer_from_scratch.checks import check_transformer_lm
from mutants import Catalogue


class Steps(TransformerLM):
    """The reference computation, one step per method, so that each mutant below changes exactly one step."""

    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta, device=None,
                 dtype=None, *, fused=False, tie_embeddings=False):
        super().__init__(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta, device=device,
                         dtype=dtype, fused=fused)
        self.d_model, self.device, self.dtype = d_model, device, dtype
        self.setup()
        if tie_embeddings:
            self.tie()

    def setup(self):
        """A hook for the mutants that change what __init__ creates."""

    def tie(self):
        """tie_embeddings=True, the plain way (without the package's load_state_dict rule, which the check leaves
        alone); a hook for the mutants that tie wrongly."""
        self.lm_head.weight = self.token_embeddings.weight

    def embed(self, token_ids):
        return self.token_embeddings(token_ids)

    def run_blocks(self, x, token_positions):
        for layer in self.layers:
            x = layer(x, token_positions)
        return x

    def finish(self, x):
        return self.lm_head(self.ln_final(x))

    def forward(self, token_ids, token_positions=None):
        return self.finish(self.run_blocks(self.embed(token_ids), token_positions))


# --- what forward returns ------------------------------------------------------------------------------------

class ReturnsSoftmax(Steps):
    def finish(self, x):
        return softmax(super().finish(x), dim=-1)


class ReturnsLogSoftmax(Steps):
    def finish(self, x):
        return torch.log_softmax(super().finish(x), dim=-1)


class LastPositionOnly(Steps):
    def finish(self, x):
        return super().finish(x)[..., -1, :]


class NoLmHead(Steps):
    def finish(self, x):
        return self.ln_final(x)


# --- ln_final --------------------------------------------------------------------------------------------------

class LnFinalNotApplied(Steps):
    def finish(self, x):
        return self.lm_head(x)


class NoLnFinal(Steps):
    def setup(self):
        del self.ln_final

    def finish(self, x):
        return self.lm_head(x)


# --- the embeddings --------------------------------------------------------------------------------------------

class ScaledEmbeddings(Steps):
    def embed(self, token_ids):
        return self.token_embeddings(token_ids) * math.sqrt(self.token_embeddings.embedding_dim)


class Tied(Steps):
    def setup(self):
        self.lm_head.weight = self.token_embeddings.weight


# --- tie_embeddings=True ---------------------------------------------------------------------------------------

class TieIgnored(Steps):
    def tie(self):
        pass


class TiedByClone(Steps):
    def tie(self):
        self.lm_head.weight = nn.Parameter(self.token_embeddings.weight.detach().clone())


class TiedByDataCopy(Steps):
    def tie(self):
        self.lm_head.weight.data.copy_(self.token_embeddings.weight.data)


class TiedBySecondParameter(Steps):
    def tie(self):
        self.lm_head.weight = nn.Parameter(self.token_embeddings.weight)  # same storage, a second Parameter


class TiedTheOtherWay(Steps):
    def tie(self):
        self.token_embeddings.weight = self.lm_head.weight  # the shared matrix gets lm_head's initialisation


class TiedWithoutLmHead(Steps):
    def tie(self):
        del self.lm_head

    def finish(self, x):
        if not hasattr(self, "lm_head"):
            return F.linear(self.ln_final(x), self.token_embeddings.weight)
        return super().finish(x)


class TiedButDetachedHead(Steps):
    def finish(self, x):
        if self.lm_head.weight is self.token_embeddings.weight:  # the logits' use gives the matrix no gradient
            return F.linear(self.ln_final(x), self.lm_head.weight.detach())
        return super().finish(x)


# --- the blocks ------------------------------------------------------------------------------------------------

class PlainList(Steps):
    def setup(self):
        blocks = list(self.layers)
        del self.layers
        self.layers = blocks  # a list attribute: nn.Module does not register what it holds


class SameBlock(Steps):
    def setup(self):
        self.layers = nn.ModuleList([self.layers[0]] * len(self.layers))


class OneBlockTooFew(Steps):
    def setup(self):
        self.layers = self.layers[:-1]


class BlocksDiscarded(Steps):
    def run_blocks(self, x, token_positions):
        for layer in self.layers:
            layer(x, token_positions)
        return x


class ResidualTwice(Steps):
    def run_blocks(self, x, token_positions):
        for layer in self.layers:
            x = x + layer(x, token_positions)
        return x


class EveryBlockReadsTheEmbeddings(Steps):
    def run_blocks(self, x, token_positions):
        embedded = x
        for layer in self.layers:
            x = layer(embedded, token_positions)
        return x


class PositionsNotPassed(Steps):
    def run_blocks(self, x, token_positions):
        return super().run_blocks(x, None)


class DefaultPositionsFromOne(Steps):
    def run_blocks(self, x, token_positions):
        if token_positions is None:
            token_positions = torch.arange(1, x.shape[-2] + 1)
        return super().run_blocks(x, token_positions)


class FusedNotPassedOn(Steps):
    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta, device=None,
                 dtype=None, *, fused=False):
        super().__init__(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta, device=device,
                         dtype=dtype)  # fused dropped


def _attention_without_mask(attn, x, token_positions):
    """attn's computation with every query seeing every key (no causal mask)."""
    split = lambda t: rearrange(t, "... s (h d) -> ... h s d", h=attn.num_heads)
    q, k, v = split(attn.q_proj(x)), split(attn.k_proj(x)), split(attn.v_proj(x))
    positions = (torch.arange(x.shape[-2]) if token_positions is None else token_positions).unsqueeze(-2)
    q, k = attn.rope(q, positions), attn.rope(k, positions)
    return attn.output_proj(rearrange(scaled_dot_product_attention(q, k, v), "... h s d -> ... s (h d)"))


class NotCausal(Steps):
    def run_blocks(self, x, token_positions):
        for layer in self.layers:
            y = x + _attention_without_mask(layer.attn, layer.ln1(x), token_positions)
            x = y + layer.ffn(layer.ln2(y))
        return x


class NotCausalOtherwise(Steps):
    """Not causal in a way the check has no variant for: the first position also reads the last token."""

    def run_blocks(self, x, token_positions):
        x = super().run_blocks(x, token_positions)
        return x + 0.5 * x[..., -1:, :]


# --- names, biases, device -----------------------------------------------------------------------------------

class CalledBlocks(Steps):
    def setup(self):
        self.blocks = self.layers
        del self.layers

    def run_blocks(self, x, token_positions):
        for layer in self.blocks:
            x = layer(x, token_positions)
        return x


class CalledNorm(Steps):
    def setup(self):
        self.norm = self.ln_final
        del self.ln_final

    def finish(self, x):
        return self.lm_head(self.norm(x))


class CalledWte(Steps):
    def setup(self):
        self.wte = self.token_embeddings
        del self.token_embeddings

    def embed(self, token_ids):
        return self.wte(token_ids)


class HeadWithBias(Steps):
    def setup(self):
        self.lm_head = nn.Linear(self.d_model, self.vocab_size, device=self.device, dtype=self.dtype)


class IgnoresDtype(Steps):
    def setup(self):
        self.ln_final = RMSNorm(self.d_model, device=self.device)


class HeadInitialisedToZero(Steps):
    def setup(self):
        self.lm_head = Linear(self.d_model, self.vocab_size, device=self.device, dtype=self.dtype)
        nn.init.zeros_(self.lm_head.weight)


class HeadNeverFilled(Steps):
    def setup(self):  # a new weight that nothing fills
        self.lm_head.weight = nn.Parameter(torch.empty_like(self.lm_head.weight))


class Detached(Steps):
    def finish(self, x):
        return super().finish(x).detach()


class WrongSignature(TransformerLM):
    def __init__(self, vocab_size, d_model, context_length, num_layers, num_heads, d_ff, rope_theta, device=None,
                 dtype=None):
        super().__init__(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta, device, dtype)


MUTANTS = [
    (ReturnsSoftmax, "returns probabilities"),
    (ReturnsLogSoftmax, "returns log-probabilities"),
    (LastPositionOnly, "last position only"),
    (NoLmHead, "lm_head is not applied"),
    (LnFinalNotApplied, "ln_final is not applied"),
    (NoLnFinal, "has no ln_final"),
    (ScaledEmbeddings, "multiplied by √d_model"),
    (Tied, "tied to token_embeddings"),
    (TieIgnored, "ignores tie_embeddings"),
    (TiedByClone, "copies token_embeddings.weight into lm_head"),
    (TiedByDataCopy, "copies token_embeddings.weight into lm_head"),
    (TiedBySecondParameter, "second nn.Parameter"),
    (TiedTheOtherWay, "has lm_head's initialisation"),
    (TiedWithoutLmHead, "has no lm_head.weight"),
    (TiedButDetachedHead, "not the reference's, the sum of its two uses"),
    (PlainList, "plain Python list"),
    (SameBlock, "the same block object"),
    (OneBlockTooFew, "has 1 block in layers"),
    (BlocksDiscarded, "outputs are thrown away"),
    (ResidualTwice, "residual is added twice"),
    (EveryBlockReadsTheEmbeddings, "every block reads the embeddings"),
    (PositionsNotPassed, "token_positions are not passed on"),
    (DefaultPositionsFromOne, "default positions are shifted by one"),
    (FusedNotPassedOn, "does not pass fused on to its blocks"),
    (NotCausal, "no causal mask anywhere"),
    (NotCausalOtherwise, "later tokens change the logits of earlier positions"),
    (CalledBlocks, "calls it `blocks`"),
    (CalledNorm, "calls it `norm`"),
    (CalledWte, "calls it `wte`"),
    (HeadWithBias, "has a bias"),
    (IgnoresDtype, "ignores its dtype"),
    (HeadInitialisedToZero, "lm_head.weight's initial std"),
    (HeadNeverFilled, "TransformerLM.lm_head.weight is never initialised"),
    (Detached, "carry no gradient"),
    (WrongSignature, "signature is"),
]


def test_the_reference_passes_with_one_line(capsys):
    check_transformer_lm(TransformerLM)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("✓ check_transformer_lm")


def test_the_step_by_step_reference_passes_too(capsys):
    check_transformer_lm(Steps)
    assert capsys.readouterr().out.startswith("✓")


def test_an_instance_instead_of_the_class_is_named():
    with pytest.raises(AssertionError, match="not the class"):
        check_transformer_lm(TransformerLM(11, 8, 12, 2, 3, 16, 10000.0))


CATALOGUES = [Catalogue(check_transformer_lm, MUTANTS, right=TransformerLM, exclusive=False, distinct="none",
                        ids=[m.__name__ for m, _ in MUTANTS])]

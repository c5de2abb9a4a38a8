"""The language model's catalogue of classic mistakes, written once: ``check_transformer_lm`` (notebook 10's final
class) and ``check_lm_forward`` (its step 2) both name a wrong forward pass with these words.

Each mistake is a knob of a forward pass computed the right way or wrongly (``chain``, ``ln_final``, ``output``),
with what the verdict says and how to fix it; ``next_stream`` and ``as_output`` turn the knobs into the computation,
so that both checks compute each mistake the same way too.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

RETURN_LOGITS = ("return lm_head's output as it is: the loss (F.cross_entropy) and sampling apply the softmax "
                 "themselves, and the logits keep what a softmax would round away")


def next_stream(chain: str, x: Tensor, out: Tensor) -> Tensor:
    """The stream after a block that read ``x`` and returned ``out``: ``chain`` is "right" (out), or a mistake:
    "discarded" (x kept), "residual twice" (x + out), "embeddings" (out; every block read the embeddings)."""
    return {"right": out, "embeddings": out, "discarded": x, "residual twice": x + out}[chain]


def as_output(logits: Tensor, output: str) -> Tensor:
    """What forward returns: the "logits", or, wrongly, their "softmax" or "log_softmax"."""
    return {"logits": logits, "softmax": logits.softmax(-1), "log_softmax": logits.log_softmax(-1)}[output]


def forward_variants(who: str) -> list[tuple[dict[str, Any], str, str]]:
    """The mistakes of a forward pass that embeds, runs the blocks, normalises and applies lm_head: (the knobs that
    make it, the mistake, the fix), most specific first. ``who`` names the function in the verdict ("forward",
    "lm_forward")."""
    return [
        (dict(output="softmax"), f"{who} returns probabilities (the softmax of the logits), not logits",
         RETURN_LOGITS),
        (dict(output="log_softmax"), f"{who} returns log-probabilities (log_softmax of the logits), not logits",
         RETURN_LOGITS),
        (dict(ln_final=False), "ln_final is not applied: the last block's output goes straight to lm_head",
         "pre-norm blocks leave the residual stream unnormalised: ln_final normalises it before lm_head reads it"),
        (dict(chain="discarded"), "the blocks' outputs are thrown away (`layer(x)` instead of `x = layer(x)`)",
         "the blocks form a chain: each reads the stream the block before it returned"),
        (dict(chain="residual twice"),
         "the residual is added twice (x = x + layer(x)), but TransformerBlock already adds its input to its output",
         "a block's output already holds its input (y = x + attn(ln1(x)), out = y + ffn(ln2(y))): take it as the new "
         "stream, add nothing"),
        (dict(chain="embeddings"), "every block reads the embeddings instead of the previous block's output",
         "the blocks form a chain: block i reads block i-1's output"),
    ]


POSITIONS_NOT_PASSED = ("token_positions are not passed on to the blocks: RoPE then rotates by 0 … seq-1 whatever "
                        "the positions are",
                        "every block needs the positions: pass token_positions on to each; None means 0 … seq-1")


def last_position_only(what: str, shape: tuple[int, ...], expected: tuple[int, ...]) -> tuple[str, str]:
    """The verdict on logits of the last position only (``shape``, where every position's were ``expected``)."""
    return (f"{what} returned the logits of the last position only, shape {tuple(shape)}",
            f"return the logits of every position, {tuple(expected)}: training predicts the next token everywhere "
            "at once; generate picks the last position itself")


def head_not_applied(what: str, shape: tuple[int, ...]) -> tuple[str, str]:
    """The verdict on a result of width d_model: lm_head was never applied."""
    return (f"{what} returned shape {tuple(shape)}, the width d_model: lm_head is not applied",
            "lm_head maps the normalised stream from d_model to vocab_size: apply it last")

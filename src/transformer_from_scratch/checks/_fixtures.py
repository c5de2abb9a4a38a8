"""Fixtures that more than one check module uses, in one place: the small models and reference objects the checks
compare a learner's code with. Each check module imports what it needs from here, never from another check module.

* ``LM_V, LM_CTX, LM_D, LM_L, LM_H, LM_KV, LM_DFF, LM_THETA`` and ``small_lm``: the course's ``TransformerLM`` that
  ``check_kv_cache`` and ``check_generate`` run (11 ids, context 8, d_model 16 in 4 heads of 4, 2 key/value heads
  when grouped, 2 layers, SwiGLU width 24), its gains moved away from 1 so that each norm shows.
* ``learners_linear``: the Linear a learner's code sees where it was written (``check_lora_linear``,
  ``check_apply_lora``, ``check_prepare_for_decode`` build their models from it).
* ``SMOLLM_PATTERN`` and ``reference_tokenizer``: notebook 14's tokenizer built from a GGUF file's metadata, written
  out here independently of the course's ``pretrained.py``, for its step check and ``check_load_gguf``.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch
from torch import nn

from ..linear import Linear as CourseLinear
from ..tokenizer import Tokenizer, bytes_to_unicode
from ..transformer_lm import TransformerLM

# ------------------------------------------------------------------------------------- the small language model

LM_V, LM_CTX, LM_D, LM_L, LM_H, LM_KV, LM_DFF, LM_THETA = 11, 8, 16, 2, 4, 2, 24, 10000.0
LM_DK = LM_D // LM_H


def small_lm(dtype: torch.dtype = torch.float64, seed: int = 0, num_kv_heads: int | None = None) -> TransformerLM:
    """The course's TransformerLM of the sizes above, seeded, its norms' gains moved away from 1."""
    torch.manual_seed(seed)
    model = TransformerLM(LM_V, LM_CTX, LM_D, LM_L, LM_H, LM_DFF, LM_THETA, dtype=dtype, num_kv_heads=num_kv_heads)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("ln1.weight", "ln2.weight", "ln_final.weight")):
                p.add_(0.3 * torch.randn_like(p))  # gains away from 1, so that each norm shows
    return model


# ------------------------------------------------------------------------------------ the learner's own Linear


def learners_linear(impl: Any) -> type[nn.Module]:
    """The Linear that the learner's code sees where it was written (in a student notebook, my_transformer's own),
    else the course's: a class's ``__init__`` (along its MRO) or a function, its globals, then its module's names."""
    owners = impl.__mro__ if inspect.isclass(impl) else (impl,)
    for owner in owners:
        spaces = []
        code = owner.__dict__.get("__init__") if inspect.isclass(owner) else owner
        if callable(code):
            try:
                code = inspect.unwrap(code)
            except ValueError:
                pass
            spaces.append(getattr(code, "__globals__", {}))
        module = sys.modules.get(getattr(owner, "__module__", "") or "")
        if module is not None:
            spaces.append(vars(module))
        for space in spaces:
            candidate = space.get("Linear")
            if inspect.isclass(candidate) and issubclass(candidate, nn.Module) and candidate is not nn.Linear:
                return candidate
    return CourseLinear


# ------------------------------------------------------------------------------ the tokenizer of a GGUF's metadata

SMOLLM_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+"""


def reference_tokenizer(metadata: dict, pattern: str = SMOLLM_PATTERN) -> Tokenizer:
    """The course's Tokenizer of a GGUF file's ``tokenizer.ggml.*`` metadata: tokens and merges mapped back from
    GPT-2's characters to bytes, control tokens (type 3) kept as UTF-8 text and special."""
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    tokens, types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
    vocab = {i: t.encode("utf-8") if kind == 3 else bytes(byte_of[c] for c in t)
             for i, (t, kind) in enumerate(zip(tokens, types))}
    merges = [tuple(bytes(byte_of[c] for c in part) for part in line.split(" "))
              for line in metadata["tokenizer.ggml.merges"]]
    special = [t for t, kind in zip(tokens, types) if kind == 3]
    return Tokenizer(vocab, merges, special, pattern=pattern)

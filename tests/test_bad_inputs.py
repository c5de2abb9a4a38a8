"""The bad-input matrix: every wrong shape, dtype or value a learner is likely to pass to a public
class or function, in one list, CASES. Each case must raise an error of the expected type whose FIRST line
says what is wrong (the argument, what was expected, what it got): once with the run-time shape checks on
and once with them off (`shape_checks(False)`), where only the cheap explicit checks inside each forward remain.

The second test, test_nothing_broadcasts_silently, takes the inputs that PyTorch's own ops (or the textbook
formula) would broadcast without a word, and checks that ours refuse them, with the checks on and off.
"""

import io
import random
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from jaxtyping import TypeCheckError

from torch import nn

from transformer_from_scratch.fast_decode import (FusedMatmul, FusedSelfAttention, FusedSwiGLU, Int8Linear,
                                                  column_major, copy_bandwidth, decode_bytes, faster_layout,
                                                  fuse_weights, int8_matmul, prepare_for_decode, quantize_int8,
                                                  split_qkv, attend_at, static_step)
from transformer_from_scratch import (LoRALinear, apply_lora, assistant_targets, encode_example, exact_match, held_out,
                                      lora_delta, masked_cross_entropy, pad_batch, reverse_task, wilson_interval)
from transformer_from_scratch import (
    AdamW,
    chat_prompt,
    default_system,
    dequantize_q4_1,
    dequantize_q8_0,
    chat_turn,
    load_gguf,
    model_from_state,
    open_gguf,
    state_dict_from,
    with_tied_head,
    model_config,
    our_name,
    read_metadata,
    tensor_of,
    tokenizer_from_gguf,
    Embedding,
    KVCache,
    GPT2StyleLM,
    Linear,
    MultiHeadSelfAttention,
    RMSNorm,
    RotaryPositionalEmbedding,
    SwiGLU,
    TransformerBlock,
    Tokenizer,
    TransformerLM,
    count_resources,
    cross_entropy,
    generate,
    get_batch,
    gradient_clipping,
    load_checkpoint,
    lr_cosine_schedule,
    next_token_distribution,
    save_checkpoint,
    scaled_dot_product_attention,
    shape_checks,
    silu,
    softmax,
    swiglu_hidden_size,
    tokenize_file,
    train_bpe,
)

# Small sizes, all different, so that a message naming the wrong size cannot pass by accident.
D_MODEL, HEADS, D_FF, MAX_SEQ, VOCAB, THETA = 16, 4, 32, 8, 50, 10_000.0
D_K = 8  # RoPE on its own: (..., seq, 8) vectors, positions 0 ... 7


class Raises:
    """What one mode must raise: the exact exception type, and phrases that must all be in the message's first line."""

    def __init__(self, error: type[Exception], *phrases: str) -> None:
        assert 1 <= len(phrases) <= 3, "one to three phrases"
        self.error, self.phrases = error, phrases

    def __repr__(self) -> str:
        return f"Raises({self.error.__name__}, {', '.join(map(repr, self.phrases))})"


def case(name: str, call, on: Raises, off: Raises | None = None):
    """One row of the matrix: `call()` builds the component and makes the bad call; `off` defaults to `on`."""
    return pytest.param(call, on, on if off is None else off, id=name)


def gap(name: str, call, on: Raises, reason: str, off: Raises | None = None):
    """A row whose refusal is still missing: the error it should raise, expected to fail (xfail) until it does."""
    return pytest.param(call, on, on if off is None else off, id=name,
                        marks=pytest.mark.xfail(strict=False, reason=f"gap: {reason}"))


def TCE(*phrases: str) -> Raises:
    """jaxtyping's TypeCheckError; its first line: "<Qualname>: <arg> is <actual>, which does not fit <expected>"."""
    return Raises(TypeCheckError, *phrases)


def randn(*shape):
    return torch.randn(shape, generator=torch.Generator().manual_seed(0))


def _with_lora(model):
    apply_lora(model, ("q_proj", "v_proj"), rank=2, alpha=4.0)
    return model


def lm(**kwargs):
    sizes = dict(vocab_size=VOCAB, context_length=MAX_SEQ, d_model=D_MODEL, num_layers=1, num_heads=HEADS,
                 d_ff=D_FF, rope_theta=THETA)
    return TransformerLM(**(sizes | kwargs))


def _after(model, n: int):
    """The model, with one cache per block already holding n positions (in _after.caches)."""
    _after.caches = KVCache.for_model(model)
    model(torch.zeros(1, n, dtype=torch.long), cache=_after.caches)
    return model


def mha(**kwargs):
    return MultiHeadSelfAttention(**(dict(d_model=D_MODEL, num_heads=HEADS, max_seq_len=MAX_SEQ, theta=THETA) | kwargs))


def block(**kwargs):
    sizes = dict(d_model=D_MODEL, num_heads=HEADS, d_ff=D_FF, max_seq_len=MAX_SEQ, theta=THETA)
    return TransformerBlock(**(sizes | kwargs))


def rope(**kwargs):
    return RotaryPositionalEmbedding(**(dict(theta=THETA, d_k=D_K, max_seq_len=MAX_SEQ) | kwargs))


def attend(q=(2, 5, 8), k=(2, 7, 8), v=(2, 7, 3), mask=None, dtype=torch.float32):
    """Our attention on random Q, K, V of these shapes (n=5 queries, m=7 keys, d_k=8, d_v=3 by default)."""
    return scaled_dot_product_attention(randn(*q).to(dtype), randn(*k).to(dtype), randn(*v).to(dtype), mask)


def ones(*shape, dtype=torch.bool):
    return torch.ones(shape, dtype=dtype)


IDS = torch.tensor([[1, 2, 3]])
CASES = [
    # ---- Linear ----------------------------------------------------------------------------------------------
    case("Linear-wrong-last-dim", lambda: Linear(4, 3)(randn(2, 5)),
         Raises(ValueError, "(..., 4)", "in_features=4", "got shape (2, 5)")),
    case("Linear-0d", lambda: Linear(4, 3)(torch.tensor(1.0)),
         TCE("Linear.forward: x is f32[]", "Float[Tensor, '... d_in']"),
         Raises(ValueError, "(..., 4)", "got shape ()")),
    case("Linear-int-input", lambda: Linear(4, 3)(ones(2, 4, dtype=torch.long)),
         TCE("x is i64[2,4]", "Float[Tensor, '... d_in']"),
         Raises(TypeError, "Linear", "int64")),
    case("Linear-in-features-0", lambda: Linear(0, 3), Raises(ValueError, "positive sizes", "in_features=0")),
    case("Linear-out-features-negative", lambda: Linear(4, -1),
         Raises(ValueError, "positive sizes", "out_features=-1")),
    # ---- Embedding -------------------------------------------------------------------------------------------
    case("Embedding-float-ids", lambda: Embedding(10, 4)(torch.tensor([1.0, 2.0])),
         Raises(TypeError, "integer token ids", "torch.float32")),
    case("Embedding-bool-ids", lambda: Embedding(10, 4)(torch.tensor([True, False])),
         Raises(TypeError, "integer token ids", "torch.bool", "mask")),
    case("Embedding-negative-id", lambda: Embedding(10, 4)(torch.tensor([-1, 2])),
         Raises(ValueError, "[0, 9]", "num_embeddings=10", "from -1 to 2")),
    case("Embedding-id-equal-to-vocab", lambda: Embedding(10, 4)(torch.tensor([3, 10])),
         Raises(ValueError, "[0, 9]", "from 3 to 10")),
    case("Embedding-num-embeddings-0", lambda: Embedding(0, 4),
         Raises(ValueError, "positive sizes", "num_embeddings=0")),
    case("Embedding-dim-negative", lambda: Embedding(10, -4), Raises(ValueError, "positive sizes", "embedding_dim=-4")),
    # ---- softmax ---------------------------------------------------------------------------------------------
    case("softmax-dim-too-large", lambda: softmax(randn(2, 3), dim=2),
         Raises(IndexError, "dim=2", "x.ndim=2", "-2 <= dim <= 1")),
    case("softmax-dim-too-negative", lambda: softmax(randn(2, 3), dim=-3),
         Raises(IndexError, "dim=-3", "shape (2, 3)", "-2 <= dim <= 1")),
    case("softmax-0d-dim-1", lambda: softmax(torch.tensor(1.0), dim=1),
         Raises(IndexError, "dim=1", "x.ndim=0", "-1 <= dim <= 0")),
    case("softmax-int-input", lambda: softmax(torch.tensor([1, 2, 3]), dim=0),
         TCE("softmax: x is i64[3]", "Float[Tensor, '...']"),
         Raises(TypeError, "softmax", "int64")),
    case("softmax-bool-input", lambda: softmax(torch.tensor([True, False]), dim=0),
         TCE("softmax: x is bool[2]", "Float[Tensor, '...']"),
         Raises(TypeError, "softmax", "bool")),
    # ---- RMSNorm ---------------------------------------------------------------------------------------------
    case("RMSNorm-wrong-last-dim", lambda: RMSNorm(4)(randn(2, 5)),
         Raises(ValueError, "(..., 4)", "d_model=4", "got shape (2, 5)")),
    case("RMSNorm-0d", lambda: RMSNorm(4)(torch.tensor(1.0)),
         TCE("RMSNorm.forward: x is f32[]", "Float[Tensor, '... d_model']"),
         Raises(ValueError, "(..., 4)", "got shape ()")),
    case("RMSNorm-int-input", lambda: RMSNorm(4)(torch.tensor([[1, 2, 3, 4]])),
         TCE("RMSNorm.forward: x is i64[1,4]", "Float[Tensor, '... d_model']"),
         Raises(TypeError, "RMSNorm", "int64")),
    case("RMSNorm-d-model-0", lambda: RMSNorm(0), Raises(ValueError, "positive d_model", "d_model=0")),
    case("RMSNorm-eps-negative", lambda: RMSNorm(4, eps=-1.0), Raises(ValueError, "eps >= 0", "eps=-1.0")),
    # ---- scaled_dot_product_attention: Q (2, 5, 8), K (2, 7, 8), V (2, 7, 3) unless stated ---------------------
    case("attention-d_k-differs", lambda: attend(k=(2, 7, 6)),
         TCE("K is f32[2,7,6]", "'*batch m d_k'", "d_k=8"),
         Raises(ValueError, "K (..., m, d_k)", "K (2, 7, 6)")),
    case("attention-m-differs", lambda: attend(v=(2, 6, 3)),
         TCE("V is f32[2,6,3]", "'*batch m d_v'", "m=7"),
         Raises(ValueError, "V (..., m, d_v)", "V (2, 6, 3)")),
    case("attention-K-V-leading-1-Q-leading-2", lambda: attend(k=(1, 7, 8), v=(1, 7, 3)),
         TCE("K is f32[1,7,8]", "'*batch m d_k'", "batch=(2,)"),
         Raises(ValueError, "same leading dimensions", "Q (2, 5, 8), K (1, 7, 8)")),
    case("attention-K-V-leading-dim-Q-lacks", lambda: attend(q=(5, 8)),
         TCE("K is f32[2,7,8]", "batch=()"),
         Raises(ValueError, "same leading dimensions", "Q (5, 8), K (2, 7, 8)")),
    case("attention-V-leading-differs", lambda: attend(v=(3, 7, 3)),
         TCE("V is f32[3,7,3]", "batch=(2,)"),
         Raises(ValueError, "same leading dimensions", "V (3, 7, 3)")),
    case("attention-Q-1d", lambda: attend(q=(8,), k=(7, 8), v=(7, 3)),
         TCE("Q is f32[8]", "'*batch n d_k'"),
         Raises(ValueError, "Q (..., n, d_k)", "got Q (8,)")),
    case("attention-0d", lambda: attend(q=(), k=(), v=()),
         TCE("Q is f32[]", "'*batch n d_k'"),
         Raises(ValueError, "Q (..., n, d_k)", "got Q ()")),
    case("attention-mask-wrong-m", lambda: attend(mask=ones(5, 6)),
         TCE("mask is bool[5,6]", "'*#batch n m'", "m=7"),
         Raises(ValueError, "(..., 5, 7)", "got mask (5, 6)")),
    case("attention-mask-transposed", lambda: attend(mask=ones(7, 5)),
         TCE("mask is bool[7,5]", "'*#batch n m'", "n=5"),
         Raises(ValueError, "(..., 5, 7)", "got mask (7, 5)")),
    case("attention-mask-batch-does-not-broadcast", lambda: attend(mask=ones(3, 5, 7)),
         TCE("mask is bool[3,5,7]", "'*#batch n m'", "batch=(2,)"),
         Raises(ValueError, "broadcast to Q's (2,)", "got mask (3, 5, 7)")),
    case("attention-mask-more-dims-than-Q", lambda: attend(mask=ones(1, 2, 5, 7)),
         TCE("mask is bool[1,2,5,7]", "'*#batch n m'", "batch=(2,)"),
         Raises(ValueError, "broadcast to Q's (2,)", "got mask (1, 2, 5, 7)")),
    case("attention-mask-float", lambda: attend(mask=ones(5, 7, dtype=torch.float32)),
         Raises(TypeError, "mask must be a bool tensor", "got dtype torch.float32")),
    case("attention-mask-int", lambda: attend(mask=ones(5, 7, dtype=torch.long)),
         Raises(TypeError, "mask must be a bool tensor", "got dtype torch.int64")),
    case("attention-int-QKV", lambda: attend(dtype=torch.long),
         TCE("Q is i64[2,5,8]", "Float[Tensor, '*batch n d_k']"),
         Raises(TypeError, "scaled_dot_product_attention", "int64")),
    # ---- RotaryPositionalEmbedding: d_k 8, max_seq_len 8; x (2, 5, 8) unless stated ----------------------------
    case("RoPE-odd-d_k", lambda: rope(d_k=7), Raises(ValueError, "even d_k", "d_k=7")),
    case("RoPE-d_k-0", lambda: rope(d_k=0), Raises(ValueError, "even d_k > 0", "d_k=0")),
    case("RoPE-max-seq-len-0", lambda: rope(max_seq_len=0), Raises(ValueError, "max_seq_len > 0", "max_seq_len=0")),
    case("RoPE-theta-0", lambda: rope(theta=0.0), Raises(ValueError, "theta > 0", "theta=0.0")),
    case("RoPE-wrong-last-dim", lambda: rope()(randn(2, 5, 6), torch.arange(5)),
         Raises(ValueError, "d_k=8", "x of shape (2, 5, 6)")),
    case("RoPE-x-1d", lambda: rope()(randn(8), torch.arange(1)),
         TCE("RotaryPositionalEmbedding.forward: x is f32[8]", "'*batch seq d_k'"),
         Raises(ValueError, "(..., seq, 8)", "x of shape (8,)")),
    case("RoPE-position-equal-to-max-seq-len", lambda: rope()(randn(2, 5, 8), torch.arange(4, 9)),
         Raises(ValueError, "token_positions", "[0, 8)", "from 4 to 8")),
    case("RoPE-negative-position", lambda: rope()(randn(2, 5, 8), torch.arange(-1, 4)),
         Raises(ValueError, "token_positions", "[0, 8)", "from -1 to 3")),
    case("RoPE-one-position-for-seq-5", lambda: rope()(randn(2, 5, 8), torch.tensor([0])),
         TCE("token_positions is i64[1]", "'*#batch seq'", "seq=5"),
         Raises(ValueError, "(..., seq) = (..., 5)", "got token_positions (1,) for x (2, 5, 8)")),
    case("RoPE-positions-more-leading-dims-than-x", lambda: rope()(randn(5, 8), torch.arange(5).expand(2, 5)),
         TCE("token_positions is i64[2,5]", "'*#batch seq'", "batch=()"),
         Raises(ValueError, "broadcast to x's ()", "got token_positions (2, 5) for x (5, 8)")),
    case("RoPE-float-positions", lambda: rope()(randn(5, 8), torch.tensor([0.9, 1.5, 2.0, 3.0, 4.0])),
         TCE("token_positions is f32[5]", "Int[Tensor, '*#batch seq']"),
         Raises(TypeError, "token_positions", "float32")),
    case("RoPE-bool-positions", lambda: rope()(randn(5, 8), ones(5)),
         TCE("token_positions is bool[5]", "Int[Tensor, '*#batch seq']"),
         Raises(TypeError, "token_positions", "bool")),
    # ---- silu, SwiGLU, swiglu_hidden_size --------------------------------------------------------------------
    case("silu-int-input", lambda: silu(torch.tensor([1, 2])),
         TCE("silu: x is i64[2]", "Float[Tensor, '...']"),
         Raises(TypeError, "silu", "int64")),
    case("silu-bool-input", lambda: silu(torch.tensor([True])),
         TCE("silu: x is bool[1]", "Float[Tensor, '...']"),
         Raises(TypeError, "silu", "bool")),
    case("SwiGLU-wrong-last-dim", lambda: SwiGLU(4, 8)(randn(2, 5)),
         Raises(ValueError, "(..., 4)", "got shape (2, 5)")),
    case("SwiGLU-0d", lambda: SwiGLU(4, 8)(torch.tensor(1.0)),
         TCE("SwiGLU.forward: x is f32[]", "Float[Tensor, '... d_model']"),
         Raises(ValueError, "(..., 4)", "got shape ()")),
    case("SwiGLU-int-input", lambda: SwiGLU(4, 8)(ones(2, 4, dtype=torch.long)),
         TCE("SwiGLU.forward: x is i64[2,4]", "Float[Tensor, '... d_model']"),
         Raises(TypeError, "int64")),
    case("SwiGLU-d_ff-0", lambda: SwiGLU(4, 0), Raises(ValueError, "positive sizes", "d_ff=0")),
    case("SwiGLU-d_model-negative", lambda: SwiGLU(-4, 8), Raises(ValueError, "positive sizes", "d_model=-4")),
    case("swiglu_hidden_size-float", lambda: swiglu_hidden_size(768.0),
         Raises(TypeError, "d_model must be an int", "768.0")),
    case("swiglu_hidden_size-bool", lambda: swiglu_hidden_size(True),
         Raises(TypeError, "d_model must be an int", "True")),
    case("swiglu_hidden_size-0", lambda: swiglu_hidden_size(0), Raises(ValueError, "positive sizes", "d_model=0")),
    case("swiglu_hidden_size-multiple-of-negative", lambda: swiglu_hidden_size(64, multiple_of=-64),
         Raises(ValueError, "positive sizes", "multiple_of=-64")),
    # ---- MultiHeadSelfAttention: d_model 16, 4 heads, max_seq_len 8 -------------------------------------------
    case("MHA-d_model-not-divisible-by-heads", lambda: mha(d_model=10, num_heads=3),
         Raises(ValueError, "divisible by num_heads", "d_model=10, num_heads=3")),
    case("MHA-num-heads-0", lambda: mha(num_heads=0), Raises(ValueError, "divisible by num_heads", "num_heads=0")),
    case("MHA-max-seq-len-without-theta", lambda: mha(theta=None),
         Raises(ValueError, "both max_seq_len and theta", "theta=None")),
    case("MHA-odd-d_k-for-RoPE", lambda: mha(d_model=12), Raises(ValueError, "even d_k", "d_k=3")),
    case("MHA-wrong-last-dim", lambda: mha()(randn(2, 5, 12)),
         Raises(ValueError, "(..., seq, 16)", "d_model=16", "got shape (2, 5, 12)")),
    case("MHA-x-1d", lambda: mha()(randn(16)),
         TCE("MultiHeadSelfAttention.forward: x is f32[16]", "'*batch seq d_model'"),
         Raises(ValueError, "(..., seq, 16)", "got shape (16,)")),
    case("MHA-sequence-longer-than-max-seq-len", lambda: mha()(randn(2, 9, 16)),
         Raises(ValueError, "9 tokens", "max_seq_len=8")),
    case("MHA-position-equal-to-max-seq-len", lambda: mha()(randn(2, 5, 16), torch.arange(4, 9)),
         Raises(ValueError, "token_positions", "[0, 8)", "from 4 to 8")),
    case("MHA-negative-position", lambda: mha()(randn(2, 5, 16), torch.arange(-1, 4)),
         Raises(ValueError, "token_positions", "[0, 8)", "from -1 to 3")),
    case("MHA-one-position-for-seq-5", lambda: mha()(randn(2, 5, 16), torch.tensor([0])),
         TCE("token_positions is i64[1]", "'*#batch seq'", "seq=5"),
         Raises(ValueError, "(..., 5)", "got token_positions (1,)")),
    case("MHA-positions-more-leading-dims-than-x", lambda: mha()(randn(5, 16), torch.arange(5).expand(2, 5)),
         TCE("token_positions is i64[2,5]", "'*#batch seq'", "batch=()"),
         Raises(ValueError, "token_positions", "got token_positions (2, 5)")),
    case("MHA-float-positions", lambda: mha()(randn(5, 16), torch.arange(5.0)),
         TCE("token_positions is f32[5]", "Int[Tensor, '*#batch seq']"),
         Raises(TypeError, "token_positions", "float32")),
    case("MHA-positions-without-RoPE", lambda: mha(max_seq_len=None, theta=None)(randn(5, 16), torch.arange(5)),
         Raises(ValueError, "token_positions were given", "no RoPE")),
    case("MHA-int-input", lambda: mha()(ones(5, 16, dtype=torch.long)),
         TCE("MultiHeadSelfAttention.forward: x is i64[5,16]", "Float[Tensor, '*batch seq d_model']"),
         Raises(TypeError, "int64")),
    # ---- TransformerBlock: d_model 16, 4 heads, d_ff 32, max_seq_len 8 ----------------------------------------
    case("Block-d_model-not-divisible-by-heads", lambda: block(d_model=10, num_heads=3),
         Raises(ValueError, "divisible by num_heads", "d_model=10, num_heads=3")),
    case("Block-d_ff-0", lambda: block(d_ff=0), Raises(ValueError, "positive sizes", "d_ff=0")),
    case("Block-wrong-last-dim", lambda: block()(randn(2, 5, 12)),
         Raises(ValueError, "(..., seq, 16)", "d_model=16", "got shape (2, 5, 12)")),
    case("Block-x-1d", lambda: block()(randn(16)),
         TCE("TransformerBlock.forward: x is f32[16]", "'*batch seq d_model'"),
         Raises(ValueError, "(..., seq, 16)", "got shape (16,)")),
    case("Block-sequence-longer-than-max-seq-len", lambda: block()(randn(2, 9, 16)),
         Raises(ValueError, "9 tokens", "max_seq_len=8")),
    case("Block-position-equal-to-max-seq-len", lambda: block()(randn(2, 5, 16), torch.arange(4, 9)),
         Raises(ValueError, "token_positions", "[0, 8)", "from 4 to 8")),
    case("Block-one-position-for-seq-5", lambda: block()(randn(2, 5, 16), torch.tensor([0])),
         TCE("TransformerBlock.forward: token_positions is i64[1]", "seq=5"),
         Raises(ValueError, "(..., 5)", "got token_positions (1,)")),
    case("Block-int-input", lambda: block()(ones(5, 16, dtype=torch.long)),
         TCE("TransformerBlock.forward: x is i64[5,16]", "Float[Tensor, '*batch seq d_model']"),
         Raises(TypeError, "int64")),
    # ---- TransformerLM: vocab 50, context 8 -------------------------------------------------------------------
    case("LM-float-ids", lambda: lm()(IDS.float()),
         TCE("TransformerLM.forward: token_ids is f32[1,3]", "Integer[Tensor, '*batch seq']"),
         Raises(TypeError, "integer token ids", "torch.float32")),
    case("LM-bool-ids", lambda: lm()(IDS.bool()),
         TCE("token_ids is bool[1,3]", "Integer[Tensor, '*batch seq']"),
         Raises(TypeError, "integer token ids", "torch.bool")),
    case("LM-negative-id", lambda: lm()(torch.tensor([[-1, 2]])),
         Raises(ValueError, "[0, 49]", "num_embeddings=50", "from -1 to 2")),
    case("LM-id-equal-to-vocab", lambda: lm()(torch.tensor([[50, 2]])),
         Raises(ValueError, "[0, 49]", "num_embeddings=50", "from 2 to 50")),
    case("LM-0d-ids", lambda: lm()(torch.tensor(3)),
         TCE("token_ids is i64[]", "'*batch seq'"),
         Raises(ValueError, "(..., seq)", "0-d tensor")),
    case("LM-sequence-longer-than-context", lambda: lm()(torch.zeros(1, 9, dtype=torch.long)),
         Raises(ValueError, "9 tokens", "context_length=8", "(1, 9)")),
    case("LM-position-equal-to-context", lambda: lm()(IDS, torch.tensor([6, 7, 8])),
         Raises(ValueError, "token_positions", "[0, 8)", "from 6 to 8")),
    case("LM-negative-position", lambda: lm()(IDS, torch.tensor([-1, 0, 1])),
         Raises(ValueError, "token_positions", "[0, 8)", "from -1 to 1")),
    case("LM-one-position-for-seq-5", lambda: lm()(torch.zeros(2, 5, dtype=torch.long), torch.tensor([0])),
         TCE("TransformerLM.forward: token_positions is i64[1]", "seq=5"),
         Raises(ValueError, "(..., 5)", "got token_positions (1,)")),
    case("LM-positions-more-leading-dims-than-ids", lambda: lm()(torch.zeros(5, dtype=torch.long),
                                                                 torch.arange(5).expand(2, 5)),
         TCE("token_positions is i64[2,5]", "batch=()"),
         Raises(ValueError, "token_positions", "got token_positions (2, 5)")),
    case("LM-float-positions", lambda: lm()(IDS, torch.tensor([0.0, 1.0, 2.0])),
         TCE("token_positions is f32[3]", "Int[Tensor, '*#batch seq']"),
         Raises(TypeError, "token_positions", "float32")),
    case("LM-vocab-size-0", lambda: lm(vocab_size=0), Raises(ValueError, ">= 1", "vocab_size=0")),
    case("LM-context-length-0", lambda: lm(context_length=0), Raises(ValueError, ">= 1", "context_length=0")),
    case("LM-num-layers-0", lambda: lm(num_layers=0), Raises(ValueError, ">= 1", "num_layers=0")),
    case("LM-d_model-not-divisible-by-heads", lambda: lm(d_model=10, num_heads=3),
         Raises(ValueError, "divisible by num_heads", "d_model=10, num_heads=3")),
    case("LM-d_model-0", lambda: lm(d_model=0), Raises(ValueError, "every size must be >= 1", "d_model=0")),
    # ---- generate and next_token_distribution ----------------------------------------------------------------
    case("generate-2d-prompt", lambda: generate(lm(), torch.tensor([[1, 2]]), 3),
         Raises(ValueError, "shape (prompt,)", "got shape (1, 2)")),
    case("generate-empty-prompt", lambda: generate(lm(), torch.tensor([], dtype=torch.long), 3),
         Raises(ValueError, "non-empty", "got shape (0,)")),
    case("generate-0d-prompt", lambda: generate(lm(), torch.tensor(1), 3),
         Raises(ValueError, "shape (prompt,)", "got shape ()")),
    case("generate-negative-max-new-tokens", lambda: generate(lm(), torch.tensor([1]), -1),
         Raises(ValueError, "max_new_tokens must be >= 0", "got -1")),
    case("generate-negative-temperature", lambda: generate(lm(), torch.tensor([1]), 3, temperature=-1.0),
         Raises(ValueError, "temperature must be >= 0", "got -1.0")),
    case("generate-top-k-0", lambda: generate(lm(), torch.tensor([1]), 3, top_k=0),
         Raises(ValueError, "top_k must be >= 1", "got 0")),
    case("generate-top-p-0", lambda: generate(lm(), torch.tensor([1]), 3, top_p=0.0),
         Raises(ValueError, "top_p must lie in (0, 1]", "got 0.0")),
    case("generate-top-p-above-1", lambda: generate(lm(), torch.tensor([1]), 3, top_p=1.5),
         Raises(ValueError, "top_p must lie in (0, 1]", "got 1.5")),
    case("generate-prompt-id-equal-to-vocab", lambda: generate(lm(), torch.tensor([1, 50]), 3),
         Raises(ValueError, "[0, 49]", "from 1 to 50")),
    case("generate-negative-prompt-id", lambda: generate(lm(), torch.tensor([-1]), 3),
         Raises(ValueError, "[0, 49]", "from -1 to -1")),
    case("generate-float-prompt", lambda: generate(lm(), torch.tensor([1.0, 2.0]), 3),
         Raises(TypeError, "integer token ids", "torch.float32")),
    case("generate-float-prompt-uncached", lambda: generate(lm(), torch.tensor([1.0, 2.0]), 3, use_cache=False),
         Raises(TypeError, "integer token ids", "torch.float32")),
    case("KVCache-size-0", lambda: KVCache(1, 0, 8, 4),
         Raises(ValueError, "every size must be >= 1", "num_kv_heads=0")),
    case("KVCache-update-past-max-len", lambda: KVCache(1, 2, 3, 4).update(randn(1, 2, 4, 4), randn(1, 2, 4, 4)),
         Raises(ValueError, "4 new positions do not fit", "max_seq_len=3")),
    case("KVCache-update-wrong-heads", lambda: KVCache(1, 2, 3, 4).update(randn(1, 3, 1, 4), randn(1, 3, 1, 4)),
         Raises(ValueError, "(1, 2, new, 4)", "got k (1, 3, 1, 4)")),
    case("MultiHeadSelfAttention-cache-of-the-query-heads",
         lambda: mha(num_kv_heads=2)(randn(1, 2, D_MODEL), cache=KVCache(1, HEADS, 8, 4)),
         Raises(ValueError, "(1, 4, new, 4)", "got k (1, 2, 2, 4)")),
    case("TransformerLM-cache-past-context", lambda: _after(lm(), 5)(torch.zeros(1, 4, dtype=torch.long),
                                                                     cache=_after.caches),
         Raises(ValueError, "4 tokens after 5 cached positions", f"context_length={MAX_SEQ}")),
    case("TransformerLM-cache-id-equal-to-vocab", lambda: lm()(torch.tensor([[1, 50]]), cache=KVCache.for_model(lm())),
         Raises(ValueError, "[0, 49]", "from 1 to 50")),
    case("TransformerLM-caches-of-another-batch", lambda: lm()(torch.tensor([[1], [2]]), cache=KVCache.for_model(lm())),
         Raises(ValueError, "KVCache.update expects k and v", "got k (2, 4, 1, 4)")),
    case("TransformerLM-cache-not-one-per-block", lambda: lm(num_layers=2)(torch.tensor([[1]]),
                                                                          cache=KVCache.for_model(lm())),
         Raises(ValueError, "one per block", "2 blocks, 1 caches")),
    case("next_token_distribution-negative-temperature", lambda: next_token_distribution(randn(5), temperature=-0.5),
         Raises(ValueError, "temperature must be >= 0", "got -0.5")),
    case("next_token_distribution-nan-temperature", lambda: next_token_distribution(randn(5), temperature=float("nan")),
         Raises(ValueError, "temperature must be >= 0", "got nan")),
    case("next_token_distribution-top-k-0", lambda: next_token_distribution(randn(5), top_k=0),
         Raises(ValueError, "top_k must be >= 1", "got 0")),
    case("next_token_distribution-top-p-0", lambda: next_token_distribution(randn(5), top_p=0.0),
         Raises(ValueError, "top_p must lie in (0, 1]", "got 0.0")),
    case("next_token_distribution-top-p-above-1", lambda: next_token_distribution(randn(5), top_p=1.01),
         Raises(ValueError, "top_p must lie in (0, 1]", "got 1.01")),
    case("next_token_distribution-0d-logits", lambda: next_token_distribution(torch.tensor(2.0)),
         TCE("logits is f32[]"),
         Raises(ValueError, "logits", "()")),
    # ---- count_resources -------------------------------------------------------------------------------------
    case("count_resources-d_model-not-divisible-by-heads", lambda: count_resources(50, 8, 10, 1, 3, 32),
         Raises(ValueError, "num_heads must divide d_model", "d_model=10, num_heads=3")),
    case("count_resources-num-heads-0", lambda: count_resources(50, 8, 16, 1, 0, 32),
         Raises(ValueError, "num_heads=0")),
    case("count_resources-vocab-size-0", lambda: count_resources(0, 8, 16, 1, 4, 32),
         Raises(ValueError, "vocab_size=0")),
    # ---- training (notebook 11): logits (2, 3, 5) unless stated -----------------------------------------------
    case("cross_entropy-targets-of-another-shape", lambda: cross_entropy(randn(2, 3, 5), torch.zeros(2, 4, dtype=torch.long)),
         TCE("cross_entropy: targets is i64[2,4]", "'*batch'"),
         Raises(ValueError, "leading shape (2, 3)", "targets of shape (2, 4)")),
    case("cross_entropy-target-equal-to-vocab", lambda: cross_entropy(randn(2, 3, 5), torch.full((2, 3), 5)),
         Raises(ValueError, "[0, 4]", "vocab=5", "from 5 to 5")),
    case("cross_entropy-negative-target", lambda: cross_entropy(randn(4, 5), torch.tensor([0, -1, 2, 3])),
         Raises(ValueError, "[0, 4]", "from -1 to 3")),
    case("cross_entropy-float-targets", lambda: cross_entropy(randn(4, 5), torch.zeros(4)),
         TCE("targets is f32[4]", "Integer[Tensor, '*batch']"),
         Raises(TypeError, "integer class ids", "torch.float32")),
    case("cross_entropy-integer-logits", lambda: cross_entropy(torch.zeros(4, 5, dtype=torch.long), torch.zeros(4, dtype=torch.long)),
         TCE("inputs is i64[4,5]", "Float[Tensor, '*batch vocab']"),
         Raises(TypeError, "floating-point logits", "torch.int64")),
    case("AdamW-negative-lr", lambda: AdamW(Linear(4, 3).parameters(), lr=-1.0),
         Raises(ValueError, "lr must be >= 0", "got -1.0")),
    case("AdamW-beta-of-1", lambda: AdamW(Linear(4, 3).parameters(), betas=(0.9, 1.0)),
         Raises(ValueError, "betas must be two numbers in [0, 1)", "(0.9, 1.0)")),
    case("AdamW-negative-weight-decay", lambda: AdamW(Linear(4, 3).parameters(), weight_decay=-0.1),
         Raises(ValueError, "weight_decay must be >= 0", "got -0.1")),
    case("lr_cosine_schedule-negative-it", lambda: lr_cosine_schedule(-1, 1e-3, 1e-4, 10, 100),
         Raises(ValueError, "it must be >= 0", "got -1")),
    case("lr_cosine_schedule-float-it", lambda: lr_cosine_schedule(2.5, 1e-3, 1e-4, 10, 100),
         Raises(TypeError, "it must be an int", "got 2.5")),
    case("lr_cosine_schedule-cosine-ends-at-warmup", lambda: lr_cosine_schedule(5, 1e-3, 1e-4, 10, 10),
         Raises(ValueError, "cosine_cycle_iters > warmup_iters", "warmup_iters=10, cosine_cycle_iters=10")),
    case("lr_cosine_schedule-min-above-max", lambda: lr_cosine_schedule(5, 1e-4, 1e-3, 10, 100),
         Raises(ValueError, "min_learning_rate <= max_learning_rate", "min_learning_rate=0.001")),
    case("gradient_clipping-max-0", lambda: gradient_clipping(Linear(4, 3).parameters(), 0.0),
         Raises(ValueError, "max_l2_norm must be > 0", "got 0.0")),
    case("get_batch-dataset-too-short", lambda: get_batch(np.arange(8), 4, 8, "cpu"),
         Raises(ValueError, "context_length + 1 = 9 tokens", "a dataset of 8")),
    case("get_batch-2d-dataset", lambda: get_batch(np.zeros((4, 50), dtype=np.int64), 4, 8, "cpu"),
         TCE("get_batch: dataset is i64[4,50]", "Integer[ndarray, 'tokens']"),
         Raises(ValueError, "1-D dataset", "shape (4, 50)")),
    case("get_batch-float-dataset", lambda: get_batch(np.zeros(50), 4, 8, "cpu"),
         TCE("get_batch: dataset is f64[50]", "Integer[ndarray, 'tokens']"),
         Raises(TypeError, "integer token ids", "float64")),
    case("get_batch-batch-size-0", lambda: get_batch(np.arange(50), 0, 8, "cpu"),
         Raises(ValueError, "batch_size must be >= 1", "got 0")),
    case("save_checkpoint-negative-iteration", lambda: save_checkpoint(lm(), AdamW(lm().parameters()), -1, io.BytesIO()),
         Raises(ValueError, "iteration must be >= 0", "got -1")),
    case("load_checkpoint-not-a-checkpoint", lambda: load_checkpoint(io.BytesIO(b"not a checkpoint"), lm()),
         Raises(ValueError, "not a readable checkpoint", "the file object")),
    case("load_checkpoint-another-model", lambda: load_checkpoint(_checkpoint_of(lm()), lm(d_ff=64)),
         Raises(ValueError, "do not fit this TransformerLM", "layers.0.ffn.w1.weight (32, 16) (the model's: (64, 16))")),
    case("tokenize_file-missing", lambda: tokenize_file("no/such/plays.txt"),
         Raises(FileNotFoundError, "no text file at no/such/plays.txt")),
    case("GPT2StyleLM-sequence-longer-than-context", lambda: GPT2StyleLM(VOCAB, MAX_SEQ, D_MODEL, 1, HEADS, D_FF)(
        torch.zeros(1, 9, dtype=torch.long)), Raises(ValueError, "9 tokens", "context_length=8")),
    case("GPT2StyleLM-id-equal-to-vocab", lambda: GPT2StyleLM(VOCAB, MAX_SEQ, D_MODEL, 1, HEADS, D_FF)(
        torch.tensor([[1, 50]])), Raises(ValueError, "[0, 49]", "from 1 to 50")),
    case("GPT2StyleLM-heads-do-not-divide-d_model", lambda: GPT2StyleLM(VOCAB, MAX_SEQ, 10, 1, 3, D_FF),
         Raises(ValueError, "num_heads dividing d_model", "d_model=10", "num_heads=3")),
    case("train_bpe-vocab-below-the-bytes-and-specials", lambda: train_bpe("no/such/plays.txt", 256, ["<|endoftext|>"]),
         Raises(ValueError, "vocab_size=256", "256 bytes + 1 special tokens")),
    case("train_bpe-missing-file", lambda: train_bpe("no/such/plays.txt", 300),
         Raises(FileNotFoundError, "no text file at no/such/plays.txt")),
    case("Tokenizer-decode-id-outside-the-vocab", lambda: _bytes_tokenizer().decode([104, 256]),
         Raises(ValueError, "id 256 is not in the vocabulary", "0 … 255")),
    case("Tokenizer-encode-bytes", lambda: _bytes_tokenizer().encode(b"hello"),
         Raises(TypeError, "Tokenizer.encode takes a str", "got bytes")),
    case("read_metadata-of-a-path", lambda: read_metadata("model.gguf"),
         Raises(TypeError, "read_metadata takes a gguf.GGUFReader", "got str")),
    case("model_config-another-architecture", lambda: model_config({"general.architecture": "gpt2"}, []),
         Raises(ValueError, "llama architecture", "'gpt2'")),
    case("dequantize_q8_0-part-of-a-block", lambda: dequantize_q8_0(torch.zeros(2, 33, dtype=torch.uint8)),
         Raises(ValueError, "whole blocks of 34 bytes", "shape (2, 33)")),
    case("dequantize_q4_1-floats", lambda: dequantize_q4_1(torch.zeros(20)),
         Raises(ValueError, "dequantize_q4_1 takes uint8 bytes", "got torch.float32")),
    case("tensor_of-bf16", lambda: tensor_of(_bf16_tensor()), Raises(ValueError, "is BF16", "reads F32")),
    case("our_name-unknown-tensor", lambda: our_name("blk.3.attn_qk.weight"),
         Raises(ValueError, "no TransformerLM weight", "'blk.3.attn_qk.weight'")),
    case("tokenizer_from_gguf-sentencepiece", lambda: tokenizer_from_gguf({"tokenizer.ggml.model": "llama"}),
         Raises(ValueError, "byte-level BPE", "'llama'")),
    case("default_system-not-a-str", lambda: default_system(["<|im_start|>system"]),
         Raises(TypeError, "default_system takes the chat template as a str", "got list")),
    case("chat_prompt-no-messages", lambda: chat_prompt([]), Raises(ValueError, "the message list is empty")),
    case("chat_prompt-a-str", lambda: chat_prompt(["hello"]), Raises(ValueError, "a message is", "got 'hello'")),
    case("load_gguf-missing-file", lambda: load_gguf("no/such/model.gguf"),
         Raises(FileNotFoundError, "no/such/model.gguf", "make weights")),
    case("open_gguf-not-gguf", lambda: open_gguf(_not_gguf()), Raises(ValueError, "is not a GGUF file", "b'PK")),
    case("state_dict_from-a-path", lambda: state_dict_from("model.gguf"),
         Raises(TypeError, "state_dict_from takes the file's tensors", "got str")),
    case("with_tied_head-no-embedding", lambda: with_tied_head({"ln_final.weight": torch.ones(2)}, True),
         Raises(ValueError, "no token_embeddings.weight", "['ln_final.weight']")),
    case("model_from_state-config-list", lambda: model_from_state([49152, 576], {}),
         Raises(TypeError, "model_from_state takes the configuration as a dict", "got list")),
    case("chat_turn-not-a-str", lambda: chat_turn([], 42, lambda messages: "hi"),
         Raises(TypeError, "chat_turn: the question is a str", "got int")),
    case("Tokenizer-encode_iterable-of-ints", lambda: list(_bytes_tokenizer().encode_iterable([1, 2])),
         Raises(TypeError, "Tokenizer.encode_iterable takes a str", "got int")),
]


def _bf16_tensor():
    """A BF16 tensor of a tiny GGUF file (a type load_gguf does not read)."""
    import gguf
    from transformer_from_scratch.checks._tiny_gguf import write_tiny_gguf
    path = write_tiny_gguf(Path(tempfile.mkdtemp()) / "bf16.gguf", matrix_type="BF16")
    return next(t for t in gguf.GGUFReader(path).tensors if t.tensor_type.name == "BF16")


def _not_gguf() -> Path:
    """A file that is not GGUF: a zip archive's first bytes."""
    path = Path(tempfile.mkdtemp()) / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(60))
    return path


def _bytes_tokenizer() -> Tokenizer:
    """A tokenizer with the 256 bytes and no merge."""
    return Tokenizer({b: bytes([b]) for b in range(256)}, [])


def _checkpoint_of(model):
    """A checkpoint of `model` (and a fresh AdamW) in memory, ready to load."""
    buffer = io.BytesIO()
    save_checkpoint(model, AdamW(model.parameters()), 3, buffer)
    buffer.seek(0)
    return buffer


# Notebook 15's public names.
def _tiny_lm():
    return TransformerLM(32, 8, 16, 1, 2, 32, 10_000.0)


FINETUNE_CASES = [
    case("lora_delta-wrong-d_in", lambda: lora_delta(randn(2, 5), randn(2, 4), randn(3, 2), 1.0),
         TCE("lora_delta: A is", "does not fit"), Raises(ValueError, "lora_delta: x (..., d_in), A (rank, d_in)", "A (2, 4)")),
    case("assistant_targets-no-reply", lambda: assistant_targets([1, 2], []),
         Raises(ValueError, "assistant_targets: the prompt and the reply need at least one id each", "got 2 and 0")),
    case("pad_batch-no-examples", lambda: pad_batch([], 0), Raises(ValueError, "pad_batch: no examples")),
    case("pad_batch-lengths-differ", lambda: pad_batch([([1, 2], [3])], 0),
         Raises(ValueError, "pad_batch: example 0 has 2 ids and 1 targets")),
    case("masked_cross_entropy-nothing-counted", lambda: masked_cross_entropy(randn(1, 2, 3), torch.full((1, 2), -100)),
         Raises(ValueError, "masked_cross_entropy: every target is IGNORE")),
    case("exact_match-seq-differs", lambda: exact_match(randn(2, 3, 4), torch.zeros(2, 4, dtype=torch.long)),
         Raises(ValueError, "exact_match: logits (batch, seq, vocab) and integer targets (batch, seq)", "(2, 4)")),
    case("LoRALinear-biased-base", lambda: LoRALinear(nn.Linear(4, 3), 1, 1.0),
         Raises(TypeError, "LoRALinear: base must be a Linear without bias", "got Linear")),
    case("LoRALinear-rank-too-large", lambda: LoRALinear(Linear(4, 3), 4, 1.0),
         Raises(ValueError, "LoRALinear: rank must be an int in [1, min(d_in, d_out)] = [1, 3]", "got 4")),
    case("LoRALinear-alpha-zero", lambda: LoRALinear(Linear(4, 3), 1, 0.0),
         Raises(ValueError, "LoRALinear: alpha must be a number > 0", "got 0.0")),
    case("LoRALinear-forward-wrong-d_in", lambda: LoRALinear(Linear(4, 3), 1, 1.0)(randn(2, 5)),
         Raises(ValueError, "Linear expected an input of shape (..., 4)", "got shape (2, 5)")),
    case("apply_lora-unknown-target", lambda: apply_lora(_tiny_lm(), ("q_proj", "wq")),
         Raises(ValueError, "apply_lora: no Linear is called wq", "q_proj")),
    case("held_out-a-str", lambda: held_out("apple"), Raises(TypeError, "held_out takes the list's words", "'apple'")),
    case("reverse_task-split", lambda: reverse_task(random.Random(0), split="valid"),
         Raises(ValueError, "reverse_task: split is 'train' or 'test'", "'valid'")),
    case("encode_example-answer-a-list", lambda: encode_example(None, "Reverse: a, b", ["b", "a"], None),
         Raises(TypeError, "encode_example: the question and the answer are str", "got str and list")),
    case("wilson_interval-more-right-than-asked", lambda: wilson_interval(5, 4),
         Raises(ValueError, "wilson_interval: need ints 0 <= correct <= n and n >= 1", "correct=5, n=4")),
]
CASES += FINETUNE_CASES

# Notebook 16's public names (transformer_from_scratch.fast_decode).
FAST_DECODE_CASES = [
    case("decode_bytes-negative-cache-length", lambda: decode_bytes(lm(), -1),
         Raises(ValueError, "decode_bytes: cache_length must be an int >= 0", "got -1")),
    case("decode_bytes-float-cache-length", lambda: decode_bytes(lm(), 2.5),
         Raises(ValueError, "decode_bytes: cache_length must be an int >= 0", "got 2.5")),
    case("column_major-1d", lambda: column_major(randn(4)),
         Raises(ValueError, "column_major: a (d_out, d_in) matrix", "got shape (4,)")),
    case("fuse_weights-d_in-differs", lambda: fuse_weights(Linear(4, 3), Linear(5, 3)),
         Raises(ValueError, "fuse_weights: one or more linears with the same d_in", "[(3, 4), (3, 5)]")),
    case("fuse_weights-none", lambda: fuse_weights(),
         Raises(ValueError, "fuse_weights: one or more linears with the same d_in", "got weights of shapes []")),
    case("split_qkv-indivisible", lambda: split_qkv(randn(2, 3, 10), 4, 2),
         Raises(ValueError, "split_qkv: the last dimension must be (num_heads + 2·num_kv_heads)·d_k",
                "got 10 with num_heads=4, num_kv_heads=2")),
    case("quantize_int8-3d", lambda: quantize_int8(randn(2, 3, 4)),
         Raises(ValueError, "quantize_int8: a floating-point (d_out, d_in) matrix", "shape (2, 3, 4)")),
    case("quantize_int8-integer", lambda: quantize_int8(torch.zeros(3, 4, dtype=torch.long)),
         Raises(ValueError, "quantize_int8: a floating-point (d_out, d_in) matrix", "got torch.int64")),
    case("prepare_for_decode-not-a-model", lambda: prepare_for_decode(Linear(4, 3)),
         Raises(TypeError, "prepare_for_decode: a TransformerLM", "got Linear")),
    case("prepare_for_decode-threads-0", lambda: prepare_for_decode(lm(), threads=0),
         Raises(ValueError, "prepare_for_decode: threads must be an int >= 1 or None", "got 0")),
    case("prepare_for_decode-threads-float", lambda: prepare_for_decode(lm(), threads=1.5),
         Raises(ValueError, "prepare_for_decode: threads must be an int >= 1 or None", "got 1.5")),
    case("prepare_for_decode-lora", lambda: prepare_for_decode(_with_lora(lm())),
         Raises(TypeError, "prepare_for_decode: layers.0.attn.q_proj is a LoRALinear with no weight tensor",
                "put its .base back")),
    case("prepare_for_decode-layout", lambda: prepare_for_decode(lm(), layout="cols"),
         Raises(ValueError, "prepare_for_decode: layout must be one of ('auto', 'columns', 'rows')", "got 'cols'")),
    case("copy_bandwidth-no-repeats", lambda: copy_bandwidth(1024, repeats=0),
         Raises(ValueError, "copy_bandwidth: nbytes >= 4 and repeats >= 1", "repeats=0")),
    case("Int8Linear-3d-weight", lambda: Int8Linear(randn(2, 3, 4)),
         Raises(ValueError, "quantize_int8: a floating-point (d_out, d_in) matrix", "shape (2, 3, 4)")),
    case("FusedSelfAttention-wrong-last-dim", lambda: FusedSelfAttention(mha())(randn(2, 5, 12)),
         Raises(ValueError, "expected x of shape (..., seq, 16)", "got shape (2, 5, 12)")),
    case("FusedSelfAttention-sequence-too-long", lambda: FusedSelfAttention(mha())(randn(2, 9, D_MODEL)),
         Raises(ValueError, "the sequence has 9 tokens", "max_seq_len=8")),
    case("Int8Linear-wrong-last-dim", lambda: Int8Linear(randn(3, 4))(randn(2, 5)),
         Raises(ValueError, "Int8Linear: expected x of shape (..., 4)", "got shape (2, 5)")),
    case("FusedSwiGLU-wrong-last-dim", lambda: FusedSwiGLU(SwiGLU(D_MODEL, D_FF))(randn(2, 12)),
         Raises(ValueError, "FusedSwiGLU: expected x of shape (..., 16)", "got shape (2, 12)")),
    case("FusedMatmul-wrong-last-dim", lambda: FusedMatmul(randn(3, 4))(randn(2, 5)),
         Raises(ValueError, "FusedMatmul: expected x of shape (..., 4)", "got shape (2, 5)")),
    case("faster_layout-1d", lambda: faster_layout(randn(4)),
         Raises(ValueError, "faster_layout: a (d_out, d_in) matrix", "got shape (4,)")),
    case("attend_at-k-not-one-position", lambda: attend_at(randn(1, 4, 1, 8), randn(1, 2, 3, 8), randn(1, 2, 3, 8),
                                                           randn(1, 2, 6, 8), randn(1, 2, 6, 8), torch.tensor([0])),
         Raises(ValueError, "attend_at: k and v (..., kv_heads, 1, d_k) must fit the buffers", "got k (1, 2, 3, 8)")),
    case("attend_at-heads-not-a-multiple", lambda: attend_at(randn(1, 3, 1, 8), randn(1, 2, 1, 8), randn(1, 2, 1, 8),
                                                             randn(1, 2, 6, 8), randn(1, 2, 6, 8), torch.tensor([0])),
         Raises(ValueError, "attend_at: q (..., heads, 1, d_k) with heads a multiple of k's 2", "got q (1, 3, 1, 8)")),
    case("attend_at-two-positions", lambda: attend_at(randn(1, 4, 1, 8), randn(1, 2, 1, 8), randn(1, 2, 1, 8),
                                                      randn(1, 2, 6, 8), randn(1, 2, 6, 8), torch.tensor([0, 1])),
         Raises(ValueError, "attend_at: position must be one integer in a tensor of shape (1,)", "got shape (2,)")),
    case("attend_at-float-position", lambda: attend_at(randn(1, 4, 1, 8), randn(1, 2, 1, 8), randn(1, 2, 1, 8),
                                                       randn(1, 2, 6, 8), randn(1, 2, 6, 8), torch.tensor([0.0])),
         Raises(TypeError, "attend_at: position must be one integer", "dtype torch.float32")),
    case("static_step-not-prepared", lambda: static_step(lm(), torch.tensor([1]), torch.tensor([0]), [], []),
         Raises(TypeError, "static_step: a TransformerLM prepared by prepare_for_decode", "got TransformerLM")),
    case("static_step-two-tokens", lambda: static_step(prepare_for_decode(lm()), torch.tensor([1, 2]),
                                                       torch.tensor([0]), [], []),
         Raises(ValueError, "static_step: one token and one position, each of shape (1,)", "token of shape (2,)")),
    case("static_step-buffers-missing", lambda: static_step(prepare_for_decode(lm()), torch.tensor([1]),
                                                            torch.tensor([0]), [], []),
         Raises(ValueError, "static_step: one key and one value buffer per block", "got 0 and 0")),
    case("int8_matmul-wrong-d_in", lambda: int8_matmul(randn(2, 5), torch.zeros(3, 4, dtype=torch.int8), torch.ones(3)),
         TCE("int8_matmul: q is i8[3,4]", "d_in=5"),
         off=Raises(ValueError, "int8_matmul: expected x of shape (..., 4)", "got shape (2, 5)")),
]
CASES += FAST_DECODE_CASES


@pytest.mark.parametrize("checks", [True, False], ids=["checks-on", "checks-off"])
@pytest.mark.parametrize("call, on, off", CASES)
def test_bad_input_raises_a_clear_error(checks, call, on, off):
    expected = on if checks else off
    with shape_checks(checks):
        with pytest.raises(Exception) as caught:
            call()
    first_line = str(caught.value).partition("\n")[0]
    # The exact type: a TypeCheckError (a TypeError) with the checks off would mean they were not off.
    assert caught.type is expected.error, f"raised {caught.type.__name__}: {first_line}"
    missing = [phrase for phrase in expected.phrases if phrase not in first_line]
    assert not missing, f"first line {first_line!r} lacks {missing}"


def test_the_cases_have_unique_names_and_cover_every_public_name():
    import transformer_from_scratch as tfs

    names = [param.id for param in CASES]
    assert len(names) == len(set(names))
    covered = {name.split("-")[0] for name in names}
    aliases = {"attention": "scaled_dot_product_attention", "RoPE": "RotaryPositionalEmbedding",
               "MHA": "MultiHeadSelfAttention", "Block": "TransformerBlock", "LM": "TransformerLM"}
    covered = {aliases.get(name, name) for name in covered}
    switches = {"set_shape_checks", "shape_checks", "shape_checks_enabled", "trusted"}  # test_compile, test_kv_cache
    switches |= {"GPT2_PATTERN", "bytes_to_unicode"}  # a constant, and a function without arguments
    assert set(tfs.__all__) - switches <= covered, set(tfs.__all__) - switches - covered


# ---- Nothing broadcasts silently ---------------------------------------------------------------------------------
# Each row: our call, and the same inputs through PyTorch's own op or the textbook formula, which broadcasts
# them without complaint (so the row proves something): ours must raise instead, with the checks on and off.


def _qkv(q=(2, 5, 8), k=(2, 7, 8), v=(2, 7, 3)):
    return randn(*q), randn(*k), randn(*v)


def _textbook_attention(Q, K, V, mask=None):
    scores = Q @ K.transpose(-2, -1) / Q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ V


def _textbook_rope(x, positions, d_k=D_K, theta=THETA):
    angles = positions[..., None].double() * theta ** (-torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


BROADCASTS = [
    pytest.param(lambda: scaled_dot_product_attention(*_qkv(k=(1, 7, 8), v=(1, 7, 3))),
                 lambda: F.scaled_dot_product_attention(*_qkv(k=(1, 7, 8), v=(1, 7, 3))),
                 (2, 5, 3), id="attention-K-V-leading-1"),
    pytest.param(lambda: scaled_dot_product_attention(*_qkv(q=(5, 8))),
                 lambda: F.scaled_dot_product_attention(*_qkv(q=(5, 8))),
                 (2, 5, 3), id="attention-Q-without-the-batch-dim"),
    pytest.param(lambda: scaled_dot_product_attention(*_qkv(), ones(5, 1)),
                 lambda: F.scaled_dot_product_attention(*_qkv(), attn_mask=ones(5, 1)),
                 (2, 5, 3), id="attention-mask-n-by-1"),
    pytest.param(lambda: scaled_dot_product_attention(*_qkv(), ones(1, 2, 5, 7)),
                 lambda: _textbook_attention(*_qkv(), ones(1, 2, 5, 7)),
                 (1, 2, 5, 3), id="attention-mask-more-dims-than-Q"),
    pytest.param(lambda: RMSNorm(4)(randn(2, 1)),
                 lambda: randn(2, 1) * torch.rsqrt(randn(2, 1).pow(2).mean(-1, keepdim=True) + 1e-5) * torch.ones(4),
                 (2, 4), id="RMSNorm-last-dim-1"),
    pytest.param(lambda: rope()(randn(2, 5, 8), torch.tensor([3])),
                 lambda: _textbook_rope(randn(2, 5, 8), torch.tensor([3])),
                 (2, 5, 8), id="RoPE-one-position-for-every-token"),
    pytest.param(lambda: rope()(randn(5, 8), torch.arange(5).expand(2, 5)),
                 lambda: _textbook_rope(randn(5, 8), torch.arange(5).expand(2, 5)),
                 (2, 5, 8), id="RoPE-positions-with-more-dims-than-x"),
    pytest.param(lambda: mha()(randn(2, 5, 16), torch.tensor([0])), None, None, id="MHA-one-position"),
    pytest.param(lambda: lm()(torch.zeros(5, dtype=torch.long), torch.arange(5).expand(2, 5)), None, None,
                 id="LM-positions-with-more-dims-than-ids"),
]


@pytest.mark.parametrize("checks", [True, False], ids=["checks-on", "checks-off"])
@pytest.mark.parametrize("ours, theirs, broadcast_shape", BROADCASTS)
def test_nothing_broadcasts_silently(checks, ours, theirs, broadcast_shape):
    if theirs is not None:
        assert theirs().shape == broadcast_shape  # the built-in or the formula broadcasts these inputs silently
    with shape_checks(checks), pytest.raises((ValueError, TypeError)):
        ours()

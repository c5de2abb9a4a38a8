"""Self-checks for the steps of notebook 14 (a real model from a GGUF file): the model's configuration from the file's
metadata, dequantizing Q8_0 and Q4_1 blocks, the tensors' names in TransformerLM's state dict, the state dict from the
file's tensors, the tie, the model built on the meta device with its RoPE tables, the tokenizer from the metadata, and
the ChatML prompt (and exercise 1's last question, times_smaller).

Each compares the learner's function with an independent answer (llama.cpp's own ``gguf.quants`` for the blocks, the
file's Jinja template rendered by ``jinja2`` for the prompt, tables written out here for the rest) on small made-up
inputs whose numbers are not SmolLM2's, so that a hard-coded answer fails; when they differ, it computes the classic
mistakes one by one and names the first the learner's result matches.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import gguf
import numpy as np
import torch

from ...tokenizer import GPT2_PATTERN, bytes_to_unicode
from .._fixtures import reference_tokenizer as _reference_tokenizer
from .._harness import attempt, call, crashed, describe, expect_tensor, fail, first_line, passed, refuses
from ..tokenizer import short

# ---------------------------------------------------------------------------------------------------------
# Step 1 · the configuration from the metadata
# ---------------------------------------------------------------------------------------------------------

CONFIG_KEYS = {"vocab_size": "the length of tokenizer.ggml.tokens", "context_length": "llama.context_length",
               "d_model": "llama.embedding_length", "num_layers": "llama.block_count",
               "num_heads": "llama.attention.head_count", "d_ff": "llama.feed_forward_length",
               "rope_theta": "llama.rope.freq_base", "num_kv_heads": "llama.attention.head_count_kv",
               "norm_eps": "llama.attention.layer_norm_rms_epsilon",
               "tie_embeddings": "whether the file lacks output.weight"}


def fake_metadata(architecture: str = "llama", *, vocab: int = 300, merges: int = 40, context_length: int = 96,
                  d_model: int = 48, num_layers: int = 3, num_heads: int = 6, num_kv_heads: int = 2, d_ff: int = 160,
                  theta: float = 50000.0, eps: float = 1e-6) -> dict:
    """A GGUF's metadata as read_metadata gives it, with made-up sizes (not SmolLM2's) and no llama.vocab_size."""
    p = architecture + "."
    return {"general.architecture": architecture, "general.name": "made-up",
            f"{p}context_length": context_length, f"{p}embedding_length": d_model, f"{p}block_count": num_layers,
            f"{p}feed_forward_length": d_ff, f"{p}attention.head_count": num_heads,
            f"{p}attention.head_count_kv": num_kv_heads, f"{p}rope.freq_base": theta,
            f"{p}attention.layer_norm_rms_epsilon": eps, "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.tokens": [f"t{i}" for i in range(vocab)], "tokenizer.ggml.token_type": [1] * vocab,
            "tokenizer.ggml.merges": [f"t {i}" for i in range(merges)]}


def _tensor_names(num_layers: int, tied: bool) -> list[str]:
    names = ["token_embd.weight", "output_norm.weight"] + ([] if tied else ["output.weight"])
    return names + [f"blk.{i}.{part}.weight" for i in range(num_layers) for part in
                    ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                     "ffn_down")]


CONFIG_CASES = [  # (metadata's sizes, tied)
    (dict(), True),
    (dict(vocab=260, merges=3, context_length=40, d_model=32, num_layers=2, num_heads=8, num_kv_heads=4, d_ff=96,
          theta=20000.0, eps=3e-5), False),
]


def _expected_config(sizes: dict, tied: bool) -> dict:
    s = {**dict(vocab=300, context_length=96, d_model=48, num_layers=3, num_heads=6, num_kv_heads=2, d_ff=160,
                theta=50000.0, eps=1e-6), **sizes}
    return dict(vocab_size=s["vocab"], context_length=s["context_length"], d_model=s["d_model"],
                num_layers=s["num_layers"], num_heads=s["num_heads"], d_ff=s["d_ff"], rope_theta=s["theta"],
                num_kv_heads=s["num_kv_heads"], norm_eps=s["eps"], tie_embeddings=tied)


_CONFIG_FIX = "read each size from the metadata's llama.* key (CONFIG_KEYS in the notebook's table)"


def check_model_config(model_config: Callable[[dict, list[str]], dict]) -> None:
    """Check ``model_config(metadata, tensor_names)``: TransformerLM's keyword arguments from a llama file's metadata
    (made-up sizes, two cases: tied and untied), and a ValueError naming the architecture for another one.

    Mistakes it recognises: num_heads and num_kv_heads swapped; d_model and d_ff swapped; tie_embeddings inverted, or
    always False; vocab_size read from llama.vocab_size (not in every file) or counted from the merges; rope_theta or
    norm_eps not read (left at TransformerLM's defaults) or missing; another architecture accepted, refused with
    another error, or refused without its name.
    """
    outs = []
    for sizes, tied in CONFIG_CASES:
        metadata = fake_metadata(**sizes)
        names = _tensor_names(metadata["llama.block_count"], tied)
        what = f"model_config(metadata, tensor_names) on a made-up {'tied' if tied else 'untied'} file"
        out, error = attempt(what, model_config, dict(metadata), list(names))
        if isinstance(error, KeyError) and "vocab_size" in str(error):
            fail(f"{what} raised KeyError {error}: it reads the vocabulary's size from a key not every file has",
                 "the vocabulary is the list tokenizer.ggml.tokens: vocab_size is its length")
        if error is not None:
            crashed(what, error)
        if not isinstance(out, dict):
            fail(f"{what} returned {describe(out)}, not a dict", "return TransformerLM's keyword arguments as a dict, "
                 "so that TransformerLM(**config) builds the model")
        outs.append((out, _expected_config(sizes, tied), metadata, what))
    for out, expected, metadata, what in outs:
        missing, extra = sorted(set(expected) - set(out)), sorted(set(out) - set(expected))
        if "norm_eps" in missing or "rope_theta" in missing:
            key = "norm_eps" if "norm_eps" in missing else "rope_theta"
            fail(f"{what} has no {key}: the model would use TransformerLM's default instead of the file's "
                 f"{CONFIG_KEYS[key]}", "read it from the metadata too: a model runs well only with the numbers it "
                 "was trained with")
        if missing or extra:
            fail(f"{what} returned the keys {sorted(out)}, not TransformerLM's keyword arguments",
                 "return exactly " + ", ".join(expected), f"missing: {missing}, unexpected: {extra}")
    untied = [out["tie_embeddings"] for out, expected, _, _ in outs if not expected["tie_embeddings"]]
    tied = [out["tie_embeddings"] for out, expected, _, _ in outs if expected["tie_embeddings"]]
    if all(untied) and not any(tied):
        fail("tie_embeddings is inverted: it is True when the file has output.weight", "a file without output.weight "
             "ties the embeddings (the output layer reads the embedding matrix): tie exactly when 'output.weight' "
             "is not among the tensor names")
    if not any(tied):
        fail("tie_embeddings is False for a file without output.weight", "with no output matrix in the file the "
             "output layer reads the embedding matrix: tie exactly when 'output.weight' is not among the tensor names")
    if any(untied):
        fail("tie_embeddings is True for a file that has output.weight", "tie only when the file has no output "
             "matrix, when 'output.weight' is not among the tensor names")
    for out, expected, metadata, what in outs:
        if out == expected:
            continue
        if (out["num_heads"], out["num_kv_heads"]) == (expected["num_kv_heads"], expected["num_heads"]):
            fail("num_heads and num_kv_heads are swapped", "attention.head_count is the number of query heads "
                 "(num_heads), attention.head_count_kv the fewer key/value heads that groups of them share")
        if (out["d_model"], out["d_ff"]) == (expected["d_ff"], expected["d_model"]):
            fail("d_model and d_ff are swapped", "embedding_length is the width of the residual stream (d_model), "
                 "feed_forward_length the SwiGLU's hidden width (d_ff)")
        if out["vocab_size"] == len(metadata["tokenizer.ggml.merges"]):
            fail("vocab_size is the number of merges", "the vocabulary is the list tokenizer.ggml.tokens (the "
                 "bytes, the merged tokens and the special tokens): vocab_size is its length")
        for key, default in (("rope_theta", 10000.0), ("norm_eps", 1e-5)):
            if out[key] != expected[key] and out[key] == default:
                fail(f"{key} is {default}, TransformerLM's default, not the file's", f"read it from "
                     f"{CONFIG_KEYS[key]}: a model runs well only with the numbers it was trained with")
        key = next(k for k in expected if out[k] != expected[k])
        fail(f"{what}: {key} is {out[key]!r}, expected {expected[key]!r}", f"{key} is {CONFIG_KEYS[key]}")
    _check_other_architecture(model_config)
    passed("model_config: TransformerLM's sizes from the llama.* keys, vocab_size from the tokens, tied embeddings "
           "exactly when the file has no output.weight; another architecture refused by name")


def _check_other_architecture(model_config: Callable[[dict, list[str]], dict]) -> None:
    metadata = fake_metadata("qwen2")
    what = "model_config(metadata, tensor_names) on a made-up file whose general.architecture is 'qwen2'"
    error = refuses(what, lambda: model_config(metadata, _tensor_names(3, True)), ValueError,
                    "another architecture is accepted, though it has other parts (biases, another norm, …) and this "
                    "TransformerLM would compute something else with its numbers",
                    "check general.architecture first and raise ValueError when it is not 'llama'")
    if "qwen2" not in str(error):
        fail(f"{what} raised ValueError without naming the architecture ({str(error).strip()[:80]})",
             "say which architecture the file has (general.architecture) and that 'llama' is what it reads")


# ---------------------------------------------------------------------------------------------------------
# Step 2 · dequantizing Q8_0 and Q4_1
# ---------------------------------------------------------------------------------------------------------

def _f16(two_bytes: torch.Tensor) -> torch.Tensor:
    return two_bytes.contiguous().view(torch.float16).float()


def _as(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return raw.contiguous().view(dtype).float()


def _per_row(scale: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Each row's first block's scale for every block of that row: one scale per row, (blocks, 1) as the scales."""
    rows = scale.reshape(*blocks.shape[:-1], -1) if blocks.dim() > 1 else scale.reshape(1, -1)
    return rows[..., :1].expand_as(rows).reshape(-1, 1)


def q8_0_variant(blocks: torch.Tensor, mistake: str | None = None) -> torch.Tensor:
    """Q8_0 dequantized (d·q) with a named mistake."""
    b = blocks.reshape(-1, 34)
    d, q = _f16(b[:, :2]), b[:, 2:].contiguous().view(torch.int8).float()
    if mistake == "unsigned":
        q = b[:, 2:].float()
    elif mistake == "scale_int":
        d = b[:, :2].contiguous().view(torch.int16).float()
    elif mistake == "big_endian":
        d = _f16(b[:, :2].flip(-1))
    elif mistake == "scale_at_end":
        d, q = _f16(b[:, 32:]), b[:, :32].contiguous().view(torch.int8).float()
    elif mistake == "one_scale":
        d = d[:1].expand_as(d)
    elif mistake == "row_scale":
        d = _per_row(d, blocks)
    elif mistake == "scale_bf16":
        d = _as(b[:, :2], torch.bfloat16)
    elif mistake == "scale_fp32":
        d = _as(b[:, :4], torch.float32)
    out = q / d if mistake == "divided" else d * q
    return out.reshape(*blocks.shape[:-1], -1)


def q4_1_variant(blocks: torch.Tensor, mistake: str | None = None) -> torch.Tensor:
    """Q4_1 dequantized (d·q + m) with a named mistake."""
    b = blocks.reshape(-1, 20)
    d, m, qs = _f16(b[:, 0:2]), _f16(b[:, 2:4]), b[:, 4:]
    low, high = qs & 0x0F, qs >> 4
    q = torch.cat([low, high], dim=1)
    if mistake == "interleaved":
        q = torch.stack([low, high], dim=-1).reshape(-1, 32)
    elif mistake == "high_first":
        q = torch.cat([high, low], dim=1)
    elif mistake == "unshifted":
        q = torch.cat([low, qs & 0xF0], dim=1)
    elif mistake == "scale_int":
        d, m = b[:, 0:2].contiguous().view(torch.int16).float(), b[:, 2:4].contiguous().view(torch.int16).float()
    elif mistake == "big_endian":
        d, m = _f16(b[:, 0:2].flip(-1)), _f16(b[:, 2:4].flip(-1))
    elif mistake == "d_m_swapped":
        d, m = m, d
    elif mistake == "one_scale":
        d, m = d[:1].expand_as(d), m[:1].expand_as(m)
    elif mistake == "row_scale":
        d, m = _per_row(d, blocks), _per_row(m, blocks)
    elif mistake == "scale_bf16":
        d, m = _as(b[:, 0:2], torch.bfloat16), _as(b[:, 2:4], torch.bfloat16)
    elif mistake == "scale_fp32":
        d = _as(b[:, 0:4], torch.float32)
    q = q.float()
    if mistake == "offset":
        q = q - 8
    out = {"no_min": d * q, "min_multiplied": d * q * m, "min_subtracted": d * q - m,
           "divided": q / d + m}.get(mistake, d * q + m)
    return out.reshape(*blocks.shape[:-1], -1)


_SCALE_INT = ("the scale is read as an integer: its two bytes are a float16 (sign, exponent, mantissa)",
              "view the two bytes as torch.float16 (then .float()), not as an integer")
_BF16 = ("the scale is read as bfloat16: GGUF stores it as float16 (IEEE half precision)",
         "the same 16 bits split otherwise: float16 has 5 exponent bits and 10 of mantissa, bfloat16 8 and 7; view "
         "the two bytes as torch.float16")
_FP32 = ("the scale is read as a float32 from 4 bytes: it is a float16, 2 bytes",
         "a block starts with a 2-byte float16 scale, and the bytes after it are already the block's values")
_DIVIDED = ("the weights are q / d: the scale multiplies", "quantizing divided each weight by d and rounded it to q, "
            "so d·q undoes it")
_BIG_ENDIAN = ("the scale's two bytes are read in the wrong order", "GGUF is little-endian: the low byte comes first, "
               "exactly what .view(torch.float16) on the two bytes reads")
Q8_0_MISTAKES = {
    "unsigned": ("q is read as unsigned (uint8): Q8_0's 32 values are signed bytes, -128 … 127",
                 "view those 32 bytes as torch.int8, so that a byte above 127 is a negative q"),
    "scale_int": _SCALE_INT,
    "big_endian": _BIG_ENDIAN,
    "scale_at_end": ("the scale is read from the end of the block", "a Q8_0 block is the float16 scale d (bytes "
                     "0–1) then the 32 int8 values q (bytes 2–33)"),
    "one_scale": ("every block uses the first block's scale", "each 34-byte block has its own scale d: reshape to "
                  "(-1, 34) and take the scale of every row"),
    "row_scale": ("each row uses one scale, its first block's: every block of 32 weights has its own",
                  "a row of the matrix holds several blocks: cut it into blocks of 34 bytes and take each one's scale"),
    "scale_bf16": _BF16,
    "scale_fp32": _FP32,
    "divided": _DIVIDED,
}
Q4_1_MISTAKES = {
    "interleaved": ("the nibbles are interleaved (low, high, low, high, …)", "byte j's low nibble is weight j and "
                    "its high nibble weight j + 16: all 16 low nibbles first, then all 16 high ones"),
    "high_first": ("the high and low nibbles are swapped", "byte j's LOW nibble (& 0x0F) is weight j, its HIGH "
                   "nibble (>> 4) weight j + 16"),
    "unshifted": ("the high nibbles are masked but not shifted (& 0xF0 gives 16·q)", "shift them down: byte >> 4 is "
                  "the high nibble as a number 0 … 15"),
    "no_min": ("the minimum m is forgotten", "Q4_1 stores 32 weights as d·q + m: q runs over 0 … 15, so m shifts "
               "them down to the block's smallest weight"),
    "min_multiplied": ("the minimum m is multiplied in, not added", "each weight is d·q + m: m is the block's "
                       "smallest weight, added to the step d times q"),
    "d_m_swapped": ("the scale d and the minimum m are swapped", "a Q4_1 block is d (bytes 0–1), then m (bytes "
                    "2–3), then the 16 bytes of nibbles"),
    "offset": ("q is shifted by 8 (q − 8), as in Q4_0", "Q4_1's q runs over 0 … 15 unshifted: its minimum m does "
               "the shifting, d·q + m"),
    "scale_int": _SCALE_INT,
    "big_endian": _BIG_ENDIAN,
    "one_scale": ("every block uses the first block's scale and minimum", "each 20-byte block has its own d and m: "
                  "reshape to (-1, 20) and take them from every row"),
    "row_scale": ("each row uses one scale and minimum, its first block's: every block of 32 weights has its own",
                  "a row of the matrix holds several blocks: cut it into blocks of 20 bytes and take each one's d "
                  "and m"),
    "min_subtracted": ("the minimum m is subtracted, not added", "m is the block's smallest weight, where q = 0 "
                       "lands: each weight is d·q + m"),
    "scale_bf16": _BF16,
    "scale_fp32": _FP32,
    "divided": _DIVIDED,
}

DEQUANTIZERS = {"Q8_0": (q8_0_variant, Q8_0_MISTAKES), "Q4_1": (q4_1_variant, Q4_1_MISTAKES)}


TRANSPOSED_FIX = ("ggml's shape lists the fastest axis first: reshape the values to the reversed shape, (d_out, d_in), "
                  "and do not transpose them")


def holds_transposed(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """True when a matrix holds the file's values read in ggml's shape and then transposed (the classic mistake)."""
    return expected.dim() == 2 and torch.allclose(got, expected.reshape(expected.shape[::-1]).T, rtol=1e-6, atol=1e-6)


def named_dequantization_mistake(out: torch.Tensor, blocks: torch.Tensor, expected: torch.Tensor,
                                 kind: str) -> tuple[str, str] | None:
    """The classic mistake (message, fix) whose result ``out`` matches, for blocks of type ``kind`` whose right
    values are ``expected``; None if none does. Shared by the steps' checks and check_load_gguf."""
    variant, mistakes = DEQUANTIZERS[kind]
    out, expected = out.detach().cpu().double().flatten(), expected.double().flatten()
    for mistake, (message, fix) in mistakes.items():
        wrong = variant(blocks, mistake).double().flatten()
        if wrong.shape == out.shape and \
                not torch.allclose(wrong, expected, rtol=1e-6, atol=1e-6, equal_nan=True) and \
                torch.allclose(out, wrong, rtol=1e-6, atol=1e-6, equal_nan=True):
            return message, fix
    return None


def _blocks_of(shape: tuple[int, ...], kind: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random weights of ``shape`` quantized by gguf.quants: the blocks (uint8) and their values, dequantized by
    gguf.quants too (llama.cpp's own numpy code: an independent answer)."""
    qtype = gguf.GGMLQuantizationType[kind]
    rng = np.random.default_rng(seed)
    weights = (rng.standard_normal(shape) * rng.uniform(0.01, 3.0, shape[:-1] + (1,))).astype(np.float32)
    weights[..., :1] += rng.uniform(-2.0, 2.0, shape[:-1] + (1,)).astype(np.float32)  # blocks not centred on 0
    blocks = gguf.quants.quantize(weights, qtype)
    return torch.from_numpy(blocks.copy()), torch.from_numpy(gguf.quants.dequantize(blocks, qtype).copy())


DEQUANT_SHAPES = [(3, 64), (2, 2, 32), (32,), (1, 96)]


def _check_dequantize(fn: Callable[[torch.Tensor], torch.Tensor], kind: str, block: int, header: int,
                      variant: Callable[[torch.Tensor, str], torch.Tensor], mistakes: dict[str, tuple[str, str]],
                      layout: str) -> None:
    name = f"dequantize_{kind.lower()}"
    for seed, shape in enumerate(DEQUANT_SHAPES):
        blocks, expected = _blocks_of(shape, kind, seed)
        what = f"{name}(blocks of shape {tuple(blocks.shape)})"
        out = expect_tensor(what, call(what, fn, blocks.clone()), fix=f"return the weights as a float32 tensor",
                            returns="return the weights as a float32 tensor of shape (*rows, n)")
        if out.dtype == torch.float16:
            fail(f"{what} returned float16: the scale is float16, and d·q stays float16 unless it is converted",
                 "convert the scale (and q) to float32 before multiplying: the model computes in float32")
        if out.dtype != torch.float32:
            fail(f"{what} returned {out.dtype}, expected torch.float32", "return float32 weights: convert the "
                 "float16 scale with .float(), and q too")
        nbytes = blocks.shape[-1]
        if out.dim() == 1 and expected.dim() > 1 and out.numel() == expected.numel():
            fail(f"{what} returned shape {tuple(out.shape)}, expected {tuple(expected.shape)}: the rows are lost",
                 "keep the leading axes: the result has the blocks' shape with the last axis of bytes turned into "
                 f"the weights, (*rows, n), n = 32 per {block} bytes")
        if nbytes > block and tuple(out.shape) == (*blocks.shape[:-1], (nbytes - header) * (32 // (block - header))):
            fail(f"{what} reads a whole row as one block: a row of {nbytes} bytes holds {nbytes // block} blocks",
                 f"cut the bytes into blocks of {block} (reshape(-1, {block})): each block is {layout}")
        if tuple(out.shape) != tuple(expected.shape):
            fail(f"{what} returned shape {tuple(out.shape)}, expected {tuple(expected.shape)}", f"every {block} "
                 f"bytes give 32 weights: (*rows, nbytes) -> (*rows, nbytes // {block} * 32)")
        if torch.allclose(out, expected, rtol=1e-6, atol=1e-6):
            continue
        if (named := named_dequantization_mistake(out, blocks, expected, kind)) is not None:
            fail(*named, f"on {what}: yours matches that mistake")
        worst = (out - expected).abs().nan_to_num(nan=float("inf")).max().item()
        fail(f"{what} differs from llama.cpp's dequantization by up to {worst:.3g}", f"each block of {block} bytes is "
             f"{layout}", _first_wrong_weights(out, expected))


def _first_wrong_weights(out: torch.Tensor, expected: torch.Tensor, count: int = 4) -> str:
    """The evidence of a wrong dequantization: where the first wrong weight lies (its block, counted in reading order
    over the rows, and its place among the block's 32) and the weights from there, yours and the expected ones."""
    out, expected = out.flatten(), expected.flatten()
    wrong = ~torch.isclose(out, expected, rtol=1e-6, atol=1e-6)
    first = int(wrong.nonzero()[0])
    return (f"the first wrong weight is weight {first % 32} of block {first // 32}: from there, yours "
            f"{[round(v, 4) for v in out[first:first + count].tolist()]}, expected "
            f"{[round(v, 4) for v in expected[first:first + count].tolist()]}")


def check_dequantize_q8_0(dequantize_q8_0: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Check ``dequantize_q8_0(blocks)``: uint8 blocks (*rows, nbytes) of 34 bytes, a little-endian float16 scale d
    then 32 int8 q, to the float32 weights d·q, (*rows, nbytes // 34 * 32); against gguf.quants (llama.cpp's code) on
    random rows of one to several blocks, and a lone block.

    Mistakes it recognises: q read as unsigned; the scale read as an integer, as bfloat16, as a float32 of 4 bytes,
    with its bytes swapped, or from the end of the block; one scale for every block, or one per row; q / d for d·q;
    a whole row read as one block; the rows lost (a flat result); float16 (or another dtype) out.
    """
    _check_dequantize(dequantize_q8_0, "Q8_0", 34, 2, q8_0_variant, Q8_0_MISTAKES,
                      "a float16 scale d (bytes 0–1) then 32 int8 values q: weights d·q")
    passed("dequantize_q8_0: d·q with d the block's little-endian float16, q signed bytes; every block its own "
           "scale; (*rows, n) float32, as llama.cpp's gguf.quants")


def check_dequantize_q4_1(dequantize_q4_1: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Check ``dequantize_q4_1(blocks)``: uint8 blocks (*rows, nbytes) of 20 bytes, float16 d and m then 16 bytes of
    nibbles (byte j: weight j in the low nibble, weight j + 16 in the high one), to the float32 weights d·q + m,
    (*rows, nbytes // 20 * 32); against gguf.quants (llama.cpp's code).

    Mistakes it recognises: the nibbles interleaved; high and low swapped; the high ones not shifted; the minimum
    forgotten, multiplied or subtracted; d and m swapped; q shifted by 8 (Q4_0's offset); q / d for d·q; the scales
    read as integers, as bfloat16, as a float32 of 4 bytes, or with their bytes swapped; one scale for every block, or
    one per row; a whole row read as one block; the rows lost; float16 (or another
    dtype) out.
    """
    _check_dequantize(dequantize_q4_1, "Q4_1", 20, 4, q4_1_variant, Q4_1_MISTAKES,
                      "float16 d (bytes 0–1), float16 m (bytes 2–3), then 16 bytes whose low nibbles are weights "
                      "0–15 and high nibbles weights 16–31: weights d·q + m")
    passed("dequantize_q4_1: d·q + m, the low nibbles first then the high ones; every block its own d and m; "
           "(*rows, n) float32, as llama.cpp's gguf.quants")


# ---------------------------------------------------------------------------------------------------------
# Step 3 · the tensors' names
# ---------------------------------------------------------------------------------------------------------

TOP_NAMES = {"token_embd.weight": "token_embeddings.weight", "output_norm.weight": "ln_final.weight",
             "output.weight": "lm_head.weight"}
BLOCK_NAMES = {"attn_norm": "ln1", "attn_q": "attn.q_proj", "attn_k": "attn.k_proj", "attn_v": "attn.v_proj",
               "attn_output": "attn.output_proj", "ffn_norm": "ln2", "ffn_gate": "ffn.w1", "ffn_up": "ffn.w3",
               "ffn_down": "ffn.w2"}
BLOCK_NUMBERS = [0, 7, 12, 29, 104]
UNKNOWN_NAMES = ["blk.3.attn_qkv.weight", "rope_freqs.weight", "blk.2.ffn_gate.bias"]


def check_our_name(our_name: Callable[[str], str]) -> None:
    """Check ``our_name(gguf_name)``: every llama GGUF tensor's name in TransformerLM's state dict (token_embd ->
    token_embeddings, output_norm -> ln_final, output -> lm_head, blk.N.<part> -> layers.N.<part>, for blocks 0 to 104),
    and ValueError for a name the model has no place for.

    Mistakes it recognises: ffn_gate and ffn_up swapped (w1 and w3); ffn_down not w2; attn_norm and ffn_norm swapped
    (ln1 and ln2); the block number cut to one digit, lost or fixed; a block number above 9 refused, or read as one
    digit so that the rest of it joins the part's name (a KeyError); '.weight' lost;
    an unknown name passed through, or refused with another error than ValueError.
    """
    cases = dict(TOP_NAMES)
    cases.update({f"blk.{n}.{part}.weight": f"layers.{n}.{ours}.weight" for n in BLOCK_NUMBERS
                  for part, ours in BLOCK_NAMES.items()})
    outs = {}
    for name, expected in cases.items():
        what = f"our_name({name!r})"
        out, error = attempt(what, our_name, name)
        if error is not None:
            number = name.split(".")[1] if name.startswith("blk.") else ""
            whole = "read the whole block number (every digit: blk.12 is block 12): SmolLM2 has 30 blocks"
            if isinstance(error, ValueError) and len(number) > 1:
                fail(f"{what} refuses a block number above 9", whole)
            if len(number) > 1 and any(seen.startswith("blk.") for seen in outs):  # blocks 0 and 7 went through
                fail(f"{what} raised {type(error).__name__} ({error}) where blocks 0 and 7 work: the block number is "
                     "read as one digit, and the rest of it is taken for the part's name", whole)
            crashed(what, error)
        if not isinstance(out, str):
            fail(f"{what} returned {describe(out)}, not a str", "return the name in TransformerLM's state dict")
        outs[name] = out
    for n in BLOCK_NUMBERS:
        gate, up, down = (outs[f"blk.{n}.{p}.weight"] for p in ("ffn_gate", "ffn_up", "ffn_down"))
        if (gate, up) == (f"layers.{n}.ffn.w3.weight", f"layers.{n}.ffn.w1.weight"):
            fail("ffn_gate and ffn_up are swapped: the gate is w1", "SwiGLU is w2(silu(w1 x) ⊙ w3 x): the gate is "
                 "the branch that goes through SiLU, w1; up is the plain branch, w3")
        if down != f"layers.{n}.ffn.w2.weight" and down.endswith((".w1.weight", ".w3.weight")):
            fail(f"ffn_down is named {down!r}: it is w2", "ffn_down brings the d_ff hidden values back to d_model: "
                 "the outer w2 of w2(silu(w1 x) ⊙ w3 x)")
        attn_norm, ffn_norm = outs[f"blk.{n}.attn_norm.weight"], outs[f"blk.{n}.ffn_norm.weight"]
        if (attn_norm, ffn_norm) == (f"layers.{n}.ln2.weight", f"layers.{n}.ln1.weight"):
            fail("attn_norm and ffn_norm are swapped: ln1 is the norm before attention",
                 "the block is x + attn(ln1(x)), then y + ffn(ln2(y)): attn_norm is ln1, ffn_norm ln2")
    for name, expected in cases.items():
        out = outs[name]
        if out == expected:
            continue
        if out == expected.removesuffix(".weight"):
            fail(f"our_name({name!r}) returned {out!r}: '.weight' is lost", "a state dict names each parameter in "
                 "full: the module's name then '.weight'")
        if name.startswith("blk.") and out.startswith("layers.") and out.split(".")[1] != name.split(".")[1]:
            fail(f"our_name({name!r}) returned {out!r}: the block number is cut, lost or fixed", "keep the block "
                 "number, every digit of it: blk.N.… is layers.N.…")
        fail(f"our_name({name!r}) returned {out!r}, not the name in TransformerLM's state dict", "map each part to "
             "the module that holds that weight (CONTRACT.md's names): q_proj, k_proj, v_proj, output_proj, ln1, ln2, "
             "w1, w2, w3, token_embeddings, ln_final, lm_head")
    for name in UNKNOWN_NAMES:
        error = refuses(f"our_name({name!r})", lambda: our_name(name), ValueError, "an unknown name passes through, "
                        "to fail later, far from its cause, or be dropped", "raise ValueError naming the tensor for a "
                        "name the model has no place for", shown=repr)
        if name not in str(error):
            fail(f"our_name({name!r}) raised ValueError without naming the tensor ({short(first_line(error), 60)})",
                 "put the name in the message: among a file's hundreds of tensors, it says which one has no place")
    passed("our_name: every llama tensor's name in TransformerLM's state dict (gate w1, up w3, down w2; attn_norm ln1, "
           "ffn_norm ln2; any block number), ValueError naming an unknown one")


# ---------------------------------------------------------------------------------------------------------
# Step 4 · the tokenizer from the metadata
# ---------------------------------------------------------------------------------------------------------

_MERGES = [(b" ", b"t"), (b"h", b"e"), (b" t", b"he"), (b"\xc3", b"\xa9"), (b"c", b"a"), (b"ca", b"f"),
           (b"caf", b"\xc3\xa9"), (b"i", b"m"), (b"<", b"|"), (b"2", b"0"), (b" ", b"2"), (b"e", b"r"), (b"us", b"er"),
           (b"u", b"s"), (b"\xe2\x82", b"\xac")]
TOKENIZER_TEXTS = ["<|im_start|>user\nthe café costs 20€<|im_end|>\n", " the theme in 2024,  is 'caféé'",
                   "<|tool call|>x<|café|>", "<|im_start|><|im_end|>", ""]


def fake_tokenizer_metadata(seed: int = 0, pre: str = "smollm") -> dict:
    """A byte-level BPE's metadata as a GGUF file holds it: control tokens as text (one with a space, one with é),
    the 256 bytes in a shuffled order and the merged tokens, all written with GPT-2's byte-to-character map."""
    char = bytes_to_unicode()
    as_chars = lambda token: "".join(char[b] for b in token)  # noqa: E731
    order = list(range(256))
    random.Random(seed).shuffle(order)
    byte_tokens = [as_chars(bytes([b])) for b in order]
    merged = [as_chars(a + b) for a, b in _MERGES]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *byte_tokens[:100], "<|café|>", *byte_tokens[100:],
              *merged, "<|tool call|>"]
    types = [3 if t.startswith("<|") and t.endswith("|>") and len(t) > 2 else 1 for t in tokens]
    return {"general.architecture": "llama", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": [f"{as_chars(a)} {as_chars(b)}" for a, b in _MERGES],
            "tokenizer.chat_template": "{% for message in messages %}{{ message['content'] }}{% endfor %}"}



def check_tokenizer_from_gguf(tokenizer_from_gguf: Callable[[dict], Any]) -> None:
    """Check ``tokenizer_from_gguf(metadata)``: a Tokenizer from made-up metadata (the 256 bytes in a shuffled order,
    merges of non-ASCII bytes, control tokens among the others, one with a space and one with é, the "smollm"
    pre-tokenizer): ``.vocab`` (id i is token i of the file, as bytes), ``.merges``, the control tokens special, the
    file's pattern, ``encode`` of a few texts, and ``chat_template`` kept.

    Mistakes it recognises: tokens kept as their GPT-2 characters (not mapped back to bytes); control tokens put
    through the byte map (a KeyError, or é's latin-1 byte); control tokens not special (split into pieces when
    encoding); merges split at the wrong place, kept as characters or as str; ids renumbered (not the file's order);
    GPT-2's pattern instead of PATTERNS[tokenizer.ggml.pre]; chat_template not kept.
    """
    metadata = fake_tokenizer_metadata()
    reference = _reference_tokenizer(metadata)
    what = "tokenizer_from_gguf(metadata) on a made-up vocabulary"
    out, error = attempt(what, tokenizer_from_gguf, dict(metadata))
    if isinstance(error, KeyError) and error.args and error.args[0] == " ":
        fail("the control tokens go through the byte map: '<|tool call|>' has a space, which GPT-2's map never "
             "writes (KeyError ' ')", "keep a control token (token_type 3) as its UTF-8 text, token.encode('utf-8'); "
             "only the other tokens are written with GPT-2's characters")
    if error is not None:
        crashed(what, error)
    vocab, merges = getattr(out, "vocab", None), getattr(out, "merges", None)
    if not isinstance(vocab, dict) or not isinstance(merges, list):
        fail(f"{what} returned {describe(out)}, not a Tokenizer", "build the course's Tokenizer(vocab, merges, "
             "special_tokens, pattern=...)")
    tokens, types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
    control = [i for i, kind in enumerate(types) if kind == 3]
    if sorted(vocab) != sorted(reference.vocab) or sorted(vocab.values()) != sorted(reference.vocab.values()):
        plain = [i for i in reference.vocab if i not in control]
        if all(vocab.get(i) == tokens[i].encode("utf-8") for i in plain):
            fail("the tokens are kept as their GPT-2 characters: 'Ġ' is the byte 0x20 (a space), written as a "
                 "printable character", "map every character of a token back to its byte with the inverse of "
                 "bytes_to_unicode(): the vocabulary holds bytes")
        if any(vocab.get(i) == bytes(b for b in tokens[i].encode("latin-1")) != reference.vocab[i]
               for i in control if tokens[i].isascii() is False):
            fail("the control tokens go through the byte map: '<|café|>' comes out with é as the latin-1 byte 0xE9",
                 "keep a control token (token_type 3) as its UTF-8 text, token.encode('utf-8'); only the other "
                 "tokens are written with GPT-2's characters")
    if vocab != reference.vocab:
        if sorted(vocab.values()) == sorted(reference.vocab.values()):
            fail("the ids are renumbered: token i of tokenizer.ggml.tokens must have id i", "keep the file's order "
                 "(enumerate the tokens, control tokens included): the model's embedding rows follow it")
        wrong = next(i for i in sorted(set(vocab) | set(reference.vocab)) if vocab.get(i) != reference.vocab.get(i))
        fail(f"{what}: id {wrong} is {vocab.get(wrong)!r}, expected {reference.vocab.get(wrong)!r}",
             "id i is token i of tokenizer.ggml.tokens, as bytes: a control token's UTF-8 text, any other token's "
             "characters mapped back through GPT-2's byte map")
    merges = [tuple(m) if isinstance(m, (list, tuple)) else m for m in merges]
    if merges != reference.merges:
        lines = metadata["tokenizer.ggml.merges"]
        if merges == [tuple(part.encode("utf-8") for part in line.split(" ")) for line in lines]:
            fail("the merges are kept as their GPT-2 characters", "map each half of a merge back to bytes, as the "
                 "tokens: the merges hold pairs of bytes")
        if any(isinstance(m, str) or isinstance(m, tuple) and any(isinstance(p, str) for p in m) for m in merges):
            fail("the merges are str, not pairs of bytes", "cut each line at its space and map both halves back to "
                 "bytes")
        if len(merges) == len(lines) and all(isinstance(m, tuple) and len(m) == 2 and b"".join(m) == a + b
                                             for m, (a, b) in zip(merges, reference.merges)):
            fail("the merges are split at the wrong place", "each line is the two tokens separated by one space "
                 "(GPT-2's characters never include a space: the space byte is written 'Ġ'): cut each line at its "
                 "one space")
        fail(f"{what}: the merges differ from the file's", "one merge per line of tokenizer.ggml.merges, in order, "
             "as a pair of bytes", f"yours begin {short(merges[:4])}")
    for text in TOKENIZER_TEXTS:
        ids = call(f"encode({text!r})", out.encode, text)
        expected = reference.encode(text)
        if ids == expected:
            continue
        pieces = [reference.vocab.get(i, b"?") for i in ids] if isinstance(ids, list) else ids
        if any(s in text for s in ("<|im_start|>", "<|im_end|>", "<|café|>")) and isinstance(ids, list) and \
                not any(i in control for i in ids):
            fail("the control tokens are not special: '<|im_start|>' is encoded as the pieces of its text",
                 "pass the control tokens (token_type 3) to the Tokenizer as its special tokens, so that each is one "
                 "id", f"encode({text!r}) gave {short(pieces)}")
        if ids == _reference_tokenizer(metadata, GPT2_PATTERN).encode(text):
            fail("the pre-tokenizer is GPT-2's, not the file's: tokenizer.ggml.pre is 'smollm', which cuts every "
                 "digit alone", "give the Tokenizer the pattern that PATTERNS holds for the file's tokenizer.ggml.pre",
                 f"encode({text!r}) gave {short(pieces)}")
        fail(f"encode({text!r}) gave {short(ids)}, expected {short(expected)}", "build the Tokenizer from the "
             "file's vocab, merges, control tokens and pattern")
    if getattr(out, "chat_template", None) != metadata["tokenizer.chat_template"]:
        fail("the tokenizer does not keep the file's chat template", "keep the metadata's tokenizer.chat_template "
             "on the tokenizer, as its chat_template attribute: chat reads its default system prompt there")
    passed("tokenizer_from_gguf: the file's ids, tokens mapped back to bytes through GPT-2's map, control tokens as "
           "special tokens in UTF-8, merges as byte pairs, the file's pre-tokenizer, the chat template kept")


# ---------------------------------------------------------------------------------------------------------
# Step 5 · the ChatML prompt
# ---------------------------------------------------------------------------------------------------------

SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
SMOLLM2_TEMPLATE = (  # tokenizer.chat_template of SmolLM2-135M-Instruct.Q4_1.gguf (a test checks it is the file's)
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' "
    "+ message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")

PROMPT_CASES = [
    ([{"role": "user", "content": "What is 2 + 2?"}], SMOLLM2_SYSTEM),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
      {"role": "user", "content": "Tell me a joke\nabout cats."}], "Be brief."),
    ([{"role": "system", "content": "You speak French."}, {"role": "user", "content": "Bonjour"}], SMOLLM2_SYSTEM),
    ([{"role": "user", "content": "No system prompt here"}], None),
]


def render_template(messages: list[dict], system: str | None) -> str:
    """The independent answer: SmolLM2's Jinja template rendered by jinja2 (its default system prompt replaced by
    ``system``; with None, the template without a system message)."""
    import jinja2  # imported here: only this check needs it

    if system is None:
        template = SMOLLM2_TEMPLATE.replace(f"{{{{ '<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n' }}}}", "")
    else:
        template = SMOLLM2_TEMPLATE.replace(SMOLLM2_SYSTEM, system)
    return jinja2.Template(template, keep_trailing_newline=True).render(messages=messages, add_generation_prompt=True)


def prompt_variant(messages: list[dict], system: str | None, mistake: str) -> str:
    """chat_prompt with a named mistake."""
    if system is not None and (mistake == "system_always" or messages[0]["role"] != "system"):
        added = {"role": "system", "content": system}
        messages = [*messages, added] if mistake == "system_last" else [added, *messages]
    if mistake == "system_none" and system is None:
        messages = [{"role": "system", "content": "None"}, *messages]
    end = {"no_newline": "<|im_end|>", "endoftext": "<|endoftext|>\n"}.get(mistake, "<|im_end|>\n")
    after_role = "" if mistake == "no_role_newline" else "\n"
    turn = (lambda m: f"<|im_start|>{m['content']}\n{m['role']}{end}") if mistake == "swapped" else \
        (lambda m: f"<|im_start|>{m['role']}{after_role}{m['content']}{end}")
    tail = {"no_generation": "", "no_generation_newline": "<|im_start|>assistant"}.get(mistake,
                                                                                      "<|im_start|>assistant\n")
    return "".join(turn(m) for m in messages) + tail


PROMPT_MISTAKES = {
    "no_newline": ("there is no newline after <|im_end|>", "ChatML ends every message with <|im_end|> and a newline: "
                   "<|im_start|>role\\ncontent<|im_end|>\\n"),
    "no_generation": ("the prompt does not end with <|im_start|>assistant\\n", "end with the start of the reply, "
                      "<|im_start|>assistant and a newline: the model then writes the assistant's turn"),
    "no_generation_newline": ("the prompt ends with <|im_start|>assistant without its newline", "every turn's role "
                              "is followed by a newline, the reply's too: <|im_start|>assistant\\n"),
    "system_always": ("a system message is added even when the messages start with one", "add `system` only when "
                      "messages[0]['role'] is not 'system': the conversation's own system prompt wins"),
    "system_none": ("a system message is added when system is None", "with system=None add no system message"),
    "swapped": ("the role and the content are swapped", "each message is <|im_start|>{role}\\n{content}<|im_end|>\\n"),
    "no_role_newline": ("there is no newline between a message's role and its content", "each message is "
                        "<|im_start|>{role}\\n{content}<|im_end|>\\n: the newline ends the role"),
    "endoftext": ("the messages end with <|endoftext|>, not <|im_end|>", "<|endoftext|> ends a document; ChatML ends "
                  "each message with <|im_end|> (and a newline), the token SmolLM2 learnt to write after a reply"),
    "system_last": ("the system message comes last, after the conversation", "put it first: the model reads its "
                    "instructions before the conversation"),
}


def where_they_part(out: str, expected: str, before: int = 24, after: int = 24) -> str:
    """Where two strings first differ, as one line: the character's index, then each string from a little before it
    (repr, so that a newline shows as \\n)."""
    i = next((k for k, (a, b) in enumerate(zip(out, expected)) if a != b), min(len(out), len(expected)))
    start = max(0, i - before)

    def piece(text: str) -> str:
        shown = repr(text[start:i + after])
        return ("…" if start else "") + shown + ("…" if i + after < len(text) else " (its end)")
    return f"they part at character {i}: yours has {piece(out)}, the template {piece(expected)}"


def check_chat_prompt(chat_prompt: Callable[..., str]) -> None:
    """Check ``chat_prompt(messages, system=None)``: ChatML, each message <|im_start|>{role}\\n{content}<|im_end|>\\n,
    a system message first when ``system`` is given and the messages start without one, then <|im_start|>assistant\\n;
    against SmolLM2's own Jinja template rendered by jinja2; ValueError for an empty list.

    Mistakes it recognises: no newline after <|im_end|>, or after the role; <|endoftext|> for <|im_end|>; no
    generation prompt, or one without its newline; a system message added although the messages start with one, or
    when system is None, or last; role and content swapped; the caller's list changed; an empty list accepted. Any
    other difference is shown where the prompt parts from the template's.
    """
    for messages, system in PROMPT_CASES:
        what = f"chat_prompt({short(messages, 90)}, system={short(system, 40)})"
        given = [dict(m) for m in messages]
        out = call(what, chat_prompt, given, system)
        if given != messages:
            fail(f"{what} changed the caller's messages ({len(messages)} went in, {len(given)} came out, "
                 f"{short([m.get('role') if isinstance(m, dict) else m for m in given], 60)})",
                 "build a new list (or the text directly): an insert or append into `messages` adds the system "
                 "message to the conversation the caller keeps, and shows it as a reply")
        if not isinstance(out, str):
            fail(f"{what} returned {describe(out)}, not a str", "return the prompt's text")
        expected = render_template(messages, system)
        if out == expected:
            continue
        for mistake, (message, fix) in PROMPT_MISTAKES.items():
            wrong = prompt_variant(messages, system, mistake)
            if wrong != expected and out == wrong:
                fail(message, fix, f"on {what}: yours matches that mistake")
        fail(f"{what} is not the template's prompt", "write each message as <|im_start|>{role}\\n{content}"
             "<|im_end|>\\n, a system message first if needed, then <|im_start|>assistant\\n",
             where_they_part(out, expected))
    refuses("chat_prompt([])", lambda: chat_prompt([]), ValueError, "an empty conversation is accepted, with "
            "nothing to reply to", "check the list first and raise ValueError when it is empty", shown=short)
    passed("chat_prompt: ChatML as SmolLM2's template writes it (newline after each <|im_end|>, the system message "
           "only where needed, <|im_start|>assistant\\n to end); ValueError for no messages")


# ---------------------------------------------------------------------------------------------------------
# Steps 5 to 7 · the model from the file's tensors: the state dict, the tie, the model without a random start
# ---------------------------------------------------------------------------------------------------------

_GQA = ("the model has as many key/value heads as query heads: grouped-query attention is ignored",
        "the file's k_proj and v_proj have num_kv_heads·d_k rows, fewer than q_proj's: build the TransformerLM with "
        "num_kv_heads from the metadata (all of model_config's arguments)")
_NO_HEAD = ("the state dict has no lm_head.weight: a file without output.weight ties its output layer to the "
            "embedding matrix", "the model still has an output layer: give lm_head.weight the embedding's tensor "
            "(the tie) before loading, and build the model tied (model_config's tie_embeddings)")


def load_crash(error: BaseException) -> tuple[str, str] | None:
    """The classic cause of a crash in load_state_dict of a file's tensors, as (mistake, fix): k_proj's shape (the
    key/value heads left out) or lm_head.weight missing (no tie); None for any other error."""
    text = str(error)
    if "size mismatch" in text and ("k_proj" in text or "v_proj" in text):
        return _GQA
    if "Missing key" in text and "lm_head.weight" in text:
        return _NO_HEAD
    return None


def _tiny_file(folder: str, **kwargs: Any) -> tuple[gguf.GGUFReader, dict]:
    from .._tiny_gguf import write_tiny_gguf
    reader = gguf.GGUFReader(write_tiny_gguf(f"{folder}/tiny.gguf", **kwargs))
    return reader, {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}


def check_state_dict_from(state_dict_from: Callable[[list], dict]) -> None:
    """Check ``state_dict_from(tensors)``: a tiny llama file's tensors (reader.tensors: Q8_0, Q4_1, F32) as a dict
    from TransformerLM's names to float32 tensors in PyTorch's shape, the values llama.cpp's gguf.quants gives.

    Mistakes it recognises: not a dict; GGUF's names kept; a tensor left out; lm_head.weight added though the file
    has none (the tie is the next step); the ggml shape kept or the values transposed; other values; not float32.
    """
    import tempfile

    from ..pretrained import file_state
    with tempfile.TemporaryDirectory() as folder:
        reader, _ = _tiny_file(folder)
        expected = file_state(reader.data.filename)[0]
        del expected["lm_head.weight"]  # the file has no output.weight
        what = "state_dict_from(reader.tensors) of a tiny llama file"
        out = call(what, state_dict_from, reader.tensors)
        gguf_names = {t.name for t in reader.tensors}
        ggml_shapes = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}
    if not isinstance(out, dict):
        fail(f"{what} returned {describe(out)}, not a dict", "return a dict from each tensor's name in the model to "
             "its values")
    if set(out) & gguf_names:
        fail(f"{what} keeps GGUF's names ({sorted(set(out) & gguf_names)[0]!r})", "the model loads its own names: "
             "rename each tensor (your our_name)")
    missing = sorted(set(expected) - set(out))
    if missing:
        fail(f"{what} has no {missing[0]}", "one entry per tensor of the file: every tensor is a weight of the model")
    if "lm_head.weight" in out:
        fail(f"{what} holds lm_head.weight, though the file has no output.weight", "keep to the file's tensors here: "
             "the tie, which gives the output layer the embedding matrix, is the next step")
    extra = sorted(set(out) - set(expected))
    if extra:
        fail(f"{what} holds {extra[0]}, which is not a tensor of the file", "one entry per tensor of the file")
    by_ours = {_course_name(name): name for name in gguf_names}
    for name, want in expected.items():
        got = out[name]
        if not isinstance(got, torch.Tensor):
            fail(f"{what}[{name!r}] is {describe(got)}, not a tensor", "give each name the tensor's values")
        if got.dim() == 2 and tuple(got.shape) == ggml_shapes[by_ours[name]] != tuple(want.shape):
            fail(f"{what}[{name!r}] has ggml's shape {tuple(got.shape)}, expected {tuple(want.shape)}", "ggml lists "
                 "the fastest axis first: reverse the shape to get PyTorch's (d_out, d_in) (weights_of does)")
        if tuple(got.shape) != tuple(want.shape):
            fail(f"{what}[{name!r}] has shape {tuple(got.shape)}, expected {tuple(want.shape)}", "reverse ggml's "
                 "shape: PyTorch's (d_out, d_in)")
        if got.dtype != torch.float32:
            fail(f"{what}[{name!r}] is {got.dtype}, not float32", "dequantize every tensor to float32 (weights_of)")
        values = got.detach().to("cpu", torch.float64)
        if torch.allclose(values, want, rtol=1e-6, atol=1e-6):
            continue
        if holds_transposed(values, want):
            fail(f"{what}[{name!r}] holds the file's numbers transposed", TRANSPOSED_FIX)
        fail(f"{what}[{name!r}] differs from the file's dequantized values by up to "
             f"{(values - want).abs().max().item():.3g}", "give each name its own tensor, dequantized by its type "
             "(weights_of, with your dequantizers)")
    passed("state_dict_from: every tensor of the file under the model's name, float32, in PyTorch's shape, the "
           "values llama.cpp's gguf.quants gives")


def _course_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return f"layers.{parts[1]}.{BLOCK_NAMES[parts[2]]}.weight"
    return TOP_NAMES[gguf_name]


def check_with_tied_head(with_tied_head: Callable[[dict, bool], dict]) -> None:
    """Check ``with_tied_head(state, tied)``: with tied=True, the state dict with lm_head.weight the embedding's tensor
    itself (the same object); with tied=False (the file has its own output.weight), the state as it was.

    Mistakes it recognises: not a dict; lm_head.weight missing; a copy of the embedding's tensor, or another tensor;
    the file's own output layer replaced by the embedding; a weight lost on the way.
    """
    torch_state = {"token_embeddings.weight": torch.randn(11, 4, generator=torch.Generator().manual_seed(0)),
                   "ln_final.weight": torch.ones(4)}
    what = "with_tied_head(state without lm_head.weight, tied=True)"
    out = call(what, with_tied_head, dict(torch_state), True)
    if not isinstance(out, dict):
        fail(f"{what} returned {describe(out)}, not the state dict", "return the state dict, with lm_head.weight")
    embedding = torch_state["token_embeddings.weight"]
    if "lm_head.weight" not in out:
        fail(f"{what} has no lm_head.weight", _NO_HEAD[0].split(": ", 1)[1] + ": give lm_head.weight the "
             "embedding's tensor, so that the model loads it under both names")
    head = out["lm_head.weight"]
    if head is not embedding:
        if isinstance(head, torch.Tensor) and head.shape == embedding.shape and torch.equal(head, embedding):
            fail(f"{what} gives lm_head.weight a copy of the embedding matrix", "tied means one matrix, read twice: "
                 "give lm_head.weight the embedding's tensor itself, no second copy in memory")
        fail(f"{what} gives lm_head.weight {describe(head)}, not the embedding's tensor", "the output layer of a "
             "tied model is the embedding matrix: the same tensor under the name lm_head.weight")
    lost = sorted(set(torch_state) - set(out))
    if lost:
        fail(f"{what} loses {lost[0]}", "keep every weight of the state dict, and add lm_head.weight")
    own = torch.randn(11, 4, generator=torch.Generator().manual_seed(1))
    what = "with_tied_head(state with the file's own lm_head.weight, tied=False)"
    out = call(what, with_tied_head, {**torch_state, "lm_head.weight": own}, False)
    if not isinstance(out, dict) or out.get("lm_head.weight") is not own:
        if isinstance(out, dict) and out.get("lm_head.weight") is embedding:
            fail(f"{what} replaces the file's output layer with the embedding matrix", "tie only when the file has "
                 "no output.weight (tied=False: the state as it is)")
        fail(f"{what} returned {describe(out)}, not the state with the file's own lm_head.weight", "with tied=False, "
             "return the state as it is")
    passed("with_tied_head: lm_head.weight the embedding's tensor itself when tied, the file's own otherwise")


def check_model_from_state(model_from_state: Callable[..., Any]) -> None:
    """Check ``model_from_state(config, state)``: a TransformerLM of a tiny llama file's configuration (grouped-query
    attention, tied embeddings, norm_eps 1e-6) whose parameters are the state dict's tensors themselves, its one set
    of RoPE tables computed (shared by every block), its logits those of the course's reference on the same numbers.

    Mistakes it recognises: not a model; the key/value heads left out (load_state_dict's size mismatch); the tie
    left out; the weights still on the meta device (loaded without assign=True, or not at all); copies of the
    tensors (a model built with its own random initialisation first); RoPE's tables left on the meta device, or
    computed once per block; norm_eps or rope_theta not the file's.
    """
    import tempfile

    from torch import nn

    from ..pretrained import IDS, file_state, reference_logits
    from ...pretrained import model_config
    with tempfile.TemporaryDirectory() as folder:
        reader, metadata = _tiny_file(folder)
        config = model_config(metadata, [t.name for t in reader.tensors])
        expected = file_state(reader.data.filename)[0]
    state = {name: value.float() for name, value in expected.items()}
    state["lm_head.weight"] = state["token_embeddings.weight"]
    what = "model_from_state(config, state) of a tiny llama file"
    out, error = attempt(what, model_from_state, dict(config), dict(state))
    if error is not None:
        if (cause := load_crash(error)) is not None:
            fail(*cause, f"on {what}: {type(error).__name__}: {first_line(error)[:160]}")
        crashed(what, error)
    if not isinstance(out, nn.Module):
        fail(f"{what} returned {describe(out)}, not a TransformerLM", "return the model")
    params = dict(out.named_parameters())
    on_meta = [name for name, p in params.items() if p.is_meta]
    if on_meta:
        fail(f"{what}: {on_meta[0]} is still on the meta device, with no numbers", "a meta tensor has no memory to "
             "copy into: load the state dict with load_state_dict(state, assign=True), which makes its tensors the "
             "parameters")
    attn = getattr(getattr(out, "layers", [None])[0], "attn", None)
    if attn is not None and getattr(attn, "num_kv_heads", None) != config["num_kv_heads"]:
        fail(*_GQA)
    if out.lm_head.weight is not out.token_embeddings.weight:
        fail(f"{what}: lm_head and the embedding are two matrices, though the file ties them", "build the model with "
             "tie_embeddings=True (model_config's): one Parameter, read twice")
    if out.token_embeddings.weight.data_ptr() != state["token_embeddings.weight"].data_ptr():
        fail(f"{what}: the parameters are copies of the state dict's tensors", "build the model on the meta device "
             "(shapes, no memory, no random initialisation to throw away), then load_state_dict(state, "
             "assign=True): the file's tensors become the parameters, no second copy")
    ropes = {id(layer.attn.rope) for layer in out.layers}
    buffers = [name for name, b in out.named_buffers() if b.is_meta]
    if buffers:
        fail(f"{what}: {buffers[0]} (RoPE's table) is still on the meta device, with no numbers", "no file holds "
             "RoPE's tables (they are computed, not learnt): compute them for the model's shared "
             "RotaryPositionalEmbedding, with its own theta, d_k and max_seq_len")
    if len(ropes) > 1:
        fail(f"{what}: the blocks have {len(ropes)} RoPE modules, one each", "TransformerLM shares one set of tables "
             "between its blocks (the same numbers): compute the tables of that one module, "
             "model.layers[0].attn.rope, once")
    eps = {layer.ln1.eps for layer in out.layers} | {out.ln_final.eps}
    if eps != {config["norm_eps"]}:
        fail(f"{what}: the norms use eps = {sorted(eps)[0]}, not the file's {config['norm_eps']}", "build the model "
             "with norm_eps from the metadata (llama.attention.layer_norm_rms_epsilon, model_config's)")
    with torch.no_grad():
        logits = call(f"the model of {what}, on 12 token ids", out, IDS.clone())
    want = reference_logits(expected, IDS)  # float64, from the same numbers
    if not isinstance(logits, torch.Tensor) or logits.shape != want.shape or \
            not torch.allclose(logits.double(), want, rtol=1e-4, atol=1e-4):
        fail(f"the model of {what} gives other logits than the reference model on the same weights", "build it with "
             "all of model_config's arguments, and compute RoPE's tables with the model's own rope_theta")
    passed("model_from_state: the state dict's tensors are the parameters (no copy, no random start), key/value heads, "
           "norm_eps and the tie the file's, one set of RoPE tables computed for every block, the reference's logits")


# ---------------------------------------------------------------------------------------------------------
# Exercise 1's last question · how many times smaller the Q4_1 matrices are than float32
# ---------------------------------------------------------------------------------------------------------

def check_times_smaller(times_smaller: Any) -> None:
    """Check ``times_smaller``: float32's 32 bits a weight over Q4_1's 5 (its 4 bits and its share of a block's d and
    m), 6.4, to 1 %.

    Mistakes it recognises: not a number; 8 (the 4 bits alone, without the block's d and m); the ratio inverted; the
    whole file's ratio (5.5, its embedding being Q8_0); float16's 16 bits in place of float32's 32.
    """
    if isinstance(times_smaller, bool) or not isinstance(times_smaller, (int, float)) and not (
            isinstance(times_smaller, torch.Tensor) and times_smaller.numel() == 1):
        fail(f"times_smaller is {describe(times_smaller)}, not a number", "write the ratio as a Python number")
    value = float(times_smaller)
    right = 32 / ((2 + 2 + 16) * 8 / 32)
    near = lambda x: abs(value - x) <= 0.01 * abs(x)
    if near(right):
        passed(f"times_smaller: {right:g}, float32's 32 bits over Q4_1's 5 a weight")
        return
    for wrong, mistake, fix in (
            (8.0, "times_smaller counts 4 bits a weight: the block's d and m are left out", "each block of 32 weights "
             "also stores its float16 d and m, 32 bits more: a share of 1 bit a weight"),
            (1 / right, "times_smaller is the ratio upside down", "float32's bits over Q4_1's: more than 1"),
            (5.47, "times_smaller is the whole file's ratio", "the question is about the Q4_1 matrices alone: the "
             "file's embedding matrix is Q8_0, which makes the file as a whole less small"),
            (right / 2, "times_smaller compares with float16's 16 bits", "the same weights in float32 take 32 bits")):
        if near(wrong):
            fail(mistake, fix)
    fail(f"times_smaller is {value:g}, not float32's bits over Q4_1's", "divide the 32 bits of a float32 by Q4_1's "
         "bits a weight (your bits_q4_1)")

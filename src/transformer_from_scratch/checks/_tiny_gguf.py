"""A tiny random llama model as a GGUF file, for the checks of notebook 14 (and their tests): the real file is 98 MB and
takes seconds to read, this one a few hundred kilobytes and milliseconds.

It is written with ``gguf.GGUFWriter`` and quantized with ``gguf.quants`` (llama.cpp's own Python package), laid out
like SmolLM2's: a byte-level BPE vocabulary written with GPT-2's byte-to-character map (the control tokens first, then
the 256 bytes in a shuffled order, then the merged tokens), ``tokenizer.ggml.pre`` "smollm", a ChatML template, the
embedding as Q8_0, the matrices as Q4_1, the norms as F32, and no ``output.weight`` (tied embeddings) unless
``tied=False``.
"""

from __future__ import annotations

import os
import random

import gguf
import numpy as np

from ..tokenizer import bytes_to_unicode

CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SYSTEM = "You are a tiny test model"
TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\n" + SYSTEM + "<|im_end|>\n' }}{% endif %}"
            "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# The merges, as bytes: words of the chat prompt, a space before a word, and é (0xC3 0xA9) as one token.
MERGES = [(b"i", b"m"), (b"<", b"|"), (b"|", b">"), (b"s", b"t"), (b"e", b"r"), (b"a", b"n"), (b" ", b"t"),
          (b"h", b"e"), (b" t", b"he"), (b"u", b"s"), (b"us", b"er"), (b"\xc3", b"\xa9"), (b"c", b"a"),
          (b"ca", b"f"), (b"caf", b"\xc3\xa9"), (b"e", b"s"), (b"o", b"u"), (b" ", b"a"), (b"a", b"s"),
          (b"s", b"y"), (b"sy", b"st"), (b"syst", b"e"), (b"syste", b"m"), (b"a", b"ss"), (b"s", b"s"),
          (b"o", b"r"), (b"i", b"n"), (b" ", b"w"), (b"H", b"e"), (b"l", b"l"), (b"He", b"ll"), (b"Hell", b"o"),
          (b"2", b"0")]  # digits merge: only a pre-tokenizer that keeps each digit alone (smollm) leaves 2024 apart
SIZES = dict(context_length=64, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=128)
ROPE_THETA, NORM_EPS = 50000.0, 1e-6


def tiny_vocabulary(seed: int = 0) -> tuple[list[bytes | str], list[int], list[tuple[bytes, bytes]]]:
    """The tokens (control tokens as str, the rest as bytes), their types and the merges of the tiny file."""
    order = list(range(256))
    random.Random(seed).shuffle(order)
    tokens: list[bytes | str] = [*CONTROL_TOKENS, *(bytes([b]) for b in order), *(a + b for a, b in MERGES)]
    types = [3] * len(CONTROL_TOKENS) + [1] * (len(tokens) - len(CONTROL_TOKENS))
    return tokens, types, list(MERGES)


def write_tiny_gguf(path: str | os.PathLike, *, architecture: str = "llama", tied: bool = True, seed: int = 0,
                    embedding_type: str = "Q8_0", matrix_type: str = "Q4_1", pre: str = "smollm",
                    template: str | None = TEMPLATE) -> str:
    """Write a tiny random model to ``path`` (2 blocks, d_model 64, 4 heads, 2 key/value heads, d_ff 128, a vocabulary
    of ``3 + 256 + len(MERGES)`` tokens) and return the path. ``embedding_type`` and ``matrix_type``: Q8_0, Q4_1, F32,
    F16 or BF16 (the last one not read by the course); ``architecture``: the name written in the metadata and in front
    of its keys."""
    rng = np.random.default_rng(seed)
    char = bytes_to_unicode()
    tokens, types, merges = tiny_vocabulary(seed)
    written = [t if isinstance(t, str) else "".join(char[b] for b in t) for t in tokens]
    d, ff, heads, kv = SIZES["d_model"], SIZES["d_ff"], SIZES["num_heads"], SIZES["num_kv_heads"]
    d_k = d // heads

    writer = gguf.GGUFWriter(os.fspath(path), architecture)
    writer.add_name("tiny-test-model")
    writer.add_block_count(SIZES["num_layers"])
    writer.add_context_length(SIZES["context_length"])
    writer.add_embedding_length(d)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(NORM_EPS)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(written)
    writer.add_token_types(types)
    writer.add_token_merges([" ".join("".join(char[b] for b in part) for part in pair) for pair in merges])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if template is not None:
        writer.add_chat_template(template)

    def add(name: str, shape: tuple[int, ...], kind: str, scale: float = 1.0) -> None:
        values = (rng.standard_normal(shape) * scale).astype(np.float32)
        if len(shape) == 1:
            values = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)  # a norm's gains, near 1
        if kind == "F32":
            writer.add_tensor(name, values)
        elif kind == "F16":
            writer.add_tensor(name, values.astype(np.float16))
        else:
            qtype = gguf.GGMLQuantizationType[kind]
            data = gguf.quants.quantize(values, qtype)
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)

    add("token_embd.weight", (len(tokens), d), embedding_type)
    for i in range(SIZES["num_layers"]):
        add(f"blk.{i}.attn_norm.weight", (d,), "F32")
        add(f"blk.{i}.attn_q.weight", (d, d), matrix_type, d ** -0.5)
        add(f"blk.{i}.attn_k.weight", (kv * d_k, d), matrix_type, d ** -0.5)
        add(f"blk.{i}.attn_v.weight", (kv * d_k, d), matrix_type, d ** -0.5)
        add(f"blk.{i}.attn_output.weight", (d, d), matrix_type, 8 * d ** -0.5)  # blocks that outweigh the embedding
        add(f"blk.{i}.ffn_norm.weight", (d,), "F32")
        add(f"blk.{i}.ffn_gate.weight", (ff, d), matrix_type, d ** -0.5)
        add(f"blk.{i}.ffn_up.weight", (ff, d), matrix_type, d ** -0.5)
        add(f"blk.{i}.ffn_down.weight", (d, ff), matrix_type, 8 * ff ** -0.5)  # (a varied greedy reply)
    add("output_norm.weight", (d,), "F32")
    if not tied:
        add("output.weight", (len(tokens), d), matrix_type, d ** -0.5)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return os.fspath(path)

# Generated from notebooks/14_pretrained.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: 31d23bc776387e02c959952822d1292d59fa2b52b93ddf54b4c106f5307b9db1

import codecs
import os
from collections.abc import Callable

import gguf
import numpy as np
import regex
import torch
from jaxtyping import Float, UInt8
from torch import Tensor

from transformer_from_scratch.rope import RotaryPositionalEmbedding
from transformer_from_scratch.tokenizer import GPT2_PATTERN, Tokenizer, bytes_to_unicode
from transformer_from_scratch.transformer_lm import TransformerLM, generate

# SmolLM2's pre-tokenizer (tokenizer.ggml.pre "smollm"): each digit alone, the rest by GPT-2's pattern, whose white
# space stops before a digit as it stops before any other non-space.
SMOLLM_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+"""
PATTERNS = {"smollm": SMOLLM_PATTERN, "gpt-2": GPT2_PATTERN}  # tokenizer.ggml.pre -> the pattern
CONTROL = 3  # tokenizer.ggml.token_type of a control token (<|im_start|>, <|im_end|>, ...): a special token


def read_metadata(reader: gguf.GGUFReader) -> dict:
    """The file's key/value metadata as Python values (numbers, strings, lists), without the GGUF.* header fields."""
    if not isinstance(reader, gguf.GGUFReader):
        raise TypeError(f"read_metadata takes a gguf.GGUFReader (gguf.GGUFReader(path)), got {type(reader).__name__}")
    return {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}


def model_config(metadata: dict, tensor_names: list[str]) -> dict:
    """TransformerLM's keyword arguments from a llama GGUF's metadata; tie_embeddings when there is no output.weight
    (the output layer reads the embedding matrix). ValueError naming the architecture of any other file."""
    if metadata.get("general.architecture") != "llama":
        raise ValueError(f"load_gguf reads the llama architecture (SmolLM2, Llama), this file's general.architecture "
                         f"is {metadata.get('general.architecture')!r}")
    llama = lambda key: metadata["llama." + key]
    return dict(vocab_size=len(metadata["tokenizer.ggml.tokens"]), context_length=llama("context_length"),
                d_model=llama("embedding_length"), num_layers=llama("block_count"),
                num_heads=llama("attention.head_count"), d_ff=llama("feed_forward_length"),
                rope_theta=float(llama("rope.freq_base")), num_kv_heads=llama("attention.head_count_kv"),
                norm_eps=float(llama("attention.layer_norm_rms_epsilon")),
                tie_embeddings="output.weight" not in tensor_names)


def _check_blocks(blocks: Tensor, block_bytes: int, name: str) -> None:
    """ValueError unless `blocks` is uint8 bytes whose last dimension holds whole blocks of block_bytes."""
    if not isinstance(blocks, Tensor) or blocks.dtype != torch.uint8 or blocks.ndim == 0 or \
            blocks.shape[-1] == 0 or blocks.shape[-1] % block_bytes:
        got = f"{blocks.dtype} of shape {tuple(blocks.shape)}" if isinstance(blocks, Tensor) else type(blocks).__name__
        raise ValueError(f"{name} takes uint8 bytes (..., {block_bytes}·n), whole blocks of {block_bytes} bytes; "
                         f"got {got}")


def dequantize_q8_0(blocks: UInt8[Tensor, "*rows nbytes"]) -> Float[Tensor, "*rows n"]:
    """Q8_0 bytes (..., 34·n) -> float32 weights (..., 32·n): each block a float16 scale d, then 32 int8 q: d·q."""
    _check_blocks(blocks, 34, "dequantize_q8_0")
    b = blocks.reshape(-1, 34)
    d = b[:, :2].contiguous().view(torch.float16).float()        # (blocks, 1)
    q = b[:, 2:].contiguous().view(torch.int8).float()           # (blocks, 32)
    return (d * q).reshape(*blocks.shape[:-1], -1)


def dequantize_q4_1(blocks: UInt8[Tensor, "*rows nbytes"]) -> Float[Tensor, "*rows n"]:
    """Q4_1 bytes (..., 20·n) -> float32 weights (..., 32·n): each block a float16 scale d and minimum m, then 16
    bytes; byte j's low 4 bits are weight j's q, its high 4 bits weight j+16's: d·q + m."""
    _check_blocks(blocks, 20, "dequantize_q4_1")
    b = blocks.reshape(-1, 20)
    d = b[:, 0:2].contiguous().view(torch.float16).float()
    m = b[:, 2:4].contiguous().view(torch.float16).float()
    q = torch.cat([b[:, 4:] & 0x0F, b[:, 4:] >> 4], dim=1).float()  # the 16 low halves, then the 16 high halves
    return (d * q + m).reshape(*blocks.shape[:-1], -1)


DEQUANTIZE = {"Q8_0": dequantize_q8_0, "Q4_1": dequantize_q4_1}


def tensor_of(tensor: gguf.ReaderTensor) -> Float[Tensor, "..."]:
    """A GGUF tensor as float32 in PyTorch's order: ggml lists the fastest axis first, so a [576, 1536] matrix is a
    (1536, 576) weight. ValueError naming a type that is not F32, F16, Q8_0 or Q4_1."""
    kind = tensor.tensor_type.name
    if kind not in ("F32", "F16", *DEQUANTIZE):
        raise ValueError(f"tensor {tensor.name!r} is {kind}: load_gguf reads F32, F16, {', '.join(DEQUANTIZE)}")
    data = torch.from_numpy(np.array(tensor.data))  # a copy: the reader's array is a read-only view of the file
    data = DEQUANTIZE[kind](data) if kind in DEQUANTIZE else data
    return data.float().reshape(*reversed([int(n) for n in tensor.shape]))


def our_name(gguf_name: str) -> str:
    """A GGUF tensor's name in TransformerLM's state dict: blk.3.ffn_gate.weight -> layers.3.ffn.w1.weight (SwiGLU's
    gate is w1, up w3, down w2). ValueError naming a tensor that has no place in the model."""
    blocks = {"attn_norm": "ln1", "attn_q": "attn.q_proj", "attn_k": "attn.k_proj", "attn_v": "attn.v_proj",
              "attn_output": "attn.output_proj", "ffn_norm": "ln2", "ffn_gate": "ffn.w1", "ffn_up": "ffn.w3",
              "ffn_down": "ffn.w2"}
    top = {"token_embd": "token_embeddings", "output_norm": "ln_final", "output": "lm_head"}
    if (m := regex.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", gguf_name)) and m[2] in blocks:
        return f"layers.{m[1]}.{blocks[m[2]]}.weight"
    if (m := regex.fullmatch(r"(\w+)\.weight", gguf_name)) and m[1] in top:
        return f"{top[m[1]]}.weight"
    raise ValueError(f"no TransformerLM weight for the GGUF tensor {gguf_name!r}")


def tokenizer_from_gguf(metadata: dict) -> Tokenizer:
    """The file's byte-level BPE as a Tokenizer: tokens and merges read back from GPT-2's characters to bytes, control
    tokens as special tokens, the pre-tokenizer tokenizer.ggml.pre names; the chat template kept as .chat_template.
    ValueError for a tokenizer that is not byte-level BPE or a pre-tokenizer not in PATTERNS."""
    model, pre = metadata.get("tokenizer.ggml.model"), metadata.get("tokenizer.ggml.pre", "gpt-2")
    if model != "gpt2" or pre not in PATTERNS:
        raise ValueError(f"load_gguf reads byte-level BPE (tokenizer.ggml.model 'gpt2') with a pre-tokenizer of "
                         f"{', '.join(PATTERNS)}; this file has {model!r}, {pre!r}")
    byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
    as_bytes = lambda token: bytes(byte_of[char] for char in token)
    tokens, types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
    special = [token for token, kind in zip(tokens, types) if kind == CONTROL]
    vocab = {i: token.encode("utf-8") if kind == CONTROL else as_bytes(token)
             for i, (token, kind) in enumerate(zip(tokens, types))}
    merges = [tuple(as_bytes(part) for part in line.split(" ")) for line in metadata["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(vocab, merges, special, pattern=PATTERNS[pre])
    tokenizer.chat_template = metadata.get("tokenizer.chat_template")
    return tokenizer


def default_system(template: str | None) -> str | None:
    """The system prompt a ChatML template writes when the conversation has none (None if it writes none)."""
    if template is not None and not isinstance(template, str):
        raise TypeError(f"default_system takes the chat template as a str (or None), got {type(template).__name__}")
    found = regex.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", template or "", flags=regex.S)
    return found[1] if found else None


def chat_prompt(messages: list[dict], system: str | None = None) -> str:
    """ChatML: <|im_start|>role\ncontent<|im_end|>\n per message, a system message first (when `system` is given and
    the messages do not start with one), then <|im_start|>assistant\n. ValueError for no messages or a message that
    is not {"role": str, "content": str}."""
    for message in messages:
        if not isinstance(message, dict) or sorted(message) != ["content", "role"] or \
                not all(isinstance(value, str) for value in message.values()):
            raise ValueError(f"chat: a message is {{'role': str, 'content': str}}, got {message!r}")
    if not messages:
        raise ValueError("chat: the message list is empty (give at least one {'role': 'user', 'content': ...})")
    if messages[0]["role"] != "system" and system is not None:
        messages = [{"role": "system", "content": system}, *messages]
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + "<|im_start|>assistant\n"


class _TensorExtents(gguf.GGUFReader):
    """gguf's header parse without the tensors' data: each tensor's name and byte range, for a file too short."""

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        self.extents = []
        for field in fields:
            _, name, _, dims, kind, offset = field.parts
            block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(kind[0]))]
            size = int(np.prod(dims)) * block_bytes // block
            self.extents.append((bytes(name).decode("utf-8"), int(start_offs + offset[0]), size))


def open_gguf(path: str | os.PathLike) -> gguf.GGUFReader:
    """gguf.GGUFReader(path), or a ValueError in one line naming the file and what is wrong with it: not a GGUF file
    (its first bytes), or cut short (the first tensor whose bytes run past the file's end)."""
    with open(path, "rb") as file:
        head = file.read(8)
    if head[:4] != b"GGUF":
        raise ValueError(f"{os.fspath(path)} is not a GGUF file (its first bytes are {head!r}; a GGUF file starts "
                         f"with b'GGUF')")
    try:
        return gguf.GGUFReader(path)
    except (ValueError, IndexError) as error:  # numpy's reshape of a tensor whose bytes are not all there, say
        size = os.path.getsize(path)
        try:
            extents = _TensorExtents(path).extents
        except (ValueError, IndexError):
            raise ValueError(f"{os.fspath(path)} is truncated or damaged: its header cannot be read "
                             f"({size} bytes)") from error
        for name, start, nbytes in extents:
            if start + nbytes > size:
                raise ValueError(f"{os.fspath(path)} is truncated: tensor {name} needs {nbytes} bytes from byte "
                                 f"{start}, the file holds {max(0, size - start)} of them") from error
        raise


def state_dict_from(tensors: list, *, device=None, dtype=None) -> dict[str, Tensor]:
    """Every tensor of the file (reader.tensors) as float32 in PyTorch's order (tensor_of), under its name in
    TransformerLM's state dict (our_name), then moved to device and cast to dtype, one at a time."""
    if isinstance(tensors, (str, bytes, os.PathLike, gguf.GGUFReader)):
        raise TypeError(f"state_dict_from takes the file's tensors (reader.tensors), got {type(tensors).__name__}")
    return {our_name(t.name): tensor_of(t).to(device=device, dtype=dtype) for t in tensors}


def with_tied_head(state: dict[str, Tensor], tied: bool) -> dict[str, Tensor]:
    """The state dict a TransformerLM loads: with `tied` (the file has no output.weight), lm_head.weight is the
    embedding's tensor itself, the one matrix under its second name; otherwise the state as it is."""
    if tied and "token_embeddings.weight" not in state:
        raise ValueError(f"with_tied_head: a tied head is the embedding matrix, and the state dict has no "
                         f"token_embeddings.weight ({len(state)} keys, the first {sorted(state)[:2]})")
    if tied:
        state = {**state, "lm_head.weight": state["token_embeddings.weight"]}
    return state


def model_from_state(config: dict, state: dict[str, Tensor], device=None) -> TransformerLM:
    """A TransformerLM of `config` whose parameters are the state dict's tensors themselves: built on the meta device
    (shapes, no memory, no random initialisation), then loaded with assign=True; RoPE's tables, which no file holds,
    computed on `device` for the model's one shared RotaryPositionalEmbedding."""
    if not isinstance(config, dict):
        raise TypeError(f"model_from_state takes the configuration as a dict (model_config's), got "
                        f"{type(config).__name__}")
    with torch.device("meta"):
        model = TransformerLM(**config)
    model.load_state_dict(state, assign=True)  # the tensors become the parameters (a tied model re-ties)
    rope = model.layers[0].attn.rope           # every block's: TransformerLM keeps one set of tables
    tables = RotaryPositionalEmbedding(rope.theta, rope.d_k, rope.max_seq_len, device=device)
    rope.cos_table, rope.sin_table = tables.cos_table, tables.sin_table
    return model


def load_gguf(path: str | os.PathLike, *, device=None, dtype=None) -> tuple[TransformerLM, Tokenizer]:
    """A llama GGUF file (SmolLM2-135M-Instruct from `make weights`) as the course's TransformerLM and Tokenizer: the
    configuration from the metadata, every tensor dequantized to float32 and renamed, the model in eval mode, cast to
    dtype and moved to device. FileNotFoundError naming `make weights` when the file is missing; ValueError in one
    line for a file that is not GGUF or is cut short (open_gguf)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no GGUF file at {path}: run `make weights` to fetch SmolLM2-135M-Instruct")
    reader = open_gguf(path)
    metadata, tensor_names = read_metadata(reader), [t.name for t in reader.tensors]
    config = model_config(metadata, tensor_names)
    tokenizer = tokenizer_from_gguf(metadata)
    state = with_tied_head(state_dict_from(reader.tensors, device=device, dtype=dtype), config["tie_embeddings"])
    model = model_from_state(config, state, device)
    return model.to(device=device, dtype=dtype).eval(), tokenizer


@torch.no_grad()
def chat(model: TransformerLM, tokenizer: Tokenizer, messages: list[dict], *, max_new_tokens: int = 256,
         temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
         on_token: Callable[[str], None] | None = None) -> str:
    """The assistant's reply to `messages` ([{"role": "user", "content": ...}, ...]) in ChatML, with the template's
    default system prompt when they start without one, continued by notebook 10's generate (its KV caches, greedy at
    temperature 0, else sampled from next_token_distribution; `seed`: a sample you can repeat) until <|im_end|>,
    max_new_tokens or the end of the context. on_token(text) receives the reply as it decodes, never part of a
    character. Returns the reply's text without <|im_end|>. ValueError for no messages, a prompt that fills the
    context, or max_new_tokens < 0."""
    prompt = tokenizer.encode(chat_prompt(messages, default_system(getattr(tokenizer, "chat_template", None))))
    if len(prompt) >= model.context_length:
        raise ValueError(f"chat: the prompt is {len(prompt)} tokens and the context holds {model.context_length}: "
                         f"leave out earlier messages")
    if max_new_tokens < 0:
        raise ValueError(f"chat: max_new_tokens must be >= 0, got {max_new_tokens}")
    end = tokenizer.special_ids["<|im_end|>"]
    weight = model.lm_head.weight
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # keeps a character's first bytes until it ends

    def show(next_id: int) -> None:  # each new id's bytes through the decoder; on_token gets the text it completes
        text = "" if next_id == end else utf8.decode(tokenizer.vocab[next_id])  # <|im_end|> is not text
        if text:
            on_token(text)

    new = generate(model, torch.tensor(prompt, device=weight.device),
                   min(max_new_tokens, model.context_length - len(prompt)),  # no further than the context
                   temperature=temperature, top_k=top_k, top_p=top_p, eos_id=end,
                   generator=None if seed is None else torch.Generator(weight.device).manual_seed(seed),
                   on_token=None if on_token is None else show)
    if on_token is not None and (rest := utf8.decode(b"", final=True)):  # a reply cut inside a character
        on_token(rest)
    return tokenizer.decode([i for i in new.tolist() if i != end])


def chat_turn(history: list[dict], text: str, answer: Callable[[list[dict]], str]) -> str | None:
    """One Send of a chat box: `answer(messages)` (chat, say) replies to the conversation `history` continued by the
    user's `text`; both turns join `history` and None is returned. For an empty text, or when `answer` raises (a
    question longer than the context, say), `history` stays as it was and the message to show is returned instead."""
    if not isinstance(text, str):
        raise TypeError(f"chat_turn: the question is a str, got {type(text).__name__}")
    text = text.strip()
    if not text:
        return "Type a question first."
    question = {"role": "user", "content": text}
    try:
        reply = answer([*history, question])
    except Exception as error:  # shown in the box: an error raised in a button's callback is shown nowhere
        return f"{type(error).__name__}: {error}"
    history += [question, {"role": "assistant", "content": reply}]
    return None

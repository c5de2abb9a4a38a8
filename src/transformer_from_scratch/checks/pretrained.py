"""The checks of notebook 14 (a real model from a GGUF file): ``check_load_gguf`` and ``check_chat``.

Neither needs the 98 MB file of SmolLM2: each writes a tiny random llama model in the same format
(``_tiny_gguf.write_tiny_gguf``: Q8_0 embedding, Q4_1 matrices, F32 norms, tied embeddings, a byte-level BPE with
ChatML's control tokens) and compares the learner's function with an independent computation: the file read by
``gguf.GGUFReader``, dequantized by ``gguf.quants`` (llama.cpp's own numpy code) and run through the course's reference
model (``transformer_from_scratch.reference``, PyTorch's built-in functions) for ``load_gguf``; greedy decoding without
a cache, on a prompt rendered by ``jinja2`` from the file's template, for ``chat``.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import gguf
import numpy as np
import torch
from torch import nn

from .. import reference
from ..tokenizer import Tokenizer
from ..transformer_lm import TransformerLM
from ._harness import attempt, call, crashed, describe, fail, first_line, passed, refuses
from ._tiny_gguf import NORM_EPS, ROPE_THETA, SIZES, TEMPLATE, write_tiny_gguf
from ._fixtures import reference_tokenizer as _reference_tokenizer
from .steps.pretrained import TRANSPOSED_FIX, holds_transposed, load_crash, named_dequantization_mistake
from .tokenizer import short


@contextmanager
def one_thread() -> Iterator[None]:
    """PyTorch on one thread inside the block (the caller's count put back): a tiny model gains nothing from more, and
    on a busy machine their waiting for each other makes a step a hundred times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# ----------------------------------------------------------------------------------- the independent answer

def _metadata(reader: gguf.GGUFReader) -> dict:
    return {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}


_OUR_NAMES = {"token_embd": "token_embeddings", "output_norm": "ln_final", "output": "lm_head", "attn_norm": "ln1",
              "attn_q": "attn.q_proj", "attn_k": "attn.k_proj", "attn_v": "attn.v_proj",
              "attn_output": "attn.output_proj", "ffn_norm": "ln2", "ffn_gate": "ffn.w1", "ffn_up": "ffn.w3",
              "ffn_down": "ffn.w2"}


def _renamed(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "blk":
        return f"layers.{parts[1]}.{_OUR_NAMES[parts[2]]}.weight"
    return f"{_OUR_NAMES[parts[0]]}.weight"


def file_state(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict]:
    """The file's tensors by the course's names, dequantized by gguf.quants, float64 (lm_head tied when the file has
    no output.weight), and its metadata."""
    reader = gguf.GGUFReader(path)
    state = {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(np.array(t.data), t.tensor_type)
        state[_renamed(t.name)] = torch.from_numpy(np.ascontiguousarray(values)).double()
    state.setdefault("lm_head.weight", state["token_embeddings.weight"])
    return state, _metadata(reader)


def reference_logits(state: dict[str, torch.Tensor], ids: torch.Tensor, *, theta: float = ROPE_THETA,
                     eps: float = NORM_EPS) -> torch.Tensor:
    return reference.transformer_lm(ids, state, SIZES["num_heads"], theta, eps=eps)


IDS = torch.tensor([[1, 45, 200, 7, 288, 3, 120, 64, 2, 250, 17, 9]])


# ------------------------------------------------------------------------------------------------- load_gguf

def _unpack(out: Any, what: str) -> tuple[nn.Module, Any]:
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        fail(f"{what} returned {describe(out)}, not the pair (model, tokenizer)", "return both: model, tokenizer")
    model, tokenizer = out
    if not isinstance(model, nn.Module):
        fail(f"{what} returned a model that is {describe(model)}, not a TransformerLM", "return (model, tokenizer), "
             "the model first")
    return model, tokenizer


def file_blocks(path: str | os.PathLike) -> dict[str, tuple[str, torch.Tensor]]:
    """The file's quantized tensors by the course's names: (type, their raw uint8 blocks, one row of bytes per row)."""
    return {_renamed(t.name): (t.tensor_type.name, torch.from_numpy(np.array(t.data)))
            for t in gguf.GGUFReader(path).tensors if t.tensor_type.name in ("Q8_0", "Q4_1")}


def _check_weights(model: nn.Module, state: dict[str, torch.Tensor], what: str, tied: bool,
                   blocks: dict[str, tuple[str, torch.Tensor]]) -> None:
    found = dict(model.state_dict())
    missing = sorted(set(state) - set(found))
    if missing:
        fail(f"{what}: the model has no {missing[0]}", "build a TransformerLM with model_config's arguments: its "
             "state dict holds every name our_name gives")
    for name, expected in state.items():
        weight = found[name]
        if weight.is_meta:
            fail(f"{what}: {name} is still on the meta device, with no numbers", "load the file's tensors into the "
                 "model (model_from_state: the tensors become the parameters) and compute what the file does not hold "
                 "(RoPE's tables)")
        if tuple(weight.shape) != tuple(expected.shape):
            fail(f"{what}: {name} has shape {tuple(weight.shape)}, expected {tuple(expected.shape)}",
                 "ggml lists a tensor's fastest axis first: reverse its shape to get PyTorch's (d_out, d_in)")
        got = weight.detach().to("cpu", torch.float64)
        if torch.allclose(got, expected, rtol=1e-6, atol=1e-6):
            continue
        if holds_transposed(got, expected):
            fail(f"{what}: {name} holds the file's numbers transposed", TRANSPOSED_FIX)
        if name == "lm_head.weight" and tied:
            fail(f"{what}: lm_head.weight is not the embedding matrix, though the file has no output.weight",
                 "a file without output.weight ties the embeddings: build the model with tie_embeddings=True")
        if name in blocks:
            kind, raw = blocks[name]
            if (named := named_dequantization_mistake(got, raw, expected, kind)) is not None:
                mistake, fix = named
                fail(f"{what}: {name}, a {kind} tensor, is dequantized wrong: {mistake}", fix,
                     f"the dequantizer of {kind} in your final class (check_dequantize_{kind.lower()} runs it alone)")
        fail(f"{what}: {name} differs from the file's dequantized values by up to "
             f"{(got - expected).abs().max().item():.3g}", "dequantize each tensor by its type (F32, F16, Q8_0, "
             "Q4_1: check_dequantize_q8_0 and check_dequantize_q4_1) and give it its own name (our_name)")
    on_meta = [name for name, buffer in model.named_buffers() if buffer.is_meta]
    if on_meta:
        fail(f"{what}: {on_meta[0]} (RoPE's table) is still on the meta device, with no numbers", "the file holds no "
             "RoPE tables: compute them (a RotaryPositionalEmbedding built for the model's sizes and rope_theta)")
    if tied and model.lm_head.weight is not model.token_embeddings.weight:
        fail(f"{what}: lm_head.weight is a copy of the embedding matrix, not the same Parameter",
             "tie them (TransformerLM(..., tie_embeddings=True)): one matrix, read twice, as in the file")
    ropes = {id(layer.attn.rope) for layer in model.layers}
    if len(ropes) > 1:
        fail(f"{what}: the blocks have {len(ropes)} RoPE modules, one each", "TransformerLM shares one set of tables "
             "between its blocks (the same numbers): compute the tables of that one module once (model_from_state)")


def _load(load_gguf: Callable[..., Any], path: str, what: str, **kwargs: Any) -> tuple[nn.Module, Any]:
    """load_gguf(path, **kwargs) as (model, tokenizer); a crash in load_state_dict named by its classic cause (the
    key/value heads left out, the tie left out)."""
    out, error = attempt(what, load_gguf, path, **kwargs)
    if error is not None:
        if (cause := load_crash(error)) is not None:
            fail(*cause, f"on {what}: {type(error).__name__}: {first_line(error)[:160]}")
        crashed(what, error)
    return _unpack(out, what)


def _check_errors(load_gguf: Callable[..., Any], folder: Path) -> None:
    missing = folder / "no-such-file.gguf"
    what = "load_gguf(a path where there is no file)"
    error = refuses(what, lambda: load_gguf(str(missing)), FileNotFoundError, "a missing file is not refused",
                    "check the path first and raise FileNotFoundError saying to run `make weights`, which fetches "
                    "the file")
    if "make weights" not in str(error):
        fail(f"{what} raised FileNotFoundError without saying how to get the file ({str(error).strip()[:80]})",
             "name `make weights` in the message: it fetches SmolLM2's file")
    what = "load_gguf(a file whose architecture is qwen2)"
    error = refuses(what, lambda: load_gguf(str(folder / "qwen2.gguf")), ValueError,
                    "another architecture is accepted, though it has other parts and this TransformerLM would compute "
                    "something else", "check general.architecture first (model_config) and raise ValueError naming it")
    if "qwen2" not in str(error):
        fail(f"{what} raised ValueError without naming the architecture ({str(error).strip()[:80]})",
             "say which architecture the file has (general.architecture) and that load_gguf reads llama")
    what = "load_gguf(a file whose matrices are BF16)"
    path = folder / "bf16.gguf"
    out, error = attempt(what, load_gguf, str(path))
    if error is None:  # reading BF16 right is fine too; anything else is not
        model, _ = _unpack(out, what)
        state = file_state(path)[0]
        found = model.state_dict()
        if any(name not in found or found[name].shape != w.shape or not torch.allclose(
                found[name].detach().to("cpu", torch.float64), w, rtol=1e-6, atol=1e-6) for name, w in state.items()):
            fail(f"{what} loads the BF16 tensors as something else: a tensor type it does not read is not refused",
                 "raise ValueError naming the tensor and its type (tensor.tensor_type.name) for a type other than "
                 "F32, F16, Q8_0 and Q4_1")
    elif not isinstance(error, ValueError):
        fail(f"{what} raised {type(error).__name__} ({str(error).strip()[:60]}), not ValueError",
             "refuse a tensor type it does not read with ValueError naming the type (tensor.tensor_type.name)")
    elif "BF16" not in str(error):
        fail(f"{what} raised ValueError without naming the tensor type ({str(error).strip()[:80]})",
             "say which type the tensor has (BF16) and which load_gguf reads")


def check_load_gguf(load_gguf: Callable[..., Any]) -> None:
    """Check ``load_gguf(path, *, device=None, dtype=None) -> (model, tokenizer)`` on a tiny random llama file in
    SmolLM2's format: every weight the file's value dequantized by gguf.quants, under its course name and in
    PyTorch's shape; lm_head the embedding's Parameter (no output.weight) or the file's output.weight; the logits those
    of the course's reference model on the same numbers; the tokenizer's ids; dtype= and device= applied (the meta
    device: no GPU needed); FileNotFoundError naming `make weights` for a missing file, ValueError naming another
    architecture or an unsupported tensor type (BF16).

    Mistakes it recognises: not a (model, tokenizer) pair; a weight missing, still on the meta device, of the wrong
    shape, transposed or with other values; a dequantizer's classic mistakes (those its step check names: a scale
    read as bfloat16 or float32, one scale per row, q / d, the minimum subtracted, ...); RoPE's tables left on the
    meta device, or one set per block; lm_head not tied, or a copy, or tied in a file that has output.weight; the tie
    left out of the state dict, or the key/value heads out of the model (load_state_dict's crash, named);
    rope_theta or norm_eps not the file's; other token ids; dtype or device ignored;
    a missing file without `make weights` in its error; another architecture accepted, refused with another error or
    without its name; a BF16 tensor read as something else, or refused with another error or without its type (reading
    BF16 right passes).
    """
    with tempfile.TemporaryDirectory() as name, one_thread():
        folder = Path(name)
        path = write_tiny_gguf(folder / "tiny.gguf")
        untied = write_tiny_gguf(folder / "untied.gguf", tied=False, seed=1)
        write_tiny_gguf(folder / "qwen2.gguf", architecture="qwen2")
        write_tiny_gguf(folder / "bf16.gguf", matrix_type="BF16")
        what = "load_gguf(path of a tiny random llama file)"
        model, tokenizer = _load(load_gguf, path, what)
        state, metadata = file_state(path)
        _check_weights(model, state, what, tied=True, blocks=file_blocks(path))
        what_untied = "load_gguf(a tiny file with its own output.weight)"
        untied_model, _ = _load(load_gguf, untied, what_untied)
        _check_weights(untied_model, file_state(untied)[0], what_untied, tied=False, blocks=file_blocks(untied))
        if untied_model.lm_head.weight is untied_model.token_embeddings.weight:
            fail(f"{what_untied}: lm_head is tied to the embedding matrix", "tie only a file without output.weight")
        _check_logits(model, state, what)
        _check_tokenizer(tokenizer, metadata, what)
        _check_dtype_device(load_gguf, path)
        _check_errors(load_gguf, folder)
    passed("load_gguf: every weight the file's (dequantized, renamed, in PyTorch's shape), tied exactly when the file "
           "has no output.weight, logits as the reference's, the file's tokenizer, dtype and device applied; a missing "
           "file, another architecture or tensor type refused")


def _check_logits(model: nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    with torch.no_grad():
        out = call(f"the model of {what}, on 12 token ids", model, IDS.clone())
    expected = reference_logits(state, IDS)
    if not isinstance(out, torch.Tensor) or out.shape != expected.shape:
        fail(f"the model of {what} returned {describe(out)}, expected logits of shape {tuple(expected.shape)}",
             "build the course's TransformerLM")
    out = out.detach().to(torch.float64)
    if torch.allclose(out, expected, rtol=1e-4, atol=1e-4):
        return
    for key, value, wrong in (("rope_theta", 10000.0, dict(theta=10000.0)), ("norm_eps", 1e-5, dict(eps=1e-5))):
        if torch.allclose(out, reference_logits(state, IDS, **wrong), rtol=1e-4, atol=1e-4):
            fail(f"the model of {what} uses {key} = {value}, TransformerLM's default, not the file's",
                 "build the model with model_config's arguments: rope_theta (llama.rope.freq_base) and norm_eps "
                 "(llama.attention.layer_norm_rms_epsilon) come from the metadata; SmolLM2's eps happens to be the "
                 "default, this file's is not")
    fail(f"the model of {what} gives other logits than the reference model on the file's weights, by up to "
         f"{(out - expected).abs().max().item():.3g}", "every weight is right: check the model's configuration "
         "(model_config: heads, key/value heads, rope_theta, norm_eps) and RoPE's tables, computed, not loaded")


def _check_tokenizer(tokenizer: Any, metadata: dict, what: str) -> None:
    expected = _reference_tokenizer(metadata)
    text = "<|im_start|>user\nHello café, the theme is 2024<|im_end|>\n"
    if not hasattr(tokenizer, "encode"):
        fail(f"{what} returned a tokenizer that is {describe(tokenizer)}", "return the file's Tokenizer "
             "(tokenizer_from_gguf) second")
    ids = call(f"the tokenizer of {what}: encode({text!r})", tokenizer.encode, text)
    if ids != expected.encode(text):
        fail(f"the tokenizer of {what} gives other ids than the file's tokenizer", "build it with "
             "tokenizer_from_gguf(metadata) from the same file", f"yours: {short(ids)}")


def _check_dtype_device(load_gguf: Callable[..., Any], path: str) -> None:
    what = "load_gguf(path, dtype=torch.float64)"
    model, _ = _unpack(call(what, load_gguf, path, dtype=torch.float64), what)
    wrong = [(n, p.dtype) for n, p in model.named_parameters() if p.dtype != torch.float64]
    if wrong:
        fail(f"{what} gives {wrong[0][0]} in {wrong[0][1]}", "dtype is the caller's choice for the whole model: "
             "cast it once it is built, every weight and table of it")
    what = "load_gguf(path, device='meta')"
    model, _ = _unpack(call(what, load_gguf, path, device="meta"), what)
    wrong = [(n, p.device) for n, p in model.named_parameters() if p.device.type != "meta"]
    if wrong:
        fail(f"{what} leaves {wrong[0][0]} on {wrong[0][1]}", "device is the caller's choice for the whole model: "
             "move it once it is built, every weight and table of it")


# ------------------------------------------------------------------------------------------------------ chat

class _Scripted(TransformerLM):
    """The tiny model, whose next token after each token of ``script`` is the script's next one: logits + 100 there."""

    boost: torch.Tensor

    def forward(self, token_ids, token_positions=None, *, cache=None):
        return super().forward(token_ids, token_positions, cache=cache) + self.boost[token_ids]


def _scripted(model: TransformerLM, chain: list[int]) -> TransformerLM:
    boost = torch.zeros(model.vocab_size, model.vocab_size)
    for here, after in zip(chain, chain[1:]):
        boost[here, after] = 100.0
    scripted = _Scripted.__new__(_Scripted)
    scripted.__dict__.update(model.__dict__)
    scripted.boost = boost
    return scripted


def _render(messages: list[dict], *, system: bool = True, generation: bool = True) -> str:
    import jinja2

    template = TEMPLATE if system else TEMPLATE.replace(
        TEMPLATE[TEMPLATE.index("{% if loop.first"):TEMPLATE.index("{% endif %}") + len("{% endif %}")], "")
    return jinja2.Template(template, keep_trailing_newline=True).render(messages=messages,
                                                                        add_generation_prompt=generation)


@torch.no_grad()
def _greedy(model: nn.Module, tokenizer: Tokenizer, prompt: str, max_new_tokens: int) -> str:
    """Greedy decoding without a cache (the whole sequence each step), until <|im_end|>."""
    ids, end, reply = tokenizer.encode(prompt), tokenizer.special_ids["<|im_end|>"], []
    for _ in range(max_new_tokens):
        next_id = int(model(torch.tensor([ids + reply]))[0, -1].argmax())
        if next_id == end:
            break
        reply.append(next_id)
    return tokenizer.decode(reply)


MESSAGES = [{"role": "user", "content": "Hello café"}]
SCRIPT = "Hi €é!"  # two characters of several bytes, each byte its own token


def _chat(chat: Callable[..., Any], model: nn.Module, tokenizer: Any, messages: list[dict], what: str,
          draw: int = 0, **kwargs: Any) -> Any:
    """chat(...), a str back; torch's own generator at a new state for each ``draw`` (a chat that samples without its
    seed draws other tokens each time), and the caller's put back afterwards. Every call of the model is watched: its
    number of ids and whether it got a cache, so that a chat without the cache, or one that feeds it the whole text
    again, is named (even when that made it fail). A cache that overflows is named as a loop that runs too long."""
    calls: list[tuple[int, bool]] = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append((args[0].shape[-1], kwargs.get("cache") is not None)),
        with_kwargs=True)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(draw)
            out, error = attempt(what, chat, model, tokenizer, [dict(m) for m in messages], **kwargs)
    finally:
        hook.remove()
    _check_cache_use(calls, what)
    if isinstance(error, ValueError) and "do not fit after the" in str(error):  # KVCache.update's refusal
        fail(f"{what} raised ValueError ({first_line(error)}): the loop runs past the positions its cache holds",
             "the cache holds the prompt and the reply (prompt + max_new_tokens, at most context_length): stop "
             "after max_new_tokens tokens, or where the context ends, whichever comes first")
    if isinstance(error, ValueError) and "more than context_length" in str(error):  # TransformerLM's refusal
        fail(f"{what} raised ValueError ({short(first_line(error), 90)}): the reply runs past the end of the context",
             "stop where the prompt and the reply fill model.context_length, even when max_new_tokens allows more")
    if error is not None:
        crashed(what, error)
    if not isinstance(out, str):
        fail(f"{what} returned {describe(out)}, not a str", "return the reply's text")
    return out


def _check_cache_use(calls: list[tuple[int, bool]], what: str) -> None:
    """The model's calls of one chat, (ids, cache given): the prompt once, then one new id a call, with the caches."""
    if len(calls) > 1 and not any(cached for _, cached in calls):
        fail(f"{what} runs the model without a cache: each step computes the whole text again", "decode with "
             "notebook 10's generate, whose KV caches keep every earlier key and value, so that after the prompt "
             "each step runs the newest token alone")
    again = [(step, n) for step, (n, cached) in enumerate(calls, 1) if step > 1 and cached and n > 1]
    if again:
        fail(f"{what} feeds the model {again[0][1]} ids at step {again[0][0]}, the whole text again, though its cache "
             "holds all but the newest", "the cache already holds the keys and values of every earlier token: after "
             "the prompt, each step needs only the newest token (as notebook 10's generate does)")


def check_chat(chat: Callable[..., Any]) -> None:
    """Check ``chat(model, tokenizer, messages, *, max_new_tokens, temperature, top_k, top_p, seed, on_token)`` on
    the tiny random model of a GGUF file: the greedy reply equals greedy decoding without a cache on the template's
    prompt; on a model made to answer "Hi €é!" then <|im_end|>, byte by byte, the reply stops there and leaves
    <|im_end|> out, on_token's pieces join to the reply and never split a character, max_new_tokens is respected; a
    seed makes sampling repeatable and temperature > 0 samples; ValueError for no messages.

    Mistakes it recognises: the prompt without the template's default system prompt, or without
    <|im_start|>assistant\\n; no KV cache, or the whole text fed to it again at each step; <|im_end|> in the reply, or
    decoding past it; max_new_tokens not respected (one more, one fewer, ignored, or a loop that overflows the cache);
    no stop where the context ends; on_token pieces that split a character or do not join to the reply; the seed
    ignored; temperature, top_k or top_p ignored; an empty message list accepted.
    """
    with one_thread():
        _check_chat(chat)
    passed("chat: the greedy reply on the template's prompt, one new id a step through the KV cache, stopping at "
           "<|im_end|> (left out), at max_new_tokens or where the context ends; on_token's pieces whole characters "
           "that join to the reply; sampling repeatable with a seed, top_k and top_p applied")


def _check_chat(chat: Callable[..., Any]) -> None:
    from ..pretrained import load_gguf as course_load

    with tempfile.TemporaryDirectory() as folder:
        model, tokenizer = course_load(write_tiny_gguf(Path(folder) / "tiny.gguf"))
    _check_script(chat, model, tokenizer)
    n = 6
    what = f"chat(model, tokenizer, {MESSAGES!r}, max_new_tokens={n})"
    out = _chat(chat, model, tokenizer, MESSAGES, what, max_new_tokens=n)
    expected = _greedy(model, tokenizer, _render(MESSAGES), n)
    if out != expected:
        if out == _greedy(model, tokenizer, _render(MESSAGES, system=False), n):
            fail("the prompt has no system message: the file's template adds its default one when the messages start "
                 "without one", "pass default_system(tokenizer.chat_template) to chat_prompt as `system`")
        if out == _greedy(model, tokenizer, _render(MESSAGES, generation=False), n):
            fail("the prompt does not end with <|im_start|>assistant\\n", "build it with chat_prompt, which opens the "
                 "assistant's turn: the model then writes the reply, not a new message")
        fail(f"{what} returned {out!r}, not the greedy reply {expected!r}", "encode chat_prompt(messages, "
             "default_system(tokenizer.chat_template)), then pick the most likely token at each step (temperature 0), "
             "feeding each new token through the cache")
    _check_sampling(chat, model, tokenizer, expected)
    _check_context(chat, model, tokenizer)
    with torch.random.fork_rng(devices=[]):
        refuses("chat(model, tokenizer, [])", lambda: chat(model, tokenizer, []), ValueError,
                "an empty conversation is not refused", "raise ValueError for an empty list (chat_prompt does)",
                shown=short)


def _check_script(chat: Callable[..., Any], model: TransformerLM, tokenizer: Tokenizer) -> None:
    prompt = tokenizer.encode(_render(MESSAGES))
    script = [tokenizer.ids[bytes([b])] for b in SCRIPT.encode("utf-8")]
    scripted = _scripted(model, [prompt[-1], *script, tokenizer.special_ids["<|im_end|>"]])
    pieces: list[str] = []
    what = f"chat(a model that answers {SCRIPT!r} then <|im_end|>, one byte per token, max_new_tokens=20, on_token=...)"
    out = _chat(chat, scripted, tokenizer, MESSAGES, what, max_new_tokens=20, on_token=pieces.append)
    if out != SCRIPT:
        if out == SCRIPT + "<|im_end|>":
            fail(f"{what} returned {out!r}: the reply includes <|im_end|>", "stop when the model picks <|im_end|> and "
                 "leave it out: it marks the end of the turn, it is not text")
        if out.startswith(SCRIPT):
            fail(f"{what} returned {short(out)}: it does not stop at <|im_end|>", "stop as soon as the model picks "
                 "<|im_end|>'s id (tokenizer.special_ids['<|im_end|>']): the assistant's turn is over")
        split = "".join(tokenizer.decode([i]) for i in script)
        if out == split or "\ufffd" in out:
            fail(f"{what} returned {out!r}: the reply is decoded token by token, and a character split across tokens "
                 "becomes U+FFFD", "€ and é are several bytes of UTF-8, each its own token here: decode the reply's "
                 "bytes together, or incrementally, never one token's bytes alone")
        fail(f"{what} returned {out!r}, not {SCRIPT!r}", "the reply is the text of the ids picked before <|im_end|>, "
             "their bytes decoded together")
    if "".join(pieces) != out:
        if any("\ufffd" in piece for piece in pieces):
            fail("on_token receives part of a character (U+FFFD): € and é are several bytes of UTF-8, each its own "
                 "token here, so a token's bytes alone are not always text",
                 "decode the bytes incrementally: hold a character's first bytes until it is whole, then pass it on",
                 f"on {what}: pieces {short(pieces)}")
        fail(f"on_token's pieces do not join to the reply ({short(pieces)} for {out!r})", "call on_token with the "
             "text of each new token as it is decoded, and nothing else")
    limit = 3
    what = f"chat(a model that answers {SCRIPT!r}, max_new_tokens={limit})"
    out = _chat(chat, scripted, tokenizer, MESSAGES, what, max_new_tokens=limit)
    texts = [tokenizer.decode(script[:k]) for k in range(len(script) + 1)]
    if out != texts[limit]:
        if out == texts[limit + 1]:
            fail(f"{what} returned {out!r}: one token more than max_new_tokens", "generate at most max_new_tokens "
                 "tokens: count the ones made")
        if out == texts[limit - 1]:
            fail(f"{what} returned {out!r}: one token fewer than max_new_tokens", "generate max_new_tokens tokens "
                 "(unless <|im_end|> comes first)")
        fail(f"{what} returned {out!r}: max_new_tokens is not respected", f"stop after max_new_tokens tokens "
             f"({texts[limit]!r} here)")


def _check_sampling(chat: Callable[..., Any], model: TransformerLM, tokenizer: Tokenizer, greedy: str) -> None:
    n = 5
    replies = []
    for draw, seed in enumerate((0, 0, 1)):
        what = f"chat(model, tokenizer, {MESSAGES!r}, max_new_tokens={n}, temperature=1.5, seed={seed})"
        replies.append(_chat(chat, model, tokenizer, MESSAGES, what, 1000 + draw, max_new_tokens=n, temperature=1.5,
                             seed=seed))
    if replies[0] != replies[1]:
        fail(f"two replies with seed=0 differ ({replies[0]!r}, {replies[1]!r}): the seed is not used",
             "a sample is repeatable only when its random numbers come from a generator seeded with `seed`, of "
             "its own (not the global one): hand that generator to the draws, so that the same seed gives the "
             "same reply")
    if all(reply == greedy[:len(reply)] or greedy.startswith(reply) for reply in replies):
        fail(f"with temperature=1.5 the replies are the greedy one ({greedy!r}): temperature is ignored",
             "at temperature > 0 sample the next token from softmax(logits / temperature) (next_token_distribution), "
             "the most likely one only at temperature 0")
    for knob, value in (("top_k", 1), ("top_p", 1e-6)):  # either keeps the most likely token alone: greedy
        for draw, seed in enumerate((0, 1, 2)):
            what = f"chat(model, tokenizer, {MESSAGES!r}, max_new_tokens={n}, temperature=1.5, {knob}={value}, " \
                   f"seed={seed})"
            reply = _chat(chat, model, tokenizer, MESSAGES, what, 2000 + draw, max_new_tokens=n, temperature=1.5,
                          seed=seed, **{knob: value})
            if not greedy.startswith(reply):
                fail(f"{what} returned {reply!r}, not the start of the greedy reply {greedy!r}: {knob} is ignored",
                     f"pass top_k and top_p on to next_token_distribution: {knob}={value} keeps the most likely "
                     "token alone")


def _check_context(chat: Callable[..., Any], model: TransformerLM, tokenizer: Tokenizer) -> None:
    """A reply that may run on (max_new_tokens far beyond the context) stops where the context ends, as greedy
    decoding of context_length - len(prompt) tokens does."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    room = model.context_length - len(tokenizer.encode(_render(messages)))
    what = f"chat(model, tokenizer, {messages!r}, max_new_tokens={10 * model.context_length}) on a model of " \
           f"context_length={model.context_length}"
    out = _chat(chat, model, tokenizer, messages, what, max_new_tokens=10 * model.context_length)
    expected = _greedy(model, tokenizer, _render(messages), room)
    if out != expected:
        fail(f"{what} returned {short(out)}, not the {room} tokens that fill the context ({short(expected)})",
             "stop where the prompt and the reply fill model.context_length, even when max_new_tokens allows more")

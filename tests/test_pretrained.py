"""Notebook 14's module (pretrained.py) against independent implementations: llama.cpp's `gguf.quants` for the
dequantizers, Hugging Face's `transformers` (its own GGUF loader and Llama) for the whole model, Hugging Face's
`tokenizers` with SmolLM2's pre-tokenizer for the tokenizer, `jinja2` on the file's own template for the chat prompt.

The real file comes from `make weights` (make test fetches it first); loading it takes seconds, so each model is
loaded once per module.
"""

import gguf
import jinja2
import numpy as np
import pytest
import regex
import torch

from transformer_from_scratch import GPT2_PATTERN, Tokenizer
from transformer_from_scratch.checks._tiny_gguf import write_tiny_gguf
from transformer_from_scratch.pretrained import (PATTERNS, SMOLLM_PATTERN, chat, chat_prompt, default_system,
                                                 dequantize_q4_1, dequantize_q8_0, load_gguf, model_config, our_name,
                                                 read_metadata, tensor_of, tokenizer_from_gguf)
from transformer_from_scratch.weights import gguf_path

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "What is 12 + 35?"]
TEXTS = ["Hello, world!", "In 1984,  12345 people paid $3.50 each.", "x  1", "a   22\n\n 3", "tabs\t\t7 and  \n  spaces   ",
         "café naïve 東京 🎉👍🏽", "def f(x):\n    return x**2  # square\n", "<|im_start|>user\nhi<|im_end|>\n",
         "I'm sure you'll see they've", "ⅻ ½ ²3 ٣٤", "  leading", "trailing  ", "\n\n\n", "", " 1 2  3   4", "9\n 9\t9"]


@pytest.fixture(scope="module")
def path():
    return gguf_path()  # a one-line error naming `make weights` if the file is missing


@pytest.fixture(scope="module")
def reader(path):
    return gguf.GGUFReader(path)


@pytest.fixture(scope="module")
def metadata(reader):
    return read_metadata(reader)


@pytest.fixture(scope="module")
def ours(path):
    return load_gguf(path)


@pytest.fixture(scope="module")
def hf_model(path):
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                             dtype=torch.float32).eval()


# --- dequantization ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, ours_fn", [("Q8_0", dequantize_q8_0), ("Q4_1", dequantize_q4_1)])
@pytest.mark.parametrize("shape", [(1, 32), (3, 64), (2, 5, 96)])
def test_dequantize_equals_gguf_on_random_weights(kind, ours_fn, shape):
    qtype = gguf.GGMLQuantizationType[kind]
    weights = np.random.default_rng(0).normal(scale=0.05, size=shape).astype(np.float32)
    packed = gguf.quants.quantize(weights, qtype)
    expected = gguf.quants.dequantize(packed, qtype)
    out = ours_fn(torch.from_numpy(packed))
    assert out.dtype == torch.float32 and tuple(out.shape) == shape
    torch.testing.assert_close(out, torch.from_numpy(expected), rtol=0, atol=0)
    assert (out - torch.from_numpy(weights)).abs().max() < 0.05  # and it is close to what was quantized


def test_q4_1_by_hand():
    """One block written by hand: d = 0.5, m = -1, byte j = (q_{j+16} << 4) | q_j with q_j = j, q_{j+16} = 15 - j."""
    low, high = list(range(16)), [15 - j for j in range(16)]
    block = (np.float16(0.5).tobytes() + np.float16(-1.0).tobytes() + bytes((h << 4) | l for l, h in zip(low, high)))
    out = dequantize_q4_1(torch.tensor(list(block), dtype=torch.uint8)[None])
    assert out[0].tolist() == [0.5 * q - 1.0 for q in low + high]


def test_q8_0_by_hand():
    q = list(range(-16, 16))
    block = np.float16(0.25).tobytes() + np.array(q, dtype=np.int8).tobytes()
    out = dequantize_q8_0(torch.tensor(list(block), dtype=torch.uint8)[None])
    assert out[0].tolist() == [0.25 * v for v in q]


def test_every_tensor_of_the_file_equals_gguf(reader):
    for tensor in reader.tensors:
        expected = torch.from_numpy(np.array(gguf.quants.dequantize(tensor.data, tensor.tensor_type))).float()
        out = tensor_of(tensor)
        assert tuple(out.shape) == tuple(int(n) for n in reversed(tensor.shape)), tensor.name
        assert torch.equal(out.flatten(), expected.flatten()), tensor.name


# --- configuration and names -------------------------------------------------------------------------------------

def test_config_equals_transformers(metadata, reader, hf_model):
    config = model_config(metadata, [t.name for t in reader.tensors])
    hf = hf_model.config
    assert config == dict(vocab_size=hf.vocab_size, context_length=hf.max_position_embeddings, d_model=hf.hidden_size,
                          num_layers=hf.num_hidden_layers, num_heads=hf.num_attention_heads, d_ff=hf.intermediate_size,
                          rope_theta=float(hf.rope_parameters["rope_theta"]) if getattr(hf, "rope_parameters", None)
                          else float(hf.rope_theta), num_kv_heads=hf.num_key_value_heads, norm_eps=config["norm_eps"],
                          tie_embeddings=hf.tie_word_embeddings)
    assert config["norm_eps"] == pytest.approx(hf.rms_norm_eps)


def test_every_name_has_a_place(reader, ours):
    model, _ = ours
    names = {our_name(t.name) for t in reader.tensors} | {"lm_head.weight"}
    assert names == set(model.state_dict())


# --- the whole model against transformers ------------------------------------------------------------------------

def test_logits_equal_transformers(ours, hf_model):
    model, tokenizer = ours
    assert model.lm_head.weight is model.token_embeddings.weight
    assert sum(p.numel() for p in model.parameters()) == hf_model.num_parameters() == 134_515_008
    for text in [chat_prompt([{"role": "user", "content": QUESTIONS[0]}], default_system(tokenizer.chat_template)),
                 "The quick brown fox jumps over the lazy dog. " * 8]:
        ids = torch.tensor([tokenizer.encode(text)])
        with torch.no_grad():
            torch.testing.assert_close(model(ids), hf_model(ids).logits, rtol=0, atol=1e-4)


@pytest.mark.parametrize("question", QUESTIONS)
def test_greedy_replies_equal_transformers(ours, hf_model, question):
    model, tokenizer = ours
    messages = [{"role": "user", "content": question}]
    reply = chat(model, tokenizer, messages, max_new_tokens=48)
    end = tokenizer.special_ids["<|im_end|>"]
    ids = torch.tensor([tokenizer.encode(chat_prompt(messages, default_system(tokenizer.chat_template)))])
    new = hf_model.generate(ids, max_new_tokens=48, do_sample=False, eos_token_id=end)[0, ids.shape[1]:].tolist()
    assert reply == tokenizer.decode([i for i in new if i != end])
    if question == QUESTIONS[0]:
        assert reply == "The capital of France is Paris."


def test_bfloat16_follows_float32(path, ours):
    """bfloat16 is the float32 model rounded: along a whole reply, read teacher-forced, its next-token distributions
    stay close to float32's. Not one greedy text: a near-tie early in a reply sends it elsewhere after any rounding
    change, and half-precision kernels round differently from one CPU to another (Intel's AMX units). Measured on
    this test's reply: mean KL 0.002, max 0.04, top-1 agreement 0.95-1.0, with and without AMX."""
    model, tokenizer = ours
    half, _ = load_gguf(path, dtype=torch.bfloat16)
    assert half.lm_head.weight.dtype == torch.bfloat16
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    text = chat_prompt(messages, default_system(tokenizer.chat_template)) + chat(model, tokenizer, messages)
    ids = torch.tensor([tokenizer.encode(text)])
    with torch.no_grad():
        exact, rounded = (torch.log_softmax(m(ids)[0].double(), dim=-1) for m in (model, half))
    kl = (exact.exp() * (exact - rounded)).sum(-1)  # KL(float32 || bfloat16) at every position, in nats
    agreement = (exact.argmax(-1) == rounded.argmax(-1)).double().mean().item()
    assert kl.mean() < 0.02 and kl.max() < 0.2 and agreement >= 0.9, (kl.mean(), kl.max(), agreement)



# --- the tokenizer -----------------------------------------------------------------------------------------------

def _smollm_reference(metadata):
    """SmolLM2's own tokenizer (its tokenizer.json: Digits(individual_digits) then ByteLevel) on the file's vocab."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {token: i for i, token in enumerate(metadata["tokenizer.ggml.tokens"])}
    hf = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, [tuple(m.split(" ")) for m in metadata["tokenizer.ggml.merges"]]))
    hf.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([
        tokenizers.pre_tokenizers.Digits(individual_digits=True),
        tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    specials = [t for t, kind in zip(metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]) if kind == 3]
    hf.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in specials])
    return hf


def test_tokenizer_ids_equal_smollm2s(metadata):
    ours = tokenizer_from_gguf(metadata)
    reference = _smollm_reference(metadata)
    from transformer_from_scratch._project import repo_root
    plays = (repo_root() / "notebooks" / "data" / "shakespeare" / "heldout.txt").read_text(encoding="utf-8")[:30_000]
    for text in [*TEXTS, plays]:
        assert ours.encode(text) == reference.encode(text).ids, repr(text[:40])
        assert ours.decode(ours.encode(text)) == text
    assert len(ours) == 49_152 and len(ours.special_tokens) == 17
    assert ours.encode("<|im_end|>") == [2]


def _digits_first(text: str) -> list[str]:
    """SmolLM2's pre-tokenizer as two passes (llama.cpp's "smollm"): every digit alone, then GPT-2's on the rest."""
    out = []
    for piece in regex.split(r"(\p{N})", text):
        out += [piece] if regex.fullmatch(r"\p{N}", piece) else regex.findall(GPT2_PATTERN, piece)
    return out


def test_smollm_pattern_is_digits_first_then_gpt2():
    alphabet = ["a", "Z", "é", "1", "٣", "½", " ", "  ", "\n", "\t", "'s", ".", "!", "東", "🎉"]
    rng = np.random.default_rng(0)
    texts = TEXTS + ["".join(rng.choice(alphabet, size=rng.integers(1, 20))) for _ in range(3000)]
    for text in texts:
        assert regex.findall(SMOLLM_PATTERN, text) == _digits_first(text), repr(text)
    assert PATTERNS["gpt-2"] == GPT2_PATTERN


# --- the chat ----------------------------------------------------------------------------------------------------

def test_chat_prompt_equals_the_files_template(metadata):
    template = jinja2.Template(metadata["tokenizer.chat_template"])
    system = default_system(metadata["tokenizer.chat_template"])
    assert system == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    conversations = [
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}],
    ]
    for messages in conversations:
        assert chat_prompt(messages, system) == template.render(messages=messages, add_generation_prompt=True)


def test_chat_streams_whole_characters_and_stops_at_im_end(ours):
    model, tokenizer = ours
    pieces = []
    messages = [{"role": "user", "content": "Reply with three emoji and the word café."}]
    reply = chat(model, tokenizer, messages, max_new_tokens=24, on_token=pieces.append)
    assert "".join(pieces) == reply and "<|im_end|>" not in reply
    assert all("\ufffd" not in piece for piece in pieces)


def test_chat_sampling_repeats_with_a_seed(ours):
    model, tokenizer = ours
    messages = [{"role": "user", "content": "Tell me a story."}]
    runs = [chat(model, tokenizer, messages, max_new_tokens=12, temperature=1.0, top_p=0.9, seed=s) for s in (1, 1, 2)]
    assert runs[0] == runs[1] != runs[2]


def test_chat_respects_max_new_tokens(ours):
    model, tokenizer = ours
    reply = chat(model, tokenizer, [{"role": "user", "content": QUESTIONS[1]}], max_new_tokens=5)
    assert len(tokenizer.encode(reply)) <= 5 + 1  # re-encoding may merge differently by one token at most
    assert chat(model, tokenizer, [{"role": "user", "content": QUESTIONS[1]}], max_new_tokens=0) == ""


# --- bad input ---------------------------------------------------------------------------------------------------

def test_bad_input_gets_one_line_errors(ours, tmp_path):
    model, tokenizer = ours
    cases = [
        (FileNotFoundError, "make weights", lambda: load_gguf(tmp_path / "missing.gguf")),
        (ValueError, "'gpt2'", lambda: load_gguf(write_tiny_gguf(tmp_path / "gpt2.gguf", architecture="gpt2"))),
        (ValueError, "BF16", lambda: load_gguf(write_tiny_gguf(tmp_path / "bf16.gguf", matrix_type="BF16"))),
        (ValueError, "'gpt-4o'", lambda: load_gguf(write_tiny_gguf(tmp_path / "pre.gguf", pre="gpt-4o"))),
        (ValueError, "empty", lambda: chat(model, tokenizer, [])),
        (ValueError, "'role'", lambda: chat(model, tokenizer, [{"content": "hi"}])),
        (ValueError, "context holds 8192", lambda: chat(model, tokenizer, [{"role": "user", "content": "word " * 9000}])),
        (ValueError, "max_new_tokens", lambda: chat(model, tokenizer, [{"role": "user", "content": "hi"}],
                                                    max_new_tokens=-1)),
        (ValueError, "tensor 'blk.7.attn_qq.weight'", lambda: our_name("blk.7.attn_qq.weight")),
    ]
    for error, words, call in cases:
        with pytest.raises(error) as caught:
            call()
        message = str(caught.value)
        assert words in message and "\n" not in message.strip(), message


def test_a_tiny_file_loads_and_chats(tmp_path):
    model, tokenizer = load_gguf(write_tiny_gguf(tmp_path / "tiny.gguf"))
    assert model.lm_head.weight is model.token_embeddings.weight
    untied, _ = load_gguf(write_tiny_gguf(tmp_path / "untied.gguf", tied=False))
    assert untied.lm_head.weight is not untied.token_embeddings.weight
    reply = chat(model, tokenizer, [{"role": "user", "content": "Hello"}], max_new_tokens=8)
    assert isinstance(reply, str)


# --- the chat box's Send, and chat on notebook 10's generate ----------------------------------------------------

def test_chat_turn_refuses_an_empty_question_and_keeps_the_history_when_the_answer_fails():
    from transformer_from_scratch.pretrained import chat_turn
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    before = [dict(m) for m in history]
    asked = []
    assert chat_turn(history, "   ", lambda messages: asked.append(messages) or "x") == "Type a question first."
    assert history == before and asked == []

    def too_long(messages):
        raise ValueError("chat: the prompt is 9000 tokens and the context holds 8192: leave out earlier messages")

    shown = chat_turn(history, "word " * 9000, too_long)
    assert shown.startswith("ValueError: chat: the prompt is 9000 tokens") and history == before
    assert chat_turn(history, " and you? ", lambda messages: asked.append(messages) or "fine") is None
    assert asked == [before + [{"role": "user", "content": "and you?"}]]
    assert history == before + [{"role": "user", "content": "and you?"}, {"role": "assistant", "content": "fine"}]


def test_chat_turn_with_chat_on_a_tiny_model(tmp_path):
    from transformer_from_scratch.pretrained import chat_turn
    model, tokenizer = load_gguf(write_tiny_gguf(tmp_path / "tiny.gguf"))
    history = []
    answer = lambda messages: chat(model, tokenizer, messages, max_new_tokens=4)
    assert "context holds 64" in chat_turn(history, "word " * 80, answer) and history == []
    assert chat_turn(history, "Hello", answer) is None and [m["role"] for m in history] == ["user", "assistant"]


def test_chat_decodes_with_generate(tmp_path, monkeypatch):
    """chat is a layer over notebook 10's generate: one decoding loop, with <|im_end|> as its eos_id and the reply's
    length cut where the context ends."""
    from transformer_from_scratch import pretrained
    model, tokenizer = load_gguf(write_tiny_gguf(tmp_path / "tiny.gguf"))
    calls = []
    real = pretrained.generate
    monkeypatch.setattr(pretrained, "generate", lambda *args, **kwargs: calls.append((args, kwargs)) or
                        real(*args, **kwargs))
    chat(model, tokenizer, [{"role": "user", "content": "Hello"}], max_new_tokens=10_000)
    (args, kwargs), = calls
    assert kwargs["eos_id"] == tokenizer.special_ids["<|im_end|>"]
    assert len(args[1]) + args[2] == model.context_length

"""The step checks of notebook 14 pass the right steps and name each planted mistake on their first line."""

import gguf
import pytest
import regex
import torch

from transformer_from_scratch import pretrained
from transformer_from_scratch.checks._fixtures import SMOLLM_PATTERN
from transformer_from_scratch.checks.steps.pretrained import (SMOLLM2_TEMPLATE, check_chat_prompt, check_dequantize_q4_1,
                                                              check_dequantize_q8_0, check_model_config, check_our_name,
                                                              check_tokenizer_from_gguf)
from transformer_from_scratch.tokenizer import GPT2_PATTERN, Tokenizer, bytes_to_unicode
from mutants import assert_own_verdict, assert_phrases_distinct, assert_random_state_kept, each_mistake_of

# --- the right steps: the course's (src/transformer_from_scratch/pretrained.py) ---------------------------------

model_config = pretrained.model_config
dequantize_q8_0 = pretrained.dequantize_q8_0
dequantize_q4_1 = pretrained.dequantize_q4_1
our_name = pretrained.our_name
tokenizer_from_gguf = pretrained.tokenizer_from_gguf
chat_prompt = pretrained.chat_prompt


def variant(fn, **knobs):
    return lambda *args: fn(*args, **knobs)


# --- model_config ------------------------------------------------------------------------------------------------

def config_with(**changes):
    def learners(metadata, tensor_names):
        config = model_config(metadata, tensor_names)
        swapped = {key: config[value] for key, value in changes.items() if isinstance(value, str) and value in config}
        config.update({key: value for key, value in changes.items() if key not in swapped}, **swapped)
        return {key: value for key, value in config.items() if value is not None}
    return learners


def _vocab_from_key(metadata, tensor_names):
    return {**model_config(metadata, tensor_names), "vocab_size": metadata["llama.vocab_size"]}


def _vocab_from_merges(metadata, tensor_names):
    return {**model_config(metadata, tensor_names), "vocab_size": len(metadata["tokenizer.ggml.merges"])}


def _tie_inverted(metadata, tensor_names):
    return {**model_config(metadata, tensor_names), "tie_embeddings": "output.weight" in tensor_names}


def _any_architecture(metadata, tensor_names):
    """Reads the keys of whatever architecture the file names."""
    p = metadata["general.architecture"] + "."
    return dict(vocab_size=len(metadata["tokenizer.ggml.tokens"]), context_length=metadata[p + "context_length"],
                d_model=metadata[p + "embedding_length"], num_layers=metadata[p + "block_count"],
                num_heads=metadata[p + "attention.head_count"], d_ff=metadata[p + "feed_forward_length"],
                rope_theta=metadata[p + "rope.freq_base"], num_kv_heads=metadata[p + "attention.head_count_kv"],
                norm_eps=metadata[p + "attention.layer_norm_rms_epsilon"],
                tie_embeddings="output.weight" not in tensor_names)


def _no_architecture_check(metadata, tensor_names):
    return model_config({**metadata, "general.architecture": "llama"}, tensor_names)  # then llama.* is missing


def _unnamed_error(metadata, tensor_names):
    if metadata["general.architecture"] != "llama":
        raise ValueError("unsupported architecture")
    return model_config(metadata, tensor_names)


def _smollm2(metadata, tensor_names):
    return dict(vocab_size=49152, context_length=8192, d_model=576, num_layers=30, num_heads=9, d_ff=1536,
                rope_theta=100000.0, num_kv_heads=3, norm_eps=9.999999747378752e-06,
                tie_embeddings="output.weight" not in tensor_names)


CONFIG_MUTANTS = [
    (config_with(num_heads="num_kv_heads", num_kv_heads="num_heads"), "num_heads and num_kv_heads are swapped"),
    (config_with(d_model="d_ff", d_ff="d_model"), "d_model and d_ff are swapped"),
    (_tie_inverted, "tie_embeddings is inverted"),
    (config_with(tie_embeddings=False), "tie_embeddings is False for a file without output.weight"),
    (config_with(tie_embeddings=True), "tie_embeddings is True for a file that has output.weight"),
    (_vocab_from_key, "from a key not every file has"),
    (_vocab_from_merges, "vocab_size is the number of merges"),
    (config_with(norm_eps=1e-5), "norm_eps is 1e-05, TransformerLM's default"),
    (config_with(rope_theta=10000.0), "rope_theta is 10000.0, TransformerLM's default"),
    (config_with(norm_eps=None), "has no norm_eps"),
    (config_with(fused=True), "not TransformerLM's keyword arguments"),
    (_any_architecture, "another architecture is accepted"),
    (_no_architecture_check, "'qwen2' raised KeyError"),
    (_unnamed_error, "without naming the architecture"),
    (_smollm2, "vocab_size is 49152, expected 300"),
    (lambda metadata, tensor_names: list(model_config(metadata, tensor_names).items()), "not a dict"),
]


# --- dequantize --------------------------------------------------------------------------------------------------

def _f16(b):
    return b.contiguous().view(torch.float16)


def q8_0(blocks, *, signed=True, scale="f16", rows="blocks", out_dtype=torch.float32, flatten=False):
    b = blocks.reshape(-1, blocks.shape[-1] if rows == "row" else 34)  # "row": the whole last axis as one block
    d, q = (b[:, 32:34], b[:, :32]) if scale == "end" else (b[:, :2], b[:, 2:])
    d = {"f16": lambda: _f16(d).float(), "end": lambda: _f16(d).float(), "half": lambda: _f16(d),
         "int": lambda: d.contiguous().view(torch.int16).float(), "swapped": lambda: _f16(d.flip(-1)).float()}[scale]()
    q = q.contiguous().view(torch.int8) if signed else q
    if rows == "first":
        d = d[:1]
    out = d * q.to(d.dtype)
    out = out if scale == "half" else out.to(out_dtype)
    return out.reshape(-1) if flatten else out.reshape(*blocks.shape[:-1], -1)


def q4_1(blocks, *, order="halves", minimum="add", scale="f16", offset=0, rows="blocks", out_dtype=torch.float32,
         flatten=False):
    b = blocks.reshape(-1, blocks.shape[-1]) if rows == "row" else blocks.reshape(-1, 20)
    read = {"f16": lambda x: _f16(x).float(), "int": lambda x: x.contiguous().view(torch.int16).float(),
            "swapped": lambda x: _f16(x.flip(-1)).float(), "half": _f16}[scale]
    d, m = read(b[:, 0:2]), read(b[:, 2:4])
    if minimum == "swapped":
        d, m = m, d
    if rows == "first":
        d, m = d[:1], m[:1]
    qs = b[:, 4:]
    lo, hi = qs & 15, qs >> 4
    q = {"halves": lambda: torch.cat([lo, hi], 1), "interleaved": lambda: torch.stack([lo, hi], -1).flatten(1),
         "high_first": lambda: torch.cat([hi, lo], 1), "unshifted": lambda: torch.cat([lo, qs & 0xF0], 1)
         }[order]().to(d.dtype) - offset
    out = {"add": lambda: d * q + m, "swapped": lambda: d * q + m, "forgot": lambda: d * q,
           "multiply": lambda: d * q * m}[minimum]()
    out = out if scale == "half" else out.to(out_dtype)
    return out.reshape(-1) if flatten else out.reshape(*blocks.shape[:-1], -1)


Q8_0_MUTANTS = [
    (variant(q8_0, signed=False), "q is read as unsigned"),
    (variant(q8_0, scale="int"), "the scale is read as an integer"),
    (variant(q8_0, scale="swapped"), "two bytes are read in the wrong order"),
    (variant(q8_0, scale="end"), "the scale is read from the end of the block"),
    (variant(q8_0, rows="first"), "every block uses the first block's scale"),
    (variant(q8_0, rows="row"), "reads a whole row as one block"),
    (variant(q8_0, flatten=True), "the rows are lost"),
    (variant(q8_0, scale="half"), "returned float16"),
    (variant(q8_0, out_dtype=torch.float64), "returned torch.float64, expected torch.float32"),
]
Q4_1_MUTANTS = [
    (variant(q4_1, order="interleaved"), "the nibbles are interleaved"),
    (variant(q4_1, order="high_first"), "the high and low nibbles are swapped"),
    (variant(q4_1, order="unshifted"), "the high nibbles are masked but not shifted"),
    (variant(q4_1, minimum="forgot"), "the minimum m is forgotten"),
    (variant(q4_1, minimum="multiply"), "the minimum m is multiplied in"),
    (variant(q4_1, minimum="swapped"), "the scale d and the minimum m are swapped"),
    (variant(q4_1, offset=8), "q is shifted by 8"),
    (variant(q4_1, scale="int"), "the scale is read as an integer"),
    (variant(q4_1, scale="swapped"), "two bytes are read in the wrong order"),
    (variant(q4_1, rows="first"), "every block uses the first block's scale and minimum"),
    (variant(q4_1, rows="row"), "reads a whole row as one block"),
    (variant(q4_1, flatten=True), "the rows are lost"),
    (variant(q4_1, scale="half"), "returned float16"),
    (variant(q4_1, out_dtype=torch.float64), "returned torch.float64, expected torch.float32"),
]


# --- our_name ----------------------------------------------------------------------------------------------------

BLOCK = {"attn_norm": "ln1", "attn_q": "attn.q_proj", "attn_k": "attn.k_proj", "attn_v": "attn.v_proj",
         "attn_output": "attn.output_proj", "ffn_norm": "ln2", "ffn_gate": "ffn.w1", "ffn_up": "ffn.w3",
         "ffn_down": "ffn.w2"}
TOP = {"token_embd": "token_embeddings", "output_norm": "ln_final", "output": "lm_head"}


def learners_our_name(name, *, block=None, number=r"\d+", pick=None, suffix=".weight", unknown="raise"):
    table = {**BLOCK, **(block or {})}
    if m := regex.fullmatch(rf"blk\.({number})\.(\w+)\.weight", name):
        if m[2] in table:
            return f"layers.{pick(m[1]) if pick else m[1]}.{table[m[2]]}{suffix}"
    elif m := regex.fullmatch(r"(\w+)\.weight", name):
        if m[1] in TOP:
            return f"{TOP[m[1]]}{suffix}"
    if unknown == "pass":
        return name
    if unknown == "key":
        raise KeyError(name)
    if unknown == "unnamed":
        raise ValueError("unknown tensor")
    raise ValueError(f"no TransformerLM weight for {name!r}")


def one_digit_our_name(name):
    """A learner's draft that reads the block number as the one character after "blk.": blk.12.attn_norm looks up
    the part ".attn_norm" and raises KeyError."""
    if name.startswith("blk."):
        return f"layers.{name[4]}.{BLOCK[name[6:-len('.weight')]]}.weight"
    return learners_our_name(name)


NAME_MUTANTS = [
    (one_digit_our_name, "the block number is read as one digit"),
    (variant(learners_our_name, block={"ffn_gate": "ffn.w3", "ffn_up": "ffn.w1"}), "ffn_gate and ffn_up are swapped"),
    (variant(learners_our_name, block={"ffn_down": "ffn.w3", "ffn_up": "ffn.w2"}), "ffn_down is named"),
    (variant(learners_our_name, block={"attn_norm": "ln2", "ffn_norm": "ln1"}), "attn_norm and ffn_norm are swapped"),
    (variant(learners_our_name, number=r"\d"), "refuses a block number above 9"),
    (variant(learners_our_name, pick=lambda n: n[0]), "the block number is cut, lost or fixed"),
    (variant(learners_our_name, pick=lambda n: "0"), "the block number is cut, lost or fixed"),
    (variant(learners_our_name, suffix=""), "'.weight' is lost"),
    (variant(learners_our_name, block={"attn_k": "attn.v_proj", "attn_v": "attn.k_proj"}),
     "not the name in TransformerLM's state dict"),
    (variant(learners_our_name, unknown="pass"), "an unknown name passes through"),
    (variant(learners_our_name, unknown="unnamed"), "raised ValueError without naming the tensor"),
    (variant(learners_our_name, unknown="key"), "raised KeyError ('blk.3.attn_qkv.weight'), not ValueError"),
]


# --- tokenizer_from_gguf ------------------------------------------------------------------------------------------

PATTERNS = {"smollm": SMOLLM_PATTERN, "gpt-2": GPT2_PATTERN}


def learners_tokenizer(metadata, *, tokens="bytes", control="utf8", special=True, merges="split", ids="file",
                       pattern=True, template=True):
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    as_bytes = {"bytes": lambda t: bytes(byte_of[c] for c in t), "utf8": lambda t: t.encode("utf-8")}[tokens]
    through_map = {"utf8": lambda t: t.encode("utf-8"), "map": as_bytes,
                   "latin1": lambda t: bytes(byte_of.get(c, ord(c)) for c in t)}[control]
    names, types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
    pairs = [(t, k) for t, k in zip(names, types)]
    if ids == "controls last":
        pairs = [p for p in pairs if p[1] != 3] + [p for p in pairs if p[1] == 3]
    vocab = {i: through_map(t) if k == 3 else as_bytes(t) for i, (t, k) in enumerate(pairs)}
    split = {"split": lambda line: tuple(as_bytes(p) for p in line.split(" ")),
             "first char": lambda line: (as_bytes(line[0]), as_bytes(line[1:].replace(" ", ""))),
             "chars": lambda line: tuple(p.encode("utf-8") for p in line.split(" ")),
             "str": lambda line: tuple(line.split(" "))}[merges]
    tokenizer = Tokenizer(vocab, [split(line) for line in metadata["tokenizer.ggml.merges"]],
                          [t for t, k in pairs if k == 3] if special else None,
                          **({"pattern": PATTERNS[metadata["tokenizer.ggml.pre"]]} if pattern else {}))
    if template:
        tokenizer.chat_template = metadata.get("tokenizer.chat_template")
    return tokenizer


TOKENIZER_MUTANTS = [
    (variant(learners_tokenizer, tokens="utf8", merges="chars"), "the tokens are kept as their GPT-2 characters"),
    (variant(learners_tokenizer, control="map"), "the control tokens go through the byte map: '<|tool call|>'"),
    (variant(learners_tokenizer, control="latin1"), "the control tokens go through the byte map: '<|café|>'"),
    (variant(learners_tokenizer, special=False), "the control tokens are not special"),
    (variant(learners_tokenizer, merges="first char"), "the merges are split at the wrong place"),
    (variant(learners_tokenizer, merges="chars"), "the merges are kept as their GPT-2 characters"),
    (variant(learners_tokenizer, merges="str"), "the merges are str"),
    (variant(learners_tokenizer, ids="controls last"), "the ids are renumbered"),
    (variant(learners_tokenizer, pattern=False), "the pre-tokenizer is GPT-2's"),
    (variant(learners_tokenizer, template=False), "does not keep the file's chat template"),
]


# --- chat_prompt --------------------------------------------------------------------------------------------------

def learners_prompt(messages, system=None, *, end="<|im_end|>\n", tail="<|im_start|>assistant\n", when="first",
                    none="skip", swap=False, guard=True, role_end="\n"):
    if guard and not messages:
        raise ValueError("no messages")
    if system is not None and when == "insert" and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system})  # the caller's list
    elif system is not None and (when == "always" or messages[0]["role"] != "system"):
        added = {"role": "system", "content": system}
        messages = [*messages, added] if when == "last" else [added, *messages]
    elif system is None and none == "add" and messages:
        messages = [{"role": "system", "content": str(system)}, *messages]
    turns = [(m["content"], m["role"]) if swap else (m["role"], m["content"]) for m in messages]
    return "".join(f"<|im_start|>{a}{role_end}{b}{end}" for a, b in turns) + tail


def _index_error(messages, system=None):
    if messages[0]["role"] != "system" and system is not None:  # IndexError for []
        messages = [{"role": "system", "content": system}, *messages]
    return learners_prompt(messages, None)


PROMPT_MUTANTS = [
    (variant(learners_prompt, end="<|im_end|>"), "no newline after <|im_end|>"),
    (variant(learners_prompt, tail=""), "does not end with <|im_start|>assistant"),
    (variant(learners_prompt, tail="<|im_start|>assistant"), "ends with <|im_start|>assistant without its newline"),
    (variant(learners_prompt, when="always"), "added even when the messages start with one"),
    (variant(learners_prompt, none="add"), "added when system is None"),
    (variant(learners_prompt, swap=True), "the role and the content are swapped"),
    (variant(learners_prompt, guard=False), "an empty conversation is accepted"),
    (_index_error, "raised IndexError (list index out of range), not ValueError"),
    (variant(learners_prompt, role_end=""), "no newline between a message's role and its content"),
    (variant(learners_prompt, end="<|endoftext|>\n"), "end with <|endoftext|>, not <|im_end|>"),
    (variant(learners_prompt, when="last"), "the system message comes last"),
    (variant(learners_prompt, when="insert"),
     "changed the caller's messages (1 went in, 2 came out, ['system', 'user'])"),

    (lambda messages, system=None: learners_prompt(messages, system).encode(), "not a str"),
]

def test_a_prompt_unlike_any_named_mistake_shows_where_it_parts_from_the_template():
    """Both strings from just before their first difference: a verdict that cut them both at the same place would
    show the learner two identical texts."""
    with pytest.raises(AssertionError) as error:
        check_chat_prompt(variant(learners_prompt, tail="<|im_start|>assistant\n\n"))
    first, evidence = str(error.value).splitlines()
    assert "is not the template's prompt" in first
    assert evidence.startswith("they part at character "), evidence
    yours, template = evidence.split(": yours has ")[1].split(", the template ")
    assert yours.endswith("<|im_start|>assistant\\n\\n' (its end)"), evidence
    assert template.endswith("<|im_start|>assistant\\n' (its end)"), evidence


def test_an_unnamed_dequantization_mistake_shows_the_first_wrong_weight():
    """Weights 16 to 31 of each block wrong (here: the high nibbles doubled): the evidence starts at weight 16, where
    yours and the expected weights differ, not at weight 0, where they agree."""
    def doubled_high(blocks):
        out = q4_1(blocks).clone()
        out.view(-1, 32)[:, 16:] *= 2
        return out

    with pytest.raises(AssertionError) as error:
        check_dequantize_q4_1(doubled_high)
    first, evidence = str(error.value).splitlines()
    assert "differs from llama.cpp's dequantization" in first
    assert evidence.startswith("the first wrong weight is weight 16 of block 0: from there, yours ["), evidence
    yours, expected = ([float(v) for v in listed.split(", ")] for listed in regex.findall(r"\[([^\]]*)\]", evidence))
    assert len(yours) == len(expected) == 4 and yours != expected, evidence
    assert all(abs(a - 2 * b) < 1e-3 for a, b in zip(yours, expected)), evidence


RIGHT = [(check_model_config, model_config), (check_dequantize_q8_0, dequantize_q8_0),
         (check_dequantize_q4_1, dequantize_q4_1), (check_our_name, our_name),
         (check_tokenizer_from_gguf, tokenizer_from_gguf), (check_chat_prompt, chat_prompt)]
ALL = [(check_model_config, CONFIG_MUTANTS), (check_dequantize_q8_0, Q8_0_MUTANTS),
       (check_dequantize_q4_1, Q4_1_MUTANTS), (check_our_name, NAME_MUTANTS),
       (check_tokenizer_from_gguf, TOKENIZER_MUTANTS), (check_chat_prompt, PROMPT_MUTANTS)]


def test_the_right_steps_pass_with_one_line(capsys):
    for check, step in RIGHT:
        check(step)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * len(RIGHT), lines
    assert not any("b'" in line or "[" in line for line in lines), lines  # what was checked, never the answer


def test_the_learners_versions_written_here_are_right():
    """The knobbed versions above, with no knob turned, pass too: each mutant is one mistake away from right."""
    for check, step in [(check_dequantize_q8_0, q8_0), (check_dequantize_q4_1, q4_1),
                        (check_our_name, learners_our_name), (check_tokenizer_from_gguf, learners_tokenizer),
                        (check_chat_prompt, learners_prompt)]:
        check(step)


@each_mistake_of(ALL)
def test_each_mistake_is_named(check, mutant, phrase):
    """Two ways to make one mistake (a block number cut or fixed) share its phrase; every other is the mutant's."""
    mutants = next(m for c, m in ALL if c is check)
    assert_own_verdict(check, mutant, phrase, [(m, p) for m, p in mutants if p != phrase])


def test_the_phrases_are_distinct():
    for _, mutants in ALL:
        assert_phrases_distinct(list({phrase: (mutant, phrase) for mutant, phrase in mutants}.values()))


def test_the_checks_keep_the_random_state():
    for check, step in RIGHT:
        assert_random_state_kept(check, step)


def test_the_template_is_the_files():
    """The check's copy of SmolLM2's chat template is the file's (skipped without `make weights`)."""
    import pytest

    from transformer_from_scratch.weights import gguf_path
    try:
        path = gguf_path()
    except FileNotFoundError:
        pytest.skip("no SmolLM2 file: run `make weights`")
    metadata = pretrained.read_metadata(gguf.GGUFReader(path))
    assert metadata["tokenizer.chat_template"] == SMOLLM2_TEMPLATE
    assert metadata["tokenizer.ggml.pre"] == "smollm"


def test_the_checks_pattern_is_the_courses():
    assert pretrained.SMOLLM_PATTERN == SMOLLM_PATTERN and pretrained.PATTERNS["gpt-2"] == GPT2_PATTERN

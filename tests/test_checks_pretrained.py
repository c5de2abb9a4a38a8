"""check_load_gguf and check_chat pass the course's load_gguf and chat and name each classic mistake, planted here as a
small change of a learner's version built from notebook 14's steps; the tiny GGUF file they use is SmolLM2's format."""

import codecs
import os

import gguf
import numpy as np
import pytest
import torch

from transformer_from_scratch import pretrained
from transformer_from_scratch.checks import check_chat, check_load_gguf
from transformer_from_scratch.checks._tiny_gguf import SIZES, write_tiny_gguf
from transformer_from_scratch.checks.steps import pretrained as steps
from transformer_from_scratch.kv_cache import KVCache
from transformer_from_scratch.rope import RotaryPositionalEmbedding
from transformer_from_scratch.transformer_lm import TransformerLM, next_token_distribution
from mutants import assert_own_verdict, assert_phrases_distinct, assert_random_state_kept


# --- the tiny file ------------------------------------------------------------------------------------------------

def test_the_tiny_file_reads_like_smollm2(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    reader = gguf.GGUFReader(path)
    metadata = pretrained.read_metadata(reader)
    kinds = {t.name: t.tensor_type.name for t in reader.tensors}
    assert kinds["token_embd.weight"] == "Q8_0" and kinds["blk.1.ffn_gate.weight"] == "Q4_1"
    assert kinds["output_norm.weight"] == "F32" and "output.weight" not in kinds
    assert metadata["tokenizer.ggml.pre"] == "smollm" and metadata["tokenizer.ggml.token_type"][:3] == [3, 3, 3]
    config = pretrained.model_config(metadata, list(kinds))
    assert {k: config[k] for k in SIZES} == SIZES and config["tie_embeddings"]
    assert os.path.getsize(path) < 200_000


def test_the_tiny_file_has_its_bad_variants(tmp_path):
    untied = gguf.GGUFReader(write_tiny_gguf(tmp_path / "untied.gguf", tied=False))
    assert "output.weight" in [t.name for t in untied.tensors]
    with pytest.raises(ValueError, match="qwen2"):
        pretrained.load_gguf(write_tiny_gguf(tmp_path / "qwen2.gguf", architecture="qwen2"))
    with pytest.raises(ValueError, match="BF16"):
        pretrained.load_gguf(write_tiny_gguf(tmp_path / "bf16.gguf", matrix_type="BF16"))


# --- load_gguf: a learner's, from the steps -------------------------------------------------------------------------

def learners_load_gguf(path, *, device=None, dtype=None, exists=True, layout="reversed", tie="tie", rope=True,
                       config=None, pattern=True, cast=True, move=True, pair=True, bf16="refuse", dequant=None):
    if exists and not os.path.exists(path):
        raise FileNotFoundError(f"no GGUF file at {path}: run `make weights`")
    reader = gguf.GGUFReader(path)
    metadata = pretrained.read_metadata(reader)
    if config == "any architecture":
        metadata = {**metadata, "general.architecture": "llama"}
    cfg = pretrained.model_config(metadata, [t.name for t in reader.tensors])
    cfg.update(config if isinstance(config, dict) else {})
    tokenizer = pretrained.tokenizer_from_gguf(metadata) if pattern else \
        pretrained.Tokenizer(pretrained.tokenizer_from_gguf(metadata).vocab,
                             pretrained.tokenizer_from_gguf(metadata).merges,
                             pretrained.tokenizer_from_gguf(metadata).special_tokens)
    state = {}
    for t in reader.tensors:
        data = torch.from_numpy(np.array(t.data))
        kind = t.tensor_type.name
        if dequant is not None and kind == dequant[0]:
            data = steps.DEQUANTIZERS[kind][0](data, dequant[1])
        elif kind in pretrained.DEQUANTIZE:
            data = pretrained.DEQUANTIZE[kind](data)
        elif kind == "BF16" and bf16 == "as F16":
            data = data.view(torch.float16)  # two float16 numbers per weight
        elif kind not in ("F32", "F16") and bf16 == "refuse":
            raise ValueError(f"tensor {t.name!r} is {kind}: only F32, F16, Q8_0, Q4_1")
        shape = [int(n) for n in t.shape]
        data = data.float()
        if layout == "transposed" and len(shape) == 2:
            data = data.reshape(shape).T
        else:
            data = data.reshape(*reversed(shape))
        state[pretrained.our_name(t.name)] = data
    tied = cfg["tie_embeddings"]
    if tie == "copy" and tied:
        cfg["tie_embeddings"] = False
        state["lm_head.weight"] = state["token_embeddings.weight"].clone()
    elif tie == "none" and tied:
        cfg["tie_embeddings"] = False
    elif tie == "missing":
        pass  # the model is tied, the state dict has no lm_head.weight
    elif tied:
        state["lm_head.weight"] = state["token_embeddings.weight"]
    if tie == "none":
        model = TransformerLM(**cfg)
        model.load_state_dict(state, strict=False)
    else:
        with torch.device("meta"):
            model = TransformerLM(**cfg)
        model.load_state_dict(state, assign=True)
    if rope == "per layer":
        for layer in model.layers:
            layer.attn.rope = RotaryPositionalEmbedding(cfg["rope_theta"], cfg["d_model"] // cfg["num_heads"],
                                                        cfg["context_length"])
    elif rope and tie != "none":
        shared = model.layers[0].attn.rope
        fresh = RotaryPositionalEmbedding(shared.theta, shared.d_k, shared.max_seq_len)
        shared.cos_table, shared.sin_table = fresh.cos_table, fresh.sin_table
    model = model.to(device=device if move else None, dtype=dtype if cast else None).eval()
    return (model, tokenizer) if pair else model


def loader(**knobs):
    return lambda path, *, device=None, dtype=None: learners_load_gguf(path, device=device, dtype=dtype, **knobs)


def _own_theta(path, *, device=None, dtype=None):
    """rope_theta left at the default 10000, the RoPE tables computed with it too."""
    return learners_load_gguf(path, device=device, dtype=dtype, config=dict(rope_theta=10000.0))


LOAD_MUTANTS = [
    (loader(pair=False), "not the pair (model, tokenizer)"),
    (loader(layout="transposed"), "holds the file's numbers transposed"),
    (loader(tie="none"), "lm_head.weight is not the embedding matrix"),
    (loader(tie="copy"), "a copy of the embedding matrix"),
    (loader(rope=False), "(RoPE's table) is still on the meta device"),
    (loader(config=dict(norm_eps=1e-5)), "uses norm_eps = 1e-05"),
    (_own_theta, "uses rope_theta = 10000.0"),
    (loader(pattern=False), "other ids than the file's tokenizer"),
    (loader(cast=False), "load_gguf(path, dtype=torch.float64) gives"),
    (loader(move=False), "load_gguf(path, device='meta') leaves"),
    (loader(exists=False), "without saying how to get the file"),
    (loader(config="any architecture"), "(a file whose architecture is qwen2) raised KeyError"),
    (loader(bf16="as they are"), "BF16) raised RuntimeError"),  # its bytes reshaped as if they were weights
    (loader(config=dict(num_kv_heads=None)), "grouped-query attention is ignored"),
    (loader(tie="missing"), "the state dict has no lm_head.weight"),
    (loader(rope="per layer"), "RoPE modules, one each"),
    (loader(dequant=("Q8_0", "scale_bf16")), "a Q8_0 tensor, is dequantized wrong: the scale is read as bfloat16"),
    (loader(dequant=("Q4_1", "scale_fp32")), "a Q4_1 tensor, is dequantized wrong: the scale is read as a float32"),
    (loader(dequant=("Q4_1", "row_scale")), "each row uses one scale and minimum"),
    (loader(dequant=("Q8_0", "row_scale")), "each row uses one scale, its first block's"),
    (loader(dequant=("Q8_0", "divided")), "a Q8_0 tensor, is dequantized wrong: the weights are q / d"),
    (loader(dequant=("Q4_1", "min_subtracted")), "the minimum m is subtracted, not added"),
]


def _accepts_any_architecture(path, *, device=None, dtype=None):
    if not os.path.exists(path):
        raise FileNotFoundError(f"no GGUF file at {path}: run `make weights`")
    reader = gguf.GGUFReader(path)
    if reader.fields["general.architecture"].contents() != "llama":
        return learners_load_gguf(write_tiny_gguf(os.path.join(os.path.dirname(path), "x.gguf")))
    return learners_load_gguf(path, device=device, dtype=dtype)


def _unnamed_architecture(path, *, device=None, dtype=None):
    try:
        return learners_load_gguf(path, device=device, dtype=dtype)
    except ValueError as error:
        if "qwen2" in str(error):
            raise ValueError("cannot read this file") from error
        raise


LOAD_MUTANTS += [
    (_accepts_any_architecture, "another architecture is accepted"),
    (_unnamed_architecture, "without naming the architecture"),
    (loader(bf16="as F16"), "loads the BF16 tensors as something else"),
]


# --- chat: a learner's, from the course's -------------------------------------------------------------------------

@torch.no_grad()
def learners_chat(model, tokenizer, messages, *, max_new_tokens=256, temperature=0.0, top_k=None, top_p=None,
                  seed=None, on_token=None, system=True, generation=True, keep_end=False, stop=True, extra=0,
                  limit=True, pieces="incremental", use_seed=True, sample=True, guard=True, filters=True,
                  context=True, feed="new", loop="budget", joined=False):
    if not messages and not guard:
        return ""
    default = pretrained.default_system(tokenizer.chat_template) if system else None
    prompt_text = pretrained.chat_prompt(messages, default)
    if not generation:
        prompt_text = prompt_text.removesuffix("<|im_start|>assistant\n")
    prompt = tokenizer.encode(prompt_text)
    end = tokenizer.special_ids["<|im_end|>"]
    generator = torch.Generator().manual_seed(seed) if seed is not None and use_seed else None
    budget = max_new_tokens + extra if limit else 20
    length = len(prompt) + budget if not context else \
        min(model.context_length - (context == "one short"), len(prompt) + budget)
    cache = [KVCache(1, b.attn.num_kv_heads, length, b.attn.d_k) for b in model.layers]
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    ids, reply, text = torch.tensor([prompt]), [], ""
    steps = model.context_length - len(prompt) if loop == "context" else length - len(prompt)
    for _ in range(steps):
        logits = model(ids, cache=None if feed == "all, no cache" else cache)[0, -1].float()
        if temperature == 0 or not sample:
            next_id = int(logits.argmax())
        else:
            kept = (top_k, top_p) if filters else (None, None)
            next_id = int(torch.multinomial(next_token_distribution(logits, temperature, *kept), 1,
                                            generator=generator))
        if next_id == end and stop:
            if keep_end:
                reply.append(next_id)
            break
        reply.append(next_id)
        if on_token is not None:
            piece = {"incremental": lambda: utf8.decode(tokenizer.vocab[next_id]),
                     "each": lambda: tokenizer.decode([next_id]),
                     "stripped": lambda: utf8.decode(tokenizer.vocab[next_id]).strip()}[pieces]()
            if piece:
                on_token(piece)
        ids = torch.tensor([[next_id]]) if feed == "new" else torch.tensor([prompt + reply])
    if joined:  # the reply is the tokens decoded one by one
        return "".join(tokenizer.decode([i]) for i in reply)
    return tokenizer.decode(reply)


def chatter(**knobs):
    return lambda model, tokenizer, messages, **kwargs: learners_chat(model, tokenizer, messages, **kwargs, **knobs)


CHAT_MUTANTS = [
    (chatter(system=False), "the prompt has no system message"),
    (chatter(generation=False), "the prompt does not end with <|im_start|>assistant"),
    (chatter(keep_end=True), "the reply includes <|im_end|>"),
    (chatter(stop=False), "it does not stop at <|im_end|>"),
    (chatter(extra=1), "one token more than max_new_tokens"),
    (chatter(extra=-1), "one token fewer than max_new_tokens"),
    (chatter(limit=False), "max_new_tokens is not respected"),
    (chatter(pieces="each"), "on_token receives part of a character"),
    (chatter(pieces="stripped"), "on_token's pieces do not join to the reply"),
    (chatter(joined=True), "the reply is decoded token by token"),
    (chatter(use_seed=False), "the seed is not used"),
    (chatter(sample=False), "temperature is ignored"),
    (chatter(guard=False), "an empty conversation is not refused"),
    (chatter(filters=False), "top_k is ignored"),
    (chatter(context=False), "the reply runs past the end of the context"),
    (chatter(context="one short"), "not the 35 tokens that fill the context"),
    (chatter(feed="all, no cache"), "runs the model without a cache"),
    (chatter(feed="all"), "ids at step 2, the whole text again"),
    (chatter(loop="context"), "the loop runs past the positions its cache holds"),
    (lambda model, tokenizer, messages, **kwargs: list(learners_chat(model, tokenizer, messages, **kwargs)),
     "not a str"),
]


# --- the tests ----------------------------------------------------------------------------------------------------

def test_the_right_functions_pass_with_one_line(capsys):
    for check, right in [(check_load_gguf, pretrained.load_gguf), (check_chat, pretrained.chat),
                         (check_load_gguf, loader()), (check_chat, chatter())]:
        check(right)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * 4, lines


ALL = [(check_load_gguf, LOAD_MUTANTS), (check_chat, CHAT_MUTANTS)]


@pytest.mark.parametrize("check, mutant, phrase", [(c, m, p) for c, ms in ALL for m, p in ms],
                         ids=[f"{c.__name__}: {p}" for c, ms in ALL for _, p in ms])
def test_each_mistake_is_named(check, mutant, phrase):
    mutants = next(m for c, m in ALL if c is check)
    assert_own_verdict(check, mutant, phrase, mutants)


def test_the_phrases_are_distinct():
    for _, mutants in ALL:
        assert_phrases_distinct(mutants)


def test_the_checks_keep_the_random_state():
    assert_random_state_kept(check_load_gguf, pretrained.load_gguf)
    assert_random_state_kept(check_chat, pretrained.chat)


def test_a_chat_that_seeds_torch_itself_keeps_the_callers_random_state():
    def seeds_globally(model, tokenizer, messages, *, seed=None, **kwargs):
        if seed is not None:
            torch.manual_seed(seed)
        return learners_chat(model, tokenizer, messages, use_seed=False, **kwargs)

    assert_random_state_kept(check_chat, seeds_globally)


# --- the steps that assemble the model (5 to 7), and the dequantizers' further mistakes ----------------------------

def _state_dict_from(mode="right"):
    def state_dict_from(tensors):
        out = {}
        for t in tensors:
            values = pretrained.tensor_of(t)
            if mode == "ggml shape" and values.dim() == 2:
                values = values.reshape(values.shape[::-1])
            out[t.name if mode == "gguf names" else pretrained.our_name(t.name)] = values
        if mode == "tied here":
            out["lm_head.weight"] = out["token_embeddings.weight"]
        if mode == "one lost":
            out.pop("ln_final.weight")
        return out
    return state_dict_from


def _with_tied_head(mode="right"):
    def with_tied_head(state, tied):
        state = dict(state)
        if mode == "copy" and tied:
            state["lm_head.weight"] = state["token_embeddings.weight"].clone()
        elif mode == "always":
            state["lm_head.weight"] = state["token_embeddings.weight"]
        elif mode != "never" and tied:
            state["lm_head.weight"] = state["token_embeddings.weight"]
        return state
    return with_tied_head


def _model_from_state(mode="right"):
    def model_from_state(config, state):
        config = dict(config)
        if mode == "no gqa":
            config.pop("num_kv_heads")
        if mode == "default eps":
            config.pop("norm_eps")
        if mode == "untied":
            config["tie_embeddings"] = False
        if mode == "random start":
            model = TransformerLM(**config)
            model.load_state_dict(state)
            return model
        with torch.device("meta"):
            model = TransformerLM(**config)
        model.load_state_dict(state, assign=mode != "no assign")
        if mode == "no rope":
            return model
        for layer in model.layers if mode == "per layer" else model.layers[:1]:
            rope = layer.attn.rope if mode != "per layer" else RotaryPositionalEmbedding(
                config["rope_theta"], config["d_model"] // config["num_heads"], config["context_length"])
            fresh = RotaryPositionalEmbedding(rope.theta, rope.d_k, rope.max_seq_len)
            rope.cos_table, rope.sin_table = fresh.cos_table, fresh.sin_table
            layer.attn.rope = rope
        return model
    return model_from_state


STEP_MUTANTS = [
    (steps.check_state_dict_from, [
        (_state_dict_from("gguf names"), "keeps GGUF's names"),
        (_state_dict_from("ggml shape"), "has ggml's shape"),
        (_state_dict_from("tied here"), "holds lm_head.weight, though the file has no output.weight"),
        (_state_dict_from("one lost"), "has no ln_final.weight"),
    ]),
    (steps.check_with_tied_head, [
        (_with_tied_head("never"), "has no lm_head.weight"),
        (_with_tied_head("copy"), "gives lm_head.weight a copy of the embedding matrix"),
        (_with_tied_head("always"), "replaces the file's output layer with the embedding matrix"),
    ]),
    (steps.check_model_from_state, [
        (_model_from_state("no gqa"), "grouped-query attention is ignored"),
        (_model_from_state("default eps"), "the norms use eps = 1e-05"),
        (_model_from_state("untied"), "lm_head and the embedding are two matrices"),
        (_model_from_state("random start"), "the parameters are copies of the state dict's tensors"),
        (_model_from_state("no assign"), "a meta tensor has no memory to copy into"),
        (_model_from_state("no rope"), "(RoPE's table) is still on the meta device"),
        (_model_from_state("per layer"), "RoPE modules, one each"),
    ]),
]


def test_the_assembly_steps_pass_the_course_and_the_guided_versions(capsys):
    for check, right in [(steps.check_state_dict_from, pretrained.state_dict_from),
                         (steps.check_state_dict_from, _state_dict_from()),
                         (steps.check_with_tied_head, pretrained.with_tied_head),
                         (steps.check_with_tied_head, _with_tied_head()),
                         (steps.check_model_from_state, pretrained.model_from_state),
                         (steps.check_model_from_state, _model_from_state())]:
        check(right)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * 6, lines


@pytest.mark.parametrize("check, mutant, phrase", [(c, m, p) for c, ms in STEP_MUTANTS for m, p in ms],
                         ids=[f"{c.__name__}: {p}" for c, ms in STEP_MUTANTS for _, p in ms])
def test_each_assembly_mistake_is_named(check, mutant, phrase):
    assert_own_verdict(check, mutant, phrase, next(m for c, m in STEP_MUTANTS if c is check))


NEW_DEQUANT_MISTAKES = [(kind, mistake) for kind in ("Q8_0", "Q4_1")
                        for mistake in ("row_scale", "scale_bf16", "scale_fp32", "divided", "min_subtracted")
                        if mistake in steps.DEQUANTIZERS[kind][1]]


@pytest.mark.parametrize("kind, mistake", NEW_DEQUANT_MISTAKES, ids=[f"{k}: {m}" for k, m in NEW_DEQUANT_MISTAKES])
def test_the_dequantizers_step_checks_name_the_new_mistakes(kind, mistake):
    variant, mistakes = steps.DEQUANTIZERS[kind]
    check = steps.check_dequantize_q8_0 if kind == "Q8_0" else steps.check_dequantize_q4_1
    with pytest.raises(AssertionError) as error:
        check(lambda blocks: variant(blocks, mistake))
    assert str(error.value).startswith(mistakes[mistake][0]), str(error.value).splitlines()[0]


# --- files that are not GGUF, or cut short -------------------------------------------------------------------------

def test_a_file_that_is_not_gguf_is_named_in_one_line(tmp_path):
    path = tmp_path / "weights.gguf"
    path.write_bytes(b"PK\x03\x04 a zip archive, say")
    with pytest.raises(ValueError) as error:
        pretrained.load_gguf(path)
    message = str(error.value)
    assert "\n" not in message and str(path) in message and "is not a GGUF file" in message and "PK" in message


def test_a_truncated_file_names_the_tensor_that_runs_past_its_end(tmp_path):
    whole = write_tiny_gguf(tmp_path / "whole.gguf")
    reader = gguf.GGUFReader(whole)
    last = max(reader.tensors, key=lambda t: t.data_offset)
    data = open(whole, "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:last.data_offset + 10])
    with pytest.raises(ValueError) as error:
        pretrained.load_gguf(cut)
    message = str(error.value)
    assert "\n" not in message and str(cut) in message and "is truncated" in message
    assert f"tensor {last.name} needs {last.n_bytes} bytes" in message and "the file holds 10 of them" in message
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(data[:40])
    with pytest.raises(ValueError, match="truncated or damaged"):
        pretrained.load_gguf(header_only)


TIMES_SMALLER = [(8, "counts 4 bits a weight"), (1 / 6.4, "upside down"), (5.47, "the whole file's ratio"),
                 (3.2, "compares with float16's 16 bits"), (7, "not float32's bits over Q4_1's"),
                 ("6.4", "not a number")]


@pytest.mark.parametrize("value, phrase", TIMES_SMALLER, ids=[p for _, p in TIMES_SMALLER])
def test_times_smaller_names_each_mistake(value, phrase, capsys):
    steps.check_times_smaller(6.4)
    assert capsys.readouterr().out.startswith("✓ times_smaller")
    assert_own_verdict(steps.check_times_smaller, value, phrase, [(v, p) for v, p in TIMES_SMALLER if v is not value])

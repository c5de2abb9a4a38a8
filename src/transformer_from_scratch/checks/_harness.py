"""What every learner check shares: calling the learner's code safely, failing with a diagnosis, passing
with one line.

The contract (see ``checks/__init__.py``): a check returns ``None`` and prints one line when the learner's
component is right; when it is wrong it raises ``AssertionError`` whose *first line* names the most likely
mistake and how to fix it. Later lines may add evidence (expected and actual numbers).
"""

from __future__ import annotations

import inspect
import re
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, Sequence

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

STUB_FIX = "replace the `raise NotImplementedError(...)` line under '# YOUR CODE HERE' with your code, run that cell, then this one"


def fail(mistake: str, fix: str, evidence: str = "") -> NoReturn:
    """Raise the check's verdict: first line "<mistake>: <fix>", then the evidence, if any."""
    message = f"{mistake.rstrip('.')}: {fix.rstrip('.')}."
    raise AssertionError(message + (f"\n{evidence}" if evidence else ""))


def call(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, turning a stub or a crash into a verdict that names ``what`` was called.

    A ``NotImplementedError`` means the learner has not written that part yet. Any other exception is
    reported with its type and first line; the original is chained, so its traceback stays visible.
    """
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as error:
        fail(*_stub_verdict(what, error))
    except AssertionError:
        raise
    except Exception as error:  # noqa: BLE001 - any crash of the learner's code becomes a verdict
        first = (str(error).strip().splitlines() or [""])[0]
        raise AssertionError(
            f"{what} raised {type(error).__name__} ({first}): read the error below and fix that line first."
        ) from error


def _stub_verdict(what: str, error: NotImplementedError) -> tuple[str, str]:
    """Name the stub that raised: the learner's own, or one in another notebook's module it builds on."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return f"{what} is not written yet (it raises NotImplementedError)", STUB_FIX
    code = tb.tb_frame.f_code
    where = getattr(code, "co_qualname", code.co_name)
    path = Path(code.co_filename)
    source = re.match(r"# Written from your (\S+\.ipynb)", path.read_text(encoding="utf-8", errors="replace")) \
        if path.is_file() else None
    if source is None:  # the stub is in the cell being checked
        return f"{what} is not written yet ({where} raises NotImplementedError)", STUB_FIX
    notebook = source.group(1)
    return (f"{what} is not written yet: it uses your {where} from {notebook}, which is still a stub",
            f"write it in {notebook} and run its export cell, or continue with the course's version: "
            f'export_notebook("{notebook}", reference=True) there')


def passed(message: str) -> None:
    """The one line a check prints when everything it checked is right."""
    print(f"✓ {message}")


def generator(seed: int = 0) -> torch.Generator:
    """A CPU generator: checks draw their inputs on the CPU so they are the same on every machine."""
    return torch.Generator().manual_seed(seed)


# torch.testing.assert_close's default tolerances (rtol, atol) per dtype. (assert_close itself would cost a
# one-off import of about a second in a fresh kernel, longer than a whole check.)
_TOLERANCES = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
               torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7)}


def close(actual: torch.Tensor, expected: torch.Tensor, *, rtol: float | None = None, atol: float | None = None) -> bool:
    """True when the two tensors have the same shape and agree to the expected dtype's usual tolerance
    (that of ``torch.testing.assert_close``; NaN equals NaN)."""
    if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape:
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


def expect_tensor(what: str, out: Any, shape: tuple[int, ...], fix: str, *,
                  dtype: torch.dtype | None = None) -> torch.Tensor:
    """``out`` as a tensor of ``shape`` (and ``dtype``, if given); otherwise fail, saying what came back and ``fix``."""
    if not isinstance(out, torch.Tensor):
        fail(f"{what} returned {describe(out)}, not a tensor", fix)
    if tuple(out.shape) != tuple(shape):
        fail(f"{what} returned shape {tuple(out.shape)}, expected {tuple(shape)}", fix)
    if dtype is not None and out.dtype != dtype:
        fail(f"{what} returned {out.dtype}, expected {dtype}", fix)
    return out


Variants = Sequence[tuple[Any, str, str]]


def diagnose(what: str, out: torch.Tensor, expected: torch.Tensor, variants: Variants, fix: str, *,
             rtol: float | None = None, atol: float | None = None, evidence: str = "") -> None:
    """Pass when ``out`` is ``expected``; else fail with the first of ``variants`` that ``out`` matches.

    ``variants`` are the classic mistakes, each ``(wrong, mistake, fix)``: ``wrong`` is what the mistake computes (a
    tensor, or a callable that returns one, so that a costly variant is only computed when needed). A variant that
    happens to equal the right answer on these inputs is skipped. Without a match: "<what> differs from the expected
    result by up to …" and ``fix``, with ``evidence`` on the next line.
    """
    tolerance = dict(rtol=rtol, atol=atol)
    if close(out, expected, **tolerance):
        return
    for wrong, mistake, variant_fix in variants:
        wrong = wrong() if callable(wrong) else wrong
        if not close(wrong, expected, **tolerance) and close(out, wrong, **tolerance):
            fail(mistake, variant_fix, f"on {what}: yours matches that mistake" + (f"; {evidence}" if evidence else ""))
    if out.shape == expected.shape:
        difference = (out.detach().cpu().to(expected.dtype) - expected.cpu()).abs().nan_to_num(nan=float("inf")).max().item()
        fail(f"{what} differs from the expected result by up to {difference:.3g}", fix, evidence)
    fail(f"{what} returned shape {tuple(out.shape)}, expected {tuple(expected.shape)}", fix, evidence)


def describe(t: Any) -> str:
    """A short description of what the learner returned: type, shape, dtype."""
    if isinstance(t, torch.Tensor):
        return f"a {t.dtype} tensor of shape {tuple(t.shape)}"
    return f"a {type(t).__name__}"


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


def check_device_and_dtype(make: Callable[..., nn.Module], name: str) -> None:
    """``make(device=..., dtype=...)`` creates every parameter there.

    Uses the ``meta`` device (shapes without memory), so it works on a machine without a GPU.
    """
    module = call(f"{name}(..., dtype=torch.float64)", make, dtype=torch.float64)
    wrong = [key for key, p in module.named_parameters() if p.dtype != torch.float64]
    if wrong:
        fail(f"{name} ignores its dtype argument ({wrong[0]} is {dict(module.named_parameters())[wrong[0]].dtype})",
             "pass dtype=dtype on to everything you create: torch.empty(..., dtype=dtype) for a parameter, "
             "Linear(..., dtype=dtype) for a submodule")
    module = call(f"{name}(..., device='meta')", make, device="meta")
    wrong = [key for key, p in module.named_parameters() if p.device.type != "meta"]
    if wrong:
        fail(f"{name} ignores its device argument ({wrong[0]} was created on {dict(module.named_parameters())[wrong[0]].device})",
             "pass device=device on to everything you create: torch.empty(..., device=device) for a parameter, "
             "Linear(..., device=device) for a submodule")


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

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
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

"""Run-time shape checks for the components, and the one switch that turns them off.

Every component's forward is decorated with ``@shape_checked``: jaxtyping checks each argument against its
annotation (``Float[Tensor, "... d_in"]``: a floating tensor with at least one dimension, and the same ``d_in``
everywhere it appears), with beartype doing the checking, exactly as ``@jaxtyped(typechecker=beartype)``
does. Two things are added:

* The error's first line says what is wrong: which argument, what it is, what was expected, and the sizes
  the earlier arguments fixed. jaxtyping's full report follows on the next lines.
* One switch. The checks cost tens of microseconds a call, which a training step does not notice but a
  token-by-token decode does; benchmarks and long training runs turn them off::

      import transformer_from_scratch as tfs
      tfs.set_shape_checks(False)          # for the rest of the process
      with tfs.shape_checks(False):        # or for a block
          ...

  ``JAXTYPING_DISABLE=1`` in the environment starts a process with them off. The notebooks and the tests
  keep them on. The explicit checks inside each forward (a wrong last dimension, an id out of range, a mask
  that is not bool, ...) cost a few microseconds and always stay on. Inside ``torch.compile`` the shape checks
  are skipped: the compiled graph is specialised to the shapes it was traced with.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch
from beartype import BeartypeConf, beartype
from jaxtyping import TypeCheckError, config, jaxtyped

F = TypeVar("F", bound=Callable)

_enabled = not config.jaxtyping_disable
# PEP 484's numeric tower: an int is accepted where a float is annotated (temperature=0, theta=10_000).
_typechecker = beartype(conf=BeartypeConf(is_pep484_tower=True))


def shape_checks_enabled() -> bool:
    """Whether ``@shape_checked`` functions check their arguments now."""
    return _enabled


def set_shape_checks(enabled: bool) -> None:
    """Turn the run-time shape checks on or off for the whole process (jaxtyping's own switch follows)."""
    global _enabled
    if not isinstance(enabled, bool):
        raise TypeError(f"set_shape_checks expects True or False, got {enabled!r}")
    _enabled = enabled
    config.update("jaxtyping_disable", not enabled)


@contextlib.contextmanager
def shape_checks(enabled: bool) -> Iterator[None]:
    """``with shape_checks(False): ...`` runs a block with the checks off (or on), then restores the setting."""
    previous = _enabled
    set_shape_checks(enabled)
    try:
        yield
    finally:
        set_shape_checks(previous)


class trusted:
    """``with trusted(): ...``: the caller has checked the inputs, so the components called inside skip theirs.

    A model checks what it is given once, at its edge (``TransformerLM.forward``: the ids, the context length, the
    caches), then runs its blocks inside ``trusted()``: their ``@shape_checked`` annotations and the input checks
    that ask ``checking()`` are skipped, since every tensor they get was made by the model from checked inputs.
    ``generate`` checks its arguments once and decodes inside it. Called on its own, a component checks everything.
    Blocks nest; under ``torch.compile`` it does nothing (the compiled code skips the checks anyway).
    """

    def __enter__(self) -> None:
        if not torch.compiler.is_compiling():
            _trusted.depth = _trusted_depth() + 1

    def __exit__(self, *exc_info: object) -> None:
        if not torch.compiler.is_compiling():
            _trusted.depth = _trusted_depth() - 1


_trusted = threading.local()  # how many trusted() blocks are open, per thread: another thread keeps its checks


def _trusted_depth() -> int:
    return getattr(_trusted, "depth", 0)


def checking() -> bool:
    """Whether a component should check its inputs now: False inside ``trusted()`` (its caller checked them)."""
    return _trusted_depth() == 0


def check_length(who: str, seq: int, limit: int, name: str, shape: tuple[int, ...], *, past: int = 0,
                 tensor: str = "x", advice: str = "") -> None:
    """The one rule for sequence lengths: `past` cached positions plus `seq` new ones fit within `limit`.

    Every module with a longest sequence (the attention's and the block's max_seq_len, the model's context_length)
    calls this one function, so the rule and its message live here. A ValueError that names the numbers, e.g.
    "TransformerBlock: the sequence has 17 tokens, more than max_seq_len=16 (x of shape (2, 17, 12))"."""
    if past + seq > limit:
        cached = f" after {past} cached positions" if past else ""
        raise ValueError(f"{who}: the sequence has {seq} tokens{cached}, more than {name}={limit} ({tensor} of shape "
                         f"{tuple(shape)})" + (f"; {advice}" if advice else ""))


def check_positions(who: str, token_positions: torch.Tensor | None, lead: tuple[int, ...], shape: tuple[int, ...],
                    tensor: str = "x") -> None:
    """The one rule for token_positions: shape (..., seq), with the input's seq as its last dimension and leading
    dimensions that broadcast to the input's (never growing it). `lead` is the input's (..., seq) part, `shape` its
    whole shape (for the message). None passes (the default positions 0 … seq-1). A ValueError that names the shapes."""
    if token_positions is None:
        return
    positions = token_positions.shape
    if (len(positions) < 1 or len(positions) > len(lead) or positions[-1] != lead[-1]
            or any(a not in (1, b) for a, b in zip(reversed(positions[:-1]), reversed(lead[:-1])))):
        raise ValueError(f"{who}: token_positions must have shape (..., seq) = (..., {lead[-1]}) with leading "
                         f"dimensions that broadcast to {tensor}'s {tuple(lead[:-1])}, got token_positions "
                         f"{tuple(positions)} for {tensor} {tuple(shape)}")


def check_stream(who: str, x: torch.Tensor, d_model: int, max_seq_len: int | None, *, past: int = 0) -> None:
    """The one rule for what a block or an attention layer reads from the residual stream: x of shape
    (..., seq, d_model), and, where the module has a max_seq_len, `past` cached positions plus seq within it
    (check_length). A ValueError that names the numbers, e.g. "TransformerBlock expected x of shape (..., seq, 12)
    (d_model=12), got shape (2, 5, 10)"."""
    if x.ndim < 2 or x.shape[-1] != d_model:
        raise ValueError(f"{who} expected x of shape (..., seq, {d_model}) (d_model={d_model}), "
                         f"got shape {tuple(x.shape)}")
    if max_seq_len is not None:
        check_length(who, x.shape[-2], max_seq_len, "max_seq_len", x.shape, past=past)


# Every integer dtype can hold token ids and positions. bool is not among them: a bool tensor in square brackets is a
# mask. Nor are floats (a float id is a mistake upstream) or complex numbers.
INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                  torch.uint16, torch.uint32, torch.uint64)


def is_integer_dtype(dtype: torch.dtype) -> bool:
    """The one rule for the dtype of ids and positions (token ids, class ids, token_positions): one of
    INTEGER_DTYPES. Each caller raises its own TypeError, naming its argument and the dtype it got."""
    return dtype in INTEGER_DTYPES


def _size(value: str) -> str:
    """``torch.Size([2, 3])`` -> ``(2, 3)``, ``torch.Size([2])`` -> ``(2,)``; anything else unchanged."""
    inner = re.fullmatch(r"torch\.Size\(\[(.*)\]\)", value)
    if inner is None:
        return value
    return f"({inner[1]},)" if inner[1] and "," not in inner[1] else f"({inner[1]})"


def _summary(name: str, report: str) -> str | None:
    """One line from jaxtyping's report: the argument (or return value), what it is, what it should be."""
    actual = re.search(r"^Actual value: (.*?)(?:\(torch\))?$", report, re.MULTILINE)
    expected = re.search(r"^Expected type: (?:<class ')?(.*?)(?:'>)?\.$", report, re.MULTILINE)
    if actual is None or expected is None:
        return None
    argument = re.search(r"typechecking parameter '(\w+)'", report)
    what = f"{name}: {argument[1]} is" if argument else f"{name} returned"
    _, found, memo = report.partition("axis annotation are as follows.")
    sizes = ", ".join(f"{dim}={_size(value)}" for dim, value in re.findall(r"^(\w+)=(.+)$", memo, re.MULTILINE))
    known = f" (sizes so far: {sizes})" if found and sizes else ""
    wanted = re.sub(r"\bjaxtyping\.", "", expected[1])  # a union is printed with the module's name
    return f"{what} {actual[1]}, which does not fit {wanted}{known}"


def shape_checked(fn: F) -> F:
    """``@jaxtyped(typechecker=beartype)``, with a first line that says what is wrong, and an off switch."""
    checked = jaxtyped(typechecker=_typechecker)(fn)
    name = fn.__qualname__

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not _enabled or _trusted_depth() or torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        try:
            return checked(*args, **kwargs)
        except TypeCheckError as error:
            first_line = _summary(name, str(error))
            if first_line is None:
                raise
            raise TypeCheckError(f"{first_line}\n{error}") from error.__cause__

    return wrapper  # type: ignore[return-value]

"""A failing learner check reads in a few lines: its verdict, then the learner's own code, never the checker's.

A check (``check_linear(Linear)``, or a step's ``check_rms(rms)``) fails with an ``AssertionError`` whose first
line is the mistake and how to fix it. IPython would show it under the check's frames, and their source is the
answer (``expected = positions * frequencies``). So the setup cell's
``%load_ext transformer_from_scratch.nbtools.export`` also calls ``install``, and an ``AssertionError`` that
passes through ``transformer_from_scratch/checks/`` is shown in its short form::

    AssertionError: Linear(6, 6)(x of shape (2, 5, 6), ...) raised TypeError (...): read the error below and fix ...

    Cell In[4], line 3, in Linear.forward
        return x @ self.weight.T + "oops"
    TypeError: unsupported operand type(s) for +: 'Tensor' and 'str'

That is the verdict, then each error it was raised from, with only the learner's frames below the check: notebook
cells and files of theirs (``my_transformer/``), never this package's nor a library's (torch, Python). A stub's
``NotImplementedError`` met by a check reads the same way: the verdict, the stub's line and its message.

Only ``AssertionError`` is handled: the harness's ``call`` runs the learner's code and turns whatever it raises into
one (chaining the original), while an error of another kind inside a check is a bug of the check, best seen in
full. Every other error is left to IPython, exactly as it shows it; so is a check failure once the extension is
unloaded. ``%tb`` in the next cell prints the full traceback of the last error, ``%debug`` opens it.
"""

from __future__ import annotations

import linecache
import sys
import sysconfig
import traceback
from pathlib import Path
from types import TracebackType
from typing import Iterator

PACKAGE_DIR = Path(__file__).parents[1]
CHECKS_DIR = PACKAGE_DIR / "checks"
# Where the installed libraries live (torch, IPython, Python's own modules): never the learner's code.
LIBRARY_DIRS = tuple(Path(sysconfig.get_path(name)) for name in ("stdlib", "platstdlib", "purelib", "platlib"))


def install(shell) -> None:
    """Show the failures of the learner checks in ``shell`` (an IPython shell) in their short form."""
    shell.set_custom_exc((AssertionError,), show_assertion_error)


def uninstall(shell) -> None:
    """Back to IPython's own display for every error (IPython's default: no custom handler)."""
    shell.set_custom_exc((), None)


def show_assertion_error(shell, etype, value, tb, tb_offset=None) -> None:
    """IPython's handler for an ``AssertionError`` raised by a cell: short if a check raised it, else as usual."""
    if not any(_inside(filename, CHECKS_DIR) for filename, _, _ in _frames(tb)):  # not a check's
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset, running_compiled_code=True)  # as run_code does
        return
    # What showtraceback does besides the display: %tb and %debug find this error, and %pdb opens it.
    sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = value
    # The kernel sends it as the cell's error output: ename and evalue as ever, the traceback short.
    shell._showtraceback(etype, value, short_traceback(shell, value))
    if shell.call_pdb:
        shell.debugger(force=True)


def short_traceback(shell, error: BaseException) -> list[str]:
    """The lines shown for a check's ``error``: the verdict, then each error it was raised from or while handling
    (most recent first), with the learner's frames under the check. An earlier verdict of a check (a check that
    catches the harness's verdict to give a more precise one) is left out."""
    lines: list[str] = []
    for exception in _chain(error):
        if exception is not error and _is_a_verdict(exception):
            continue
        if lines:
            lines.append("")
        for filename, lineno, function in _learners_frames(shell, exception.__traceback__):
            lines.append(_where(shell, filename, lineno, function))
            source = linecache.getline(filename, lineno).strip()
            if source:
                lines.append(f"    {source}")
        lines += "".join(traceback.format_exception_only(type(exception), exception)).rstrip("\n").split("\n")
    return lines


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error``, then the exception it was raised from or while handling, and so on, as Python shows them."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)


def _frames(tb: TracebackType | None) -> list[tuple[str, int, str]]:
    """(file name, line number, qualified function name) of every frame of ``tb``, outermost first."""
    return [(frame.f_code.co_filename, lineno, getattr(frame.f_code, "co_qualname", frame.f_code.co_name))
            for frame, lineno in traceback.walk_tb(tb)]


def _inside(filename: str, folder: Path) -> bool:
    return Path(filename).is_relative_to(folder)


def _is_a_verdict(error: BaseException) -> bool:
    """An ``AssertionError`` raised in a check (not one the learner's code raised, nor a crash in the learner's code:
    the check's ``BuiltinSpy`` sees every torch operation, so the last frame of such a crash can be in the harness)."""
    frames = _frames(error.__traceback__)
    return isinstance(error, AssertionError) and bool(frames) and _inside(frames[-1][0], CHECKS_DIR)


def _learners_frames(shell, tb: TracebackType | None) -> list[tuple[str, int, str]]:
    """The frames of ``tb`` in the learner's code (a notebook cell, or a file that is neither this package nor a
    library) below its first frame in this package, if any: what the check called, not the cell that called it."""
    frames = _frames(tb)
    first = next((i for i, (filename, _, _) in enumerate(frames) if _inside(filename, PACKAGE_DIR)), -1)
    return [frame for frame in frames[first + 1:] if _is_learners(shell, frame[0])]


def _is_learners(shell, filename: str) -> bool:
    if shell.compile.format_code_name(filename) is not None:  # a notebook cell
        return True
    return Path(filename).is_file() and not any(_inside(filename, folder) for folder in (PACKAGE_DIR, *LIBRARY_DIRS))


def _where(shell, filename: str, lineno: int, function: str) -> str:
    """``Cell In[4], line 3, in Linear.forward``, or ``File my_transformer/linear.py:20, in Linear.forward``."""
    cell = shell.compile.format_code_name(filename)  # ("Cell", "In[4]"), as IPython's tracebacks name a cell
    where = f"{cell[0]} {cell[1]}, line {lineno}" if cell else f"File {_short_path(filename)}:{lineno}"
    return where if function == "<module>" else f"{where}, in {function}"


def _short_path(filename: str) -> str:
    """Relative to the notebook's folder when inside it (``my_transformer/linear.py``), else as it is."""
    path, here = Path(filename), Path.cwd()
    return str(path.relative_to(here)) if path.is_relative_to(here) else filename

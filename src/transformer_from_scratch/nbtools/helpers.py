"""Small helpers the notebooks share, so every notebook shows the same thing the same way."""

from __future__ import annotations

import functools
import math
import os
import sys
from contextlib import contextmanager
from typing import Iterator

import torch


@contextmanager
def expect_error(*error_types: type[BaseException], lines: int = 1) -> Iterator[None]:
    """Run the block, which must raise one of ``error_types``, and print ``Type: message``.

    This is the one way a notebook shows a caught error: a traceback would be stored in the notebook
    (and differ between machines), and a bare ``try``/``except`` would silently pass if the error
    were never raised. Only the first ``lines`` lines of the message are printed (jaxtyping's reports
    are long), joined by `` | ``.

    Example::

        with expect_error(ValueError):
            Linear(4, 3)(torch.randn(2, 5))
    """
    if not error_types:
        raise ValueError("expect_error needs the error type(s) the block must raise, e.g. expect_error(ValueError)")
    try:
        yield
    except error_types as error:
        text = [line.strip() for line in str(error).splitlines() if line.strip()]
        print(f"{type(error).__name__}: {' | '.join(text[:lines])}")
    else:
        names = " or ".join(t.__name__ for t in error_types)
        raise AssertionError(f"expected the block to raise {names}, but it raised nothing")


def entropy_bits(p: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Shannon entropy of the distributions along ``dim``, in bits (0 · log 0 counts as 0).

    Returns a tensor with ``dim`` removed: a 0-d tensor for one distribution (``float()`` it to print).
    """
    return -torch.special.xlogy(p, p).sum(dim=dim) / math.log(2)


@contextmanager
def silenced_stderr() -> Iterator[None]:
    """Send the process's standard error (file descriptor 2, C++ libraries included) to the void for a moment:
    torch.profiler's library (kineto) logs a line at each start and stop there, with the time, which a notebook would
    store. Python's own sys.stderr is flushed first, so nothing written before is lost."""
    sys.stderr.flush()
    saved, void = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(void, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(void)


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Run Hugging Face ``transformers`` (a test-only yardstick in notebooks 14 and 16) without its progress bars and
    advisory logs: a notebook would save each bar as an empty widget. Its GGUF converter calls tqdm directly, with no
    switch, so its bar is turned off here for the moment and restored after, with the library's own settings."""
    from transformers import modeling_gguf_pytorch_utils as gguf_loading
    from transformers.utils import logging as hf_logging

    verbosity, bars, converter_bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled(), gguf_loading.tqdm
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    gguf_loading.tqdm = functools.partial(converter_bar, disable=True)
    try:
        yield
    finally:
        gguf_loading.tqdm = converter_bar
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()

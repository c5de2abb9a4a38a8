"""A course command run as a child process, stopped on a signal once it has done enough (tests/test_train.py and
tests/test_tune.py: Ctrl-C, SIGTERM and kill -9, then resume)."""

import os
import subprocess
import sys
import time
from typing import Callable


def start(module: str, *args: str) -> subprocess.Popen:
    """``python -m module args`` on one thread, its output captured as text."""
    return subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def wait_for(child: subprocess.Popen, ready: Callable[[], bool], seconds: float = 120) -> None:
    """Return once ``ready()``; fail, with the child's output, if it ends first or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while not ready():
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.02)

"""make test-gpu (.ci/test-gpu) on a machine without a GPU: it says so in one line and exits 0, so that the prepared
GPU run can sit in the Makefile and be tried anywhere."""

import subprocess
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: make test-gpu runs for real here")
def test_without_a_gpu_it_says_so_and_exits_cleanly():
    run = subprocess.run(["bash", str(REPO / ".ci" / "test-gpu")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines() == [run.stdout.strip()]
    assert run.stdout.startswith("make test-gpu: no CUDA GPU here")

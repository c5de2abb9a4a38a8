"""Shared test settings: the devices every component is checked on."""

import pytest
import torch

# Every component runs on every available device; CUDA cases are skipped (not dropped) without a GPU,
# so the report shows what was not checked on this machine.
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "cuda", id="cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
    ),
]
FLOAT_DTYPES = [pytest.param(torch.float32, id="float32"), pytest.param(torch.float64, id="float64")]
# Leading (batch-like) shapes: none at all, one, two and three dimensions, including a size-1 one.
LEADING_SHAPES = [(), (1,), (7,), (2, 3), (2, 1, 4)]
